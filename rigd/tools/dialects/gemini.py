"""Gemini's computer-use functions (coordinates 0-999 of the screenshot) read into a :class:`Call`,
and its function declarations (the OpenAPI subset Gemini takes)."""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any

from rigd.errors import FieldError
from rigd.model import Tool
from rigd.tools.dialects.base import (
    GEMINI_SEARCH_URL,
    GEMINI_WAIT_S,
    GRID,
    NOTCH_PX,
    Call,
    Dialect,
    Frame,
    Observe,
    Step,
    _keys,
    _notches,
    _Reader,
    _shot,
)

# --- gemini --------------------------------------------------------------------------------

GEMINI_ACTIONS: tuple[str, ...] = (
    "open_web_browser", "wait_5_seconds", "go_back", "go_forward", "search", "navigate",
    "click_at", "hover_at", "type_text_at", "key_combination", "scroll_document", "scroll_at",
    "drag_and_drop",
)
_G_TAKES: dict[str, set[str]] = {
    "open_web_browser": set(), "wait_5_seconds": set(), "go_back": set(), "go_forward": set(),
    "search": set(), "navigate": {"url"}, "click_at": {"x", "y"}, "hover_at": {"x", "y"},
    "type_text_at": {"x", "y", "text", "press_enter", "clear_before_typing"},
    "key_combination": {"keys"}, "scroll_document": {"direction"},
    "scroll_at": {"x", "y", "direction", "magnitude"},
    "drag_and_drop": {"x", "y", "destination_x", "destination_y"},
}
#: Sent by the model beside its arguments: a safety decision the client has
#: confirmed with its user (rigd's own guard rules are separate), and the
#: model's intent. Neither changes what is done.
_G_NOTES = {"safety_decision", "intent"}
_DIRECTIONS = ("up", "down", "left", "right")


def _gemini(name: str, args: object) -> Call:
    r = _Reader(args, "arguments", Dialect.GEMINI)
    rig_id = r.rig_id()
    r.only({"rigId", *_G_NOTES, *_G_TAKES[name]}, name)
    where = "arguments"
    steps: list[Step] = []

    def grid(xk: str, yk: str) -> Callable[[Frame], list[int]]:
        x, y = r.integer(xk, 0, GRID - 1), r.integer(yk, 0, GRID - 1)
        return lambda f: f.from_grid(x, y)

    def direction() -> str:
        value = r.raw.get("direction")
        if value not in _DIRECTIONS:
            raise FieldError(r.name("direction"), "must be up, down, left or right")
        return str(value)

    if name == "wait_5_seconds":
        steps.append(Step(where, None, GEMINI_WAIT_S))
    elif name in ("go_back", "go_forward"):
        history = "back" if name == "go_back" else "forward"
        steps.append(Step(where, lambda _f: {"action": "history", "direction": history}))
    elif name in ("search", "navigate"):
        url = GEMINI_SEARCH_URL if name == "search" else r.string("url", max_chars=8192)
        if "://" not in url:  # Gemini often names a host ("wikipedia.org"): https is meant.
            url = "https://" + url
        steps.append(Step(where, lambda _f: {"action": "navigate", "url": url}, fields={"url": "url"}))
    elif name in ("click_at", "hover_at"):
        at = grid("x", "y")
        verb = "click" if name == "click_at" else "mouse_move"
        steps.append(Step(where, lambda f: {"action": verb, "coordinate": at(f)}))
    elif name == "type_text_at":
        at = grid("x", "y")
        text = r.string("text", allow_empty=True)
        steps.append(Step(where, lambda f: {"action": "click", "coordinate": at(f)}))
        # Google documents both defaults as true: the field is cleared, then Enter pressed.
        if r.boolean("clear_before_typing", True):
            steps.append(Step(where, lambda _f: {"action": "key", "text": "ControlOrMeta+a"}))
            steps.append(Step(where, lambda _f: {"action": "key", "text": "Delete"}))
        if text:
            steps.append(Step(where, lambda _f: {"action": "type", "text": text}, fields={"text": "text"}))
        if r.boolean("press_enter", True):
            steps.append(Step(where, lambda _f: {"action": "key", "text": "Enter"}))
    elif name == "key_combination":
        combo = _keys(r, "keys", r.string("keys", max_chars=256), "dom")
        if " " in combo:
            raise FieldError(r.name("keys"), "must be one combination such as Control+C")
        steps.append(Step(where, lambda _f: {"action": "key", "text": combo}))
    elif name == "scroll_document":
        way = direction()
        if way in ("up", "down"):  # as Gemini's reference does: a page at a time
            key = "PageDown" if way == "down" else "PageUp"
            steps.append(Step(where, lambda _f: {"action": "key", "text": key}))
        else:
            steps.append(Step(where, lambda f: {
                "action": "scroll", "scroll_direction": way,
                "scroll_amount": max(1, round(f.display.width / 2 / NOTCH_PX))}))
    elif name == "scroll_at":
        at = grid("x", "y")
        way = direction()
        magnitude = r.integer("magnitude", 0, GRID - 1, default=800)

        def scroll(f: Frame) -> dict[str, Any]:
            span = f.display.height if way in ("up", "down") else f.display.width
            return {"action": "scroll", "coordinate": at(f), "scroll_direction": way,
                    "scroll_amount": _notches(magnitude * span / GRID, r.name("magnitude"), "0-999")}

        steps.append(Step(where, scroll))
    elif name == "drag_and_drop":
        start, end = grid("x", "y"), grid("destination_x", "destination_y")
        steps.append(Step(where, lambda f: {"action": "drag", "start_coordinate": start(f),
                                            "coordinate": end(f)}))
    steps.append(_shot(where))
    return Call(Dialect.GEMINI, name, Tool.BROWSER_USE, rig_id, tuple(steps), Observe.SCREENSHOT, name)


