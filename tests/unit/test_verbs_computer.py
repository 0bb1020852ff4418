"""computer_use: every verb, valid, and each of its rules broken."""

from __future__ import annotations

from typing import Any

import pytest

from rigd.errors import FieldError
from rigd.model import Display
from rigd.verbs import (
    Action,
    ClipboardSelection,
    ComputerClipboardRead,
    ComputerClipboardWrite,
    ComputerCursorPosition,
    ComputerDoubleClick,
    ComputerHoldKey,
    ComputerKey,
    ComputerLeftClick,
    ComputerLeftClickDrag,
    ComputerLeftMouseDown,
    ComputerLeftMouseUp,
    ComputerMiddleClick,
    ComputerMouseMove,
    ComputerRightClick,
    ComputerScreenshot,
    ComputerScroll,
    ComputerSetDisplay,
    ComputerTripleClick,
    ComputerType,
    ComputerWait,
    KeyCombo,
    ParseContext,
    ScrollDirection,
    parse_action,
)

CTX = ParseContext(display=Display(1280, 800))


def ok(payload: dict[str, Any], ctx: ParseContext = CTX) -> Action:
    result = parse_action("computer_use", payload, ctx)
    assert isinstance(result, Action), result
    return result


def err(payload: dict[str, Any], ctx: ParseContext = CTX) -> FieldError:
    result = parse_action("computer_use", payload, ctx)
    assert isinstance(result, FieldError), result
    return result


@pytest.mark.parametrize(
    ("payload", "expected"),
    [
        ({"action": "screenshot"}, ComputerScreenshot()),
        ({"action": "cursor_position"}, ComputerCursorPosition()),
        ({"action": "mouse_move", "coordinate": [0, 0]}, ComputerMouseMove((0, 0))),
        ({"action": "mouse_move", "coordinate": [1279, 799]}, ComputerMouseMove((1279, 799))),
        ({"action": "left_click"}, ComputerLeftClick()),
        ({"action": "left_click", "coordinate": [10, 20]}, ComputerLeftClick((10, 20))),
        (
            {"action": "left_click", "coordinate": [10, 20], "text": "shift"},
            ComputerLeftClick((10, 20), ("Shift_L",)),
        ),
        (
            {"action": "right_click", "text": "ctrl+Shift"},
            ComputerRightClick(None, ("Control_L", "Shift_L")),
        ),
        ({"action": "middle_click", "coordinate": [1, 1]}, ComputerMiddleClick((1, 1))),
        ({"action": "double_click", "coordinate": [1, 1]}, ComputerDoubleClick((1, 1))),
        ({"action": "triple_click", "text": "super"}, ComputerTripleClick(None, ("Super_L",))),
        ({"action": "left_mouse_down"}, ComputerLeftMouseDown()),
        ({"action": "left_mouse_up"}, ComputerLeftMouseUp()),
        (
            {"action": "left_click_drag", "start_coordinate": [1, 2], "coordinate": [3, 4]},
            ComputerLeftClickDrag((1, 2), (3, 4)),
        ),
        (
            {"action": "scroll", "coordinate": [5, 5], "scroll_direction": "down",
             "scroll_amount": 3},
            ComputerScroll(ScrollDirection.DOWN, 3, (5, 5)),
        ),
        (
            {"action": "scroll", "scroll_direction": "left", "scroll_amount": 100,
             "text": "shift"},
            ComputerScroll(ScrollDirection.LEFT, 100, None, ("Shift_L",)),
        ),
        (
            {"action": "key", "text": "ctrl+s"},
            ComputerKey((KeyCombo(("Control_L",), "s"),)),
        ),
        (
            {"action": "key", "text": "alt+Tab Return KP_Enter F5 super"},
            ComputerKey((
                KeyCombo(("Alt_L",), "Tab"), KeyCombo((), "Return"), KeyCombo((), "KP_Enter"),
                KeyCombo((), "F5"), KeyCombo((), "Super_L"),
            )),
        ),
        (
            {"action": "hold_key", "text": "shift", "duration": 1.5},
            ComputerHoldKey(KeyCombo((), "Shift_L"), 1.5),
        ),
        ({"action": "hold_key", "text": "a", "duration": 0}, ComputerHoldKey(KeyCombo((), "a"), 0)),
        ({"action": "type", "text": "héllo\nwörld 🙂"}, ComputerType("héllo\nwörld 🙂")),
        ({"action": "wait", "duration": 60}, ComputerWait(60.0)),
        ({"action": "wait", "duration": 0.25}, ComputerWait(0.25)),
        ({"action": "set_display", "width": 640, "height": 480}, ComputerSetDisplay(640, 480)),
        ({"action": "set_display", "width": 2560, "height": 1600}, ComputerSetDisplay(2560, 1600)),
        ({"action": "clipboard_read"}, ComputerClipboardRead(ClipboardSelection.CLIPBOARD)),
        (
            {"action": "clipboard_read", "selection": "primary"},
            ComputerClipboardRead(ClipboardSelection.PRIMARY),
        ),
        (
            {"action": "clipboard_read", "selection": "xdnd"},
            ComputerClipboardRead(ClipboardSelection.XDND),
        ),
        ({"action": "clipboard_write", "text": "copied"}, ComputerClipboardWrite("copied")),
        ({"action": "clipboard_write", "text": ""}, ComputerClipboardWrite("")),
    ],
)
def test_valid(payload: dict[str, Any], expected: Action) -> None:
    assert ok(payload) == expected


