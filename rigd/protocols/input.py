"""Input through the hypervisor, planned without I/O.

A computer rig's mouse and keyboard are QEMU's virtio tablet and keyboard;
the host injects events with QMP ``input-send-event``, so the guest cannot
see, block or fake where they came from. This module turns rigd's typed
actions into the exact QMP payloads (lists of events and pauses); the
backend only sends them. Facts that shape it (HOST-NOTES.md):

- absolute axes run 0..32767 over the current mode; scaling rounds *up* or a
  click lands a pixel short;
- key events take QEMU ``qcode`` names; a shifted character is shift + key
  on the US layout the desktop image uses;
- characters with no key on that layout (``é``, ``世``) cannot be typed as
  key events: :func:`plan_text` splits text into runs of typeable ASCII and
  runs that must travel another way (the backend pastes them through the
  guest clipboard), so nothing is dropped.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from typing import Any

from rigd.verbs.keys import KeyCombo

AXIS_MAX = 32767

#: X11 keysym names (xdotool spelling) → QEMU qcodes.
KEYSYM_QCODES: dict[str, str] = {
    "Return": "ret", "KP_Enter": "kp_enter", "Tab": "tab", "ISO_Left_Tab": "tab",
    "Escape": "esc", "BackSpace": "backspace", "Delete": "delete", "Insert": "insert",
    "Home": "home", "End": "end", "Prior": "pgup", "Page_Up": "pgup", "Next": "pgdn",
    "Page_Down": "pgdn", "Up": "up", "Down": "down", "Left": "left", "Right": "right",
    "space": "spc", "Print": "print", "Pause": "pause", "Menu": "menu",
    "Caps_Lock": "caps_lock", "Num_Lock": "num_lock", "Scroll_Lock": "scroll_lock",
    "Control_L": "ctrl", "Control_R": "ctrl_r", "Shift_L": "shift", "Shift_R": "shift_r",
    "Alt_L": "alt", "Alt_R": "alt_r", "Meta_L": "alt", "Meta_R": "alt_r",
    "Super_L": "meta_l", "Super_R": "meta_r", "Hyper_L": "meta_l", "Hyper_R": "meta_r",
    "ISO_Level3_Shift": "alt_r", "Mode_switch": "alt_r",
    "KP_0": "kp_0", "KP_1": "kp_1", "KP_2": "kp_2", "KP_3": "kp_3", "KP_4": "kp_4",
    "KP_5": "kp_5", "KP_6": "kp_6", "KP_7": "kp_7", "KP_8": "kp_8", "KP_9": "kp_9",
    "KP_Add": "kp_add", "KP_Subtract": "kp_subtract", "KP_Multiply": "kp_multiply",
    "KP_Divide": "kp_divide", "KP_Decimal": "kp_decimal", "KP_Equal": "kp_equals",
    "minus": "minus", "equal": "equal", "bracketleft": "bracket_left",
    "bracketright": "bracket_right", "backslash": "backslash", "semicolon": "semicolon",
    "apostrophe": "apostrophe", "grave": "grave_accent", "comma": "comma", "period": "dot",
    "slash": "slash", "plus": "equal", "XF86AudioMute": "audiomute",
    "XF86AudioLowerVolume": "volumedown", "XF86AudioRaiseVolume": "volumeup",
    **{f"F{i}": f"f{i}" for i in range(1, 13)},
}
#: Keysyms that need shift on the US layout.
SHIFTED_KEYSYMS = {"plus", "ISO_Left_Tab"}

#: Printable ASCII → (qcode, shift) on the US layout.
CHAR_KEYS: dict[str, tuple[str, bool]] = {
    **{c: (c, False) for c in "abcdefghijklmnopqrstuvwxyz"},
    **{c.upper(): (c, True) for c in "abcdefghijklmnopqrstuvwxyz"},
    **{str(d): (str(d), False) for d in range(10)},
    " ": ("spc", False), "\n": ("ret", False), "\t": ("tab", False),
    "-": ("minus", False), "_": ("minus", True), "=": ("equal", False), "+": ("equal", True),
    "[": ("bracket_left", False), "{": ("bracket_left", True),
    "]": ("bracket_right", False), "}": ("bracket_right", True),
    "\\": ("backslash", False), "|": ("backslash", True),
    ";": ("semicolon", False), ":": ("semicolon", True),
    "'": ("apostrophe", False), '"': ("apostrophe", True),
    "`": ("grave_accent", False), "~": ("grave_accent", True),
    ",": ("comma", False), "<": ("comma", True), ".": ("dot", False), ">": ("dot", True),
    "/": ("slash", False), "?": ("slash", True),
    "!": ("1", True), "@": ("2", True), "#": ("3", True), "$": ("4", True), "%": ("5", True),
    "^": ("6", True), "&": ("7", True), "*": ("8", True), "(": ("9", True), ")": ("0", True),
}

BUTTONS = {"left": "left", "right": "right", "middle": "middle"}
#: Held modifiers get a moment before and after the buttons they modify: the
#: guest's input stack reads keyboard and pointer as separate devices, and a
#: wheel notch delivered after the modifier's release is an unmodified one.
MOD_GAP_S = 0.05


class UnknownKey(ValueError):
    """A keysym this map cannot send; the message names it."""


@dataclass(frozen=True, slots=True)
class Pause:
    seconds: float


#: One step of a plan: a QMP ``input-send-event`` argument list, or a pause.
Step = list[dict[str, Any]] | Pause


def qcode_of(keysym: str) -> tuple[str, bool]:
    """(qcode, needs shift) for an X11 keysym name or a single character."""
    if keysym in KEYSYM_QCODES:
        return KEYSYM_QCODES[keysym], keysym in SHIFTED_KEYSYMS
    if len(keysym) == 1 and keysym in CHAR_KEYS:
        return CHAR_KEYS[keysym]
    raise UnknownKey(f"no key for {keysym!r} on the rig's keyboard")


def _key(qcode: str, down: bool) -> dict[str, Any]:
    return {"type": "key", "data": {"down": down, "key": {"type": "qcode", "data": qcode}}}


def combo_events(combo: KeyCombo) -> tuple[list[dict[str, Any]], list[dict[str, Any]]]:
    """(press, release): modifiers down in order, the key, then all up in reverse."""
    qcodes: list[str] = []
    for name in combo.modifiers:
        qcodes.append(qcode_of(name)[0])
    key, shift = qcode_of(combo.key)
    if shift and "shift" not in qcodes and "shift_r" not in qcodes:
        qcodes.append("shift")
    qcodes.append(key)
    press = [_key(q, True) for q in qcodes]
    release = [_key(q, False) for q in reversed(qcodes)]
    return press, release


def plan_combos(combos: Sequence[KeyCombo], gap_s: float = 0.02) -> list[Step]:
    """``key``: each combo pressed and released before the next."""
    steps: list[Step] = []
    for i, combo in enumerate(combos):
        press, release = combo_events(combo)
        steps += [press, release]
        if i + 1 < len(combos):
            steps.append(Pause(gap_s))
    return steps


def plan_hold(combo: KeyCombo, seconds: float) -> list[Step]:
    press, release = combo_events(combo)
    return [press, Pause(seconds), release]


@dataclass(frozen=True, slots=True)
class TextRun:
    """A run of text: ``keys`` (typeable as key events) or not (paste it)."""

    text: str
    keys: bool


def split_text(text: str) -> list[TextRun]:
    runs: list[TextRun] = []
    for ch in text:
        typeable = ch in CHAR_KEYS
        if runs and runs[-1].keys == typeable:
            runs[-1] = TextRun(runs[-1].text + ch, typeable)
        else:
            runs.append(TextRun(ch, typeable))
    return runs


def plan_typing(text: str, *, chunk: int = 16) -> list[Step]:
    """Key events for typeable text, ``chunk`` characters per QMP call."""
    steps: list[Step] = []
    batch: list[dict[str, Any]] = []
    for i, ch in enumerate(text):
        qcode, shift = CHAR_KEYS[ch]
        if shift:
            batch.append(_key("shift", True))
        batch += [_key(qcode, True), _key(qcode, False)]
        if shift:
            batch.append(_key("shift", False))
        if (i + 1) % chunk == 0:
            steps.append(batch)
            batch = []
    if batch:
        steps.append(batch)
    return steps


def axis(value: int, size: int) -> int:
    """A guest pixel (0..size-1) on QEMU's 0..32767 absolute axis, rounded up."""
    if size <= 1:
        return 0
    return min(AXIS_MAX, math.ceil(value * AXIS_MAX / (size - 1)))


