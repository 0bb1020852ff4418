"""Key-name syntax of each surface, checked without touching a machine.

- **X11** (computer_use): xdotool's spelling, which Anthropic's computer-use
  tool documents. A *combo* is ``+``-joined names: every name but the last is
  a modifier (``ctrl``, ``control``, ``alt``, ``shift``, ``super``, ``meta``,
  ``hyper``, any case, or a modifier keysym such as ``Control_R``); the last
  is a keysym name of ``[A-Za-z0-9_]`` (``Return``, ``KP_Enter``, ``F5``,
  ``XF86AudioMute``) or one printable character. A *sequence* is combos
  separated by whitespace (``ctrl+a Delete``). Only the syntax is checked:
  whether a keysym exists is the backend's answer. Modifier aliases are
  normalised to the keysyms xdotool presses for them (``ctrl`` →
  ``Control_L``), so a backend maps keysyms only. ``+`` and space cannot be
  bare characters here (they are separators): write ``plus`` and ``space``.
- **DOM** (browser_use): Playwright's ``keyboard.press`` spelling. Modifiers
  are ``Shift``, ``Control``, ``Alt``, ``Meta`` and ``ControlOrMeta``; the
  key is a name from Playwright's US layout (``Enter``, ``ArrowLeft``,
  ``KeyA``, ``Digit1``, ``F5``…) or one printable character (``a``, ``+``).
  Names are case-sensitive, as in Playwright; near misses get a hint.
- **Android** (mobile_use): the aliases of RIGS.md §4 (any case) or a
  ``KEYCODE_*`` constant. ``delete`` is the forward delete key
  (``KEYCODE_FORWARD_DEL``) and ``backspace`` is Android's ``KEYCODE_DEL``,
  so the two aliases differ as they do on a PC keyboard.
- **iOS** (ios_use): ``enter``, ``backspace``, ``tab``, ``escape``, ``up``,
  ``down``, ``left``, ``right`` (any case) or one printable character, with
  optional modifiers ``command``, ``control``, ``option``, ``shift``.

Every parser raises :class:`KeySyntaxError` whose message is the rule broken.
"""

from __future__ import annotations

import re
from dataclasses import dataclass


class KeySyntaxError(ValueError):
    """A key specification breaks the syntax; the message states the rule."""


@dataclass(frozen=True, slots=True)
class KeyCombo:
    """Keys pressed together: ``modifiers`` held, then ``key`` pressed."""

    modifiers: tuple[str, ...]
    key: str

    def __str__(self) -> str:
        return "+".join((*self.modifiers, self.key))


def _show(token: str, limit: int = 32) -> str:
    """Quote a token for an error message, bounded and with escapes."""
    return repr(token if len(token) <= limit else token[:limit] + "…")


def _is_char(token: str) -> bool:
    return len(token) == 1 and token.isprintable()


# --- X11 ---------------------------------------------------------------------

#: xdotool's case-insensitive modifier aliases and the keysyms it presses.
X11_MODIFIER_ALIASES: dict[str, str] = {
    "ctrl": "Control_L",
    "control": "Control_L",
    "alt": "Alt_L",
    "shift": "Shift_L",
    "super": "Super_L",
    "meta": "Meta_L",
    "hyper": "Hyper_L",
}
X11_MODIFIER_KEYSYMS: frozenset[str] = frozenset(
    {
        *(f"{name}_{side}" for name in ("Control", "Shift", "Alt", "Super", "Meta", "Hyper")
          for side in "LR"),
        "ISO_Level3_Shift",
        "Mode_switch",
    }
)
_X11_HINTS = {
    "cmd": "super", "command": "super", "win": "super", "windows": "super",
    "option": "alt", "opt": "alt", "ctl": "ctrl",
}
_X11_KEYSYM = re.compile(r"[A-Za-z0-9_]{1,64}")
_X11_MODIFIER_RULE = "modifiers are ctrl, alt, shift, super, meta, hyper (or a *_L/*_R keysym)"


