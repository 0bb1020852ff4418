"""Vocabularies: the agent tools in each model vendor's own shape (pure; no I/O).

``tools.list {dialect}`` and ``tools.call {…, dialect}`` speak one of:

- ``openai`` — rigd's own function tools (``rigd.tools.catalogue.definitions``), the default.
- ``anthropic`` — Anthropic's ``computer`` tool (``computer_20250124``, or
  ``computer_20251124`` with ``zoom``) drives a computer rig; the other tools
  are rigd's, as Anthropic custom tools (``input_schema``).
- ``openai-computer`` — OpenAI's computer-use actions (``click``,
  ``double_click``, ``drag``, ``keypress``, ``move``, ``scroll``, ``type``,
  ``wait``, ``screenshot``; one ``action`` or several ``actions``) drive a
  computer rig; the other tools are Responses-API function tools.
- ``gemini`` — Gemini's computer-use functions (``click_at``,
  ``type_text_at``, ``navigate`` …, coordinates 0-999 of the screenshot) drive
  a browser rig; the other tools are Gemini function declarations.

How this works: :func:`translate` reads one vendor call into a :class:`Call`
— its shape checked, field by field, with errors naming the vendor's field
(``arguments.coordinate``, ``arguments.actions[2].x``) — without knowing the
rig. Once the rig is known, :meth:`Call.plan` resolves the call against the
rig's :class:`Frame` (coordinates are pixels of the screenshot the model was
sent; a point outside it is refused, never clamped) into rigd
``computer_use`` / ``browser_use`` actions, each checked by
:func:`rigd.verbs.parse_action` before any runs, so a batch runs whole or not
at all. :func:`render` turns the last result back into content: the
screenshot and a line stating its scale, in the vendor's frame.

The frame is stateless: the display the rig reports now, fitted into
:data:`rigd.model.AGENT_STILL_MAX` by the rule every still follows
(:func:`rigd.frames.fit`). Keys go through one table
(:func:`rigd.verbs.keys.combo_for`).
"""

from __future__ import annotations

import enum
import math
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

from rigd.errors import BackendError, FieldError
from rigd.frames import fit
from rigd.model import AGENT_STILL_MAX, Display, Surface, Tool
from rigd.verbs import ParseContext, parse_action
from rigd.verbs._args import field_path, is_int, show
from rigd.verbs.base import SCROLL_AMOUNT_MAX
from rigd.verbs.keys import KeySyntaxError, combo_for, modifiers_for, split_combo


class Dialect(enum.StrEnum):
    OPENAI = "openai"
    OPENAI_COMPUTER = "openai-computer"
    ANTHROPIC = "anthropic"
    GEMINI = "gemini"


def parse_dialect(value: object, name: str = "dialect") -> Dialect:
    """``None`` is ``openai``; anything else must name a dialect."""
    if value is None:
        return Dialect.OPENAI
    for dialect in Dialect:
        if value == dialect.value:
            return dialect
    shown = show(value) if isinstance(value, str) else f"a {type(value).__name__}"
    raise FieldError(name, f"{shown} is not a dialect; one of {', '.join(d.value for d in Dialect)}")


ANTHROPIC_TOOL_TYPES = ("computer_20250124", "computer_20251124")

#: The vendor tool's name in tools.call (Anthropic's is ``computer``; OpenAI's
#: computer calls carry no name, so rigd names them ``computer`` too).
COMPUTER = "computer"

#: CSS or X11 pixels per wheel notch: Chromium's wheel tick (rigd.verbs.browser).
NOTCH_PX = 100
#: OpenAI's ``wait`` says no duration; its reference loops wait 1-2 s.
OPENAI_WAIT_S = 2.0
GEMINI_WAIT_S = 5.0
#: Gemini's ``search`` opens "the default search engine's homepage" (its reference: Google).
GEMINI_SEARCH_URL = "https://www.google.com/"
#: Gemini's coordinates are 0-999 of the screenshot on each axis.
GRID = 1000
MAX_BATCH = 50
MAX_DRAG_POINTS = 100

