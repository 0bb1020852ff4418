"""Keys, text and a person's live-view input → WebDriver BiDi ``input.performActions``, planned without I/O.

Firefox takes input over BiDi as *input sources* (W3C WebDriver, "Actions"): a key
source whose actions name keys by WebDriver key value — a printable grapheme stands for
itself, a named key is a code point of U+E000-U+E05D (:data:`WEBDRIVER_KEYS`) — a
pointer source and a wheel source. One ``input.performActions`` call takes a list of
sources; the browser runs them tick by tick (action *i* of every source in tick *i*).

How this works:

- :func:`press_actions` reads a :class:`~rigd.verbs.keys.KeyCombo` as
  :func:`rigd.browser.dom_keys.plan_press` does (``ControlOrMeta`` is Control: the
  browser runs on Linux; with Shift held a key with a shifted character sends that
  character) and returns the key actions: modifiers down, the key down and up,
  modifiers up in reverse.
- :func:`text_actions` splits text into grapheme clusters, because BiDi takes one
  grapheme per key action: a base character keeps its combining marks, variation
  selectors, emoji modifiers and tag characters, a ZWJ joins two pictographs, regional
  indicators pair into flags. The split errs towards *smaller* pieces (Hangul jamo,
  prepended marks stay apart): each piece is still a whole grapheme, so the browser
  takes it and the page receives the same code points; a piece too large would be
  refused. Newlines, CRLF and a lone CR are Enter; a tab is Tab.
- :func:`plan_bidi` replays a live-view plan (:mod:`rigd.protocols.input`) with the
  contract of :func:`rigd.browser.live_input.plan_cdp` — the same
  :class:`~rigd.browser.live_input.PointerState`, the same
  :class:`~rigd.browser.live_input.Sleep`, the same field errors — but each command is
  a list of sources for one ``performActions`` call. Consecutive actions of one source
  share a source; when the source changes, a new command starts, so the order a person
  acted in is the order the page sees (two sources in one call would run side by side).
  Held keys and buttons stay held between calls: BiDi keeps the input state per
  top-level browsing context until ``input.releaseActions``, and Firefox applies the
  held Shift to a key's character itself (``1`` with Shift held is ``!``), so a key is
  sent by its unshifted value, the same on its way down and up.

Pure: the driver sends what it plans. A key with no WebDriver value is a
:class:`~rigd.errors.FieldError` naming ``action.text`` (the key verb's field) from
:func:`press_actions` and ``key`` from :func:`plan_bidi`, as :func:`plan_cdp` does.
"""

from __future__ import annotations

import dataclasses
import unicodedata
from collections.abc import Sequence
from typing import Any

from rigd.browser.dom_keys import _ALIASES, KEYS_BY_CODE, MODIFIER_BITS
from rigd.browser.live_input import QCODE_CODES, PointerState, Sleep, walk
from rigd.errors import FieldError
from rigd.protocols import input as qin
from rigd.verbs.keys import KeyCombo

#: Input source ids: one of each kind, so held keys and buttons carry across calls.
KEYBOARD_ID = "rigd-keyboard"
MOUSE_ID = "rigd-mouse"
WHEEL_ID = "rigd-wheel"

#: The main Enter key. The spec's table gives U+E006 the code ``Enter`` and U+E007 the
#: code ``NumpadEnter``; Firefox's key data agrees (U+E007 reaches a page as
#: ``code: "NumpadEnter"``), so the Enter a page expects is U+E006.
ENTER = "\ue006"
TAB = "\ue004"


