"""What goes into a browser image of one engine: the part of :mod:`rigd.images.browser`
that the browser images' cache keys name.

Everything here decides the bytes of an engine's image (its package list,
its labels, the arguments of ``customize.sh``); what a server does with a
built image (packs, custom images, the browser user of a pulled image) lives
in :mod:`rigd.images.browser` and never rebuilds an image when it changes.
"""

from __future__ import annotations

import copy
import enum
import shlex
import sys
from pathlib import Path

from rigd.errors import RigdError
from rigd.images.recipes import Recipes, read_packages
from rigd.images.terminal import OciImage, load_recipe_file


class Engine(enum.StrEnum):
    """A browser engine, named by its Debian package."""

    CHROMIUM = "chromium"
    FIREFOX_ESR = "firefox-esr"
    WEBKIT = "webkit2gtk-driver"


DEFAULT_ENGINE = Engine.CHROMIUM


def engine_files(d: Path, engine: Engine) -> tuple[Path, ...]:
    """Recipe files only one engine's build reads (so only its key hashes them)."""
    return (d / "firefox_seed.py",) if engine is Engine.FIREFOX_ESR else ()


def browser_image(r: Recipes, engine: Engine, cache_dir: Path) -> OciImage:
    d = r.browser_dir
    recipe = copy.deepcopy(load_recipe_file(d / "recipe.json"))
    audio = recipe.get("audio_revision")
    if not isinstance(audio, str) or not audio:
        raise RigdError(f"{d / 'recipe.json'}: audio_revision must be a string", field="audio_revision")
    engine_list = d / "engines" / f"{engine.value}.txt"
    labels = recipe["config"].setdefault("Labels", {})
    labels["org.opencontainers.image.title"] = f"rigd browser ({engine.value})"
    labels["dev.rigd.engine"] = engine.value
    labels["dev.rigd.audio"] = f"{audio}-{engine.value}"
    return OciImage(
        kind=f"browser-{engine.value}",
        recipe_dir=d,
        packages=(*read_packages(d / "packages.txt"), *read_packages(engine_list)),
        key_files=(d / "recipe.json", d / "packages.txt", d / "customize.sh", engine_list,
                   *engine_files(d, engine)),
        recipe=recipe,
        builders=("terminal", "oci", "recipes", "browser_recipe"),
        # The interpreter a hook's Python helper runs on (images/browser/firefox_seed.py).
        hook_args=(engine.value, shlex.quote(sys.executable)),
        title=f"rigd browser ({engine.value})",
        debs_dir=cache_dir / "browser-debs" / engine.value,
        key_extra=(engine.value,),
    )


__all__ = ["DEFAULT_ENGINE", "Engine", "browser_image"]
