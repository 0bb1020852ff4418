"""computer_use zoom: the verb's region rule and the host-side cut of a full-size still (pure)."""

from __future__ import annotations

import io

import pytest
from PIL import Image

from rigd.backends.desktop import crop_still
from rigd.errors import BackendError, FieldError
from rigd.frames import Still
from rigd.model import AGENT_STILL_MAX, Display, Surface
from rigd.verbs import ComputerZoom, ParseContext, parse_action

CTX = ParseContext(display=Display(1920, 1080), surface=Surface.COMPUTER)


def still(w: int, h: int, box: tuple[int, int, int, int], *, claim: tuple[int, int] | None = None) -> Still:
    img = Image.new("RGB", (w, h), (255, 255, 255))
    img.paste((255, 0, 0), box)
    buf = io.BytesIO()
    img.save(buf, "PNG")
    cw, ch = claim or (w, h)
    return Still(buf.getvalue(), "image/png", w, h, cw, ch, 1.0)


def test_zoom_takes_a_region_inside_the_display() -> None:
    got = parse_action("computer_use", {"action": "zoom", "region": [0, 0, 1920, 1080]}, CTX)
    assert got == ComputerZoom(region=(0, 0, 1920, 1080)) and got.observation is True
    for region in ([0, 0, 1921, 10], [10, 10, 10, 20], [5, 5, 4, 9], [-1, 0, 5, 5], [0, 0, 5], "0,0,5,5",
                   [0, 0, 5.5, 5], [True, 0, 5, 5]):
        bad = parse_action("computer_use", {"action": "zoom", "region": region}, CTX)
        assert isinstance(bad, FieldError) and bad.field == "action.region", region
    assert isinstance(parse_action("computer_use", {"action": "zoom"}, CTX), FieldError)


def test_the_cut_is_at_display_resolution_and_only_shrinks_a_large_region() -> None:
    s = still(1920, 1080, (100, 100, 300, 200))
    data, w, h = crop_still(s, (100, 100, 300, 200), AGENT_STILL_MAX)
    assert (w, h) == (200, 100)  # the region's own pixels, not enlarged
    with Image.open(io.BytesIO(data)) as img:
        assert img.format == "JPEG" and img.size == (200, 100)
        red, green, _blue = img.convert("RGB").getpixel((100, 50))
        assert red > 200 > green + 100
    _data, w, h = crop_still(s, (0, 0, 1920, 1080), AGENT_STILL_MAX)
    assert (w, h) == (1280, 720)  # larger than an agent still: scaled down to fit


def test_a_still_that_is_not_the_size_it_claims_is_refused() -> None:
    with pytest.raises(BackendError, match="not the"):
        crop_still(still(10, 10, (0, 0, 5, 5), claim=(1920, 1080)), (0, 0, 5, 5), AGENT_STILL_MAX)
    bogus = Still(b"not an image", "image/png", 10, 10, 10, 10, 1.0)
    with pytest.raises(BackendError, match="does not decode"):
        crop_still(bogus, (0, 0, 5, 5), AGENT_STILL_MAX)
