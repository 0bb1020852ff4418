"""Browser images: one Debian image per engine, booted as a microVM like a terminal.

A browser rig boots the same kernel, initramfs and tools disk (with the same
guest agent) as a terminal rig; only its root differs. That root is built by
the terminal image's builder (:class:`rigd.images.terminal.OciImage`) from
``images/browser/``: ``packages.txt`` (what every engine shares: PulseAudio
and ffmpeg for the audio lane, curl for the readiness check, fonts) plus
``engines/<engine>.txt``, and ``customize.sh`` run with the engine's name
(it adds the unprivileged ``browser`` user and ``/etc/rigd/browser.json``).

Each engine is its own image with its own cache key (``<cache>/browser-<engine>/<key>/``;
the key hashes the shared recipe files, that engine's list and the engine's
name, never another engine's list) and its own pack
(``<dataDir>/rigs/browser-packs/<digesthex>-<engine>-audio-v1-<engine>/``):
nothing is shared between engines but the boot assets. The .debs each
engine's build downloaded are kept in ``<cache>/browser-debs/<engine>/``, so
``offline=True`` rebuilds the same image with no network (see
:mod:`rigd.images.terminal`); ``build.json`` lists every installed package
and version.
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from pathlib import Path

from rigd.errors import FieldError, RigdError
from rigd.images.assets import TerminalAssets
from rigd.images.browser_recipe import DEFAULT_ENGINE, Engine, browser_image
from rigd.images.cache import Log, default_cache_dir
from rigd.images.initramfs import build_initramfs, initramfs_key
from rigd.images.kernel import KernelAsset, build_kernel, kernel_key
from rigd.images.pack import ensure_pack, pack_dir, run_as_root
from rigd.images.recipes import Recipes
from rigd.images.terminal import OciImage, build_image, find_image
from rigd.images.tools import build_tools, tools_key

PACKS = "browser-packs"


def parse_engine(value: object, field: str = "engine") -> Engine:
    """An engine by name; anything else is a field error (never the default)."""
    if isinstance(value, str):
        try:
            return Engine(value)
        except ValueError:
            pass
    names = ", ".join(e.value for e in Engine)
    raise FieldError(field, f"{field} must be one of {names}, not {value!r}")


@dataclass(frozen=True, slots=True)
class BrowserAssets:
    """What a browser rig of one engine boots: the microVM assets with that engine's image."""

    engine: Engine
    #: kernel, initramfs, tools disk (shared with terminals) and this engine's OCI layout + digest.
    boot: TerminalAssets
    #: The pack revision: engine + audio lane (``chromium-audio-v1-chromium``).
    revision: str


def _revision(r: Recipes, engine: Engine, image: OciImage) -> str:
    return f"{engine.value}-{image.recipe['audio_revision']}-{engine.value}"


def build_browser(engine: Engine = DEFAULT_ENGINE, cache_dir: Path | None = None, *, log: Log = print,
                  offline: bool = False) -> BrowserAssets:
    """Build (or find in the cache) what a browser rig of ``engine`` boots.

    Synchronous; minutes on a cold cache (mmdebstrap), a hash of the recipes
    when cached. ``offline`` rebuilds from the .debs an earlier build kept.
    """
    cache = cache_dir or default_cache_dir()
    cache.mkdir(parents=True, exist_ok=True)
    r = Recipes.find()
    t0 = time.monotonic()
    kernel = build_kernel(r, cache, log)
    initrd = build_initramfs(r, kernel, cache, log)
    tools = build_tools(r, cache, log)
    image = browser_image(r, engine, cache)
    layout, digest = build_image(r, image, cache, log, offline=offline)
    log(f"browser ({engine.value}): ready in {time.monotonic() - t0:.1f} s (cache {cache})")
    boot = TerminalAssets(kernel=kernel.vmlinux, initrd=initrd, tools=tools.image, oci_layout=layout,
                          image_digest=digest, kernel_release=kernel.release)
    return BrowserAssets(engine, boot, _revision(r, engine, image))


