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
- characters with no key on that layout (``é``, ``世``) are typed as
  xdotool types them: the guest agent binds a spare keycode to the
  character's keysym (``keymap_bind``) and the host presses that keycode
  through QMP. :func:`plan_text` plans it against a :class:`Keymap` — what
  the host has bound so far, least recently used first — and returns the
  keymap after the plan; bindings stay (they are never restored), so text
  that reuses a character binds nothing.

How :func:`plan_text` batches: it walks the text in order, giving each
character outside the US map the spare key already bound to its keysym, else
an unbound spare key, else the least recently used bound key that this batch
has not pressed. When every spare key is taken by the batch, the batch is
closed: one :class:`Bind` with all of its new bindings, then its key presses
(US-map characters included, in order). A batch that takes a key away from
an earlier binding waits :data:`REBIND_SETTLE_S` first, because X clients
translate keycodes with their own copy of the map and some fetch it lazily:
a press still unhandled when its key is rebound would be read as the new
character. See docs/decisions.md ("Typing every character").
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
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


def _press(qcode: str, shift: bool) -> list[dict[str, Any]]:
    events = [_key(qcode, True), _key(qcode, False)]
    return [_key("shift", True), *events, _key("shift", False)] if shift else events


#: Keys per QMP call when typing. QEMU's virtio-input queues one call's events
#: as one report and drops the *whole* report when the guest's event queue (64
#: buffers) has less room than it needs: 16 shifted characters (65 events) were
#: lost outright under TCG (bench/lanes.py). Four keys are at most 16 events.
TYPE_CHUNK = 4
#: Between two calls, time for the guest to hand the buffers back (xdotool waits
#: 12 ms between keys by default; this is 10 ms between four).
TYPE_PACE_S = 0.01


def _press_steps(keys: Sequence[tuple[str, bool]], chunk: int) -> list[Step]:
    """Key presses, ``chunk`` keys per QMP call, paced."""
    steps: list[Step] = []
    for i in range(0, len(keys), chunk):
        if steps:
            steps.append(Pause(TYPE_PACE_S))
        steps.append([e for qcode, shift in keys[i:i + chunk] for e in _press(qcode, shift)])
    return steps


def plan_typing(text: str, *, chunk: int = TYPE_CHUNK) -> list[Step]:
    """Key events for text of the US map alone (every character in :data:`CHAR_KEYS`)."""
    return _press_steps([CHAR_KEYS[ch] for ch in text], chunk)


# -- characters outside the US map: spare keycodes bound to keysyms ------------------


@dataclass(frozen=True, slots=True)
class SpareKey:
    """A key the host may rebind: its QMP qcode and the X keycode it reaches."""

    qcode: str
    #: The Linux evdev code QEMU's keyboard sends for ``qcode``.
    linux: int

    @property
    def keycode(self) -> int:
        """Xorg's keycode for it (evdev + 8, as xf86-input-libinput and -evdev number keys)."""
        return self.linux + 8


