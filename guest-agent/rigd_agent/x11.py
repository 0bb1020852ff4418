"""The desktop's pure parts (guest protocol 2): the session's environment, selection targets
and media types, image fitting and encoding, damage rectangles, modelines and xrandr's
output. Nothing here talks to X.
"""

from __future__ import annotations

import contextlib
import os
import re
import threading
from typing import Any

from rigd_agent.base import BadRequest, clip, close_quietly

SESSION_ENV_FILE = "/etc/rigd/session.env"


SESSION_KEYS = ("DISPLAY", "XAUTHORITY")  # taken from the agent's own environment too


DESKTOP_FEATURES = (
    "screen", "cursor", "display", "set_display", "clipboard_read", "clipboard_write", "session_env",
    "clipboard_image", "clipboard_files", "keymap", "damage",
)  # fmt: skip


FEATURES = ("files",)  # both protocols, standard library only


NO_DISPLAY = "no display: this rig has no X session"


INLINE_MAX = 512 * 1024  # bigger payloads (images, clipboard text) go as streamed `data` chunks


MAX_CLIPBOARD = 1 << 20  # bytes of UTF-8, both directions


MAX_CLIPBOARD_IMAGE = 16 << 20  # bytes of an image, both directions


MEDIA_TYPES = ("text/plain", "text/uri-list", "image/png", "image/jpeg")


CLIPBOARD_KINDS = ("text", "image", "uris")


SCREEN_MAX = (2560, 1600)  # the largest still anyone may ask for (RIGS.md §7: people)


SCREEN_DEFAULT = (1280, 800)  # the agent lane's cap


MODE_MIN = (640, 480)


MODE_MAX = (2560, 1600)


SELECTIONS = {"clipboard": "CLIPBOARD", "primary": "PRIMARY", "xdnd": "XdndSelection"}


# Text targets asked of a selection owner, best first (decoding per target).
TEXT_TARGETS = ("UTF8_STRING", "text/plain;charset=utf-8", "STRING", "TEXT", "text/plain", "text/uri-list")


IMAGE_TARGETS = ("image/png", "image/jpeg")


URI_TARGETS = ("text/uri-list",)


MAX_TARGETS = 64  # TARGETS names reported, each at most MAX_TARGET_LEN characters


MAX_TARGET_LEN = 128


KEYMAP_MAX_BIND = 32


DAMAGE_RATE_DEFAULT = 30  # notices per second at most, per watch (the host may ask 1-60)


DAMAGE_RATE_MAX = 60


DAMAGE_MAX_RECTS = 16  # per notice; more are merged into their bounding box


DAMAGE_MAX_WATCHES = 8  # watches at once (one per live view on the host)


KEYSYM_MAX = 0x1FFFFFF


SELECTION_TIMEOUT_S = 3.0


XRANDR_TIMEOUT_S = 20.0


_ENV_NAME = re.compile(r"[A-Za-z_][A-Za-z0-9_]*\Z")


DISPLAY_NAME = re.compile(r"(?P<host>[^:]*):(?P<num>\d+)(?:\.\d+)?\Z")


def read_session_env(path: str | None, own: dict[str, str] | os._Environ[str]) -> dict[str, str]:
    """The X session's environment: ``KEY=VALUE`` lines of ``path``, then
    ``DISPLAY``/``XAUTHORITY`` of the agent's own environment over them.

    Empty unless a ``DISPLAY`` is known: no display, no desktop.
    """
    env: dict[str, str] = {}
    text = ""
    if path:
        try:
            with open(path, encoding="utf-8", errors="replace") as f:
                text = f.read(65536)
        except OSError:
            text = ""
    for raw in text.splitlines():
        line = raw.strip()
        if not line or line.startswith("#"):
            continue
        if line.startswith("export "):
            line = line[7:].lstrip()
        key, sep, value = line.partition("=")
        key, value = key.strip(), value.strip()
        if not sep or not _ENV_NAME.match(key) or "\0" in value:
            continue
        if len(value) >= 2 and value[0] == value[-1] and value[0] in "'\"":
            value = value[1:-1]
        env[key] = value
    for key in SESSION_KEYS:
        if own.get(key):
            env[key] = own[key]
    return env if env.get("DISPLAY") else {}


