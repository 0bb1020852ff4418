"""browser_use: the headless browser verbs (RIGS.md §4), named as in
Playwright where RIGS.md is silent, with the pointer verbs shaped like
computer_use's so one habit serves both tools.

- ``navigate``: ``url``, http:// or https:// with a host, at most 8192
  characters, no spaces or control characters, and **no credentials**
  (``user:pass@``): action arguments go to the audit log, and saved logins
  exist for signing in.
- ``reload``: optional ``hard`` (bool, default false). Firefox and WebKit do
  a normal reload (RIGS.md §2); that is the backend's to report.
- ``stop_loading``: no fields.
- ``click``: exactly one of ``selector`` (a non-empty string in Playwright's
  selector syntax, CSS by default), ``coordinate`` or ``mark`` (an id drawn on
  the newest marked screenshot; a disabled target is waited for up to 45 s).
- ``fill``: ``selector`` and ``text``; the text may be empty, which clears
  the field as Playwright's ``fill('')`` does.
- ``type``: ``text``, non-empty, at most 64 KiB of UTF-8, inserted at the
  caret; with ``mark``, the mark is clicked first (for the focus).
- ``key``: ``text``, one Playwright combo (``Enter``, ``ArrowLeft``,
  ``Control+a``).
- ``scroll``: ``scroll_direction`` and ``scroll_amount`` (1-100 notches),
  optional ``coordinate`` or ``mark``. This computer_use shape was picked over
  Playwright's ``deltaX``/``deltaY`` so one habit serves both tools; the
  backend turns a notch into Chromium's 100 CSS px wheel tick and scrolls at
  the pointer when no coordinate is given.
- ``mouse_move``: ``coordinate``.
- ``drag``: ``start_coordinate`` and ``coordinate`` (the end), as
  computer_use's ``left_click_drag``.
- ``left_mouse_down``, ``left_mouse_up``: no fields; at the pointer, as
  Playwright's ``mouse.down()``.
- ``extract`` ○: ``kind``, one of a11y, dom, console. Required: RIGS.md
  names no default.
- ``screenshot`` ○: optional ``full_page`` (bool, default false) or ``marks``
  (bool, default false: numbered boxes on the viewport's still and their
  list, rigd.marks); not both.
- ``set_viewport``: integers ``width`` 320-2560 and ``height`` 240-1600.
- ``history``: ``direction``, back or forward.
- ``wait_for`` ○: ``selector``; optional ``timeoutS`` 0.1-30, default 30
  (Playwright's).
- ``clipboard_read`` ○: no fields; a browser has one clipboard, so a
  ``selection`` is refused saying so.
- ``clipboard_write``: ``text`` only; it may be empty.
- ``login``: ``site`` (an ``https://`` origin) and ``account``: fill that saved login
  (rigd.rigs.logins) into the page's form, only when the page's origin is ``site``; a
  ``password`` field is refused (agents never send or see one).

Coordinates are CSS pixels of the viewport, inside ``ctx.display``. Audit:
``type``, ``fill`` and ``clipboard_write`` text is masked; a URL's userinfo
is masked.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from urllib.parse import urlsplit

from rigd.errors import FieldError
from rigd.verbs._args import Args, VerbSpec, no_fields, table
from rigd.verbs.base import (
    SCROLL_AMOUNT_MAX,
    SCROLL_AMOUNT_MIN,
    SELECTOR_MAX_CHARS,
    VIEWPORT_MAX,
    VIEWPORT_MIN,
    WAIT_FOR_DEFAULT_S,
    WAIT_FOR_MAX_S,
    WAIT_FOR_MIN_S,
    BrowserAction,
    ExtractKind,
    HistoryDirection,
    Point,
    ScrollDirection,
)
from rigd.verbs.keys import KeyCombo, parse_dom_combo
from rigd.verbs.masking import keep_if, keep_url, mask


@dataclass(frozen=True, slots=True)
class BrowserNavigate(BrowserAction):
    verb = "navigate"
    url: str


@dataclass(frozen=True, slots=True)
class BrowserReload(BrowserAction):
    verb = "reload"
    hard: bool = False


@dataclass(frozen=True, slots=True)
class BrowserStopLoading(BrowserAction):
    verb = "stop_loading"


@dataclass(frozen=True, slots=True)
class BrowserClick(BrowserAction):
    """Exactly one of ``selector``, ``coordinate`` and ``mark`` is set."""

    verb = "click"
    selector: str | None = None
    coordinate: Point | None = None
    mark: int | None = None


@dataclass(frozen=True, slots=True)
class BrowserFill(BrowserAction):
    verb = "fill"
    selector: str
    text: str = field(repr=False)


@dataclass(frozen=True, slots=True)
class BrowserType(BrowserAction):
    verb = "type"
    text: str = field(repr=False)
    #: Type at this mark (clicked first for the focus) instead of where the focus is.
    mark: int | None = None


@dataclass(frozen=True, slots=True)
class BrowserKey(BrowserAction):
    verb = "key"
    combo: KeyCombo


@dataclass(frozen=True, slots=True)
class BrowserScroll(BrowserAction):
    verb = "scroll"
    direction: ScrollDirection
    amount: int
    coordinate: Point | None = None
    mark: int | None = None


@dataclass(frozen=True, slots=True)
class BrowserMouseMove(BrowserAction):
    verb = "mouse_move"
    coordinate: Point


@dataclass(frozen=True, slots=True)
class BrowserDrag(BrowserAction):
    verb = "drag"
    start: Point
    end: Point


@dataclass(frozen=True, slots=True)
class BrowserLeftMouseDown(BrowserAction):
    verb = "left_mouse_down"


@dataclass(frozen=True, slots=True)
class BrowserLeftMouseUp(BrowserAction):
    verb = "left_mouse_up"


@dataclass(frozen=True, slots=True)
class BrowserExtract(BrowserAction):
    verb = "extract"
    observation = True
    kind: ExtractKind


@dataclass(frozen=True, slots=True)
class BrowserScreenshot(BrowserAction):
    verb = "screenshot"
    observation = True
    full_page: bool = False
    #: Numbered boxes on the elements a person could act on, and their list (rigd.marks).
    marks: bool = False


@dataclass(frozen=True, slots=True)
class BrowserSetViewport(BrowserAction):
    verb = "set_viewport"
    width: int
    height: int


@dataclass(frozen=True, slots=True)
class BrowserHistory(BrowserAction):
    verb = "history"
    direction: HistoryDirection


@dataclass(frozen=True, slots=True)
class BrowserWaitFor(BrowserAction):
    verb = "wait_for"
    observation = True
    selector: str
    timeout_s: float = WAIT_FOR_DEFAULT_S


@dataclass(frozen=True, slots=True)
class BrowserLogin(BrowserAction):
    """Fill a saved login (issue 30) into the page's login form. ``password`` is never parsed
    from the request: the server looks it up (rigd.rigs.logins) before the driver runs."""

    verb = "login"
    site: str
    account: str
    password: str | None = field(default=None, repr=False, compare=False)


@dataclass(frozen=True, slots=True)
class BrowserClipboardRead(BrowserAction):
    verb = "clipboard_read"
    observation = True


@dataclass(frozen=True, slots=True)
class BrowserClipboardWrite(BrowserAction):
    verb = "clipboard_write"
    text: str = field(repr=False)


ACCOUNT_MAX = 256


def parse_site(raw: object, name: str = "site") -> str:
    """An ``https://host[:port]`` origin, lower-cased; anything else is a field error."""
    if not isinstance(raw, str) or not raw or len(raw) > 300:
        raise FieldError(name, "must be an https:// origin, e.g. https://accounts.example.com")
    parts = urlsplit(raw.strip())
    if parts.scheme.lower() != "https":
        raise FieldError(name, f"must be an https:// origin: logins are filled only into HTTPS pages, "
                               f"not {parts.scheme or 'a bare host'}")
    if not parts.hostname or "@" in parts.netloc or parts.query or parts.fragment \
            or parts.path not in ("", "/"):
        raise FieldError(name, "must be an origin only (https://host or https://host:port), with no "
                               "path, query or credentials")
    try:
        port = parts.port
    except ValueError:
        raise FieldError(name, "has a port that is not a number from 1 to 65535") from None
    host = parts.hostname.lower()
    return f"https://{host}" + (f":{port}" if port not in (None, 443) else "")


