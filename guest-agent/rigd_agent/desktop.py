"""The X session the agent can see (guest protocol 2): stills, the cursor, display modes,
selections, the keymap and damage, through python3-xlib and python3-pil (imported lazily,
so the agent still starts on the terminal tools disk, which has only the standard
library) and xrandr/xclip.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import socket
import subprocess
import threading
import time
from collections.abc import Callable
from typing import Any, TypeVar

from rigd_agent.base import CLEAN_PATH, Refused, clean_env, clip
from rigd_agent.x11 import (
    DAMAGE_MAX_RECTS,
    DESKTOP_FEATURES,
    DISPLAY_NAME,
    IMAGE_TARGETS,
    MAX_CLIPBOARD,
    MAX_CLIPBOARD_IMAGE,
    SELECTION_TIMEOUT_S,
    SELECTIONS,
    XRANDR_TIMEOUT_S,
    DamageWatch,
    coalesce_rects,
    parse_xrandr,
    pick_targets,
    report_targets,
    x_error_text,
)
from rigd_agent.xgrab import OffScreen, RawGrabber, XGrabError, off_screen

T = TypeVar("T")


class Desktop:
    """The X session of a computer rig, as root sees it.

    One python-xlib connection is kept for quick queries (pointer, screen
    size, selection owners) and re-made when the X server restarts; frames
    are grabbed by Pillow's XCB code (C: faster than python-xlib's
    ``get_image`` under emulation); selections are read on a connection of
    their own (they need events); xclip owns written selections.
    """

    def __init__(self, env: dict[str, str], *, session: bool = True) -> None:
        self.env = dict(env)
        self.name = env["DISPLAY"]
        if session:
            # python-xlib and Xcb read these from the process environment. The
            # agent's own environment is never handed to children. (Another
            # display of the rig's own — ``session=False`` — is named per call.)
            os.environ["DISPLAY"] = self.name
            if env.get("XAUTHORITY"):
                os.environ["XAUTHORITY"] = env["XAUTHORITY"]
        self.xlock = threading.Lock()
        self.mode_lock = threading.Lock()
        self.clip_lock = threading.Lock()
        self._dpy: Any = None
        #: Rectangles of a display of the rig's own (no cookie) are read on a connection of
        #: ours (rigd_agent.xgrab); the session's go through Pillow, whole, then cropped.
        m = DISPLAY_NAME.match(self.name)
        self.raw = RawGrabber(int(m.group("num"))) if not session and m is not None else None
        self.has_pil = _has_module("PIL")
        self.has_xlib = _has_module("Xlib")
        self.xrandr = shutil.which("xrandr", path=CLEAN_PATH)
        self.xclip = shutil.which("xclip", path=CLEAN_PATH)

    def features(self) -> list[str]:
        have = {
            "screen": self.has_pil,
            "cursor": self.has_xlib,
            "display": bool(self.xrandr),
            "set_display": bool(self.xrandr),
            "clipboard_read": self.has_xlib,
            "clipboard_write": bool(self.xclip) and self.has_xlib,
            "session_env": True,
            "clipboard_image": bool(self.xclip) and self.has_xlib,
            "clipboard_files": bool(self.xclip) and self.has_xlib,
            "keymap": self.has_xlib,
            "damage": self.has_xlib,
        }
        return [f for f in DESKTOP_FEATURES if have[f]]

    def warm_up(self) -> None:
        """Import the heavy modules early (0.4-0.7 s under TCG), off the request path."""
        with contextlib.suppress(Exception):
            if self.has_pil:
                from PIL import Image, ImageDraw, ImageGrab  # noqa: F401

                Image.preinit()
            if self.has_xlib:
                import Xlib.display  # noqa: F401

    def reachable(self) -> bool:
        """Cheap: does the X server's socket accept a connection (no X handshake)?"""
        m = DISPLAY_NAME.match(self.name)
        if m is None:
            return False
        if self.env.get("XAUTHORITY") and not os.access(self.env["XAUTHORITY"], os.R_OK):
            return False
        host, num = m.group("host"), int(m.group("num"))
        try:
            if host in ("", "unix"):
                with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as s:
                    s.settimeout(0.5)
                    s.connect(f"/tmp/.X11-unix/X{num}")
            else:
                with socket.create_connection((host, 6000 + num), timeout=0.5):
                    pass
        except OSError:
            return False
        return True

    # ---- python-xlib, the shared connection

    def need(self, feature: str) -> None:
        if feature not in self.features():
            xclip = "xclip and python3-xlib"
            missing = {"screen": "python3-pil", "cursor": "python3-xlib", "display": "xrandr",
                       "set_display": "xrandr", "clipboard_read": "python3-xlib", "clipboard_write": xclip,
                       "clipboard_image": xclip, "clipboard_files": xclip, "keymap": "python3-xlib",
                       "damage": "python3-xlib"}.get(feature, feature)  # fmt: skip
            raise Refused(f"no display support for {feature}: the image lacks {missing}")

    def _connect(self) -> Any:
        try:
            import Xlib.display
        except ImportError:
            raise Refused("no display support: the image lacks python3-xlib") from None
        try:
            return Xlib.display.Display(self.name)
        except Exception as exc:
            why = x_error_text(exc)
            raise Refused(f"display not ready: cannot connect to {self.name} ({why})") from None

    def x(self, fn: Callable[[Any], T]) -> T:
        """Run ``fn(display)`` on the shared connection; one retry on a fresh one."""
        with self.xlock:
            for attempt in (1, 2):
                if self._dpy is None:
                    self._dpy = self._connect()
                try:
                    return fn(self._dpy)
                except Refused:
                    raise
                except Exception as exc:
                    # The X server went away (lightdm restarted it) or the
                    # connection broke: start over once, then give up.
                    with contextlib.suppress(Exception):
                        self._dpy.close()
                    self._dpy = None
                    if attempt == 2:
                        raise Refused(f"display not ready: {x_error_text(exc)}") from None
        raise AssertionError("unreachable")

    def geometry(self) -> tuple[int, int]:
        def q(d: Any) -> tuple[int, int]:
            g = d.screen().root.get_geometry()  # fresh: the setup block goes stale after xrandr
            return int(g.width), int(g.height)

        return self.x(q)

    def pointer(self) -> tuple[int, int, int, int]:
        """``(x, y, screen width, screen height)`` of the pointer."""

        def q(d: Any) -> tuple[int, int, int, int]:
            root = d.screen().root
            p = root.query_pointer()
            g = root.get_geometry()
            return int(p.root_x), int(p.root_y), int(g.width), int(g.height)

        return self.x(q)

    def selection_owner(self, atom_name: str) -> int:
        def q(d: Any) -> int:
            owner = d.get_selection_owner(d.intern_atom(atom_name))
            return int(getattr(owner, "id", owner) or 0)

        return int(self.x(q))

    # ---- frames

    def grab_rect(self, rect: tuple[int, int, int, int]) -> Any:
        """``rect`` of the screen as a PIL RGB image: read alone where it can be (a display of
        the rig's own), else cropped from the whole screen."""
        x, y, w, h = rect
        if self.raw is None:
            image = self.grab()
            why = off_screen(rect, *image.size)
            if why is not None:
                raise Refused(why)
            return image.crop((x, y, x + w, y + h))
        from PIL import Image

        try:
            data, _sw, _sh = self.raw.grab(x, y, w, h)
        except OffScreen as exc:
            raise Refused(str(exc)) from None
        except XGrabError as exc:
            raise Refused(f"display not ready: {exc}") from None
        return Image.frombytes("RGB", (w, h), bytes(data), "raw", "BGRX")

    def grab(self) -> Any:
        """The whole screen as a PIL RGB image (the cursor is never in it)."""
        try:
            from PIL import Image, ImageGrab
        except ImportError:
            raise Refused("no display support for screen: the image lacks python3-pil") from None
        try:
            return ImageGrab.grab(xdisplay=self.name)
        except OSError as exc:
            if "XCB support" not in str(exc):
                raise Refused(f"display not ready: {x_error_text(exc)}") from None
        # A Pillow built without XCB: python-xlib's GetImage (slower).

        def q(d: Any) -> Any:
            import Xlib.X

            root = d.screen().root
            g = root.get_geometry()
            raw = root.get_image(0, 0, g.width, g.height, Xlib.X.ZPixmap, 0xFFFFFFFF)
            return Image.frombytes("RGB", (g.width, g.height), raw.data, "raw", "BGRX")

        return self.x(q)

    # ---- change notices (X DAMAGE)

    def watch_damage(self, watch: DamageWatch, rate: int, notify: Callable[[dict[str, Any]], bool]) -> int:
        """Tell ``notify`` where the screen changed, at most ``rate`` times a
        second, until ``watch`` is stopped; returns the notices sent.

        A DAMAGE object on the root (delta rectangles: an event only when the
        damaged region grows) on a connection of its own; the region is
        emptied (DamageSubtract) when a notice goes out, so the next drawing
        reports again. Between notices the rectangles are gathered, so a
        screen that changes all the time costs ``rate`` lines a second, and
        an idle one costs nothing. The pointer is not drawn into the screen
        (no damage): the host knows where it moves it."""
        try:
            import select

            from Xlib.ext import damage
        except ImportError:
            raise Refused("no display support for damage: the image lacks python3-xlib") from None
        d = self._connect()
        try:
            if not d.has_extension("DAMAGE"):
                raise Refused("no display support for damage: the X server has no DAMAGE extension")
            d.damage_query_version()
            notify_code = d.query_extension("DAMAGE").first_event + damage.DamageNotifyCode
            root = d.screen().root
            dmg = root.damage_create(damage.DamageReportDeltaRectangles)
            d.flush()
            interval = 1.0 / rate
            pending: list[tuple[int, int, int, int]] = []
            last = 0.0
            sent = 0
            fd = d.fileno()
            while not watch.stop.is_set():
                while d.pending_events():
                    ev = d.next_event()
                    if ev.type == notify_code:
                        a = ev.area
                        pending.append((int(a.x), int(a.y), int(a.width), int(a.height)))
                        if len(pending) > 4 * DAMAGE_MAX_RECTS:  # a flood: keep it small
                            g = ev.drawable_geometry
                            pending = [tuple(r) for r in coalesce_rects(pending, g.width, g.height)]  # type: ignore[misc]
                now = time.monotonic()
                if pending and now - last >= interval:
                    d.damage_subtract(dmg)
                    g = root.get_geometry()
                    p = root.query_pointer()
                    body = {"rects": coalesce_rects(pending, int(g.width), int(g.height)),
                            "cursor": [int(p.root_x), int(p.root_y)],
                            "width": int(g.width), "height": int(g.height)}  # fmt: skip
                    pending = []
                    last = now
                    if body["rects"]:
                        if not notify(body):
                            break  # the channel is gone
                        sent += 1
                    continue
                wait = None if not pending else max(0.0, interval - (now - last))
                ready, _, _ = select.select([fd, watch.wake_r], [], [], wait)
                if watch.wake_r in ready:
                    break
            with contextlib.suppress(Exception):
                d.damage_destroy(dmg)
                d.flush()
            return sent
        except Refused:
            raise
        except Exception as exc:  # the X server went away (lightdm restarted it)
            raise Refused(f"display not ready: {x_error_text(exc)}") from None
        finally:
            with contextlib.suppress(Exception):
                d.close()

    # ---- xrandr

    def run_xrandr(self, *args: str) -> subprocess.CompletedProcess[bytes]:
        if not self.xrandr:
            raise Refused("no display support for display: the image lacks xrandr")
        try:
            return subprocess.run(
                [self.xrandr, *args], stdin=subprocess.DEVNULL, capture_output=True,
                env=clean_env(self.env), timeout=XRANDR_TIMEOUT_S, check=False, close_fds=True,
            )  # fmt: skip
        except subprocess.TimeoutExpired:
            raise Refused(f"xrandr {' '.join(args)} did not finish in {XRANDR_TIMEOUT_S:.0f} s") from None

    def query_modes(self) -> dict[str, Any]:
        res = self.run_xrandr("--query")
        if res.returncode != 0:
            err = res.stderr.decode("utf-8", "replace").strip()
            raise Refused(f"display not ready: xrandr: {clip(err, 300) or f'exit {res.returncode}'}")
        info = parse_xrandr(res.stdout.decode("utf-8", "replace"))
        if not info["width"]:
            raise Refused("display not ready: xrandr reported no screen")
        return info

    # ---- selections

    def read_selection(self, which: str, accept: tuple[str, ...] = ("text",)) -> dict[str, Any]:
        """Ask the owner of a selection for the best target of the ``accept``ed kinds.

        ``{"owner": False}`` if it has none. Text is cut at 1 MiB
        (``truncated``), an image at 16 MiB (and then refused by the caller).
        """
        import select

        import Xlib.X

        atom_name = SELECTIONS[which]
        d = self._connect()  # its own connection: the answer comes as events
        try:
            sel = d.intern_atom(atom_name)
            owner = d.get_selection_owner(sel)
            if int(getattr(owner, "id", owner) or 0) == 0:
                return {"owner": False, "data": b"", "target": None, "truncated": False, "targets": []}
            win = d.screen().root.create_window(
                0, 0, 1, 1, 0, Xlib.X.CopyFromParent, event_mask=Xlib.X.PropertyChangeMask
            )
            prop = d.intern_atom("RIGD_SELECTION")
            incr = d.intern_atom("INCR")
            deadline = time.monotonic() + SELECTION_TIMEOUT_S

            def next_event(pred: Callable[[Any], bool]) -> Any:
                while True:
                    while d.pending_events():
                        ev = d.next_event()
                        if pred(ev):
                            return ev
                    left = deadline - time.monotonic()
                    if left <= 0:
                        raise Refused(f"the {which} owner did not answer within {SELECTION_TIMEOUT_S:.0f} s")
                    select.select([d.fileno()], [], [], left)

            def convert(target: str) -> Any:
                win.convert_selection(sel, d.intern_atom(target), prop, Xlib.X.CurrentTime)
                d.flush()
                ev = next_event(lambda e: e.type == Xlib.X.SelectionNotify and e.requestor.id == win.id)
                if ev.property == Xlib.X.NONE:
                    return None
                return win.get_full_property(prop, Xlib.X.AnyPropertyType, sizehint=1 << 16)

            offered: list[str] = []
            with contextlib.suppress(Refused):
                got = convert("TARGETS")
                if got is not None and got.format == 32:
                    for a in list(got.value)[:256]:
                        with contextlib.suppress(Exception):
                            offered.append(d.get_atom_name(a))
            for target in pick_targets(offered or None, accept):
                got = convert(target)
                if got is None:
                    continue
                limit = MAX_CLIPBOARD_IMAGE if target in IMAGE_TARGETS else MAX_CLIPBOARD
                if got.property_type == incr:
                    data, truncated = self._read_incr(d, win, prop, limit, next_event)
                else:
                    data = _prop_bytes(got.value)
                    truncated = len(data) > limit
                    data = data[:limit]
                win.delete_property(prop)
                d.flush()
                return {"owner": True, "data": data, "target": target, "truncated": truncated,
                        "targets": report_targets(offered)}  # fmt: skip
            return {"owner": True, "data": b"", "target": None, "truncated": False,
                    "targets": report_targets(offered)}  # fmt: skip
        finally:
            with contextlib.suppress(Exception):
                d.close()

    @staticmethod
    def _read_incr(
        d: Any, win: Any, prop: int, limit: int, next_event: Callable[[Callable[[Any], bool]], Any]
    ) -> tuple[bytes, bool]:
        """ICCCM INCR: delete the property, then read each new value until an empty one."""
        import Xlib.X

        win.delete_property(prop)
        d.flush()
        out = bytearray()
        truncated = False
        while True:
            next_event(lambda e: e.type == Xlib.X.PropertyNotify and e.window.id == win.id
                       and e.atom == prop and e.state == Xlib.X.PropertyNewValue)  # fmt: skip
            got = win.get_full_property(prop, Xlib.X.AnyPropertyType, sizehint=1 << 16)
            chunk = _prop_bytes(got.value) if got is not None else b""
            win.delete_property(prop)
            d.flush()
            if not chunk:
                return bytes(out), truncated
            room = limit - len(out)
            if len(chunk) > room:
                truncated = True
                out += chunk[: max(room, 0)]
                return bytes(out), truncated  # the owner gives up on its own later
            out += chunk

    def write_selection(self, which: str, data: bytes, media: str = "text/plain") -> None:
        """Make xclip own ``which`` with ``data`` (as ``media``); return once it does."""
        if not self.xclip:
            raise Refused("no display support for clipboard_write: the image lacks xclip")
        atom_name = SELECTIONS[which]
        with self.clip_lock:
            before = self.selection_owner(atom_name)
            # xclip forks a child that serves the selection until another
            # owner takes it. That child keeps any inherited pipe open, so
            # stdout/stderr go to /dev/null (HOST-NOTES) and only stdin is ours.
            typed = [] if media == "text/plain" else ["-t", media]  # plain text: xclip's own targets
            proc = subprocess.Popen(
                [self.xclip, "-i", "-selection", which, *typed],
                stdin=subprocess.PIPE, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
                env=clean_env(self.env), start_new_session=True, close_fds=True,
            )  # fmt: skip
            try:
                proc.communicate(data, timeout=10)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()
                raise Refused("xclip did not start within 10 s") from None
            if proc.returncode != 0:
                raise Refused(f"xclip failed (exit {proc.returncode}): is the display up?")
            # The xclip parent exits as soon as it forks; the child's ownership
            # may reach the server a moment later.
            deadline = time.monotonic() + 2.0
            while True:
                owner = self.selection_owner(atom_name)
                if owner and owner != before:
                    return
                if time.monotonic() > deadline:
                    raise Refused(f"xclip did not take the {which} selection")
                time.sleep(0.01)


    # ---- the keyboard mapping

    def bind_keys(self, pairs: list[tuple[int, int]]) -> tuple[int, int]:
        """Give each keycode its keysym in every column (XChangeKeyboardMapping), then XSync.

        Returns ``(pairs bound, keysyms per keycode)``.
        """

        def q(d: Any) -> tuple[int, int]:
            import Xlib.error

            lo, hi = int(d.display.info.min_keycode), int(d.display.info.max_keycode)
            for keycode, _ in pairs:
                if not lo <= keycode <= hi:
                    raise Refused(f"keymap_bind: keycode {keycode} is outside the X server's range {lo}-{hi}")
            per = len(d.get_keyboard_mapping(lo, 1)[0]) or 1
            catch = Xlib.error.CatchError()
            for keycode, keysym in pairs:
                d.change_keyboard_mapping(keycode, [[keysym] * per], onerror=catch)
            d.sync()
            err = catch.get_error()
            if err is not None:
                raise Refused(f"keymap_bind: X error {x_error_text(err)}")
            return len(pairs), per

        return self.x(q)


