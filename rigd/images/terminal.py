"""Debian images built by mmdebstrap into OCI layouts: the terminal image, and
every image made the same way (the browser images, :mod:`rigd.images.browser`).

``mmdebstrap`` builds the root into a tarball (no loop mounts, no docker;
root mode when we are root, else its unshare mode), with the recipe's dpkg
path filters trimming docs, man pages and locales, and the recipe's
``customize.sh`` (for the terminal: masking qemu-guest-agent, removing apt
lists and logs). :func:`rigd.images.oci.write_layout` turns the tarball into a
one-layer OCI layout whose manifest digest pins the image; it is written to
``digest`` beside the layout.

``SOURCE_DATE_EPOCH`` comes from the recipe, so the same package versions
give the same tarball and the same digest.

An :class:`OciImage` names what differs between such images: the recipe
directory, the cache kind, the packages, the files its key hashes, the
hook's extra arguments, and optionally a directory that keeps the downloaded
.debs so that the image can be rebuilt offline (``offline=True``: the kept
.debs become a flat local repository, and the image's apt sources are put
back to ``images/debian.sources``, so the image is the same as an online
build of the same versions).

Output directory (``<cache>/<kind>/<key>/``)::

    oci/       the OCI image layout
    digest     "sha256:<hex>" of the manifest
    build.json what was built, from what, and how long it took
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import os
import shutil
import subprocess
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from rigd.errors import RigdError
from rigd.images import oci
from rigd.images.cache import READ_ONLY_MODE, Log, builder_sources, cached_build, recipe_key, remove_tree
from rigd.images.recipes import Recipes, read_packages


def load_recipe_file(path: Path) -> dict[str, Any]:
    """An mmdebstrap recipe (``recipe.json``), checked for the keys every image needs."""
    try:
        doc = json.loads(path.read_text())
    except (OSError, json.JSONDecodeError) as exc:
        raise RigdError(f"cannot read {path}: {exc}") from exc
    if not isinstance(doc, dict):
        raise RigdError(f"{path}: not a JSON object")
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
    return doc


def load_recipe(r: Recipes) -> dict[str, Any]:
    return load_recipe_file(r.terminal_dir / "recipe.json")


@dataclass(frozen=True, slots=True)
class OciImage:
    """One image built by mmdebstrap into an OCI layout."""

    #: The cache kind (``<cache>/<kind>/<key>/``) and the prefix of log lines.
    kind: str
    #: Holds ``recipe.json`` and ``customize.sh``.
    recipe_dir: Path
    #: What mmdebstrap installs (``--include``).
    packages: tuple[str, ...]
    #: The recipe's own files the key hashes (besides debian.sources and the builder).
    key_files: tuple[Path, ...]
    #: The recipe, parsed (:func:`load_recipe_file`).
    recipe: dict[str, Any]
    #: Builder modules (by stem) whose source is part of the key.
    builders: tuple[str, ...] = ("terminal", "oci", "recipes")
    #: Arguments after the root for ``customize.sh``.
    hook_args: tuple[str, ...] = ()
    #: The OCI title annotation.
    title: str = "rigd terminal"
    #: Keep the downloaded .debs here between builds (and allow offline rebuilds).
    debs_dir: Path | None = None
    #: Strings the key also hashes (an engine name …).
    key_extra: tuple[str, ...] = field(default=())


def terminal_image(r: Recipes) -> OciImage:
    return OciImage(
        kind="terminal",
        recipe_dir=r.terminal_dir,
        packages=tuple(read_packages(r.terminal_dir / "packages.txt")),
        key_files=tuple(sorted(p for p in r.terminal_dir.rglob("*") if p.is_file())),
        recipe=load_recipe(r),
    )


def image_key_files(r: Recipes, image: OciImage) -> list[Path]:
    """What the image's key hashes: its recipe files and the modules that build it."""
    return [r.sources, *image.key_files, *builder_sources(*image.builders)]


def image_key(r: Recipes, image: OciImage) -> str:
    return recipe_key(image_key_files(r, image), root=r.root, extra=image.key_extra)


def terminal_key(r: Recipes) -> str:
    return image_key(r, terminal_image(r))


