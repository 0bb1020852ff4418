"""A person's live-view input → CDP ``Input.*`` commands, planned without I/O.

The live view plans what a person does as hypervisor input (:mod:`rigd.protocols.input`:
QMP absolute axes, buttons, wheel notches, key qcodes, text). A browser rig has no
hypervisor pointer — its engine is headless — so the same plan is replayed through the
engine's input API instead: :func:`plan_cdp` turns it into ``Input.dispatchMouseEvent``,
``Input.dispatchKeyEvent`` and ``Input.insertText`` params against a :class:`PointerState`
(where the pointer is, which buttons and modifiers are held), which it returns updated.

Pure: the driver sends what it plans. Anything the plan holds that a page cannot take
(an unknown key, a keymap binding) is a :class:`~rigd.errors.FieldError` naming ``key``.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any, Protocol

from rigd.browser.dom_keys import KEYS_BY_CODE, MODIFIER_BITS
from rigd.errors import FieldError
from rigd.protocols import input as qin

#: One wheel notch, in CSS pixels (Chromium's own tick).
WHEEL_PX = 100
_WHEEL = {"wheel-up": (0, -WHEEL_PX), "wheel-down": (0, WHEEL_PX),
          "wheel-left": (-WHEEL_PX, 0), "wheel-right": (WHEEL_PX, 0)}
#: CDP's ``buttons`` bitmask.
_BUTTON_BITS = {"left": 1, "right": 2, "middle": 4}


def _qcode_codes() -> dict[str, str]:
    out = {c: f"Key{c.upper()}" for c in "abcdefghijklmnopqrstuvwxyz"}
    out.update({str(n): f"Digit{n}" for n in range(10)})
    out.update({f"f{n}": f"F{n}" for n in range(1, 13)})
    out.update({f"kp_{n}": f"Numpad{n}" for n in range(10)})
    out.update({
        "ret": "Enter", "kp_enter": "NumpadEnter", "spc": "Space", "tab": "Tab", "esc": "Escape",
        "backspace": "Backspace", "delete": "Delete", "insert": "Insert", "home": "Home", "end": "End",
        "pgup": "PageUp", "pgdn": "PageDown", "up": "ArrowUp", "down": "ArrowDown",
        "left": "ArrowLeft", "right": "ArrowRight", "shift": "ShiftLeft", "shift_r": "ShiftRight",
        "ctrl": "ControlLeft", "ctrl_r": "ControlRight", "alt": "AltLeft", "alt_r": "AltRight",
        "meta_l": "MetaLeft", "meta_r": "MetaRight", "menu": "ContextMenu", "caps_lock": "CapsLock",
        "num_lock": "NumLock", "scroll_lock": "ScrollLock", "print": "PrintScreen", "pause": "Pause",
        "minus": "Minus", "equal": "Equal", "bracket_left": "BracketLeft",
        "bracket_right": "BracketRight", "semicolon": "Semicolon", "apostrophe": "Quote",
        "grave_accent": "Backquote", "backslash": "Backslash", "comma": "Comma", "dot": "Period",
        "slash": "Slash", "kp_add": "NumpadAdd", "kp_subtract": "NumpadSubtract",
        "kp_multiply": "NumpadMultiply", "kp_divide": "NumpadDivide", "kp_decimal": "NumpadDecimal",
    })
    missing = sorted(code for code in out.values() if code not in KEYS_BY_CODE)
    assert not missing, missing
    return out


#: QEMU qcode → DOM ``code`` (the US layout the live view's keysyms are planned on).
QCODE_CODES: dict[str, str] = _qcode_codes()


@dataclass(frozen=True, slots=True)
class PointerState:
    """Where the pointer is (CSS px of the viewport) and what is held."""

    x: int = 0
    y: int = 0
    #: CDP ``buttons`` bits held.
    buttons: int = 0
    #: CDP modifier bits held.
    modifiers: int = 0


@dataclass(frozen=True, slots=True)
class Sleep:
    seconds: float


Command = tuple[str, dict[str, Any]] | Sleep


def _from_axis(value: object, size: int) -> int:
    if not isinstance(value, int):
        raise FieldError("x", "an absolute axis value must be an integer")
    return max(0, min(size - 1, round(value * (size - 1) / qin.AXIS_MAX)))


def _mouse(kind: str, s: PointerState, **extra: Any) -> tuple[str, dict[str, Any]]:
    return "Input.dispatchMouseEvent", {"type": kind, "x": s.x, "y": s.y, "buttons": s.buttons,
                                        "modifiers": s.modifiers, **extra}


def _key(qcode: str, down: bool, s: PointerState) -> tuple[list[Command], PointerState]:
    code = QCODE_CODES.get(qcode)
    if code is None:
        raise FieldError("key", f"the browser has no key for {qcode!r}")
    d = KEYS_BY_CODE[code]
    bit = MODIFIER_BITS.get(d.key, 0)
    held = s.modifiers | bit if down else s.modifiers & ~bit
    shift = bool(held & MODIFIER_BITS["Shift"])
    key = d.shift_key if shift and d.shift_key else d.key
    text = d.text if d.text is not None else (key if len(key) == 1 else "")
    # Printable characters come as text from the live view; a key types only without
    # Control, Alt or Meta held (those are shortcuts), as Playwright's press does.
    typing = down and bool(text) and not held & (MODIFIER_BITS["Control"] | MODIFIER_BITS["Alt"]
                                                 | MODIFIER_BITS["Meta"])
    params: dict[str, Any] = {
        "type": ("keyDown" if typing else "rawKeyDown") if down else "keyUp",
        "modifiers": held, "key": key, "code": d.code, "windowsVirtualKeyCode": d.key_code,
        "location": d.location,
    }
    if d.location == 3:
        params["isKeypad"] = True
    if typing:
        params["text"] = params["unmodifiedText"] = text
    return [("Input.dispatchKeyEvent", params)], dataclasses.replace(s, modifiers=held)


class InputPlan(Protocol):
    """Where :func:`walk` puts each gesture, in an engine's own terms."""

    def sleep(self, seconds: float) -> None: ...

    def text(self, step: qin.Text) -> None: ...

    def move(self, s: PointerState) -> None: ...

    def wheel(self, s: PointerState, dx: int, dy: int) -> None: ...

    def button(self, s: PointerState, name: str, down: bool) -> None:
        """``name`` went down or up; ``s`` is the state after."""
        ...

    def key(self, qcode: str, down: bool, s: PointerState) -> PointerState:
        """A key went down or up; the state after (its modifiers)."""
        ...


