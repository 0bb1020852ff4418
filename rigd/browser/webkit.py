"""The WebKit driver: every browser_use verb (RIGS.md §4) over WebDriver classic, on one window.

How this works: :func:`open_webkit` starts a session on ``WebKitWebDriver``
(which launches WebKitGTK's MiniBrowser in automation mode on the rig's own X
display), pins the timeouts and the viewport and loads the start page.
:meth:`WebKitDriver.perform` maps each parsed action to WebDriver commands
(:class:`rigd.browser.webdriver.WebDriverConnection`, one HTTP/1.1 connection
over the rig's port):

- rigd's functions (:mod:`rigd.browser.page`, the same ones Firefox runs)
  are called with ``execute/async`` and answer JSON text parsed here under the
  cap. WebDriver classic has no isolated world: they run in the page's own,
  so a page can see and disturb them; what they answer is read as untrusted
  data, as everything from a page is;
- pointer and key verbs are ``actions`` with the same input sources as the
  Firefox driver and the live view (:mod:`rigd.browser.bidi_input`: the
  shapes are WebDriver's own);
- navigations wait for the load (``pageLoad`` strategy ``normal``); a load
  that fails shows WebKit's error document, whose text is the verb's error.

Engine limits are said in the results, not worked around: no hard reload, no
HTTP status of a document, no console before rigd's hook is in a document
(output logged while it loads is missed), a DOM-derived ``a11y`` extract,
viewport-only screenshots, and wheel input that WebKitGTK's WebDriver drops
(``scroll`` moves the scrollable box under the point by script, and says so).
Why one module of this size: what WebKit needs that no other engine does (page scripts
over ``execute/async``, stitched full-page stills, cookies in WebDriver's shape, one code
point per key action, the X display's stills) is WebKit's alone; the verbs every engine
shares are :class:`rigd.browser.driver.PageVerbs`, written once.
"""

from __future__ import annotations

import contextlib
import io
import json
import logging
import secrets
from collections.abc import AsyncIterator, Awaitable, Callable, Sequence
from typing import Any
from urllib.parse import urlsplit

import trio
from PIL import Image

import rigd.verbs.browser as bv
from rigd.browser.driver import Still, page_size, too_tall
from rigd.browser.firefox import MAX_PIXELS, fit_jpeg
from rigd.browser.page import (
    BOOT_VIEWPORT,
    CLIPBOARD_MAX_BYTES,
    CONSOLE_ENTRY_MAX_CHARS,
    CONSOLE_KEEP,
    FULL_PAGE_MAX_HEIGHT,
    IMAGE_MAX_BYTES,
    LOAD_TIMEOUT_S,
    PAGE_SIZE,
    POLL_FPS,
    RESTORE_STORAGE,
    FrameSink,
    PageError,
    decoded_image,
    origin_of,
    polled_frames,
    scroll_xy,
    text_json,
)
from rigd.browser.profiles import ProfileState, expires_from_w3c, expiry_for_w3c, parse_state
from rigd.browser.w3c import W3CActionsDriver
from rigd.browser.webdriver import WebDriverCommandFailed, WebDriverConnection
from rigd.errors import Conflict, FieldError
from rigd.model import AGENT_STILL_MAX, Display
from rigd.nurseries import beside
from rigd.protocols.cdp import CDPClosed, CDPError, CDPProtocolError
from rigd.verbs.base import (
    Action,
    HistoryDirection,
    is_observation,
)

log = logging.getLogger("rigd.browser.webkit")

#: WebKitGTK's browser for automation (libwebkit2gtk-4.1-0 in Debian).
MINIBROWSER = "/usr/lib/x86_64-linux-gnu/webkit2gtk-4.1/MiniBrowser"
#: MiniBrowser's own chrome (its toolbar), shrunk by a user style sheet in its HOME so the
#: window can be as narrow as the smallest viewport (320 px; the toolbar's own floor is ~447 px).
#: GTK styles only the browser's widgets, never the page (WebKit draws web content itself).
MINIBROWSER_GTK_CSS = ("* { min-width: 0; min-height: 0; padding: 0; margin: 0; font-size: 1px; }\n"
                       "entry, button { min-width: 0; }\n")
#: Dialogs never stall a verb: WebKit dismisses them and says so on the next command.
PROMPTS = "dismiss and notify"
#: Deadlines: the driver's own (script, load) are the verbs'; rigd's command deadline is
#: longer, so the driver's ``timeout`` error comes back rather than a silent stream.
SCRIPT_TIMEOUT_S = 30.0
COMMAND_SLACK_S = 15.0
SESSION_NEW_TIMEOUT_S = 120.0
CAPTURE_TIMEOUT_S = 60.0
#: Key actions sent in one ``actions`` command.
#: How often the window is asked whether it is still there (and the connection kept used).
ALIVE_EVERY_S = 5.0
#: The W3C errors that mean the session or its window is gone for good.
GONE_ERRORS = frozenset({"invalid session id", "no such window", "session not created"})

