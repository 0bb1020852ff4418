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

Chromium (``--headless=new``, DevTools on guest loopback 9223) is driven
over CDP; Firefox ESR (its remote agent on guest loopback 9223, WebDriver
BiDi at ``/session``) over BiDi, through the same Trio connection
(:class:`rigd.browser.cdp.CDPConnection` with :class:`rigd.protocols.bidi.BiDiProtocol`);
WebKit (``WebKitWebDriver`` on guest loopback 9223, driving MiniBrowser on the
guest's own Xvfb display) over WebDriver classic
(:class:`rigd.browser.webdriver.WebDriverConnection`, one keep-alive HTTP/1.1
connection). Every way one socat relay in the guest (9222 → 9223) and the rig's own
virtio-serial port are the only path in; the engine's page driver
(:class:`rigd.browser.page.PageDriver`) does the verbs. A browser rig's warm start
restores a standby point taken at the agent's hello, before any engine runs (a running
engine is never cloned: docs/decisions.md), and starts an engine of its own.

Why one module of this size: :class:`BrowserDriver` is the one place a browser rig's
machine, engine process and page driver meet (start, readiness, the engine's death, the
live view's frames, drops, profiles put back); the recipe and the images beside it are
small, and the engines' own differences live in :mod:`rigd.browser`.
"""

from __future__ import annotations

import contextlib
import shlex
from collections.abc import AsyncIterator, Awaitable, Callable, Sequence
from contextlib import AbstractAsyncContextManager, asynccontextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any, Protocol

import trio

from rigd.backends.base import Frame, MachineSpec
from rigd.backends.browser_scripts import (
    BIDI_PATH,
    BROWSER_DROPS,
    BROWSER_USER,
    CHROMIUM_DROPS,
    DEVTOOLS_PORT_NAME,
    DEVTOOLS_SOCKET,
    GUEST_DEVTOOLS_PORT,
    LOG_FILE,
    POLL_S,
    RELAY_PORT,
    WEBKIT_DISPLAY,
    chromium_launch_script,
    devtools_probe_script,
    engine_watch_script,
    firefox_launch_script,
    relay_script,
    webkit_launch_script,
)
from rigd.backends.confine import UidPool
from rigd.backends.guest_client import request_screen
from rigd.backends.host import QemuBackend
from rigd.backends.lanes import DropTarget
from rigd.backends.layout import Layout
from rigd.backends.qemu import QemuConfig, timeouts_for
from rigd.backends.recipe import PLACEHOLDER_PATHS, Identity, RigPaths
from rigd.backends.smolvm import CustomPack, check_contract, rig_argv
from rigd.backends.warm import SnapshotService
from rigd.browser.cdp import open_cdp
from rigd.browser.chromium import BOOT_VIEWPORT, PageError, open_chromium
from rigd.browser.firefox import open_firefox
from rigd.browser.live_input import PointerState
from rigd.browser.page import CLIPBOARD_MAX_BYTES, TCG_TITLE_FACTOR, TITLE_TIMEOUT_S, PageDriver
from rigd.browser.profiles import ProfileRef, ProfileState, ProfileStore
from rigd.browser.webdriver import WebDriverConnection
from rigd.browser.webkit import MINIBROWSER, open_webkit
from rigd.errors import BackendError, FieldError, GuestError, GuestRefused, RigdError
from rigd.frames import Changes, Lane, Still
from rigd.images.browser import BrowserAssets, Engine
from rigd.model import HUMAN_STILL_MAX, Accel, Backend, Display, Surface
from rigd.model import Engine as ApiEngine
from rigd.protocols.bidi import BiDiProtocol
from rigd.protocols.cdp import CDPError
from rigd.protocols.devtools import MAX_VERSION_BYTES, DevToolsVersion, parse_version
from rigd.verbs import browser as bv
from rigd.verbs import is_observation, parse_action

if TYPE_CHECKING:
    from rigd.backends.qemu import QemuMachine
    from rigd.protocols.input import Step
    from rigd.verbs import Action

def _navigate(url: str) -> Action:
    parsed = parse_action("browser_use", {"action": "navigate", "url": url})
    if isinstance(parsed, RigdError):
        raise parsed
    return parsed



#: How long a written clipboard may take to read back (xclip's child takes the selection).
CLIP_SETTLE_S = 10.0
#: How long the guest agent may take to grab and encode a still of WebKit's display.
CAPTURE_S = 30.0
#: JPEG quality of the live view's screencast frames (as the desktop's live view).
CAST_QUALITY = 70
#: How long a live still waits for a new screencast's first frame before taking a screenshot.
CAST_FIRST_S = 3.0
#: How often a profile is saved with no action to prompt it, and how long after an action.
PROFILE_EVERY_S = 30.0
PROFILE_SETTLE_S = 2.0
#: How long the relays may take to start: the first answer through 9222 can take tens of
#: seconds from an engine that has just started under TCG (Firefox's remote agent, measured).
RELAY_START_S = 120.0
#: How long one engine watch may wait before it is asked again (the agent's exec deadline).
WATCH_S = 3600.0


class EngineConnection(Protocol):
    """What the rig watches of an engine's connection (CDP, BiDi or WebDriver's): its end."""

    async def wait_ended(self) -> str: ...


@dataclass
class BrowserDriver:
    """The browser's half of a running machine: the engine, its DevTools connection
    over the rig's own port, and the browser_use verbs on its page."""

    machine: QemuMachine
    engine: Engine
    sandbox: bool = True
    drop_target: DropTarget = CHROMIUM_DROPS
    viewport: Display = BOOT_VIEWPORT
    #: What DevTools said once it answered (Chromium); the engine's name and version (any engine).
    version: DevToolsVersion | None = None
    browser: str | None = None
    #: The engine's user-data directory in the guest (throwaway: a profile is kept over CDP).
    profile_dir: str | None = None
    #: Seconds from the engine's start to DevTools answering.
    devtools_s: float | None = None
    #: Seconds from DevTools answering to the page's driver ready (the session, the start page).
    session_s: float | None = None
    timings: dict[str, float] = field(default_factory=dict)
    #: The page's driver while the engine's connection is up.
    page: PageDriver | None = None

    #: Live views watching (each gets a damage notice per screencast frame).
    _viewers: list[Changes] = field(default_factory=list)
    #: The newest screencast frame (JPEG) and its size, while a screencast runs.
    _cast: tuple[bytes, int, int] | None = None
    _cast_scope: trio.CancelScope | None = None
    #: Set when the running screencast has delivered its first frame; when it has stopped.
    _cast_ready: trio.Event = field(default_factory=trio.Event)
    _cast_stopped: trio.Event = field(default_factory=trio.Event)
    #: The owner's profile this rig keeps (rigd.browser.profiles), and where profiles live.
    profile: ProfileRef | None = None
    profiles: ProfileStore | None = None
    #: What the profile holds as last saved (or loaded), and when it should be saved again.
    _profile_state: ProfileState | None = None
    _profile_dirty: trio.Event = field(default_factory=trio.Event)
    #: How many saves this rig made; what could not be restored.
    profile_saves: int = 0
    profile_problems: list[str] = field(default_factory=list)
    #: A person's pointer and held keys (live-view input, replayed through CDP).
    _pointer: PointerState = field(default_factory=PointerState)
    _input_lock: trio.Lock = field(default_factory=trio.Lock)
    #: The nursery of the engine's watchers while its connection is up (a profile taken over
    #: later is kept from there).
    _watch: trio.Nursery | None = None
    #: A custom image (a workspace's ``rigs.smolvm.browserImage``) not yet checked against
    #: the browser contract: checked before the engine starts.
    contract: CustomPack | None = None

    @property
    def display(self) -> tuple[int, int] | None:
        """The page's viewport (CSS px): what live-view frames show and input addresses."""
        v = self.page.viewport if self.page is not None else self.viewport
        return (v.width, v.height)

    @property
    def port_socket(self) -> Path:
        return self.machine.rig_dir / DEVTOOLS_SOCKET

    async def _sh(self, script: str, timeout_s: float,
                  max_output: int = 64 * 1024) -> tuple[int | None, bytes, bytes]:
        r = await self.machine.exec(["/bin/sh", "-c", script], cwd="/", env=None, stdin=None,
                                    timeout_s=timeout_s, max_output=max_output)
        return r.exit_code, r.stdout, r.stderr

    @property
    def firefox(self) -> bool:
        return self.engine is Engine.FIREFOX_ESR

    @property
    def webkit(self) -> bool:
        return self.engine is Engine.WEBKIT

    async def ready(self, progress: Callable[[str], None], *, warm: bool, left_s: float) -> None:
        if self.engine not in (Engine.CHROMIUM, Engine.FIREFOX_ESR, Engine.WEBKIT):
            raise BackendError(f"the {self.engine.value} engine is not started by rigd yet")
        with trio.move_on_after(max(left_s, 1.0)) as scope:
            t0 = trio.current_time()
            if self.contract is not None:
                progress("checking the image's browser contract")
                await check_contract(self.machine, self.contract, BROWSER_CONTRACT, "browser", left_s)
            if not warm:
                progress(f"starting {self.engine.value}")
                launch = (firefox_launch_script() if self.firefox else webkit_launch_script()
                          if self.webkit else chromium_launch_script(sandbox=self.sandbox))
                code, out, err = await self._sh(launch, 30)
                if code != 0:
                    raise BackendError(f"starting {self.engine.value} failed (exit {code}): "
                                       f"{err.decode(errors='replace')[-500:]}")
                self.profile_dir = out.decode(errors="replace").strip()[:200]
            progress("waiting for DevTools")
            self.version = await self._wait_devtools()
            self.devtools_s = trio.current_time() - t0
            progress("connecting to DevTools")
            path = BIDI_PATH if self.version is None else self.version.browser_path
            await self.machine.start_task(self._hold, path)
            self.session_s = trio.current_time() - t0 - self.devtools_s
        if scope.cancelled_caught:
            raise BackendError(f"{self.engine.value} DevTools did not answer within {int(left_s)} s",
                               console=self.machine.console_tail(1024))
        browser = self.browser
        self.machine.log.info("browser ready", extra={"engine": self.engine.value, "browser": browser,
                                                      "devtools_s": round(self.devtools_s or 0, 2),
                                                      "session_s": round(self.session_s or 0, 2)})

    async def _hold(self, path: str, *, task_status: trio.TaskStatus[None]) -> None:
        """The DevTools connection for the machine's life (started in its nursery).

        Connects to the rig's DevTools port first (so the guest's port relay finds the
        host there), starts the relays, then the WebSocket and the page's driver. When
        the connection drops, the page's renderer crashes or the engine exits, the rig
        fails saying which — the engine is never restarted behind the agent's back.
        """
        try:
            stream = await trio.open_unix_socket(str(self.port_socket))
        except OSError as exc:
            raise BackendError(f"cannot reach the rig's DevTools port: {exc}") from exc
        code, _out, err = await self._sh(relay_script(), RELAY_START_S)
        if code != 0:
            await stream.aclose()
            said = (f"within {RELAY_START_S:g} s" if code is None else f"(exit {code})")
            raise BackendError(f"the DevTools relay did not start {said}: "
                               f"{err.decode(errors='replace')[-500:]}",
                               console=self.machine.console_tail(1024))
        reason: str | None = None
        try:
            async with self._connect(stream, path) as (conn, page):
                if self.machine.config.accel is Accel.TCG:
                    page.title_timeout_s = TITLE_TIMEOUT_S * TCG_TITLE_FACTOR
                self.page = page
                reopened = False
                if self.profile is not None:
                    reopened = await self._restore_profile(page, self.profile)
                elif self.machine.spec.browser_state is not None:  # a fork's copy
                    reopened = await self._put_state(page, self.machine.spec.browser_state,
                                                     "the parent's engine")
                if not reopened:
                    # (a new or tab-less profile shows the start page too, once it has loaded)
                    await self._start_page_shown(page)
                task_status.started()
                async with trio.open_nursery() as watch:
                    self._watch = watch
                    async def ended(what: Awaitable[str]) -> None:
                        nonlocal reason
                        reason = await what
                        watch.cancel_scope.cancel()

                    watch.start_soon(ended, conn.wait_ended())
                    watch.start_soon(ended, page.ended())
                    watch.start_soon(ended, self._engine_exit())
                    if self.profile is not None:
                        watch.start_soon(self._keep_profile, page, self.profile)
        except Exception as exc:  # a teardown loses the channels; anything else fails the rig
            if self.machine.shutting_down:
                return
            raise BackendError(f"{self.engine.value}: the DevTools connection failed: {exc}"[:1000],
                               console=self.machine.console_tail(1024)) from exc
        finally:
            self.page = None
            self._watch = None
        if self.machine.shutting_down:
            return
        raise BackendError(f"{self.engine.value}: {reason or 'the DevTools connection ended'}",
                           console=self.machine.console_tail(1024))

    @property
    def _open_s(self) -> float:
        return DEVTOOLS_OPEN_S[self.machine.config.accel]

    async def _start_page_shown(self, page: PageDriver) -> None:
        """Wait until the first tab shows its start page (Chromium answers DevTools before that
        tab has committed its first navigation: on a loaded TCG host a rig could be ready on an
        empty document; the other engines' opens return on a loaded page). A tab still
        without it after a third of the DevTools wait is sent there, saying what it showed,
        its tabs and the engine's log; a page that never loads is not fatal (the agent can
        navigate): it is logged."""
        wait_s = DEVTOOLS_OPEN_S[self.machine.config.accel] / 3
        where = await page.start_page_state(wait_s)
        if where is True:
            return
        tabs: object = None
        with contextlib.suppress(CDPError):
            tabs = await page.tabs()
        _code, log_tail, _err = await self._sh(f"tail -c 1500 {LOG_FILE}", 10)
        self.machine.log.warning("the start page had not loaded: the tab is sent there", extra={
            "last": str(where)[:300], "tabs": str(tabs)[:600],
            "engine_log": log_tail.decode(errors="replace")[-1500:]})
        if self.profile_dir is not None:
            with contextlib.suppress(CDPError, PageError):
                await page.perform(bv.BrowserNavigate(url=f"file://{self.profile_dir}/start.html"))
            where = await page.start_page_state(wait_s)
            if where is True:
                return
        self.machine.log.warning("the start page did not load before the rig was handed out",
                                 extra={"last": str(where)[:300]})

    @asynccontextmanager
    async def _connect(self, stream: trio.abc.Stream,
                       path: str) -> AsyncIterator[tuple[EngineConnection, PageDriver]]:
        """The engine's connection over the rig's port, and the page's driver on it."""
        if self.webkit:
            # WebDriver classic: one keep-alive HTTP/1.1 connection through the relay.
            wd = WebDriverConnection(stream, host=f"127.0.0.1:{RELAY_PORT}", log=self.machine.log)
            start = f"file://{self.profile_dir}/start.html" if self.profile_dir else None
            try:
                async with open_webkit(wd, viewport=self.viewport, start_url=start, binary=MINIBROWSER,
                                       clipboard=self._x_clipboard, grab=self._display_grab) as webkit:
                    self.browser = f"WebKitGTK/{webkit.version}"
                    yield wd, webkit
            finally:
                await wd.aclose()
            return
        if self.firefox:
            # BiDi, with the guest-side authority as Host (the remote agent checks it).
            url = f"ws://127.0.0.1:{GUEST_DEVTOOLS_PORT}{path}"
            async with (open_cdp(url, stream=stream, log=self.machine.log, protocol=BiDiProtocol(),
                                 open_timeout=self._open_s) as conn,
                        open_firefox(conn, viewport=self.viewport) as firefox):
                self.browser = f"Firefox/{firefox.version}"
                yield conn, firefox
            return
        url = f"ws://127.0.0.1:{RELAY_PORT}{path}"
        async with (open_cdp(url, stream=stream, log=self.machine.log, open_timeout=self._open_s) as conn,
                    open_chromium(conn, viewport=self.viewport, first_tab_s=self._open_s) as chromium):
            self.browser = self.version.browser if self.version is not None else "Chromium"
            yield conn, chromium

    async def _display_grab(self, rect: tuple[int, int, int, int], max_w: int, max_h: int,
                            quality: int) -> tuple[bytes, int, int] | None:
        """The page from WebKit's X display, grabbed by the guest agent (Pillow, from the image)
        and cropped to ``rect``: a JPEG and its size; None (logged) when the agent cannot."""
        try:
            got = await request_screen(self.machine.channel(), timeout=CAPTURE_S + self.machine.grace,
                                       max_w=max_w, max_h=max_h, quality=quality, format="jpeg",
                                       markCursor=False, display=WEBKIT_DISPLAY, rect=list(rect))
        except (GuestRefused, GuestError) as exc:
            self.machine.log.info("the agent cannot grab WebKit's display; WebDriver's stills instead",
                                  extra={"reason": str(exc)[:300]})
            return None
        if (got.display_w, got.display_h) != rect[2:]:
            self.machine.log.info("the agent's grab is not the page's size; WebDriver's stills instead",
                                  extra={"got": [got.display_w, got.display_h], "rect": list(rect)})
            return None
        return got.data, got.image_w, got.image_h

    async def _x_clipboard(self, text: str | None) -> str:
        """The WebKit display's clipboard (``xclip`` as the browser user): its text, or set to
        ``text`` (xclip stays to serve it, as a copying program does)."""
        u = shlex.quote(BROWSER_USER)
        run = (f"setpriv --reuid={u} --regid={u} --init-groups --inh-caps=-all --bounding-set=-all "
               f"env -i PATH=/usr/bin:/bin LANG=C.UTF-8 DISPLAY={WEBKIT_DISPLAY} "
               "xclip -selection clipboard")
        if text is None:
            r = await self.machine.exec(["/bin/sh", "-c", f"{run} -o -t UTF8_STRING 2>/dev/null || true"],
                                        cwd="/", env=None, stdin=None, timeout_s=15,
                                        max_output=CLIPBOARD_MAX_BYTES + 4)
            return r.stdout[:CLIPBOARD_MAX_BYTES + 4].decode("utf-8", "replace")
        r = await self.machine.exec(["/bin/sh", "-c", f"{run} -i >/dev/null 2>&1"], cwd="/", env=None,
                                    stdin=text.encode(), timeout_s=15, max_output=4096)
        if r.exit_code != 0:
            raise BackendError(f"clipboard_write: xclip failed (exit {r.exit_code})")
        # xclip forks before its child owns the selection: a paste right away could read the
        # old clipboard. The text is there once it reads back (bounded).
        with trio.move_on_after(CLIP_SETTLE_S):
            while True:
                if await self._x_clipboard(None) == text:
                    return text
                await trio.sleep(0.05)
        raise BackendError(f"clipboard_write: the display's clipboard did not take the text "
                           f"within {CLIP_SETTLE_S:g} s")

    # -- the profile: restored before the first verb, saved after changes and every 30 s --

    def _engine_key(self) -> str:
        return IMAGE_ENGINE_KEY[self.engine]

    async def _restore_profile(self, page: PageDriver, ref: ProfileRef) -> bool:
        """Put the profile back into the running engine; True when it reopened a tab."""
        assert self.profiles is not None
        try:
            state = await trio.to_thread.run_sync(self.profiles.load, ref, self._engine_key())
        except RigdError as exc:
            # A profile that does not open is not replaced by a clean one behind the owner's back:
            # the rig fails saying so (they may close it and open without a profile).
            raise BackendError(f"{exc.message}") from exc
        if state is None:
            self._profile_state = ProfileState()
            return False
        self._profile_state = state
        return await self._put_state(page, state, f"profile {ref.name}")

    async def _put_state(self, page: PageDriver, state: ProfileState, what: str) -> bool:
        """Cookies, local storage and tabs into the running engine; True when it reopened a tab."""
        self.profile_problems = await page.import_profile(state)
        reopened = False
        if state.tabs:
            try:
                await page.perform(_navigate(state.tabs[0]))
                reopened = True
            except RigdError as exc:
                self.profile_problems.append(f"reopening {state.tabs[0][:100]}: {exc.message[:200]}")
        self.machine.log.info("browser state restored", extra={
            "from": what, "cookies": len(state.cookies), "tabs": len(state.tabs),
            "origins": len(state.storage), "problems": len(self.profile_problems)})
        return reopened

    async def browser_state(self) -> ProfileState:
        """What the engine holds now: cookies, the driven page's local storage (over what the
        kept profile had for other origins) and the open tabs, the driven page's first."""
        page = self.page
        if page is None:
            raise BackendError(f"{self.engine.value}: the engine is not connected")
        return await page.export_profile(self._profile_state)

    async def take_profile(self, owner: str, name: str) -> None:
        """A pooled rig's hand-over (issue 28): put the new owner's profile into the running
        engine as a rig opened with it does before its first verb (cookies, storage, the open
        tab), and keep it from now on."""
        page, watch = self.page, self._watch
        if page is None or watch is None or self.profiles is None:
            raise BackendError(f"{self.engine.value}: the engine is not connected; cannot load a profile")
        if self.profile is not None:
            raise BackendError(f"this rig already keeps profile {self.profile.name!r}")
        ref = ProfileRef(owner, name)
        await self._restore_profile(page, ref)
        self.profile = ref
        watch.start_soon(self._keep_profile, page, ref)

    async def _keep_profile(self, page: PageDriver, ref: ProfileRef) -> None:
        """Save the profile soon after anything that may change it, and every
        :data:`PROFILE_EVERY_S` (pages set cookies on their own); a failed save is logged and
        tried again, never the rig's failure."""
        assert self.profiles is not None
        while True:
            with trio.move_on_after(PROFILE_EVERY_S):
                await self._profile_dirty.wait()
            # Let a burst of actions finish before reading the engine (a rate limit, not a wait).
            await trio.sleep(PROFILE_SETTLE_S)
            self._profile_dirty = trio.Event()
            try:
                state = await page.export_profile(self._profile_state)
                await trio.to_thread.run_sync(self.profiles.save, ref, self._engine_key(), state)
            except (CDPError, RigdError, OSError) as exc:
                self.machine.log.warning("browser profile not saved", extra={"reason": str(exc)[:200]})
                continue
            self._profile_state = state
            self.profile_saves += 1

    def _profile_changed(self) -> None:
        if self.profile is not None:
            self._profile_dirty.set()

    async def _engine_exit(self) -> str:
        while True:
            code, _out, err = await self._sh(engine_watch_script(), WATCH_S + 60, max_output=4096)
            if code is not None:
                tail = err.decode(errors="replace").strip()[-1000:]
                return "the browser exited" + (f"; its log ends: {tail}" if tail else "")

    async def _wait_devtools(self) -> DevToolsVersion | None:
        """Chromium's ``/json/version`` once DevTools answers; for Firefox, None once its
        remote agent answers HTTP (its version comes with the BiDi session)."""
        probe = devtools_probe_script(any_answer=self.firefox or self.webkit)
        while True:
            code, out, err = await self._sh(probe, 10, max_output=MAX_VERSION_BYTES + 1)
            if code == 0:
                if self.firefox or self.webkit:
                    return None
                try:
                    return parse_version(out)
                except RigdError as exc:
                    raise BackendError(
                        f"{self.engine.value} DevTools answered nonsense: {exc.message}") from exc
            if code == 3:
                raise BackendError(f"{self.engine.value} exited before DevTools answered: "
                                   f"{err.decode(errors='replace')[-1500:]}")
            if code == 4:
                raise BackendError(f"the DevTools relay exited before {self.engine.value} answered: "
                                   f"{err.decode(errors='replace')[-1000:]}")
            await trio.sleep(POLL_S)

    async def version_now(self) -> DevToolsVersion:
        """Ask Chromium's DevTools again (a check that the engine still answers)."""
        code, out, err = await self._sh(devtools_probe_script(), 10, max_output=MAX_VERSION_BYTES + 1)
        if code != 0:
            raise BackendError(f"{self.engine.value} DevTools does not answer (exit {code}): "
                               f"{err.decode(errors='replace')[-500:]}")
        return parse_version(out)

    def page_driver(self) -> PageDriver:
        if self.page is None:
            raise BackendError(f"{self.engine.value} is not connected (the rig is starting or failing)")
        return self.page

    @property
    def _source(self) -> str:
        return "bidi" if self.firefox else "webdriver" if self.webkit else "cdp"

    async def perform(self, action: Action) -> dict[str, Any]:
        try:
            return await self.page_driver().perform(action)
        except CDPError as exc:
            raise BackendError(f"{action.verb}: {exc}") from exc
        finally:
            if not is_observation(action):
                self._profile_changed()

    async def still(self, *, max_w: int, max_h: int, fmt: str, quality: int,
                    mark_cursor: bool) -> Frame:
        page = self.page_driver()
        try:
            data, iw, ih = await page.capture(max_w=max_w, max_h=max_h, quality=quality)
        except CDPError as exc:
            raise BackendError(f"screenshot: {exc}") from exc
        vw, vh = page.viewport.width, page.viewport.height
        still = Still(data=data, media_type="image/jpeg", display_w=vw, display_h=vh,
                      image_w=iw, image_h=ih, scale=round(vw / iw, 6))
        return Frame(still, self._source, page.pointer, False)

    async def send_input(self, steps: Sequence[Step]) -> None:
        """A person's live-view input, replayed through the engine's input API."""
        page = self.page_driver()
        async with self._input_lock:
            try:
                self._pointer = await page.replay(steps, self._pointer)
            except CDPError as exc:
                # Where the pointer is after a partial replay is the page's last word on it.
                self._pointer = PointerState(*page.pointer)
                raise BackendError(f"input: {exc}") from exc
            finally:
                self._profile_changed()

    async def drop_event(self, paths: list[str], point: tuple[int, int] | None) -> None:
        """Drop files already in the guest onto the page at ``point`` (the pointer when None):
        drag enter, over and drop, as a person's drag from the desktop would."""
        page = self.page_driver()
        if not page.takes_drops:
            raise BackendError(f"{self.engine.value} takes no drop event; "
                               f"the files are in {self.drop_target.dir}")
        try:
            await page.drop(paths, point if point is not None else page.pointer)
        except CDPError as exc:
            raise BackendError(f"the drop event: {exc}") from exc

    # -- the live view (rigd.frames.LiveScreen): Chromium's screencast --

    async def screencast_stopped(self) -> None:
        """Return once no live-view screencast runs (one whose last viewer left has stopped)."""
        if self._cast_scope is not None:
            await self._cast_stopped.wait()

    def open_changes(self) -> AbstractAsyncContextManager[Changes | None]:
        return self._changes()

    @asynccontextmanager
    async def _changes(self) -> AsyncIterator[Changes | None]:
        if self.page is None:
            yield None
            return
        changes = Changes()
        self._viewers.append(changes)
        try:
            if self._cast_scope is not None and self._cast_scope.cancel_called:
                await self._cast_stopped.wait()  # the last viewer just left: let it stop first
            if self._cast_scope is None:
                await self.machine.start_task(self._screencast)
            yield changes
        finally:
            self._viewers.remove(changes)
            changes.end()
            if not self._viewers and self._cast_scope is not None:
                self._cast_scope.cancel()

    async def _screencast(self, *, task_status: trio.TaskStatus[None]) -> None:
        """Frames for the live view while anyone watches, as the engine's driver gives them
        (:meth:`PageDriver.cast`: Chromium pushes a JPEG whenever the page repaints; Firefox and
        WebKit are asked for stills, rate-capped). Each frame is kept as the newest and every
        viewer told. Its end never fails the rig (a lost connection does that on its own)."""
        page = self.page_driver()
        with trio.CancelScope() as scope:
            self._cast_scope = scope
            self._cast_ready = trio.Event()
            self._cast_stopped = trio.Event()
            task_status.started()
            try:
                await page.cast(lambda data, w, h: self._new_frame(page, data, w, h),
                                max_w=HUMAN_STILL_MAX.width, max_h=HUMAN_STILL_MAX.height,
                                quality=CAST_QUALITY)
            except (CDPError, RigdError) as exc:
                self.machine.log.info("screencast ended", extra={"reason": str(exc)[:200]})
            finally:
                self._cast = None
                self._cast_scope = None
                self._cast_stopped.set()
        for viewer in self._viewers:
            viewer.pointer()  # wake them: the next still is a screenshot

    def _new_frame(self, page: PageDriver, data: bytes, width: int, height: int) -> None:
        self._cast = (data, width, height)
        self._cast_ready.set()
        v = page.viewport
        for viewer in self._viewers:
            viewer.damage([(0, 0, v.width, v.height)])

    async def live_still(self, *, max_w: int, max_h: int, quality: int) -> tuple[Frame, Lane]:
        page = self.page_driver()
        vw, vh = page.viewport.width, page.viewport.height
        if self._cast is None and self._cast_scope is not None:
            # A screencast that just started sends its first frame at once: take that
            # rather than a screenshot of the same page.
            with trio.move_on_after(CAST_FIRST_S):
                await self._cast_ready.wait()
        if self._cast is not None:
            data, iw, ih = self._cast
            lane = Lane(*page.cast_lane, {})
        else:
            try:
                data, iw, ih = await page.capture(max_w=max_w, max_h=max_h, quality=quality)
            except CDPError as exc:
                raise BackendError(f"screenshot: {exc}") from exc
            lane = Lane(self._source, "a screenshot: no screencast is running", {})
        still = Still(data=data, media_type="image/jpeg", display_w=vw, display_h=vh,
                      image_w=iw, image_h=ih, scale=round(vw / iw, 6))
        return Frame(still, lane.source, page.pointer, False), lane


