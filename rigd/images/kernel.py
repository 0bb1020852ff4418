"""The guest kernel: Debian's cloud kernel, unpacked to a PVH-bootable ELF + modules.

Output directory (``<cache>/kernel/<key>/``)::

    vmlinux            the uncompressed ELF (booted by PVH)
    release            e.g. "6.1.0-57-cloud-amd64"
    config             the kernel's .config, for reference
    modules/lib/modules/<release>/...   with modules.dep made by depmod

The .deb ships no ``modules.dep``; ``depmod -b`` makes one so the initramfs
builder can resolve each module's dependencies.
"""

from __future__ import annotations

import shutil
import subprocess
from dataclasses import dataclass
from pathlib import Path

from rigd.errors import RigdError
from rigd.images import debs
from rigd.images.cache import READ_ONLY_MODE, Log, builder_sources, cached_build, recipe_key
from rigd.images.recipes import Recipes
from rigd.images.vmlinux import extract_vmlinux


@dataclass(frozen=True, slots=True)
class KernelAsset:
    dir: Path

    @property
    def vmlinux(self) -> Path:
        return self.dir / "vmlinux"

    @property
    def release(self) -> str:
        return (self.dir / "release").read_text().strip()

    @property
    def modules_root(self) -> Path:
        """The ``-b`` base directory (contains ``lib/modules/<release>``)."""
        return self.dir / "modules"

    @property
    def modules_dir(self) -> Path:
        return self.modules_root / "lib" / "modules" / self.release


def kernel_key(r: Recipes) -> str:
    return recipe_key([r.kernel_lock, r.sources, *builder_sources("kernel", "debs", "vmlinux")], root=r.root)


def _depmod() -> str:
    for cand in (shutil.which("depmod"), "/usr/sbin/depmod", "/sbin/depmod"):
        if cand and Path(cand).is_file():
            return cand
    raise RigdError("`depmod` is not installed (Debian package kmod)")


def _build(r: Recipes, cache_dir: Path, out: Path, log: Log) -> None:
    lock = debs.load_lock(r.kernel_lock)
    pins = [p for p in lock.packages if p.name.startswith("linux-image-")]
    if len(pins) != 1:
        raise RigdError(f"{r.kernel_lock}: must pin exactly one linux-image-* package")
    (deb,) = debs.fetch(pins, cache_dir, r.sources, log)
    unpacked = out / ".deb"
    debs.extract(deb, unpacked)
    images = sorted((unpacked / "boot").glob("vmlinuz-*"))
    if len(images) != 1:
        raise RigdError(f"{deb.name}: expected one boot/vmlinuz-*, found {len(images)}")
    release = images[0].name.removeprefix("vmlinuz-")
    log(f"kernel: extracting vmlinux from {images[0].name}")
    elf, compressor = extract_vmlinux(images[0].read_bytes())
    (out / "vmlinux").write_bytes(elf)
    (out / "release").write_text(release + "\n")
    shutil.copyfile(unpacked / "boot" / f"config-{release}", out / "config")
    src_modules = unpacked / "lib" / "modules" / release
    if not src_modules.is_dir():
        raise RigdError(f"{deb.name}: no lib/modules/{release}")
    dest_modules = out / "modules" / "lib" / "modules"
    dest_modules.mkdir(parents=True)
    src_modules.rename(dest_modules / release)
    res = subprocess.run(
        [_depmod(), "-b", str(out / "modules"), release], capture_output=True, text=True, check=False
    )
    if res.returncode != 0:
        raise RigdError(f"depmod failed for {release}: {res.stderr.strip()}")
    debs.remove_tree(unpacked)
    for f in ("vmlinux", "release", "config"):
        (out / f).chmod(READ_ONLY_MODE)
    log(f"kernel: {release} ({compressor} payload, vmlinux {len(elf) >> 20} MiB)")


def build_kernel(r: Recipes, cache_dir: Path, log: Log) -> KernelAsset:
    d = cached_build(
        cache_dir / "kernel",
        kernel_key(r),
        "kernel",
        lambda out: _build(r, cache_dir, out, log),
        log,
    )
    return KernelAsset(d)
