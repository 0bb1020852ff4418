"""Browser rigs: the boot recipe and driver of a browser microVM (one engine per rig).

A browser rig is a terminal-shaped microVM — the same kernel, initramfs,
tools disk and guest agent, the same ``microvm`` command line
(:func:`rigd.backends.smolvm.rig_argv`) — whose root is the engine's pack
(:mod:`rigd.images.browser`). What the surface adds lives in the driver:
once the agent has said hello, :meth:`BrowserDriver.ready` starts the engine
through the agent's ``exec`` as the image's unprivileged ``browser`` user
with a throwaway profile in ``/tmp`` (the rig's overlay; gone with the rig),
then asks DevTools on guest loopback (``curl /json/version``, through exec
again) until it answers, the engine dies, or the boot deadline passes.

Only Chromium is started so far (``--headless=new``, DevTools on
127.0.0.1:9223 inside the guest; the host-side relay to 9222 and the CDP
client are the next steps of issue 12). Warm starts are off for browser
rigs until a snapshot with a running engine is measured.
"""

from __future__ import annotations

import shlex
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

import trio

from rigd.backends.base import Frame, MachineSpec
from rigd.backends.lanes import DropTarget
from rigd.backends.qemu import QemuConfig, timeouts_for
from rigd.backends.recipe import PLACEHOLDER_PATHS, Identity, RigPaths
from rigd.backends.smolvm import rig_argv
from rigd.errors import BackendError, FieldError, RigdError
from rigd.images.browser import BrowserAssets, Engine
from rigd.model import Accel, Backend, Surface
from rigd.protocols.devtools import MAX_VERSION_BYTES, DevToolsVersion, parse_version

if TYPE_CHECKING:
    from rigd.backends.qemu import QemuMachine
    from rigd.protocols.input import Step
    from rigd.verbs import Action

#: Where Chromium's DevTools listens inside the guest (loopback only).
GUEST_DEVTOOLS_PORT = 9223
#: The image's unprivileged user (images/browser/customize.sh).
BROWSER_USER = "browser"
#: The engine's pid and its stdout/stderr, in the guest's /run (tmpfs).
PID_FILE = "/run/rigd-browser.pid"
LOG_FILE = "/run/rigd-browser.log"
#: How often readiness asks DevTools (each ask is one exec: ~0.1-0.3 s under TCG).
POLL_S = 0.5
#: Where dropped files land for engines without a drop event (issue 12; Chromium gets a
#: real drop event later). In the guest: the rig's own /tmp, not the host's.
BROWSER_DROPS = DropTarget(dir="/tmp/cc-drops", owner=BROWSER_USER, told="none")  # noqa: S108

CHROMIUM_FLAGS = (
    "--headless=new",
    "--remote-debugging-address=127.0.0.1",
    "--no-first-run",
    "--no-default-browser-check",
    "--disable-gpu",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
    "--disable-default-apps",
    "--disable-breakpad",
    "--password-store=basic",
    "--window-size=1280,800",  # the browser's boot display (RIGS.md §7)
)


def chromium_launch_script(*, port: int = GUEST_DEVTOOLS_PORT, sandbox: bool = True) -> str:
    """The shell script (run as root by the agent) that starts Chromium in the
    background as :data:`BROWSER_USER` with a fresh profile, and prints the profile dir.

    The engine gets a clean environment (its own HOME inside the profile) and
    no capabilities; its output goes to :data:`LOG_FILE` (never to the exec's
    pipes, so the exec returns as soon as the script does).
    """
    flags = [*CHROMIUM_FLAGS, f"--remote-debugging-port={port}"]
    if not sandbox:
        flags.append("--no-sandbox")
    u = shlex.quote(BROWSER_USER)
    return "\n".join([
        "set -eu",
        "p=$(mktemp -d /tmp/rigd-profile.XXXXXXXX)",
        f'chown {u}:{u} "$p"',
        'chmod 0700 "$p"',
        f"setsid setpriv --reuid={u} --regid={u} --init-groups --inh-caps=-all --bounding-set=-all \\",
        '  env -i HOME="$p" PATH=/usr/bin:/bin LANG=C.UTF-8 \\',
        f'  /usr/bin/chromium {" ".join(flags)} --user-data-dir="$p" about:blank \\',
        f"  </dev/null >{LOG_FILE} 2>&1 &",
        f"echo $! >{PID_FILE}",
        'printf "%s\\n" "$p"',
    ])