#: A browser's cold boot: the agent's deadline plus the engine's start (Chromium
#: under TCG on 2 shared cores: see docs/images.md, "Browser image").
ENGINE_START_S = {Accel.TCG: 180.0, Accel.KVM: 60.0, Accel.HVF: 60.0}
#: How long the engine may take to answer the DevTools/BiDi WebSocket's opening handshake. A
#: cold Firefox's remote agent loads its modules first: over 10 s under TCG on a loaded host.
DEVTOOLS_OPEN_S = {Accel.TCG: 90.0, Accel.KVM: 15.0, Accel.HVF: 15.0}


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
    volume_bus: str = "device"
    volume_owner: str | None = None
    profiles: ProfileStore | None = None
    #: A custom image's pack (its digest is ``assets.boot.image_digest``), or None: the built one.
    custom: CustomPack | None = None

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
                        rig_dir=at.rig_dir, overlay=at.overlay, mac=mac, incoming=incoming, tap_fd=tap_fd,
                        extra_ports=[(DEVTOOLS_PORT_NAME, at.rig_dir / DEVTOOLS_SOCKET)])

    #: A standby point: never a running engine (a clone would share its in-process random
    #: state: docs/decisions.md); each restored rig starts its own engine.
    snapshot_at_hello: bool = True

    def warm_eligible(self, spec: MachineSpec) -> bool:
        # As for terminals, a custom image (a pack an admin can replace) boots cold, and so
        # does a rig with volumes (no snapshot has those disks; a microvm takes no hot-plug).
        return self.custom is None and not spec.volumes

    def warm_shape(self, spec: MachineSpec) -> tuple[list[str], dict[str, Any]]:
        boot = self.assets.boot
        at = PLACEHOLDER_PATHS
        shape = rig_argv(
            self.config, boot, memory_mb=spec.memory_mb, vcpus=spec.vcpus, rig_dir=at.rig_dir,
            overlay=at.overlay, mac=None if self.config.network is None else "02:00:00:00:00:00",
            kernel=Path("/@kernel"), initrd=Path("/@initrd"), tools=Path("/@tools"), tap_fd="@fd",
            extra_ports=[(DEVTOOLS_PORT_NAME, at.rig_dir / DEVTOOLS_SOCKET)],
        )
        material: dict[str, Any] = {
            name: {"key": path.parent.name, "file": path.name, "size": path.stat().st_size}
            for name, path in (("kernel", boot.kernel), ("initrd", boot.initrd), ("tools", boot.tools))
        }
        material["engine"] = {"engine": self.engine.value, "revision": self.assets.revision,
                              "image": boot.image_digest}
        return shape, material

    def driver(self, machine: QemuMachine) -> BrowserDriver:
        shown = machine.spec.display
        viewport = Display(*shown) if shown is not None else BOOT_VIEWPORT
        owned = machine.spec.profile
        drops = CHROMIUM_DROPS if self.engine is Engine.CHROMIUM else BROWSER_DROPS
        unchecked = self.custom if self.custom is not None and not self.custom.contract.exists() else None
        return BrowserDriver(machine, self.engine, sandbox=self.sandbox, viewport=viewport, drop_target=drops,
                             profile=ProfileRef(*owned) if owned is not None else None,
                             profiles=self.profiles, contract=unchecked)