#: Rarely used keys that US applications give no meaning to, each reaching its
#: own X keycode: (qcode, Linux code). QEMU 7.2's QKeyCode has no f13-f24.
#: The Linux codes are QEMU's qcode -> Linux table (keycodemapdb
#: ``data/keymaps.csv``, columns "QEMU QKeyCode" and "Linux Keycode"; for
#: these keys unchanged from d21009b, 2021, which added lang1/lang2, to its
#: head 22b8996), checked against the table compiled into this host's
#: qemu-system-x86_64 7.2.22; with virtio-keyboard QEMU sends exactly that
#: code. Left out: power/sleep/wake, launchers and media keys (the desktop
#: acts on them), compose/menu, and the editing keys (XF86Copy/Cut/Paste,
#: Undo, Redo/Again): were a binding ever stale (an X server that restarted,
#: a guest program that reset the map), pressing the key would edit text or
#: overwrite the clipboard instead of typing. Each comment names the X
#: keycode and the keysym a pc105/us map gives it before it is rebound.
SPARE_KEYS: tuple[SpareKey, ...] = tuple(SpareKey(q, code) for q, code in (
    ("props", 130),             # X 138 (SunProps)
    ("front", 132),             # X 140 (SunFront)
    ("lang1", 122),             # X 130 (Hangul)
    ("lang2", 123),             # X 131 (Hangul_Hanja)
    ("henkan", 92),             # X 100 (Henkan_Mode)
    ("muhenkan", 94),           # X 102 (Muhenkan)
    ("katakanahiragana", 93),   # X 101 (Hiragana_Katakana)
    ("hiragana", 91),           # X 99 (Hiragana)
    ("ro", 89),                 # X 97 (AB11: no keysym on the US layout)
    ("yen", 124),               # X 132 (AE13: no keysym on the US layout)
    ("kp_comma", 121),          # X 129 (KP_Decimal)
    ("stop", 128),              # X 136 (Cancel)
    ("help", 138),              # X 146 (Help)
    ("find", 136),              # X 144 (Find)
    ("open", 134),              # X 142 (XF86Open)
))
#: usb-kbd (``input="usb"``) reaches a key only through QEMU's qcode -> PS/2
#: set 1 -> HID usage tables (hw/input/hid.c), then Linux's HID usage -> key
#: table (hid-input.c ``hid_keyboard``). In QEMU 7.2 (the tables compiled into
#: this host's binary) props, front, lang1, lang2, hiragana, stop, help and
#: find map to no usage at all (the event is dropped), open becomes F24 (a
#: different X keycode), and kp_comma becomes the right Super key. Five reach
#: the same X keycode as on virtio (International1-5 usages 0x87-0x8b -> RO,
#: KATAKANAHIRAGANA, YEN, HENKAN, MUHENKAN), so a usb keyboard types with
#: those, in smaller batches.
USB_SPARE_QCODES = frozenset({"ro", "katakanahiragana", "henkan", "muhenkan", "yen"})
#: The spare keys each keyboard of the desktop (``desktop_argv(input=...)``) reaches.
SPARE_KEYS_BY_INPUT: dict[str, tuple[SpareKey, ...]] = {
    "virtio": SPARE_KEYS,
    "usb": tuple(k for k in SPARE_KEYS if k.qcode in USB_SPARE_QCODES),
}
#: The agent's ``keymap_bind`` takes at most this many pairs.
MAX_BIND = 32
#: How long a batch that takes a key from an earlier binding waits before
#: rebinding it, so clients have handled the presses made with the old one.
REBIND_SETTLE_S = 0.3
#: A keysym no character has: a key bound to it is in an unknown state (a plan
#: failed midway) and is rebound, after the settle, before it is pressed again.
UNKNOWN_KEYSYM = -1


def keysym_of(ch: str) -> int | None:
    """The X keysym that types ``ch``; None for a character no key types.

    Latin-1 (U+00A0-U+00FF) keysyms are the code point; every other character
    is the Unicode keysym 0x01000000 + code point. Controls (C0, DEL, C1) and
    surrogates have none; ``\\n``, ``\\t`` and ``\\r`` are keys of the US map.
    """
    cp = ord(ch)
    if cp < 0x20 or 0x7F <= cp < 0xA0 or 0xD800 <= cp <= 0xDFFF:
        return None
    if cp <= 0xFF:
        return cp
    return 0x01000000 + cp


class Untypeable(ValueError):
    """Text with characters no key types; ``positions`` are their indexes (never the text)."""

    def __init__(self, positions: Sequence[int], reason: str) -> None:
        super().__init__(reason)
        self.positions = tuple(positions)
        self.reason = reason


@dataclass(frozen=True, slots=True)
class Bind:
    """Agent ``keymap_bind``: (X keycode, keysym) pairs, bound before the presses after it.

    ``typed_before``: how many keys the plan has pressed for the text by then
    (a CRLF is one), so a failed bind can say how far the text got."""

    pairs: tuple[tuple[int, int], ...] = field(repr=False)
    typed_before: int = 0


@dataclass(frozen=True, slots=True)
class Text:
    """Type ``text``; the machine plans it (:func:`plan_text`) against its
    keymap when it sends it, under its input lock. ``field`` names the request
    field a refusal points at."""

    text: str = field(repr=False)
    field: str = "text"


#: One step of a plan: a QMP ``input-send-event`` argument list, a pause, a
#: ``keymap_bind`` through the agent, or text the machine plans when it sends it.
Step = list[dict[str, Any]] | Pause | Bind | Text