def x11_modifier(token: str) -> str | None:
    """The keysym a modifier name presses, or ``None`` if it is no modifier."""
    if token in X11_MODIFIER_KEYSYMS:
        return token
    return X11_MODIFIER_ALIASES.get(token.lower())


def _x11_not_modifier(token: str, combo: str) -> KeySyntaxError:
    hint = _X11_HINTS.get(token.lower())
    extra = f" (did you mean {hint}?)" if hint else ""
    return KeySyntaxError(
        f"{_show(token)} in {_show(combo)} is not an X11 modifier{extra}; {_X11_MODIFIER_RULE}"
    )


def parse_x11_combo(combo: str) -> KeyCombo:
    """One xdotool combo such as ``ctrl+shift+t``, ``Return`` or ``super``."""
    if not combo:
        raise KeySyntaxError("must name a key, e.g. Return, ctrl+s or alt+Tab")
    parts = combo.split("+")
    if any(not part for part in parts):
        raise KeySyntaxError(
            f"{_show(combo)} has an empty name around '+'; join names with '+' "
            "and write the + key as plus"
        )
    modifiers: list[str] = []
    for part in parts[:-1]:
        keysym = x11_modifier(part)
        if keysym is None:
            raise _x11_not_modifier(part, combo)
        modifiers.append(keysym)
    last = parts[-1]
    key = x11_modifier(last) or last
    if not (_X11_KEYSYM.fullmatch(key) or (_is_char(key) and not key.isspace())):
        raise KeySyntaxError(
            f"{_show(last)} is not an X11 keysym name ([A-Za-z0-9_], e.g. Return, Tab, "
            "KP_Enter, F5) or a single printable character"
        )
    return KeyCombo(tuple(modifiers), key)


def parse_x11_keys(text: str) -> tuple[KeyCombo, ...]:
    """A whitespace-separated sequence of xdotool combos (``ctrl+a Delete``)."""
    if len(text) > 1024:
        raise KeySyntaxError("must be at most 1024 characters")
    combos = text.split()
    if not combos:
        raise KeySyntaxError("must name a key, e.g. Return, ctrl+s or alt+Tab")
    return tuple(parse_x11_combo(combo) for combo in combos)


def parse_x11_modifiers(text: str) -> tuple[str, ...]:
    """Modifiers held during a click: ``shift``, ``ctrl+shift`` (keysyms out)."""
    if not text or len(text) > 1024:
        raise KeySyntaxError(
            f"must name modifier keys joined by '+', e.g. shift; {_X11_MODIFIER_RULE}"
        )
    out: list[str] = []
    for part in text.split("+"):
        keysym = x11_modifier(part)
        if keysym is None:
            raise _x11_not_modifier(part, text)
        out.append(keysym)
    return tuple(out)


# --- DOM (Playwright) --------------------------------------------------------

DOM_MODIFIERS: tuple[str, ...] = ("Shift", "Control", "Alt", "Meta", "ControlOrMeta")

#: Names ``keyboard.press`` knows in Playwright's US layout: the ``code`` of
#: every key, the ``key`` value of the unlocated ones, and the modifier aliases.
DOM_KEYS: frozenset[str] = frozenset(
    {
        "Escape", *(f"F{n}" for n in range(1, 13)),
        "Backquote", *(f"Digit{n}" for n in range(10)), "Minus", "Equal", "Backslash",
        "Backspace", "Tab", *(f"Key{c}" for c in "ABCDEFGHIJKLMNOPQRSTUVWXYZ"),
        "BracketLeft", "BracketRight", "CapsLock", "Semicolon", "Quote", "Enter",
        "ShiftLeft", "ShiftRight", "Comma", "Period", "Slash",
        "ControlLeft", "ControlRight", "MetaLeft", "MetaRight", "AltLeft", "AltRight",
        "Space", "AltGraph", "ContextMenu",
        "PrintScreen", "ScrollLock", "Pause", "PageUp", "PageDown", "Insert", "Delete",
        "Home", "End", "ArrowLeft", "ArrowUp", "ArrowRight", "ArrowDown",
        "AudioVolumeMute", "AudioVolumeDown", "AudioVolumeUp",
        "MediaTrackNext", "MediaTrackPrevious", "MediaPlayPause",
        "NumLock", "NumpadDivide", "NumpadMultiply", "NumpadSubtract", "NumpadAdd",
        "NumpadDecimal", "NumpadEnter", *(f"Numpad{n}" for n in range(10)),
        *DOM_MODIFIERS,
    }
)
_DOM_BY_FOLD = {name.casefold(): name for name in DOM_KEYS}
_DOM_HINTS = {
    "ctrl": "Control", "cmd": "Meta", "command": "Meta", "win": "Meta", "super": "Meta",
    "option": "Alt", "opt": "Alt", "esc": "Escape", "return": "Enter", "del": "Delete",
    "up": "ArrowUp", "down": "ArrowDown", "left": "ArrowLeft", "right": "ArrowRight",
    "pgup": "PageUp", "pgdn": "PageDown", "pagedown": "PageDown", "pageup": "PageUp",
}


