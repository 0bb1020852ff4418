"""computer_use: the X11 desktop verbs (RIGS.md §4), shaped like Anthropic's
computer-use tool (``computer_20250124``) so a model trained on it needs no
new habits.

- ``screenshot`` ○: optional ``marks`` (bool, default false): numbered boxes on
  the widgets of the desktop's accessibility tree, and their list (rigd.marks).
- ``cursor_position`` ○: no fields.
- ``zoom`` ○: ``region`` ``[x1, y1, x2, y2]``, the top-left and bottom-right
  corners in display pixels (``x1 < x2 <= width``, ``y1 < y2 <= height``):
  that part of the screen at the display's own resolution (scaled down only
  when it is larger than an agent still), as ``computer_20251124`` defines it.
- ``mouse_move``: ``coordinate``.
- ``left_click``, ``right_click``, ``middle_click``, ``double_click``,
  ``triple_click``: optional ``coordinate`` or ``mark`` (else at the pointer); optional
  ``text``, the modifiers held during the click (``shift``, ``ctrl+shift``).
- ``left_mouse_down``, ``left_mouse_up``: no fields. They act at the
  pointer, as in Anthropic's tool; a ``coordinate`` is refused with a hint to
  ``mouse_move`` first.
- ``left_click_drag``: ``start_coordinate`` and ``coordinate`` (the end).
- ``scroll``: ``scroll_direction`` (up, down, left, right) and
  ``scroll_amount`` (1-100 wheel notches), both required; optional
  ``coordinate`` (else at the pointer) and ``text`` (modifiers held, e.g.
  shift for a sideways scroll), as in Anthropic's tool.
- ``key``: ``text``, xdotool combos, whitespace-separated for a sequence.
- ``hold_key``: ``text`` (one combo) and ``duration`` (0-60 s).
- ``type``: ``text``, any Unicode, non-empty, at most 64 KiB of UTF-8; with
  ``mark``, the widget is clicked first (for the focus).
- ``wait`` ○: ``duration`` (0-60 s), required as in Anthropic's tool.
- ``set_display``: integers ``width`` 640-2560 and ``height`` 480-1600.
- ``clipboard_read`` ○: optional ``selection``: clipboard (the default),
  primary or xdnd.
- ``clipboard_write``: ``text`` only; it may be empty, which clears the
  clipboard. Image or file fields are refused pointing at the file lane.

Coordinates are guest pixels of the current mode, inside ``ctx.display``.
Key syntax is in :mod:`rigd.verbs.keys`. Audit: ``type`` and
``clipboard_write`` text is masked; key and modifier text is kept when it is
well-formed key syntax and masked otherwise.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import ClassVar

from rigd.verbs._args import Args, VerbSpec, is_int, no_fields, table
from rigd.verbs.base import (
    COORD_MAX,
    DESKTOP_MAX,
    DESKTOP_MIN,
    DURATION_MAX_S,
    SCROLL_AMOUNT_MAX,
    SCROLL_AMOUNT_MIN,
    ClipboardSelection,
    ComputerAction,
    Point,
    ScrollDirection,
)
from rigd.verbs.keys import KeyCombo, parse_x11_combo, parse_x11_keys, parse_x11_modifiers
from rigd.verbs.masking import keep_if, mask


@dataclass(frozen=True, slots=True)
class ComputerScreenshot(ComputerAction):
    verb = "screenshot"
    observation = True
    #: Numbered boxes on the widgets of the desktop's accessibility tree, and their list.
    marks: bool = False


@dataclass(frozen=True, slots=True)
class ComputerZoom(ComputerAction):
    verb = "zoom"
    observation = True
    region: tuple[int, int, int, int]


@dataclass(frozen=True, slots=True)
class ComputerCursorPosition(ComputerAction):
    verb = "cursor_position"
    observation = True


@dataclass(frozen=True, slots=True)
class ComputerMouseMove(ComputerAction):
    verb = "mouse_move"
    coordinate: Point


@dataclass(frozen=True, slots=True)
class ComputerClick(ComputerAction):
    """Shared shape of the five click verbs; ``button`` and ``clicks`` say
    which one. ``modifiers`` are X11 keysyms held during the click."""

    button: ClassVar[str]
    clicks: ClassVar[int]

    coordinate: Point | None = None
    modifiers: tuple[str, ...] = ()
    #: A widget's id from the newest marked screenshot, in place of ``coordinate``.
    mark: int | None = None


@dataclass(frozen=True, slots=True)
class ComputerLeftClick(ComputerClick):
    verb = "left_click"
    button = "left"
    clicks = 1


@dataclass(frozen=True, slots=True)
class ComputerRightClick(ComputerClick):
    verb = "right_click"
    button = "right"
    clicks = 1


@dataclass(frozen=True, slots=True)
class ComputerMiddleClick(ComputerClick):
    verb = "middle_click"
    button = "middle"
    clicks = 1


@dataclass(frozen=True, slots=True)
class ComputerDoubleClick(ComputerClick):
    verb = "double_click"
    button = "left"
    clicks = 2


@dataclass(frozen=True, slots=True)
class ComputerTripleClick(ComputerClick):
    verb = "triple_click"
    button = "left"
    clicks = 3


@dataclass(frozen=True, slots=True)
class ComputerLeftMouseDown(ComputerAction):
    verb = "left_mouse_down"


@dataclass(frozen=True, slots=True)
class ComputerLeftMouseUp(ComputerAction):
    verb = "left_mouse_up"


@dataclass(frozen=True, slots=True)
class ComputerLeftClickDrag(ComputerAction):
    verb = "left_click_drag"
    start: Point
    end: Point


@dataclass(frozen=True, slots=True)
class ComputerScroll(ComputerAction):
    verb = "scroll"
    direction: ScrollDirection
    amount: int
    coordinate: Point | None = None
    modifiers: tuple[str, ...] = ()
    mark: int | None = None


@dataclass(frozen=True, slots=True)
class ComputerKey(ComputerAction):
    """Combos pressed one after the other, each released before the next."""

    verb = "key"
    combos: tuple[KeyCombo, ...]


@dataclass(frozen=True, slots=True)
class ComputerHoldKey(ComputerAction):
    verb = "hold_key"
    combo: KeyCombo
    duration_s: float


@dataclass(frozen=True, slots=True)
class ComputerType(ComputerAction):
    verb = "type"
    text: str = field(repr=False)
    #: Type into this widget (clicked first, for the focus) instead of where the focus is.
    mark: int | None = None


@dataclass(frozen=True, slots=True)
class ComputerWait(ComputerAction):
    verb = "wait"
    observation = True
    duration_s: float


@dataclass(frozen=True, slots=True)
class ComputerSetDisplay(ComputerAction):
    verb = "set_display"
    width: int
    height: int


@dataclass(frozen=True, slots=True)
class ComputerClipboardRead(ComputerAction):
    verb = "clipboard_read"
    observation = True
    selection: ClipboardSelection = ClipboardSelection.CLIPBOARD


@dataclass(frozen=True, slots=True)
class ComputerClipboardWrite(ComputerAction):
    verb = "clipboard_write"
    text: str = field(repr=False)


def _region(a: Args) -> tuple[int, int, int, int]:
    value = a.get("region")
    display = a.ctx.display
    inside = f" inside the {display.width}x{display.height} display" if display is not None else ""
    rule = f"must be [x1, y1, x2, y2], the top-left and bottom-right corners{inside}, x1 < x2 and y1 < y2"
    if not (isinstance(value, list) and len(value) == 4 and all(is_int(v) for v in value)):
        raise a.error("region", rule)
    x1, y1, x2, y2 = (int(v) for v in value)
    w, h = (display.width, display.height) if display is not None else (COORD_MAX + 1, COORD_MAX + 1)
    if not (0 <= x1 < x2 <= w and 0 <= y1 < y2 <= h):
        raise a.error("region", rule)
    return x1, y1, x2, y2


def _modifiers(a: Args) -> tuple[str, ...]:
    return a.check("text", parse_x11_modifiers) if a.has("text") else ()


def _click(cls: type[ComputerClick]) -> VerbSpec:
    def parse(a: Args) -> ComputerClick:
        mark = a.opt_mark()
        return cls(coordinate=a.opt_coordinate("coordinate"), modifiers=_modifiers(a), mark=mark)

    return VerbSpec(
        cls, ("coordinate", "text", "mark"), parse, audit={"text": keep_if(parse_x11_modifiers)}
    )


def _duration(a: Args) -> float:
    return a.number("duration", 0, DURATION_MAX_S)


def _scroll(a: Args) -> ComputerScroll:
    return ComputerScroll(
        direction=a.choice("scroll_direction", ScrollDirection),
        amount=a.integer("scroll_amount", SCROLL_AMOUNT_MIN, SCROLL_AMOUNT_MAX, unit="notches"),
        mark=a.opt_mark(),
        coordinate=a.opt_coordinate("coordinate"),
        modifiers=_modifiers(a),
    )


_AT_POINTER = "it acts at the pointer's current position; move it first with mouse_move"
_TEXT_ONLY = (
    "clipboard_write takes text only; images and files travel on the file lane "
    "(POST /rig/files/<rigId>)"
)

VERBS = table(
    VerbSpec(ComputerScreenshot, ("marks",), lambda a: ComputerScreenshot(a.boolean("marks", False))),
    VerbSpec(ComputerCursorPosition, (), no_fields(ComputerCursorPosition)),
    VerbSpec(ComputerZoom, ("region",), lambda a: ComputerZoom(_region(a))),
    VerbSpec(
        ComputerMouseMove, ("coordinate",),
        lambda a: ComputerMouseMove(a.coordinate("coordinate")),
    ),
    _click(ComputerLeftClick),
    _click(ComputerRightClick),
    _click(ComputerMiddleClick),
    _click(ComputerDoubleClick),
    _click(ComputerTripleClick),
    VerbSpec(
        ComputerLeftMouseDown, (), no_fields(ComputerLeftMouseDown),
        refused={"coordinate": _AT_POINTER},
    ),
    VerbSpec(
        ComputerLeftMouseUp, (), no_fields(ComputerLeftMouseUp),
        refused={"coordinate": _AT_POINTER},
    ),
    VerbSpec(
        ComputerLeftClickDrag, ("start_coordinate", "coordinate"),
        lambda a: ComputerLeftClickDrag(
            start=a.coordinate("start_coordinate"), end=a.coordinate("coordinate")
        ),
    ),
    VerbSpec(
        ComputerScroll, ("coordinate", "mark", "scroll_direction", "scroll_amount", "text"), _scroll,
        audit={"text": keep_if(parse_x11_modifiers)},
    ),
    VerbSpec(
        ComputerKey, ("text",), lambda a: ComputerKey(a.check("text", parse_x11_keys)),
        refused={"duration": "key presses and releases at once; use hold_key to hold"},
        audit={"text": keep_if(parse_x11_keys)},
    ),
    VerbSpec(
        ComputerHoldKey, ("text", "duration"),
        lambda a: ComputerHoldKey(a.check("text", parse_x11_combo), _duration(a)),
        audit={"text": keep_if(parse_x11_combo)},
    ),
    VerbSpec(
        ComputerType, ("text", "mark"), lambda a: ComputerType(a.text("text"), a.opt_mark()),
        refused={"coordinate": "type enters text at the focus; click the field first (or give a mark)"},
        audit={"text": mask},
    ),
    VerbSpec(ComputerWait, ("duration",), lambda a: ComputerWait(_duration(a))),
    VerbSpec(
        ComputerSetDisplay, ("width", "height"),
        lambda a: ComputerSetDisplay(
            width=a.integer("width", DESKTOP_MIN.width, DESKTOP_MAX.width, unit="pixels"),
            height=a.integer("height", DESKTOP_MIN.height, DESKTOP_MAX.height, unit="pixels"),
        ),
    ),
    VerbSpec(
        ComputerClipboardRead, ("selection",),
        lambda a: ComputerClipboardRead(
            a.choice("selection", ClipboardSelection, ClipboardSelection.CLIPBOARD)
        ),
    ),
    VerbSpec(
        ComputerClipboardWrite, ("text",),
        lambda a: ComputerClipboardWrite(a.text("text", allow_empty=True)),
        refused={name: _TEXT_ONLY for name in ("image", "images", "files", "file", "path", "data")},
        audit={"text": mask},
    ),
)
