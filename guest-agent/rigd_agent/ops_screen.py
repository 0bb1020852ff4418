"""The desktop's screen ops (protocol 2): ``screen``, ``cursor``, ``display``,
``set_display``, ``keymap_bind`` and the damage watches.
"""

from __future__ import annotations

import contextlib
import time
from typing import Any

from rigd_agent.base import Refused, field_bool, field_choice, field_int, to_ms
from rigd_agent.core import AgentCore
from rigd_agent.desktop import xrandr_ok
from rigd_agent.x11 import (
    DAMAGE_MAX_WATCHES,
    DAMAGE_RATE_DEFAULT,
    DAMAGE_RATE_MAX,
    MODE_MAX,
    MODE_MIN,
    SCREEN_DEFAULT,
    SCREEN_MAX,
    DamageWatch,
    cvt_modeline,
    encode_image,
    field_bind,
    field_display,
    field_rect,
    fit_size,
    mark_cursor,
    resample_box,
)


class ScreenOps(AgentCore):
    def op_screen(self, rid: int, req: dict[str, Any]) -> None:
        max_w = field_int(req, "maxWidth", default=SCREEN_DEFAULT[0], lo=16, hi=SCREEN_MAX[0])
        max_h = field_int(req, "maxHeight", default=SCREEN_DEFAULT[1], lo=16, hi=SCREEN_MAX[1])
        quality = field_int(req, "quality", default=75, lo=1, hi=100)
        fmt = field_choice(req, "format", ("jpeg", "png"), default="jpeg")
        mark = field_bool(req, "markCursor", default=True)
        rect = field_rect(req)
        assert max_w is not None and max_h is not None and quality is not None
        desk = self.display_desktop(field_display(req), "screen")
        t0 = time.monotonic()
        image = desk.grab() if rect is None else desk.grab_rect(rect)
        t_grab = time.monotonic()
        cursor: list[int] | None = None
        if desk.has_xlib:
            with contextlib.suppress(Refused):
                x, y, _, _ = desk.pointer()
                cursor = [x, y] if rect is None else [x - rect[0], y - rect[1]]
        width, height = image.size
        image_w, image_h, scale = fit_size(width, height, max_w, max_h)
        if (image_w, image_h) != (width, height):
            image = image.resize((image_w, image_h), resample_box())
        marked = False
        if mark and cursor is not None and 0 <= cursor[0] < width and 0 <= cursor[1] < height:
            mark_cursor(image, cursor[0] / scale, cursor[1] / scale)
            marked = True
        t_scale = time.monotonic()
        data = encode_image(image, fmt, quality)
        t_enc = time.monotonic()
        payload = self.send_bulk(rid, data)
        self.ok(
            rid,
            displayWidth=width,
            displayHeight=height,
            imageWidth=image_w,
            imageHeight=image_h,
            scale=round(scale, 6),
            cursor=cursor,
            cursorMarked=marked,
            format=fmt,
            bytes=len(data),
            timings={
                "grabMs": to_ms(t_grab - t0),
                "scaleMs": to_ms(t_scale - t_grab),
                "encodeMs": to_ms(t_enc - t_scale),
                "totalMs": to_ms(time.monotonic() - t0),
            },
            **payload,
        )

    def op_cursor(self, rid: int, req: dict[str, Any]) -> None:
        desk = self.need_desktop("cursor")
        x, y, width, height = desk.pointer()
        self.ok(rid, cursor=[x, y], displayWidth=width, displayHeight=height)

    def op_display(self, rid: int, req: dict[str, Any]) -> None:
        desk = self.need_desktop("display")
        self.ok(rid, **desk.query_modes())

    def op_set_display(self, rid: int, req: dict[str, Any]) -> None:
        width = field_int(req, "width", required=True, lo=MODE_MIN[0], hi=MODE_MAX[0])
        height = field_int(req, "height", required=True, lo=MODE_MIN[1], hi=MODE_MAX[1])
        assert width is not None and height is not None
        desk = self.need_desktop("set_display")
        with desk.mode_lock:
            # Our own connection stays open across the xrandr runs: a server
            # with no client left resets (Xvfb does), and a reset forgets a
            # mode made by --newmode before --addmode can use it.
            desk.geometry()
            info = desk.query_modes()
            before = (info["width"], info["height"])
            if before != (width, height):
                output = info["output"]
                if output is None:
                    raise Refused("set_display: xrandr lists no connected output")
                mode = next((m for m in info["modes"] if (m["width"], m["height"]) == (width, height)), None)
                name = mode["name"] if mode is not None else f"{width}x{height}"
                if mode is None:
                    # A size the display's EDID does not list: make the mode.
                    # An existing mode of that name (an earlier set_display) is fine.
                    desk.run_xrandr("--newmode", name, *cvt_modeline(width, height))
                    xrandr_ok(desk.run_xrandr("--addmode", output, name), "--addmode")
                xrandr_ok(desk.run_xrandr("--output", output, "--mode", name), "--output --mode")
                info = desk.query_modes()
        self.ok(rid, **info, changed=(info["width"], info["height"]) != before)

    def op_keymap_bind(self, rid: int, req: dict[str, Any]) -> None:
        pairs = field_bind(req)
        desk = self.need_desktop("keymap")
        bound, per = desk.bind_keys(pairs)
        self.ok(rid, bound=bound, keysymsPerKeycode=per)

    def op_damage_watch(self, rid: int, req: dict[str, Any]) -> None:
        rate = field_int(req, "maxRate", default=DAMAGE_RATE_DEFAULT, lo=1, hi=DAMAGE_RATE_MAX)
        assert rate is not None
        desk = self.need_desktop("damage")
        watch = DamageWatch()
        try:
            with self.lock:
                if len(self.watches) >= DAMAGE_MAX_WATCHES:
                    raise Refused(f"at most {DAMAGE_MAX_WATCHES} damage watches at once")
                self.watches[rid] = watch
            sent = desk.watch_damage(
                watch, rate, lambda body: self.chan.send({"id": rid, "ev": "damage", **body}))
        finally:
            with self.lock:
                self.watches.pop(rid, None)
            watch.close()
        self.ok(rid, notices=sent)

    def op_damage_stop(self, rid: int, req: dict[str, Any]) -> None:
        wid = field_int(req, "watch", required=True)
        with self.lock:
            watch = self.watches.get(wid)  # type: ignore[arg-type]
        if watch is not None:
            watch.cancel()
        self.ok(rid, stopped=watch is not None)

