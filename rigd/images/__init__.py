"""Images: build, pin and find what every rig boots from. See docs/images.md.

``build_all`` makes (or finds in the cache) the kernel, the initramfs, the tools
disk and the default terminal image; ``find_assets`` only looks, and says how to
build when something is missing. The desktop image (``desktop``), the browser
images (``browser``, one per engine: Chromium, Firefox ESR, WebKitGTK), imports
from OCI registries (``registry``, ``importer``) and packs (boot-ready root
filesystems, :func:`rigd.images.pack.ensure_pack`, per data directory) live in
their own modules.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from pathlib import Path

from rigd.errors import RigdError
from rigd.images.assets import TerminalAssets
from rigd.images.cache import default_cache_dir
from rigd.images.initramfs import build_initramfs, initramfs_key
from rigd.images.kernel import KernelAsset, build_kernel, kernel_key
from rigd.images.recipes import Recipes
from rigd.images.terminal import build_terminal, terminal_key
from rigd.images.tools import build_tools, tools_key

__all__ = ["TerminalAssets", "build_all", "find_assets"]

NOT_BUILT = "terminal image not built; run `make images`"


def build_all(cache_dir: Path | None = None, *, log: Callable[[str], None] = print) -> TerminalAssets:
    """Build every terminal asset that is not cached yet; return them all.

    Synchronous and slow on a cold cache (about a minute: mmdebstrap
    dominates); a second call only hashes the recipes.
    """
    cache = cache_dir or default_cache_dir()
    cache.mkdir(parents=True, exist_ok=True)
    r = Recipes.find()
    t0 = time.monotonic()
    kernel = build_kernel(r, cache, log)
    initrd = build_initramfs(r, kernel, cache, log)
    tools = build_tools(r, cache, log)
    layout, digest = build_terminal(r, cache, log)
    log(f"images: ready in {time.monotonic() - t0:.1f} s (cache {cache})")
    return TerminalAssets(
        kernel=kernel.vmlinux,
        initrd=initrd,
        tools=tools.image,
        oci_layout=layout,
        image_digest=digest,
        kernel_release=kernel.release,
    )


def find_assets(cache_dir: Path | None = None) -> TerminalAssets:
    """The assets for the current recipes, without building anything.

    Raises :class:`RigdError` ("terminal image not built; run `make images`")
    when any of them is missing — including when a recipe, a lock file, the
    builder or the guest agent changed since the last build.
    """
    cache = cache_dir or default_cache_dir()
    r = Recipes.find()
    kdir = cache / "kernel" / kernel_key(r)
    paths = {
        "kernel": kdir / "vmlinux",
        "initrd": cache / "initrd" / initramfs_key(r) / "initrd.img",
        "tools": cache / "tools" / tools_key(r) / "tools.img",
        "digest": cache / "terminal" / terminal_key(r) / "digest",
    }
    missing = [name for name, p in paths.items() if not p.is_file()]
    if missing:
        raise RigdError(NOT_BUILT, missing=missing, cache_dir=str(cache))
    return TerminalAssets(
        kernel=paths["kernel"],
        initrd=paths["initrd"],
        tools=paths["tools"],
        oci_layout=paths["digest"].parent / "oci",
        image_digest=paths["digest"].read_text().strip(),
        kernel_release=KernelAsset(kdir).release,
    )