def move(x: int, y: int, width: int, height: int) -> list[dict[str, Any]]:
    return [
        {"type": "abs", "data": {"axis": "x", "value": axis(x, width)}},
        {"type": "abs", "data": {"axis": "y", "value": axis(y, height)}},
    ]


def button(name: str, down: bool) -> dict[str, Any]:
    return {"type": "btn", "data": {"down": down, "button": BUTTONS.get(name, name)}}


def plan_click(
    point: tuple[int, int] | None, size: tuple[int, int], *, button_name: str = "left",
    clicks: int = 1, modifiers: Iterable[str] = (), gap_s: float = 0.05,
) -> list[Step]:
    """Optionally move, hold modifiers, click ``clicks`` times, release modifiers."""
    steps: list[Step] = []
    if point is not None:
        steps.append(move(point[0], point[1], *size))
    mods = [qcode_of(m)[0] for m in modifiers]
    if mods:
        steps += [[_key(q, True) for q in mods], Pause(MOD_GAP_S)]
    for i in range(clicks):
        steps.append([button(button_name, True)])
        steps.append([button(button_name, False)])
        if i + 1 < clicks:
            steps.append(Pause(gap_s))
    if mods:
        steps += [Pause(MOD_GAP_S), [_key(q, False) for q in reversed(mods)]]
    return steps


