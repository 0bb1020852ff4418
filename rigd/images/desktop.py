"""The computer (desktop) image: Debian bookworm + Xorg + XFCE + three browsers, as a qcow2.

How this works
--------------
``mmdebstrap`` installs ``images/desktop/packages.txt`` plus the kernel .deb
pinned in ``images/desktop/kernel.lock`` (downloaded and sha256-checked by
:mod:`rigd.images.debs`) into a plain directory — no loop mounts, no
chroot of our own; ``images/desktop/customize.sh`` adds the user, the
autologin, the Xorg tuning and the guest agent's unit (the agent itself is
not in the image: it comes on the rig's tools disk, mounted at ``/.rigd`` by
our initramfs, so that a change to it never rebuilds this image). Then, in Python:

1. the image kernel's bzImage is unpacked to the ELF ``vmlinux`` (PVH boot,
   :mod:`rigd.images.vmlinux`); modules for hardware a rig never has are
   pruned (``prune_modules`` in the recipe) and ``depmod`` re-run;
2. our initramfs is built from the *image's* modules (virtio_pci, virtio_blk,
   ext4 …, ``images/desktop/initramfs/modules.txt``), static busybox and
   ``images/desktop/initramfs/init``, with the helpers of the terminal
   initramfs (:mod:`rigd.images.initramfs`, :mod:`rigd.images.cpio`);
3. the marker ``/etc/rigd/image.json`` (guest protocol, kernel and initramfs
   paths inside the image) is written, and a copy of the initramfs is put at
   ``/boot/rigd/initrd.img`` so a bare qcow2 carries everything it needs
   (:mod:`rigd.images.importer` reads them back);
4. ``mke2fs -t ext4 -d`` makes a sparse raw filesystem with the recipe's
   headroom, and ``qemu-img convert -O qcow2`` (zstd-compressed clusters)
   turns it into the disk; the raw file is deleted.

The Debian packages mmdebstrap downloads are kept in ``<cache>/desktop-debs``
between builds (synced in and out of the chroot's apt archive), so a rebuild
after a recipe change downloads only what changed.

Output directory (``<cache>/desktop/<key>/``), every file 0444::

    desktop.qcow2      the disk (a rig boots a thin overlay of it)
    vmlinux            the image's kernel, uncompressed ELF
    initrd.img         our initramfs (uncompressed newc)
    rigd-image.json    the manifest (rigd.image/v1) — import it with
                       rigd.images.importer.import_image
    build.json         what was built, from what, how long each step took

The build must run as root (mmdebstrap's root mode writes the tree with
real owners, which ``mke2fs -d`` copies).
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from rigd.errors import RigdError
from rigd.images import cpio, debs, initramfs
from rigd.images.cache import (
    READ_ONLY_MODE,
    Log,
    builder_sources,
    cached_build,
    default_cache_dir,
    recipe_key,
    remove_tree,
    sha256_file,
)
from rigd.images.ext4 import MiB, make_ext4, tree_usage
from rigd.images.manifest import (
    MANIFEST_NAME,
    MARKER_PATH,
    FileRef,
    ImageManifest,
    ImageMarker,
    parse_manifest,
)
from rigd.images.recipes import Recipes, read_packages
from rigd.images.vmlinux import extract_vmlinux

NOT_BUILT = "desktop image not built; run `python -m rigd.images desktop`"
DISK = "desktop.qcow2"
KERNEL = "vmlinux"
INITRD = "initrd.img"
#: Where the initramfs is kept inside the image (for bare-qcow2 imports).
INITRD_IN_IMAGE = "/boot/rigd/initrd.img"


@dataclass(frozen=True, slots=True)
class DesktopImage:
    dir: Path
    disk: Path  # desktop.qcow2
    kernel: Path  # vmlinux (PVH ELF)
    initrd: Path  # initrd.img
    manifest_path: Path  # rigd-image.json
    manifest: ImageManifest

    @property
    def guest_protocol(self) -> int:
        return self.manifest.guest_protocol

    @property
    def kernel_release(self) -> str:
        return self.manifest.kernel_release

    @property
    def cmdline(self) -> tuple[str, ...]:
        """What the image needs on the kernel command line (beyond the console)."""
        return self.manifest.cmdline


def load_recipe(r: Recipes) -> dict[str, Any]:
    path = r.desktop_dir / "recipe.json"
    try:
        doc = json.loads(path.read_text())
    except (OSError, json.JSONDecodeError) as exc:
        raise RigdError(f"cannot read {path}: {exc}") from exc
    for key, typ in (
        ("suite", str),
        ("variant", str),
        ("source_date_epoch", int),
        ("guest_protocol", int),
        ("surface", str),
        ("display", dict),
        ("headroom_mib", int),
        ("qcow2", dict),
        ("cmdline", list),
        ("dpkg_options", list),
        ("apt_options", list),
        ("prune_modules", list),
    ):
        if not isinstance(doc.get(key), typ):
            raise RigdError(f"{path}: {key} must be a {typ.__name__}", field=key)
    for rel in doc["prune_modules"]:
        if not isinstance(rel, str) or rel.startswith("/") or ".." in rel.split("/"):
            raise RigdError(f"{path}: prune_modules: {rel!r} must be a relative path", field="prune_modules")
    return doc  # type: ignore[no-any-return]


def desktop_key_files(r: Recipes) -> list[Path]:
    """What the image's cache key hashes: its recipe and the code that builds it, nothing else.

    The guest agent is not in the image (it comes on the rig's tools disk,
    like a terminal's), so a change to the agent, the importer or the CLI
    never rebuilds this 700 MB image.
    """
    return [
        r.sources,
        r.busybox_lock,
        *sorted(p for p in r.desktop_dir.rglob("*") if p.is_file()),
        *builder_sources(
            "desktop", "manifest", "recipes", "debs", "ext4", "initramfs", "cpio", "vmlinux"
        ),
    ]


def desktop_key(r: Recipes) -> str:
    return recipe_key(desktop_key_files(r), root=r.root)


def mmdebstrap_argv(
    r: Recipes,
    recipe: dict[str, Any],
    target: Path,
    kernel_deb: Path,
    *,
    debs_in: Path,
    debs_out: Path,
) -> list[str]:
    exe = shutil.which("mmdebstrap")
    if exe is None:
        raise RigdError("`mmdebstrap` is not installed (apt-get install mmdebstrap)")
    pkgs = read_packages(r.desktop_dir / "packages.txt")
    return [
        exe,
        f"--variant={recipe['variant']}",
        "--mode=root",
        "--format=directory",
        "--include=" + ",".join([*pkgs, str(kernel_deb)]),
        *(f"--dpkgopt={o}" for o in recipe["dpkg_options"]),
        *(f"--aptopt={o}" for o in recipe["apt_options"]),
        # Keep downloaded debs between builds: sync them in before apt runs;
        # after autoclean (which drops what the archive no longer offers) sync
        # them out to a fresh directory that replaces the old one.
        '--setup-hook=mkdir -p "$1"/var/cache/apt/archives/',
        f"--setup-hook=sync-in {debs_in} /var/cache/apt/archives/",
        '--customize-hook=chroot "$1" apt-get -qq autoclean',
        f"--customize-hook=sync-out /var/cache/apt/archives {debs_out}",
        f'--customize-hook=sh {r.desktop_dir / "customize.sh"} "$1" {r.desktop_dir}',
        recipe["suite"],
        str(target),
        str(r.sources),
    ]


def _depmod() -> str:
    for cand in (shutil.which("depmod"), "/usr/sbin/depmod", "/sbin/depmod"):
        if cand and Path(cand).is_file():
            return cand
    raise RigdError("`depmod` is not installed (Debian package kmod)")


def _du(path: Path) -> int:
    return tree_usage(path)[0] if path.exists() else 0


def prune_modules(tree: Path, release: str, prune: list[str], log: Log) -> int:
    """Remove module subtrees a rig never loads; re-run depmod. Returns bytes freed."""
    mdir = tree / "lib" / "modules" / release
    freed = 0
    for rel in prune:
        p = mdir / rel
        if p.exists():
            freed += _du(p)
            remove_tree(p)
    res = subprocess.run(
        [_depmod(), "-b", str(tree), release], capture_output=True, text=True, check=False
    )
    if res.returncode != 0:
        raise RigdError(f"depmod failed for {release}: {res.stderr.strip()}")
    log(f"desktop: pruned {freed >> 20} MiB of kernel modules")
    return freed


def build_initrd(
    r: Recipes, tree: Path, release: str, cache_dir: Path, out: Path, log: Log, epoch: int
) -> None:
    """Our initramfs, from the image's own modules (so kernel and modules always match).

    Reuses the terminal initramfs's pieces as they are (module index, cpio
    entries, busybox); its module reader is private there, and is used here
    rather than touched, so that the terminal assets keep their cache keys.
    """
    md = tree / "lib" / "modules" / release
    index = initramfs.ModuleIndex.parse(
        (md / "modules.dep").read_text(),
        (md / "modules.builtin").read_text(),
        (md / "modules.softdep").read_text() if (md / "modules.softdep").is_file() else "",
    )
    order = index.load_order(initramfs.read_wanted(r.desktop_dir / "initramfs" / "modules.txt"))
    modules: list[tuple[str, bytes]] = []
    for rel in order:
        modules.append((initramfs.module_name(rel) + ".ko", initramfs._module_bytes(md / rel)))
    work = out.parent / ".busybox"
    bb = initramfs.busybox_binary(r, cache_dir, work, log)
    remove_tree(work)
    members = initramfs.entries(
        init=(r.desktop_dir / "initramfs" / "init").read_bytes(), busybox=bb, modules=modules
    )
    with out.open("wb") as f:
        cpio.write_newc(members, f, mtime=epoch)
    names = ", ".join(n for n, _ in modules)
    log(f"desktop: initramfs {len(modules)} modules ({names}), {out.stat().st_size >> 10} KiB")


def _run(argv: list[str], what: str, env: dict[str, str] | None = None) -> None:
    res = subprocess.run(argv, capture_output=True, text=True, env=env, check=False)
    if res.returncode != 0:
        raise RigdError(f"{what} failed: {(res.stderr or res.stdout).strip()[-3000:]}")


def _build(r: Recipes, cache_dir: Path, out: Path, log: Log) -> None:
    if os.geteuid() != 0:
        raise RigdError("building the desktop image needs root (mmdebstrap --mode=root, real file owners)")
    recipe = load_recipe(r)
    epoch = int(recipe["source_date_epoch"])
    steps: dict[str, float] = {}
    t = time.monotonic()

    lock = debs.load_lock(r.desktop_kernel_lock)
    pins = [p for p in lock.packages if p.name.startswith("linux-image-")]
    if len(pins) != 1:
        raise RigdError(f"{r.desktop_kernel_lock}: must pin exactly one linux-image-* package")
    (kernel_deb,) = debs.fetch(pins, cache_dir, r.sources, log)

    tree = out / ".root"
    debs_in = cache_dir / "desktop-debs"
    debs_in.mkdir(exist_ok=True)
    debs_out = out / ".debs"
    debs_out.mkdir()
    log(f"desktop: mmdebstrap {recipe['suite']} (a few minutes; downloads ~700 MB on a cold cache)")
    # INITRD=No: the kernel's postinst skips update-initramfs. Debian's
    # initramfs is never booted (ours is faster, docs/images.md) and making it
    # costs build time.
    env = dict(os.environ, SOURCE_DATE_EPOCH=str(epoch), INITRD="No")
    _run(
        mmdebstrap_argv(r, recipe, tree, kernel_deb, debs_in=debs_in, debs_out=debs_out),
        "mmdebstrap",
        env,
    )
    # The previous build's debs give way to this one's (nothing stale is kept).
    remove_tree(debs_in)
    os.rename(debs_out, debs_in)
    steps["mmdebstrap"] = time.monotonic() - t
    t = time.monotonic()

    vmlinuz = sorted((tree / "boot").glob("vmlinuz-*"))
    if len(vmlinuz) != 1:
        raise RigdError(f"the image has {len(vmlinuz)} kernels in /boot; expected one")
    release = vmlinuz[0].name.removeprefix("vmlinuz-")
    elf, compressor = extract_vmlinux(vmlinuz[0].read_bytes())
    (out / KERNEL).write_bytes(elf)
    # Debian's own initramfs is never used (ours boots faster: docs/images.md).
    for f in (tree / "boot").glob("initrd.img-*"):
        f.unlink()
    prune_modules(tree, release, recipe["prune_modules"], log)
    build_initrd(r, tree, release, cache_dir, out / INITRD, log, epoch)
    (tree / "boot" / "rigd").mkdir(exist_ok=True)
    shutil.copyfile(out / INITRD, tree / INITRD_IN_IMAGE.lstrip("/"))
    display = recipe["display"]
    marker = ImageMarker(
        surface=recipe["surface"],
        guest_protocol=int(recipe["guest_protocol"]),
        kernel_release=release,
        cmdline=tuple(recipe["cmdline"]),
        width=int(display["width"]),
        height=int(display["height"]),
        kernel_path=f"/boot/vmlinuz-{release}",
        initrd_path=INITRD_IN_IMAGE,
    )
    marker_file = tree / MARKER_PATH.lstrip("/")
    marker_file.parent.mkdir(parents=True, exist_ok=True)
    marker_file.write_text(json.dumps(marker.to_json(), indent=1, sort_keys=True) + "\n")
    (marker_file.parent / "guest-protocol").write_text(f"{marker.guest_protocol}\n")
    steps["kernel+initramfs"] = time.monotonic() - t
    t = time.monotonic()

    used, inodes = tree_usage(tree)
    raw = out / ".rootfs.img"
    make_ext4(
        tree,
        raw,
        size_bytes=used + used // 10 + int(recipe["headroom_mib"]) * MiB,
        label="rigd-desktop",
        journal=True,
        inodes=inodes + 200_000,
        seed=f"desktop:{out.name}",
        epoch=epoch,
    )
    remove_tree(tree)
    steps["mke2fs"] = time.monotonic() - t
    t = time.monotonic()

    qopts = recipe["qcow2"]
    convert = [shutil.which("qemu-img") or "qemu-img", "convert", "-f", "raw", "-O", "qcow2"]
    if qopts.get("compression"):
        convert += ["-c", "-o", f"compression_type={qopts['compression']}"]
    _run([*convert, str(raw), str(out / DISK)], "qemu-img convert")
    raw_bytes = raw.stat().st_size
    raw.unlink()
    steps["qcow2"] = time.monotonic() - t

    manifest = ImageManifest(
        surface=marker.surface,
        guest_protocol=marker.guest_protocol,
        kernel_release=release,
        cmdline=marker.cmdline,
        width=marker.width,
        height=marker.height,
        disk=_ref(out / DISK),
        kernel=_ref(out / KERNEL),
        initrd=_ref(out / INITRD),
    )
    (out / MANIFEST_NAME).write_text(manifest.dumps())
    (out / "build.json").write_text(
        json.dumps(
            {
                "suite": recipe["suite"],
                "kernel": {"release": release, "deb": pins[0].to_json(), "compressor": compressor},
                "packages": read_packages(r.desktop_dir / "packages.txt"),
                "tree_bytes": used,
                "ext4_apparent_bytes": raw_bytes,
                "qcow2_bytes": (out / DISK).stat().st_size,
                "seconds": {k: round(v, 1) for k, v in steps.items()},
            },
            indent=1,
        )
        + "\n"
    )
    for name in (DISK, KERNEL, INITRD, MANIFEST_NAME, "build.json"):
        (out / name).chmod(READ_ONLY_MODE)
    log(
        f"desktop: {release}, tree {used >> 20} MiB, qcow2 {(out / DISK).stat().st_size >> 20} MiB; "
        + ", ".join(f"{k} {v:.0f} s" for k, v in steps.items())
    )


def _ref(path: Path) -> FileRef:
    return FileRef(path.name, sha256_file(path), path.stat().st_size)


def _image(d: Path) -> DesktopImage:
    mpath = d / MANIFEST_NAME
    return DesktopImage(
        dir=d,
        disk=d / DISK,
        kernel=d / KERNEL,
        initrd=d / INITRD,
        manifest_path=mpath,
        manifest=parse_manifest(mpath.read_bytes(), str(mpath)),
    )


def build_desktop(cache_dir: Path | None = None, *, log: Log = print) -> DesktopImage:
    """Build the desktop image if it is not cached yet; return it.

    Synchronous and slow on a cold cache (minutes: mmdebstrap dominates); a
    second call only hashes the recipe.
    """
    cache = cache_dir or default_cache_dir()
    cache.mkdir(parents=True, exist_ok=True)
    r = Recipes.find()
    t0 = time.monotonic()
    d = cached_build(
        cache / "desktop", desktop_key(r), "desktop image", lambda out: _build(r, cache, out, log), log
    )
    log(f"desktop: ready in {time.monotonic() - t0:.1f} s ({d})")
    return _image(d)


def find_desktop(cache_dir: Path | None = None) -> DesktopImage:
    """The desktop image of the current recipe, without building; RigdError if absent."""
    cache = cache_dir or default_cache_dir()
    d = cache / "desktop" / desktop_key(Recipes.find())
    if not (d / MANIFEST_NAME).is_file():
        raise RigdError(NOT_BUILT, cache_dir=str(cache))
    return _image(d)


__all__ = ["DesktopImage", "build_desktop", "desktop_key", "desktop_key_files", "find_desktop", "load_recipe"]