# Fields that mark another dialect's shape, with the hint a model needs.
_FOREIGN = {
    Dialect.ANTHROPIC: {
        "x": "the anthropic computer tool takes coordinate: [x, y] (pixels of the screenshot)",
        "y": "the anthropic computer tool takes coordinate: [x, y] (pixels of the screenshot)",
        "type": "the anthropic computer tool names its action in action, e.g. {\"action\": \"left_click\"}",
        "keys": "the anthropic computer tool takes keys in text, xdotool style, e.g. ctrl+s",
        "button": "the anthropic computer tool has left_click, right_click and middle_click",
        "actions": "the anthropic computer tool takes one action per call",
    },
    Dialect.OPENAI_COMPUTER: {
        "coordinate": "OpenAI computer actions take x and y (pixels of the screenshot)",
        "start_coordinate": "a drag takes a path of {x, y} points",
        "action": "an action is an object with a type, e.g. {\"type\": \"click\", \"button\": \"left\", ...}",
        "scroll_direction": "scroll takes scroll_x and scroll_y (pixels)",
        "scroll_amount": "scroll takes scroll_x and scroll_y (pixels)",
        "text": "keypress takes keys: [\"CTRL\", \"A\"]",
    },
    Dialect.GEMINI: {
        "coordinate": "Gemini actions take x and y, 0-999 of the screenshot",
        "action": "Gemini actions are separate functions (click_at, type_text_at, ...)",
        "scroll_direction": "scroll_at takes direction and magnitude",
        "key": "key_combination takes keys, e.g. \"Control+C\"",
    },
}