def xrandr_ok(res: subprocess.CompletedProcess[bytes], what: str) -> None:
    if res.returncode != 0:
        err = res.stderr.decode("utf-8", "replace").strip()
        raise Refused(f"set_display: xrandr {what} failed: {clip(err, 300) or f'exit {res.returncode}'}")


#: Where a Debian image keeps its Python packages. An agent run by the tools disk's own
#: interpreter sees only its standard library; a browser image that carries python3-pil
#: (WebKit's: its engine display's stills) lends it Pillow from here.
IMAGE_PACKAGES = "/usr/lib/python3/dist-packages"


def use_image_packages() -> bool:
    """Make the image's Pillow importable when this interpreter has none and the image's is
    built for it (its C extension carries this interpreter's suffix); True when PIL imports.
    The directory goes last on ``sys.path``: it adds modules, never replaces one."""
    if _has_module("PIL"):
        return True
    import importlib
    import sys
    import sysconfig

    suffix = sysconfig.get_config_var("EXT_SUFFIX") or ""
    if not suffix or not os.path.isfile(os.path.join(IMAGE_PACKAGES, "PIL", "_imaging" + suffix)):
        return False
    if IMAGE_PACKAGES not in sys.path:
        sys.path.append(IMAGE_PACKAGES)
    importlib.invalidate_caches()
    return _has_module("PIL")


def _has_module(name: str) -> bool:
    import importlib.util

    try:
        return importlib.util.find_spec(name) is not None
    except (ImportError, ValueError):
        return False


def _prop_bytes(value: Any) -> bytes:
    if isinstance(value, bytes | bytearray):
        return bytes(value)
    if isinstance(value, str):
        return value.encode("latin-1", "replace")
    return bytes(value)


def decode_selection(data: bytes, target: str | None) -> str:
    if target == "STRING":
        return data.decode("latin-1")
    return data.decode("utf-8", "replace")

