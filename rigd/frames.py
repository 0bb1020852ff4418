"""Stills on the host side, and what the live view needs to be cheap.

- The QMP ``screendump`` lanes: QEMU writes the display's framebuffer (PNG,
  or PPM — raw pixels, no compression, the cheapest thing QEMU can write)
  and the host scales, marks the pointer and encodes with Pillow, in a
  worker thread (:func:`encode_still`).
- :class:`Changes`: the change notices of one live view (the agent's X
  DAMAGE notices, and pointer moves the host sends itself), which the frame
  loop waits on instead of polling. Floods are bounded: a notice only sets a
  flag and grows one bounding box.
- :class:`LiveScreen`: what a machine offers the live view beyond
  ``still`` (change notices, and a still from the lane measured fastest).
"""

from __future__ import annotations

import io
from collections.abc import Iterable
from contextlib import AbstractAsyncContextManager
from dataclasses import dataclass
from typing import TYPE_CHECKING, Protocol, runtime_checkable

import trio
from PIL import Image, ImageDraw

if TYPE_CHECKING:
    from rigd.backends.base import Frame


@dataclass(frozen=True, slots=True)
class Still:
    data: bytes
    media_type: str
    display_w: int
    display_h: int
    image_w: int
    image_h: int
    #: Display pixels per image pixel (1.0 when the frame was not scaled).
    scale: float


def fit(width: int, height: int, max_w: int, max_h: int) -> tuple[int, int, float]:
    """Scale ``width``x``height`` down (never up) into ``max_w``x``max_h``; the
    same rule as the agent's, so both lanes state the same sizes."""
    scale = max(width / max_w, height / max_h, 1.0)
    if scale == 1.0:
        return width, height, 1.0
    return max(1, min(max_w, round(width / scale))), max(1, min(max_h, round(height / scale))), scale


#: The cursor mark, as the agent draws it (guest-agent ``mark_cursor``): magenta, black rim.
MARK_FILL = (255, 0, 255)
MARK_RIM = (0, 0, 0)
MARK_RADIUS = 7


def mark_cursor(image: Image.Image, x: float, y: float) -> None:
    """Draw the pointer's position on ``image`` (in place) exactly as the agent
    does: a ring with four ticks around the hot spot, in image pixels."""
    draw = ImageDraw.Draw(image)
    cx, cy, r = round(x), round(y), MARK_RADIUS
    ticks = [((cx - r - 5, cy), (cx - r + 1, cy)), ((cx + r - 1, cy), (cx + r + 5, cy)),
             ((cx, cy - r - 5), (cx, cy - r + 1)), ((cx, cy + r - 1), (cx, cy + r + 5))]
    for colour, width, grow in ((MARK_RIM, 5, 1), (MARK_FILL, 3, 0)):
        for a, b in ticks:
            draw.line([a, b], fill=colour, width=width)
        box = [cx - r - grow, cy - r - grow, cx + r + grow, cy + r + grow]
        draw.ellipse(box, outline=colour, width=width)


def encode_still(raw: bytes, *, max_w: int, max_h: int, fmt: str = "jpeg", quality: int = 75,
                 cursor: tuple[int, int] | None = None) -> Still:
    """Decode a PNG or PPM frame, scale it to fit, mark ``cursor`` (display
    pixels) when given and inside, and encode it as JPEG or PNG."""
    with Image.open(io.BytesIO(raw)) as src:
        src.load()
        image = src.convert("RGB") if src.mode != "RGB" else src.copy()
    width, height = image.size
    image_w, image_h, scale = fit(width, height, max_w, max_h)
    if (image_w, image_h) != (width, height):
        image = image.resize((image_w, image_h), Image.Resampling.BOX)
    if cursor is not None and 0 <= cursor[0] < width and 0 <= cursor[1] < height:
        mark_cursor(image, cursor[0] / scale, cursor[1] / scale)
    out = io.BytesIO()
    if fmt == "png":
        image.save(out, "PNG", optimize=False, compress_level=1)
        media = "image/png"
    else:
        image.save(out, "JPEG", quality=quality)
        media = "image/jpeg"
    return Still(out.getvalue(), media, width, height, image_w, image_h, scale)


Rect = tuple[int, int, int, int]


def union(a: Rect | None, rects: Iterable[Rect]) -> Rect | None:
    """The bounding box ``(x, y, w, h)`` of ``a`` and ``rects``."""
    box = None if a is None else (a[0], a[1], a[0] + a[2], a[1] + a[3])
    for x, y, w, h in rects:
        r = (x, y, x + w, y + h)
        if box is None:
            box = r
        else:
            box = (min(box[0], r[0]), min(box[1], r[1]), max(box[2], r[2]), max(box[3], r[3]))
    return None if box is None else (box[0], box[1], box[2] - box[0], box[3] - box[1])


@dataclass(frozen=True, slots=True)
class Change:
    """What happened since the frame loop last looked: why it should grab."""

    #: "damage" (the agent saw the screen change), "pointer" (the host moved it), or both.
    why: frozenset[str]
    #: The bounding box of the damage, display pixels (None: pointer only).
    area: Rect | None
    notices: int


class Changes:
    """Change notices for one live view.

    ``damage`` and ``pointer`` are plain callbacks (the guest channel's reader
    calls them for each notice): each costs O(1) — a flag, a counter, one
    bounding box — however many a guest sends. :meth:`wait` blocks until
    there is something, then takes it all; ``end`` (the watch is over)
    makes it return None.
    """

    def __init__(self) -> None:
        self._event = trio.Event()
        self._why: set[str] = set()
        self._area: Rect | None = None
        self._notices = 0
        self.ended = False
        #: Every notice counted, taken or not (a test sees a flood coalesced).
        self.received = 0

    def damage(self, rects: Iterable[Rect]) -> None:
        self.received += 1
        self._notices += 1
        self._area = union(self._area, rects)
        self._why.add("damage")
        self._event.set()

    def pointer(self) -> None:
        self._why.add("pointer")
        self._event.set()

    def end(self) -> None:
        self.ended = True
        self._event.set()

    @property
    def pending(self) -> bool:
        return bool(self._why)

    async def wait(self) -> Change | None:
        """The changes since the last call (waiting for one); None once ended."""
        await self._event.wait()
        if self.ended:
            return None
        change = Change(frozenset(self._why), self._area, self._notices)
        self._why.clear()
        self._area = None
        self._notices = 0
        self._event = trio.Event()
        return change


@dataclass(frozen=True, slots=True)
class Lane:
    """The lane a live view takes frames from, and why (what was measured)."""

    source: str
    why: str
    #: Milliseconds per grab measured for each candidate lane.
    measured_ms: dict[str, float]


@runtime_checkable
class LiveScreen(Protocol):
    """What a machine may offer the live view beyond ``Machine.still``."""

    def open_changes(self) -> AbstractAsyncContextManager[Changes | None]:
        """Change notices while the context is open; None when the machine cannot send them."""
        ...

    async def live_still(self, *, max_w: int, max_h: int, quality: int) -> tuple[Frame, Lane]:
        """A still (pointer marked) from the lane measured fastest on this machine."""
        ...


__all__ = ["Change", "Changes", "Lane", "LiveScreen", "Still", "encode_still", "fit", "mark_cursor", "union"]