def pick_targets(offered: list[str] | None, accept: tuple[str, ...]) -> list[str]:
    """The targets to ask a selection owner for, best first, among the ``accept``ed kinds.

    Images first (PNG, then JPEG), then a URI list, then text as ever (whose
    last resort is a URI list too). ``offered`` is the owner's TARGETS;
    ``None`` when it did not answer them, then the likely ones are tried.
    """
    order: list[str] = []
    if "image" in accept:
        order += IMAGE_TARGETS
    if "uris" in accept:
        order += URI_TARGETS
    if "text" in accept:
        order += TEXT_TARGETS if offered is not None else TEXT_TARGETS[:3]
    order = list(dict.fromkeys(order))
    return order if offered is None else [t for t in order if t in offered]


def media_type(target: str | None) -> str:
    """What a reply says it carries: the image and URI-list targets name themselves."""
    return target if target in IMAGE_TARGETS or target in URI_TARGETS else "text/plain"


def report_targets(offered: list[str] | None) -> list[str]:
    return [t for t in offered or () if 0 < len(t) <= MAX_TARGET_LEN][:MAX_TARGETS]


def field_accept(req: dict[str, Any]) -> tuple[str, ...]:
    value = req.get("accept")
    if value is None:
        return ("text",)
    if not isinstance(value, list) or not value or not all(v in CLIPBOARD_KINDS for v in value):
        raise BadRequest(f"accept must be a non-empty list of {', '.join(CLIPBOARD_KINDS)}")
    return tuple(dict.fromkeys(value))


def field_bind(req: dict[str, Any]) -> list[tuple[int, int]]:
    value = req.get("bind")
    if not isinstance(value, list) or not 1 <= len(value) <= KEYMAP_MAX_BIND:
        raise BadRequest(f"bind must be a list of 1 to {KEYMAP_MAX_BIND} [keycode, keysym] pairs")
    pairs: list[tuple[int, int]] = []
    for i, pair in enumerate(value):
        if not (isinstance(pair, list) and len(pair) == 2 and all(type(v) is int for v in pair)):
            raise BadRequest(f"bind[{i}] must be a [keycode, keysym] pair of integers")
        keycode, keysym = pair
        if not 8 <= keycode <= 255:
            raise BadRequest(f"bind[{i}]: keycode must be between 8 and 255")
        if not 0 <= keysym <= KEYSYM_MAX:
            raise BadRequest(f"bind[{i}]: keysym must be between 0 and {KEYSYM_MAX:#x}")
        pairs.append((keycode, keysym))
    return pairs


#: X displays of the rig's own an agent may grab besides its session's (a browser rig's engine
#: display): at most this many, each a local ``:N``.
MAX_OTHER_DISPLAYS = 4
RECT_MAX = 16384


def field_display(req: dict[str, Any]) -> str | None:
    """``display``: a local X display (``:99``), or None for the session's own."""
    value = req.get("display")
    if value is None:
        return None
    m = DISPLAY_NAME.match(value) if isinstance(value, str) else None
    if m is None or m.group("host") not in ("", "unix") or int(m.group("num")) > 65535:
        raise BadRequest("display must be a local X display such as :99")
    return f":{int(m.group('num'))}"


def field_rect(req: dict[str, Any]) -> tuple[int, int, int, int] | None:
    """``rect``: ``[x, y, width, height]`` in screen pixels (a crop before scaling), or None."""
    value = req.get("rect")
    if value is None:
        return None
    if not (isinstance(value, list) and len(value) == 4 and all(type(v) is int for v in value)):
        raise BadRequest("rect must be [x, y, width, height], four integers")
    x, y, w, h = value
    if not (0 <= x < RECT_MAX and 0 <= y < RECT_MAX and 1 <= w <= RECT_MAX and 1 <= h <= RECT_MAX):
        raise BadRequest(f"rect: x and y must be 0 to {RECT_MAX - 1}, width and height 1 to {RECT_MAX}")
    return x, y, w, h


