"""Input planning: key maps, axis scaling, and how text is typed (spare keys bound to keysyms)."""

from __future__ import annotations

from typing import Any

import pytest

from rigd.protocols.input import (
    AXIS_MAX,
    CHAR_KEYS,
    KEYSYM_QCODES,
    REBIND_SETTLE_S,
    SPARE_KEYS,
    SPARE_KEYS_BY_INPUT,
    Bind,
    Keymap,
    Pause,
    Step,
    UnknownKey,
    Untypeable,
    axis,
    combo_events,
    keysym_of,
    plan_click,
    plan_combos,
    plan_drag,
    plan_hold,
    plan_scroll,
    plan_text,
    plan_typing,
    qcode_of,
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


def test_plain_text_is_typed_as_us_keys() -> None:
    plan = plan_typing("Ab!", chunk=16)
    assert keys(plan[0]) == [("shift", True), ("a", True), ("a", False), ("shift", False),
                             ("b", True), ("b", False),
                             ("shift", True), ("1", True), ("1", False), ("shift", False)]
    assert len([s for s in plan_typing("x" * 40, chunk=16) if not isinstance(s, Pause)]) == 3
    # By default a call carries at most 16 events (one virtio-input report fits the
    # guest's 64-buffer queue with room to spare) and calls are paced.
    shifted = '&*()_+{}|:"<>?~!@#$%^' * 3
    paced = plan_typing(shifted)
    calls = [s for s in paced if not isinstance(s, Pause)]
    assert max(len(c) for c in calls) <= 16 and sum(len(c) for c in calls) == 4 * len(shifted)
    assert all(isinstance(paced[i], Pause) for i in range(1, len(paced), 2))
    typed = plan_text("Ab!", Keymap(SPARE_KEYS))
    assert typed.steps == plan and typed.keymap_used is False and typed.keymap == Keymap(SPARE_KEYS)


def pressed(steps: list[Step]) -> list[str]:
    """The qcodes pressed, in order (Binds and Pauses skipped)."""
    return [e["data"]["key"]["data"] for s in steps if isinstance(s, list) for e in s
            if e["data"]["down"] and e["data"]["key"]["data"] != "shift"]


QCODE_OF_KEYCODE = {k.keycode: k.qcode for k in SPARE_KEYS}
US_CHAR_OF = {(q, shift): ch for ch, (q, shift) in CHAR_KEYS.items() if ch not in "\n\t"}


def guest_reads(steps: list[Step], keymap: Keymap | None = None) -> str:
    """What an X client reading every press with the map current at the time would see.

    It also checks the rule that keeps a lazy client from reading a press with
    a later binding: a Bind that takes a key from an earlier binding is
    preceded by the settle pause."""
    bound: dict[str, int] = {k.qcode: sym for k, sym in (keymap.bound if keymap else ())}
    out: list[str] = []
    for i, step in enumerate(steps):
        if isinstance(step, Bind):
            rebinds = {QCODE_OF_KEYCODE[code] for code, _sym in step.pairs} & set(bound)
            if rebinds:
                assert steps[i - 1] == Pause(REBIND_SETTLE_S), f"rebind without settle at {i}"
            bound.update({QCODE_OF_KEYCODE[code]: sym for code, sym in step.pairs})
            continue
        if isinstance(step, Pause):
            continue
        shift = False
        for event in step:
            q, down = event["data"]["key"]["data"], event["data"]["down"]
            if q == "shift":
                shift = down
            elif down and q in bound:
                sym = bound[q]
                out.append(chr(sym - 0x01000000 if sym > 0xFF else sym))
            elif down:
                out.append({"ret": "\n", "tab": "\t"}.get(q) or US_CHAR_OF[(q, shift)])
    return "".join(out)


def test_keysyms_latin1_is_the_code_point_else_unicode() -> None:
    assert keysym_of("é") == 0xE9 and keysym_of("\u00a0") == 0xA0 and keysym_of("ÿ") == 0xFF
    assert keysym_of("Ā") == 0x01000100 and keysym_of("世") == 0x01004E16
    assert keysym_of("😀") == 0x0101F600
    for ch in ("\x00", "\x07", "\x1b", "\x7f", "\x85", "\ud800"):
        assert keysym_of(ch) is None


def test_other_characters_are_bound_then_pressed_in_order() -> None:
    plan = plan_text("aé\n世\tb", Keymap(SPARE_KEYS))
    props, front = SPARE_KEYS[0], SPARE_KEYS[1]
    assert plan.steps[0] == Bind(((props.keycode, 0xE9), (front.keycode, 0x01004E16)), typed_before=0)
    assert (props.keycode, front.keycode) == (138, 140)
    assert pressed(plan.steps[1:]) == ["a", "props", "ret", "front", "tab", "b"]
    assert Pause(REBIND_SETTLE_S) not in plan.steps  # nothing was bound before: no settle
    assert plan.keymap_used is True
    assert guest_reads(plan.steps) == "aé\n世\tb"


def test_crlf_and_cr_are_one_return_each() -> None:
    assert pressed(plan_text("a\r\nb\rc\n", Keymap(SPARE_KEYS)).steps) == [
        "a", "ret", "b", "ret", "c", "ret"]


def test_bindings_are_reused_without_rebinding() -> None:
    first = plan_text("é", Keymap(SPARE_KEYS))
    again = plan_text("xéé", first.keymap)
    assert not any(isinstance(s, Bind) for s in again.steps) and Pause(REBIND_SETTLE_S) not in again.steps
    assert pressed(again.steps) == ["x", "props", "props"]
    assert guest_reads(again.steps, first.keymap) == "xéé"
    # A new character takes an unbound key while there is one; nothing is evicted.
    third = plan_text("ü", again.keymap)
    assert third.steps[0] == Bind(((SPARE_KEYS[1].keycode, 0xFC),))


def test_more_characters_than_the_pool_are_bound_in_batches() -> None:
    small = Keymap(SPARE_KEYS[:3])
    text = "世界和平 世"
    plan = plan_text(text, small)
    binds = [s for s in plan.steps if isinstance(s, Bind)]
    assert [len(b.pairs) for b in binds] == [3, 2]
    # The second batch waits, then gives 平 the key 世 had (the least recently
    # used) and the 世 after it the key 界 had: one Bind before any of its presses.
    assert binds[1].pairs == ((SPARE_KEYS[0].keycode, 0x01000000 + ord("平")),
                              (SPARE_KEYS[1].keycode, 0x01000000 + ord("世")))
    assert binds[1].typed_before == 3
    i = plan.steps.index(binds[1])
    assert plan.steps[i - 1] == Pause(REBIND_SETTLE_S)
    assert all(isinstance(s, list) for s in plan.steps[i + 1:])
    assert guest_reads(plan.steps) == text
    assert set(pressed(plan.steps)) == {k.qcode for k in SPARE_KEYS[:3]} | {"spc"}


def test_a_long_text_of_many_characters_reads_back_whole() -> None:
    text = "".join(chr(0x4E00 + i) + ("\n" if i % 7 == 0 else "") for i in range(60)) + "né€"
    plan = plan_text(text, Keymap(SPARE_KEYS))
    assert guest_reads(plan.steps) == text
    assert sum(isinstance(s, Bind) for s in plan.steps) == 5  # 62 distinct over 15 keys
    again = plan_text(text[-20:], plan.keymap)
    assert guest_reads(again.steps, plan.keymap) == text[-20:]


def test_the_least_recently_used_key_is_the_one_rebound() -> None:
    two = Keymap(SPARE_KEYS[:2])
    first = plan_text("世界", two)
    second = plan_text("世和", first.keymap)  # 世 is reused, so 界's key goes to 和
    assert [s for s in second.steps if isinstance(s, Bind)] == [
        Bind(((SPARE_KEYS[1].keycode, 0x01000000 + ord("和")),), typed_before=0)]
    assert second.steps[0] == Pause(REBIND_SETTLE_S)
    assert guest_reads(second.steps, first.keymap) == "世和"
    assert [k.qcode for k, _sym in second.keymap.bound] == [SPARE_KEYS[0].qcode, SPARE_KEYS[1].qcode]


def test_an_unsure_keymap_rebinds_after_the_settle() -> None:
    bound = plan_text("é", Keymap(SPARE_KEYS)).keymap
    plan = plan_text("é", bound.unsure())
    assert plan.steps[0] == Pause(REBIND_SETTLE_S) and isinstance(plan.steps[1], Bind)
    assert guest_reads(plan.steps) == "é"


def test_characters_no_key_types_are_refused_by_position() -> None:
    with pytest.raises(Untypeable) as info:
        plan_text("ok\x07é\x1b", Keymap(SPARE_KEYS))
    assert info.value.positions == (2, 4) and "\x07" not in str(info.value)
    with pytest.raises(Untypeable) as info:
        plan_text("née", Keymap(()))
    assert info.value.positions == (1,)
    assert plan_text("plain\n", Keymap(())).keymap_used is False


def test_keymap_reprs_keep_typed_keysyms_out() -> None:
    plan = plan_text("é", Keymap(SPARE_KEYS))
    assert "233" not in repr(plan.keymap) and "233" not in repr(plan.steps[0])


def test_the_spare_keys_are_distinct_unused_and_reachable() -> None:
    qcodes = [k.qcode for k in SPARE_KEYS]
    keycodes = [k.keycode for k in SPARE_KEYS]
    assert len(set(qcodes)) == len(qcodes) and len(set(keycodes)) == len(keycodes)
    assert all(8 <= c <= 255 for c in keycodes)
    used: set[Any] = {q for q, _shift in CHAR_KEYS.values()} | set(KEYSYM_QCODES.values())
    assert not set(qcodes) & used  # no key the US map or a named key already sends
    # QEMU's qcode -> Linux codes (keycodemapdb), X keycode = evdev + 8.
    assert {k.qcode: k.keycode for k in SPARE_KEYS} == {
        "props": 138, "front": 140, "lang1": 130, "lang2": 131, "henkan": 100, "muhenkan": 102,
        "katakanahiragana": 101, "hiragana": 99, "ro": 97, "yen": 132, "kp_comma": 129,
        "stop": 136, "help": 146, "find": 144, "open": 142}
    # usb-kbd reaches five of them, at the same X keycodes.
    usb = SPARE_KEYS_BY_INPUT["usb"]
    assert {k.qcode for k in usb} == {"ro", "katakanahiragana", "henkan", "muhenkan", "yen"}
    assert set(usb) <= set(SPARE_KEYS_BY_INPUT["virtio"])
    plan = plan_text("世界和平日月", Keymap(usb))
    assert sum(isinstance(s, Bind) for s in plan.steps) == 2
    assert set(pressed(plan.steps)) <= {k.qcode for k in usb}


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