def _dom_hint(token: str) -> str:
    folded = token.casefold()
    hint = _DOM_BY_FOLD.get(folded) or _DOM_HINTS.get(folded)
    return f" (did you mean {hint}?)" if hint else ""


def _dom_split(combo: str) -> list[str]:
    """Playwright's split: a '+' starts a token when no token is being built,
    so ``Shift++`` is Shift then ``+``, and ``+`` alone is the plus key."""
    tokens: list[str] = []
    building = ""
    for char in combo:
        if char == "+" and building:
            tokens.append(building)
            building = ""
        else:
            building += char
    tokens.append(building)
    return tokens


def parse_dom_combo(combo: str) -> KeyCombo:
    """One Playwright ``keyboard.press`` combo: ``Enter``, ``Control+a``."""
    if not combo or len(combo) > 256:
        raise KeySyntaxError("must name a DOM key, e.g. Enter, ArrowLeft or Control+a")
    tokens = _dom_split(combo)
    for token in tokens[:-1]:
        if token not in DOM_MODIFIERS:
            raise KeySyntaxError(
                f"{_show(token)} in {_show(combo)} is not a modifier{_dom_hint(token)}; "
                f"modifiers are {', '.join(DOM_MODIFIERS)}"
            )
    key = tokens[-1]
    if not (key in DOM_KEYS or _is_char(key)):
        raise KeySyntaxError(
            f"{_show(key)} is not a DOM key name{_dom_hint(key)}; use a name such as Enter, "
            "Tab, ArrowLeft, PageDown, F5, KeyA, or a single printable character"
        )
    return KeyCombo(tuple(tokens[:-1]), key)


# --- Android -----------------------------------------------------------------

ANDROID_KEY_ALIASES: dict[str, str] = {
    "back": "KEYCODE_BACK",
    "home": "KEYCODE_HOME",
    "recents": "KEYCODE_APP_SWITCH",
    "enter": "KEYCODE_ENTER",
    "delete": "KEYCODE_FORWARD_DEL",
    "backspace": "KEYCODE_DEL",
    "tab": "KEYCODE_TAB",
    "escape": "KEYCODE_ESCAPE",
    "search": "KEYCODE_SEARCH",
    "menu": "KEYCODE_MENU",
    "volume_up": "KEYCODE_VOLUME_UP",
    "volume_down": "KEYCODE_VOLUME_DOWN",
    "power": "KEYCODE_POWER",
}
_KEYCODE = re.compile(r"KEYCODE_[A-Z0-9_]{1,64}")


def android_keycode(text: str) -> str:
    """The ``KEYCODE_*`` constant an alias or a keycode name stands for."""
    if _KEYCODE.fullmatch(text):
        return text
    keycode = ANDROID_KEY_ALIASES.get(text.lower())
    if keycode is None:
        raise KeySyntaxError(
            f"{_show(text)} is not an Android key; use one of "
            f"{', '.join(ANDROID_KEY_ALIASES)} or a KEYCODE_* name such as KEYCODE_DPAD_UP"
        )
    return keycode


