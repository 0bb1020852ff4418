"""Keys, text and live-view input planned as WebDriver BiDi actions for Firefox (pure)."""

from __future__ import annotations

from typing import Any

import pytest

from rigd.browser.bidi_input import (
    WEBDRIVER_KEYS,
    Command,
    PointerState,
    Sleep,
    plan_bidi,
    press_actions,
    text_actions,
)
from rigd.errors import FieldError
from rigd.protocols import input as qin
from rigd.server.live import plan_input
from rigd.verbs.keys import DOM_KEYS, KeyCombo, parse_dom_combo

VIEW = (1280, 800)
CTRL, SHIFT, ENTER, TAB = "\ue009", "\ue008", "\ue006", "\ue004"


def _down(v: str) -> dict[str, Any]:
    return {"type": "keyDown", "value": v}


def _up(v: str) -> dict[str, Any]:
    return {"type": "keyUp", "value": v}


def _typed(*values: str) -> list[dict[str, Any]]:
    return [a for v in values for a in (_down(v), _up(v))]


def _plan(*msgs: dict[str, object], state: PointerState | None = None) -> tuple[list[Command], PointerState]:
    steps: list[qin.Step] = []
    for msg in msgs:
        steps += plan_input(msg, VIEW)[0]
    return plan_bidi(steps, VIEW, state or PointerState())


def _key(name: str, down: bool) -> dict[str, object]:
    return {"type": "key", "key": name, "down": down}


def _pointer(*actions: dict[str, Any]) -> list[dict[str, Any]]:
    return [{"type": "pointer", "id": "rigd-mouse", "parameters": {"pointerType": "mouse"},
             "actions": list(actions)}]


def _keyboard(*actions: dict[str, Any]) -> list[dict[str, Any]]:
    return [{"type": "key", "id": "rigd-keyboard", "actions": list(actions)}]


def _wheel(*actions: dict[str, Any]) -> list[dict[str, Any]]:
    return [{"type": "wheel", "id": "rigd-wheel", "actions": list(actions)}]


# -- key combos ---------------------------------------------------------------------------


def test_a_combo_holds_its_modifiers_around_the_key() -> None:
    assert press_actions(parse_dom_combo("Control+a")) == [
        _down(CTRL), _down("a"), _up("a"), _up(CTRL)]
    assert press_actions(parse_dom_combo("Shift+Tab")) == [
        _down(SHIFT), _down(TAB), _up(TAB), _up(SHIFT)]
    # The browser runs on Linux: ControlOrMeta is Control.
    assert press_actions(parse_dom_combo("ControlOrMeta+c")) == [
        _down(CTRL), _down("c"), _up("c"), _up(CTRL)]
    assert press_actions(parse_dom_combo("Control+Alt+Delete")) == [
        _down(CTRL), _down("\ue00a"), _down("\ue017"), _up("\ue017"), _up("\ue00a"), _up(CTRL)]
    assert press_actions(parse_dom_combo("Meta+ArrowLeft")) == [
        _down("\ue03d"), _down("\ue012"), _up("\ue012"), _up("\ue03d")]


def test_named_keys_are_the_webdriver_code_points() -> None:
    for name, value in (("Enter", ENTER), ("NumpadEnter", "\ue007"), ("Backspace", "\ue003"),
                        ("Escape", "\ue00c"), ("F1", "\ue031"), ("F12", "\ue03c"),
                        ("PageDown", "\ue00f"), ("Numpad7", "\ue021"), ("Space", " "),
                        ("KeyQ", "q"), ("Digit0", "0"), ("Backquote", "`")):
        assert press_actions(parse_dom_combo(name)) == _typed(value), name
    assert WEBDRIVER_KEYS["Shift"] == WEBDRIVER_KEYS["ShiftLeft"] == SHIFT
    assert WEBDRIVER_KEYS["ShiftRight"] == "\ue050" and WEBDRIVER_KEYS["MetaRight"] == "\ue053"