@dataclass(frozen=True, slots=True)
class Keymap:
    """What the host has bound on a machine's spare keys: (key, keysym), least recently used first."""

    pool: tuple[SpareKey, ...]
    #: Keysyms are what was typed: kept out of reprs (and so out of logs).
    bound: tuple[tuple[SpareKey, int], ...] = field(default=(), repr=False)

    def __post_init__(self) -> None:
        if len(self.pool) > MAX_BIND:  # one batch binds at most the whole pool
            raise ValueError(f"a keymap pool holds at most {MAX_BIND} keys")

    def unsure(self) -> Keymap:
        """Every spare key in an unknown state (after a plan that did not finish)."""
        return Keymap(self.pool, tuple((k, UNKNOWN_KEYSYM) for k in self.pool))


@dataclass(frozen=True, slots=True)
class TextPlan:
    steps: list[Step]
    #: The keymap once the plan has been sent.
    keymap: Keymap
    #: Whether any character went through a spare key.
    keymap_used: bool


def key_text(text: str) -> str:
    """The text as keys see it: CRLF and a lone CR are one Return each."""
    return text.replace("\r\n", "\n").replace("\r", "\n")


def needs_keymap(text: str) -> bool:
    """Whether some character of ``text`` has no key on the US map."""
    return any(ch not in CHAR_KEYS for ch in key_text(text))


def off_map(text: str) -> list[int]:
    """Indexes (in ``text``) of characters with no key on the US map."""
    return [i for i, ch in enumerate(text) if ch not in CHAR_KEYS and ch != "\r"]


def untypeable(text: str) -> list[int]:
    """Indexes (in ``text``) of characters with neither a US key nor a keysym."""
    return [i for i, ch in enumerate(text)
            if ch not in CHAR_KEYS and ch != "\r" and keysym_of(ch) is None]


def plan_text(text: str, keymap: Keymap, *, chunk: int = TYPE_CHUNK,
              settle_s: float = REBIND_SETTLE_S) -> TextPlan:
    """Every character of ``text``, in order, as key presses (see the module doc).

    Raises :class:`Untypeable` before planning anything when a character has
    no key (a control character, or any character outside the US map when
    ``keymap`` has no spare keys).
    """
    bad = untypeable(text)
    if bad:
        raise Untypeable(bad, "control characters have no key (send Escape, BackSpace and "
                              "the like with the key action)")
    chars = key_text(text)
    if not keymap.pool and needs_keymap(text):
        raise Untypeable(off_map(text), "this keyboard has no spare keys to bind")
    lru: dict[SpareKey, int] = dict(keymap.bound)     # key -> keysym, least recent first
    by_sym = {sym: key for key, sym in lru.items()}
    unbound = [k for k in keymap.pool if k not in lru]
    steps: list[Step] = []
    presses: list[tuple[str, bool]] = []
    pairs: list[tuple[int, int]] = []
    taken: set[SpareKey] = set()   # keys this batch presses: not rebound within it
    evicts = False
    typed = 0                      # keys pressed in the batches already closed
    used = False

    def close_batch() -> None:
        nonlocal evicts, typed
        if pairs:
            if evicts:
                steps.append(Pause(settle_s))
            steps.append(Bind(tuple(pairs), typed_before=typed))
        steps.extend(_press_steps(presses, chunk))
        typed += len(presses)
        presses.clear()
        pairs.clear()
        taken.clear()
        evicts = False

    for ch in chars:
        if ch in CHAR_KEYS:
            presses.append(CHAR_KEYS[ch])
            continue
        sym = keysym_of(ch)
        assert sym is not None  # untypeable() refused the rest
        used = True
        key = by_sym.get(sym)
        if key is None:
            if unbound:
                key = unbound.pop(0)
            else:
                free = next((k for k in lru if k not in taken), None)
                if free is None:
                    close_batch()
                    free = next(iter(lru))
                key = free
                by_sym.pop(lru.pop(key), None)
                evicts = True
            pairs.append((key.keycode, sym))
            by_sym[sym] = key
        lru.pop(key, None)
        lru[key] = sym  # now the most recently used
        taken.add(key)
        presses.append((key.qcode, False))
    close_batch()
    return TextPlan(steps, Keymap(keymap.pool, tuple(lru.items())), used)


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