def _webdriver_keys() -> dict[str, str]:
    out: dict[str, str] = {
        "Cancel": "\ue001", "Help": "\ue002", "Backspace": "\ue003", "Tab": TAB,
        "Clear": "\ue005", "Enter": ENTER, "NumpadEnter": "\ue007",
        "Shift": "\ue008", "ShiftLeft": "\ue008", "Control": "\ue009", "ControlLeft": "\ue009",
        "Alt": "\ue00a", "AltLeft": "\ue00a", "Pause": "\ue00b", "Escape": "\ue00c",
        "PageUp": "\ue00e", "PageDown": "\ue00f", "End": "\ue010", "Home": "\ue011",
        "ArrowLeft": "\ue012", "ArrowUp": "\ue013", "ArrowRight": "\ue014", "ArrowDown": "\ue015",
        "Insert": "\ue016", "Delete": "\ue017",
        "NumpadMultiply": "\ue024", "NumpadAdd": "\ue025", "NumpadSubtract": "\ue027",
        "NumpadDecimal": "\ue028", "NumpadDivide": "\ue029",
        "Meta": "\ue03d", "MetaLeft": "\ue03d", "ShiftRight": "\ue050", "ControlRight": "\ue051",
        "AltRight": "\ue052", "MetaRight": "\ue053",
        # U+E00D is a *shifted* space in Firefox's key data: a plain space is itself.
        "Space": " ",
        # Playwright's alias; Control on Linux, as dom_keys reads it.
        "ControlOrMeta": "\ue009",
    }
    out.update({f"Numpad{n}": chr(0xE01A + n) for n in range(10)})
    out.update({f"F{n}": chr(0xE030 + n) for n in range(1, 13)})
    for code, d in KEYS_BY_CODE.items():
        if d.location == 0 and len(d.key) == 1:
            out.setdefault(code, d.key)        # KeyA → a, Digit1 → 1, Backquote → `
            out.setdefault(d.key, d.key)
            if d.shift_key is not None:
                out.setdefault(d.shift_key, d.shift_key)
    # Every code the live view's qcodes reach has a value, except the keys WebDriver
    # has none for (they are refused when pressed).
    unreachable = {"CapsLock", "NumLock", "ScrollLock", "PrintScreen", "ContextMenu"}
    missing = sorted(c for c in QCODE_CODES.values() if c not in out and c not in unreachable)
    assert not missing, missing
    return out


#: DOM key names (``KeyboardEvent.key`` values and Playwright's code names) → WebDriver
#: key values. Any other single printable character is its own value
#: (:func:`webdriver_key`). Keys WebDriver has no value for (CapsLock, NumLock,
#: ScrollLock, PrintScreen, ContextMenu, AltGraph, media keys) are absent.
WEBDRIVER_KEYS: dict[str, str] = _webdriver_keys()


def webdriver_key(name: str) -> str | None:
    """The WebDriver key value for a DOM key name or a printable character; None if none."""
    value = WEBDRIVER_KEYS.get(name)
    if value is None and len(name) == 1 and name.isprintable():
        value = name
    return value


def _down(value: str) -> dict[str, Any]:
    return {"type": "keyDown", "value": value}


def _up(value: str) -> dict[str, Any]:
    return {"type": "keyUp", "value": value}


def press_actions(combo: KeyCombo) -> list[dict[str, Any]]:
    """Key-source actions that press ``combo`` once (modifiers down, key, modifiers up)."""
    mods: list[str] = []
    for name in combo.modifiers:
        value = webdriver_key(name)
        if value is None:
            raise FieldError("action.text", f"Firefox has no key for the modifier {name!r}")
        mods.append(value)
    shift = WEBDRIVER_KEYS["Shift"] in mods
    key = combo.key
    d = KEYS_BY_CODE.get(_ALIASES.get(key, key))
    if shift and d is not None and d.shift_key is not None:
        value = d.shift_key                    # Shift+KeyA → A, Shift+Digit1 → !
    else:
        found = webdriver_key(key)
        if found is None:
            raise FieldError("action.text", f"{key!r} is a key Firefox cannot press "
                                            "(WebDriver has no value for it)")
        value = found
    return [*map(_down, mods), _down(value), _up(value), *map(_up, reversed(mods))]


# -- text → graphemes ------------------------------------------------------------------

_ZWJ = 0x200D


def _is_regional(cp: int) -> bool:
    return 0x1F1E6 <= cp <= 0x1F1FF