#: The image engine (Debian package) of each engine a caller names (``rigd.model.Engine``).
IMAGE_ENGINE: dict[ApiEngine, Engine] = {
    ApiEngine.CHROMIUM: Engine.CHROMIUM,
    ApiEngine.FIREFOX: Engine.FIREFOX_ESR,
    ApiEngine.WEBKIT: Engine.WEBKIT,
}

#: The engine's name in profile paths (the API's: chromium, firefox, webkit).
IMAGE_ENGINE_KEY: dict[Engine, str] = {v: k.value for k, v in IMAGE_ENGINE.items()}

#: Finds (building it when absent) one engine's image and pack: its assets and the
#: pack's rootfs. Blocking (minutes on a cold cache); called in a worker thread.
PreparePack = Callable[[Engine, Callable[[str], None]], tuple[BrowserAssets, Path]]


#: Pull (if needed) and pack a custom Chromium image: its assets (the built boot assets
#: with the image's layout and digest) and the pack's rootfs.
CustomBrowserPacker = Callable[[str, Callable[[str], None]], Awaitable[tuple[BrowserAssets, Path]]]

#: What RIGS.md §3 asks of a browser image, and what rigd's launch and relay scripts run.
BROWSER_CONTRACT = ("bash", "socat", "/usr/bin/chromium", "setpriv", "setsid", "mktemp")