NO_HARD_RELOAD = ("WebKit's WebDriver has no hard reload: a normal reload was done, so cached files "
                  "may have been used")
NO_STATUS = "WebKit's WebDriver does not report a document's HTTP status"
CONSOLE_LIMIT = ("WebKit's WebDriver has no console API: rigd's hook records what a document logs after "
                 "it has loaded; output logged while a page loads (and uncaught errors before it) is missed")
STITCHED = ("WebKit's WebDriver captures the viewport only: the page was scrolled a viewport at a time "
            "and the stills joined, so a fixed or sticky element appears once per viewport, and the page "
            "saw scroll events")
#: A full page is at most this many viewport stills (a tall page at a small viewport is cut, and said).
MAX_STITCH = 32
SCRIPT_SCROLL = ("WebKitGTK's WebDriver drops wheel input: the scrollable box under the point (or the page) "
                 "was scrolled by script, so the page got scroll events but no wheel events")
PAGE_REALM = ("WebDriver classic has no isolated world: rigd's functions run in the page's own, where "
              "the page can see them")

#: rigd's console hook, put into each document after it loads (no earlier hook exists).
CONSOLE_HOOK = f"""() => {{
  if (window.__rigdConsole) return false;
  const buf = [], keep = {CONSOLE_KEEP}, cut = {CONSOLE_ENTRY_MAX_CHARS};
  let dropped = 0;
  const note = line => {{ if (buf.length >= keep) {{ buf.shift(); dropped++; }}
    buf.push(line.length > cut ? line.slice(0, cut) + ' [... ' + (line.length - cut) + ' characters cut]'
                               : line); }};
  const show = v => {{ try {{ return typeof v === 'string' ? v : JSON.stringify(v); }}
                       catch (e) {{ return String(v); }} }};
  for (const m of ['log', 'info', 'warn', 'error', 'debug']) {{
    const orig = console[m];
    console[m] = function (...a) {{ try {{ note('[' + m + '] ' + a.map(show).join(' ')); }} catch (e) {{}}
      return orig.apply(this, a); }};
  }}
  window.addEventListener('error', e => note('[exception] ' + (e.message || 'error')));
  window.addEventListener('unhandledrejection', e => note('[exception] ' + show(e.reason)));
  Object.defineProperty(window, '__rigdConsole', {{value: () => {{
    const out = {{lines: buf.splice(0), dropped}}; dropped = 0; return out; }}}});
  return true;
}}"""
#: Scroll the box under (x, y) that can move that way, else the page; which one, and where it is.
SCROLL_BY = """(x, y, dx, dy) => {
  const movable = (el, s) =>
    (dy && /(auto|scroll|overlay)/.test(s.overflowY) && el.scrollHeight > el.clientHeight)
    || (dx && /(auto|scroll|overlay)/.test(s.overflowX) && el.scrollWidth > el.clientWidth);
  const root = [document.body, document.documentElement];
  for (let el = document.elementFromPoint(x, y); el && !root.includes(el); el = el.parentElement) {
    if (movable(el, getComputedStyle(el))) {
      el.scrollBy({left: dx, top: dy, behavior: 'instant'}); return 'box';
    }
  }
  window.scrollBy({left: dx, top: dy, behavior: 'instant'});
  return 'page';
}"""
#: What a failed load leaves: WebKit's error document is ``about:blank`` with the reason as text.
LOAD_STATE = """() => [location.href.substring(0, 8192),
  document.body ? document.body.innerText.substring(0, 300) : '', document.readyState]"""
#: A mark on the current document (history: did the document change?).
MARK = "(token) => { window.__rigdMark = token; return true; }"
MARKED = "() => window.__rigdMark || null"
#: Scroll the page to (x, y) at once; where it landed.
SCROLL_TO = ("(y, x) => { window.scrollTo({left: x || 0, top: y, behavior: 'instant'}); "
             "return [scrollX, scrollY]; }")
#: The page's own view of its viewport.
# How long a window/rect may take to show in the page's own size.
RESIZE_WAIT_S = 4.0
INNER = "() => [window.innerWidth, window.innerHeight, window.outerWidth, window.outerHeight]"
#: A still of the page from the engine's X display: ``(rect, max_w, max_h, quality)`` → a JPEG
#: and its size, or None when it cannot be had (the driver falls back to WebDriver's PNG).
Grab = Callable[[tuple[int, int, int, int], int, int, int], Awaitable[tuple[bytes, int, int] | None]]


