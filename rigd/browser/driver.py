"""The browser_use verbs every engine answers alike, written once over a few engine hooks.

:class:`PageVerbs` is the base of all three drivers (Chromium over CDP, Firefox over
WebDriver BiDi, WebKit over WebDriver classic). It holds the state a page's verbs share
(the viewport, the pointer, the console kept between extracts, the input lock) and the
verbs whose meaning does not depend on the engine's protocol: dispatch, ``extract``,
``set_viewport``, ``wait_for`` and the clipboard's secure-origin check, plus the answer of
``screenshot``. Each engine supplies the hooks below; what truly differs (loads, history,
stills, input, profiles) stays in its own module.

Engine hooks:

- ``_value(expression)``: an expression's JSON value, evaluated in rigd's world of the page;
- ``_page_json()``: the page's URL and title as the RPC shape; ``_page_url()``: the URL;
- ``_a11y()``: the document's accessibility outline;
- ``_gather_console()``: move what the engine has buffered into :attr:`console`;
- ``_resize(size)``: make the page ``size`` CSS px, or raise :class:`PageError` saying what it is;
- ``_matches(engine, body)``: whether a selector matches now (a field error when it is invalid);
  ``_element_point(selector)``: the centre of the element it matches, in the viewport;
- input: ``_click_at``, ``_move_to``, ``_drag_along``, ``_set_button``, ``_wheel``,
  ``_type_text``, ``_press_combo``, each one gesture through the engine's input API;
- ``_with_gesture(verb, function, *args)``: a page function run as if a person's gesture
  had started it (the Clipboard API asks for one).
"""

from __future__ import annotations

import base64
import contextlib
from collections import deque
from collections.abc import Awaitable, Callable, Iterator, Sequence
from dataclasses import dataclass
from typing import Any
from urllib.parse import urlsplit

import trio

import rigd.verbs.browser as bv
from rigd.browser.live_input import PointerState, Sleep
from rigd.browser.marks import FIND_MARKS, LOGIN_FILL, MARK_TARGET, call, parse_target
from rigd.browser.page import (
    CLIPBOARD_MAX_BYTES,
    CONSOLE_KEEP,
    DOM_SCRIPT,
    EXTRACT_MAX_BYTES,
    FOCUSED_EDITABLE,
    FULL_PAGE_MAX_HEIGHT,
    LOAD_TIMEOUT_S,
    TITLE_TIMEOUT_S,
    WAIT_FOR_POLL_S,
    WHEEL_NOTCH_PX,
    PageError,
    check_point,
    scroll_xy,
    selector_engine,
    settled,
    text_json,
)
from rigd.errors import Conflict, FieldError
from rigd.marks import MARK_NAME_MAX, MARKS_MAX, Located, MarkBook, acted, annotate, located
from rigd.model import Display
from rigd.protocols.cdp import CDPError, CDPProtocolError
from rigd.protocols.input import Step
from rigd.verbs.base import Action, BrowserAction, ExtractKind, ScrollDirection
from rigd.verbs.keys import KeyCombo

SINCE = "the previous console extract (or the rig's start)"
#: The Clipboard API's calls, run in the page's own realm with a gesture.
READ_CLIPBOARD = "() => navigator.clipboard.readText()"
WRITE_CLIPBOARD = "(t) => navigator.clipboard.writeText(t)"
NOTHING_FOCUSED = ("no input, textarea or contenteditable element had focus, so the text may "
                   "have gone nowhere; click the field (or use fill) first")


#: The engine's commands for a person's live input (:class:`Sleep` between) and the pointer after.
Planned = tuple[Sequence[object], PointerState]