def parse_account(raw: object, name: str = "account") -> str:
    if not isinstance(raw, str) or not 1 <= len(raw) <= ACCOUNT_MAX \
            or any(ord(c) < 32 or ord(c) == 127 for c in raw):
        raise FieldError(name, f"must be 1-{ACCOUNT_MAX} printable characters (a user name or address)")
    return raw


def _selector(a: Args) -> str:
    return a.string(
        "selector", required_hint="a Playwright selector, e.g. button#submit or text=Sign in",
        max_chars=SELECTOR_MAX_CHARS,
    )


def _click(a: Args) -> BrowserClick:
    given = [name for name in ("selector", "coordinate", "mark") if a.has(name)]
    if len(given) > 1:
        raise a.error(given[1], f"give one of selector, coordinate and mark, not both {given[0]} and "
                                f"{given[1]}")
    if not given:
        raise a.error("selector", "is required: give selector or coordinate (or a mark from a marked "
                                  "screenshot)")
    if given[0] == "selector":
        return BrowserClick(selector=_selector(a))
    if given[0] == "mark":
        return BrowserClick(mark=a.opt_mark())
    return BrowserClick(coordinate=a.coordinate("coordinate"))


def _scroll(a: Args) -> BrowserScroll:
    return BrowserScroll(
        direction=a.choice("scroll_direction", ScrollDirection),
        amount=a.integer("scroll_amount", SCROLL_AMOUNT_MIN, SCROLL_AMOUNT_MAX, unit="notches"),
        mark=a.opt_mark(),
        coordinate=a.opt_coordinate("coordinate"),
    )


