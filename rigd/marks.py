"""Marks: numbered boxes on the model's still, so an agent names an element instead of a pixel.

``screenshot {marks: true}`` finds the elements a person could act on (the DOM of a web page;
the accessibility tree of a desktop's windows), draws a numbered box on each in the *agent's*
still only (the person's live view is a separate lane and never shows them), and answers the
list ``[{id, role, name, box: [x, y, w, h]}]`` beside the image. ``click``/``type``/``scroll``
then take ``mark`` in place of a coordinate and act at the element's centre as it is *now*.

What holds the ids (:class:`MarkBook`): ids only grow over a rig's life, so an id drawn on
an older still is never the id of something else on a newer one: it is refused as stale,
naming the field, instead of being guessed. The newest still's ids are the live ones; the
page (or the guest) keeps the elements they stand for, so a navigation makes them stale too.

A disabled target (``[disabled]``, ``aria-disabled``, an insensitive widget) is waited for
up to :data:`ENABLE_WAIT_S` before the action fails saying it stayed disabled.

Everything a page or guest answers is hostile: :func:`parse_marks` keeps at most
:data:`MARKS_MAX` marks, each with a bounded role and name and a box clipped to the display.
Drawing is pure Pillow on the host (:func:`draw_marks`), in a worker thread.
"""

from __future__ import annotations

import base64
import io
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import Any

import trio
from PIL import Image, ImageDraw, ImageFont

from rigd.errors import Conflict, FieldError
from rigd.model import Display
from rigd.verbs.base import MARK_ID_MAX

#: The most marks one still carries (the rest are counted in the answer's note).
MARKS_MAX = 200
MARK_ROLE_MAX = 32
MARK_NAME_MAX = 80
#: How long an action at a disabled mark waits for it to enable, and how often it asks.
ENABLE_WAIT_S = 45.0
ENABLE_POLL_S = 0.25
FIELD = "action.mark"
#: Box colours, cycled by id: each readable on light and dark pages, with the label's text colour.
PALETTE: tuple[tuple[tuple[int, int, int], tuple[int, int, int]], ...] = (
    ((230, 25, 75), (255, 255, 255)),
    ((0, 130, 200), (255, 255, 255)),
    ((60, 180, 75), (0, 0, 0)),
    ((245, 130, 48), (0, 0, 0)),
    ((145, 30, 180), (255, 255, 255)),
    ((0, 128, 128), (255, 255, 255)),
)


@dataclass(frozen=True, slots=True)
class Mark:
    id: int
    role: str
    name: str
    #: x, y, width, height in the display's (the viewport's CSS) pixels, inside the display.
    box: tuple[int, int, int, int]
    disabled: bool = False

    @property
    def centre(self) -> tuple[int, int]:
        x, y, w, h = self.box
        return x + w // 2, y + h // 2

    def to_json(self) -> dict[str, Any]:
        out: dict[str, Any] = {"id": self.id, "role": self.role, "name": self.name, "box": list(self.box)}
        if self.disabled:
            out["disabled"] = True
        return out


def _text(value: object, limit: int) -> str:
    if not isinstance(value, str):
        return ""
    return " ".join(value.split())[:limit]


def clip_box(raw: object, display: Display) -> tuple[int, int, int, int] | None:
    """``[x, y, w, h]`` (numbers) clipped to the display; None when nothing of it is inside."""
    if not (isinstance(raw, list) and len(raw) == 4 and all(
            isinstance(v, int | float) and not isinstance(v, bool) and abs(v) < 1e7 for v in raw)):
        return None
    x0, y0 = max(0, int(raw[0])), max(0, int(raw[1]))
    x1 = min(display.width, int(raw[0] + raw[2]))
    y1 = min(display.height, int(raw[1] + raw[3]))
    if x1 - x0 < 1 or y1 - y0 < 1:
        return None
    return x0, y0, x1 - x0, y1 - y0


