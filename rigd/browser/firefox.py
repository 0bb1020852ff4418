"""The Firefox driver: every browser_use verb (RIGS.md §4) over WebDriver BiDi, on one tab.

How this works: :func:`open_firefox` starts a BiDi session on Firefox's
remote agent (``session.new``, prompts dismissed by the browser itself and
``beforeunload`` accepted), takes the first top-level browsing context,
subscribes to the events the verbs need and pins the viewport.
:meth:`FirefoxDriver.perform` maps each parsed action to BiDi commands:

- rigd's scripts run in a sandbox of the page (``target.sandbox``), so the
  page's JavaScript cannot reach them, and every one answers JSON text that
  is parsed here with the message cap (:func:`parse_script_result`);
- pointer, wheel and key verbs are ``input.performActions`` with the same
  input sources the live view uses (:mod:`rigd.browser.bidi_input`), so the
  browser's input state is one: ``type`` and ``fill`` send one key action
  per grapheme cluster (any Unicode);
- loads wait for ``browsingContext.load`` of the navigation the command
  started; a same-document navigation says so; the document's status comes
  from ``network.responseCompleted`` of that navigation.

Engine limits are said in the results, not worked around: Firefox has no hard
reload over BiDi (``ignoreCache`` is refused), and its ``a11y`` extract is
derived from the DOM (BiDi exposes no accessibility tree), labelled so.
"""

from __future__ import annotations

import contextlib
import io
import json
import logging
from collections.abc import AsyncIterator
from typing import Any
from urllib.parse import urlsplit

import trio
from PIL import Image

import rigd.verbs.browser as bv
from rigd.browser.cdp import CDPConnection, Subscription
from rigd.browser.driver import Still, check_viewport, page_size, too_tall
from rigd.browser.page import (
    BOOT_VIEWPORT,
    CONSOLE_ENTRY_MAX_CHARS,
    CONSOLE_KEEP,
    FULL_PAGE_MAX_HEIGHT,
    IMAGE_MAX_BYTES,
    PAGE_SIZE,
    POLL_FPS,
    QUIET_URL,
    RESTORE_STORAGE,
    WORLD_NAME,
    PageError,
    decoded_image,
)
from rigd.browser.profiles import ProfileState, expires_from_w3c, expiry_for_w3c, parse_state
from rigd.browser.w3c import W3CActionsDriver
from rigd.errors import FieldError
from rigd.model import AGENT_STILL_MAX, Display
from rigd.nurseries import beside
from rigd.protocols.bidi import error_code
from rigd.protocols.cdp import CDPCommandFailed, CDPError, CDPProtocolError, Fields
from rigd.verbs.base import HistoryDirection

log = logging.getLogger("rigd.browser.firefox")

#: The events the driver reads for its whole life (console, prompts, its tab's end, loads).
SESSION_EVENTS = ("log.entryAdded", "browsingContext.userPromptOpened", "browsingContext.contextDestroyed",
                  "browsingContext.load", "browsingContext.fragmentNavigated")
#: Read only for the driven tab (a document's status).
TAB_EVENTS = ("network.responseCompleted",)
#: What Firefox is told when a session starts: dialogs never stall a verb.
CAPABILITIES: dict[str, dict[str, Any]] = {"alwaysMatch": {"acceptInsecureCerts": False,
                                "unhandledPromptBehavior": {"default": "dismiss", "beforeUnload": "accept"}}}
#: Firefox captures a full page at full size (BiDi has no scale): it is cut to this width,
#: and no image the browser sends is decoded past :data:`MAX_PIXELS`.
FULL_PAGE_MAX_WIDTH = 2560
MAX_PIXELS = FULL_PAGE_MAX_WIDTH * FULL_PAGE_MAX_HEIGHT
#: Key actions sent in one ``input.performActions`` (128 characters' down and up).
#: How long the session's start may take (a cold remote agent under TCG).
SESSION_NEW_TIMEOUT_S = 120.0
#: How long one live-view poll may take to come back (a busy page answers late, not never).
CAPTURE_TIMEOUT_S = 60.0
#: The limit Firefox states and rigd passes on.
NO_HARD_RELOAD = ("Firefox's WebDriver BiDi has no hard reload (it refuses ignoreCache): "
                  "a normal reload was done, so cached files may have been used")


