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
from collections.abc import Sequence
from typing import Any

import trio

import rigd.verbs.browser as bv
from rigd.browser.bidi_input import (
    KEYBOARD_ID,
    MOUSE_ID,
    WHEEL_ID,
    plan_bidi,
    press_actions,
    text_actions,
)
from rigd.browser.driver import Outline, PageVerbs, Planned
from rigd.browser.live_input import PointerState
from rigd.browser.page import (
    A11Y_OUTLINE,
    DRAG_STEPS,
    FILL,
    FIND,
    POINT,
    STORAGE,
    TITLE,
    TITLE_MAX_CHARS,
    FrameSink,
    check_fill_verdict,
    element_centre,
    origin_of,
    polled_frames,
    selector_engine,
    text_json,
)
from rigd.browser.profiles import ProfileState
from rigd.errors import FieldError
from rigd.model import Display
from rigd.protocols.cdp import CDPError, CDPProtocolError
from rigd.protocols.input import Step
from rigd.verbs.keys import KeyCombo

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

    def _key_actions(self, actions: list[dict[str, Any]]) -> list[dict[str, Any]]:
        """The key actions as this engine takes them (as given, unless it says otherwise)."""
        return actions

    async def _value(self, expression: str, *, timeout: float | None = None) -> Any:
        return await self._script(f"() => {expression}", timeout=timeout)

    #: Where the a11y extract's outline comes from (the engine has no accessibility tree to read).
    A11Y_SOURCE = "DOM-derived outline"

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

    async def _click_at(self, point: tuple[int, int]) -> None:
        await self._actions(self._mouse([self._move(point), {"type": "pointerDown", "button": 0},
                                         {"type": "pointerUp", "button": 0}]))

    async def _move_to(self, point: tuple[int, int]) -> None:
        await self._actions(self._mouse([self._move(point)]))

    async def _drag_along(self, start: tuple[int, int], end: tuple[int, int]) -> None:
        steps: list[dict[str, Any]] = [self._move(start), {"type": "pointerDown", "button": 0}]
        for step in range(1, DRAG_STEPS + 1):
            steps.append({**self._move((start[0] + (end[0] - start[0]) * step // DRAG_STEPS,
                                        start[1] + (end[1] - start[1]) * step // DRAG_STEPS)),
                          "duration": 20})
        steps.append({"type": "pointerUp", "button": 0})
        await self._actions(self._mouse(steps))

    async def _set_button(self, down: bool) -> None:
        await self._actions(self._mouse([self._move(self.pointer),
                                         {"type": "pointerDown" if down else "pointerUp", "button": 0}]))

    async def _wheel(self, point: tuple[int, int], dx: int, dy: int) -> dict[str, Any]:
        await self._actions({"type": "wheel", "id": WHEEL_ID, "actions": [
            {"type": "scroll", "x": point[0], "y": point[1], "deltaX": dx, "deltaY": dy}]})
        return {}

    async def _storage_now(self, previous: ProfileState | None, url: str) -> dict[str, dict[str, str]]:
        """A profile's local storage: ``previous``'s, with the driven page's origin as it is now
        (dropped when the page holds none); origins visited earlier keep what was saved."""
        storage = dict(previous.storage) if previous is not None else {}
        origin = origin_of(url)
        if origin is not None:
            items = await self._script(STORAGE, timeout=30)
            if isinstance(items, dict) and items:
                storage[origin] = items
            else:
                storage.pop(origin, None)
        return storage

    # -- a person's live-view input --

    def _plan_input(self, steps: Sequence[Step], state: PointerState) -> Planned:
        return plan_bidi(steps, (self.viewport.width, self.viewport.height), state)

    async def _send_planned(self, command: Any) -> None:
        await self._replay_sources(command)

    async def _replay_sources(self, sources: list[dict[str, Any]]) -> None:
        await self._actions(*sources)

    # -- keyboard --

    async def _keys(self, actions: list[dict[str, Any]]) -> None:
        actions = self._key_actions(actions)
        for i in range(0, len(actions), KEY_CHUNK):
            await self._actions({"type": "key", "id": KEYBOARD_ID, "actions": actions[i:i + KEY_CHUNK]})

    async def _type_text(self, text: str) -> str:
        await self._keys(text_actions(text))
        return "key actions"

    async def _press_combo(self, combo: KeyCombo) -> None:
        await self._keys(press_actions(combo))

    async def _do_fill(self, a: bv.BrowserFill) -> dict[str, Any]:
        engine, body = selector_engine(a.selector)
        actions = text_actions(a.text)
        async with self._input_lock:
            check_fill_verdict(await self._script(FILL, engine, body, not a.text), engine)
            await self._keys(actions)
        return {"selector": a.selector, "characters": len(a.text)}


__all__ = ["KEY_CHUNK", "W3CActionsDriver"]
