"""What every engine's page driver shares: limits, errors, the scripts run in the page, selectors.

The browser_use verbs mean the same on every engine (RIGS.md §4). The verbs written once
live in :mod:`rigd.browser.driver` (every engine) and :mod:`rigd.browser.w3c` (the two
W3C-actions engines); the engine modules (:mod:`rigd.browser.chromium` over CDP,
:mod:`rigd.browser.firefox` over WebDriver BiDi, :mod:`rigd.browser.webkit` over
WebDriver classic) hold only how each reaches the page. What is below them all lives here:
the bounds on what a page may send back, :class:`PageError`, the untrusted-text shape, the
scripts rigd runs in the page (resolving Playwright selectors, preparing a field for
``fill``, putting a profile's local storage back), :func:`selector_engine`, and
:class:`PageDriver`, what :class:`rigd.backends.browser.BrowserDriver` asks of any engine.
"""

from __future__ import annotations

import base64
import math
from collections.abc import Awaitable, Callable, Sequence
from typing import TYPE_CHECKING, Any, Protocol, TypeVar
from urllib.parse import urlsplit

import trio

from rigd.errors import BackendError, FieldError
from rigd.framing import untrusted_bytes
from rigd.model import Display
from rigd.protocols.cdp import CDPProtocolError
from rigd.protocols.devtools import jpeg_size

T = TypeVar("T")

if TYPE_CHECKING:
    from rigd.browser.live_input import PointerState
    from rigd.browser.profiles import ProfileState
    from rigd.protocols.input import Step
    from rigd.verbs.base import Action

#: RIGS.md §7: a browser rig boots at 1280x800.
BOOT_VIEWPORT = Display(1280, 800)
#: How long a page load may take before the verb answers ``loaded: false``.
LOAD_TIMEOUT_S = 30.0
#: One wheel notch in CSS pixels (Chromium's own; Firefox is sent the same).
WHEEL_NOTCH_PX = 100
#: Extracts are capped at this many UTF-8 bytes of content.
EXTRACT_MAX_BYTES = 256 * 1024
#: Console entries kept between two console extracts, and the length of one.
CONSOLE_KEEP = 1000
CONSOLE_ENTRY_MAX_CHARS = 2000
#: The accessibility tree: nodes read at most.
AX_MAX_NODES = 100_000
#: A full-page screenshot is at most this many CSS pixels tall (Chromium's own
#: texture limit is 16384 device pixels).
FULL_PAGE_MAX_HEIGHT = 16384
#: The largest image the browser may send back, decoded.
IMAGE_MAX_BYTES = 24 * 1024 * 1024
#: Text kept from the page's title, and from a clipboard read.
TITLE_MAX_CHARS = 1000
CLIPBOARD_MAX_BYTES = 64 * 1024
#: How long the document's title may take before the browser's copy is used (or, where the
#: protocol has none, an empty title): a driver's ``title_timeout_s``, which a rig under TCG
#: multiplies by :data:`TCG_TITLE_FACTOR` (a loaded TCG host took longer than 2 s to answer a
#: title script in Firefox right after a load).
TITLE_TIMEOUT_S = 2.0
TCG_TITLE_FACTOR = 5
WAIT_FOR_POLL_S = 0.1
#: The isolated world (Chromium) or sandbox (BiDi) rigd's scripts run in.
WORLD_NAME = "rigd"
#: How long a wheel scroll may animate before its position is reported.
SCROLL_SETTLE_S = 2.0
DRAG_STEPS = 5


class PageError(BackendError):
    """The page could not do what the verb asked (a failed load, a crashed renderer)."""


def decoded_image(text: object, what: str) -> bytes:
    """A still sent as base64 text, decoded; a protocol error naming ``what`` unless it is
    base64 text of at most :data:`IMAGE_MAX_BYTES` decoded."""
    if not isinstance(text, str) or len(text) > IMAGE_MAX_BYTES * 4 // 3 + 4:
        raise CDPProtocolError(f"{what}: the image is not base64 text under the cap")
    try:
        return base64.b64decode(text, validate=True)
    except ValueError as exc:
        raise CDPProtocolError(f"{what}: the image is not base64") from exc


def text_json(text: str, limit: int) -> dict[str, Any]:
    """Page text as the untrusted RPC shape, cut to ``limit`` UTF-8 bytes on a character boundary."""
    raw = text.encode("utf-8", "replace")
    truncated = len(raw) > limit
    if truncated:
        raw = raw[:limit].decode("utf-8", "ignore").encode()
    return untrusted_bytes(raw, truncated=truncated, limit=limit)


