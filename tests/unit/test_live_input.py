"""The live view's input messages → QMP plans and audit shapes (pure)."""

from __future__ import annotations

from typing import Any

import pytest

from rigd.errors import FieldError
from rigd.protocols import input as qin
from rigd.server.live import plan_input

DISPLAY = (1280, 800)


def test_move_scales_to_the_absolute_axis() -> None:
    plan, shape = plan_input({"type": "move", "x": 1279, "y": 0}, DISPLAY)
    assert plan == [qin.move(1279, 0, *DISPLAY)]
    assert plan[0][0]["data"] == {"axis": "x", "value": qin.AXIS_MAX}
    assert shape == {"type": "move", "x": 1279, "y": 0}


@pytest.mark.parametrize(
    ("msg", "field"),
    [
        ({"type": "move", "x": 1280, "y": 0}, "x"),
        ({"type": "move", "x": 5, "y": -1}, "y"),
        ({"type": "move", "x": True, "y": 3}, "x"),
        ({"type": "button", "button": "back", "down": True}, "button"),
        ({"type": "button", "button": "left", "down": 1}, "down"),
        ({"type": "wheel", "direction": "sideways"}, "direction"),
        ({"type": "wheel", "direction": "up", "amount": 21}, "amount"),
        ({"type": "key", "key": "NoSuchKey", "down": True}, "key"),
        ({"type": "key", "key": "a"}, "down"),
        ({"type": "text", "text": ""}, "text"),
        ({"type": "text", "text": "x" * 4097}, "text"),
        ({"type": "text", "text": 7}, "text"),
        ({"type": "teleport"}, "type"),
        ({}, "type"),
    ],
)
def test_bad_messages_name_the_field(msg: dict[str, Any], field: str) -> None:
    with pytest.raises(FieldError) as info:
        plan_input(msg, DISPLAY)
    assert info.value.data["field"] == field


def test_button_with_a_point_moves_first() -> None:
    plan, shape = plan_input({"type": "button", "button": "right", "down": True, "x": 10, "y": 20}, DISPLAY)
    assert plan == [qin.move(10, 20, *DISPLAY), [qin.button("right", True)]]
    assert shape == {"type": "button", "button": "right", "down": True, "x": 10, "y": 20}


def test_key_events_are_audited_without_the_key() -> None:
    plan, shape = plan_input({"type": "key", "key": "Return", "down": False}, DISPLAY)
    assert plan == [[{"type": "key", "data": {"down": False, "key": {"type": "qcode", "data": "ret"}}}]]
    assert shape == {"type": "key", "down": False}


def test_text_is_typed_and_masked() -> None:
    plan, shape = plan_input({"type": "text", "text": "s3cret!"}, DISPLAY)
    assert plan == [qin.Text("s3cret!")]
    assert "s3cret" not in repr(shape) and "s3cret" not in repr(plan)
    assert shape["text"]["len"] == 7


def test_text_outside_the_us_map_is_left_to_the_machines_keymap() -> None:
    """No refusal here: the machine types it on spare keys its agent binds
    (tests/unit/test_desktop_machine.py), as the type verb does."""
    plan, shape = plan_input({"type": "text", "text": "héllo 世界\n"}, DISPLAY)
    assert plan == [qin.Text("héllo 世界\n")] and isinstance(plan[0], qin.Text)
    assert plan[0].field == "text"
    assert "héllo" not in repr(shape) and "世界" not in repr(plan)
    assert shape["type"] == "text" and shape["text"]["len"] == 9


def test_wheel_defaults_to_one_notch() -> None:
    plan, shape = plan_input({"type": "wheel", "direction": "down"}, DISPLAY)
    assert plan == qin.plan_scroll(None, DISPLAY, "down", 1)
    assert shape == {"type": "wheel", "direction": "down", "amount": 1}
