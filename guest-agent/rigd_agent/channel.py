"""The channel: lines in (:class:`LineReader`, capped at ``MAX_LINE``), JSON lines out under
one lock (:class:`Channel`), and finding and opening the virtio-serial port (shared with the
port multiplexer, :mod:`rigd_agent.mux`).
"""

from __future__ import annotations

import contextlib
import json
import os
import termios
import threading
import time
from typing import Any

from rigd_agent.base import MAX_LINE, PORT_NAME, describe_oserror, log


class LineReader:
    """Splits a byte stream into lines of at most ``max_line`` bytes.

    A longer line is dropped up to its next newline and reported once as
    ``None`` in the returned list. The pieces of a line that spans many reads
    (a virtio port returns at most a page per read) are kept as they came and
    joined once: a big line is copied once, not grown.
    """

    def __init__(self, max_line: int = MAX_LINE) -> None:
        self.max_line = max_line
        self.parts: list[bytes] = []
        self.size = 0
        self.discarding = False

    def reset(self) -> None:
        self.parts.clear()
        self.size = 0
        self.discarding = False

    def feed(self, data: bytes) -> list[bytes | None]:
        out: list[bytes | None] = []
        pos, n = 0, len(data)
        while pos < n:
            nl = data.find(b"\n", pos)
            end = nl if nl >= 0 else n
            if self.discarding:
                if nl >= 0:
                    self.discarding = False
            elif self.size + (end - pos) > self.max_line:
                self.reset()
                out.append(None)
                self.discarding = nl < 0
            elif nl >= 0:
                if self.parts:
                    self.parts.append(data[pos:end])
                    out.append(b"".join(self.parts))
                    self.reset()
                else:
                    out.append(data[pos:end])
            else:
                self.parts.append(data[pos:end])  # data itself when the read is all one piece
                self.size += end - pos
            pos = end + 1 if nl >= 0 else n
        return out


class Channel:
    """The write side of the port: one lock, whole lines, nothing over the cap."""

    def __init__(self, wfd: int) -> None:
        self.wfd = wfd
        self.lock = threading.Lock()

    def swap(self, wfd: int) -> None:
        with self.lock:
            self.wfd = wfd

    def send(self, obj: dict[str, Any]) -> bool:
        line = json.dumps(obj, separators=(",", ":"), ensure_ascii=True).encode("ascii")
        if len(line) > MAX_LINE:
            if "id" in obj:
                obj = {"id": obj["id"], "ok": False, "error": "reply too large for one line"}
            else:
                obj = {"ev": "error", "error": "event too large for one line"}
            line = json.dumps(obj, separators=(",", ":")).encode("ascii")
        return self.send_parts([line, b"\n"])

    def send_parts(self, parts: list[bytes]) -> bool:
        """Write ``parts`` as one line (the caller ends it with a newline), without joining them.

        A virtio port takes at most 32 KiB per write: a partial ``writev``
        moves on through the parts by view, never copying a big one.
        """
        views = [memoryview(part) for part in parts if part]
        with self.lock:
            while views:
                try:
                    n = os.writev(self.wfd, views)
                except (BlockingIOError, InterruptedError):
                    time.sleep(0.01)
                    continue
                except OSError as exc:
                    log(f"write to host failed: {exc}")
                    return False
                while n:
                    if n >= len(views[0]):
                        n -= len(views.pop(0))
                    else:
                        views[0] = views[0][n:]
                        n = 0
        return True


def find_port(name: str = PORT_NAME) -> str | None:
    """The device of the virtio-serial port ``name`` (the agent's by default), if it exists yet."""
    direct = f"/dev/virtio-ports/{name}"
    if os.path.exists(direct):
        return direct
    base = "/sys/class/virtio-ports"
    try:
        names = sorted(os.listdir(base))
    except OSError:
        return None
    for vport in names:
        try:
            with open(f"{base}/{vport}/name") as f:
                if f.read().strip() == name:
                    return f"/dev/{vport}"
        except OSError:
            continue
    return None


def open_port(spec: str) -> int:
    """Open the channel device, retrying forever (it may appear late or be held)."""
    delay = 0.05
    last_complaint = ""
    while True:
        path = find_port() if spec == "auto" else spec
        complaint = ""
        if path is None:
            complaint = f"no virtio port named {PORT_NAME} yet"
        else:
            try:
                fd = os.open(path, os.O_RDWR | os.O_NOCTTY | os.O_CLOEXEC)
            except OSError as exc:
                complaint = f"cannot open {path}: {describe_oserror(exc, '')}".rstrip(": ")
            else:
                if os.isatty(fd):
                    with contextlib.suppress(termios.error):
                        import tty

                        tty.setraw(fd)
                return fd
        if complaint != last_complaint:
            log(complaint + " (retrying)")
            last_complaint = complaint
        time.sleep(delay)
        delay = min(delay * 2, 2.0)


def announce_console(console: str | None) -> None:
    if not console:
        return
    try:
        fd = os.open(console, os.O_WRONLY | os.O_NOCTTY | os.O_APPEND | os.O_CREAT, 0o644)
    except OSError as exc:
        log(f"cannot write to {console}: {exc}")
        return
    try:
        os.write(fd, b"RIGD-AGENT-READY\n")
    except OSError as exc:
        log(f"cannot write to {console}: {exc}")
    finally:
        os.close(fd)