# -- scripts run in the page (rigd's isolated world) ---------------------------------------------

FILL_PREPARE = """function () {
  const el = this, tag = el.tagName ? el.tagName.toLowerCase() : '';
  if (el.isContentEditable) {
    el.focus();
    const r = document.createRange(); r.selectNodeContents(el);
    const s = window.getSelection(); s.removeAllRanges(); s.addRange(r);
    return 'ok';
  }
  const kinds = ['', 'text', 'search', 'email', 'password', 'tel', 'url', 'number'];
  if (tag === 'textarea' || (tag === 'input' && kinds.includes(el.type))) {
    if (el.disabled || el.readOnly) return 'disabled';
    el.focus();
    if (el.type === 'number' || el.type === 'email') { el.value = ''; }
    else { el.select(); }
    return 'ok';
  }
  return 'not fillable: <' + tag + (el.type ? ' type=' + el.type : '') + '>';
}"""
CLEAR = """function () {
  document.execCommand('delete'); this.dispatchEvent(new Event('input', {bubbles: true})); }"""
LAYOUT_WIDTH = "document.documentElement ? document.documentElement.clientWidth : 0"
FOCUSED_EDITABLE = """(() => { const a = document.activeElement;
  return !!a && (a.isContentEditable || a.tagName === 'INPUT' || a.tagName === 'TEXTAREA'); })()"""
DOM_SCRIPT = """(() => { const s = document.documentElement ? document.documentElement.outerHTML : '';
  return {length: s.length, html: s.slice(0, %d)}; })()"""
#: Playwright's selector engines other than CSS, in the page: ``(engine, body) => Element | null``.
#: ``text=`` is a case-insensitive, whitespace-collapsed substring match (a quoted body is an exact
#: match) of the deepest element that holds it, as Playwright's; ``xpath=`` the first node in
#: document order (a text node gives its parent).
RESOLVE = """(engine, body) => {
  const norm = s => s.replace(/\\s+/g, ' ').trim();
  if (engine === 'css') return document.querySelector(body);
  if (engine === 'id') return document.getElementById(body);
  if (engine === 'data-testid') return document.querySelector('[data-testid="' + CSS.escape(body) + '"]');
  if (engine === 'xpath') {
    const r = document.evaluate(body, document, null, XPathResult.FIRST_ORDERED_NODE_TYPE, null)
      .singleNodeValue;
    return !r ? null : (r.nodeType === 1 ? r : r.parentElement);
  }
  let exact = false, want = body;
  if (want.length >= 2 && (want[0] === '"' || want[0] === "'") && want[want.length - 1] === want[0]) {
    exact = true; want = want.slice(1, -1);
  }
  want = exact ? norm(want) : norm(want).toLowerCase();
  const skip = new Set(['SCRIPT', 'STYLE', 'HEAD', 'NOSCRIPT', 'TEMPLATE']);
  const test = el => {
    if (skip.has(el.tagName)) return false;
    const t = norm(el.textContent || '');
    return exact ? t === want : t.toLowerCase().includes(want);
  };
  const root = document.body || document.documentElement;
  if (!root) return null;
  const walker = document.createTreeWalker(root, NodeFilter.SHOW_ELEMENT);
  for (let el = walker.currentNode; el; el = walker.nextNode()) {
    if (test(el) && ![...el.children].some(test)) return el;
  }
  return null;
}"""

#: Run before a new document's own scripts: put a saved profile's local storage back for
#: this origin, once per tab (a marker in session storage), never over a value the page has.
RESTORE_STORAGE = """(() => { try {
  const saved = __SAVED__;
  const items = saved[location.origin];
  if (!items || sessionStorage.getItem("__rigd_profile_restored") !== null) return;
  for (const [k, v] of Object.entries(items)) {
    if (localStorage.getItem(k) === null) localStorage.setItem(k, v);
  }
  sessionStorage.setItem("__rigd_profile_restored", "1");
} catch (e) {} })();"""


# -- functions rigd calls in the page (BiDi's callFunction, WebDriver's execute) --------------

