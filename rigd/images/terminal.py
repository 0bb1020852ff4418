"""The default terminal image: Debian bookworm + the CI toolkit, as an OCI layout.

``mmdebstrap`` builds the root into a tarball (no loop mounts, no docker;
root mode when we are root, else its unshare mode), with the recipe's dpkg
path filters trimming docs, man pages and locales, and
``images/terminal/customize.sh`` masking qemu-guest-agent and removing apt
lists and logs. :func:`rigd.images.oci.write_layout` turns the tarball into a
one-layer OCI layout whose manifest digest pins the image; it is written to
``digest`` beside the layout.

``SOURCE_DATE_EPOCH`` comes from the recipe, so the same package versions
give the same tarball and the same digest.

Output directory (``<cache>/terminal/<key>/``)::

    oci/       the OCI image layout
    digest     "sha256:<hex>" of the manifest
    build.json what was built, from what, and how long it took
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import time
from pathlib import Path
from typing import Any

from rigd.errors import RigdError
from rigd.images import oci
from rigd.images.cache import READ_ONLY_MODE, Log, builder_sources, cached_build, recipe_key
from rigd.images.recipes import Recipes


def read_packages(path: Path) -> list[str]:
    out: list[str] = []
    for line in path.read_text().splitlines():
        line = line.split("#", 1)[0].strip()
        if line:
            out.append(line)
    if not out:
        raise RigdError(f"{path}: lists no packages")
    return out


def load_recipe(r: Recipes) -> dict[str, Any]:
    path = r.terminal_dir / "recipe.json"
    try:
        doc = json.loads(path.read_text())
    except (OSError, json.JSONDecodeError) as exc:
        raise RigdError(f"cannot read {path}: {exc}") from exc
    for key, typ in (
        ("suite", str),
        ("variant", str),
        ("source_date_epoch", int),
        ("dpkg_options", list),
        ("apt_options", list),
        ("config", dict),
    ):
        if not isinstance(doc.get(key), typ):
            raise RigdError(f"{path}: {key} must be a {typ.__name__}", field=key)
    return doc  # type: ignore[no-any-return]


def terminal_key(r: Recipes) -> str:
    files = [
        r.sources,
        *sorted(p for p in r.terminal_dir.rglob("*") if p.is_file()),
        *builder_sources("terminal", "oci"),
    ]
    return recipe_key(files, root=r.root)


def mmdebstrap_argv(r: Recipes, recipe: dict[str, Any], out_tar: Path) -> list[str]:
    exe = shutil.which("mmdebstrap")
    if exe is None:
        raise RigdError("`mmdebstrap` is not installed (apt-get install mmdebstrap)")
    pkgs = read_packages(r.terminal_dir / "packages.txt")
    argv = [
        exe,
        f"--variant={recipe['variant']}",
        "--mode=" + ("root" if os.geteuid() == 0 else "unshare"),
        "--format=tar",
        "--include=" + ",".join(pkgs),
        *(f"--dpkgopt={o}" for o in recipe["dpkg_options"]),
        *(f"--aptopt={o}" for o in recipe["apt_options"]),
        f'--customize-hook=sh {r.terminal_dir / "customize.sh"} "$1"',
        recipe["suite"],
        str(out_tar),
        str(r.sources),  # a .sources file is used as the deb822 sources list
    ]
    return argv


def _build(r: Recipes, out: Path, log: Log) -> None:
    recipe = load_recipe(r)
    epoch = int(recipe["source_date_epoch"])
    tar = out / ".rootfs.tar"
    argv = mmdebstrap_argv(r, recipe, tar)
    log("terminal: mmdebstrap " + recipe["suite"] + " (this takes a minute or two)")
    t0 = time.monotonic()
    env = dict(os.environ, SOURCE_DATE_EPOCH=str(epoch))
    res = subprocess.run(argv, capture_output=True, text=True, env=env, check=False)
    if res.returncode != 0:
        raise RigdError(f"mmdebstrap failed: {res.stderr.strip()[-3000:]}")
    t1 = time.monotonic()
    log(f"terminal: rootfs tarball {tar.stat().st_size >> 20} MiB in {t1 - t0:.0f} s; writing OCI layout")
    digest = oci.write_layout(
        out / "oci",
        tar,
        epoch=epoch,
        config=recipe["config"],
        gzip_level=int(recipe.get("gzip_level", 6)),
        annotations={"org.opencontainers.image.title": "rigd terminal"},
    )
    tar_bytes = tar.stat().st_size
    tar.unlink()
    for p in (out / "oci").rglob("*"):
        if p.is_file():
            p.chmod(READ_ONLY_MODE)
    (out / "digest").write_text(digest + "\n")
    (out / "digest").chmod(READ_ONLY_MODE)
    manifest = oci.load_manifest(out / "oci", digest)
    (out / "build.json").write_text(
        json.dumps(
            {
                "digest": digest,
                "suite": recipe["suite"],
                "packages": read_packages(r.terminal_dir / "packages.txt"),
                "rootfs_tar_bytes": tar_bytes,
                "layer_bytes": manifest.layers[0].size,
                "mmdebstrap_seconds": round(t1 - t0, 1),
                "layout_seconds": round(time.monotonic() - t1, 1),
            },
            indent=1,
        )
        + "\n"
    )
    log(f"terminal: {digest} (layer {manifest.layers[0].size >> 20} MiB)")


def build_terminal(r: Recipes, cache_dir: Path, log: Log) -> tuple[Path, str]:
    """Return ``(oci_layout, manifest_digest)``, building if needed."""
    d = cached_build(
        cache_dir / "terminal", terminal_key(r), "terminal image", lambda out: _build(r, out, log), log
    )
    return d / "oci", (d / "digest").read_text().strip()