def parse_marks(got: object, *, first_id: int, display: Display) -> tuple[list[Mark], int]:
    """A page's or guest's list of ``{role, name, box, disabled}`` as marks numbered from
    ``first_id`` (an item without a usable box is skipped, keeping its number unused), and how
    many more it found than :data:`MARKS_MAX`."""
    items = got.get("items") if isinstance(got, dict) else None
    more = got.get("more") if isinstance(got, dict) else 0
    if not isinstance(items, list):
        raise ValueError("the answer has no list of items")
    marks: list[Mark] = []
    for index, item in enumerate(items[:MARKS_MAX]):
        if not isinstance(item, dict):
            continue
        box = clip_box(item.get("box"), display)
        if box is None:
            continue
        marks.append(Mark(first_id + index, _text(item.get("role"), MARK_ROLE_MAX) or "generic",
                          _text(item.get("name"), MARK_NAME_MAX), box, item.get("disabled") is True))
    extra = max(0, len(items) - MARKS_MAX)
    if isinstance(more, int) and not isinstance(more, bool) and 0 < more < 1_000_000:
        extra += more
    return marks, extra


class MarkBook:
    """The ids one rig (or one screen) has issued: which are live, which are stale."""

    def __init__(self) -> None:
        self.next_id = 1
        #: The live still's generation (0: none yet), its first id and how many ids it used.
        self.generation = 0
        self.first = 0
        self.count = 0
        self.marks: dict[int, Mark] = {}

    def begin(self) -> tuple[int, int]:
        """A new still's generation and first id; every id issued before is stale from now."""
        self.generation += 1
        self.first, self.count, self.marks = self.next_id, 0, {}
        return self.generation, self.first

    def issued(self, marks: list[Mark], numbers_used: int) -> None:
        self.count = numbers_used
        self.marks = {m.id: m for m in marks}
        self.next_id = min(MARK_ID_MAX, self.first + max(numbers_used, 1))

    def issue(self, got: object, display: Display) -> tuple[list[Mark], int]:
        """The new still's marks from a page's or guest's answer (:func:`parse_marks`, numbered
        from :meth:`begin`'s first id), issued; and how many were left out."""
        marks, more = parse_marks(got, first_id=self.first, display=display)
        items = got.get("items") if isinstance(got, dict) else []
        self.issued(marks, min(len(items) if isinstance(items, list) else 0, MARKS_MAX))
        return marks, more

    def live(self, mark: int) -> Mark:
        """The live mark ``mark``, or a field error saying why it is not one."""
        if self.generation == 0 or mark >= self.next_id:
            raise FieldError(FIELD, f"mark {mark} was never issued: take screenshot {{marks: true}} and "
                                    "use an id drawn on it")
        if mark < self.first:
            raise FieldError(FIELD, f"mark {mark} is stale: it was drawn on an older still, and ids are "
                                    "reassigned on every marked screenshot; take screenshot {marks: true} "
                                    "again")
        found = self.marks.get(mark)
        if found is None:
            raise FieldError(FIELD, f"mark {mark} was never issued: the newest still's marks are "
                                    f"{self.first}-{self.first + self.count - 1}")
        return found


#: Where a mark's element is now and whether it is disabled, or why the mark is stale.
Located = tuple[tuple[int, int], bool] | str


async def located(mark: int, known: Mark, locate: Callable[[], Awaitable[Located]], *,
                  wait_enabled: bool, poll_s: float = ENABLE_POLL_S) -> tuple[tuple[int, int], float]:
    """Where mark ``mark``'s element is now, and how long it was waited for to enable (0 when
    it was enabled at once): asked of ``locate`` every ``poll_s`` while the element is
    disabled, for up to :data:`ENABLE_WAIT_S`. A stale mark is a field error naming
    ``action.mark``; one that stayed disabled a conflict naming it."""
    start, polls = trio.current_time(), 0
    while True:
        got = await locate()
        if isinstance(got, str):
            raise FieldError(FIELD, f"mark {mark} is stale: {got}; take screenshot {{marks: true}} again")
        point, disabled = got
        waited = trio.current_time() - start
        if not (wait_enabled and disabled):
            return point, waited if polls else 0.0
        if waited >= ENABLE_WAIT_S:
            raise Conflict(f"mark {mark} ({known.role} {known.name!r}) stayed disabled for "
                           f"{ENABLE_WAIT_S:g} s", reason="disabled", field=FIELD)
        polls += 1
        await trio.sleep(poll_s)