FIND = f"""(engine, body) => {{
  let el;
  try {{ el = ({RESOLVE})(engine, body); }} catch (e) {{ return {{invalid: true}}; }}
  return {{found: !!el}};
}}"""
POINT = f"""(engine, body) => {{
  let el;
  try {{ el = ({RESOLVE})(engine, body); }} catch (e) {{ return {{invalid: true}}; }}
  if (!el) return {{found: false}};
  el.scrollIntoView({{block: 'center', inline: 'center', behavior: 'instant'}});
  for (const r of el.getClientRects()) {{
    if (r.width * r.height > 0.5) return {{found: true, x: r.left + r.width / 2, y: r.top + r.height / 2}};
  }}
  return {{found: true}};
}}"""
FILL = f"""(engine, body, clear) => {{
  let el;
  try {{ el = ({RESOLVE})(engine, body); }} catch (e) {{ return 'invalid'; }}
  if (!el) return 'missing';
  el.scrollIntoView({{block: 'center', behavior: 'instant'}});
  const verdict = ({FILL_PREPARE}).call(el);
  if (verdict === 'ok' && clear) ({CLEAR}).call(el);
  return verdict;
}}"""
TITLE = f"() => document.title.substring(0, {TITLE_MAX_CHARS})"
PAGE_SIZE = """() => { const d = document.documentElement, b = document.body;
  return [Math.max(d ? d.scrollWidth : 0, b ? b.scrollWidth : 0, innerWidth),
          Math.max(d ? d.scrollHeight : 0, b ? b.scrollHeight : 0, innerHeight)]; }"""
STORAGE = """() => { const out = {}; try {
  for (let i = 0; i < localStorage.length && i < 10000; i++) {
    const k = localStorage.key(i); out[k] = localStorage.getItem(k); } } catch (e) {}
  return out; }"""
#: The DOM-derived outline: landmarks, headings, links, buttons, fields, images and text.
A11Y_OUTLINE = """(limit) => {
  const roles = {A: 'link', BUTTON: 'button', H1: 'heading', H2: 'heading', H3: 'heading', H4: 'heading',
    H5: 'heading', H6: 'heading', NAV: 'navigation', MAIN: 'main', HEADER: 'banner', FOOTER: 'contentinfo',
    ASIDE: 'complementary', FORM: 'form', IMG: 'img', SELECT: 'combobox', TEXTAREA: 'textbox', UL: 'list',
    OL: 'list', LI: 'listitem', TABLE: 'table', TR: 'row', TD: 'cell', TH: 'columnheader', LABEL: 'label',
    DIALOG: 'dialog', P: 'paragraph'};
  const inputRole = t => ({checkbox: 'checkbox', radio: 'radio', button: 'button', submit: 'button',
    reset: 'button', range: 'slider', search: 'searchbox'})[t] || 'textbox';
  const skip = new Set(['SCRIPT', 'STYLE', 'NOSCRIPT', 'TEMPLATE', 'HEAD']);
  const lines = []; let count = 0;
  const name = el => {
    const l = el.getAttribute('aria-label'); if (l) return l;
    const by = el.getAttribute('aria-labelledby');
    if (by) { const t = by.split(/\\s+/).map(i => document.getElementById(i)).filter(Boolean)
      .map(e => e.textContent).join(' '); if (t.trim()) return t; }
    if (el.tagName === 'IMG') return el.getAttribute('alt') || '';
    if (el.tagName === 'INPUT' || el.tagName === 'TEXTAREA' || el.tagName === 'SELECT') {
      if (el.labels && el.labels.length) return el.labels[0].textContent;
      return el.getAttribute('placeholder') || el.getAttribute('title') || '';
    }
    return el.textContent || '';
  };
  const walk = (el, depth) => {
    if (count >= limit || skip.has(el.tagName) || el.hidden) return;
    if (el.getAttribute('aria-hidden') === 'true') return;
    count++;
    let role = el.getAttribute('role') || (el.tagName === 'INPUT' ? inputRole(el.type) : roles[el.tagName]);
    if (role === 'link' && !el.hasAttribute('href')) role = undefined;
    let next = depth;
    if (role) {
      let text = name(el).replace(/\\s+/g, ' ').trim().slice(0, 200);
      let line = '  '.repeat(Math.min(depth, 64)) + role + (text ? ' ' + JSON.stringify(text) : '');
      if ((el.tagName === 'INPUT' || el.tagName === 'TEXTAREA') && el.type !== 'password' && el.value)
        line += ' = ' + JSON.stringify(String(el.value).slice(0, 200));
      if (el.type === 'checkbox' || el.type === 'radio') line += el.checked ? ' (checked)' : '';
      lines.push(line); next = depth + 1;
    } else if (el.children.length === 0) {
      const t = (el.textContent || '').replace(/\\s+/g, ' ').trim();
      if (t) lines.push('  '.repeat(Math.min(depth, 64)) + 'text ' + JSON.stringify(t.slice(0, 200)));
    }
    for (const c of el.children) walk(c, next);
  };
  if (document.body) walk(document.body, 0);
  return {count, text: lines.join('\\n')};
}"""