def mmdebstrap_argv(
    r: Recipes, image: OciImage, out_tar: Path, *, sources: Path | None = None,
    debs_in: Path | None = None, debs_out: Path | None = None,
) -> list[str]:
    """The mmdebstrap command line; ``sources`` replaces ``images/debian.sources``
    (an offline build's local repository), ``debs_in``/``debs_out`` keep the
    downloaded .debs (synced in before apt runs, out after ``autoclean``)."""
    exe = shutil.which("mmdebstrap")
    if exe is None:
        raise RigdError("`mmdebstrap` is not installed (apt-get install mmdebstrap)")
    recipe = image.recipe
    hooks: list[str] = []
    if debs_in is not None:
        hooks += [
            '--setup-hook=mkdir -p "$1"/var/cache/apt/archives/',
            f"--setup-hook=sync-in {debs_in} /var/cache/apt/archives/",
        ]
    if debs_out is not None:
        # mmdebstrap deletes the essential set's .debs once unpacked; keep them too.
        hooks += [
            "--skip=essential/unlink",
            '--customize-hook=chroot "$1" apt-get -qq autoclean',
            f"--customize-hook=sync-out /var/cache/apt/archives {debs_out}",
        ]
    if sources is not None:
        # The image keeps the archive's sources, not the build's local repository.
        hooks.append(f'--customize-hook=cp {r.sources} "$1"/etc/apt/sources.list.d/0000debian.sources')
    hook = f'--customize-hook=sh {image.recipe_dir / "customize.sh"} "$1"'
    hooks.append(" ".join((hook, *image.hook_args)))
    return [
        exe,
        f"--variant={recipe['variant']}",
        "--mode=" + ("root" if os.geteuid() == 0 else "unshare"),
        "--format=tar",
        "--include=" + ",".join(image.packages),
        *(f"--dpkgopt={o}" for o in recipe["dpkg_options"]),
        *(f"--aptopt={o}" for o in recipe["apt_options"]),
        *hooks,
        recipe["suite"],
        str(out_tar),
        str(sources or r.sources),  # a .sources file is used as the deb822 sources list
    ]


def local_repository(debs: Path, work: Path, suite: str = "bookworm") -> Path:
    """A deb822 sources file naming ``debs`` as a flat, trusted repository (offline builds).

    Its ``Release`` names ``suite`` as suite and codename (mmdebstrap selects the
    essential and required packages of that suite) and the ``Packages`` index's sha256.

    The file is called ``debian.sources`` like the archive's, so mmdebstrap
    gives it the same name in the image (where a hook then puts the archive's back).
    """
    if not any(debs.glob("*.deb")):
        raise RigdError(f"an offline build needs the .debs of an earlier build in {debs}; there are none",
                        path=str(debs))
    scan = shutil.which("dpkg-scanpackages")
    if scan is None:
        raise RigdError("an offline build needs `dpkg-scanpackages` (apt-get install dpkg-dev)")
    res = subprocess.run([scan, "-m", "."], cwd=debs, capture_output=True, check=False)
    if res.returncode != 0:
        raise RigdError(f"dpkg-scanpackages failed: {res.stderr.decode(errors='replace')[-1000:]}")
    (debs / "Packages").write_bytes(res.stdout)
    digest = hashlib.sha256(res.stdout).hexdigest()
    (debs / "Release").write_text(
        f"Origin: rigd\nLabel: rigd offline\nSuite: {suite}\nCodename: {suite}\n"
        "Date: Wed, 01 Jan 2025 00:00:00 UTC\n"
        f"Architectures: amd64 all\nSHA256:\n {digest} {len(res.stdout)} Packages\n"
    )
    src = work / "debian.sources"
    src.write_text(f"Types: deb\nURIs: file://{debs}\nSuites: ./\nTrusted: yes\n")
    return src