#: Firefox's preferences for a rig's throwaway profile (``user.js``): nothing phones home or
#: updates, no first-run pages, and the Clipboard API answers an automation's read without
#: the paste prompt (a person is not at the guest's screen to click it). The remote agent
#: adds its own recommended automation preferences on top.
FIREFOX_PREFS: dict[str, bool | int | str] = {
    "app.update.auto": False,
    "app.update.enabled": False,
    "browser.shell.checkDefaultBrowser": False,
    "browser.startup.homepage_override.mstone": "ignore",
    "browser.aboutwelcome.enabled": False,
    "datareporting.policy.dataSubmissionEnabled": False,
    "datareporting.healthreport.uploadEnabled": False,
    "toolkit.telemetry.reportingpolicy.firstRun": False,
    "toolkit.telemetry.enabled": False,
    "browser.safebrowsing.malware.enabled": False,
    "browser.safebrowsing.phishing.enabled": False,
    "browser.safebrowsing.downloads.enabled": False,
    "extensions.update.enabled": False,
    "extensions.getAddons.cache.enabled": False,
    "network.captive-portal-service.enabled": False,
    "network.connectivity-service.enabled": False,
    "network.dns.disablePrefetch": True,
    "network.prefetch-next": False,
    "browser.newtabpage.enabled": False,
    # Quiet at rest (issue 28, item 5): no remote settings, normandy, push, Pocket, search
    # suggestions, region lookup, geolocation, crash/ping reports or experiments.
    "app.normandy.enabled": False,
    "app.shield.optoutstudies.enabled": False,
    "messaging-system.rsexperimentloader.enabled": False,
    # Remote settings have no off switch: their server is a closed guest-loopback port
    # (QUIET_URL), refused at once, no lookup.
    "services.settings.server": f"{QUIET_URL}/v1",
    "dom.push.enabled": False,
    "dom.push.connection.enabled": False,
    "extensions.pocket.enabled": False,
    "extensions.systemAddon.update.enabled": False,
    "extensions.blocklist.enabled": False,
    "browser.search.update": False,
    "browser.search.suggest.enabled": False,
    "browser.region.network.url": "",
    "browser.region.update.enabled": False,
    "geo.enabled": False,
    "geo.provider.network.url": "",
    "browser.ping-centre.telemetry": False,
    "browser.newtabpage.activity-stream.feeds.telemetry": False,
    "browser.newtabpage.activity-stream.telemetry": False,
    "browser.newtabpage.activity-stream.feeds.topsites": False,
    "browser.discovery.enabled": False,
    "browser.crashReports.unsubmittedCheck.autoSubmit2": False,
    "toolkit.telemetry.unified": False,
    "toolkit.telemetry.archive.enabled": False,
    "toolkit.telemetry.server": "",
    "network.trr.mode": 5,
    "browser.safebrowsing.provider.google4.updateURL": "",
    "browser.safebrowsing.provider.google.updateURL": "",
    "browser.safebrowsing.provider.mozilla.updateURL": "",
    "media.gmp-manager.url": "",
    "media.gmp-manager.updateEnabled": False,
    "media.gmp-manager.chromiumUpdateUrl": "",
    "media.gmp-widevinecdm.enabled": False,
    "media.gmp-widevinecdm.visible": False,
    "media.gmp-gmpopenh264.enabled": False,
    "identity.fxaccounts.enabled": False,
    "network.http.speculative-parallel-limit": 0,
    "browser.tabs.warnOnClose": False,
    "dom.events.testing.asyncClipboard": True,
    # Less work at start (measured under TCG, docs/decisions.md "Firefox's first session"):
    # no spare content process, the built-in add-ons in the parent (no extension process),
    # and neither form autofill (rigd fills logins itself) nor the screenshots add-on.
    # Site isolation (Fission) and the file:// and privileged-content processes stay.
    "dom.ipc.processPrelaunch.enabled": False,
    "extensions.webextensions.remote": False,
    "extensions.formautofill.enabled": False,
    "extensions.screenshots.disabled": True,
    "browser.startup.page": 0,
}