#: Extended_Pictographic (Unicode emoji-data), as ranges: what a ZWJ joins.
_PICTOGRAPHIC: tuple[tuple[int, int], ...] = (
    (0x00A9, 0x00A9), (0x00AE, 0x00AE), (0x203C, 0x203C), (0x2049, 0x2049),
    (0x2122, 0x2122), (0x2139, 0x2139), (0x2194, 0x2199), (0x21A9, 0x21AA),
    (0x231A, 0x231B), (0x2328, 0x2328), (0x2388, 0x2388), (0x23CF, 0x23CF),
    (0x23E9, 0x23F3), (0x23F8, 0x23FA), (0x24C2, 0x24C2), (0x25AA, 0x25AB),
    (0x25B6, 0x25B6), (0x25C0, 0x25C0), (0x25FB, 0x25FE), (0x2600, 0x2605),
    (0x2607, 0x2612), (0x2614, 0x2685), (0x2690, 0x2705), (0x2708, 0x2712),
    (0x2714, 0x2714), (0x2716, 0x2716), (0x271D, 0x271D), (0x2721, 0x2721),
    (0x2728, 0x2728), (0x2733, 0x2734), (0x2744, 0x2744), (0x2747, 0x2747),
    (0x274C, 0x274C), (0x274E, 0x274E), (0x2753, 0x2755), (0x2757, 0x2757),
    (0x2763, 0x2767), (0x2795, 0x2797), (0x27A1, 0x27A1), (0x27B0, 0x27B0),
    (0x27BF, 0x27BF), (0x2934, 0x2935), (0x2B05, 0x2B07), (0x2B1B, 0x2B1C),
    (0x2B50, 0x2B50), (0x2B55, 0x2B55), (0x3030, 0x3030), (0x303D, 0x303D),
    (0x3297, 0x3297), (0x3299, 0x3299),
    (0x1F000, 0x1F0FF), (0x1F10D, 0x1F10F), (0x1F12F, 0x1F12F), (0x1F16C, 0x1F171),
    (0x1F17E, 0x1F17F), (0x1F18E, 0x1F18E), (0x1F191, 0x1F19A), (0x1F1AD, 0x1F1E5),
    (0x1F201, 0x1F20F), (0x1F21A, 0x1F21A), (0x1F22F, 0x1F22F), (0x1F232, 0x1F23A),
    (0x1F23C, 0x1F23F), (0x1F249, 0x1F3FA), (0x1F400, 0x1F53D), (0x1F546, 0x1F64F),
    (0x1F680, 0x1F6FF), (0x1F774, 0x1F77F), (0x1F7D5, 0x1F7FF), (0x1F80C, 0x1F80F),
    (0x1F848, 0x1F84F), (0x1F85A, 0x1F85F), (0x1F888, 0x1F88F), (0x1F8AE, 0x1F8FF),
    (0x1F90C, 0x1F93A), (0x1F93C, 0x1F945), (0x1F947, 0x1FAFF), (0x1FC00, 0x1FFFD),
)


def _is_pictographic(cp: int) -> bool:
    return any(lo <= cp <= hi for lo, hi in _PICTOGRAPHIC)


def _extends(ch: str) -> bool:
    """Whether ``ch`` stays with the character before it (UAX #29 Extend, SpacingMark, ZWJ)."""
    cp = ord(ch)
    return (unicodedata.combining(ch) != 0
            or unicodedata.category(ch) in ("Mn", "Me", "Mc")
            or 0xFE00 <= cp <= 0xFE0F or 0xE0100 <= cp <= 0xE01EF   # variation selectors
            or 0x1F3FB <= cp <= 0x1F3FF                              # emoji skin tones
            or 0xE0020 <= cp <= 0xE007F                              # emoji tag characters
            or cp in (0x200C, _ZWJ))


def _is_control(ch: str) -> bool:
    # C0, DEL and C1 (Cc), and lone surrogates, which are no characters at all.
    return unicodedata.category(ch) in ("Cc", "Cs")


def graphemes(text: str, *, field: str = "action.text") -> list[str]:
    """``text`` as key values, one grapheme each: CRLF, CR and LF are Enter, a tab is Tab.

    A control character other than those is a :class:`FieldError` naming ``field``
    (with its position, never the text).
    """
    out: list[str] = []
    cluster = ""          # the grapheme being built
    pictograph = False    # it started with a pictograph (so a ZWJ may join another)
    join_next = False     # it ends with ZWJ after a pictograph
    i = 0
    while i < len(text):
        ch = text[i]
        cp = ord(ch)
        if ch in "\r\n\t":
            if cluster:
                out.append(cluster)
            cluster, pictograph, join_next = "", False, False
            out.append(TAB if ch == "\t" else ENTER)
            i += 2 if text.startswith("\r\n", i) else 1
            continue
        if _is_control(ch):
            raise FieldError(field, f"character {i} is the control character U+{cp:04X}, which no "
                                    "key types (send Escape, Backspace and the like with the key "
                                    "action)")
        joins = bool(cluster) and (
            _extends(ch)
            or (join_next and _is_pictographic(cp))
            or (_is_regional(cp) and _is_regional(ord(cluster[-1]))
                and sum(_is_regional(ord(c)) for c in cluster) % 2 == 1))
        if joins:
            cluster += ch
            join_next = pictograph and cp == _ZWJ
        else:
            if cluster:
                out.append(cluster)
            cluster, pictograph, join_next = ch, _is_pictographic(cp), False
        i += 1
    if cluster:
        out.append(cluster)
    return out


