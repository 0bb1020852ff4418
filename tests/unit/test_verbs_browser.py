"""browser_use: every verb, valid, and each of its rules broken."""

from __future__ import annotations

from typing import Any

import pytest

from rigd.errors import FieldError
from rigd.model import Display
from rigd.verbs import (
    Action,
    BrowserClick,
    BrowserClipboardRead,
    BrowserClipboardWrite,
    BrowserDrag,
    BrowserExtract,
    BrowserFill,
    BrowserHistory,
    BrowserKey,
    BrowserLeftMouseDown,
    BrowserLeftMouseUp,
    BrowserMouseMove,
    BrowserNavigate,
    BrowserReload,
    BrowserScreenshot,
    BrowserScroll,
    BrowserSetViewport,
    BrowserStopLoading,
    BrowserType,
    BrowserWaitFor,
    ExtractKind,
    HistoryDirection,
    KeyCombo,
    ParseContext,
    ScrollDirection,
    parse_action,
)

CTX = ParseContext(display=Display(1280, 800))


def ok(payload: dict[str, Any]) -> Action:
    result = parse_action("browser_use", payload, CTX)
    assert isinstance(result, Action), result
    return result


def err(payload: dict[str, Any]) -> FieldError:
    result = parse_action("browser_use", payload, CTX)
    assert isinstance(result, FieldError), result
    return result


@pytest.mark.parametrize(
    ("payload", "expected"),
    [
        (
            {"action": "navigate", "url": "https://example.com/a?b=c#d"},
            BrowserNavigate("https://example.com/a?b=c#d"),
        ),
        (
            {"action": "navigate", "url": "http://app.test:8080/"},
            BrowserNavigate("http://app.test:8080/"),
        ),
        ({"action": "navigate", "url": "HTTP://[::1]/"}, BrowserNavigate("HTTP://[::1]/")),
        ({"action": "navigate", "url": "https://bücher.de/"}, BrowserNavigate("https://bücher.de/")),
        ({"action": "reload"}, BrowserReload(hard=False)),
        ({"action": "reload", "hard": True}, BrowserReload(hard=True)),
        ({"action": "stop_loading"}, BrowserStopLoading()),
        ({"action": "click", "selector": "button#go"}, BrowserClick(selector="button#go")),
        ({"action": "click", "coordinate": [10, 20]}, BrowserClick(coordinate=(10, 20))),
        (
            {"action": "fill", "selector": "input[name=q]", "text": "rigs"},
            BrowserFill("input[name=q]", "rigs"),
        ),
        ({"action": "fill", "selector": "#q", "text": ""}, BrowserFill("#q", "")),
        ({"action": "type", "text": "hello"}, BrowserType("hello")),
        ({"action": "key", "text": "Enter"}, BrowserKey(KeyCombo((), "Enter"))),
        ({"action": "key", "text": "ArrowLeft"}, BrowserKey(KeyCombo((), "ArrowLeft"))),
        ({"action": "key", "text": "Control+a"}, BrowserKey(KeyCombo(("Control",), "a"))),
        (
            {"action": "key", "text": "ControlOrMeta+Shift+KeyZ"},
            BrowserKey(KeyCombo(("ControlOrMeta", "Shift"), "KeyZ")),
        ),
        ({"action": "key", "text": "Shift++"}, BrowserKey(KeyCombo(("Shift",), "+"))),
        ({"action": "key", "text": "+"}, BrowserKey(KeyCombo((), "+"))),
        ({"action": "key", "text": "é"}, BrowserKey(KeyCombo((), "é"))),
        ({"action": "key", "text": "Control+Shift"}, BrowserKey(KeyCombo(("Control",), "Shift"))),
        (
            {"action": "scroll", "scroll_direction": "down", "scroll_amount": 5},
            BrowserScroll(ScrollDirection.DOWN, 5),
        ),
        (
            {"action": "scroll", "scroll_direction": "right", "scroll_amount": 1,
             "coordinate": [640, 400]},
            BrowserScroll(ScrollDirection.RIGHT, 1, (640, 400)),
        ),
        ({"action": "mouse_move", "coordinate": [1, 2]}, BrowserMouseMove((1, 2))),
        (
            {"action": "drag", "start_coordinate": [1, 2], "coordinate": [30, 40]},
            BrowserDrag((1, 2), (30, 40)),
        ),
        ({"action": "left_mouse_down"}, BrowserLeftMouseDown()),
        ({"action": "left_mouse_up"}, BrowserLeftMouseUp()),
        ({"action": "extract", "kind": "a11y"}, BrowserExtract(ExtractKind.A11Y)),
        ({"action": "extract", "kind": "dom"}, BrowserExtract(ExtractKind.DOM)),
        ({"action": "extract", "kind": "console"}, BrowserExtract(ExtractKind.CONSOLE)),
        ({"action": "screenshot"}, BrowserScreenshot(full_page=False)),
        ({"action": "screenshot", "full_page": True}, BrowserScreenshot(full_page=True)),
        ({"action": "screenshot", "marks": True}, BrowserScreenshot(marks=True)),
        ({"action": "click", "mark": 7}, BrowserClick(mark=7)),
        ({"action": "type", "text": "hi", "mark": 3}, BrowserType("hi", 3)),
        (
            {"action": "scroll", "scroll_direction": "down", "scroll_amount": 2, "mark": 4},
            BrowserScroll(ScrollDirection.DOWN, 2, mark=4),
        ),
        ({"action": "set_viewport", "width": 320, "height": 240}, BrowserSetViewport(320, 240)),
        ({"action": "set_viewport", "width": 2560, "height": 1600}, BrowserSetViewport(2560, 1600)),
        ({"action": "history", "direction": "back"}, BrowserHistory(HistoryDirection.BACK)),
        ({"action": "history", "direction": "forward"}, BrowserHistory(HistoryDirection.FORWARD)),
        ({"action": "wait_for", "selector": ".done"}, BrowserWaitFor(".done", 30.0)),
        ({"action": "wait_for", "selector": ".done", "timeoutS": 0.1}, BrowserWaitFor(".done", 0.1)),
        ({"action": "clipboard_read"}, BrowserClipboardRead()),
        ({"action": "clipboard_write", "text": "x"}, BrowserClipboardWrite("x")),
    ],
)
def test_valid(payload: dict[str, Any], expected: Action) -> None:
    assert ok(payload) == expected