def origin_of(url: str) -> str | None:
    """``scheme://host[:port]`` of an http(s) URL (local storage is kept per origin)."""
    parts = urlsplit(url)
    if parts.scheme not in ("http", "https") or not parts.netloc or "@" in parts.netloc:
        return None
    return f"{parts.scheme}://{parts.netloc}".lower()


_ENGINES = ("css", "xpath", "text", "id", "data-testid")
_UNSUPPORTED = ("role", "nth", "visible", "internal:text", "internal:role", "internal:label")


def selector_engine(selector: str) -> tuple[str, str]:
    """(engine, body) of a Playwright selector: ``css=``, ``xpath=``, ``text=``, ``id=``,
    ``data-testid=``, a leading ``//`` (XPath) or quote (exact text), else CSS.

    Chains (``>>``) and the engines the driver does not implement are a field error naming them.
    """
    head, sep, body = selector.partition("=")
    if sep and head in _ENGINES:
        engine = head
    elif sep and head in _UNSUPPORTED:
        raise FieldError("action.selector", f"the {head}= engine is not supported by rigd's "
                                            "drivers yet; use css=, xpath=, text=, id= or data-testid=")
    elif selector.startswith(("//", "(//", "..")):
        engine, body = "xpath", selector
    elif selector.startswith(('"', "'")):
        engine, body = "text", selector
    else:
        engine, body = "css", selector
    if ">>" in body and engine in ("css", "text"):
        raise FieldError("action.selector", "chained selectors (>>) are not supported by rigd's "
                                            "drivers yet; give one selector")
    if not body:
        raise FieldError("action.selector", f"names the {engine} engine but no selector after '='")
    return engine, body


def check_point(viewport: Display, point: tuple[int, int], field: str) -> None:
    """A field error naming ``field`` unless ``point`` is inside ``viewport`` (CSS px)."""
    x, y = point
    if not (0 <= x < viewport.width and 0 <= y < viewport.height):
        raise FieldError(field, f"({x}, {y}) is outside the {viewport.width}x{viewport.height} viewport")


def scroll_xy(got: Any) -> tuple[int, int] | None:
    """The page's ``[scrollX, scrollY]`` answer as two integers, or None when it is not that."""
    if isinstance(got, list) and len(got) == 2 and all(
            isinstance(v, int | float) and not isinstance(v, bool) and math.isfinite(v) for v in got):
        return round(got[0]), round(got[1])
    return None


async def settled(read: Callable[[], Awaitable[T]]) -> T:
    """``read()`` again every 50 ms until it answers the same twice (a smooth scroll
    animates), for at most :data:`SCROLL_SETTLE_S`; the last answer."""
    last = await read()
    with trio.move_on_after(SCROLL_SETTLE_S):
        while True:
            await trio.sleep(0.05)
            now = await read()
            if now == last:
                break
            last = now
    return last


# -- answers of the page functions, read the same for every engine that calls them -------------

def element_centre(got: Any, engine: str, viewport: Display) -> tuple[int, int]:
    """:data:`POINT`'s answer as the element's centre in the viewport, or the field error saying why not."""
    if not isinstance(got, dict) or got.get("invalid"):
        raise FieldError("action.selector", "is not a valid " + ("XPath expression" if engine == "xpath"
                                                                  else f"{engine} selector"))
    if not got.get("found"):
        raise FieldError("action.selector", "matches no element on the page")
    x, y = got.get("x"), got.get("y")
    if not all(isinstance(v, int | float) and not isinstance(v, bool) and math.isfinite(v) for v in (x, y)):
        raise FieldError("action.selector", "matches an element that is not rendered (it has no box)")
    assert isinstance(x, int | float) and isinstance(y, int | float)
    px, py = math.floor(x), math.floor(y)
    if not (0 <= px < viewport.width and 0 <= py < viewport.height):
        raise FieldError("action.selector", f"matches an element whose centre ({px}, {py}) is outside "
                                            f"the {viewport.width}x{viewport.height} viewport")
    return px, py


