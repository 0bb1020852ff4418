"""DOM key names → CDP ``Input.dispatchKeyEvent`` parameters, as Playwright's US layout does it.

Pure data and one planning function: :func:`plan_press` turns a parsed
:class:`rigd.verbs.keys.KeyCombo` into the key events to send (modifiers
down, the key down and up, modifiers up), each a params dict. ``ControlOrMeta``
is Control here: the browser runs on Linux.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from rigd.verbs.keys import KeyCombo


@dataclass(frozen=True, slots=True)
class KeyDef:
    code: str
    key: str
    key_code: int
    shift_key: str | None = None
    text: str | None = None
    location: int = 0


def _defs() -> dict[str, KeyDef]:
    out: dict[str, KeyDef] = {}

    def add(code: str, key: str, key_code: int, shift_key: str | None = None,
            text: str | None = None, location: int = 0) -> None:
        out[code] = KeyDef(code, key, key_code, shift_key, text, location)

    add("Escape", "Escape", 27)
    for n in range(1, 13):
        add(f"F{n}", f"F{n}", 111 + n)
    add("Backquote", "`", 192, "~")
    for n, shifted in zip(range(10), ")!@#$%^&*(", strict=True):
        add(f"Digit{n}", str(n), 48 + n, shifted)
    add("Minus", "-", 189, "_")
    add("Equal", "=", 187, "+")
    add("Backslash", "\\", 220, "|")
    add("Backspace", "Backspace", 8)
    add("Tab", "Tab", 9)
    for i, c in enumerate("abcdefghijklmnopqrstuvwxyz"):
        add(f"Key{c.upper()}", c, 65 + i, c.upper())
    add("BracketLeft", "[", 219, "{")
    add("BracketRight", "]", 221, "}")
    add("CapsLock", "CapsLock", 20)
    add("Semicolon", ";", 186, ":")
    add("Quote", "'", 222, '"')
    add("Enter", "Enter", 13, text="\r")
    add("ShiftLeft", "Shift", 16, location=1)
    add("ShiftRight", "Shift", 16, location=2)
    add("Comma", ",", 188, "<")
    add("Period", ".", 190, ">")
    add("Slash", "/", 191, "?")
    add("ControlLeft", "Control", 17, location=1)
    add("ControlRight", "Control", 17, location=2)
    add("MetaLeft", "Meta", 91, location=1)
    add("MetaRight", "Meta", 92, location=2)
    add("AltLeft", "Alt", 18, location=1)
    add("AltRight", "Alt", 18, location=2)
    add("AltGraph", "AltGraph", 225)
    add("ContextMenu", "ContextMenu", 93)
    add("Space", " ", 32)
    add("PrintScreen", "PrintScreen", 44)
    add("ScrollLock", "ScrollLock", 145)
    add("Pause", "Pause", 19)
    add("PageUp", "PageUp", 33)
    add("PageDown", "PageDown", 34)
    add("Insert", "Insert", 45)
    add("Delete", "Delete", 46)
    add("Home", "Home", 36)
    add("End", "End", 35)
    add("ArrowLeft", "ArrowLeft", 37)
    add("ArrowUp", "ArrowUp", 38)
    add("ArrowRight", "ArrowRight", 39)
    add("ArrowDown", "ArrowDown", 40)
    add("AudioVolumeMute", "AudioVolumeMute", 173)
    add("AudioVolumeDown", "AudioVolumeDown", 174)
    add("AudioVolumeUp", "AudioVolumeUp", 175)
    add("MediaTrackNext", "MediaTrackNext", 176)
    add("MediaTrackPrevious", "MediaTrackPrevious", 177)
    add("MediaPlayPause", "MediaPlayPause", 179)
    add("NumLock", "NumLock", 144)
    add("NumpadDivide", "/", 111, location=3)
    add("NumpadMultiply", "*", 106, location=3)
    add("NumpadSubtract", "-", 109, location=3)
    add("NumpadAdd", "+", 107, location=3)
    add("NumpadDecimal", ".", 110, location=3)
    add("NumpadEnter", "Enter", 13, text="\r", location=3)
    for n in range(10):
        add(f"Numpad{n}", str(n), 96 + n, location=3)
    return out


KEYS_BY_CODE: dict[str, KeyDef] = _defs()
#: Names that are not codes: the unlocated key values and the modifier aliases.
_ALIASES = {"Shift": "ShiftLeft", "Control": "ControlLeft", "Alt": "AltLeft", "Meta": "MetaLeft",
            "ControlOrMeta": "ControlLeft"}
#: A printable character → (code, whether it is the shifted key of that code).
_BY_CHAR: dict[str, tuple[str, bool]] = {}
for _code, _d in KEYS_BY_CODE.items():
    if _d.location == 0 and len(_d.key) == 1:
        _BY_CHAR.setdefault(_d.key, (_code, False))
    if _d.shift_key is not None:
        _BY_CHAR.setdefault(_d.shift_key, (_code, True))

#: CDP modifier bits.
MODIFIER_BITS = {"Alt": 1, "Control": 2, "Meta": 4, "Shift": 8}


def _describe(name: str, shift: bool) -> dict[str, Any]:
    """The key's ``key``/``code``/``keyCode``/text, as Playwright's ``_keyDescriptionForString``."""
    code = _ALIASES.get(name, name)
    if code in KEYS_BY_CODE:
        d = KEYS_BY_CODE[code]
        key = d.shift_key if shift and d.shift_key else d.key
        text = d.text if d.text is not None else (key if len(key) == 1 else "")
        return {"key": key, "code": d.code, "windowsVirtualKeyCode": d.key_code,
                "text": text, "location": d.location}
    if name in _BY_CHAR:
        code, shifted = _BY_CHAR[name]
        d = KEYS_BY_CODE[code]
        return {"key": name, "code": d.code, "windowsVirtualKeyCode": d.key_code, "text": name,
                "location": 0, "shifted": shifted}
    # Any other printable character: a key with no code, as Playwright types it.
    return {"key": name, "code": "", "windowsVirtualKeyCode": 0, "text": name, "location": 0}


def _event(kind: str, desc: dict[str, Any], modifiers: int, *, with_text: bool) -> dict[str, Any]:
    params: dict[str, Any] = {
        "type": kind, "modifiers": modifiers, "key": desc["key"], "code": desc["code"],
        "windowsVirtualKeyCode": desc["windowsVirtualKeyCode"], "location": desc["location"],
    }
    if desc["location"] == 3:
        params["isKeypad"] = True
    if with_text and desc["text"]:
        params["text"] = params["unmodifiedText"] = desc["text"]
    return params


def plan_press(combo: KeyCombo) -> list[dict[str, Any]]:
    """``Input.dispatchKeyEvent`` params for pressing ``combo`` once."""
    events: list[dict[str, Any]] = []
    held = 0
    mods = [_ALIASES.get(m, m) for m in combo.modifiers]
    for code in mods:
        d = KEYS_BY_CODE[code]
        held |= MODIFIER_BITS.get(d.key, 0)
        events.append(_event("rawKeyDown", _describe(code, False), held, with_text=False))
    shift = bool(held & MODIFIER_BITS["Shift"])
    desc = _describe(combo.key, shift)
    key_bits = MODIFIER_BITS.get(desc["key"], 0)
    # Text is typed only without Control, Alt or Meta held (those are shortcuts).
    typing = bool(desc["text"]) and not held & (MODIFIER_BITS["Control"] | MODIFIER_BITS["Alt"]
                                                 | MODIFIER_BITS["Meta"])
    events.append(_event("keyDown" if typing else "rawKeyDown", desc, held | key_bits, with_text=typing))
    events.append(_event("keyUp", desc, held, with_text=False))
    for code in reversed(mods):
        d = KEYS_BY_CODE[code]
        held &= ~MODIFIER_BITS.get(d.key, 0)
        events.append(_event("keyUp", _describe(code, False), held, with_text=False))
    return events
