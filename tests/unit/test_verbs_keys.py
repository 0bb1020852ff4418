"""Key-name syntax per surface, tested directly."""

from __future__ import annotations

import pytest

from rigd.verbs.keys import (
    KeyCombo,
    KeySyntaxError,
    android_keycode,
    ios_key,
    parse_dom_combo,
    parse_x11_combo,
    parse_x11_keys,
    parse_x11_modifiers,
)


@pytest.mark.parametrize(
    ("text", "combo"),
    [
        ("Return", KeyCombo((), "Return")),
        ("ctrl+s", KeyCombo(("Control_L",), "s")),
        ("CTRL+ALT+Delete", KeyCombo(("Control_L", "Alt_L"), "Delete")),
        ("Control_R+Shift_R+t", KeyCombo(("Control_R", "Shift_R"), "t")),
        ("super", KeyCombo((), "Super_L")),
        ("shift+ctrl", KeyCombo(("Shift_L",), "Control_L")),
        ("XF86AudioMute", KeyCombo((), "XF86AudioMute")),
        ("0x1008ff11", KeyCombo((), "0x1008ff11")),
        ("ctrl+é", KeyCombo(("Control_L",), "é")),
        ("ctrl+/", KeyCombo(("Control_L",), "/")),
    ],
)
def test_x11_combos(text: str, combo: KeyCombo) -> None:
    assert parse_x11_combo(text) == combo


def test_combo_str_joins_with_plus() -> None:
    assert str(parse_x11_combo("ctrl+shift+t")) == "Control_L+Shift_L+t"


@pytest.mark.parametrize(
    "text", ["", "+", "ctrl+", "+s", "ctrl++", "s+ctrl", "cmd+s", "a-b", "Page Down", "x" * 65]
)
def test_x11_combo_errors(text: str) -> None:
    with pytest.raises(KeySyntaxError):
        parse_x11_combo(text)


def test_x11_sequence_splits_on_whitespace() -> None:
    assert parse_x11_keys("  ctrl+a\tDelete\n") == (
        KeyCombo(("Control_L",), "a"), KeyCombo((), "Delete"),
    )


def test_x11_modifiers() -> None:
    assert parse_x11_modifiers("shift") == ("Shift_L",)
    assert parse_x11_modifiers("ctrl+Alt_R") == ("Control_L", "Alt_R")
    for bad in ("", "a", "shift+a", "shift ", "ctrl++"):
        with pytest.raises(KeySyntaxError):
            parse_x11_modifiers(bad)


@pytest.mark.parametrize(
    ("text", "combo"),
    [
        ("Enter", KeyCombo((), "Enter")),
        ("Meta+Shift+KeyP", KeyCombo(("Meta", "Shift"), "KeyP")),
        ("Shift++", KeyCombo(("Shift",), "+")),
        ("Control+ ", KeyCombo(("Control",), " ")),
        ("F12", KeyCombo((), "F12")),
        ("Numpad0", KeyCombo((), "Numpad0")),
        ("Shift", KeyCombo((), "Shift")),
    ],
)
def test_dom_combos(text: str, combo: KeyCombo) -> None:
    assert parse_dom_combo(text) == combo


@pytest.mark.parametrize("text", ["", "enter", "F13", "Shift+", "Ctrl+a", "a+b", "Tab+a"])
def test_dom_errors(text: str) -> None:
    with pytest.raises(KeySyntaxError):
        parse_dom_combo(text)


def test_android_and_ios() -> None:
    assert android_keycode("Power") == "KEYCODE_POWER"
    assert android_keycode("KEYCODE_MEDIA_PLAY") == "KEYCODE_MEDIA_PLAY"
    assert ios_key("ESCAPE") == "escape"
    assert ios_key(" ") == " "
    with pytest.raises(KeySyntaxError):
        android_keycode("")
    with pytest.raises(KeySyntaxError):
        ios_key("")
    with pytest.raises(KeySyntaxError):
        ios_key("\n")
