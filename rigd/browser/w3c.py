"""The browser_use verbs that Firefox and WebKit answer alike: both take W3C WebDriver input
actions (pointer, key and wheel sources; Firefox over BiDi's ``input.performActions``, WebKit
over classic ``POST /actions``) and run rigd's page scripts, so the pointer, keyboard,
element and page-script verbs are written once here over three engine hooks (beside
:class:`rigd.browser.driver.PageVerbs`'s):

- ``_actions(*sources)``: perform one actions request;
- ``_script(function, *args, timeout=None)``: a page function's JSON answer;
- ``_page_url()``: the top document's URL.

Each engine's module keeps what truly differs (loads, screenshots, the console, profiles,
its transport's errors) and its stated limits. Chromium is driven through CDP's own input
events and is not one of these.
"""

from __future__ import annotations

import contextlib
from typing import Any

import trio

import rigd.verbs.browser as bv
from rigd.browser.bidi_input import KEYBOARD_ID, MOUSE_ID, WHEEL_ID, press_actions, text_actions
from rigd.browser.driver import Outline, PageVerbs
from rigd.browser.page import (
    A11Y_OUTLINE,
    DOM_SCRIPT,
    DRAG_STEPS,
    EXTRACT_MAX_BYTES,
    FILL,
    FIND,
    FOCUSED_EDITABLE,
    POINT,
    SCROLL,
    TITLE,
    TITLE_MAX_CHARS,
    WHEEL_NOTCH_PX,
    FrameSink,
    check_fill_verdict,
    check_point,
    element_centre,
    polled_frames,
    scroll_xy,
    selector_engine,
    settled,
    text_json,
    typed,
)
from rigd.errors import FieldError
from rigd.model import Display
from rigd.protocols.cdp import CDPError, CDPProtocolError
from rigd.verbs.base import ScrollDirection

#: Key actions per request: an engine runs them one by one (a long text would outlast one
#: command's deadline), and its input state carries a held key from request to request.
KEY_CHUNK = 256


