"""The Chromium driver: every browser_use verb (RIGS.md §4) over CDP, on one page target.

How this works: :func:`open_chromium` attaches to the browser's page (flatten
mode), enables the domains the verbs need, pins the viewport and starts one
task that answers JavaScript dialogs (an ``alert()`` would otherwise stall
every later command) and notes them in the console buffer. :meth:`perform`
maps each parsed action to CDP commands:

- pointer verbs are ``Input.dispatchMouseEvent`` at CSS pixels of the
  viewport; a click by selector resolves it with ``DOM.querySelector``,
  scrolls it into view and clicks the centre of its first content quad;
- ``type`` is ``Input.insertText`` (any Unicode, at the caret); ``fill``
  focuses and selects the field first; ``key`` is ``Input.dispatchKeyEvent``
  planned by :mod:`rigd.browser.dom_keys`;
- page loads wait for the ``load`` lifecycle event of the loader the command
  started (navigate, reload) or for the history index and ``readyState``
  (history: a back-forward cache restore fires no load);
- extracts and the page's title are page content: they come back framed as
  untrusted (:mod:`rigd.framing`) and capped, with a note saying so.

Every reply is read into typed values at the edge (:class:`rigd.protocols.cdp.Fields`);
the page is hostile and so is the browser that renders it.
Why one module of this size: CDP is the widest of the three transports (isolated worlds,
the screencast, real drop events, dialogs answered by a task of its own); the verbs every
engine shares are :class:`rigd.browser.driver.PageVerbs`, written once.
"""

from __future__ import annotations

import contextlib
import json
import logging
import math
from collections.abc import AsyncIterator, Callable, Sequence
from typing import Any, TypeVar
from urllib.parse import urlsplit

import trio

import rigd.verbs.browser as bv
from rigd.browser.cdp import CDPConnection, CDPSession, Subscription
from rigd.browser.cdp_replies import (
    History,
    console_line,
    document_status,
    parse_ax_tree,
    parse_history,
    parse_layout,
    parse_navigate,
    parse_value,
    quad_centre,
    render_ax,
)
from rigd.browser.dom_keys import plan_press
from rigd.browser.driver import Outline, PageVerbs, Planned, Still, check_viewport
from rigd.browser.live_input import PointerState, plan_cdp
from rigd.browser.page import (
    BOOT_VIEWPORT,
    CONSOLE_KEEP,
    DRAG_STEPS,
    FULL_PAGE_MAX_HEIGHT,
    IMAGE_MAX_BYTES,
    TITLE_MAX_CHARS,
    WORLD_NAME,
    FrameSink,
    PageError,
    decoded_image,
    jpeg_size,
    selector_engine,
)
from rigd.browser.page import CLEAR as _CLEAR
from rigd.browser.page import FILL_PREPARE as _FILL_PREPARE
from rigd.browser.page import LAYOUT_WIDTH as _LAYOUT_WIDTH
from rigd.browser.page import RESOLVE as _RESOLVE
from rigd.browser.page import RESTORE_STORAGE as _RESTORE_STORAGE
from rigd.browser.page import origin_of as _origin_of
from rigd.browser.page import text_json as _text_json
from rigd.browser.profiles import ProfileState, parse_state
from rigd.errors import FieldError
from rigd.model import AGENT_STILL_MAX, Display
from rigd.nurseries import beside
from rigd.protocols.cdp import CDPCommandFailed, CDPError, Event, Fields
from rigd.protocols.devtools import parse_cast_frame
from rigd.protocols.input import Step
from rigd.verbs.base import HistoryDirection
from rigd.verbs.keys import KeyCombo

log = logging.getLogger("rigd.browser.chromium")
T = TypeVar("T")


# -- the driver ----------------------------------------------------------------------------------

#: What Chromium answers for a node id of a document a navigation replaced.
STALE_NODE = "Could not find node with given id"
#: How many times a lookup starts over when a navigation replaced the document under it.
STALE_RETRIES = 5
#: What Chromium answers while a navigation swaps the page's renderer, and how long to wait it out.
DETACHED = "Not attached to an active page"
SWAP_WAIT_S = 5.0