# --- the frame -----------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class Frame:
    """The screenshot a model is sent (``image``) over the rig's ``display``:
    ``scale`` display pixels per image pixel."""

    display: Display
    image: Display
    scale: float

    @classmethod
    def of(cls, display: Display) -> Frame:
        w, h, scale = fit(display.width, display.height, AGENT_STILL_MAX.width, AGENT_STILL_MAX.height)
        return cls(display, Display(w, h), scale)

    def to_display(self, x: int, y: int, name: str | tuple[str, str]) -> list[int]:
        """An image point as a display point; outside the image is refused, naming the
        field (``name``, or the x or the y field of a ``(x_name, y_name)`` pair)."""
        w, h = self.image.width, self.image.height
        if not (0 <= x < w and 0 <= y < h):
            if isinstance(name, tuple):
                name = name[0] if not 0 <= x < w else name[1]
            raise FieldError(name, f"({_n(x)}, {_n(y)}) is outside the screenshot: x must be 0-{w - 1} "
                                   f"and y 0-{h - 1} (pixels of the {w}x{h} image)")
        return [min(self.display.width - 1, math.floor(x * self.scale + 0.5)),
                min(self.display.height - 1, math.floor(y * self.scale + 0.5))]

    def region_to_display(self, region: tuple[int, int, int, int]) -> list[int]:
        """An image region ``[x1, y1, x2, y2]`` (checked against the image by :meth:`Call.plan`)
        as display pixels, never empty."""
        x1, y1, x2, y2 = (math.floor(v * self.scale + 0.5) for v in region)
        w, h = self.display.width, self.display.height
        x1, y1 = min(x1, w - 1), min(y1, h - 1)
        return [x1, y1, max(x1 + 1, min(x2, w)), max(y1 + 1, min(y2, h))]

    def to_image(self, x: int, y: int) -> tuple[int, int]:
        return (min(self.image.width - 1, math.floor(x / self.scale)),
                min(self.image.height - 1, math.floor(y / self.scale)))

    def from_grid(self, x: int, y: int) -> list[int]:
        """A Gemini 0-999 point (already range-checked) as a display point."""
        return [x * self.display.width // GRID, y * self.display.height // GRID]

    def to_json(self) -> dict[str, Any]:
        return {"display": self.display.to_json(), "image": self.image.to_json(),
                "scale": round(self.scale, 6)}


def _n(value: int) -> str:
    return str(value) if abs(value) < 10**9 else "a huge number"


def _notches(display_px: float, name: str, unit_max: str) -> int:
    notches = max(1, round(abs(display_px) / NOTCH_PX))
    if notches > SCROLL_AMOUNT_MAX:
        raise FieldError(name, f"scrolls {notches} wheel notches; at most {SCROLL_AMOUNT_MAX} per action "
                               f"({unit_max})")
    return notches


# --- a call, and its plan ------------------------------------------------------------------


class Observe(enum.Enum):
    SCREENSHOT = "screenshot"
    CURSOR = "cursor"
    ZOOM = "zoom"


Build = Callable[[Frame], dict[str, Any]]


@dataclass(frozen=True, slots=True)
class Step:
    """One rigd action (built once the frame is known), or a pause."""

    where: str
    build: Build | None = None
    sleep_s: float = 0.0
    #: rigd field → the vendor's field, so a rule broken reads in the vendor's words.
    fields: Mapping[str, str] = field(default_factory=dict)


@dataclass(frozen=True, slots=True)
class Planned:
    where: str
    action: dict[str, Any] | None
    sleep_s: float = 0.0


@dataclass(frozen=True, slots=True)
class Call:
    """A vendor call, shape-checked, not yet tied to a rig."""

    dialect: Dialect
    name: str
    tool: Tool
    rig_id: str | None
    steps: tuple[Step, ...]
    observe: Observe = Observe.SCREENSHOT
    #: What the model asked for, for the result's text ("click, type").
    summary: str = ""
    #: zoom: the image region [x1, y1, x2, y2].
    region: tuple[int, int, int, int] | None = None

    @property
    def surface(self) -> Surface:
        return Surface.BROWSER if self.tool is Tool.BROWSER_USE else Surface.COMPUTER

    def plan(self, frame: Frame) -> list[Planned]:
        """The rigd actions, every one checked against the rig's display before any runs."""
        if self.region is not None:
            x1, y1, x2, y2 = self.region
            w, h = frame.image.width, frame.image.height
            if not (x2 <= w and y2 <= h):
                raise FieldError("arguments.region", f"[{_n(x1)}, {_n(y1)}, {_n(x2)}, {_n(y2)}] reaches "
                                                     f"outside the {w}x{h} screenshot")
        ctx = ParseContext(display=frame.display, surface=self.surface)
        out: list[Planned] = []
        for step in self.steps:
            if step.build is None:
                out.append(Planned(step.where, None, step.sleep_s))
                continue
            action = step.build(frame)
            parsed = parse_action(self.tool.value, action, ctx)
            if isinstance(parsed, FieldError):
                rig_field = parsed.field.removeprefix("action.").split(".")[0].split("[")[0]
                vendor = step.fields.get(rig_field)
                raise FieldError(field_path(step.where, vendor) if vendor else step.where,
                                 parsed.reason if vendor else f"{parsed.field}: {parsed.reason}")
            out.append(Planned(step.where, action))
        return out


def _move(where: str, at: Callable[[Frame], list[int]]) -> Step:
    return Step(where, lambda f: {"action": "mouse_move", "coordinate": at(f)})


def _shot(where: str) -> Step:
    return Step(where, lambda _f: {"action": "screenshot"})


# --- reading a vendor's arguments ----------------------------------------------------------


class _Reader:
    """One object of a vendor's arguments; ``null`` counts as absent (OpenAI strict mode)."""

    def __init__(self, raw: object, where: str, dialect: Dialect) -> None:
        if not isinstance(raw, dict):
            raise FieldError(where, "must be an object")
        self.raw: dict[str, object] = raw
        self.where = where
        self.dialect = dialect

    def name(self, key: str) -> str:
        return field_path(self.where, key)

    def only(self, allowed: set[str], what: str) -> None:
        # A misspelt field is refused even when null: a silent ignore hides the bug.
        for key in self.raw:
            if key not in allowed:
                hint = _FOREIGN[self.dialect].get(key) if isinstance(key, str) else None
                rule = hint or f"{what} takes {', '.join(sorted(allowed)) or 'no fields'}"
                raise FieldError(self.name(key), f"is not a field of {what}; {rule}")

    def has(self, key: str) -> bool:
        return self.raw.get(key) is not None

    def foreign(self) -> None:
        """Refuse another dialect's shape by its first telltale field, with the hint."""
        hints = _FOREIGN[self.dialect]
        for key in self.raw:
            if isinstance(key, str) and key in hints:
                raise FieldError(self.name(key), f"is not a field here; {hints[key]}")

    def integer(self, key: str, lo: int | None = None, hi: int | None = None,
                default: int | None = None) -> int:
        value = self.raw.get(key)
        if value is None:
            if default is not None:
                return default
            raise FieldError(self.name(key), "is required")
        if not is_int(value):
            raise FieldError(self.name(key), "must be an integer")
        if (lo is not None and value < lo) or (hi is not None and value > hi):
            raise FieldError(self.name(key), f"must be between {lo} and {hi}" if hi is not None
                             else f"must be at least {lo}")
        return value

    def string(self, key: str, *, max_chars: int = 65536, allow_empty: bool = False) -> str:
        value = self.raw.get(key)
        if value is None:
            raise FieldError(self.name(key), "is required")
        if not isinstance(value, str):
            raise FieldError(self.name(key), "must be a string")
        if not value and not allow_empty:
            raise FieldError(self.name(key), "must not be empty")
        if len(value) > max_chars:
            raise FieldError(self.name(key), f"must be at most {max_chars} characters")
        return value

    def opt_string(self, key: str, *, max_chars: int = 65536) -> str | None:
        return self.string(key, max_chars=max_chars, allow_empty=True) if self.has(key) else None

    def boolean(self, key: str, default: bool) -> bool:
        value = self.raw.get(key)
        if value is None:
            return default
        if not isinstance(value, bool):
            raise FieldError(self.name(key), "must be true or false")
        return value

    def pair(self, key: str) -> tuple[int, int]:
        """``[x, y]``: two non-negative integers (the frame checks the rest)."""
        value = self.raw.get(key)
        if value is None:
            raise FieldError(self.name(key), "is required: [x, y], pixels of the screenshot")
        if (not isinstance(value, list) or len(value) != 2 or not all(is_int(v) for v in value)):
            raise FieldError(self.name(key), "must be [x, y]: two integers, pixels of the screenshot")
        return int(value[0]), int(value[1])

    def strings(self, key: str, *, max_items: int = 16) -> list[str]:
        value = self.raw.get(key)
        if value is None:
            raise FieldError(self.name(key), "is required: a list of key names")
        if not isinstance(value, list) or len(value) > max_items:
            raise FieldError(self.name(key), f"must be a list of at most {max_items} key names")
        for i, item in enumerate(value):
            if not isinstance(item, str) or not item or len(item) > 64:
                raise FieldError(f"{self.name(key)}[{i}]", "must be a key name (a non-empty string)")
        return [str(v) for v in value]

    def rig_id(self) -> str | None:
        value = self.raw.get("rigId")
        if value is None:
            return None
        if not isinstance(value, str) or not value or len(value) > 128:
            raise FieldError(self.name("rigId"), "must be a rig id")
        return value


def _keys(reader: _Reader, key: str, text: str, target: str) -> str:
    """A whitespace-separated sequence of ``+``-joined combos, in any vocabulary,
    as the target's key text."""
    try:
        return " ".join(combo_for(split_combo(combo), target) for combo in text.split())
    except KeySyntaxError as exc:
        raise FieldError(reader.name(key), str(exc)) from None


def _held(reader: _Reader, key: str, names: list[str]) -> str:
    try:
        return modifiers_for(names, "x11")
    except KeySyntaxError as exc:
        raise FieldError(reader.name(key), str(exc)) from None


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


def _at(where: str | tuple[str, str], x: int, y: int) -> Callable[[Frame], list[int]]:
    return lambda f: f.to_display(x, y, where)


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


# --- the entry points ----------------------------------------------------------------------

#: The rigd tools each dialect serves beside its vendor's computer tool.
_RIGD_TOOLS: dict[Dialect, tuple[str, ...]] = {
    Dialect.OPENAI: ("rig_list", "rig_close", "terminal_use", "computer_use", "browser_use"),
    Dialect.ANTHROPIC: ("rig_list", "rig_close", "terminal_use", "browser_use"),
    Dialect.OPENAI_COMPUTER: ("rig_list", "rig_close", "terminal_use", "browser_use"),
    Dialect.GEMINI: ("rig_list", "rig_close", "terminal_use", "computer_use"),
}
_VENDOR_TOOLS: dict[Dialect, tuple[str, ...]] = {
    Dialect.OPENAI: (),
    Dialect.ANTHROPIC: (COMPUTER,),
    Dialect.OPENAI_COMPUTER: (COMPUTER,),
    Dialect.GEMINI: GEMINI_ACTIONS,
}


def rigd_tools(dialect: Dialect) -> tuple[str, ...]:
    return _RIGD_TOOLS[dialect]


def tool_names(dialect: Dialect) -> tuple[str, ...]:
    return _RIGD_TOOLS[dialect] + _VENDOR_TOOLS[dialect]


def vendor_tool_of(dialect: Dialect) -> dict[str, Tool]:
    """Each vendor tool name → the rigd tool behind it (for action classes)."""
    tool = Tool.BROWSER_USE if dialect is Dialect.GEMINI else Tool.COMPUTER_USE
    return {name: tool for name in _VENDOR_TOOLS[dialect]}


def translate(dialect: Dialect, name: str, args: object) -> Call | None:
    """A vendor tool call as a :class:`Call`; ``None`` when ``name`` is one of
    rigd's own tools (served as they are). Unknown names are refused naming ``name``."""
    if name in _RIGD_TOOLS[dialect]:
        return None
    if name not in _VENDOR_TOOLS[dialect]:
        raise FieldError("name", f"{show(name)} is not a tool of the {dialect} dialect; one of "
                                 f"{', '.join(tool_names(dialect))}")
    if dialect is Dialect.ANTHROPIC:
        return _anthropic(args)
    if dialect is Dialect.OPENAI_COMPUTER:
        return _openai_computer(args)
    return _gemini(name, args)


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


def definitions(dialect: Dialect, functions: list[Any], frame: Frame,
                anthropic_tool: str = ANTHROPIC_TOOL_TYPES[0]) -> list[dict[str, Any]]:
    """The tools of ``dialect``, in its vendor's format, from rigd's OpenAI function
    definitions; the vendor's computer tool is sized to ``frame.image``."""
    by_name = {f["function"]["name"]: f["function"] for f in functions}
    own = [by_name[n] for n in _RIGD_TOOLS[dialect]]
    w, h = frame.image.width, frame.image.height
    if dialect is Dialect.OPENAI:
        return [dict(f) for f in functions]
    if dialect is Dialect.ANTHROPIC:
        computer: dict[str, Any] = {"type": anthropic_tool, "name": COMPUTER,
                                    "display_width_px": w, "display_height_px": h}
        if anthropic_tool == "computer_20251124":
            computer["enable_zoom"] = True
        tools = [{"name": f["name"], "description": f["description"], "input_schema": f["parameters"]}
                 for f in own]
        return [*tools[:3], computer, *tools[3:]]
    if dialect is Dialect.OPENAI_COMPUTER:
        tools = [{"type": "function", "name": f["name"], "description": f["description"],
                  "parameters": f["parameters"], "strict": False} for f in own]
        return [*tools[:3], {"type": "computer_use_preview", "display_width": w, "display_height": h,
                             "environment": "linux"}, *tools[3:]]
    decls = []
    for f in own:
        decl = {"name": f["name"], "description": f["description"]}
        params = _gemini_schema(f["parameters"])
        if params is not None:
            decl["parameters"] = params
        decls.append(decl)
    return [{"functionDeclarations": decls}, {"functionDeclarations": [dict(d) for d in _GEMINI_DECLS]}]


# --- results -------------------------------------------------------------------------------


def _size(value: object, name: str) -> Display:
    if (not isinstance(value, dict) or not is_int(value.get("width")) or not is_int(value.get("height"))
            or not 0 < value["width"] <= 65535 or not 0 < value["height"] <= 65535):
        raise BackendError(f"the rig's screenshot has no valid {name}")
    return Display(value["width"], value["height"])


def _still(result: Mapping[str, Any]) -> tuple[dict[str, str], Display, Display, float]:
    """The parts of a screenshot result, checked: a backend's answer is data, not trusted shape."""
    image = result.get("image")
    if (not isinstance(image, dict) or not isinstance(image.get("data"), str)
            or image.get("mediaType") not in ("image/jpeg", "image/png")):
        raise BackendError("the rig's screenshot has no image")
    scale = result.get("scale")
    if not isinstance(scale, int | float) or isinstance(scale, bool) or not 0 < scale < 1000:
        raise BackendError("the rig's screenshot has no valid scale")
    return ({"data": image["data"], "mediaType": image["mediaType"]},
            _size(result.get("display"), "display size"), _size(result.get("imageSize"), "image size"),
            float(scale))


def _image(image: Mapping[str, str]) -> dict[str, Any]:
    return {"type": "image", "data": image["data"], "mimeType": image["mediaType"]}


def render(call: Call, frame: Frame, result: Mapping[str, Any]) -> dict[str, Any]:
    """The last step's result as model content, in the call's frame."""
    done = f"{call.summary}: done." if call.summary and call.summary != "screenshot" else ""
    if call.observe is Observe.CURSOR:
        coordinate = result.get("coordinate")
        if (not isinstance(coordinate, list) or len(coordinate) != 2
                or not all(is_int(c) and 0 <= c < 65536 for c in coordinate)):
            raise BackendError("the rig did not say where its pointer is")
        ix, iy = frame.to_image(int(coordinate[0]), int(coordinate[1]))
        text = (f"X={ix},Y={iy} (pixels of the {frame.image.width}x{frame.image.height} screenshot; "
                f"display pixel {coordinate[0]},{coordinate[1]}).")
        return {"content": [{"type": "text", "text": text}], "isError": False}
    if call.observe is Observe.ZOOM:
        assert call.region is not None
        return zoomed(call.region, frame, result)
    image, display, size, scale = _still(result)
    if call.dialect is Dialect.GEMINI:
        text = (f"Screenshot of the {display.width}x{display.height} viewport as a "
                f"{size.width}x{size.height} image. x and y of click_at and the other actions are "
                "0-999 of this image (x across, y down).")
    else:
        text = (f"Screenshot: a {size.width}x{size.height} image of the {display.width}x{display.height} "
                f"display, scale {round(scale, 6)} (display pixels per image pixel). Coordinates for the "
                "computer tool are pixels of this image.")
        cursor = result.get("cursor")
        if (isinstance(cursor, list) and len(cursor) == 2
                and all(is_int(c) and 0 <= c < 65536 for c in cursor)):
            px, py = math.floor(cursor[0] / scale), math.floor(cursor[1] / scale)
            if px < size.width and py < size.height:
                text += f" Pointer at {px},{py}."
    content = [_image(image), {"type": "text", "text": f"{done} {text}".strip()}]
    return {"content": content, "isError": False}


def zoomed(region: tuple[int, int, int, int], frame: Frame, result: Mapping[str, Any]) -> dict[str, Any]:
    """computer_use zoom's answer (the region at the display's resolution) as model content."""
    image, _display, size, _scale = _still(result)
    x1, y1, x2, y2 = region
    text = (f"Zoom of [{x1}, {y1}, {x2}, {y2}] of the screenshot at the display's own resolution, "
            f"shown {size.width}x{size.height}. Coordinates for actions stay pixels of the full "
            f"{frame.image.width}x{frame.image.height} screenshot.")
    return {"content": [_image(image), {"type": "text", "text": text}], "isError": False}
