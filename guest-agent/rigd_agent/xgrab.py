"""A part of an X screen, read with one core-protocol ``GetImage`` on a connection of our own
(standard library only): for a browser rig's engine display, a local X server without a
cookie, where only the page's rectangle is wanted. Pillow's XCB grab reads the whole root
(WebKit's display is 2600x1700: ~18 MB a still, ~0.8 s under TCG); this reads the
rectangle, ~4 MB for a 1280x800 page.

The connection is made on first use and kept; any error closes it (the next grab connects
afresh). The X server is the guest's own; what it answers is still checked (sizes, depth).
"""

from __future__ import annotations

import socket
import struct
import threading

#: ``GetImage`` (core protocol opcode 73) in ``ZPixmap`` format.
GET_IMAGE = 73
Z_PIXMAP = 2
#: The one pixel layout read here: depth 24 in 32 bits per pixel (Xvfb's ``-screen … x24``).
DEPTH = 24
BITS_PER_PIXEL = 32
CONNECT_TIMEOUT_S = 5.0
READ_TIMEOUT_S = 30.0
MAX_SETUP_BYTES = 1 << 20


class XGrabError(Exception):
    """The display could not be read (its text says why)."""


class OffScreen(XGrabError):
    """The rectangle asked for is not inside the screen."""


def off_screen(rect: tuple[int, int, int, int], width: int, height: int) -> str | None:
    """Why ``rect`` cannot be read from a ``width``x``height`` screen, or None when it can."""
    x, y, w, h = rect
    if x + w > width or y + h > height:
        return f"rect {list(rect)} is outside the {width}x{height} screen"
    return None


def _pad4(n: int) -> int:
    return (n + 3) & ~3


class RawGrabber:
    """Reads rectangles of one local display's root window as BGRX bytes."""

    def __init__(self, display_num: int) -> None:
        self.path = f"/tmp/.X11-unix/X{display_num}"
        self.lock = threading.Lock()
        self._sock: socket.socket | None = None
        self.root = 0
        self.width = 0
        self.height = 0

    def _recv_exact(self, sock: socket.socket, n: int) -> bytearray:
        buf = bytearray(n)
        view = memoryview(buf)
        got = 0
        while got < n:
            k = sock.recv_into(view[got:], n - got)
            if k == 0:
                raise XGrabError("the X server closed the connection")
            got += k
        return buf

    def _connect(self) -> socket.socket:
        sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        try:
            sock.settimeout(CONNECT_TIMEOUT_S)
            sock.connect(self.path)
            # Little-endian client, protocol 11.0, no authorization.
            sock.sendall(struct.pack("<BxHHHHxx", 0x6C, 11, 0, 0, 0))
            head = self._recv_exact(sock, 8)
            status, length = head[0], struct.unpack_from("<H", head, 6)[0] * 4
            if length > MAX_SETUP_BYTES:
                raise XGrabError("the X server's setup is too large")
            body = self._recv_exact(sock, length)
            if status != 1:
                said = bytes(body[: head[1]]).decode("latin-1", "replace")
                reason = said if status == 0 else "it asks to authenticate"
                raise XGrabError(f"the X server refused the connection ({reason[:200]})")
            vendor_len, _max_req, n_screens, n_formats = struct.unpack_from("<HHBB", body, 16)
            at = 32 + _pad4(vendor_len)
            formats = {}
            for i in range(n_formats):
                depth, bpp = struct.unpack_from("<BB", body, at + 8 * i)
                formats[depth] = bpp
            at += 8 * n_formats
            if n_screens < 1 or at + 40 > len(body):
                raise XGrabError("the X server's setup names no screen")
            if body[22] != 0:  # image data comes in the server's byte order: LSBFirst, BGRX
                raise XGrabError("the X server's images are most-significant byte first")
            root = struct.unpack_from("<I", body, at)[0]
            width, height = struct.unpack_from("<HH", body, at + 20)
            root_depth = body[at + 38]
            if root_depth != DEPTH or formats.get(DEPTH) != BITS_PER_PIXEL:
                raise XGrabError(f"the screen is depth {root_depth} at {formats.get(root_depth)} bits per "
                                 f"pixel, not {DEPTH} at {BITS_PER_PIXEL}")
            sock.settimeout(READ_TIMEOUT_S)
        except BaseException:
            sock.close()
            raise
        self.root, self.width, self.height = root, width, height
        return sock

    def close(self) -> None:
        if self._sock is not None:
            self._sock.close()
            self._sock = None

    def grab(self, x: int, y: int, w: int, h: int) -> tuple[bytearray, int, int]:
        """``w``x``h`` pixels at ``(x, y)`` as BGRX rows, and the screen's size. Raises
        XGrabError (with the connection closed) when the display cannot be read."""
        with self.lock:
            try:
                if self._sock is None:
                    self._sock = self._connect()
                why = off_screen((x, y, w, h), self.width, self.height)
                if why is not None:
                    raise OffScreen(why)
                sock = self._sock
                request = struct.pack("<BBHIhhHHI", GET_IMAGE, Z_PIXMAP, 5, self.root, x, y, w, h, 0xFFFFFFFF)
                sock.sendall(request)
                head = self._recv_exact(sock, 32)
                if head[0] == 0:
                    raise XGrabError(f"the X server answered GetImage with error {head[1]}")
                if head[0] != 1:
                    raise XGrabError("the X server sent an event or garbage, not GetImage's reply")
                depth, length = head[1], struct.unpack_from("<I", head, 4)[0] * 4
                if depth != DEPTH or length != w * h * 4:
                    raise XGrabError(f"GetImage answered depth {depth} and {length} bytes for {w}x{h}")
                return self._recv_exact(sock, length), self.width, self.height
            except XGrabError:
                self.close()
                raise
            except OSError as exc:
                self.close()
                raise XGrabError(f"cannot read the display: {exc.strerror or exc}") from None