def devtools_probe_script(port: int = GUEST_DEVTOOLS_PORT) -> str:
    """Exit 0 with DevTools' ``/json/version`` on stdout; 1 when it does not answer
    yet; 3 (with the engine's log tail on stderr) when the engine is gone."""
    return "\n".join([
        f"curl -sf --max-time 3 http://127.0.0.1:{port}/json/version && exit 0",
        f'pid=$(cat {PID_FILE} 2>/dev/null) || pid=""',
        'if [ -z "$pid" ] || ! kill -0 "$pid" 2>/dev/null; then',
        f"  tail -c 2000 {LOG_FILE} >&2; exit 3",
        "fi",
        "exit 1",
    ])


@dataclass
class BrowserDriver:
    """The browser's half of a running machine (verbs come with the CDP client)."""

    machine: QemuMachine
    engine: Engine
    sandbox: bool = True
    drop_target: DropTarget = BROWSER_DROPS
    #: What DevTools said once it answered.
    version: DevToolsVersion | None = None
    #: The engine's throwaway profile directory in the guest.
    profile: str | None = None
    #: Seconds from the engine's start to DevTools answering.
    devtools_s: float | None = None
    timings: dict[str, float] = field(default_factory=dict)

    @property
    def display(self) -> tuple[int, int] | None:
        return None  # headless: frames come from the engine (screencast), not a screen

    async def _sh(self, script: str, timeout_s: float,
                  max_output: int = 64 * 1024) -> tuple[int | None, bytes, bytes]:
        r = await self.machine.exec(["/bin/sh", "-c", script], cwd="/", env=None, stdin=None,
                                    timeout_s=timeout_s, max_output=max_output)
        return r.exit_code, r.stdout, r.stderr

    async def ready(self, progress: Callable[[str], None], *, warm: bool, left_s: float) -> None:
        if self.engine is not Engine.CHROMIUM:
            raise BackendError(f"the {self.engine.value} engine is not started by rigd yet")
        with trio.move_on_after(max(left_s, 1.0)) as scope:
            t0 = trio.current_time()
            if not warm:
                progress(f"starting {self.engine.value}")
                code, out, err = await self._sh(chromium_launch_script(sandbox=self.sandbox), 30)
                if code != 0:
                    raise BackendError(f"starting {self.engine.value} failed (exit {code}): "
                                       f"{err.decode(errors='replace')[-500:]}")
                self.profile = out.decode(errors="replace").strip()[:200]
            progress("waiting for DevTools")
            self.version = await self._wait_devtools()
            self.devtools_s = trio.current_time() - t0
        if scope.cancelled_caught:
            raise BackendError(f"{self.engine.value} DevTools did not answer within {int(left_s)} s",
                               console=self.machine.console_tail(1024))
        browser = self.version.browser if self.version else None
        self.machine.log.info("browser ready", extra={"engine": self.engine.value, "browser": browser,
                                                      "devtools_s": round(self.devtools_s or 0, 2)})

    async def _wait_devtools(self) -> DevToolsVersion:
        probe = devtools_probe_script()
        while True:
            code, out, err = await self._sh(probe, 10, max_output=MAX_VERSION_BYTES + 1)
            if code == 0:
                try:
                    return parse_version(out)
                except RigdError as exc:
                    raise BackendError(
                        f"{self.engine.value} DevTools answered nonsense: {exc.message}") from exc
            if code == 3:
                raise BackendError(f"{self.engine.value} exited before DevTools answered: "
                                   f"{err.decode(errors='replace')[-1500:]}")
            await trio.sleep(POLL_S)

    async def version_now(self) -> DevToolsVersion:
        """Ask DevTools again (a check that the engine still answers)."""
        code, out, err = await self._sh(devtools_probe_script(), 10, max_output=MAX_VERSION_BYTES + 1)
        if code != 0:
            raise BackendError(f"{self.engine.value} DevTools does not answer (exit {code}): "
                               f"{err.decode(errors='replace')[-500:]}")
        return parse_version(out)

    async def perform(self, action: Action) -> dict[str, Any]:
        raise FieldError("action.action", f"browser verbs are not implemented yet, not {action.verb}")

    async def still(self, *, max_w: int, max_h: int, fmt: str, quality: int,
                    mark_cursor: bool) -> Frame:
        raise FieldError("action.action", "browser screenshots are not implemented yet")

    async def send_input(self, steps: Sequence[Step]) -> None:
        raise FieldError("action.action", "browser input is not implemented yet")


