"""The browser_use verbs every engine answers alike, written once over a few engine hooks.

:class:`PageVerbs` is the base of all three drivers (Chromium over CDP, Firefox over
WebDriver BiDi, WebKit over WebDriver classic). It holds the state a page's verbs share
(the viewport, the pointer, the console kept between extracts, the input lock) and the
verbs whose meaning does not depend on the engine's protocol: dispatch, ``extract``,
``set_viewport``, ``wait_for`` and the clipboard's secure-origin check, plus the answer of
``screenshot``. Each engine supplies the hooks below; what truly differs (loads, history,
stills, input, profiles) stays in its own module.

Engine hooks:

- ``_page_json()``: the page's URL and title as the RPC shape;
- ``_page_url()``: the top document's URL;
- ``_is_secure_context()``: whether the page has the Clipboard API;
- ``_dom()`` / ``_a11y()``: the document's HTML (:data:`rigd.browser.page.DOM_SCRIPT`'s
  answer) and its accessibility outline;
- ``_gather_console()``: move what the engine has buffered into :attr:`console`;
- ``_resize(size)``: make the page ``size`` CSS px, or raise :class:`PageError` saying what it is;
- ``_matches(engine, body)``: whether a selector matches now (a field error when it is invalid).
"""

from __future__ import annotations

import base64
import contextlib
from collections import deque
from collections.abc import Awaitable, Callable, Iterator
from dataclasses import dataclass
from typing import Any
from urllib.parse import urlsplit

import trio

import rigd.verbs.browser as bv
from rigd.browser.page import (
    CONSOLE_KEEP,
    EXTRACT_MAX_BYTES,
    FULL_PAGE_MAX_HEIGHT,
    LOAD_TIMEOUT_S,
    TITLE_TIMEOUT_S,
    WAIT_FOR_POLL_S,
    PageError,
    selector_engine,
    text_json,
)
from rigd.errors import Conflict, FieldError
from rigd.model import Display
from rigd.protocols.cdp import CDPError, CDPProtocolError
from rigd.verbs.base import Action, BrowserAction, ExtractKind

SINCE = "the previous console extract (or the rig's start)"


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
        self.verbs: dict[str, Callable[[Any], Awaitable[dict[str, Any]]]] = {
            spec_name: getattr(self, f"_do_{spec_name}") for spec_name in bv.VERBS
        }

    # -- the engine's hooks --

    async def _page_json(self) -> dict[str, Any]:
        raise NotImplementedError

    async def _page_url(self) -> str:
        raise NotImplementedError

    async def _is_secure_context(self) -> bool:
        raise NotImplementedError

    async def _dom(self) -> Any:
        raise NotImplementedError

    async def _a11y(self) -> Outline:
        raise NotImplementedError

    async def _gather_console(self) -> list[str]:
        """Move what the engine buffered into :attr:`console`; notes the answer adds."""
        return []

    async def _resize(self, size: Display) -> None:
        raise NotImplementedError

    async def _matches(self, engine: str, body: str) -> bool:
        raise NotImplementedError

    #: What a failed poll of ``wait_for`` may raise and be asked again (a navigation in between).
    transient: tuple[type[Exception], ...] = (CDPError,)

    # -- dispatch --

    async def perform(self, action: Action) -> dict[str, Any]:
        """Run one parsed browser_use action; the result is the verb's RPC answer."""
        handler = self.verbs.get(action.verb)
        if handler is None or not isinstance(action, BrowserAction):
            raise FieldError("action.action", f"a browser rig does not answer {action.verb}")
        return await handler(action)

    # -- observations --

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

    # -- clipboard --

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


__all__ = ["ConsoleLog", "Outline", "PageVerbs", "Still", "check_viewport", "page_size", "too_tall"]
