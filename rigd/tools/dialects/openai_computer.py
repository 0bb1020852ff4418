"""OpenAI's computer-use actions (one ``action`` or several ``actions``) read into a :class:`Call`."""

from __future__ import annotations

import math
from collections.abc import Callable
from typing import Any

from rigd.errors import FieldError
from rigd.model import Tool
from rigd.tools.dialects.base import (
    COMPUTER,
    MAX_BATCH,
    MAX_DRAG_POINTS,
    NOTCH_PX,
    OPENAI_WAIT_S,
    Call,
    Dialect,
    Frame,
    Observe,
    Step,
    _at,
    _held,
    _move,
    _notches,
    _Reader,
    _shot,
)
from rigd.verbs._args import show
from rigd.verbs.base import SCROLL_AMOUNT_MAX
from rigd.verbs.keys import KeySyntaxError, combo_for, split_combo

# --- openai-computer -----------------------------------------------------------------------

OPENAI_ACTIONS: tuple[str, ...] = (
    "click", "double_click", "drag", "keypress", "move", "scroll", "type", "wait", "screenshot",
)
_O_TAKES: dict[str, set[str]] = {
    "click": {"button", "x", "y", "keys"}, "double_click": {"x", "y", "keys"},
    "drag": {"path", "keys"}, "keypress": {"keys"}, "move": {"x", "y", "keys"},
    "scroll": {"x", "y", "scroll_x", "scroll_y", "keys"}, "type": {"text"}, "wait": set(),
    "screenshot": set(),
}
_BUTTONS = {"left": "left_click", "right": "right_click", "wheel": "middle_click"}


def _openai_computer(args: object) -> Call:
    r = _Reader(args, "arguments", Dialect.OPENAI_COMPUTER)
    rig_id = r.rig_id()
    r.only({"action", "actions", "rigId"}, "an OpenAI computer call")
    if r.has("action") == r.has("actions"):
        raise FieldError("arguments", "give action (one computer action) or actions (a list of them), "
                                      "as a computer_call carries them")
    if r.has("action"):
        items: list[tuple[str, object]] = [("arguments.action", r.raw["action"])]
    else:
        batch = r.raw["actions"]
        if not isinstance(batch, list) or not 1 <= len(batch) <= MAX_BATCH:
            raise FieldError("arguments.actions", f"must be a list of 1 to {MAX_BATCH} computer actions")
        items = [(f"arguments.actions[{i}]", a) for i, a in enumerate(batch)]
    steps: list[Step] = []
    names: list[str] = []
    for where, raw in items:
        names.append(_openai_action(_Reader(raw, where, Dialect.OPENAI_COMPUTER), steps))
    steps.append(_shot(items[-1][0]))
    return Call(Dialect.OPENAI_COMPUTER, COMPUTER, Tool.COMPUTER_USE, rig_id, tuple(steps),
                Observe.SCREENSHOT, ", ".join(names))