#: A browser's cold boot: the agent's deadline plus the engine's start (Chromium
#: under TCG on 2 shared cores: see docs/images.md, "Browser image").
ENGINE_START_S = {Accel.TCG: 180.0, Accel.KVM: 60.0, Accel.HVF: 60.0}


@dataclass(frozen=True, slots=True)
class BrowserRecipe:
    """Browser machines of one engine, booting that engine's pack."""

    config: QemuConfig
    assets: BrowserAssets
    #: The pack's rootfs.img (raw ext4), every overlay's backing file.
    backing: Path
    sandbox: bool = True
    surface: Surface = Surface.BROWSER
    backing_format: str = "raw"

    @property
    def engine(self) -> Engine:
        return self.assets.engine

    def identity(self, spec: MachineSpec) -> Identity:
        return Identity(Backend.SMOLVM, self.config.accel, self.assets.boot.image_digest)

    def boot_deadline_s(self, spec: MachineSpec) -> float:
        return timeouts_for(self.config.accel)[0] + ENGINE_START_S[self.config.accel]

    def argv(self, spec: MachineSpec, at: RigPaths, *, mac: str | None, incoming: bool,
             tap_fd: int | str | None) -> list[str]:
        return rig_argv(self.config, self.assets.boot, memory_mb=spec.memory_mb, vcpus=spec.vcpus,
                        rig_dir=at.rig_dir, overlay=at.overlay, mac=mac, incoming=incoming, tap_fd=tap_fd)

    def warm_eligible(self, spec: MachineSpec) -> bool:
        return False  # not until a snapshot with a running engine is measured (docs/images.md)

    def warm_shape(self, spec: MachineSpec) -> tuple[list[str], dict[str, Any]]:
        boot = self.assets.boot
        at = PLACEHOLDER_PATHS
        shape = rig_argv(
            self.config, boot, memory_mb=spec.memory_mb, vcpus=spec.vcpus, rig_dir=at.rig_dir,
            overlay=at.overlay, mac=None if self.config.network is None else "02:00:00:00:00:00",
            kernel=Path("/@kernel"), initrd=Path("/@initrd"), tools=Path("/@tools"), tap_fd="@fd",
        )
        material: dict[str, Any] = {
            name: {"key": path.parent.name, "file": path.name, "size": path.stat().st_size}
            for name, path in (("kernel", boot.kernel), ("initrd", boot.initrd), ("tools", boot.tools))
        }
        material["engine"] = {"engine": self.engine.value, "revision": self.assets.revision,
                              "image": boot.image_digest}
        return shape, material

    def driver(self, machine: QemuMachine) -> BrowserDriver:
        return BrowserDriver(machine, self.engine, sandbox=self.sandbox)


class BrowserImages:
    """The recipe source of browser rigs of one engine: its pack, made once (under a lock)."""

    def __init__(self, config: QemuConfig, assets: BrowserAssets,
                 ensure_pack: Callable[[Callable[[str], None]], Path]) -> None:
        self.config = config
        self.assets = assets
        self._ensure_pack = ensure_pack
        self._lock = trio.Lock()

    async def recipe(self, spec: MachineSpec, progress: Callable[[str], None]) -> BrowserRecipe:
        async with self._lock:
            backing = await trio.to_thread.run_sync(self._ensure_pack, progress)
        return BrowserRecipe(self.config, self.assets, backing)


__all__ = ["GUEST_DEVTOOLS_PORT", "BrowserDriver", "BrowserImages", "BrowserRecipe",
           "chromium_launch_script", "devtools_probe_script"]