class W3CActionsDriver(PageVerbs):
    """The verbs written once over W3C input actions and page scripts (see the module)."""

    #: What :meth:`ended` says when the engine gave no reason.
    GONE = "the page ended"
    #: Neither engine's automation takes a drag-and-drop of files from outside the page.
    takes_drops = False

    def __init__(self, *, viewport: Display, version: str) -> None:
        super().__init__(viewport=viewport)
        self.version = version
        self._gone: str | None = None
        self._gone_event = trio.Event()

    # -- the engine's hooks --

    async def _actions(self, *sources: dict[str, Any]) -> None:
        raise NotImplementedError

    async def _script(self, function: str, *args: Any, timeout: float | None = None) -> Any:
        raise NotImplementedError

    async def _page_url(self) -> str:
        raise NotImplementedError

    def _key_actions(self, actions: list[dict[str, Any]]) -> list[dict[str, Any]]:
        """The key actions as this engine takes them (as given, unless it says otherwise)."""
        return actions

    async def _is_secure_context(self) -> bool:
        return await self._script("() => window.isSecureContext") is True

    #: Where the a11y extract's outline comes from (the engine has no accessibility tree to read).
    A11Y_SOURCE = "DOM-derived outline"

    async def _dom(self) -> Any:
        return await self._script(f"() => {DOM_SCRIPT % EXTRACT_MAX_BYTES}", timeout=30)

    async def _a11y(self) -> Outline:
        got = await self._script(A11Y_OUTLINE, 100_000, timeout=30)
        if not (isinstance(got, dict) and isinstance(got.get("text"), str)):
            raise CDPProtocolError("extract a11y: the page's answer has no outline")
        count = got.get("count")
        return Outline(self.A11Y_SOURCE, count if isinstance(count, int) else 0, got["text"])

    async def drop(self, paths: list[str], point: tuple[int, int]) -> None:
        raise CDPError("this engine takes no drop event (WebDriver has no file drag from outside a page)")

    async def capture(self, *, max_w: int, max_h: int, quality: int = 75) -> tuple[bytes, int, int]:
        raise NotImplementedError

    async def cast(self, sink: FrameSink, *, max_w: int, max_h: int, quality: int) -> None:
        """Neither protocol has a screencast, nor says when the page repaints: stills, rate-capped."""
        await polled_frames(self.capture, sink, max_w=max_w, max_h=max_h, quality=quality)

    async def start_page_state(self, wait_s: float) -> object:
        """Both engines' opens return once their first page has loaded (the session's start)."""
        return True

    async def tabs(self) -> object:
        return None

    # -- shared plumbing --

    async def ended(self) -> str:
        await self._gone_event.wait()
        return self._gone or self.GONE

    async def _page_json(self) -> dict[str, Any]:
        url = await self._page_url()
        title = ""
        with contextlib.suppress(CDPError):
            got = await self._script(TITLE, timeout=self.title_timeout_s)
            if isinstance(got, str):
                title = got
        return {"url": url[:8192], "title": text_json(title[:TITLE_MAX_CHARS], 4096)}

    @staticmethod
    def _mouse(actions: list[dict[str, Any]]) -> dict[str, Any]:
        return {"type": "pointer", "id": MOUSE_ID, "parameters": {"pointerType": "mouse"}, "actions": actions}

    @staticmethod
    def _move(point: tuple[int, int]) -> dict[str, Any]:
        return {"type": "pointerMove", "x": point[0], "y": point[1], "origin": "viewport"}

    async def _do_stop_loading(self, _a: bv.BrowserStopLoading) -> dict[str, Any]:
        await self._script("() => { window.stop(); }")
        return {**await self._page_json(), "stopped": True}

    # -- elements --

    async def _element_point(self, selector: str) -> tuple[int, int]:
        engine, body = selector_engine(selector)
        return element_centre(await self._script(POINT, engine, body), engine, self.viewport)

    async def _matches(self, engine: str, body: str) -> bool:
        got = await self._script(FIND, engine, body)
        if isinstance(got, dict) and got.get("invalid"):
            raise FieldError("action.selector", f"is not a valid {engine} selector")
        return isinstance(got, dict) and got.get("found") is True

    # -- pointer --

    async def _do_click(self, a: bv.BrowserClick) -> dict[str, Any]:
        async with self._input_lock:
            if a.selector is not None:
                point = await self._element_point(a.selector)
            else:
                assert a.coordinate is not None
                point = a.coordinate
                check_point(self.viewport, point, "action.coordinate")
            await self._actions(self._mouse([self._move(point), {"type": "pointerDown", "button": 0},
                                             {"type": "pointerUp", "button": 0}]))
            self.pointer, self.button_down = point, False
        out: dict[str, Any] = {"coordinate": list(point), "button": "left", "clicks": 1}
        if a.selector is not None:
            out["selector"] = a.selector
        return out

    async def _do_mouse_move(self, a: bv.BrowserMouseMove) -> dict[str, Any]:
        check_point(self.viewport, a.coordinate, "action.coordinate")
        async with self._input_lock:
            await self._actions(self._mouse([self._move(a.coordinate)]))
            self.pointer = a.coordinate
        return {"coordinate": list(a.coordinate)}

    async def _do_drag(self, a: bv.BrowserDrag) -> dict[str, Any]:
        check_point(self.viewport, a.start, "action.start_coordinate")
        check_point(self.viewport, a.end, "action.coordinate")
        steps: list[dict[str, Any]] = [self._move(a.start), {"type": "pointerDown", "button": 0}]
        for step in range(1, DRAG_STEPS + 1):
            steps.append({**self._move((a.start[0] + (a.end[0] - a.start[0]) * step // DRAG_STEPS,
                                        a.start[1] + (a.end[1] - a.start[1]) * step // DRAG_STEPS)),
                          "duration": 20})
        steps.append({"type": "pointerUp", "button": 0})
        async with self._input_lock:
            await self._actions(self._mouse(steps))
            self.pointer, self.button_down = a.end, False
        return {"from": list(a.start), "to": list(a.end)}

    async def _button(self, down: bool) -> dict[str, Any]:
        async with self._input_lock:
            await self._actions(self._mouse([self._move(self.pointer),
                                             {"type": "pointerDown" if down else "pointerUp", "button": 0}]))
            self.button_down = down
        return {"coordinate": list(self.pointer), "button": "left", "down": down}

    async def _do_left_mouse_down(self, _a: bv.BrowserLeftMouseDown) -> dict[str, Any]:
        return await self._button(True)

    async def _do_left_mouse_up(self, _a: bv.BrowserLeftMouseUp) -> dict[str, Any]:
        return await self._button(False)

    async def _do_scroll(self, a: bv.BrowserScroll) -> dict[str, Any]:
        point = a.coordinate if a.coordinate is not None else self.pointer
        check_point(self.viewport, point, "action.coordinate")
        px = a.amount * WHEEL_NOTCH_PX
        dx, dy = {ScrollDirection.UP: (0, -px), ScrollDirection.DOWN: (0, px),
                  ScrollDirection.LEFT: (-px, 0), ScrollDirection.RIGHT: (px, 0)}[a.direction]
        async with self._input_lock:
            if point != self.pointer:
                await self._actions(self._mouse([self._move(point)]))
                self.pointer = point
            how = await self._wheel(point, dx, dy)
        out: dict[str, Any] = {"direction": str(a.direction), "amount": a.amount, "coordinate": list(point),
                               **how}
        # A smooth scroll animates: the position once it stops changing.
        position = await settled(self._scroll_position)
        if position is not None:
            out["scrollPosition"] = {"x": position[0], "y": position[1]}
        return out

    async def _wheel(self, point: tuple[int, int], dx: int, dy: int) -> dict[str, Any]:
        """Scroll by (dx, dy) at ``point`` (a wheel source); what the answer adds about how."""
        await self._actions({"type": "wheel", "id": WHEEL_ID, "actions": [
            {"type": "scroll", "x": point[0], "y": point[1], "deltaX": dx, "deltaY": dy}]})
        return {}

    async def _scroll_position(self) -> tuple[int, int] | None:
        return scroll_xy(await self._script(SCROLL))

    # -- keyboard --

    async def _keys(self, actions: list[dict[str, Any]]) -> None:
        actions = self._key_actions(actions)
        for i in range(0, len(actions), KEY_CHUNK):
            await self._actions({"type": "key", "id": KEYBOARD_ID, "actions": actions[i:i + KEY_CHUNK]})

    async def _do_type(self, a: bv.BrowserType) -> dict[str, Any]:
        actions = text_actions(a.text)
        focused = await self._script(f"() => {FOCUSED_EDITABLE}") is True
        async with self._input_lock:
            await self._keys(actions)
        return typed(len(a.text), focused)

    async def _do_fill(self, a: bv.BrowserFill) -> dict[str, Any]:
        engine, body = selector_engine(a.selector)
        actions = text_actions(a.text)
        async with self._input_lock:
            check_fill_verdict(await self._script(FILL, engine, body, not a.text), engine)
            await self._keys(actions)
        return {"selector": a.selector, "characters": len(a.text)}

    async def _do_key(self, a: bv.BrowserKey) -> dict[str, Any]:
        async with self._input_lock:
            await self._keys(press_actions(a.combo))
        return {"key": str(a.combo)}


__all__ = ["KEY_CHUNK", "W3CActionsDriver"]