def test_shift_gives_a_code_its_shifted_character() -> None:
    assert press_actions(parse_dom_combo("Shift+KeyA")) == [_down(SHIFT), *_typed("A"), _up(SHIFT)]
    assert press_actions(parse_dom_combo("Shift+Digit1")) == [_down(SHIFT), *_typed("!"), _up(SHIFT)]
    assert press_actions(parse_dom_combo("Shift+Slash")) == [_down(SHIFT), *_typed("?"), _up(SHIFT)]
    # A character names itself, shifted or not (as Playwright types it), and any
    # printable character is its own key.
    assert press_actions(parse_dom_combo("A")) == _typed("A")
    assert press_actions(parse_dom_combo("+")) == _typed("+")
    assert press_actions(parse_dom_combo("é")) == _typed("é")


def test_a_key_firefox_has_no_value_for_is_a_field_error_on_the_verb_field() -> None:
    for name in ("CapsLock", "AltGraph", "MediaPlayPause", "PrintScreen", "ContextMenu"):
        with pytest.raises(FieldError) as exc:
            press_actions(parse_dom_combo(f"Control+{name}"))
        assert exc.value.field == "action.text" and name in exc.value.reason
    with pytest.raises(FieldError) as exc:
        press_actions(KeyCombo((), "Return"))
    assert exc.value.field == "action.text"
    # Every other name the verb accepts has a value.
    refused = {"CapsLock", "AltGraph", "ContextMenu", "PrintScreen", "ScrollLock", "NumLock",
               "AudioVolumeMute", "AudioVolumeDown", "AudioVolumeUp", "MediaTrackNext",
               "MediaTrackPrevious", "MediaPlayPause"}
    assert {n for n in DOM_KEYS if n not in WEBDRIVER_KEYS} == refused


# -- text ---------------------------------------------------------------------------------


def test_text_is_typed_one_grapheme_per_key() -> None:
    assert text_actions("é") == _typed("é")
    assert text_actions("e\u0301") == _typed("e\u0301")           # e + combining acute: one key
    family = "\U0001F468\u200d\U0001F469\u200d\U0001F467\u200d\U0001F466"
    assert text_actions(f"a{family}b") == _typed("a", family, "b")
    flags = "\U0001F1FA\U0001F1F8\U0001F1EB\U0001F1F7"              # US, FR
    assert text_actions(flags) == _typed(flags[:2], flags[2:])
    thumbs = "\U0001F44D\U0001F3FD"                                 # skin tone stays on
    heart = "\u2764\ufe0f"                                          # emoji presentation
    assert text_actions(thumbs + heart) == _typed(thumbs, heart)
    # A ZWJ joins two pictographs only: after a letter it ends the letter's grapheme.
    assert text_actions("a\u200db") == _typed("a\u200d", "b")


def test_line_breaks_are_enter_and_a_tab_is_tab() -> None:
    assert text_actions("a\r\nb") == _typed("a", ENTER, "b")
    assert text_actions("a\nb\rc") == _typed("a", ENTER, "b", ENTER, "c")
    assert text_actions("\r\n\r\n") == _typed(ENTER, ENTER)
    assert text_actions("x\ty") == _typed("x", TAB, "y")
    # A mark after a line break has no base to join (the break ends the grapheme).
    assert text_actions("\n\u0301") == _typed(ENTER, "\u0301")


def test_control_characters_are_a_field_error_naming_the_position() -> None:
    for text, where in (("ab\x1b", 2), ("\x00", 0), ("a\x7fb", 1), ("a\x85", 1), ("\ud800", 0)):
        with pytest.raises(FieldError) as exc:
            text_actions(text)
        assert exc.value.field == "action.text" and f"character {where} " in exc.value.reason


# -- the live view ------------------------------------------------------------------------