#: CDP's drag operation mask for "copy" (a drop from outside the page).
DRAG_COPY = 1


class ChromiumDriver(PageVerbs):
    """The browser_use verbs on one page (those every engine answers alike in
    :class:`PageVerbs`, over CDP). Made by :func:`open_chromium`."""

    takes_drops = True
    cast_lane = ("cdp-screencast", "Chromium pushes a frame whenever the page repaints")

    def __init__(self, conn: CDPConnection, page: CDPSession, target_id: str, console: Subscription,
                 *, viewport: Display = BOOT_VIEWPORT) -> None:
        self.conn = conn
        self.page = page
        self.target_id = target_id
        self._console_sub = console
        self._world_id: int | None = None
        self._contexts = page.open_subscription(
            {"Runtime.executionContextDestroyed", "Runtime.executionContextsCleared",
             "Page.frameNavigated"}, limit=64)
        super().__init__(viewport=viewport)

    # -- setup -------------------------------------------------------------------------------

    async def _setup(self) -> None:
        for method in ("Page.enable", "Runtime.enable", "DOM.enable", "Network.enable"):
            await self.page.send(method)
        await self.page.send("Page.setLifecycleEventsEnabled", {"enabled": True})
        await self.page.send("Emulation.setFocusEmulationEnabled", {"enabled": True})
        await self._set_metrics(self.viewport)

    async def _set_metrics(self, size: Display) -> None:
        await self.page.send("Emulation.setDeviceMetricsOverride", {
            "width": size.width, "height": size.height, "deviceScaleFactor": 1, "mobile": False,
        })

    async def answer_dialogs(self, *, task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED) -> None:
        """Dismiss every JavaScript dialog (accept ``beforeunload``) and note it in the console."""
        with self.page.subscribe({"Page.javascriptDialogOpening"}, limit=16) as sub:
            task_status.started()
            while True:
                try:
                    event = await sub.receive()
                except CDPError:
                    return
                kind = event.params.get("type")
                self.console.note(console_line(Event("dialog", None, {
                    "type": str(kind)[:20], "message": str(event.params.get("message", ""))[:500],
                })))
                with contextlib.suppress(CDPError):
                    await self.page.send("Page.handleJavaScriptDialog",
                                         {"accept": kind == "beforeunload"})

    async def ended(self) -> str:
        """Return (why) once the page's session ends: detached, or its renderer crashed."""
        return await self.conn.wait_ended(self.page.session_id)

    async def drop(self, paths: list[str], point: tuple[int, int]) -> None:
        """Drop files already in the guest onto the page at ``point``: drag enter, over and drop,
        as a person's drag from the desktop would (CDP's ``Input.dispatchDragEvent``)."""
        x, y = point
        data = {"items": [], "files": list(paths), "dragOperationsMask": DRAG_COPY}
        for kind in ("dragEnter", "dragOver", "drop"):
            await self.page.send("Input.dispatchDragEvent",
                                 {"type": kind, "x": x, "y": y, "data": data, "modifiers": 0})
        self.pointer = (x, y)

    def _plan_input(self, steps: Sequence[Step], state: PointerState) -> Planned:
        return plan_cdp(steps, (self.viewport.width, self.viewport.height), state)

    async def _send_planned(self, command: Any) -> None:
        await self.page.send(*command)

    # -- verbs -------------------------------------------------------------------------------

    async def _history(self) -> History:
        # A navigation that swaps the page's renderer (an error page, a cross-site load) leaves
        # the target briefly without one: wait for it to be attached again, within a bound.
        with trio.move_on_after(SWAP_WAIT_S):
            while True:
                try:
                    return await self.page.call("Page.getNavigationHistory", None, parse_history)
                except CDPCommandFailed as exc:
                    if DETACHED not in exc.cdp_message:
                        raise
                await trio.sleep(0.05)
        return await self.page.call("Page.getNavigationHistory", None, parse_history)

    async def _world(self) -> int:
        """The execution context of rigd's isolated world in the current document.

        rigd's scripts run there, not in the page's world: the DOM is shared, but
        the page's JavaScript (a replaced ``String.prototype.slice``, a getter on
        ``window.scrollX``) cannot reach them. A new document destroys the world;
        the events saying so are read before each use.
        """
        if self._contexts.dropped:  # too many to know: start afresh
            self._contexts.dropped, self._world_id = 0, None
        for event in self._contexts.drain():
            gone = event.params.get("executionContextId")
            if event.method == "Runtime.executionContextsCleared" or gone == self._world_id:
                self._world_id = None
            elif event.method == "Page.frameNavigated" and self._main_frame_moved(event):
                # Also a back-forward cache restore, whose old world is frozen, not destroyed.
                self._world_id = None
        if self._world_id is None:
            self._world_id = await self.page.call(
                "Page.createIsolatedWorld", {"frameId": self.target_id, "worldName": WORLD_NAME},
                lambda f: f.integer("executionContextId", 1, 2**31))
        return self._world_id

    async def _in_world(self, method: str, params: dict[str, Any], key: str,
                        parse: Callable[[Fields], T], timeout: float | None = None) -> T:
        """``method`` with ``key`` set to rigd's world; once more in a new world if the
        document changed under the first attempt."""
        for attempt in (1, 2):
            world = await self._world()
            try:
                return await self.page.call(method, {**params, key: world}, parse, timeout=timeout)
            except CDPCommandFailed as exc:
                if attempt == 2 or "context" not in exc.cdp_message.lower():
                    raise
                self._world_id = None
        raise AssertionError("unreachable")

    async def _eval(self, expression: str, *, timeout: float | None = None,
                    await_promise: bool = False, gesture: bool = False, main_world: bool = False) -> Any:
        """An expression's JSON value, evaluated in rigd's isolated world (``main_world``:
        in the page's own, to read its globals; tests do)."""
        params = {"expression": expression, "returnByValue": True, "awaitPromise": await_promise,
                  "userGesture": gesture}
        if main_world:
            return await self.page.call("Runtime.evaluate", params, parse_value, timeout=timeout)
        return await self._in_world("Runtime.evaluate", params, "contextId", parse_value, timeout)

    async def _page_json(self) -> dict[str, Any]:
        """The page's URL (the browser's) and title (the document's: the browser's copy
        trails the renderer's; a page too busy to answer gets the browser's)."""
        entry = (await self._history()).entry
        title, url = entry.title, entry.url
        with contextlib.suppress(CDPError):
            # The browser's history can still show a first tab's initial entry (url '') after its
            # start page loaded (seen on a loaded host): the document's own location then.
            got = await self._eval(f"[document.title.substring(0, {TITLE_MAX_CHARS}), location.href]",
                                   timeout=self.title_timeout_s)
            if isinstance(got, list) and len(got) == 2 and all(isinstance(g, str) for g in got):
                title = got[0]
                url = url or got[1]
        return {"url": url[:8192], "title": _text_json(title[:TITLE_MAX_CHARS], 4096)}

    async def _wait_load(self, sub: Subscription, loader_id: str | None, timeout: float) -> bool:
        """Wait for ``load`` of ``loader_id`` on the main frame (the first loader to start
        when None). False when it did not come in time."""
        want = loader_id
        with trio.move_on_after(timeout):
            while True:
                p = (await sub.receive()).params
                if p.get("frameId") != self.target_id:
                    continue
                if want is None and p.get("name") == "init" and isinstance(p.get("loaderId"), str):
                    want = p["loaderId"]
                elif p.get("name") == "load" and want is not None and p.get("loaderId") == want:
                    return True
        return False

    async def _do_navigate(self, a: bv.BrowserNavigate) -> dict[str, Any]:
        with self.page.subscribe({"Page.lifecycleEvent"}) as life, \
                self.page.subscribe({"Network.responseReceived"}, limit=64) as responses:
            nav = await self.page.call("Page.navigate", {"url": a.url}, parse_navigate,
                                       timeout=self.load_timeout_s)
            if nav.error_text is not None:
                host = urlsplit(a.url).hostname or "the page"
                hint = (" (names outside the rig's egress allowlist do not resolve)"
                        if nav.error_text == "net::ERR_NAME_NOT_RESOLVED" else "")
                raise PageError(f"navigate: {host} did not load: {nav.error_text}{hint}")
            loaded = True if nav.loader_id is None else await self._wait_load(
                life, nav.loader_id, self.load_timeout_s)
            status = document_status(responses.drain(), nav.loader_id)
        return await self._navigated(loaded, status, nav.loader_id is None)

    async def _do_reload(self, a: bv.BrowserReload) -> dict[str, Any]:
        with self.page.subscribe({"Page.lifecycleEvent"}) as life:
            await self.page.send("Page.reload", {"ignoreCache": a.hard})
            loaded = await self._wait_load(life, None, self.load_timeout_s)
        return {**await self._page_json(), "hard": a.hard, "loaded": loaded}

    async def _do_stop_loading(self, _a: bv.BrowserStopLoading) -> dict[str, Any]:
        await self.page.send("Page.stopLoading")
        return {**await self._page_json(), "stopped": True}

    # -- elements --

    async def _query(self, selector: str) -> int:
        """The node id of the first element ``selector`` matches; a field error otherwise."""
        node = await self._find(selector)
        if node == 0:
            raise FieldError("action.selector", "matches no element on the page")
        return node

    async def _document_root(self) -> int:
        """The current document's root node id. Node ids exist only for a document the client
        has asked for (DOM.requestNode answers 0 otherwise), and a new document starts over:
        every lookup asks."""
        return await self.page.call("DOM.getDocument", {"depth": 0},
                                    lambda f: f.obj("root").integer("nodeId", 1, 2**31))

    async def _find(self, selector: str) -> int:
        """The node id of the first element ``selector`` matches, 0 for none; a field error
        when the selector is invalid."""
        return await self._node(*selector_engine(selector))

    async def _node(self, engine: str, body: str) -> int:
        if engine == "css":
            for _attempt in range(STALE_RETRIES):
                root = await self._document_root()
                try:
                    return await self.page.call("DOM.querySelector", {"nodeId": root, "selector": body},
                                                lambda f: f.integer("nodeId", 0, 2**31))
                except CDPCommandFailed as exc:
                    if STALE_NODE not in exc.cdp_message:
                        raise FieldError("action.selector", "is not a valid CSS selector") from exc
                    # A navigation replaced the document between the two calls: ask again.
            raise PageError(f"the page's document kept changing while {body[:80]!r} was looked up")
        else:
            await self._document_root()
            object_id = await self._resolve(engine, body)
            node = 0 if object_id is None else await self.page.call(
                "DOM.requestNode", {"objectId": object_id}, lambda f: f.integer("nodeId", 0, 2**31))
        return node

    async def _resolve(self, engine: str, body: str) -> str | None:
        """The remote object id of the element a non-CSS engine finds, or None."""
        def element(f: Fields) -> str | None:
            if f.has("exceptionDetails"):
                rule = "a valid XPath expression" if engine == "xpath" else f"a valid {engine} selector"
                raise FieldError("action.selector", f"is not {rule}")
            obj = f.obj("result")
            if obj.string("type", 32) != "object" or obj.raw("subtype") != "node":
                return None
            return obj.string("objectId", 256)

        expression = f"({_RESOLVE})({json.dumps(engine)}, {json.dumps(body)})"
        return await self._in_world("Runtime.evaluate", {"expression": expression}, "contextId", element)

    async def _element_point(self, selector: str) -> tuple[int, int]:
        node = await self._query(selector)
        with contextlib.suppress(CDPCommandFailed):  # an element without layout has no box: below
            await self.page.send("DOM.scrollIntoViewIfNeeded", {"nodeId": node})
        try:
            centre = await self.page.call("DOM.getContentQuads", {"nodeId": node}, quad_centre)
        except CDPCommandFailed:
            centre = None
        if centre is None:
            raise FieldError("action.selector", "matches an element that is not rendered (it has no box)")
        x, y = math.floor(centre[0]), math.floor(centre[1])
        if not (0 <= x < self.viewport.width and 0 <= y < self.viewport.height):
            raise FieldError("action.selector", f"matches an element whose centre ({x}, {y}) is outside "
                                                f"the {self.viewport.width}x{self.viewport.height} viewport")
        return x, y

    async def _object_id(self, node: int) -> str:
        return await self._in_world("DOM.resolveNode", {"nodeId": node}, "executionContextId",
                                    lambda f: f.obj("object").string("objectId", 256))

    async def _call_on(self, object_id: str, function: str) -> Any:
        return await self.page.call("Runtime.callFunctionOn", {
            "objectId": object_id, "functionDeclaration": function, "returnByValue": True,
        }, parse_value)

    # -- pointer --

    async def _mouse(self, kind: str, point: tuple[int, int], **extra: Any) -> None:
        buttons = 1 if self.button_down else 0
        params = {"type": kind, "x": point[0], "y": point[1], "buttons": buttons, **extra}
        await self.page.send("Input.dispatchMouseEvent", params)
        self.pointer = point

    async def _press(self, point: tuple[int, int], down: bool, clicks: int = 1) -> None:
        self.button_down = down
        await self._mouse("mousePressed" if down else "mouseReleased", point, button="left",
                          clickCount=clicks)

    async def _click_at(self, point: tuple[int, int]) -> None:
        await self._mouse("mouseMoved", point)
        await self._press(point, True)
        await self._press(point, False)

    async def _move_to(self, point: tuple[int, int]) -> None:
        await self._mouse("mouseMoved", point)

    async def _drag_along(self, start: tuple[int, int], end: tuple[int, int]) -> None:
        await self._mouse("mouseMoved", start)
        await self._press(start, True)
        for step in range(1, DRAG_STEPS + 1):
            x = start[0] + (end[0] - start[0]) * step // DRAG_STEPS
            y = start[1] + (end[1] - start[1]) * step // DRAG_STEPS
            await self._mouse("mouseMoved", (x, y))
        await self._press(end, False)

    async def _set_button(self, down: bool) -> None:
        await self._press(self.pointer, down)

    async def _wheel(self, point: tuple[int, int], dx: int, dy: int) -> dict[str, Any]:
        await self._mouse("mouseWheel", point, deltaX=dx, deltaY=dy)
        return {}

    # -- keyboard --

    async def _type_text(self, text: str) -> str:
        await self.page.send("Input.insertText", {"text": text})
        return "insertText"

    async def _press_combo(self, combo: KeyCombo) -> None:
        for params in plan_press(combo):
            await self.page.send("Input.dispatchKeyEvent", params)

    async def _do_fill(self, a: bv.BrowserFill) -> dict[str, Any]:
        node = await self._query(a.selector)
        obj = await self._object_id(node)
        with contextlib.suppress(CDPCommandFailed):
            await self.page.send("DOM.scrollIntoViewIfNeeded", {"nodeId": node})
        verdict = await self._call_on(obj, _FILL_PREPARE)
        if verdict == "disabled":
            raise FieldError("action.selector", "matches a field that is disabled or read-only")
        if verdict != "ok":
            raise FieldError("action.selector", f"matches an element that is {str(verdict)[:80]}; fill "
                                                "takes an input, textarea or contenteditable element")
        async with self._input_lock:
            if a.text:
                await self.page.send("Input.insertText", {"text": a.text})
            else:
                await self._call_on(obj, _CLEAR)
        return {"selector": a.selector, "characters": len(a.text)}

    # -- observations --

    async def _a11y(self) -> Outline:
        nodes = await self.page.call("Accessibility.getFullAXTree", None, parse_ax_tree, timeout=30)
        return Outline("chromium accessibility tree", len(nodes), render_ax(nodes))

    async def _gather_console(self) -> list[str]:
        for event in self._console_sub.drain():
            self.console.note(console_line(event))
        self.console.dropped += self._console_sub.dropped
        self._console_sub.dropped = 0
        return []

    async def _do_screenshot(self, a: bv.BrowserScreenshot) -> dict[str, Any]:
        cap = AGENT_STILL_MAX
        params: dict[str, Any] = {"format": "jpeg", "quality": 75}
        notes: list[str] = []
        page_size = None
        vw, vh = self.viewport.width, self.viewport.height
        if a.full_page:
            m = await self.page.call("Page.getLayoutMetrics", None, parse_layout)
            width = max(1, math.ceil(m.content_w))
            height = max(1, math.ceil(m.content_h))
            page_size = {"width": width, "height": height}
            if height > FULL_PAGE_MAX_HEIGHT:
                notes.append(f"the page is {height} px tall; only the top {FULL_PAGE_MAX_HEIGHT} px "
                             "were captured")
                height = FULL_PAGE_MAX_HEIGHT
            scale = min(1.0, cap.width / width)
            params.update(captureBeyondViewport=True,
                          clip={"x": 0, "y": 0, "width": width, "height": height, "scale": scale})
        else:
            scale = min(1.0, cap.width / vw, cap.height / vh)
            if scale < 1.0:
                m = await self.page.call("Page.getLayoutMetrics", None, parse_layout)
                params["clip"] = {"x": m.page_x, "y": m.page_y, "width": vw, "height": vh, "scale": scale}
        layout_width = await self._eval(_LAYOUT_WIDTH) if a.full_page else None
        try:
            data = await self.page.call("Page.captureScreenshot", params, _image_bytes, timeout=60)
        finally:
            if a.full_page:
                # captureBeyondViewport leaves the page without its scrollbar (its layout
                # 15 px wider) until the metrics change; clearing and setting them again
                # puts the page back as it was (a screenshot is an observation), once the
                # renderer has laid it out again.
                # Under load the renderer may take both commands before it lays out, see no
                # change and keep the page as it was captured: then the metrics go through a
                # size one pixel narrower first, which forces the layout.
                with trio.CancelScope(shield=True), contextlib.suppress(CDPError):
                    await self.page.send("Emulation.clearDeviceMetricsOverride")
                    for attempt in range(3):
                        if attempt:
                            await self._set_metrics(Display(vw - 1, vh))
                        await self._set_metrics(self.viewport)
                        with trio.move_on_after(2):
                            # No event says "laid out again": poll the layout width.
                            while await self._eval(_LAYOUT_WIDTH) != layout_width:  # noqa: ASYNC110
                                await trio.sleep(0.02)
                        if await self._eval(_LAYOUT_WIDTH) == layout_width:
                            break
        iw, ih = _jpeg_size(data)
        return self._still_answer(Still(data, iw, ih, 1 / scale, "cdp", tuple(notes), page_size),
                                  a.full_page)

    # -- profiles (rigd.browser.profiles): read and put back over CDP, never as guest files --

    async def export_profile(self, previous: ProfileState | None = None) -> ProfileState:
        """The engine's cookies and open tabs now, and the driven page's local storage merged
        over ``previous``'s (origins visited earlier keep what was saved for them)."""
        cookies = await self.conn.send("Storage.getCookies", timeout=30)
        targets = await self.conn.send("Target.getTargets", timeout=30)
        url = (await self._history()).entry.url
        pages = [t.get("url") for t in targets.get("targetInfos", []) if isinstance(t, dict)
                 and t.get("type") == "page" and t.get("targetId") != self.target_id]
        storage = dict(previous.storage) if previous is not None else {}
        origin = _origin_of(url)
        if origin is not None:
            await self.page.send("DOMStorage.enable")
            got = await self.page.send("DOMStorage.getDOMStorageItems", {
                "storageId": {"securityOrigin": origin, "isLocalStorage": True}}, timeout=30)
            entries = got.get("entries")
            items = {e[0]: e[1] for e in entries if isinstance(e, list) and len(e) == 2} \
                if isinstance(entries, list) else {}
            if items:
                storage[origin] = items
            else:
                storage.pop(origin, None)
        return parse_state({"cookies": cookies.get("cookies"), "tabs": [url, *pages], "storage": storage})

    async def import_profile(self, state: ProfileState) -> list[str]:
        """Put a saved profile back (cookies, local storage, tabs past the first as background
        tabs); returns what could not be restored. The caller navigates to ``state.tabs[0]``."""
        problems: list[str] = []
        if state.cookies:
            try:
                await self.conn.send("Storage.setCookies", {"cookies": state.cookies}, timeout=30)
            except CDPCommandFailed as exc:
                problems.append(f"cookies: {exc.cdp_message[:200]}")
        if state.storage:
            # Local storage can be set only in a frame of its origin, and must be there before
            # the page's own scripts read it: a script that runs first in every new document
            # of this page puts each origin's items back (once per tab, never over a value).
            source = _RESTORE_STORAGE.replace("__SAVED__", json.dumps(state.storage))
            try:
                await self.page.send("Page.addScriptToEvaluateOnNewDocument", {"source": source})
            except CDPCommandFailed as exc:
                problems.append(f"local storage: {exc.cdp_message[:200]}")
        for url in state.tabs[1:]:
            try:
                await self.conn.send("Target.createTarget", {"url": url, "background": True})
            except CDPCommandFailed as exc:
                problems.append(f"tab {url[:100]}: {exc.cdp_message[:200]}")
        return problems

    async def capture(self, *, max_w: int, max_h: int, quality: int = 75) -> tuple[bytes, int, int]:
        """A JPEG of the viewport as it is now, scaled down (never up) to fit
        ``max_w``x``max_h``, and its size (the live view's and a rig still's lane)."""
        vw, vh = self.viewport.width, self.viewport.height
        scale = min(1.0, max_w / vw, max_h / vh)
        params: dict[str, Any] = {"format": "jpeg", "quality": max(1, min(100, quality))}
        if scale < 1.0:
            m = await self.page.call("Page.getLayoutMetrics", None, parse_layout)
            params["clip"] = {"x": m.page_x, "y": m.page_y, "width": vw, "height": vh, "scale": scale}
        data = await self.page.call("Page.captureScreenshot", params, _image_bytes, timeout=60)
        iw, ih = _jpeg_size(data)
        return data, iw, ih

    async def cast(self, sink: FrameSink, *, max_w: int, max_h: int, quality: int) -> None:
        """Chromium pushes a JPEG whenever the page repaints (``Page.startScreencast``); each
        is acked, and the screencast stopped when the caller is cancelled."""
        try:
            with self.page.subscribe({"Page.screencastFrame"}, limit=8) as sub:
                await self.page.send("Page.startScreencast", {
                    "format": "jpeg", "quality": quality, "everyNthFrame": 1,
                    "maxWidth": max_w, "maxHeight": max_h,
                })
                while True:
                    event = await sub.receive()
                    frame = parse_cast_frame(event.params)
                    await self.page.send("Page.screencastFrameAck", {"sessionId": frame.ack})
                    sink(frame.data, frame.width, frame.height)
        finally:
            with trio.CancelScope(shield=True), trio.move_on_after(2), contextlib.suppress(CDPError):
                await self.page.send("Page.stopScreencast")

    async def start_page_state(self, wait_s: float) -> object:
        """Chromium answers DevTools before its first tab has committed its first navigation:
        wait (polling, bounded) until the tab shows a loaded ``file:`` document."""
        where: object = None
        with trio.move_on_after(wait_s):
            while True:
                try:
                    where = await self._eval("[location.href, document.readyState]", timeout=10)
                except CDPError as exc:
                    where = f"{type(exc).__name__}: {exc}"
                if isinstance(where, list) and str(where[0]).startswith("file:") and where[1] == "complete":
                    return True
                await trio.sleep(0.1)
        return where

    async def tabs(self) -> object:
        got = await self.conn.send("Target.getTargets", timeout=10)
        return [(t.get("type"), str(t.get("url"))[:100]) for t in got.get("targetInfos", [])
                if isinstance(t, dict)]

    async def _resize(self, size: Display) -> None:
        await self._set_metrics(size)
        check_viewport(await self._eval("[window.innerWidth, window.innerHeight]"), size)

    async def _do_history(self, a: bv.BrowserHistory) -> dict[str, Any]:
        history = await self._history()
        back = a.direction is HistoryDirection.BACK
        index = history.current + (-1 if back else 1)
        if not 0 <= index < len(history.entries):
            raise FieldError("action.direction",
                             f"there is no {'earlier' if back else 'later'} page in this tab's history")
        target = history.entries[index]
        loaded = False
        with trio.move_on_after(self.load_timeout_s), \
                self.page.subscribe({"Page.frameNavigated", "Page.navigatedWithinDocument"}) as moved:
            await self.page.send("Page.navigateToHistoryEntry", {"entryId": target.id})
            # The history index moves before the document does (it counts the pending
            # entry): wait for the main frame to commit, then for its readyState.
            await moved.wait_for(self._main_frame_moved, self.load_timeout_s)
            await self._until_complete()
            loaded = True
        return await self._went(a, loaded)

    def _main_frame_moved(self, event: Event) -> bool:
        if event.method == "Page.navigatedWithinDocument":
            return event.params.get("frameId") == self.target_id
        frame = event.params.get("frame")
        return isinstance(frame, dict) and frame.get("id") == self.target_id and not frame.get("parentId")

    #: A poll of ``wait_for`` that a navigation interrupts is asked again.
    transient = (CDPCommandFailed, PageError)

    async def _matches(self, engine: str, body: str) -> bool:
        if engine == "css":
            return await self._node(engine, body) != 0
        return await self._resolve(engine, body) is not None

    # -- clipboard --

    async def _page_url(self) -> str:
        return (await self._history()).entry.url

    async def _value(self, expression: str, *, timeout: float | None = None) -> Any:
        return await self._eval(expression, timeout=timeout)

    async def _secure_origin(self, verb: str) -> str:
        origin = await super()._secure_origin(verb)
        await self.conn.send("Browser.grantPermissions", {
            "origin": origin, "permissions": ["clipboardReadWrite", "clipboardSanitizedWrite"],
        })
        return origin

    async def _with_gesture(self, verb: str, function: str, *args: Any) -> Any:
        call = f"({function})({', '.join(json.dumps(a) for a in args)})"
        return await self._eval(call, await_promise=True, gesture=True)