def _call(function: str) -> str:
    """An ``execute/async`` body: call ``function`` with the command's arguments and answer its
    (awaited) value as JSON text, or ``{"__rigdThrew": why}``."""
    return ("const a = Array.prototype.slice.call(arguments, 0, -1),\n"
            "  done = arguments[arguments.length - 1];\n"
            f"Promise.resolve().then(() => ({function}).apply(null, a)).then(\n"
            "  v => done(JSON.stringify(v === undefined ? null : v)),\n"
            "  e => done(JSON.stringify({__rigdThrew: String(e && e.message || e).substring(0, 300)})));")


def stitch(parts: Sequence[tuple[int, bytes]], width: int, height: int, max_w: int, max_h: int,
           quality: int) -> tuple[bytes, int, int]:
    """Viewport stills (page y, PNG) joined into one ``width`` x ``height`` JPEG, scaled down to fit
    ``max_w`` x ``max_h``. Every still is size-checked before it is decoded. Blocking (Pillow)."""
    canvas = Image.new("RGB", (width, height), (255, 255, 255))
    for top, data in parts:
        try:
            with Image.open(io.BytesIO(data)) as img:
                w, h = img.size
                if img.format != "PNG" or w * h > MAX_PIXELS:
                    raise CDPProtocolError(f"screenshot: a {img.format} still of {w}x{h} is not a "
                                           "viewport PNG")
                canvas.paste(img.convert("RGB"), (0, top))
        except (OSError, Image.DecompressionBombError) as exc:
            raise CDPProtocolError("screenshot: a still does not decode") from exc
    scale = min(1.0, max_w / width, max_h / height)
    if scale < 1.0:
        canvas = canvas.resize((max(1, round(width * scale)), max(1, round(height * scale))),
                               Image.Resampling.LANCZOS)
    buf = io.BytesIO()
    canvas.save(buf, "JPEG", quality=max(1, min(95, quality)))
    return buf.getvalue(), canvas.width, canvas.height


class _ScriptError(CDPError):
    """A function rigd ran in the page threw (the page may have broken the document)."""


def parse_answer(raw: Any) -> Any:
    """The JSON a rigd function answered (as text); a throw is an error."""
    if not isinstance(raw, str):
        raise CDPProtocolError("execute: a rigd function answered something other than JSON text")
    if len(raw) > IMAGE_MAX_BYTES * 2:
        raise CDPProtocolError("execute: a rigd function's answer is over the cap")
    try:
        got = json.loads(raw)
    except (ValueError, RecursionError) as exc:
        raise CDPProtocolError("execute: a rigd function's answer is not JSON") from exc
    if isinstance(got, dict) and set(got) == {"__rigdThrew"}:
        raise _ScriptError(str(got["__rigdThrew"])[:300])
    return got


def cookie_to_saved(raw: object) -> dict[str, Any] | None:
    """A WebDriver cookie as a saved (CDP-shaped) one; None for what does not check."""
    if not isinstance(raw, dict):
        return None
    name, value, domain = raw.get("name"), raw.get("value"), raw.get("domain")
    if not (isinstance(name, str) and isinstance(value, str) and isinstance(domain, str)):
        return None
    out: dict[str, Any] = {"name": name, "value": value, "domain": domain,
                           "path": raw.get("path") if isinstance(raw.get("path"), str) else "/",
                           "httpOnly": raw.get("httpOnly") is True, "secure": raw.get("secure") is True}
    same = raw.get("sameSite")
    if same in ("Strict", "Lax") or (same == "None" and out["secure"]):
        out["sameSite"] = same
    out.update(expires_from_w3c(raw))
    return out


def cookie_to_webdriver(saved: dict[str, Any]) -> dict[str, Any]:
    """A saved cookie as ``POST /cookie``'s ``cookie``."""
    out: dict[str, Any] = {"name": saved["name"], "value": saved["value"], "domain": saved["domain"],
                           "path": saved.get("path", "/"), "httpOnly": bool(saved.get("httpOnly")),
                           "secure": bool(saved.get("secure"))}
    same = saved.get("sameSite")
    if same in ("Strict", "Lax") or (same == "None" and out["secure"]):
        out["sameSite"] = same
    out.update(expiry_for_w3c(saved))
    return out