def check_fill_verdict(verdict: Any, engine: str) -> None:
    """The field error for :data:`FILL`'s answer unless it is ``ok``."""
    if verdict == "invalid":
        raise FieldError("action.selector", f"is not a valid {engine} selector")
    if verdict == "missing":
        raise FieldError("action.selector", "matches no element on the page")
    if verdict == "disabled":
        raise FieldError("action.selector", "matches a field that is disabled or read-only")
    if verdict != "ok":
        raise FieldError("action.selector", f"matches an element that is {str(verdict)[:80]}; fill "
                                            "takes an input, textarea or contenteditable element")


#: Where the live view's frames go: a JPEG, its width and height.
FrameSink = Callable[[bytes, int, int], None]
#: At most this many stills a second for the live view of an engine without a screencast (RIGS.md §7).
POLL_FPS = 6

#: Where an engine's background service that cannot be switched off is sent (issue 28, item 5):
#: a closed port on the guest's own loopback (the discard port; nothing listens), so it fails at
#: once without a DNS lookup and leaves nothing in the audit log.
QUIET_URL = "http://127.0.0.1:9"


async def polled_frames(capture: Callable[..., Awaitable[tuple[bytes, int, int]]], sink: FrameSink, *,
                        max_w: int, max_h: int, quality: int) -> None:
    """Feed ``sink`` a still from ``capture`` at most :data:`POLL_FPS` times a second, until
    cancelled (for engines whose protocol says nothing when the page repaints)."""
    period = 1 / POLL_FPS
    while True:
        t0 = trio.current_time()
        data, iw, ih = await capture(max_w=max_w, max_h=max_h, quality=quality)
        sink(data, iw, ih)
        # A rate cap, not a wait for a condition: the engine says nothing when the page repaints.
        await trio.sleep(max(0.0, period - (trio.current_time() - t0)))


class PageDriver(Protocol):
    """One engine's driver of the rig's page, as :class:`rigd.backends.browser.BrowserDriver` uses it."""

    viewport: Display
    title_timeout_s: float
    pointer: tuple[int, int]
    button_down: bool

    async def perform(self, action: Action) -> dict[str, Any]: ...

    async def capture(self, *, max_w: int, max_h: int, quality: int = 75) -> tuple[bytes, int, int]:
        """A JPEG of the viewport now, scaled down to fit, and its size."""
        ...

    async def export_profile(self, previous: ProfileState | None = None) -> ProfileState: ...

    async def import_profile(self, state: ProfileState) -> list[str]: ...

    async def replay(self, steps: Sequence[Step], state: PointerState) -> PointerState:
        """A person's live-view input through the engine's input API; the pointer after it."""
        ...

    async def ended(self) -> str:
        """Return (why) once the page is gone: its session ended, its renderer or tab crashed."""
        ...

    #: Whether :meth:`drop` can drop files onto the page (an engine with a drag-and-drop input).
    takes_drops: bool

    async def drop(self, paths: list[str], point: tuple[int, int]) -> None:
        """Drop files already in the guest onto the page at ``point`` (drag enter, over, drop)."""
        ...

    #: The live view's lane: its ``source`` name and how its frames come.
    cast_lane: tuple[str, str]

    async def cast(self, sink: FrameSink, *, max_w: int, max_h: int, quality: int) -> None:
        """Feed the live view's frames to ``sink`` until cancelled (pushed by the engine when the
        page repaints, or asked for at most :data:`POLL_FPS` times a second)."""
        ...

    async def start_page_state(self, wait_s: float) -> object:
        """True once the first tab shows a loaded ``file:`` document (the rig's start page)
        within ``wait_s``; else what it showed last (its URL and ready state, or the error
        reading them)."""
        ...

    async def tabs(self) -> object:
        """The engine's tabs (type, URL) for a diagnostic; None where it cannot say."""
        ...


__all__ = [
    "A11Y_OUTLINE",
    "BOOT_VIEWPORT",
    "CONSOLE_KEEP",
    "EXTRACT_MAX_BYTES",
    "FILL",
    "FIND",
    "LOAD_TIMEOUT_S",
    "PAGE_SIZE",
    "POINT",
    "POLL_FPS",
    "STORAGE",
    "TITLE",
    "FrameSink",
    "PageDriver",
    "PageError",
    "jpeg_size",
    "origin_of",
    "polled_frames",
    "selector_engine",
    "text_json",
]