def _openai_action(a: _Reader, steps: list[Step]) -> str:
    kind = a.raw.get("type")
    if not isinstance(kind, str) or kind not in _O_TAKES:
        a.foreign()
        shown = show(kind) if isinstance(kind, str) else "missing" if kind is None else "not a string"
        raise FieldError(a.name("type"), f"{shown} is not a computer action type; one of "
                                         f"{', '.join(OPENAI_ACTIONS)}")
    a.only({"type", *_O_TAKES[kind]}, f"a {kind} action")
    where = a.where
    held: str | None = None
    keys = a.raw.get("keys")
    if keys is not None and keys != []:
        if kind in ("move", "drag"):
            raise FieldError(a.name("keys"), f"keys held through a {kind} are not supported on a rig's "
                                             "desktop; hold them with a click or scroll, or press them "
                                             "with keypress")
        if kind != "keypress":
            held = _held(a, "keys", [n for name in a.strings("keys") for n in split_combo(name)])
    xy = {"coordinate": "x", "text": "keys" if held else "text"}

    def point() -> Callable[[Frame], list[int]]:
        return _at((a.name("x"), a.name("y")), a.integer("x", 0), a.integer("y", 0))

    if kind in ("click", "double_click"):
        button = "left" if kind == "double_click" else a.raw.get("button") or "left"
        if not isinstance(button, str) or button not in _BUTTONS:
            if button in ("back", "forward"):
                raise FieldError(a.name("button"), f"the {button} mouse button is not on a rig's desktop; "
                                                   f"press keys instead (keypress [\"ALT\", "
                                                   f"\"{'LEFT' if button == 'back' else 'RIGHT'}\"])")
            raise FieldError(a.name("button"), "must be left, right, wheel, back or forward")
        verb = "double_click" if kind == "double_click" else _BUTTONS[str(button)]
        at = point()

        def click(f: Frame) -> dict[str, Any]:
            return {"action": verb, "coordinate": at(f), **({"text": held} if held else {})}

        steps.append(Step(where, click, fields=xy))
    elif kind == "move":
        steps.append(_move(where, point()))
    elif kind == "drag":
        path = _path(a)
        if len(path) == 2:
            (x0, y0, n0), (x1, y1, n1) = path
            s, e = _at(n0, x0, y0), _at(n1, x1, y1)
            steps.append(Step(where, lambda f: {"action": "left_click_drag", "start_coordinate": s(f),
                                                "coordinate": e(f)}))
        else:
            steps.append(_move(where, _at(path[0][2], path[0][0], path[0][1])))
            steps.append(Step(where, lambda _f: {"action": "left_mouse_down"}))
            steps += [_move(where, _at(names, x, y)) for x, y, names in path[1:]]
            steps.append(Step(where, lambda _f: {"action": "left_mouse_up"}))
    elif kind == "keypress":
        names = [n for name in a.strings("keys") for n in split_combo(name)]
        try:
            combo = combo_for(names, "x11")
        except KeySyntaxError as exc:
            raise FieldError(a.name("keys"), str(exc)) from None
        steps.append(Step(where, lambda _f: {"action": "key", "text": combo}))
    elif kind == "scroll":
        at = point()
        dx, dy = a.integer("scroll_x", default=0), a.integer("scroll_y", default=0)
        for d, axis in ((dx, "scroll_x"), (dy, "scroll_y")):
            if abs(d) > 10**6:
                raise FieldError(a.name(axis), "must be a distance of at most 1000000 pixels")
        scrolls = [(d, axis, pos, neg) for d, axis, pos, neg in
                   ((dy, "scroll_y", "down", "up"), (dx, "scroll_x", "right", "left")) if d]
        if not scrolls:
            steps.append(_move(where, at))
        for d, axis, pos, neg in scrolls:
            field_name = a.name(axis)

            def scroll(f: Frame, d: int = d, field_name: str = field_name, pos: str = pos,
                       neg: str = neg) -> dict[str, Any]:
                limit = f"{math.floor(SCROLL_AMOUNT_MAX * NOTCH_PX / f.scale)} pixels of the screenshot"
                out: dict[str, Any] = {"action": "scroll", "coordinate": at(f),
                                       "scroll_direction": pos if d > 0 else neg,
                                       "scroll_amount": _notches(d * f.scale, field_name, limit)}
                return {**out, "text": held} if held else out

            steps.append(Step(where, scroll, fields=xy))
    elif kind == "type":
        text = a.string("text")
        steps.append(Step(where, lambda _f: {"action": "type", "text": text}, fields=xy))
    elif kind == "wait":
        steps.append(Step(where, lambda _f: {"action": "wait", "duration": OPENAI_WAIT_S}))
    return kind


def _path(a: _Reader) -> list[tuple[int, int, tuple[str, str]]]:
    value = a.raw.get("path")
    if not isinstance(value, list) or not 2 <= len(value) <= MAX_DRAG_POINTS:
        raise FieldError(a.name("path"), f"must be a list of 2 to {MAX_DRAG_POINTS} points {{x, y}}")
    out = []
    for i, point in enumerate(value):
        p = _Reader(point, f"{a.name('path')}[{i}]", Dialect.OPENAI_COMPUTER)
        p.only({"x", "y"}, "a path point")
        out.append((p.integer("x", 0), p.integer("y", 0), (p.name("x"), p.name("y"))))
    return out