def _build(r: Recipes, image: OciImage, out: Path, log: Log, *, offline: bool) -> None:
    recipe = image.recipe
    what = image.kind
    epoch = int(recipe["source_date_epoch"])
    tar = out / ".rootfs.tar"
    sources = None
    debs_in = debs_out = None
    argv_image = image
    if image.debs_dir is not None:
        image.debs_dir.mkdir(parents=True, exist_ok=True)
        debs_in = image.debs_dir
        debs_out = out / ".debs"
        debs_out.mkdir()
        if offline:
            sources = local_repository(image.debs_dir, out, recipe["suite"])
            # Every kept package by name: the flat index's priorities are the .debs' own, not
            # the archive's, so mmdebstrap's "required" set would differ (apt is not in it).
            kept = sorted({i[0] for d in image.debs_dir.glob("*.deb") if (i := deb_identity(d.name))})
            argv_image = dataclasses.replace(image, packages=(*image.packages, *kept))
    elif offline:
        raise RigdError(f"{what}: this image keeps no .debs, so it cannot be built offline")
    argv = mmdebstrap_argv(r, argv_image, tar, sources=sources, debs_in=debs_in, debs_out=debs_out)
    mode = " (offline)" if offline else ""
    log(f"{what}: mmdebstrap {recipe['suite']}{mode} (this takes a minute or more)")
    t0 = time.monotonic()
    env = dict(os.environ, SOURCE_DATE_EPOCH=str(epoch))
    res = subprocess.run(argv, capture_output=True, text=True, env=env, check=False)
    if res.returncode != 0:
        raise RigdError(f"mmdebstrap failed: {res.stderr.strip()[-3000:]}")
    t1 = time.monotonic()
    installed = _installed(tar) if image.debs_dir is not None else {}
    if image.debs_dir is not None and debs_out is not None:
        # This build's .debs replace the previous build's, and only what the image
        # holds is kept (a directory seeded from another build keeps nothing extra).
        for index in ("Packages", "Release"):
            (debs_out / index).unlink(missing_ok=True)
        for deb in debs_out.iterdir():
            ident = deb_identity(deb.name) if deb.is_file() else None
            if ident is None or installed.get(ident[0]) != ident[1]:
                remove_tree(deb)  # apt's partial/ directory, another build's .debs
        remove_tree(image.debs_dir)
        os.rename(debs_out, image.debs_dir)
    log(f"{what}: rootfs tarball {tar.stat().st_size >> 20} MiB in {t1 - t0:.0f} s; writing OCI layout")
    digest = oci.write_layout(
        out / "oci",
        tar,
        epoch=epoch,
        config=recipe["config"],
        gzip_level=int(recipe.get("gzip_level", 6)),
        annotations={"org.opencontainers.image.title": image.title},
    )
    tar_bytes = tar.stat().st_size
    tar.unlink()
    for p in (out / "oci").rglob("*"):
        if p.is_file():
            p.chmod(READ_ONLY_MODE)
    (out / "digest").write_text(digest + "\n")
    (out / "digest").chmod(READ_ONLY_MODE)
    manifest = oci.load_manifest(out / "oci", digest)
    doc: dict[str, Any] = {
        "digest": digest,
        "suite": recipe["suite"],
        "packages": list(image.packages),
        "rootfs_tar_bytes": tar_bytes,
        "layer_bytes": manifest.layers[0].size,
        "mmdebstrap_seconds": round(t1 - t0, 1),
        "layout_seconds": round(time.monotonic() - t1, 1),
    }
    if image.debs_dir is not None:
        doc["offline"] = offline
        doc["installed"] = installed
    (out / "build.json").write_text(json.dumps(doc, indent=1) + "\n")
    log(f"{what}: {digest} (layer {manifest.layers[0].size >> 20} MiB)")


def deb_identity(filename: str) -> tuple[str, str] | None:
    """``(package, version)`` from an archive file name ``name_version_arch.deb``
    (apt writes an epoch's colon as ``%3a``); None for anything else."""
    if not filename.endswith(".deb"):
        return None
    parts = filename[:-4].split("_")
    if len(parts) != 3:
        return None
    return parts[0], parts[1].replace("%3a", ":").replace("%3A", ":")


def _installed(tar: Path) -> dict[str, str]:
    """``{package: version}`` of what the tarball's dpkg status lists (the image's own pins)."""
    res = subprocess.run(["tar", "-xOf", str(tar), "./var/lib/dpkg/status"], capture_output=True, check=False)
    if res.returncode != 0:
        return {}
    out: dict[str, str] = {}
    name = None
    for line in res.stdout.decode(errors="replace").splitlines():
        if line.startswith("Package: "):
            name = line[9:].strip()
        elif line.startswith("Version: ") and name is not None:
            out[name] = line[9:].strip()
    return dict(sorted(out.items()))


def build_image(r: Recipes, image: OciImage, cache_dir: Path, log: Log, *,
                offline: bool = False) -> tuple[Path, str]:
    """Return ``(oci_layout, manifest_digest)`` of ``image``, building it if needed."""
    d = cached_build(cache_dir / image.kind, image_key(r, image), f"{image.kind} image",
                     lambda out: _build(r, image, out, log, offline=offline), log)
    return d / "oci", (d / "digest").read_text().strip()


def find_image(r: Recipes, image: OciImage, cache_dir: Path) -> tuple[Path, str] | None:
    """``(oci_layout, manifest_digest)`` of ``image`` if it is built (never builds)."""
    d = cache_dir / image.kind / image_key(r, image)
    digest = d / "digest"
    if not digest.is_file():
        return None
    return d / "oci", digest.read_text().strip()


def build_terminal(r: Recipes, cache_dir: Path, log: Log) -> tuple[Path, str]:
    """Return ``(oci_layout, manifest_digest)``, building if needed."""
    return build_image(r, terminal_image(r), cache_dir, log)