def find_browser(engine: Engine = DEFAULT_ENGINE, cache_dir: Path | None = None) -> BrowserAssets:
    """The built assets of ``engine`` for the current recipes, without building anything."""
    cache = cache_dir or default_cache_dir()
    r = Recipes.find()
    image = browser_image(r, engine, cache)
    kdir = cache / "kernel" / kernel_key(r)
    initrd = cache / "initrd" / initramfs_key(r) / "initrd.img"
    tools = cache / "tools" / tools_key(r) / "tools.img"
    found = find_image(r, image, cache)
    missing = [name for name, ok in (("kernel", (kdir / "vmlinux").is_file()), ("initrd", initrd.is_file()),
                                     ("tools", tools.is_file()), ("image", found is not None)) if not ok]
    if missing or found is None:
        raise RigdError(f"{engine.value} browser image not built; run "
                        f"`python -m rigd.images browser --engine {engine.value}`",
                        missing=missing, cache_dir=str(cache))
    boot = TerminalAssets(kernel=kdir / "vmlinux", initrd=initrd, tools=tools, oci_layout=found[0],
                          image_digest=found[1], kernel_release=KernelAsset(kdir).release)
    return BrowserAssets(engine, boot, _revision(r, engine, image))


def browser_pack_dir(data_dir: Path, assets: BrowserAssets) -> Path:
    return pack_dir(data_dir, assets.boot.image_digest, revision=assets.revision, kind=PACKS)


def ensure_browser_pack(assets: BrowserAssets, data_dir: Path,
                        progress: Log = lambda _m: None) -> Path:
    """The ``rootfs.img`` of this engine's pack in ``data_dir``, made if absent."""
    return ensure_pack(assets.boot, data_dir, progress, revision=assets.revision, kind=PACKS)


#: The pack revision of a custom Chromium image (a workspace's ``rigs.smolvm.browserImage``):
#: the image's own files plus rigd's browser user (:func:`add_browser_user`).
CUSTOM_REVISION = "custom-v1-chromium"
BROWSER_UID = 1000


def _lines(path: Path) -> list[str]:
    try:
        return path.read_text(encoding="utf-8").splitlines()
    except FileNotFoundError:
        return []


def add_browser_user(tree: Path, state: Path) -> None:
    """Give a custom image's tree the unprivileged user the browser runs as (``browser``,
    uid/gid 1000, no password, no login shell, home ``/home/browser``), as
    ``images/browser/customize.sh`` does for the built images. An image that has it keeps
    it; one whose uid 1000 is someone else's is refused, naming them."""
    etc = tree / "etc"
    if etc.is_symlink() or not etc.is_dir():
        raise RigdError("the image has no /etc directory (or it is a symlink): not a Debian/Ubuntu base")
    passwd, group, shadow = etc / "passwd", etc / "group", etc / "shadow"
    for path in (passwd, group, shadow):
        if path.is_symlink():
            raise RigdError(f"the image's /etc/{path.name} is a symlink; refusing to edit it")
    users = [line.split(":") for line in _lines(passwd) if line.count(":") >= 6]
    mine = next((u for u in users if u[0] == "browser"), None)
    if mine is not None:
        if mine[2] != str(BROWSER_UID):
            raise RigdError(f"the image's user browser has uid {mine[2]}; rigd runs the browser as uid "
                            f"{BROWSER_UID}")
        return
    taken = next((u[0] for u in users if u[2] == str(BROWSER_UID)), None)
    if taken is not None:
        raise RigdError(f"uid {BROWSER_UID} is {taken!r} in the image; rigd runs the browser as the user "
                        f"browser with uid {BROWSER_UID}: rename that user or free the uid")
    home = "/home/browser"
    with passwd.open("a", encoding="utf-8") as f:
        f.write(f"browser:x:{BROWSER_UID}:{BROWSER_UID}:rigd browser:{home}:/usr/sbin/nologin\n")
    if not any(line.split(":")[0] == "browser" for line in _lines(group)):
        with group.open("a", encoding="utf-8") as f:
            f.write(f"browser:x:{BROWSER_UID}:\n")
    if shadow.exists():
        with shadow.open("a", encoding="utf-8") as f:
            f.write("browser:!:19000:0:99999:7:::\n")
    target = tree / "home" / "browser"
    if (tree / "home").is_symlink():
        raise RigdError("the image's /home is a symlink; refusing to make the browser's home through it")
    target.mkdir(parents=True, exist_ok=True)
    run_as_root(state, ["chown", f"{BROWSER_UID}:{BROWSER_UID}", str(target)])
    target.chmod(0o700)


__all__ = [
    "CUSTOM_REVISION",
    "DEFAULT_ENGINE",
    "BrowserAssets",
    "Engine",
    "add_browser_user",
    "browser_image",
    "browser_pack_dir",
    "build_browser",
    "ensure_browser_pack",
    "find_browser",
    "parse_engine",
]
