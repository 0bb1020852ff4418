"""Host-side stills (the QMP screendump fallback): scaling and encoding."""

from __future__ import annotations

import io

from PIL import Image

from rigd.frames import encode_still, fit


def _png(width: int, height: int) -> bytes:
    image = Image.new("RGB", (width, height), (10, 20, 30))
    image.putpixel((0, 0), (255, 255, 255))
    out = io.BytesIO()
    image.save(out, "PNG")
    return out.getvalue()


def test_fit_never_scales_up() -> None:
    assert fit(1280, 800, 1280, 800) == (1280, 800, 1.0)
    assert fit(800, 600, 1280, 800) == (800, 600, 1.0)


def test_fit_scales_larger_modes_down_keeping_the_aspect() -> None:
    assert fit(1920, 1080, 1280, 800) == (1280, 720, 1.5)
    assert fit(2560, 1600, 1280, 800) == (1280, 800, 2.0)


def test_encode_still_states_both_sizes_and_the_scale() -> None:
    still = encode_still(_png(1920, 1080), max_w=1280, max_h=800)
    assert (still.display_w, still.display_h) == (1920, 1080)
    assert (still.image_w, still.image_h) == (1280, 720)
    assert still.scale == 1.5
    assert still.media_type == "image/jpeg"
    with Image.open(io.BytesIO(still.data)) as decoded:
        assert decoded.format == "JPEG"
        assert decoded.size == (1280, 720)


def test_encode_still_png_at_full_size() -> None:
    still = encode_still(_png(640, 480), max_w=2560, max_h=1600, fmt="png")
    with Image.open(io.BytesIO(still.data)) as decoded:
        assert decoded.format == "PNG"
        assert decoded.size == (640, 480)
        assert decoded.getpixel((0, 0)) == (255, 255, 255)