def one_code_point_keys(actions: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Key actions with one code point per key: WebKit refuses a key whose value is a grapheme
    cluster of several (``e`` + combining acute, a ZWJ emoji), so a cluster is pressed code
    point by code point (the field gets the same text)."""
    out: list[dict[str, Any]] = []
    for action in actions:
        value = action.get("value")
        if not (isinstance(value, str) and len(value) > 1):
            out.append(action)
        elif action.get("type") == "keyDown":
            for cp in value[:-1]:
                out += [{"type": "keyDown", "value": cp}, {"type": "keyUp", "value": cp}]
            out.append({"type": "keyDown", "value": value[-1]})
        else:
            out.append({**action, "value": value[-1]})
    return out


#: The X clipboard of the engine's display: ``None`` reads it (its text), a text writes it.
XClipboard = Callable[[str | None], Awaitable[str]]


class WebKitDriver(W3CActionsDriver):
    """The browser_use verbs on one WebKit window (the shared ones in :class:`W3CActionsDriver`,
    over WebDriver classic). Made by :func:`open_webkit`."""

    GONE = "the page's window ended"
    A11Y_SOURCE = ("DOM-derived outline (WebKit exposes no accessibility tree over WebDriver): roles and "
                   "names come from elements and ARIA attributes, not the engine's tree")
    cast_lane = ("webdriver-poll", f"WebKit is asked for a PNG still at most {POLL_FPS} times a second, "
                                   "made a JPEG on the host (WebDriver has no screencast)")
    GRAB_LANE = ("display-poll", f"the guest agent grabs the page from WebKit's X display at most {POLL_FPS} "
                                 "times a second, as a JPEG (what the display shows: it can lag the page)")

    def __init__(self, conn: WebDriverConnection, session: str, *, viewport: Display = BOOT_VIEWPORT,
                 version: str = "", clipboard: XClipboard | None = None, grab: Grab | None = None) -> None:
        self.conn = conn
        self.x_clipboard = clipboard
        self.session = session
        #: The live view's frames from the engine's X display (the guest agent's grab), else
        #: WebDriver's PNG.
        self.grab = grab
        #: Where the page is on that display (the window's place plus its toolbar), while the
        #: window keeps its size.
        self._page_rect: tuple[int, int, int, int] | None = None
        if grab is not None:
            self.cast_lane = self.GRAB_LANE
        #: Saved local storage to put back into each document of a saved origin (a profile).
        self._restore: dict[str, dict[str, str]] = {}
        super().__init__(viewport=viewport, version=version)

    def _key_actions(self, actions: list[dict[str, Any]]) -> list[dict[str, Any]]:
        return one_code_point_keys(actions)

    # -- plumbing --

    async def _cmd(self, method: str, path: str, body: dict[str, Any] | None = None, *,
                   timeout: float | None = None) -> Any:
        """One session command; a dialog WebKit dismissed is noted in the console and the
        command sent again (once)."""
        for attempt in (1, 2):
            try:
                return await self.conn.command(method, f"/session/{self.session}{path}", body,
                                               timeout=timeout)
            except WebDriverCommandFailed as exc:
                if exc.error == "unexpected alert open" and attempt == 1:
                    said = exc.data.get("text")
                    self.console.note(f"[dialog] {str(said)[:500] if isinstance(said, str) else ''}")
                    continue
                if exc.error in GONE_ERRORS:
                    self._end(f"the page's window is gone ({exc.error})")
                raise
        raise AssertionError("unreachable")  # pragma: no cover

    def _end(self, why: str) -> None:
        if self._gone is None:
            self._gone = why
            self._gone_event.set()

    async def watch(self, *, task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED) -> None:
        """Ask every :data:`ALIVE_EVERY_S` whether the window is there (WebDriver pushes nothing)."""
        task_status.started()
        while self._gone is None:
            await trio.sleep(ALIVE_EVERY_S)
            try:
                await self._cmd("GET", "/window", timeout=30)
            except CDPClosed as exc:
                self._end(str(exc)[:300])
            except CDPError:
                continue  # a busy page answers late, not never: the connection's end is what counts

    async def _script(self, function: str, *args: Any, timeout: float | None = None) -> Any:
        """A function's JSON answer, run in the page (WebDriver classic has no isolated world)."""
        raw = await self._cmd("POST", "/execute/async", {"script": _call(function), "args": list(args)},
                              timeout=(timeout or SCRIPT_TIMEOUT_S) + COMMAND_SLACK_S)
        return parse_answer(raw)

    async def _page_url(self) -> str:
        got = await self._cmd("GET", "/url")
        if not isinstance(got, str):
            raise CDPProtocolError("GET url: not a string")
        return got[:1 << 20]

    async def _actions(self, *sources: dict[str, Any]) -> None:
        await self._cmd("POST", "/actions", {"actions": list(sources)}, timeout=60)

    async def perform(self, action: Action) -> dict[str, Any]:
        try:
            return await super().perform(action)
        finally:
            if not is_observation(action) and self._gone is None:
                # Whatever document the verb left gets rigd's console hook (and a profile's storage).
                with contextlib.suppress(CDPError):
                    await self._prepare_document()

    async def _prepare_document(self) -> None:
        await self._script(CONSOLE_HOOK, timeout=5)
        if self._restore:
            url = await self._page_url()
            origin = origin_of(url)
            if origin is not None and origin in self._restore:
                source = RESTORE_STORAGE.replace("__SAVED__", json.dumps({origin: self._restore[origin]}))
                await self._script(f"() => {{ {source} }}", timeout=5)

    # -- loads --

    async def _load(self, method: str, path: str, body: dict[str, Any] | None, verb: str,
                    url: str | None) -> bool:
        """Run a loading command; whether the load finished within the verb's timeout. A load
        that failed (WebKit's error document) raises naming the host and WebKit's reason."""
        loaded = True
        try:
            await self._cmd(method, path, body, timeout=self.load_timeout_s + COMMAND_SLACK_S)
        except WebDriverCommandFailed as exc:
            if exc.error != "timeout":
                raise PageError(f"{verb}: {exc.cdp_message[:300]}") from exc
            loaded = False
        got = await self._script(LOAD_STATE, timeout=5)
        failed = isinstance(got, list) and len(got) == 3 and got[0] == "about:blank"
        if failed and url not in (None, "about:blank"):
            host = urlsplit(url or "").hostname or "the page"
            said = str(got[1]).strip()[:200] or "the connection failed or was refused"
            hint = (" (names outside the rig's egress allowlist do not resolve)"
                    if "resolv" in said.lower() else "")
            raise PageError(f"{verb}: {host} did not load: {said}{hint}")
        return loaded

    def _load_note(self, out: dict[str, Any], loaded: bool) -> dict[str, Any]:
        notes = [NO_STATUS] if "status" in out else []
        if not loaded:
            notes.insert(0, f"the page had not finished loading within {self.load_timeout_s:g} s; "
                            "it may still be loading")
        if notes:
            out["note"] = "; ".join(notes)
        return out

    async def _do_navigate(self, a: bv.BrowserNavigate) -> dict[str, Any]:
        before = await self._page_url()
        loaded = await self._load("POST", "/url", {"url": a.url}, "navigate", a.url)
        out: dict[str, Any] = {**await self._page_json(), "loaded": loaded, "status": None}
        out = self._load_note(out, loaded)
        if loaded and before.partition("#")[0] == a.url.partition("#")[0] and "#" in a.url:
            out["note"] = ("a same-document navigation (a fragment): nothing loaded; " + out.get("note", ""))
        return out

    async def _do_reload(self, a: bv.BrowserReload) -> dict[str, Any]:
        url = await self._page_url()
        loaded = await self._load("POST", "/refresh", {}, "reload", url)
        out: dict[str, Any] = {**await self._page_json(), "hard": False, "loaded": loaded}
        out = self._load_note(out, loaded)
        if a.hard:
            out["note"] = NO_HARD_RELOAD + ("; " + out["note"] if "note" in out else "")
        return out

    # -- pointer --

    async def _scroll_by(self, point: tuple[int, int], dx: int, dy: int) -> str:
        got = await self._script(SCROLL_BY, point[0], point[1], dx, dy)
        return got if got in ("box", "page") else "page"

    async def _wheel(self, point: tuple[int, int], dx: int, dy: int) -> dict[str, Any]:
        return {"via": "script", "scrolled": await self._scroll_by(point, dx, dy), "note": SCRIPT_SCROLL}

    # -- observations --

    async def _gather_console(self) -> list[str]:
        """Move what the document's hook holds into the driver's log (and hook a new document)."""
        got = await self._script("() => window.__rigdConsole ? window.__rigdConsole() : null", timeout=10)
        if isinstance(got, dict):
            lines = got.get("lines")
            for line in lines if isinstance(lines, list) else []:
                if isinstance(line, str):
                    self.console.note(line[:CONSOLE_ENTRY_MAX_CHARS])
            dropped = got.get("dropped")
            if isinstance(dropped, int) and not isinstance(dropped, bool) and 0 < dropped < 2**31:
                self.console.dropped += dropped
        else:
            await self._script(CONSOLE_HOOK, timeout=5)
        return [CONSOLE_LIMIT]

    async def _png(self) -> bytes:
        return decoded_image(await self._cmd("GET", "/screenshot", timeout=CAPTURE_TIMEOUT_S), "screenshot")

    async def _full_page(self, notes: list[str]) -> tuple[bytes, int, int, dict[str, int]]:
        """The page joined from viewport stills, top to bottom (its scroll put back after)."""
        width, height = page_size(await self._script(PAGE_SIZE))
        vw, vh = self.viewport.width, self.viewport.height
        notes += too_tall(height)
        if width > vw:
            notes.append(f"the page is {width} px wide; only the left {vw} px (the viewport's width) "
                         "were captured")
        tall = min(height, FULL_PAGE_MAX_HEIGHT, vh * MAX_STITCH)
        if tall < min(height, FULL_PAGE_MAX_HEIGHT):
            notes.append(f"only the top {tall} px ({MAX_STITCH} viewports) were captured")
        before = await self._scroll_position()
        parts: list[tuple[int, bytes]] = []
        try:
            top = 0
            while top < tall and len(parts) < MAX_STITCH:
                at = scroll_xy(await self._script(SCROLL_TO, top))
                landed = at[1] if at is not None else top
                if parts and landed <= parts[-1][0]:
                    break  # the page stopped scrolling (it shrank, or pins its scroll)
                parts.append((landed, await self._png()))
                top = landed + vh
        finally:
            if before is not None:
                with contextlib.suppress(CDPError):
                    await self._script(SCROLL_TO, before[1], before[0])
        data, iw, ih = await trio.to_thread.run_sync(stitch, parts, vw, tall, AGENT_STILL_MAX.width,
                                                     FULL_PAGE_MAX_HEIGHT, 75)
        return data, iw, ih, {"width": width, "height": height}

    async def _rect_on_display(self) -> tuple[int, int, int, int]:
        """The page's viewport on the X display: the window's place, plus its frame (the
        toolbar above the page: outer minus inner size), the viewport's size."""
        if self._page_rect is None:
            iw, ih, ow, oh = await self._inner()
            rect = await self._cmd("GET", "/window/rect", timeout=30)
            x, y = (rect.get(k) if isinstance(rect, dict) else None for k in ("x", "y"))
            if not (isinstance(x, int) and isinstance(y, int) and 0 <= x < 100_000 and 0 <= y < 100_000):
                raise CDPProtocolError("window/rect: the window's place is not two integers")
            self._page_rect = (x + ow - iw, y + oh - ih, iw, ih)
        return self._page_rect

    async def _screenshot(self, max_w: int, max_h: int, quality: int) -> tuple[bytes, int, int]:
        # WebKit's stills are PNG: transcoded to JPEG here, on the host.
        return await trio.to_thread.run_sync(fit_jpeg, await self._png(), max_w, max_h, quality)

    async def _live_still(self, *, max_w: int, max_h: int, quality: int = 75) -> tuple[bytes, int, int]:
        """The live view's frame: what the display shows (the agent's grab, cropped to the page),
        else WebDriver's still. The display is what a person would see, and lags WebKit's
        painting: under TCG a grab right after a navigation can show tiles not yet painted,
        where WebDriver's capture repaints first — so the agent's stills stay WebDriver's."""
        if self.grab is not None:
            got = await self.grab(await self._rect_on_display(), max_w, max_h, quality)
            if got is not None:
                return got
            # The agent could not grab (said why in the rig's log): WebDriver's stills from here on.
            self.grab, self.cast_lane = None, type(self).cast_lane
        return await self._screenshot(max_w, max_h, quality)

    async def cast(self, sink: FrameSink, *, max_w: int, max_h: int, quality: int) -> None:
        """Stills for the live view, rate-capped: from the display when the agent can grab it."""
        await polled_frames(self._live_still, sink, max_w=max_w, max_h=max_h, quality=quality)

    async def _do_screenshot(self, a: bv.BrowserScreenshot) -> dict[str, Any]:
        if a.full_page:
            notes = [STITCHED]
            data, iw, ih, size = await self._full_page(notes)
            still = Still(data, iw, ih, self.viewport.width / iw, "webdriver", tuple(notes), size)
        else:
            data, iw, ih = await self._screenshot(AGENT_STILL_MAX.width, AGENT_STILL_MAX.height, 75)
            still = Still(data, iw, ih, self.viewport.width / iw, "webdriver")
        return self._still_answer(still, a.full_page)

    async def capture(self, *, max_w: int, max_h: int, quality: int = 75) -> tuple[bytes, int, int]:
        return await self._screenshot(max_w, max_h, quality)

    async def _inner(self) -> tuple[int, int, int, int]:
        got = await self._script(INNER)
        if not (isinstance(got, list) and len(got) == 4
                and all(isinstance(v, int) and not isinstance(v, bool) and 0 <= v < 100_000 for v in got)):
            raise CDPProtocolError("set_viewport: the page's size is not four integers")
        return got[0], got[1], got[2], got[3]

    async def _set_viewport(self, size: Display) -> None:
        """Size the window so its page is ``size`` (the window adds its own frame)."""
        self._page_rect = None
        want = (size.width, size.height)
        got = await self._inner()
        for _ in range(4):
            if got[:2] == want:
                return
            iw, ih, ow, oh = got
            await self._cmd("POST", "/window/rect", {"width": size.width + (ow - iw),
                                                     "height": size.height + (oh - ih)}, timeout=30)
            # The answer can come before the X server has resized the window and the page
            # has laid out again: wait for the page's size to change (or be right), then for
            # it to settle — the window and the page can each be read mid-resize, and a frame
            # measured then (outer minus inner) would aim the next try wrong (seen under load:
            # 2240x1360 for 1280x800).
            before, moved = got, False
            with trio.move_on_after(RESIZE_WAIT_S):
                while True:
                    got = await self._inner()
                    if got[:2] == want:
                        moved = True
                        break
                    if got != before:
                        moved = True
                        await trio.sleep(0.1)
                        again = await self._inner()
                        if again == got:
                            break
                        got = again
                        continue
                    await trio.sleep(0.05)
            if not moved:
                break  # nothing changed: the window is at a floor (or stuck), another try won't move it
        iw, ih, _ow, _oh = await self._inner()
        if (iw, ih) != (size.width, size.height):
            raise PageError(f"the page reports a {iw}x{ih} viewport after set_viewport "
                            f"{size.width}x{size.height}")

    async def _resize(self, size: Display) -> None:
        try:
            await self._set_viewport(size)
        except PageError:
            # MiniBrowser's window has a floor (its toolbar): say so, and put the old size back.
            iw, ih, _ow, _oh = await self._inner()
            await self._set_viewport(self.viewport)
            for field, want, got in (("action.width", size.width, iw), ("action.height", size.height, ih)):
                if got > want:
                    raise FieldError(field, f"WebKit's window cannot make the page narrower than {got} px "
                                            f"wide here (its toolbar sets the floor); give {got} or more"
                                     if field == "action.width" else
                                     f"WebKit's window cannot make the page shorter than {got} px here; "
                                     f"give {got} or more") from None
            raise

    async def _do_history(self, a: bv.BrowserHistory) -> dict[str, Any]:
        back = a.direction is HistoryDirection.BACK
        token = secrets.token_hex(8)
        await self._script(MARK, token)
        try:
            await self._cmd("POST", "/back" if back else "/forward", {},
                            timeout=self.load_timeout_s + COMMAND_SLACK_S)
            loaded = True
        except WebDriverCommandFailed as exc:
            if exc.error != "timeout":
                raise
            loaded = False
        if loaded and await self._script(MARKED) == token:
            # The same document, still marked: there was no page to go to.
            raise FieldError("action.direction", f"there is no {'earlier' if back else 'later'} page "
                                                 "in this window's history")
        return await self._went(a, loaded)

    # -- clipboard --

    async def _with_gesture(self, verb: str, function: str, *args: Any) -> Any:
        try:
            return await self._script(function, *args)
        except _ScriptError as exc:
            if "NotAllowed" in str(exc) or "not allowed" in str(exc).lower():
                raise Conflict(f"{verb}: WebKit lets a page use the Clipboard API only during a person's "
                               "gesture, and WebDriver's scripts are not one; use type (or fill) to enter "
                               "text", reason="engine limit", field="action.action") from exc
            raise

    async def _do_clipboard_read(self, a: bv.BrowserClipboardRead) -> dict[str, Any]:
        if self.x_clipboard is None:
            return await super()._do_clipboard_read(a)
        # WebKitGTK's clipboard is the display's: what the page copied, read where it lives.
        await self._secure_origin("clipboard_read")
        text = await self.x_clipboard(None)
        return {"selection": "clipboard", "via": "x-clipboard",
                "content": text_json(text, CLIPBOARD_MAX_BYTES)}

    async def _do_clipboard_write(self, a: bv.BrowserClipboardWrite) -> dict[str, Any]:
        if self.x_clipboard is None:
            return await super()._do_clipboard_write(a)
        await self._secure_origin("clipboard_write")
        await self.x_clipboard(a.text)
        return {"selection": "clipboard", "via": "x-clipboard", "bytes": len(a.text.encode())}

    # -- a person's live-view input --

    async def _replay_sources(self, sources: list[dict[str, Any]]) -> None:
        for source in sources:
            if source.get("type") == "wheel":  # dropped by WebKitGTK's WebDriver
                for s in source.get("actions", ()):
                    await self._scroll_by((int(s["x"]), int(s["y"])), int(s["deltaX"]), int(s["deltaY"]))
            else:
                await self._actions(source)

    # -- profiles (rigd.browser.profiles): over WebDriver, never as guest files --

    async def export_profile(self, previous: ProfileState | None = None) -> ProfileState:
        """Cookies WebDriver shows (the current document's; others kept from ``previous``), the
        current origin's local storage and the window's page (WebKit keeps one window)."""
        url = await self._page_url()
        raw = await self._cmd("GET", "/cookie", timeout=30)
        seen = [c for c in (cookie_to_saved(r) for r in (raw if isinstance(raw, list) else [])) if c]
        keys = {(c["name"], c["domain"], c["path"]) for c in seen}
        kept = [c for c in (previous.cookies if previous is not None else [])
                if (c.get("name"), c.get("domain"), c.get("path", "/")) not in keys
                and not _cookie_for(c, url)]
        storage = await self._storage_now(previous, url)
        return parse_state({"cookies": [*kept, *seen], "tabs": [url], "storage": storage})

    async def import_profile(self, state: ProfileState) -> list[str]:
        problems: list[str] = []
        for cookie in state.cookies:
            try:
                await self._cmd("POST", "/cookie", {"cookie": cookie_to_webdriver(cookie)}, timeout=30)
            except (WebDriverCommandFailed, KeyError) as exc:
                problems.append(f"cookie {str(cookie.get('name'))[:60]}: {str(exc)[:200]}")
        self._restore = {k: dict(v) for k, v in state.storage.items()}
        if len(state.tabs) > 1:
            problems.append(f"{len(state.tabs) - 1} more tabs were saved; a WebKit rig reopens the "
                            "first page only (it drives one window)")
        return problems


def _cookie_for(cookie: dict[str, Any], url: str) -> bool:
    """Whether WebDriver would have shown ``cookie`` for ``url`` (so its absence means it is gone)."""
    host = (urlsplit(url).hostname or "").lower()
    domain = str(cookie.get("domain", "")).lower().lstrip(".")
    return bool(host) and (host == domain or host.endswith("." + domain))


@contextlib.asynccontextmanager
async def open_webkit(conn: WebDriverConnection, *, viewport: Display = BOOT_VIEWPORT,
                      start_url: str | None = None, binary: str = MINIBROWSER,
                      insecure_certs: bool = False,
                      clipboard: XClipboard | None = None, grab: Grab | None = None,
                      session_timeout_s: float = SESSION_NEW_TIMEOUT_S) -> AsyncIterator[WebKitDriver]:
    """A WebDriver session (the browser's window) and its driver, with its watch running
    (``insecure_certs``: accept any certificate — the host tests' own CA, never a rig;
    ``clipboard``: the display's X clipboard, for the clipboard verbs; ``grab``: stills from
    the display, else WebDriver's)."""
    caps = {"alwaysMatch": {
        "acceptInsecureCerts": insecure_certs, "pageLoadStrategy": "normal",
        "unhandledPromptBehavior": PROMPTS,
        "webkitgtk:browserOptions": {"binary": binary, "args": ["--automation"]},
    }}
    got = await conn.command("POST", "/session", {"capabilities": caps}, timeout=session_timeout_s)
    if not (isinstance(got, dict) and isinstance(got.get("sessionId"), str)
            and 0 < len(got["sessionId"]) <= 128 and got["sessionId"].replace("-", "").isalnum()):
        raise CDPProtocolError("POST session: the answer names no session")
    capabilities = got.get("capabilities")
    version = capabilities.get("browserVersion") if isinstance(capabilities, dict) else None
    driver = WebKitDriver(conn, got["sessionId"], viewport=viewport, clipboard=clipboard, grab=grab,
                          version=str(version)[:64] if isinstance(version, str) else "")
    try:
        await driver._cmd("POST", "/timeouts", {"script": int(SCRIPT_TIMEOUT_S * 1000),
                                                "pageLoad": int(LOAD_TIMEOUT_S * 1000), "implicit": 0})
        await driver._set_viewport(viewport)
        if start_url is not None:
            await driver._cmd("POST", "/url", {"url": start_url}, timeout=LOAD_TIMEOUT_S + COMMAND_SLACK_S)
        await driver._script(CONSOLE_HOOK, timeout=5)
        async with beside(driver.watch):
            yield driver
    finally:
        if conn.closed is None:
            with trio.move_on_after(5), contextlib.suppress(CDPError):
                await conn.command("DELETE", f"/session/{driver.session}", timeout=5)


__all__ = [
    "MINIBROWSER",
    "Grab",
    "WebKitDriver",
    "cookie_to_saved",
    "cookie_to_webdriver",
    "one_code_point_keys",
    "open_webkit",
    "parse_answer",
]