# --- iOS ---------------------------------------------------------------------

IOS_KEY_NAMES: tuple[str, ...] = (
    "enter", "backspace", "tab", "escape", "up", "down", "left", "right",
)
_IOS_HINTS = {
    "return": "enter", "delete": "backspace", "esc": "escape",
    "arrowup": "up", "arrow_up": "up", "uparrow": "up",
    "arrowdown": "down", "arrow_down": "down", "downarrow": "down",
    "arrowleft": "left", "arrow_left": "left", "leftarrow": "left",
    "arrowright": "right", "arrow_right": "right", "rightarrow": "right",
}


def ios_key(text: str) -> str:
    """A named iOS key (lower-cased) or the single character itself."""
    if _is_char(text):
        return text
    folded = text.lower()
    if folded in IOS_KEY_NAMES:
        return folded
    hint = _IOS_HINTS.get(folded)
    extra = f" (did you mean {hint}?)" if hint else ""
    raise KeySyntaxError(
        f"{_show(text)} is not an iOS key{extra}; use one of {', '.join(IOS_KEY_NAMES)} "
        "or a single printable character"
    )


# --- One table across vocabularies -------------------------------------------
#
# Models spell keys three ways: xdotool keysyms (Anthropic's computer tool:
# ``Return``, ``ctrl+s``), OpenAI's computer-use names (``ENTER``, ``CTRL``,
# ``ARROWLEFT``) and Playwright/DOM names (Gemini: ``Enter``, ``Control+C``).
# One table maps every spelling, case-insensitively, to the key a rig
# presses: its X11 keysym on a desktop, its DOM name in a browser. A name the
# table lacks still passes when it is a valid name of the target (an X11
# keysym such as ``XF86Back``; a DOM key such as ``NumpadAdd``), so the table
# only ever widens what is accepted. ``meta``, ``cmd`` and ``win`` all mean
# the key beside Alt (``Super_L`` on the desktop, ``Meta`` in a browser): a
# model that says META means that key, not X11's rarely mapped ``Meta_L``.


@dataclass(frozen=True, slots=True)
class RigKey:
    """A named key as each surface presses it."""

    x11: str
    dom: str
    modifier: bool = False


