"""What each image's cache key names, and so what a change rebuilds (issue 25).

The desktop (700 MB) and browser images take minutes each to build; their keys
name only what goes into them. The guest agent is carried by the tools disk
(terminal, browser and desktop rigs alike), so a change to it rebuilds only
that small disk; the importer, the CLI and the server are in no image.
"""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest

import rigd
from rigd.images.browser_recipe import Engine, browser_image
from rigd.images.desktop import desktop_key, desktop_key_files
from rigd.images.recipes import Recipes
from rigd.images.terminal import image_key, image_key_files, terminal_image, terminal_key
from rigd.images.tools import tools_key

PACKAGE = Path(rigd.__file__).resolve().parent
#: Modules that run a server, import images or serve the CLI: never part of what an image is.
NOT_BUILDERS = ("images/importer.py", "images/browser.py", "images/cache.py", "images/registry.py",
                "images/pack.py", "client/cli.py", "server/main.py")


@pytest.fixture
def r() -> Recipes:
    return Recipes.find()


def copy_recipes(r: Recipes, tmp_path: Path) -> Recipes:
    """A checkout of what the keys hash: images/ and guest-agent/."""
    shutil.copytree(r.images, tmp_path / "images")
    shutil.copytree(r.agent.parent, tmp_path / "guest-agent", ignore=shutil.ignore_patterns("__pycache__"))
    return Recipes(tmp_path)


def all_keys(c: Recipes, cache: Path) -> dict[str, str]:
    keys = {"desktop": desktop_key(c), "terminal": terminal_key(c), "tools": tools_key(c)}
    keys |= {e.value: image_key(c, browser_image(c, e, cache)) for e in Engine}
    return keys


def test_a_changed_agent_rebuilds_the_tools_disk_and_no_image(r: Recipes, tmp_path: Path) -> None:
    c = copy_recipes(r, tmp_path / "co")
    before = all_keys(c, tmp_path)
    with (c.agent / "core.py").open("a") as f:
        f.write("\n# a change to the agent\n")
    after = all_keys(c, tmp_path)
    assert after["tools"] != before["tools"]
    assert {k: v for k, v in after.items() if k != "tools"} == {k: v for k, v in before.items() if k != "tools"}
    with (c.agent / "mux.py").open("a") as f:
        f.write("\n# a change to the port multiplexer\n")
    assert {k: v for k, v in all_keys(c, tmp_path).items() if k != "tools"} == \
        {k: v for k, v in before.items() if k != "tools"}


def test_a_changed_desktop_recipe_rebuilds_only_the_desktop(r: Recipes, tmp_path: Path) -> None:
    c = copy_recipes(r, tmp_path / "co")
    before = all_keys(c, tmp_path)
    unit = c.desktop_dir / "rootfs/etc/systemd/system/rigd-agent.service"
    unit.write_text(unit.read_text() + "# changed\n")
    after = all_keys(c, tmp_path)
    assert after["desktop"] != before["desktop"]
    assert {k: v for k, v in after.items() if k != "desktop"} == {k: v for k, v in before.items() if k != "desktop"}


def test_no_key_names_the_importer_the_cli_the_server_or_the_agent(r: Recipes, tmp_path: Path) -> None:
    named = {
        "desktop": desktop_key_files(r),
        "terminal": image_key_files(r, terminal_image(r)),
        **{e.value: image_key_files(r, browser_image(r, e, tmp_path)) for e in Engine},
    }
    for image, files in named.items():
        rel = {p.resolve().relative_to(PACKAGE).as_posix() for p in files if p.resolve().is_relative_to(PACKAGE)}
        assert not rel & set(NOT_BUILDERS), (image, sorted(rel & set(NOT_BUILDERS)))
        assert all(p.is_file() for p in files if p.resolve().is_relative_to(PACKAGE)), image
        assert not any(p.resolve().is_relative_to(r.agent) for p in files), image
    # ... while each names the modules that do decide its bytes.
    desktop = {p.name for p in named["desktop"]}
    assert {"desktop.py", "manifest.py", "initramfs.py", "packages.txt", "customize.sh"} <= desktop
    assert {"terminal.py", "oci.py", "browser_recipe.py"} <= {p.name for p in named["chromium"]}