def _screenshot(a: Args) -> BrowserScreenshot:
    full_page, marks = a.boolean("full_page", False), a.boolean("marks", False)
    if full_page and marks:
        raise a.error("marks", "marks are drawn on the viewport's still: take full_page without marks")
    return BrowserScreenshot(full_page, marks)


_AT_POINTER = "it acts at the pointer's current position; move it first with mouse_move"
_DELTAS = "scroll takes scroll_direction and scroll_amount (notches), as computer_use does"
_TEXT_ONLY = (
    "clipboard_write takes text only; files travel on the file lane (POST /rig/files/<rigId>)"
)

VERBS = table(
    VerbSpec(
        BrowserNavigate, ("url",), lambda a: BrowserNavigate(a.url("url", web_only=True)),
        audit={"url": keep_url},
    ),
    VerbSpec(BrowserReload, ("hard",), lambda a: BrowserReload(a.boolean("hard", False))),
    VerbSpec(BrowserStopLoading, (), no_fields(BrowserStopLoading)),
    VerbSpec(BrowserClick, ("selector", "coordinate", "mark"), _click),
    VerbSpec(
        BrowserFill, ("selector", "text"),
        lambda a: BrowserFill(_selector(a), a.text("text", allow_empty=True)),
        audit={"text": mask},
    ),
    VerbSpec(
        BrowserType, ("text", "mark"), lambda a: BrowserType(a.text("text"), a.opt_mark()),
        refused={"selector": "type inserts at the caret; to set a field's value use fill"},
        audit={"text": mask},
    ),
    VerbSpec(
        BrowserKey, ("text",), lambda a: BrowserKey(a.check("text", parse_dom_combo)),
        refused={"key": 'the key combo goes in text, e.g. {"action": "key", "text": "Enter"}'},
        audit={"text": keep_if(parse_dom_combo)},
    ),
    VerbSpec(
        BrowserScroll, ("coordinate", "mark", "scroll_direction", "scroll_amount"), _scroll,
        refused={"deltaX": _DELTAS, "deltaY": _DELTAS, "direction": _DELTAS, "amount": _DELTAS},
    ),
    VerbSpec(
        BrowserMouseMove, ("coordinate",),
        lambda a: BrowserMouseMove(a.coordinate("coordinate")),
    ),
    VerbSpec(
        BrowserDrag, ("start_coordinate", "coordinate"),
        lambda a: BrowserDrag(
            start=a.coordinate("start_coordinate"), end=a.coordinate("coordinate")
        ),
    ),
    VerbSpec(
        BrowserLeftMouseDown, (), no_fields(BrowserLeftMouseDown),
        refused={"coordinate": _AT_POINTER},
    ),
    VerbSpec(
        BrowserLeftMouseUp, (), no_fields(BrowserLeftMouseUp),
        refused={"coordinate": _AT_POINTER},
    ),
    VerbSpec(BrowserExtract, ("kind",), lambda a: BrowserExtract(a.choice("kind", ExtractKind))),
    VerbSpec(
        BrowserScreenshot, ("full_page", "marks"), _screenshot,
        refused={"fullPage": "the field is full_page"},
    ),
    VerbSpec(
        BrowserSetViewport, ("width", "height"),
        lambda a: BrowserSetViewport(
            width=a.integer("width", VIEWPORT_MIN.width, VIEWPORT_MAX.width, unit="pixels"),
            height=a.integer("height", VIEWPORT_MIN.height, VIEWPORT_MAX.height, unit="pixels"),
        ),
    ),
    VerbSpec(
        BrowserHistory, ("direction",),
        lambda a: BrowserHistory(a.choice("direction", HistoryDirection)),
    ),
    VerbSpec(
        BrowserWaitFor, ("selector", "timeoutS"),
        lambda a: BrowserWaitFor(
            _selector(a),
            a.number("timeoutS", WAIT_FOR_MIN_S, WAIT_FOR_MAX_S, default=WAIT_FOR_DEFAULT_S),
        ),
    ),
    VerbSpec(
        BrowserClipboardRead, (), no_fields(BrowserClipboardRead),
        refused={"selection": "a browser has a single clipboard, so it takes no selection"},
    ),
    VerbSpec(
        BrowserClipboardWrite, ("text",),
        lambda a: BrowserClipboardWrite(a.text("text", allow_empty=True)),
        refused={name: _TEXT_ONLY for name in ("image", "images", "files", "file", "path", "data")},
        audit={"text": mask},
    ),
    VerbSpec(
        BrowserLogin, ("site", "account"),
        lambda a: BrowserLogin(parse_site(a.get("site"), "action.site"),
                               parse_account(a.get("account"), "action.account")),
        refused={"password": "the password is never sent by an agent: a person saves it with login.save, "
                             "and login fills it"},
    ),
)