def user_js(prefs: dict[str, bool | int | str] = FIREFOX_PREFS) -> str:
    """The profile's ``user.js``: one ``user_pref(name, value);`` line per preference."""
    return "".join(f"user_pref({json.dumps(k)}, {json.dumps(v)});\n" for k, v in prefs.items())


class _ScriptError(CDPError):
    """A script rigd ran in the page threw (the page may have broken the document)."""


def parse_script_result(f: Fields) -> Any:
    """The JSON a rigd script answered (as text), or None for ``undefined``; a throw is an error."""
    if f.string("type", 16) == "exception":
        details = f.obj("exceptionDetails")
        raise _ScriptError(details.string("text", 100_000, default="the script threw")[:300])
    result = f.obj("result")
    kind = result.string("type", 32)
    if kind in ("undefined", "null"):
        return None
    if kind != "string":
        raise CDPProtocolError(f"script.callFunction: a rigd script answered {kind[:20]}, not JSON text")
    try:
        return json.loads(result.string("value", IMAGE_MAX_BYTES * 2))
    except (ValueError, RecursionError) as exc:
        raise CDPProtocolError("script.callFunction: a rigd script's answer is not JSON") from exc


def _local(value: Any) -> dict[str, Any]:
    """A Python value as a BiDi LocalValue argument."""
    if value is None:
        return {"type": "null"}
    if isinstance(value, bool):
        return {"type": "boolean", "value": value}
    if isinstance(value, int | float):
        return {"type": "number", "value": value}
    if isinstance(value, str):
        return {"type": "string", "value": value}
    raise TypeError(f"no BiDi argument for {type(value).__name__}")


def _context_url(f: Fields) -> str:
    contexts = f.objs("contexts", 1000)
    if not contexts:
        raise CDPProtocolError("browsingContext.getTree: no contexts")
    return contexts[0].string("url", 1 << 20)