CREDENTIALS = "must not carry credentials"
WEB = "must be an http:// or https:// URL"
INSIDE = "must be two integers inside the 1280x800 display"


@pytest.mark.parametrize(
    ("payload", "field", "fragment"),
    [
        # navigate
        ({"action": "navigate"}, "action.url", "is required: an http:// or https:// URL"),
        ({"action": "navigate", "url": 5}, "action.url", "must be a string"),
        ({"action": "navigate", "url": ""}, "action.url", "must not be empty"),
        ({"action": "navigate", "url": "file:///etc/passwd"}, "action.url", WEB),
        ({"action": "navigate", "url": "javascript:alert(1)"}, "action.url", WEB),
        ({"action": "navigate", "url": "ftp://x.org/"}, "action.url", "(got scheme 'ftp')"),
        ({"action": "navigate", "url": "example.com"}, "action.url", "with its scheme"),
        ({"action": "navigate", "url": "localhost:3000"}, "action.url", WEB),
        ({"action": "navigate", "url": "https://"}, "action.url", "must name a host"),
        ({"action": "navigate", "url": "http:/path"}, "action.url", "must name a host"),
        ({"action": "navigate", "url": "https://u:p@x.com/"}, "action.url", CREDENTIALS),
        ({"action": "navigate", "url": "https://token@x.com/"}, "action.url", CREDENTIALS),
        ({"action": "navigate", "url": "https://x.com/a b"}, "action.url", "percent-encode"),
        ({"action": "navigate", "url": "https://x.com/\n"}, "action.url", "control characters"),
        ({"action": "navigate", "url": "http://[::1/"}, "action.url", "is not a valid URL"),
        ({"action": "navigate", "url": "http://x.com:99999/"}, "action.url", "not a valid URL"),
        (
            {"action": "navigate", "url": "https://x.com/" + "a" * 9000},
            "action.url", "at most 8192 characters",
        ),
        # reload
        ({"action": "reload", "hard": "yes"}, "action.hard", "must be true or false"),
        ({"action": "reload", "hard": 1}, "action.hard", "must be true or false"),
        # click
        ({"action": "click"}, "action.selector", "give selector or coordinate"),
        (
            {"action": "click", "selector": "a", "coordinate": [1, 2]},
            "action.coordinate", "not both",
        ),
        ({"action": "click", "selector": ""}, "action.selector", "must not be empty"),
        ({"action": "click", "selector": ["a"]}, "action.selector", "must be a string"),
        ({"action": "click", "coordinate": [1280, 1]}, "action.coordinate", INSIDE),
        (
            {"action": "click", "selector": "a" * 5000},
            "action.selector", "at most 4096 characters",
        ),
        # fill
        ({"action": "fill", "text": "x"}, "action.selector", "is required"),
        ({"action": "fill", "selector": "#q"}, "action.text", "is required"),
        ({"action": "fill", "selector": "#q", "text": 3}, "action.text", "must be a string"),
        # type
        ({"action": "type", "text": ""}, "action.text", "must not be empty"),
        ({"action": "type", "text": "x", "selector": "#q"}, "action.selector", "use fill"),
        # key
        ({"action": "key", "text": "enter"}, "action.text", "(did you mean Enter?)"),
        ({"action": "key", "text": "Ctrl+a"}, "action.text", "(did you mean Control?)"),
        ({"action": "key", "text": "a+b"}, "action.text", "'a' in 'a+b' is not a modifier"),
        ({"action": "key", "text": "Control+"}, "action.text", "is not a DOM key name"),
        ({"action": "key", "text": "Return"}, "action.text", "(did you mean Enter?)"),
        ({"action": "key", "text": "ab"}, "action.text", "is not a DOM key name"),
        ({"action": "key", "key": "Enter"}, "action.key", "the key combo goes in text"),
        # scroll
        (
            {"action": "scroll", "deltaY": 100},
            "action.deltaY", "scroll takes scroll_direction and scroll_amount",
        ),
        (
            {"action": "scroll", "scroll_direction": "down", "scroll_amount": 0},
            "action.scroll_amount", "between 1 and 100",
        ),
        ({"action": "scroll", "scroll_amount": 1}, "action.scroll_direction", "is required"),
        # pointer
        ({"action": "mouse_move"}, "action.coordinate", "is required"),
        ({"action": "drag", "coordinate": [1, 2]}, "action.start_coordinate", "is required"),
        (
            {"action": "drag", "start_coordinate": [1, 2], "coordinate": [1, 800]},
            "action.coordinate", INSIDE,
        ),
        ({"action": "left_mouse_down", "coordinate": [1, 2]}, "action.coordinate", "mouse_move"),
        # extract / screenshot / viewport / history
        ({"action": "extract"}, "action.kind", "is required: one of a11y, dom, console"),
        ({"action": "extract", "kind": "html"}, "action.kind", "must be one of a11y, dom, console"),
        ({"action": "screenshot", "full_page": "true"}, "action.full_page", "true or false"),
        ({"action": "screenshot", "fullPage": True}, "action.fullPage", "the field is full_page"),
        ({"action": "screenshot", "marks": "yes"}, "action.marks", "true or false"),
        ({"action": "screenshot", "marks": True, "full_page": True}, "action.marks", "viewport's still"),
        # marks
        ({"action": "click", "mark": 0}, "action.mark", "between 1 and"),
        ({"action": "click", "mark": 1.5}, "action.mark", "integer"),
        ({"action": "click", "mark": True}, "action.mark", "integer"),
        ({"action": "click", "mark": 2**31}, "action.mark", "between 1 and"),
        ({"action": "click", "mark": 1, "coordinate": [1, 2]}, "action.mark", "not both coordinate and mark"),
        ({"action": "click", "mark": 1, "selector": "a"}, "action.mark", "not both selector and mark"),
        (
            {"action": "scroll", "scroll_direction": "down", "scroll_amount": 1, "mark": 1,
             "coordinate": [1, 2]},
            "action.mark", "coordinate or mark, not both",
        ),
        ({"action": "type", "text": "x", "mark": "1"}, "action.mark", "integer"),
        (
            {"action": "set_viewport", "width": 319, "height": 240},
            "action.width", "must be between 320 and 2560 pixels",
        ),
        (
            {"action": "set_viewport", "width": 320, "height": 239},
            "action.height", "must be between 240 and 1600 pixels",
        ),
        (
            {"action": "set_viewport", "width": 2561, "height": 240},
            "action.width", "between 320 and 2560",
        ),
        (
            {"action": "set_viewport", "width": 320, "height": 1601},
            "action.height", "between 240 and 1600",
        ),
        ({"action": "history"}, "action.direction", "is required: one of back, forward"),
        ({"action": "history", "direction": "up"}, "action.direction", "one of back, forward"),
        # wait_for
        ({"action": "wait_for"}, "action.selector", "is required"),
        (
            {"action": "wait_for", "selector": "a", "timeoutS": 0.05},
            "action.timeoutS", "must be between 0.1 and 30 seconds",
        ),
        (
            {"action": "wait_for", "selector": "a", "timeoutS": 31},
            "action.timeoutS", "must be between 0.1 and 30 seconds",
        ),
        # clipboard
        (
            {"action": "clipboard_read", "selection": "clipboard"},
            "action.selection", "a browser has a single clipboard",
        ),
        ({"action": "clipboard_write"}, "action.text", "is required"),
        ({"action": "clipboard_write", "text": "x", "image": "..."}, "action.image", "text only"),
    ],
)
def test_invalid(payload: dict[str, Any], field: str, fragment: str) -> None:
    e = err(payload)
    assert e.field == field
    assert fragment in e.reason


def test_fill_text_is_not_in_repr() -> None:
    assert "s3cret" not in repr(ok({"action": "fill", "selector": "#pw", "text": "s3cret"}))