def _named() -> dict[str, RigKey]:
    rows: list[tuple[RigKey, tuple[str, ...]]] = [
        (RigKey("Control_L", "Control", True), ("ctrl", "control", "control_l", "controlleft", "lctrl")),
        (RigKey("Control_R", "Control", True), ("control_r", "controlright", "rctrl")),
        (RigKey("Shift_L", "Shift", True), ("shift", "shift_l", "shiftleft", "lshift")),
        (RigKey("Shift_R", "Shift", True), ("shift_r", "shiftright", "rshift")),
        (RigKey("Alt_L", "Alt", True), ("alt", "alt_l", "altleft", "option", "opt", "lalt")),
        (RigKey("Alt_R", "Alt", True), ("alt_r", "altright", "ralt")),
        (RigKey("Super_L", "Meta", True),
         ("super", "super_l", "meta", "meta_l", "metaleft", "cmd", "command", "win", "windows", "os")),
        (RigKey("Super_R", "Meta", True), ("super_r", "meta_r", "metaright")),
        (RigKey("Return", "Enter"), ("enter", "return", "ret")),
        (RigKey("KP_Enter", "NumpadEnter"), ("kp_enter", "numpadenter")),
        (RigKey("Tab", "Tab"), ("tab",)),
        (RigKey("Escape", "Escape"), ("escape", "esc")),
        (RigKey("BackSpace", "Backspace"), ("backspace", "back_space", "bksp")),
        (RigKey("Delete", "Delete"), ("delete", "del")),
        (RigKey("Insert", "Insert"), ("insert", "ins")),
        (RigKey("Home", "Home"), ("home",)),
        (RigKey("End", "End"), ("end",)),
        (RigKey("Prior", "PageUp"), ("pageup", "page_up", "prior", "pgup")),
        (RigKey("Next", "PageDown"), ("pagedown", "page_down", "next", "pgdn")),
        (RigKey("Up", "ArrowUp"), ("up", "arrowup", "arrow_up", "uparrow")),
        (RigKey("Down", "ArrowDown"), ("down", "arrowdown", "arrow_down", "downarrow")),
        (RigKey("Left", "ArrowLeft"), ("left", "arrowleft", "arrow_left", "leftarrow")),
        (RigKey("Right", "ArrowRight"), ("right", "arrowright", "arrow_right", "rightarrow")),
        (RigKey("space", "Space"), ("space", "spacebar")),
        (RigKey("Caps_Lock", "CapsLock"), ("capslock", "caps_lock")),
        (RigKey("Num_Lock", "NumLock"), ("numlock", "num_lock")),
        (RigKey("Scroll_Lock", "ScrollLock"), ("scrolllock", "scroll_lock")),
        (RigKey("Print", "PrintScreen"), ("print", "printscreen", "print_screen", "prtsc", "prtscr")),
        (RigKey("Pause", "Pause"), ("pause",)),
        (RigKey("Menu", "ContextMenu"), ("menu", "contextmenu", "apps")),
        (RigKey("XF86AudioMute", "AudioVolumeMute"), ("xf86audiomute", "audiovolumemute", "volumemute")),
        (RigKey("XF86AudioLowerVolume", "AudioVolumeDown"),
         ("xf86audiolowervolume", "audiovolumedown", "volumedown")),
        (RigKey("XF86AudioRaiseVolume", "AudioVolumeUp"),
         ("xf86audioraisevolume", "audiovolumeup", "volumeup")),
        (RigKey("XF86AudioNext", "MediaTrackNext"), ("xf86audionext", "mediatracknext")),
        (RigKey("XF86AudioPrev", "MediaTrackPrevious"), ("xf86audioprev", "mediatrackprevious")),
        (RigKey("XF86AudioPlay", "MediaPlayPause"), ("xf86audioplay", "mediaplaypause")),
        # DOM codes of punctuation, and the X11 keysyms of the same keys.
        (RigKey("minus", "Minus"), ("minus",)),
        (RigKey("equal", "Equal"), ("equal", "equals")),
        (RigKey("comma", "Comma"), ("comma",)),
        (RigKey("period", "Period"), ("period",)),
        (RigKey("slash", "Slash"), ("slash",)),
        (RigKey("backslash", "Backslash"), ("backslash",)),
        (RigKey("semicolon", "Semicolon"), ("semicolon",)),
        (RigKey("apostrophe", "Quote"), ("apostrophe", "quote")),
        (RigKey("grave", "Backquote"), ("grave", "backquote")),
        (RigKey("bracketleft", "BracketLeft"), ("bracketleft",)),
        (RigKey("bracketright", "BracketRight"), ("bracketright",)),
        (RigKey("plus", "+"), ("plus",)),
    ]
    rows += [(RigKey(f"F{n}", f"F{n}"), (f"f{n}",)) for n in range(1, 13)]
    rows += [(RigKey(f"KP_{n}", f"Numpad{n}"), (f"kp_{n}", f"numpad{n}")) for n in range(10)]
    for x11, dom in (("KP_Add", "NumpadAdd"), ("KP_Subtract", "NumpadSubtract"),
                     ("KP_Multiply", "NumpadMultiply"), ("KP_Divide", "NumpadDivide"),
                     ("KP_Decimal", "NumpadDecimal")):
        rows.append((RigKey(x11, dom), (x11.lower(), dom.lower())))
    table: dict[str, RigKey] = {}
    for key, aliases in rows:
        for alias in aliases:
            assert alias not in table, alias
            table[alias] = key
    return table


#: Every spelling (case-folded) → the key. Single characters are not here.
KEY_TABLE: dict[str, RigKey] = _named()
_DOM_CODE = re.compile(r"(?:Key([A-Za-z])|Digit([0-9]))")