class BrowserImages:
    """The recipe source of browser rigs: each engine's image and pack, made once (under a lock
    each); a custom Chromium image's pack through ``custom`` (the server's pulls)."""

    def __init__(self, config: QemuConfig, prepare: PreparePack,
                 profiles: ProfileStore | None = None, custom: CustomBrowserPacker | None = None) -> None:
        self.config = config
        self._prepare = prepare
        self.profiles = profiles
        self._custom = custom
        self._locks: dict[Engine, trio.Lock] = {}

    async def recipe(self, spec: MachineSpec, progress: Callable[[str], None]) -> BrowserRecipe:
        try:
            engine = IMAGE_ENGINE[ApiEngine(spec.engine or ApiEngine.CHROMIUM.value)]
        except ValueError:
            raise FieldError("engine", f"unknown engine {spec.engine!r}") from None
        if spec.image is not None:
            if engine is not Engine.CHROMIUM or self._custom is None:
                raise BackendError(f"this server boots custom images for Chromium rigs only "
                                   f"(asked for {spec.image} on {engine.value})")
            assets, backing = await self._custom(spec.image, progress)
            pack = CustomPack(spec.image, assets.boot.image_digest, backing)
            return BrowserRecipe(self.config, assets, backing, profiles=self.profiles, custom=pack)
        async with self._locks.setdefault(engine, trio.Lock()):
            assets, backing = await trio.to_thread.run_sync(self._prepare, engine, progress)
        return BrowserRecipe(self.config, assets, backing, profiles=self.profiles)


def browser_backend(config: QemuConfig, prepare: PreparePack, *, layout: Layout | None = None,
                    uids: UidPool | None = None, snapshots: SnapshotService | None = None,
                    profiles: ProfileStore | None = None,
                    custom: CustomBrowserPacker | None = None) -> QemuBackend:
    return QemuBackend(Backend.SMOLVM, config, BrowserImages(config, prepare, profiles, custom),
                       layout=layout, uids=uids, snapshots=snapshots)


__all__ = [
    "BROWSER_CONTRACT",
    "GUEST_DEVTOOLS_PORT",
    "IMAGE_ENGINE",
    "BrowserDriver",
    "BrowserImages",
    "BrowserRecipe",
    "browser_backend",
    "chromium_launch_script",
    "devtools_probe_script",
    "engine_watch_script",
    "relay_script",
]