def plan_drag(start: tuple[int, int], end: tuple[int, int], size: tuple[int, int],
              *, steps_between: int = 8) -> list[Step]:
    """Press at ``start``, move in small steps (toolkits want motion), release at ``end``."""
    plan: list[Step] = [move(*start, *size), [button("left", True)]]
    for i in range(1, steps_between + 1):
        x = round(start[0] + (end[0] - start[0]) * i / steps_between)
        y = round(start[1] + (end[1] - start[1]) * i / steps_between)
        plan.append(move(x, y, *size))
        plan.append(Pause(0.01))
    plan.append([button("left", False)])
    return plan


WHEEL = {"up": "wheel-up", "down": "wheel-down", "left": "wheel-left", "right": "wheel-right"}
#: Sideways scrolling where the pointing device has no horizontal wheel: shift
#: + the vertical wheel, which GTK, Qt, Chromium and Firefox take as sideways.
#: QEMU 7.2's virtio tablet and usb-tablet drop wheel-left/right silently.
SHIFT_WHEEL = {"left": "wheel-up", "right": "wheel-down"}


def plan_scroll(point: tuple[int, int] | None, size: tuple[int, int], direction: str,
                amount: int, modifiers: Iterable[str] = (), *, hwheel: bool = False) -> list[Step]:
    """Move (optionally), hold modifiers, turn the wheel ``amount`` notches.

    ``hwheel``: the device has a horizontal wheel; without one, left/right
    become shift + wheel up/down (shift is added to the held modifiers).
    """
    steps: list[Step] = []
    if point is not None:
        steps.append(move(point[0], point[1], *size))
    mods = [qcode_of(m)[0] for m in modifiers]
    wheel = WHEEL[direction]
    if direction in SHIFT_WHEEL and not hwheel:
        wheel = SHIFT_WHEEL[direction]
        if "shift" not in mods and "shift_r" not in mods:
            mods.append("shift")
    if mods:
        steps += [[_key(q, True) for q in mods], Pause(MOD_GAP_S)]
    for _ in range(amount):
        steps.append([button(wheel, True)])
        steps.append([button(wheel, False)])
    if mods:
        steps += [Pause(MOD_GAP_S), [_key(q, False) for q in reversed(mods)]]
    return steps