class ConsoleLog:
    """The page's console lines since the previous console extract: the newest
    :data:`CONSOLE_KEEP`, and how many older ones were dropped to keep it so."""

    def __init__(self) -> None:
        self._lines: deque[str] = deque(maxlen=CONSOLE_KEEP)
        self.dropped = 0

    def note(self, line: str) -> None:
        if len(self._lines) == self._lines.maxlen:
            self.dropped += 1
        self._lines.append(line)

    def __iter__(self) -> Iterator[str]:
        """The lines kept now (a look, not a take)."""
        return iter(self._lines)

    def take(self) -> tuple[list[str], int]:
        """The lines and the count dropped, both cleared."""
        lines, dropped = list(self._lines), self.dropped
        self._lines.clear()
        self.dropped = 0
        return lines, dropped


@dataclass(frozen=True)
class Outline:
    """An accessibility extract: where it came from, how many nodes, the text."""

    source: str
    nodes: int
    text: str


@dataclass(frozen=True)
class Still:
    """A screenshot verb's JPEG and what its answer says about it."""

    data: bytes
    width: int
    height: int
    #: CSS pixels per image pixel.
    scale: float
    source: str
    notes: tuple[str, ...] = ()
    page_size: dict[str, int] | None = None


def page_size(got: Any) -> tuple[int, int]:
    """:data:`rigd.browser.page.PAGE_SIZE`'s answer as (width, height), each at least 1."""
    if not (isinstance(got, list) and len(got) == 2 and all(
            isinstance(v, int) and not isinstance(v, bool) for v in got)):
        raise CDPProtocolError("screenshot: the page's size is not two integers")
    return max(1, got[0]), max(1, got[1])


def too_tall(height: int) -> list[str]:
    """The note for a full page cut to :data:`FULL_PAGE_MAX_HEIGHT`, if it is cut."""
    if height > FULL_PAGE_MAX_HEIGHT:
        return [f"the page is {height} px tall; only the top {FULL_PAGE_MAX_HEIGHT} px were captured"]
    return []


def check_viewport(got: Any, size: Display) -> None:
    """A :class:`PageError` unless the page's ``[innerWidth, innerHeight]`` answer is ``size``."""
    if got != [size.width, size.height]:
        raise PageError(f"the page reports a {got!r:.40} viewport after set_viewport "
                        f"{size.width}x{size.height}")