def rig_key(name: str) -> RigKey | None:
    """The key a named spelling stands for (any vocabulary, any case), or ``None``;
    ``KeyA``/``Digit1`` codes and single printable characters included."""
    if _is_char(name):
        if name == " ":
            return KEY_TABLE["space"]
        if name == "+":
            return KEY_TABLE["plus"]
        return None if name.isspace() else RigKey(name, name)
    key = KEY_TABLE.get(name.casefold())
    if key is not None:
        return key
    code = _DOM_CODE.fullmatch(name)
    if code:
        char = (code.group(1) or code.group(2)).lower()
        return RigKey(char, char)
    return None


def split_combo(combo: str) -> list[str]:
    """A ``+``-joined combo's names, with ``+`` itself as a name where it stands
    alone (``Control++``, ``+``), as Playwright splits."""
    return _dom_split(combo)


def _unknown(name: str, target: str) -> KeySyntaxError:
    hint = _DOM_HINTS.get(name.casefold()) if target == "dom" else _X11_HINTS.get(name.casefold())
    extra = f" (did you mean {hint}?)" if hint else ""
    example = "Enter, Tab, ArrowLeft, PageDown, F5, Control" if target == "dom" else \
        "Return, Tab, Left, Page_Down, F5, ctrl"
    return KeySyntaxError(f"{_show(name)} is not a key name{extra}; use a name such as {example}, "
                          "or a single printable character")


def _target_name(name: str, target: str) -> tuple[str, bool]:
    key = rig_key(name)
    if key is not None:
        return (key.dom if target == "dom" else key.x11), key.modifier
    if target == "dom":
        if name in DOM_KEYS:
            return name, name in DOM_MODIFIERS
    elif _X11_KEYSYM.fullmatch(name):
        return name, name in X11_MODIFIER_KEYSYMS
    raise _unknown(name, target)


def combo_for(names: list[str] | tuple[str, ...], target: str) -> str:
    """Keys pressed together (``["CTRL", "A"]``, ``["Control", "c"]``) as one combo
    of the target's syntax: ``x11`` (``Control_L+a``, for computer_use ``key``) or
    ``dom`` (``Control+c``, for browser_use ``key``). Every name but the last must be
    a modifier. On X11 a letter pressed with modifiers is lower-cased: xdotool would
    add Shift for ``A``, and a model writing ``CTRL+A`` means select-all."""
    if not names:
        raise KeySyntaxError("must name at least one key, e.g. Enter or Control+a")
    if len(names) > 16:
        raise KeySyntaxError("must name at most 16 keys pressed together")
    out: list[str] = []
    for i, name in enumerate(names):
        if not name:
            raise KeySyntaxError("has an empty key name")
        mapped, modifier = _target_name(name, target)
        if i < len(names) - 1 and not modifier:
            raise KeySyntaxError(
                f"{_show(name)} is not a modifier; keys pressed together are modifiers "
                "(Control, Shift, Alt, Meta) followed by one key"
            )
        out.append(mapped)
    if target == "x11" and len(out) > 1 and len(out[-1]) == 1 and out[-1].isascii() and out[-1].isalpha():
        out[-1] = out[-1].lower()
    combo = "+".join(out)
    # The target's own parser has the last word (and a rule message of its own).
    (parse_dom_combo if target == "dom" else parse_x11_combo)(combo)
    return combo


def modifiers_for(names: list[str] | tuple[str, ...], target: str) -> str:
    """Modifiers held through a click or scroll (``["shift"]``, ``["CTRL", "ALT"]``)
    as the target's ``+``-joined modifier names (``Shift_L+Alt_L`` on X11)."""
    if not names or len(names) > 8:
        raise KeySyntaxError("must name one to eight modifier keys, e.g. shift or ctrl+shift")
    out: list[str] = []
    for name in names:
        mapped, modifier = _target_name(name, target) if name else ("", False)
        if not modifier:
            raise KeySyntaxError(
                f"{_show(name)} is not a modifier; the keys held are Control, Shift, Alt or Meta "
                "(ctrl, shift, alt, super)"
            )
        out.append(mapped)
    return "+".join(out)