def _image_bytes(f: Fields) -> bytes:
    return decoded_image(f.string("data", IMAGE_MAX_BYTES * 4 // 3 + 4), "Page.captureScreenshot")


def _jpeg_size(data: bytes) -> tuple[int, int]:
    return jpeg_size(data, "Page.captureScreenshot")


#: How often :func:`_page_target` asks again for the browser's first tab.
PAGE_TARGET_POLL_S = 0.1


async def _page_target(conn: CDPConnection, wait_s: float) -> str:
    """The browser's first page target, waited for up to ``wait_s``: Chromium answers DevTools
    before it has made the tab its command line asked for (seen on a loaded TCG host: a blank
    tab made here was driven while the start page loaded in another). A browser that shows
    no tab by then gets a new blank one."""
    def targets(f: Fields) -> list[str]:
        return [t.string("targetId", 128) for t in f.objs("targetInfos", 1000)
                if t.string("type", 64) == "page"]

    with trio.move_on_after(wait_s):
        while True:
            found = await conn.call("Target.getTargets", None, targets)
            if found:
                return found[0]
            await trio.sleep(PAGE_TARGET_POLL_S)
    return await conn.call("Target.createTarget", {"url": "about:blank"},
                           lambda f: f.string("targetId", 128))


@contextlib.asynccontextmanager
async def open_chromium(conn: CDPConnection, *, viewport: Display = BOOT_VIEWPORT,
                        target_id: str | None = None,
                        first_tab_s: float = 10) -> AsyncIterator[ChromiumDriver]:
    """A driver on ``target_id`` (default: the browser's first page, waited for up to
    ``first_tab_s``), with its dialog task running."""
    tid = target_id or await _page_target(conn, first_tab_s)
    page = await conn.attach(tid)
    console = page.open_subscription({"Runtime.consoleAPICalled", "Runtime.exceptionThrown"},
                                     limit=CONSOLE_KEEP)
    driver = ChromiumDriver(conn, page, tid, console, viewport=viewport)
    await driver._setup()
    try:
        async with beside(driver.answer_dialogs):
            yield driver
    finally:
        conn.unsubscribe(console)
        conn.unsubscribe(driver._contexts)


__all__ = ["BOOT_VIEWPORT", "ChromiumDriver", "PageError", "open_chromium", "render_ax"]