# --- tool definitions ----------------------------------------------------------------------

_GEMINI_POINT = {
    "x": {"type": "integer", "description": "0-999, left to right across the screenshot"},
    "y": {"type": "integer", "description": "0-999, top to bottom down the screenshot"},
}
_GEMINI_DECLS: list[dict[str, Any]] = [
    {"name": "open_web_browser", "description": "Open the web browser (it is open: returns a screenshot)."},
    {"name": "wait_5_seconds", "description": "Wait 5 seconds for content to load, then take a screenshot."},
    {"name": "go_back", "description": "Go back in the browser's history."},
    {"name": "go_forward", "description": "Go forward in the browser's history."},
    {"name": "search", "description": "Open a search engine's home page."},
    {"name": "navigate", "description": "Go to a URL (http or https).",
     "parameters": {"type": "object", "properties": {"url": {"type": "string"}}, "required": ["url"]}},
    {"name": "click_at", "description": "Click at a point; x and y are 0-999 of the screenshot.",
     "parameters": {"type": "object", "properties": _GEMINI_POINT, "required": ["x", "y"]}},
    {"name": "hover_at", "description": "Move the pointer to a point (0-999 of the screenshot).",
     "parameters": {"type": "object", "properties": _GEMINI_POINT, "required": ["x", "y"]}},
    {"name": "type_text_at",
     "description": "Click at a point (0-999 of the screenshot), clear the field, type text and press "
                    "Enter; press_enter and clear_before_typing (both default true) turn those off.",
     "parameters": {"type": "object", "properties": {
         **_GEMINI_POINT, "text": {"type": "string"}, "press_enter": {"type": "boolean"},
         "clear_before_typing": {"type": "boolean"}}, "required": ["x", "y", "text"]}},
    {"name": "key_combination", "description": "Press keys together, Playwright names: Enter, "
                                               "Control+C, Shift+Tab, ArrowDown.",
     "parameters": {"type": "object", "properties": {"keys": {"type": "string"}}, "required": ["keys"]}},
    {"name": "scroll_document", "description": "Scroll the page up or down a page, or sideways.",
     "parameters": {"type": "object", "properties": {
         "direction": {"type": "string", "enum": list(_DIRECTIONS)}}, "required": ["direction"]}},
    {"name": "scroll_at", "description": "Scroll at a point (0-999 of the screenshot); magnitude is "
                                         "0-999 of the screenshot's height or width (default 800).",
     "parameters": {"type": "object", "properties": {
         **_GEMINI_POINT, "direction": {"type": "string", "enum": list(_DIRECTIONS)},
         "magnitude": {"type": "integer"}}, "required": ["x", "y", "direction"]}},
    {"name": "drag_and_drop", "description": "Drag from (x, y) to (destination_x, destination_y), all "
                                             "0-999 of the screenshot.",
     "parameters": {"type": "object", "properties": {
         **_GEMINI_POINT, "destination_x": {"type": "integer"}, "destination_y": {"type": "integer"}},
         "required": ["x", "y", "destination_x", "destination_y"]}},
]


def _gemini_schema(schema: Mapping[str, Any]) -> dict[str, Any] | None:
    """A JSON schema in the OpenAPI subset Gemini's function declarations take: no
    additionalProperties, no object without properties (such a field is dropped)."""
    out = {k: v for k, v in schema.items() if k not in ("additionalProperties", "properties", "items")}
    if "items" in schema:
        out["items"] = _gemini_schema(schema["items"]) or {"type": "string"}
    if schema.get("type") == "object":
        props = {}
        for name, sub in schema.get("properties", {}).items():
            converted = _gemini_schema(sub)
            if converted is not None:
                props[name] = converted
        if not props:
            return None
        out["properties"] = props
        if "required" in schema:
            out["required"] = [n for n in schema["required"] if n in props]
    return out