class PageVerbs:
    """The verbs written once for every engine (see the module); a driver's base."""

    def __init__(self, *, viewport: Display) -> None:
        self.viewport = viewport
        self.pointer: tuple[int, int] = (0, 0)
        self.button_down = False
        #: How long a navigation may take to answer and then to load.
        self.load_timeout_s = LOAD_TIMEOUT_S
        self.title_timeout_s = TITLE_TIMEOUT_S
        self.console = ConsoleLog()
        self._input_lock = trio.Lock()
        #: The ids drawn on the agent's marked stills (:mod:`rigd.marks`).
        self.marks = MarkBook()
        self.verbs: dict[str, Callable[[Any], Awaitable[dict[str, Any]]]] = {
            spec_name: getattr(self, f"_do_{spec_name}") for spec_name in bv.VERBS
        }

    # -- the engine's hooks --

    async def _value(self, expression: str, *, timeout: float | None = None) -> Any:
        raise NotImplementedError

    async def _page_json(self) -> dict[str, Any]:
        raise NotImplementedError

    async def _page_url(self) -> str:
        raise NotImplementedError

    async def _is_secure_context(self) -> bool:
        return await self._value("window.isSecureContext") is True

    async def _a11y(self) -> Outline:
        raise NotImplementedError

    async def _gather_console(self) -> list[str]:
        """Move what the engine buffered into :attr:`console`; notes the answer adds."""
        return []

    async def _resize(self, size: Display) -> None:
        raise NotImplementedError

    async def _matches(self, engine: str, body: str) -> bool:
        raise NotImplementedError

    async def _element_point(self, selector: str) -> tuple[int, int]:
        raise NotImplementedError

    async def _click_at(self, point: tuple[int, int]) -> None:
        """Move to ``point`` and click the left button there."""
        raise NotImplementedError

    async def _move_to(self, point: tuple[int, int]) -> None:
        raise NotImplementedError

    async def _drag_along(self, start: tuple[int, int], end: tuple[int, int]) -> None:
        """Press at ``start``, move to ``end`` in :data:`DRAG_STEPS` steps, release."""
        raise NotImplementedError

    async def _set_button(self, down: bool) -> None:
        """Press or release the left button where the pointer is."""
        raise NotImplementedError

    async def _wheel(self, point: tuple[int, int], dx: int, dy: int) -> dict[str, Any]:
        """Scroll by (dx, dy) CSS px at ``point``; what the answer adds about how."""
        raise NotImplementedError

    async def _type_text(self, text: str) -> str:
        """Enter ``text`` where the focus is; how (the answer's ``via``)."""
        raise NotImplementedError

    async def _press_combo(self, combo: KeyCombo) -> None:
        raise NotImplementedError

    async def _with_gesture(self, verb: str, function: str, *args: Any) -> Any:
        raise NotImplementedError

    def _plan_input(self, steps: Sequence[Step], state: PointerState) -> Planned:
        """A person's live-view input as the engine's input commands (:class:`Sleep` between)."""
        raise NotImplementedError

    async def _send_planned(self, command: Any) -> None:
        raise NotImplementedError

    #: What a failed poll of ``wait_for`` may raise and be asked again (a navigation in between).
    transient: tuple[type[Exception], ...] = (CDPError,)

    # -- dispatch --

    async def perform(self, action: Action) -> dict[str, Any]:
        """Run one parsed browser_use action; the result is the verb's RPC answer."""
        handler = self.verbs.get(action.verb)
        if handler is None or not isinstance(action, BrowserAction):
            raise FieldError("action.action", f"a browser rig does not answer {action.verb}")
        if isinstance(action, bv.BrowserScreenshot) and action.marks:
            return await self._marked_still(handler, action)
        return await handler(action)

    # -- marks --

    async def _marked_still(self, handler: Callable[[Any], Awaitable[dict[str, Any]]],
                            a: bv.BrowserScreenshot) -> dict[str, Any]:
        """The viewport's still with a numbered box on each element a person could act on
        (drawn on the host, on the agent's copy only), and the list of them."""
        generation, _first = self.marks.begin()
        got = await self._value(call(FIND_MARKS, generation, MARKS_MAX, MARK_NAME_MAX), timeout=30)
        try:
            marks, more = self.marks.issue(got, self.viewport)
        except ValueError as exc:
            raise CDPProtocolError(f"screenshot marks: {exc}") from None
        return await annotate(await handler(bv.BrowserScreenshot(full_page=False)), marks, more)

    async def _mark_point(self, mark: int, *, wait_enabled: bool) -> tuple[tuple[int, int], float]:
        """Where mark ``mark``'s element is now, and how long it was waited for to enable."""
        known = self.marks.live(mark)
        generation, index = self.marks.generation, mark - self.marks.first

        async def locate() -> Located:
            return parse_target(await self._value(call(MARK_TARGET, generation, index)), self.viewport)

        return await located(mark, known, locate, wait_enabled=wait_enabled)

    # -- a person's live-view input --

    async def replay(self, steps: Sequence[Step], state: PointerState) -> PointerState:
        """A person's live-view input through the engine's input API; the pointer after."""
        commands, after = self._plan_input(steps, state)
        try:
            async with self._input_lock:
                for command in commands:
                    if isinstance(command, Sleep):
                        await trio.sleep(command.seconds)
                    else:
                        await self._send_planned(command)
        finally:
            self.pointer = (after.x, after.y)
            self.button_down = bool(after.buttons & 1)
        return after

    # -- pointer --

    async def _do_click(self, a: bv.BrowserClick) -> dict[str, Any]:
        waited = 0.0
        if a.mark is not None:  # found (and waited for) outside the input lock: the wait is long
            point, waited = await self._mark_point(a.mark, wait_enabled=True)
        async with self._input_lock:
            if a.selector is not None:
                point = await self._element_point(a.selector)
            elif a.coordinate is not None:
                point = a.coordinate
                check_point(self.viewport, point, "action.coordinate")
            await self._click_at(point)
            self.pointer, self.button_down = point, False
        out: dict[str, Any] = {"coordinate": list(point), "button": "left", "clicks": 1}
        if a.selector is not None:
            out["selector"] = a.selector
        return {**out, **acted(a.mark, waited)}

    async def _do_mouse_move(self, a: bv.BrowserMouseMove) -> dict[str, Any]:
        check_point(self.viewport, a.coordinate, "action.coordinate")
        async with self._input_lock:
            await self._move_to(a.coordinate)
            self.pointer = a.coordinate
        return {"coordinate": list(a.coordinate)}

    async def _do_drag(self, a: bv.BrowserDrag) -> dict[str, Any]:
        check_point(self.viewport, a.start, "action.start_coordinate")
        check_point(self.viewport, a.end, "action.coordinate")
        async with self._input_lock:
            await self._drag_along(a.start, a.end)
            self.pointer, self.button_down = a.end, False
        return {"from": list(a.start), "to": list(a.end)}

    async def _button(self, down: bool) -> dict[str, Any]:
        async with self._input_lock:
            await self._set_button(down)
            self.button_down = down
        return {"coordinate": list(self.pointer), "button": "left", "down": down}

    async def _do_left_mouse_down(self, _a: bv.BrowserLeftMouseDown) -> dict[str, Any]:
        return await self._button(True)

    async def _do_left_mouse_up(self, _a: bv.BrowserLeftMouseUp) -> dict[str, Any]:
        return await self._button(False)

    async def _do_scroll(self, a: bv.BrowserScroll) -> dict[str, Any]:
        if a.mark is not None:
            point, _ = await self._mark_point(a.mark, wait_enabled=False)
        else:
            point = a.coordinate if a.coordinate is not None else self.pointer
        check_point(self.viewport, point, "action.coordinate")
        px = a.amount * WHEEL_NOTCH_PX
        dx, dy = {ScrollDirection.UP: (0, -px), ScrollDirection.DOWN: (0, px),
                  ScrollDirection.LEFT: (-px, 0), ScrollDirection.RIGHT: (px, 0)}[a.direction]
        async with self._input_lock:
            if point != self.pointer:
                await self._move_to(point)
                self.pointer = point
            how = await self._wheel(point, dx, dy)
        out: dict[str, Any] = {"direction": str(a.direction), "amount": a.amount, "coordinate": list(point),
                               **how, **acted(a.mark, 0.0)}
        # A smooth scroll animates: the position once it stops changing.
        position = await settled(self._scroll_position)
        if position is not None:
            out["scrollPosition"] = {"x": position[0], "y": position[1]}
        return out

    async def _scroll_position(self) -> tuple[int, int] | None:
        return scroll_xy(await self._value("[window.scrollX, window.scrollY]"))

    # -- keyboard --

    async def _do_type(self, a: bv.BrowserType) -> dict[str, Any]:
        if a.mark is not None:  # typing at a mark: a click on it first gives it the focus
            await self._do_click(bv.BrowserClick(mark=a.mark))
        focused = await self._value(FOCUSED_EDITABLE) is True
        async with self._input_lock:
            via = await self._type_text(a.text)
        out: dict[str, Any] = {"characters": len(a.text), "via": via, "focusedEditable": focused,
                               **acted(a.mark, 0.0)}
        if not focused:
            out["note"] = NOTHING_FOCUSED
        return out

    async def _do_key(self, a: bv.BrowserKey) -> dict[str, Any]:
        async with self._input_lock:
            await self._press_combo(a.combo)
        return {"key": str(a.combo)}

    # -- loads --

    async def _navigated(self, loaded: bool, status: int | None, same_document: bool) -> dict[str, Any]:
        """A navigate's answer once the engine has said how the load went."""
        out: dict[str, Any] = {**await self._page_json(), "loaded": loaded, "status": status}
        if same_document:
            out["note"] = "a same-document navigation (a fragment or history.pushState): nothing loaded"
        elif not loaded:
            out["note"] = (f"the page had not fired load within {self.load_timeout_s:g} s; "
                           "it may still be loading")
        return out

    async def _until_complete(self, moved: Callable[[], Awaitable[bool]] | None = None) -> None:
        """Poll (every 50 ms, within the caller's deadline) until the document's readyState is
        ``complete`` and, if given, ``moved()`` (no event says a restored page is ready)."""
        while True:
            with contextlib.suppress(CDPError):
                if await self._value("document.readyState") == "complete" \
                        and (moved is None or await moved()):
                    return
            await trio.sleep(0.05)

    async def _went(self, a: bv.BrowserHistory, loaded: bool) -> dict[str, Any]:
        """A history verb's answer once the engine has moved."""
        out = {**await self._page_json(), "direction": str(a.direction), "loaded": loaded}
        if not loaded:
            out["note"] = f"the page had not finished loading within {self.load_timeout_s:g} s"
        return out

    # -- observations --

    async def _dom(self) -> Any:
        return await self._value(DOM_SCRIPT % EXTRACT_MAX_BYTES, timeout=30)

    async def _do_extract(self, a: bv.BrowserExtract) -> dict[str, Any]:
        page = await self._page_json()
        if a.kind is ExtractKind.DOM:
            got = await self._dom()
            if not (isinstance(got, dict) and isinstance(got.get("html"), str)
                    and isinstance(got.get("length"), int)):
                raise CDPProtocolError("extract dom: the page's answer has no html")
            content = text_json(got["html"], EXTRACT_MAX_BYTES)
            if got["length"] > len(got["html"]):
                content["truncated"] = True
                content["note"] = (f"the document's HTML is {got['length']} characters; only the first "
                                   f"{EXTRACT_MAX_BYTES} bytes were kept")
            return {"kind": "dom", **page, "content": content}
        if a.kind is ExtractKind.A11Y:
            outline = await self._a11y()
            return {"kind": "a11y", **page, "source": outline.source, "nodes": outline.nodes,
                    "content": text_json(outline.text, EXTRACT_MAX_BYTES)}
        notes = await self._gather_console()
        lines, dropped = self.console.take()
        if dropped:
            notes.append(f"{dropped} older console entries were dropped (at most {CONSOLE_KEEP} are kept)")
        out = {"kind": "console", **page, "entries": len(lines), "since": SINCE,
               "content": text_json("\n".join(lines), EXTRACT_MAX_BYTES)}
        if notes:
            out["note"] = "; ".join(notes)
        return out

    def _still_answer(self, still: Still, full_page: bool) -> dict[str, Any]:
        """The screenshot verb's answer for ``still``."""
        out: dict[str, Any] = {
            "image": {"mediaType": "image/jpeg", "data": base64.b64encode(still.data).decode()},
            "display": self.viewport.to_json(),
            "imageSize": {"width": still.width, "height": still.height},
            "scale": round(still.scale, 6),
            "fullPage": full_page,
            "source": still.source,
        }
        if still.page_size is not None:
            out["pageSize"] = still.page_size
        out["note"] = "; ".join(("scale is CSS pixels per image pixel: image point (x, y) is "
                                 + ("page" if full_page else "viewport") + " point (x*scale, y*scale)",
                                 *still.notes))
        return out

    # -- the page --

    async def _do_set_viewport(self, a: bv.BrowserSetViewport) -> dict[str, Any]:
        size = Display(a.width, a.height)
        changed = size != self.viewport
        await self._resize(size)
        self.viewport = size
        self.pointer = (min(self.pointer[0], a.width - 1), min(self.pointer[1], a.height - 1))
        return {"display": size.to_json(), "changed": changed}

    async def _do_wait_for(self, a: bv.BrowserWaitFor) -> dict[str, Any]:
        """Ask whether the selector matches every :data:`WAIT_FOR_POLL_S` until it does or the
        timeout passes (each poll is a fresh query: a navigation meanwhile replaces the document)."""
        engine, body = selector_engine(a.selector)
        start = trio.current_time()
        found = False
        with trio.move_on_after(a.timeout_s):
            while True:
                with contextlib.suppress(*self.transient):
                    found = await self._matches(engine, body)
                if found:
                    break
                await trio.sleep(WAIT_FOR_POLL_S)
        out: dict[str, Any] = {"selector": a.selector, "found": found,
                               "waitedS": round(trio.current_time() - start, 3)}
        if not found:
            out["note"] = f"no element matched within {a.timeout_s:g} s"
        return out

    # -- saved logins (issue 30) --

    async def _do_login(self, a: bv.BrowserLogin) -> dict[str, Any]:
        """Fill the saved login (its password looked up by the server, rigd.rigs.logins) into
        the page's login form, only when the page is ``a.site`` over HTTPS. The password
        goes into the page and nowhere else: not in the answer, the audit row or a log."""
        if a.password is None:
            raise Conflict("login: no saved password was looked up for this action", field="action.account")
        url = await self._page_url()
        parts = urlsplit(url)
        if parts.scheme != "https":
            raise Conflict(f"login: this page is {parts.scheme or 'not a web page'}:, not https://; a saved "
                           "login is filled only into HTTPS pages", reason="not https", field="action.site")
        try:
            origin = bv.parse_site(f"https://{parts.netloc}", "action.site")
        except FieldError:
            origin = f"https://{parts.netloc[:200]}"
        if origin != a.site:
            raise Conflict(f"login: the page's origin is {origin}, not {a.site}; a saved login is filled "
                           "only into its own site (a look-alike is refused)", reason="other origin",
                           field="action.site")
        got = await self._value(call(LOGIN_FILL, a.account, a.password), timeout=30)
        if not (isinstance(got, dict) and got.get("found") is True):
            raise Conflict("login: the page has no visible, enabled password field to fill",
                           reason="no login form", field="action.site")
        out: dict[str, Any] = {"site": a.site, "account": a.account, "filled": True,
                               "usernameField": got.get("username") is True}
        if not out["usernameField"]:
            out["note"] = ("the page has no user-name field beside its password field: only the password "
                           "was filled")
        return out

    # -- clipboard --

    async def _do_clipboard_read(self, _a: bv.BrowserClipboardRead) -> dict[str, Any]:
        await self._secure_origin("clipboard_read")
        text = await self._with_gesture("clipboard_read", READ_CLIPBOARD)
        if not isinstance(text, str):
            raise CDPProtocolError("clipboard_read: the page's answer is not text")
        return {"selection": "clipboard", "content": text_json(text, CLIPBOARD_MAX_BYTES)}

    async def _do_clipboard_write(self, a: bv.BrowserClipboardWrite) -> dict[str, Any]:
        await self._secure_origin("clipboard_write")
        await self._with_gesture("clipboard_write", WRITE_CLIPBOARD, a.text)
        return {"selection": "clipboard", "bytes": len(a.text.encode())}

    async def _secure_origin(self, verb: str) -> str:
        """The page's origin, or a refusal of a clipboard verb on a page without the Clipboard
        API saying why."""
        parts = urlsplit(await self._page_url())
        if parts.scheme == "http":
            raise Conflict(
                f"{verb}: this page is served over plain http://, which has no Clipboard API (it is not "
                "a secure context); use type, which inserts at the caret without the clipboard",
                reason="not a secure context", field="action.action",
            )
        if parts.scheme != "https" or not await self._is_secure_context():
            raise Conflict(f"{verb}: this page ({parts.scheme}:) is not a secure https:// context, so it has "
                           "no Clipboard API; use type instead", reason="not a secure context",
                           field="action.action")
        return f"{parts.scheme}://{parts.netloc}"


__all__ = [
    "ConsoleLog", "Outline", "PageVerbs", "Planned", "Still", "check_viewport", "page_size", "too_tall",
]
