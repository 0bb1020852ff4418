"""Anthropic's ``computer`` tool (``computer_20250124``/``computer_20251124``) read into a :class:`Call`."""

from __future__ import annotations

from typing import Any

from rigd.errors import FieldError
from rigd.model import Tool
from rigd.tools.dialects.base import (
    COMPUTER,
    Call,
    Dialect,
    Frame,
    Observe,
    Step,
    _at,
    _held,
    _keys,
    _move,
    _Reader,
    _shot,
)
from rigd.verbs._args import is_int, show
from rigd.verbs.keys import split_combo

# --- anthropic -----------------------------------------------------------------------------

ANTHROPIC_ACTIONS: tuple[str, ...] = (
    "screenshot", "cursor_position", "mouse_move", "left_click", "right_click", "middle_click",
    "double_click", "triple_click", "left_mouse_down", "left_mouse_up", "left_click_drag",
    "scroll", "key", "hold_key", "type", "wait", "zoom",
)
_A_FIELDS = {"coordinate": "coordinate", "start_coordinate": "start_coordinate", "text": "text",
             "scroll_direction": "scroll_direction", "scroll_amount": "scroll_amount",
             "duration": "duration"}
_A_TAKES: dict[str, set[str]] = {
    "screenshot": set(), "cursor_position": set(), "mouse_move": {"coordinate"},
    **{v: {"coordinate", "text"} for v in ("left_click", "right_click", "middle_click", "double_click",
                                           "triple_click")},
    "left_mouse_down": {"coordinate"}, "left_mouse_up": {"coordinate"},
    "left_click_drag": {"start_coordinate", "coordinate"},
    "scroll": {"coordinate", "scroll_direction", "scroll_amount", "text"},
    "key": {"text"}, "hold_key": {"text", "duration"}, "type": {"text"}, "wait": {"duration"},
    "zoom": {"region"},
}




def _anthropic(args: object) -> Call:
    r = _Reader(args, "arguments", Dialect.ANTHROPIC)
    rig_id = r.rig_id()
    verb = r.raw.get("action")
    if not isinstance(verb, str) or verb not in _A_TAKES:
        r.foreign()
        shown = show(verb) if isinstance(verb, str) else "missing" if verb is None else "not a string"
        raise FieldError("arguments.action", f"{shown} is not an action of the computer tool; one of "
                                             f"{', '.join(ANTHROPIC_ACTIONS)}")
    r.only({"action", "rigId", *_A_TAKES[verb]}, f"the {verb} action")
    where = "arguments"
    steps: list[Step] = []
    pt = _at(r.name("coordinate"), *r.pair("coordinate")) if r.has("coordinate") else None
    passed: dict[str, Any] = {k: r.raw[k] for k in ("scroll_direction", "scroll_amount", "duration")
                              if r.has(k)}
    observe = Observe.SCREENSHOT
    region = None
    if verb == "screenshot":
        pass
    elif verb == "cursor_position":
        steps.append(Step(where, lambda _f: {"action": "cursor_position"}))
        observe = Observe.CURSOR
    elif verb == "zoom":
        region = _region(r)
        observe = Observe.ZOOM
    elif verb in ("left_mouse_down", "left_mouse_up"):
        if pt is not None:  # Anthropic's tool presses where it is told; rigd's at the pointer.
            steps.append(_move(where, pt))
        steps.append(Step(where, lambda _f: {"action": verb}))
    elif verb == "left_click_drag":
        start = _at(r.name("start_coordinate"), *r.pair("start_coordinate"))
        end = _at(r.name("coordinate"), *r.pair("coordinate"))
        steps.append(Step(where, lambda f: {"action": verb, "start_coordinate": start(f),
                                            "coordinate": end(f)}, fields=_A_FIELDS))
    elif verb in ("key", "hold_key"):
        text = _keys(r, "text", r.string("text", max_chars=1024), "x11")
        steps.append(Step(where, lambda _f: {"action": verb, "text": text, **passed}, fields=_A_FIELDS))
    elif verb == "type":
        text = r.string("text")
        steps.append(Step(where, lambda _f: {"action": "type", "text": text}, fields=_A_FIELDS))
    elif verb == "wait":
        steps.append(Step(where, lambda _f: {"action": "wait", **passed}, fields=_A_FIELDS))
    else:  # mouse_move, the clicks, scroll
        held = None
        if r.has("text"):
            held = _held(r, "text", split_combo(r.string("text", max_chars=256)))
        maybe_at = pt

        def build(f: Frame) -> dict[str, Any]:
            out: dict[str, Any] = {"action": verb, **passed}
            if maybe_at is not None:
                out["coordinate"] = maybe_at(f)
            if held is not None:
                out["text"] = held
            return out

        steps.append(Step(where, build, fields=_A_FIELDS))
    if observe is Observe.ZOOM:
        assert region is not None
        box = region
        # The region at the display's own resolution: computer_use's zoom, in display pixels.
        steps.append(Step(where, lambda f: {"action": "zoom", "region": f.region_to_display(box)},
                          fields={"region": "region"}))
    elif observe is not Observe.CURSOR:
        steps.append(_shot(where))
    return Call(Dialect.ANTHROPIC, COMPUTER, Tool.COMPUTER_USE, rig_id, tuple(steps), observe, verb, region)


def _region(r: _Reader) -> tuple[int, int, int, int]:
    value = r.raw.get("region")
    rule = "must be [x1, y1, x2, y2]: the top-left and bottom-right corners, pixels of the screenshot"
    if not isinstance(value, list) or len(value) != 4 or not all(is_int(v) for v in value):
        raise FieldError("arguments.region", rule)
    x1, y1, x2, y2 = (int(v) for v in value)
    if not (0 <= x1 < x2 and 0 <= y1 < y2):
        raise FieldError("arguments.region", rule + ", with x1 < x2 and y1 < y2")
    return x1, y1, x2, y2