def _image_bytes(f: Fields) -> bytes:
    return decoded_image(f.string("data", IMAGE_MAX_BYTES * 4 // 3 + 4), "browsingContext.captureScreenshot")


def fit_jpeg(data: bytes, max_w: int, max_h: int, quality: int) -> tuple[bytes, int, int]:
    """The browser's image as a JPEG no larger than ``max_w`` x ``max_h`` (never scaled up).
    Blocking (Pillow): call in a worker thread."""
    try:
        with Image.open(io.BytesIO(data)) as img:
            if img.format not in ("JPEG", "PNG"):
                raise CDPProtocolError("browsingContext.captureScreenshot: not a JPEG or PNG")
            w, h = img.size
            if w * h > MAX_PIXELS:  # checked before anything is decoded
                raise CDPProtocolError(f"browsingContext.captureScreenshot: a {w}x{h} image is over "
                                       f"the {MAX_PIXELS}-pixel cap")
            scale = min(1.0, max_w / w, max_h / h)
            if scale >= 1.0 and img.format == "JPEG":
                return data, w, h
            out = img.convert("RGB")
            if scale < 1.0:
                size = (max(1, round(w * scale)), max(1, round(h * scale)))
                out = out.resize(size, Image.Resampling.LANCZOS)
            buf = io.BytesIO()
            out.save(buf, "JPEG", quality=max(1, min(95, quality)))
            return buf.getvalue(), out.width, out.height
    except (OSError, Image.DecompressionBombError) as exc:
        raise CDPProtocolError("browsingContext.captureScreenshot: the image does not decode") from exc


def console_entry(params: dict[str, Any]) -> str:
    """One ``log.entryAdded`` as a bounded line: ``[log] a b``, ``[exception] …``."""
    kind = params.get("type")
    text = params.get("text")
    text = text if isinstance(text, str) else ""
    if kind == "console":
        method = params.get("method")
        line = f"[{method[:20] if isinstance(method, str) else 'log'}] {text}"
    elif kind == "javascript":
        line = f"[exception] {text}"
    else:
        line = f"[{str(kind)[:20]}] {text}"
    if len(line) > CONSOLE_ENTRY_MAX_CHARS:
        line = line[:CONSOLE_ENTRY_MAX_CHARS] + f" [... {len(line) - CONSOLE_ENTRY_MAX_CHARS} characters cut]"
    return line


# -- cookies: the saved profile's shape is CDP's (one format on disk for every engine) -----------

_SAME_SITE_OUT = {"strict": "Strict", "lax": "Lax", "none": "None"}
_SAME_SITE_IN = {v: k for k, v in _SAME_SITE_OUT.items()}


def cookie_to_saved(raw: object) -> dict[str, Any] | None:
    """A BiDi cookie as a saved (CDP-shaped) one; None for what does not check."""
    if not isinstance(raw, dict):
        return None
    value = raw.get("value")
    if not (isinstance(value, dict) and value.get("type") == "string"
            and isinstance(value.get("value"), str)):
        return None  # base64 (binary) values are not kept
    out: dict[str, Any] = {"name": raw.get("name"), "value": value["value"], "domain": raw.get("domain"),
                           "path": raw.get("path", "/"), "httpOnly": raw.get("httpOnly") is True,
                           "secure": raw.get("secure") is True}
    same = _SAME_SITE_OUT.get(str(raw.get("sameSite")))
    # Firefox answers "none" for a cookie set without the attribute; None on an insecure
    # cookie would be refused when it is put back, so the browser's default is kept instead.
    if same is not None and (same != "None" or out["secure"]):
        out["sameSite"] = same
    out.update(expires_from_w3c(raw))
    return out


def cookie_to_bidi(saved: dict[str, Any]) -> dict[str, Any]:
    """A saved cookie as ``storage.setCookie``'s ``cookie``."""
    out: dict[str, Any] = {"name": saved["name"], "value": {"type": "string", "value": saved["value"]},
                           "domain": saved["domain"], "path": saved.get("path", "/"),
                           "httpOnly": bool(saved.get("httpOnly")), "secure": bool(saved.get("secure"))}
    # Absent: Firefox's setCookie would make it None, which it then refuses on an insecure
    # cookie; Lax is what a page's own unmarked cookie behaves as for top-level loads.
    same = saved.get("sameSite")
    fallback = "none" if out["secure"] else "lax"
    out["sameSite"] = _SAME_SITE_IN.get(same if isinstance(same, str) else "", fallback)
    out.update(expiry_for_w3c(saved))
    return out


class FirefoxDriver(W3CActionsDriver):
    """The browser_use verbs on one tab (the shared ones in :class:`W3CActionsDriver`, over
    BiDi). Made by :func:`open_firefox`."""

    GONE = "the page's tab ended"
    A11Y_SOURCE = ("DOM-derived outline (Firefox exposes no accessibility tree over WebDriver BiDi): "
                   "roles and names come from elements and ARIA attributes, not the engine's tree")
    cast_lane = ("bidi-poll", f"Firefox is asked for a screenshot at most {POLL_FPS} times a second "
                              "(BiDi has no screencast)")

    def __init__(self, conn: CDPConnection, context: str, events: Subscription,
                 *, viewport: Display = BOOT_VIEWPORT, version: str = "") -> None:
        self.conn = conn
        self.context = context
        self._events = events
        super().__init__(viewport=viewport, version=version)

    # -- setup and the session's events --

    async def _setup(self) -> None:
        await self.conn.send("session.subscribe", {"events": list(TAB_EVENTS), "contexts": [self.context]})
        await self._set_viewport(self.viewport)

    async def _set_viewport(self, size: Display) -> None:
        await self.conn.send("browsingContext.setViewport", {
            "context": self.context, "viewport": {"width": size.width, "height": size.height},
            "devicePixelRatio": 1})

    async def read_events(self, *, task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED) -> None:
        """Keep the console and note dialogs (Firefox dismisses them itself) and the tab's end."""
        task_status.started()
        while True:
            try:
                event = await self._events.receive()
            except CDPError:
                return
            p = event.params
            if event.method == "log.entryAdded":
                source = p.get("source")
                if not isinstance(source, dict) or source.get("context") in (None, self.context):
                    self.console.note(console_entry(p))
            elif event.method == "browsingContext.userPromptOpened" and p.get("context") == self.context:
                kind, said = str(p.get("type", ""))[:20], str(p.get("message", ""))[:500]
                self.console.note(f"[dialog] {kind}: {said}")
            elif event.method == "browsingContext.contextDestroyed" and p.get("context") == self.context:
                self._gone = "the page's tab was closed or its content process crashed"
                self._gone_event.set()

    # -- plumbing --

    async def _script(self, function: str, *args: Any, timeout: float | None = None,
                      page_realm: bool = False, activation: bool = False) -> Any:
        """A function's JSON answer, run in rigd's sandbox of the page (``page_realm``: in the
        page's own realm, for APIs a sandbox lacks)."""
        target: dict[str, Any] = {"context": self.context}
        if not page_realm:
            target["sandbox"] = WORLD_NAME
        wrapped = f"async function (...a) {{ return JSON.stringify(await ({function}).apply(this, a)); }}"
        return await self.conn.call("script.callFunction", {
            "functionDeclaration": wrapped, "arguments": [_local(a) for a in args], "target": target,
            "awaitPromise": True, "resultOwnership": "none", "userActivation": activation,
        }, parse_script_result, timeout=timeout)

    async def _is_secure_context(self) -> bool:
        return await self._script("() => window.isSecureContext", page_realm=True) is True

    async def _page_url(self) -> str:
        return await self.conn.call("browsingContext.getTree", {"root": self.context, "maxDepth": 0},
                                    _context_url)

    async def _actions(self, *sources: dict[str, Any]) -> None:
        await self.conn.send("input.performActions", {"context": self.context, "actions": list(sources)})

    # -- loads --

    def _navigate_error(self, exc: CDPCommandFailed, url: str, verb: str) -> PageError:
        host = urlsplit(url).hostname or "the page"
        said = exc.cdp_message.partition(": ")[2].removeprefix("Error: ")[:200] or exc.cdp_message[:200]
        hint = (" (names outside the rig's egress allowlist do not resolve)"
                if "UNKNOWN_HOST" in said else "")
        return PageError(f"{verb}: {host} did not load: {said}{hint}")

    async def _wait_load(self, sub: Subscription, navigation: str | None, url: str,
                         timeout: float) -> tuple[bool, bool, int | None]:
        """(loaded, same_document, status) of ``navigation``: its load event, a fragment
        navigation to ``url``, or neither within ``timeout``."""
        status: int | None = None
        with trio.move_on_after(timeout):
            while True:
                event = await sub.receive()
                p = event.params
                if p.get("context") != self.context:
                    continue
                if event.method == "network.responseCompleted" and p.get("navigation") == navigation:
                    response = p.get("response")
                    got = response.get("status") if isinstance(response, dict) else None
                    if isinstance(got, int) and not isinstance(got, bool) and 0 <= got < 1000:
                        status = got
                elif event.method == "browsingContext.load" and p.get("navigation") == navigation:
                    return True, False, status
                elif event.method == "browsingContext.fragmentNavigated" and p.get("url") == url:
                    return True, True, status
        return False, False, status

    async def _load(self, method: str, params: dict[str, Any], verb: str,
                    url: str | None) -> tuple[bool, bool, int | None]:
        with self.conn.subscribe({"browsingContext.load", "browsingContext.fragmentNavigated",
                                  "network.responseCompleted"}, limit=256) as sub:
            try:
                got = await self.conn.call(method, {**params, "context": self.context, "wait": "none"},
                                           lambda f: (f.string("navigation", 128) if f.has("navigation")
                                                      else None, f.string("url", 1 << 20)),
                                           timeout=self.load_timeout_s)
            except CDPCommandFailed as exc:
                raise self._navigate_error(exc, url or "", verb) from exc
            navigation, landed = got
            return await self._wait_load(sub, navigation, landed, self.load_timeout_s)

    async def _do_navigate(self, a: bv.BrowserNavigate) -> dict[str, Any]:
        loaded, same, status = await self._load("browsingContext.navigate", {"url": a.url}, "navigate", a.url)
        return await self._navigated(loaded, status, same)

    async def _do_reload(self, a: bv.BrowserReload) -> dict[str, Any]:
        url = await self._page_url()
        loaded, _same, _status = await self._load("browsingContext.reload", {}, "reload", url)
        out: dict[str, Any] = {**await self._page_json(), "hard": False, "loaded": loaded}
        if a.hard:
            out["note"] = NO_HARD_RELOAD
        return out

    # -- observations --

    async def _gather_console(self) -> list[str]:
        # What the session's event queue dropped (its bound) counts as dropped too.
        self.console.dropped += self._events.dropped
        self._events.dropped = 0
        return []

    async def _screenshot(self, params: dict[str, Any], max_w: int, max_h: int,
                          quality: int) -> tuple[bytes, int, int]:
        data = await self.conn.call("browsingContext.captureScreenshot", {
            "context": self.context, "format": {"type": "image/jpeg", "quality": quality / 100}, **params,
        }, _image_bytes, timeout=CAPTURE_TIMEOUT_S)
        return await trio.to_thread.run_sync(fit_jpeg, data, max_w, max_h, quality)

    async def _do_screenshot(self, a: bv.BrowserScreenshot) -> dict[str, Any]:
        cap = AGENT_STILL_MAX
        if not a.full_page:
            data, iw, ih = await self._screenshot({"origin": "viewport"}, cap.width, cap.height, 75)
            return self._still_answer(Still(data, iw, ih, self.viewport.width / iw, "bidi"), False)
        width, height = page_size(await self._script(PAGE_SIZE))
        notes = too_tall(height)
        if width > FULL_PAGE_MAX_WIDTH:
            notes.append(f"the page is {width} px wide; only the left {FULL_PAGE_MAX_WIDTH} px were captured")
        shown_w = min(width, FULL_PAGE_MAX_WIDTH)
        clip = {"type": "box", "x": 0, "y": 0, "width": shown_w, "height": min(height, FULL_PAGE_MAX_HEIGHT)}
        data, iw, ih = await self._screenshot({"origin": "document", "clip": clip}, cap.width,
                                              FULL_PAGE_MAX_HEIGHT, 75)
        return self._still_answer(Still(data, iw, ih, shown_w / iw, "bidi", tuple(notes),
                                        {"width": width, "height": height}), True)

    async def capture(self, *, max_w: int, max_h: int, quality: int = 75) -> tuple[bytes, int, int]:
        return await self._screenshot({"origin": "viewport"}, max_w, max_h, quality)

    async def _resize(self, size: Display) -> None:
        await self._set_viewport(size)
        check_viewport(await self._script("() => [window.innerWidth, window.innerHeight]"), size)

    async def _do_history(self, a: bv.BrowserHistory) -> dict[str, Any]:
        back = a.direction is HistoryDirection.BACK
        before = await self._page_url()
        try:
            await self.conn.send("browsingContext.traverseHistory",
                                 {"context": self.context, "delta": -1 if back else 1},
                                 timeout=self.load_timeout_s)
        except CDPCommandFailed as exc:
            if error_code(exc.cdp_message) == "no such history entry":
                raise FieldError("action.direction", f"there is no {'earlier' if back else 'later'} page "
                                                     "in this tab's history") from exc
            raise
        async def moved() -> bool:
            return await self._page_url() != before

        loaded = False
        with trio.move_on_after(self.load_timeout_s):
            # A back-forward cache restore fires no load: read the document itself.
            await self._until_complete(moved)
            loaded = True
        return await self._went(a, loaded)

    # -- clipboard --

    async def _with_gesture(self, verb: str, function: str, *args: Any) -> Any:
        return await self._script(function, *args, page_realm=True, activation=True)

    # -- a person's live-view input --

    # -- profiles (rigd.browser.profiles): over BiDi, never as guest files --

    async def export_profile(self, previous: ProfileState | None = None) -> ProfileState:
        got = await self.conn.send("storage.getCookies", {}, timeout=30)
        raw = got.get("cookies")
        cookies = [c for c in (cookie_to_saved(r) for r in (raw if isinstance(raw, list) else [])) if c]
        tree = await self.conn.send("browsingContext.getTree", {"maxDepth": 0}, timeout=30)
        listed = tree.get("contexts")
        url = await self._page_url()
        tabs = [c.get("url") for c in (listed if isinstance(listed, list) else [])
                if isinstance(c, dict) and c.get("context") != self.context]
        storage = await self._storage_now(previous, url)
        return parse_state({"cookies": cookies, "tabs": [url, *tabs], "storage": storage})

    async def import_profile(self, state: ProfileState) -> list[str]:
        problems: list[str] = []
        for cookie in state.cookies:
            try:
                await self.conn.send("storage.setCookie", {"cookie": cookie_to_bidi(cookie)}, timeout=30)
            except (CDPCommandFailed, KeyError) as exc:
                problems.append(f"cookie {str(cookie.get('name'))[:60]}: {str(exc)[:200]}")
        if state.storage:
            source = RESTORE_STORAGE.replace("__SAVED__", json.dumps(state.storage))
            try:
                await self.conn.send("script.addPreloadScript", {
                    "functionDeclaration": f"() => {{ {source} }}", "contexts": [self.context]})
            except CDPCommandFailed as exc:
                problems.append(f"local storage: {exc.cdp_message[:200]}")
        for url in state.tabs[1:]:
            try:
                tab = await self.conn.call("browsingContext.create", {"type": "tab", "background": True},
                                           lambda f: f.string("context", 128))
                await self.conn.send("browsingContext.navigate", {"context": tab, "url": url, "wait": "none"})
            except CDPCommandFailed as exc:
                problems.append(f"tab {url[:100]}: {exc.cdp_message[:200]}")
        return problems


def _first_context(f: Fields) -> str:
    for c in f.objs("contexts", 1000):
        return c.string("context", 128)
    raise CDPProtocolError("browsingContext.getTree: the browser has no tab")


@contextlib.asynccontextmanager
async def open_firefox(conn: CDPConnection, *, viewport: Display = BOOT_VIEWPORT,
                       insecure_certs: bool = False) -> AsyncIterator[FirefoxDriver]:
    """A BiDi session and a driver on the browser's first tab, with its event reader running
    (``insecure_certs``: accept any certificate — the host tests' own CA, never a rig)."""
    caps = {"alwaysMatch": {**CAPABILITIES["alwaysMatch"], "acceptInsecureCerts": insecure_certs}}
    # The first session is slow on a cold engine (its remote agent loads its modules): ~15 s
    # under TCG; later commands take their usual deadline.
    version = await conn.call("session.new", {"capabilities": caps},
                              lambda f: f.obj("capabilities").string("browserVersion", 64, default=""),
                              timeout=SESSION_NEW_TIMEOUT_S)
    events = conn.open_subscription(set(SESSION_EVENTS), limit=CONSOLE_KEEP)
    await conn.send("session.subscribe", {"events": list(SESSION_EVENTS)}, timeout=SESSION_NEW_TIMEOUT_S)
    context = await conn.call("browsingContext.getTree", {"maxDepth": 0}, _first_context)
    driver = FirefoxDriver(conn, context, events, viewport=viewport, version=version)
    await driver._setup()
    try:
        async with beside(driver.read_events):
            yield driver
    finally:
        conn.unsubscribe(events)


__all__ = [
    "FIREFOX_PREFS", "FirefoxDriver", "console_entry", "cookie_to_bidi", "cookie_to_saved", "fit_jpeg",
    "open_firefox", "parse_script_result", "user_js",
]
