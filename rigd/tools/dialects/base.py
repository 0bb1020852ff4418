"""What every dialect shares: the frame a call is read in, a call and its plan, the reader of
a vendor's arguments (errors name the vendor's field), and rendering a result back (pure; no I/O).
The package's docstring says how the dialects work."""

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


def _at(where: str | tuple[str, str], x: int, y: int) -> Callable[[Frame], list[int]]:
    return lambda f: f.to_display(x, y, where)



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