def text_actions(text: str, *, field: str = "action.text") -> list[dict[str, Any]]:
    """Key-source actions that type ``text``: keyDown and keyUp per grapheme (:func:`graphemes`)."""
    return [a for g in graphemes(text, field=field) for a in (_down(g), _up(g))]


# -- the live view's plan --------------------------------------------------------------

#: One ``input.performActions`` call (its ``actions`` list of sources), or a pause.
Command = list[dict[str, Any]] | Sleep

#: BiDi pointer button numbers (``MouseEvent.button``).
_BUTTON_NUMBERS = {"left": 0, "middle": 1, "right": 2}


def _source(kind: str) -> dict[str, Any]:
    if kind == "pointer":
        return {"type": "pointer", "id": MOUSE_ID, "parameters": {"pointerType": "mouse"},
                "actions": []}
    if kind == "wheel":
        return {"type": "wheel", "id": WHEEL_ID, "actions": []}
    return {"type": "key", "id": KEYBOARD_ID, "actions": []}


class _Plan:
    """Commands being built: actions go to the open source while its kind continues."""

    def __init__(self) -> None:
        self.out: list[Command] = []
        self._open: dict[str, Any] | None = None

    def add(self, kind: str, *actions: dict[str, Any]) -> None:
        if self._open is None or self._open["type"] != kind:
            self._open = _source(kind)
            self.out.append([self._open])
        self._open["actions"].extend(actions)

    def sleep(self, seconds: float) -> None:
        self.out.append(Sleep(seconds))
        self._open = None

    # -- the gestures of rigd.browser.live_input.walk --

    def text(self, step: qin.Text) -> None:
        self.add("key", *text_actions(step.text, field=step.field))

    def move(self, s: PointerState) -> None:
        self.add("pointer", _move(s))

    def wheel(self, s: PointerState, dx: int, dy: int) -> None:
        self.add("wheel", {"type": "scroll", "x": s.x, "y": s.y, "deltaX": dx, "deltaY": dy})

    def button(self, s: PointerState, name: str, down: bool) -> None:
        self.add("pointer", {"type": "pointerDown" if down else "pointerUp", "button": _BUTTON_NUMBERS[name]})

    def key(self, qcode: str, down: bool, s: PointerState) -> PointerState:
        value, bit = _key_value(qcode)
        self.add("key", (_down if down else _up)(value))
        return dataclasses.replace(s, modifiers=s.modifiers | bit if down else s.modifiers & ~bit)


def _move(s: PointerState) -> dict[str, Any]:
    return {"type": "pointerMove", "x": s.x, "y": s.y, "origin": "viewport"}


def _key_value(qcode: str) -> tuple[str, int]:
    """(WebDriver value, CDP modifier bit) of a qcode's key, unshifted."""
    code = QCODE_CODES.get(qcode)
    value = WEBDRIVER_KEYS.get(code) if code is not None else None
    if code is None or value is None:
        raise FieldError("key", f"the browser has no key for {qcode!r}")
    return value, MODIFIER_BITS.get(KEYS_BY_CODE[code].key, 0)


def plan_bidi(steps: Sequence[qin.Step], viewport: tuple[int, int],
              state: PointerState) -> tuple[list[Command], PointerState]:
    """The ``performActions`` source lists that replay ``steps`` on a ``viewport``-sized page,
    and the state after (see :func:`rigd.browser.live_input.plan_cdp`)."""
    plan = _Plan()
    after = walk(steps, viewport, state, plan)
    return plan.out, after


__all__ = [
    "ENTER", "KEYBOARD_ID", "MOUSE_ID", "TAB", "WEBDRIVER_KEYS", "WHEEL_ID", "Command",
    "PointerState", "Sleep", "graphemes", "plan_bidi", "press_actions", "text_actions",
    "webdriver_key",
]