def test_a_live_view_session_replays_in_order_with_the_state_carried() -> None:
    cmds, after = _plan(
        {"type": "button", "button": "left", "down": True, "x": 640, "y": 123},
        {"type": "button", "button": "left", "down": False},
        {"type": "wheel", "direction": "down", "amount": 2},
        _key("Shift_L", True), _key("1", True), _key("1", False),
        {"type": "text", "text": "hé\n"},
    )
    assert cmds == [
        _pointer({"type": "pointerMove", "x": 640, "y": 123, "origin": "viewport"},
                 {"type": "pointerDown", "button": 0}, {"type": "pointerUp", "button": 0}),
        _wheel(*[{"type": "scroll", "x": 640, "y": 123, "deltaX": 0, "deltaY": 100}] * 2),
        # The key goes by its unshifted value: Firefox applies the held Shift ("!").
        _keyboard(_down(SHIFT), _down("1"), _up("1"), *_typed("h", "é", ENTER)),
    ]
    assert after == PointerState(640, 123, buttons=0, modifiers=8)
    cmds, after = _plan(_key("Shift_L", False), state=after)
    assert cmds == [_keyboard(_up(SHIFT))]
    assert after == PointerState(640, 123, buttons=0, modifiers=0)


def test_a_drag_keeps_the_button_held_and_points_stay_on_the_page() -> None:
    cmds, after = _plan({"type": "button", "button": "right", "down": True, "x": 0, "y": 0},
                        {"type": "move", "x": 1279, "y": 799})
    assert cmds == [_pointer({"type": "pointerMove", "x": 0, "y": 0, "origin": "viewport"},
                             {"type": "pointerDown", "button": 2},
                             {"type": "pointerMove", "x": 1279, "y": 799, "origin": "viewport"})]
    assert after == PointerState(1279, 799, buttons=2)
    cmds, after = _plan({"type": "button", "button": "middle", "down": True}, state=after)
    assert cmds == [_pointer({"type": "pointerDown", "button": 1})] and after.buttons == 2 | 4
    # An axis past the end lands on the last pixel, as plan_cdp clamps it.
    cmds, after = plan_bidi([[{"type": "abs", "data": {"axis": "x", "value": 99999}},
                              {"type": "abs", "data": {"axis": "y", "value": -5}}]],
                            VIEW, PointerState())
    assert cmds == [_pointer({"type": "pointerMove", "x": 1279, "y": 0, "origin": "viewport"})]


def test_a_pause_is_a_sleep_between_calls() -> None:
    # Sideways scrolling on a vertical wheel: Shift, a pause, the notch, a pause, Shift up.
    cmds, after = _plan({"type": "wheel", "direction": "left"}, state=PointerState(5, 6))
    assert cmds == [
        _keyboard(_down(SHIFT)), Sleep(qin.MOD_GAP_S),
        _wheel({"type": "scroll", "x": 5, "y": 6, "deltaX": 0, "deltaY": -100}),
        Sleep(qin.MOD_GAP_S), _keyboard(_up(SHIFT)),
    ]
    assert after.modifiers == 0


def test_what_the_page_cannot_take_is_the_same_field_error_as_plan_cdp() -> None:
    def refused(steps: list[qin.Step]) -> str:
        with pytest.raises(FieldError) as exc:
            plan_bidi(steps, VIEW, PointerState())
        return exc.value.field

    qkey = {"type": "key", "data": {"down": True, "key": {"type": "qcode", "data": "lang1"}}}
    assert refused([[qkey]]) == "key"
    assert refused(plan_input(_key("Caps_Lock", True), VIEW)[0]) == "key"   # no WebDriver value
    assert refused([[{"type": "key", "data": {"down": True, "key": {"type": "number", "data": 30}}}]]) == "key"
    assert refused([qin.Bind(((200, 0x4E16),), 0)]) == "key"
    assert refused([[{"type": "rel", "data": {"axis": "x", "value": 3}}]]) == "type"
    assert refused([[{"type": "btn", "data": {"down": True, "button": "side"}}]]) == "button"
    assert refused([[{"type": "abs", "data": {"axis": "x", "value": 1.5}}]]) == "x"
    assert refused(plan_input({"type": "text", "text": "a\x07"}, VIEW)[0]) == "text"