def walk(steps: Sequence[qin.Step], viewport: tuple[int, int], state: PointerState,
         plan: InputPlan) -> PointerState:
    """Put ``steps`` (on a ``viewport``-sized page) into ``plan`` as gestures; the state after.
    An absolute move is one gesture once both axes of a step are read."""
    w, h = viewport
    s = state
    for step in steps:
        if isinstance(step, qin.Pause):
            plan.sleep(step.seconds)
            continue
        if isinstance(step, qin.Text):
            plan.text(step)
            continue
        if isinstance(step, qin.Bind):
            raise FieldError("key", "a browser takes text as text, not through keymap bindings")
        moved = False
        for event in step:
            kind, data = event.get("type"), event.get("data") or {}
            if kind == "abs":
                if data.get("axis") == "x":
                    s = dataclasses.replace(s, x=_from_axis(data.get("value"), w))
                else:
                    s = dataclasses.replace(s, y=_from_axis(data.get("value"), h))
                moved = True
                continue
            if moved:
                plan.move(s)
                moved = False
            if kind == "btn":
                name = str(data.get("button"))
                down = bool(data.get("down"))
                if name in _WHEEL:
                    if down:
                        plan.wheel(s, *_WHEEL[name])
                    continue
                if name not in _BUTTON_BITS:
                    raise FieldError("button", f"the browser has no {name!r} button")
                bit = _BUTTON_BITS[name]
                s = dataclasses.replace(s, buttons=s.buttons | bit if down else s.buttons & ~bit)
                plan.button(s, name, down)
            elif kind == "key":
                key = data.get("key") or {}
                if key.get("type") != "qcode" or not isinstance(key.get("data"), str):
                    raise FieldError("key", "a browser takes keys by qcode")
                s = plan.key(key["data"], bool(data.get("down")), s)
            else:
                raise FieldError("type", f"the browser cannot replay a {kind!r} input event")
        if moved:
            plan.move(s)
    return s


class _CdpPlan:
    def __init__(self) -> None:
        self.out: list[Command] = []

    def sleep(self, seconds: float) -> None:
        self.out.append(Sleep(seconds))

    def text(self, step: qin.Text) -> None:
        self.out.append(("Input.insertText", {"text": step.text}))

    def move(self, s: PointerState) -> None:
        self.out.append(_mouse("mouseMoved", s, button=_held_button(s)))

    def wheel(self, s: PointerState, dx: int, dy: int) -> None:
        self.out.append(_mouse("mouseWheel", s, deltaX=dx, deltaY=dy))

    def button(self, s: PointerState, name: str, down: bool) -> None:
        self.out.append(_mouse("mousePressed" if down else "mouseReleased", s, button=name, clickCount=1))

    def key(self, qcode: str, down: bool, s: PointerState) -> PointerState:
        cmds, s = _key(qcode, down, s)
        self.out.extend(cmds)
        return s


def plan_cdp(steps: Sequence[qin.Step], viewport: tuple[int, int],
             state: PointerState) -> tuple[list[Command], PointerState]:
    """The CDP commands that replay ``steps`` on a ``viewport``-sized page, and the state after."""
    plan = _CdpPlan()
    after = walk(steps, viewport, state, plan)
    return plan.out, after


def _held_button(s: PointerState) -> str:
    for name, bit in _BUTTON_BITS.items():
        if s.buttons & bit:
            return name
    return "none"


__all__ = ["QCODE_CODES", "WHEEL_PX", "Command", "InputPlan", "PointerState", "Sleep", "plan_cdp", "walk"]