def test_wait_duration_is_a_float() -> None:
    action = ok({"action": "wait", "duration": 2})
    assert isinstance(action, ComputerWait)
    assert type(action.duration_s) is float


def test_coordinates_unbounded_by_an_unknown_display() -> None:
    action = ok({"action": "mouse_move", "coordinate": [32767, 32767]}, ParseContext())
    assert action == ComputerMouseMove((32767, 32767))


INSIDE = "must be two integers inside the 1280x800 display"


@pytest.mark.parametrize(
    ("payload", "field", "fragment"),
    [
        # coordinates
        ({"action": "mouse_move"}, "action.coordinate", "is required; " + INSIDE),
        ({"action": "mouse_move", "coordinate": [1280, 0]}, "action.coordinate", INSIDE),
        ({"action": "mouse_move", "coordinate": [0, 800]}, "action.coordinate", INSIDE),
        ({"action": "mouse_move", "coordinate": [-1, 0]}, "action.coordinate", "(got [-1, 0])"),
        ({"action": "mouse_move", "coordinate": [True, 0]}, "action.coordinate", INSIDE),
        ({"action": "mouse_move", "coordinate": [1.0, 2.0]}, "action.coordinate", INSIDE),
        ({"action": "mouse_move", "coordinate": [1, 2, 3]}, "action.coordinate", INSIDE),
        ({"action": "mouse_move", "coordinate": [1]}, "action.coordinate", INSIDE),
        ({"action": "mouse_move", "coordinate": "1,2"}, "action.coordinate", INSIDE),
        ({"action": "mouse_move", "coordinate": {"x": 1, "y": 2}}, "action.coordinate", INSIDE),
        ({"action": "mouse_move", "coordinate": [10**400, 0]}, "action.coordinate", INSIDE),
        ({"action": "left_click", "coordinate": [2000, 5]}, "action.coordinate", "(got [2000, 5])"),
        (
            {"action": "left_click_drag", "coordinate": [3, 4]},
            "action.start_coordinate", "is required",
        ),
        (
            {"action": "left_click_drag", "start_coordinate": [1, 2]},
            "action.coordinate", "is required",
        ),
        (
            {"action": "left_click_drag", "start_coordinate": [1, 9999], "coordinate": [3, 4]},
            "action.start_coordinate", INSIDE,
        ),
        # modifiers held during a click
        ({"action": "left_click", "text": "cmd"}, "action.text", "did you mean super?"),
        ({"action": "left_click", "text": "a"}, "action.text", "is not an X11 modifier"),
        ({"action": "left_click", "text": "ctrl+"}, "action.text", "is not an X11 modifier"),
        ({"action": "left_click", "text": ""}, "action.text", "must not be empty"),
        ({"action": "left_click", "text": ["shift"]}, "action.text", "must be a string"),
        # pointer-position verbs
        (
            {"action": "left_mouse_down", "coordinate": [1, 2]},
            "action.coordinate", "move it first with mouse_move",
        ),
        (
            {"action": "left_mouse_up", "coordinate": [1, 2]},
            "action.coordinate", "move it first with mouse_move",
        ),
        # scroll
        (
            {"action": "scroll", "scroll_amount": 3},
            "action.scroll_direction", "is required: one of up, down, left, right",
        ),
        (
            {"action": "scroll", "scroll_direction": "sideways", "scroll_amount": 3},
            "action.scroll_direction", "must be one of up, down, left, right (got 'sideways')",
        ),
        (
            {"action": "scroll", "scroll_direction": "Up", "scroll_amount": 3},
            "action.scroll_direction", "must be one of",
        ),
        (
            {"action": "scroll", "scroll_direction": "up"},
            "action.scroll_amount", "is required: an integer between 1 and 100",
        ),
        (
            {"action": "scroll", "scroll_direction": "up", "scroll_amount": 0},
            "action.scroll_amount", "must be between 1 and 100 notches",
        ),
        (
            {"action": "scroll", "scroll_direction": "up", "scroll_amount": 101},
            "action.scroll_amount", "must be between 1 and 100 notches",
        ),
        (
            {"action": "scroll", "scroll_direction": "up", "scroll_amount": 2.5},
            "action.scroll_amount", "must be an integer",
        ),
        (
            {"action": "scroll", "scroll_direction": "up", "scroll_amount": True},
            "action.scroll_amount", "must be an integer",
        ),
        (
            {"action": "scroll", "scroll_direction": "up", "scroll_amount": 1,
             "coordinate": [1280, 1]},
            "action.coordinate", INSIDE,
        ),
        # key
        ({"action": "key"}, "action.text", "is required"),
        ({"action": "key", "text": ""}, "action.text", "must not be empty"),
        ({"action": "key", "text": "   "}, "action.text", "must name a key"),
        ({"action": "key", "text": "cmd+s"}, "action.text", "did you mean super?"),
        ({"action": "key", "text": "s+ctrl"}, "action.text", "'s' in 's+ctrl' is not an X11 modifier"),
        ({"action": "key", "text": "ctrl++"}, "action.text", "write the + key as plus"),
        ({"action": "key", "text": "Page-Down"}, "action.text", "is not an X11 keysym name"),
        ({"action": "key", "text": "ctrl+s" * 200}, "action.text", "at most 1024 characters"),
        ({"action": "key", "text": 5}, "action.text", "must be a string"),
        (
            {"action": "key", "text": "Return", "duration": 1},
            "action.duration", "use hold_key to hold",
        ),
        # hold_key
        ({"action": "hold_key", "duration": 1}, "action.text", "is required"),
        ({"action": "hold_key", "text": "a b", "duration": 1}, "action.text", "X11 keysym"),
        (
            {"action": "hold_key", "text": "shift"},
            "action.duration", "is required: a number between 0 and 60 seconds",
        ),
        (
            {"action": "hold_key", "text": "shift", "duration": 61},
            "action.duration", "must be between 0 and 60 seconds",
        ),
        (
            {"action": "hold_key", "text": "shift", "duration": -0.1},
            "action.duration", "must be between 0 and 60 seconds",
        ),
        # type
        ({"action": "type"}, "action.text", "is required"),
        ({"action": "type", "text": ""}, "action.text", "must not be empty"),
        ({"action": "type", "text": ["a", "b"]}, "action.text", "must be a string"),
        ({"action": "type", "text": "a\x00b"}, "action.text", "must not contain NUL"),
        ({"action": "type", "text": "a\ud800"}, "action.text", "unpaired surrogate"),
        ({"action": "type", "text": "x" * 65537}, "action.text", "at most 65536 bytes of UTF-8"),
        ({"action": "type", "text": "é" * 32769}, "action.text", "at most 65536 bytes"),
        (
            {"action": "type", "text": "hi", "coordinate": [1, 1]},
            "action.coordinate", "click the field first",
        ),
        # wait
        ({"action": "wait"}, "action.duration", "is required"),
        ({"action": "wait", "duration": 60.001}, "action.duration", "between 0 and 60 seconds"),
        ({"action": "wait", "duration": float("nan")}, "action.duration", "must be a finite number"),
        ({"action": "wait", "duration": float("inf")}, "action.duration", "must be a finite number"),
        ({"action": "wait", "duration": 10**400}, "action.duration", "between 0 and 60 seconds"),
        ({"action": "wait", "duration": True}, "action.duration", "must be a number"),
        ({"action": "wait", "duration": "5"}, "action.duration", "must be a number"),
        ({"action": "wait", "seconds": 5}, "action.seconds", "unknown field"),
        # set_display
        (
            {"action": "set_display", "width": 639, "height": 480},
            "action.width", "must be between 640 and 2560 pixels",
        ),
        (
            {"action": "set_display", "width": 2561, "height": 480},
            "action.width", "must be between 640 and 2560 pixels",
        ),
        (
            {"action": "set_display", "width": 800, "height": 479},
            "action.height", "must be between 480 and 1600 pixels",
        ),
        (
            {"action": "set_display", "width": 800, "height": 1601},
            "action.height", "must be between 480 and 1600 pixels",
        ),
        (
            {"action": "set_display", "width": 800.0, "height": 600},
            "action.width", "must be an integer",
        ),
        ({"action": "set_display", "width": 800}, "action.height", "is required"),
        # clipboard
        (
            {"action": "clipboard_read", "selection": "secondary"},
            "action.selection", "must be one of clipboard, primary, xdnd",
        ),
        ({"action": "clipboard_write"}, "action.text", "is required"),
        ({"action": "clipboard_write", "text": 5}, "action.text", "must be a string"),
        (
            {"action": "clipboard_write", "image": "iVBOR..."},
            "action.image", "travel on the file lane",
        ),
        (
            {"action": "clipboard_write", "text": "a", "files": ["/x"]},
            "action.files", "travel on the file lane",
        ),
    ],
)
def test_invalid(payload: dict[str, Any], field: str, fragment: str) -> None:
    e = err(payload)
    assert e.field == field
    assert fragment in e.reason


def test_secret_text_is_never_quoted_in_a_reason() -> None:
    e = err({"action": "type", "text": "hunter2" + "\x00"})
    assert "hunter2" not in e.message


def test_repr_hides_typed_text() -> None:
    assert "hunter2" not in repr(ok({"action": "type", "text": "hunter2"}))
    assert "hunter2" not in repr(ok({"action": "clipboard_write", "text": "hunter2"}))


def test_click_variants_say_which_button() -> None:
    for verb, button, clicks in [
        ("left_click", "left", 1), ("right_click", "right", 1), ("middle_click", "middle", 1),
        ("double_click", "left", 2), ("triple_click", "left", 3),
    ]:
        action = ok({"action": verb})
        assert (action.button, action.clicks) == (button, clicks)  # type: ignore[attr-defined]