def fit_size(width: int, height: int, max_w: int, max_h: int) -> tuple[int, int, float]:
    """Scale a ``width``x``height`` screen down (never up) to fit ``max_w``x``max_h``.

    Returns ``(image_w, image_h, scale)`` where ``scale`` is display pixels
    per image pixel: a point ``(x, y)`` of the image is ``(x*scale, y*scale)``
    on the screen.
    """
    scale = max(width / max_w, height / max_h, 1.0)
    if scale == 1.0:
        return width, height, 1.0
    image_w = max(1, min(max_w, round(width / scale)))
    image_h = max(1, min(max_h, round(height / scale)))
    return image_w, image_h, scale


def coalesce_rects(
    rects: list[tuple[int, int, int, int]], width: int, height: int, limit: int = DAMAGE_MAX_RECTS
) -> list[list[int]]:
    """Damaged ``(x, y, w, h)`` rectangles, clipped to the screen, as at most
    ``limit`` ``[x, y, w, h]`` lists: duplicates and rectangles inside another
    are dropped, and when more remain they become their one bounding box."""
    clipped: list[tuple[int, int, int, int]] = []
    for x, y, w, h in rects:
        x0, y0 = max(0, x), max(0, y)
        x1, y1 = min(width, x + w), min(height, y + h)
        if x1 > x0 and y1 > y0:
            clipped.append((x0, y0, x1, y1))
    kept: list[tuple[int, int, int, int]] = []
    for r in sorted(set(clipped), key=lambda r: (r[0] - r[2]) * (r[3] - r[1])):  # biggest first
        if not any(k[0] <= r[0] and k[1] <= r[1] and k[2] >= r[2] and k[3] >= r[3] for k in kept):
            kept.append(r)
    if len(kept) > limit:
        kept = [(min(k[0] for k in kept), min(k[1] for k in kept),
                 max(k[2] for k in kept), max(k[3] for k in kept))]  # fmt: skip
    return [[x0, y0, x1 - x0, y1 - y0] for x0, y0, x1, y1 in kept]


class DamageWatch:
    """One ``damage_watch``: stopped by ``damage_stop`` (or the agent's end);
    a pipe wakes its thread from ``select``."""

    def __init__(self) -> None:
        self.stop = threading.Event()
        self.wake_r, self.wake_w = os.pipe()

    def cancel(self) -> None:
        self.stop.set()
        with contextlib.suppress(OSError):
            os.write(self.wake_w, b"x")

    def close(self) -> None:
        for fd in (self.wake_r, self.wake_w):
            close_quietly(fd)


#: The cursor mark: magenta with a black rim, readable on any background.
MARK_FILL = (255, 0, 255)


MARK_RIM = (0, 0, 0)


MARK_RADIUS = 7


def mark_cursor(image: Any, x: float, y: float) -> None:
    """Draw the pointer's position on ``image`` (in place): a ring with four
    ticks around the hot spot, whose own pixel is left untouched. Its size is
    in image pixels, so it reads the same at any scale."""
    from PIL import ImageDraw

    draw = ImageDraw.Draw(image)
    cx, cy, r = round(x), round(y), MARK_RADIUS
    ticks = [((cx - r - 5, cy), (cx - r + 1, cy)), ((cx + r - 1, cy), (cx + r + 5, cy)),
             ((cx, cy - r - 5), (cx, cy - r + 1)), ((cx, cy + r - 1), (cx, cy + r + 5))]  # fmt: skip
    for colour, width, grow in ((MARK_RIM, 5, 1), (MARK_FILL, 3, 0)):
        for a, b in ticks:
            draw.line([a, b], fill=colour, width=width)
        box = [cx - r - grow, cy - r - grow, cx + r + grow, cy + r + grow]
        draw.ellipse(box, outline=colour, width=width)


def resample_box() -> Any:
    from PIL import Image

    resampling = getattr(Image, "Resampling", Image)  # Pillow < 9.1 has the bare names
    return resampling.BOX


def encode_image(image: Any, fmt: str, quality: int) -> bytes:
    import io

    buf = io.BytesIO()
    if fmt == "png":
        image.save(buf, "PNG", compress_level=1)  # level 1: ~25% faster than 6 under TCG
    else:
        image.save(buf, "JPEG", quality=quality)
    return buf.getvalue()


