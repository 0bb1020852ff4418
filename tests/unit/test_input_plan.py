"""Input planning: key maps, axis scaling, and how text is split for typing."""

from __future__ import annotations

import pytest

from rigd.protocols.input import (
    AXIS_MAX,
    Pause,
    TextRun,
    UnknownKey,
    axis,
    combo_events,
    plan_click,
    plan_combos,
    plan_drag,
    plan_hold,
    plan_scroll,
    plan_typing,
    qcode_of,
    split_text,
)
from rigd.verbs.keys import KeyCombo


def keys(events: list[dict]) -> list[tuple[str, bool]]:  # type: ignore[type-arg]
    return [(e["data"]["key"]["data"], e["data"]["down"]) for e in events]


def test_modifiers_pressed_in_order_released_in_reverse() -> None:
    press, release = combo_events(KeyCombo(("Control_L", "Shift_L"), "t"))
    assert keys(press) == [("ctrl", True), ("shift", True), ("t", True)]
    assert keys(release) == [("t", False), ("shift", False), ("ctrl", False)]


def test_named_keys_and_shifted_characters() -> None:
    assert qcode_of("Return") == ("ret", False)
    assert qcode_of("KP_Enter") == ("kp_enter", False)
    assert qcode_of("F5") == ("f5", False)
    assert qcode_of("Super_L") == ("meta_l", False)
    assert qcode_of("A") == ("a", True)
    assert qcode_of("?") == ("slash", True)
    press, _ = combo_events(KeyCombo(("Alt_L",), "Tab"))
    assert keys(press) == [("alt", True), ("tab", True)]
    press, _ = combo_events(KeyCombo(("Control_L",), "A"))
    assert keys(press) == [("ctrl", True), ("shift", True), ("a", True)]
    with pytest.raises(UnknownKey, match="XF86Eject"):
        qcode_of("XF86Eject")


def test_sequences_and_holds_have_pauses() -> None:
    plan = plan_combos([KeyCombo((), "a"), KeyCombo(("Control_L",), "c")])
    assert isinstance(plan[2], Pause) and len(plan) == 5
    hold = plan_hold(KeyCombo((), "Shift_L"), 2.5)
    assert hold[1] == Pause(2.5)


def test_axis_scaling_rounds_up_and_hits_both_edges() -> None:
    assert axis(0, 1280) == 0
    assert axis(1279, 1280) == AXIS_MAX
    assert axis(640, 1280) == 16397  # ceil(640 * 32767 / 1279)
    # Every pixel maps back to itself when the guest divides by the axis.
    for x in range(0, 1920, 7):
        assert round(axis(x, 1920) * 1919 / AXIS_MAX) == x


def test_text_splits_into_typeable_and_pasted_runs() -> None:
    assert split_text("héllo wörld 世界") == [
        TextRun("h", True), TextRun("é", False), TextRun("llo w", True), TextRun("ö", False),
        TextRun("rld ", True), TextRun("世界", False)]
    plan = plan_typing("Ab!", chunk=16)
    assert keys(plan[0]) == [("shift", True), ("a", True), ("a", False), ("shift", False),
                             ("b", True), ("b", False),
                             ("shift", True), ("1", True), ("1", False), ("shift", False)]
    assert len(plan_typing("x" * 40, chunk=16)) == 3


def test_clicks_drags_and_scrolls() -> None:
    plan = plan_click((10, 20), (1280, 800), button_name="left", clicks=2, modifiers=("Shift_L",))
    kinds = [type(s).__name__ if isinstance(s, Pause) else s[0]["type"] for s in plan]
    assert kinds == ["abs", "key", "Pause", "btn", "btn", "Pause", "btn", "btn", "Pause", "key"]
    drag = plan_drag((0, 0), (100, 100), (1280, 800), steps_between=4)
    assert drag[1][0]["data"] == {"down": True, "button": "left"}  # type: ignore[index]
    assert drag[-1][0]["data"] == {"down": False, "button": "left"}  # type: ignore[index]
    scroll = plan_scroll(None, (1280, 800), "down", 3)
    assert [s[0]["data"]["button"] for s in scroll] == ["wheel-down"] * 6  # type: ignore[index]


def test_sideways_scroll_is_shift_wheel_without_a_horizontal_wheel() -> None:
    left = plan_scroll((5, 5), (1280, 800), "left", 2)
    assert left[1] == [{"type": "key", "data": {"down": True, "key": {"type": "qcode", "data": "shift"}}}]
    assert isinstance(left[2], Pause) and isinstance(left[-2], Pause)  # the modifier settles
    assert [s[0]["data"]["button"] for s in left[3:-2]] == ["wheel-up"] * 4  # type: ignore[index]
    assert left[-1][0]["data"]["down"] is False  # type: ignore[index]
    held = plan_scroll(None, (1280, 800), "right", 1, ["Shift_L"])
    assert sum(1 for s in held if not isinstance(s, Pause) for e in s if e["type"] == "key") == 2
    native = plan_scroll(None, (1280, 800), "right", 1, hwheel=True)
    assert [s[0]["data"]["button"] for s in native] == ["wheel-right"] * 2  # type: ignore[index]