def acted(mark: int | None, waited: float) -> dict[str, Any]:
    """What an action's answer adds when it acted at a mark: the id, and how long it waited
    for a disabled target to enable."""
    if mark is None:
        return {}
    out: dict[str, Any] = {"mark": mark}
    if waited:
        out["waitedS"] = round(waited, 3)
        out["note"] = f"mark {mark} was disabled; it enabled after {waited:.1f} s"
    return out


async def annotate(answer: dict[str, Any], marks: list[Mark], more: int) -> dict[str, Any]:
    """A screenshot verb's ``answer`` with ``marks`` drawn on its image (at its ``scale``) and
    listed beside it."""
    jpeg = base64.b64decode(answer["image"]["data"])
    drawn = await trio.to_thread.run_sync(draw_marks, jpeg, marks, float(answer["scale"]))
    out = {**answer, "image": {**answer["image"], "data": base64.b64encode(drawn).decode()},
           "marks": [m.to_json() for m in marks]}
    note = ("marks: each box is [x, y, width, height] in the display's pixels (a page's: CSS pixels "
            "of the viewport); act on one with {mark: id}; ids from an older still are refused")
    if more:
        note += f"; {more} more elements were not marked (at most {MARKS_MAX} per still)"
        out["marksOmitted"] = more
    out["note"] = f"{answer['note']}; {note}" if answer.get("note") else note
    return out


def _font(size: int) -> ImageFont.FreeTypeFont | ImageFont.ImageFont:
    try:
        return ImageFont.load_default(size=size)
    except (OSError, TypeError, AttributeError):  # a Pillow without FreeType: its bitmap font
        return ImageFont.load_default()


def draw_marks(jpeg: bytes, marks: list[Mark], scale: float, *, quality: int = 75) -> bytes:
    """``jpeg`` with each mark's box and id drawn on it; ``scale`` is display pixels per
    image pixel (a still smaller than the display)."""
    with Image.open(io.BytesIO(jpeg)) as opened:
        img = opened.convert("RGB")
    draw = ImageDraw.Draw(img)
    font = _font(13)
    factor = 1.0 / scale if scale > 0 else 1.0
    for mark in marks:
        colour, ink = PALETTE[(mark.id - 1) % len(PALETTE)]
        x, y, w, h = (round(v * factor) for v in mark.box)
        x1, y1 = min(img.width - 1, x + max(w, 1) - 1), min(img.height - 1, y + max(h, 1) - 1)
        draw.rectangle((x, y, x1, y1), outline=colour, width=2)
        label = str(mark.id)
        left, top, right, bottom = draw.textbbox((0, 0), label, font=font)
        lw, lh = right - left + 6, bottom - top + 4
        # The label sits on the box's top-left corner, inside it when the box touches the top.
        ly = y - lh if y - lh >= 0 else y
        lx = min(x, max(0, img.width - lw))
        draw.rectangle((lx, ly, lx + lw - 1, ly + lh - 1), fill=colour)
        draw.text((lx + 3 - left, ly + 2 - top), label, fill=ink, font=font)
    out = io.BytesIO()
    img.save(out, "JPEG", quality=quality)
    return out.getvalue()


def marks_text(marks: list[dict[str, Any]], more: int) -> str:
    """Marks (their JSON shape, :meth:`Mark.to_json`) as lines for a model; the names are the
    page's or the guest's: untrusted."""
    lines = [f"[{m['id']}] {m['role']} {m['name']!r} at {m['box'][0]},{m['box'][1]} size "
             f"{m['box'][2]}x{m['box'][3]}" + (" (disabled)" if m.get("disabled") else "") for m in marks]
    if more:
        lines.append(f"... and {more} more elements not marked (at most {MARKS_MAX} per still)")
    return "\n".join(lines) if lines else "(no elements to mark in view)"


__all__ = [
    "ENABLE_POLL_S", "ENABLE_WAIT_S", "MARKS_MAX", "MARK_ID_MAX", "Located", "Mark", "MarkBook", "acted",
    "annotate", "clip_box", "draw_marks", "located", "marks_text", "parse_marks",
]