def cvt_modeline(width: int, height: int, refresh: float = 60.0) -> list[str]:
    """A VESA CVT modeline (``xrandr --newmode`` arguments after the name).

    The CVT formula of ``cvt WIDTH HEIGHT`` (libxcvt), without its rounding
    of the active width: a virtual display takes any width, and the mode
    must be exactly the size asked for. The image has no ``cvt`` binary.
    """
    gran, min_v_porch, min_vsync_bp, hsync_pct, clock_step = 8, 3, 550.0, 8, 250
    if height % 3 == 0 and height * 4 // 3 == width:
        vsync = 4
    elif height % 9 == 0 and height * 16 // 9 == width:
        vsync = 5
    elif height % 10 == 0 and height * 16 // 10 == width:
        vsync = 6
    elif (height % 4 == 0 and height * 5 // 4 == width) or (height % 9 == 0 and height * 15 // 9 == width):
        vsync = 7
    else:
        vsync = 10
    hperiod = (1_000_000.0 / refresh - min_vsync_bp) / (height + min_v_porch)  # microseconds
    vsync_bp = max(int(min_vsync_bp / hperiod) + 1, vsync + min_v_porch)
    vtotal = height + vsync_bp + min_v_porch
    c_prime, m_prime = 30.0, 300.0
    hblank_pct = max(c_prime - m_prime * hperiod / 1000.0, 20.0)
    hblank = int(width * hblank_pct / (100.0 - hblank_pct))
    hblank -= hblank % (2 * gran)
    htotal = width + hblank
    hsync_end = width + hblank // 2
    hsync_start = hsync_end - (htotal * hsync_pct) // 100
    hsync_start += gran - hsync_start % gran
    vsync_start = height + min_v_porch
    clock = int(htotal * 1000.0 / hperiod)
    clock -= clock % clock_step
    numbers = (width, hsync_start, hsync_end, htotal, height, vsync_start, vsync_start + vsync, vtotal)
    return [f"{clock / 1000:.2f}", *map(str, numbers), "-hsync", "+vsync"]


_XR_SCREEN = re.compile(r"^Screen \d+:.*\bcurrent (\d+) x (\d+)")


_XR_OUTPUT = re.compile(r"^(\S+) (connected|disconnected)( primary)?")


_XR_MODE = re.compile(r"^\s+((\d+)x(\d+)\S*)\s*(.*)$")


def parse_xrandr(text: str) -> dict[str, Any]:
    """``xrandr --query`` → the screen size, the output in use and its modes.

    The output is the primary connected one, else the first connected one.
    Modes are listed once per size, in xrandr's order (preferred first).
    """
    width = height = 0
    outputs: list[tuple[str, bool, list[dict[str, Any]]]] = []
    current: list[dict[str, Any]] | None = None
    for line in text.splitlines():
        m = _XR_SCREEN.match(line)
        if m:
            width, height = int(m.group(1)), int(m.group(2))
            current = None
            continue
        m = _XR_OUTPUT.match(line)
        if m:
            if m.group(2) == "connected":
                current = []
                outputs.append((m.group(1), bool(m.group(3)), current))
            else:
                current = None
            continue
        m = _XR_MODE.match(line)
        if m and current is not None and line[:1].isspace():
            rates = m.group(4)
            mode = {"width": int(m.group(2)), "height": int(m.group(3)), "name": m.group(1),
                    "current": "*" in rates, "preferred": "+" in rates}  # fmt: skip
            size = (mode["width"], mode["height"])
            same = next((x for x in current if (x["width"], x["height"]) == size), None)
            if same is None:
                current.append(mode)
            else:
                same["current"] = same["current"] or mode["current"]
                same["preferred"] = same["preferred"] or mode["preferred"]
        elif not line[:1].isspace():
            current = None
    chosen = next((o for o in outputs if o[1]), outputs[0] if outputs else None)
    return {
        "width": width,
        "height": height,
        "output": chosen[0] if chosen else None,
        "modes": chosen[2] if chosen else [],
        "maxWidth": MODE_MAX[0],
        "maxHeight": MODE_MAX[1],
    }


def x_error_text(exc: BaseException) -> str:
    text = str(exc).strip().replace("\n", " ")
    return clip(f"{type(exc).__name__}: {text}" if text else type(exc).__name__, 300)

