"""Stills on the host side: the QMP ``screendump`` fallback's PNG, scaled and re-encoded.

The agent lane scales and encodes in the guest (guest protocol 2); when the
agent is absent or older, QEMU writes the display's framebuffer as PNG and
the host does the same work here with Pillow, in a worker thread.
"""

from __future__ import annotations

import io
from dataclasses import dataclass

from PIL import Image


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


def encode_still(png: bytes, *, max_w: int, max_h: int, fmt: str = "jpeg", quality: int = 75) -> Still:
    """Decode a PNG frame, scale it to fit, and encode it as JPEG or PNG."""
    with Image.open(io.BytesIO(png)) as src:
        src.load()
        image = src.convert("RGB")
    width, height = image.size
    image_w, image_h, scale = fit(width, height, max_w, max_h)
    if (image_w, image_h) != (width, height):
        image = image.resize((image_w, image_h), Image.Resampling.BOX)
    out = io.BytesIO()
    if fmt == "png":
        image.save(out, "PNG", optimize=False, compress_level=1)
        media = "image/png"
    else:
        image.save(out, "JPEG", quality=quality)
        media = "image/jpeg"
    return Still(out.getvalue(), media, width, height, image_w, image_h, scale)


__all__ = ["Still", "encode_still", "fit"]
