"""A PTY session's state (the shell, its master side, the input queue its writer drains).
"""

from __future__ import annotations

import fcntl
import os
import struct
import subprocess
import termios
import threading


class Pty:
    def __init__(self, handle: int, proc: subprocess.Popen[bytes], master: int) -> None:
        self.handle = handle
        self.proc = proc
        self.master = master  # owned by the reader thread; closed under ``lock``
        self.in_fd = os.dup(master)  # owned by the writer thread
        self.lock = threading.Lock()
        self.closed = False
        self.cond = threading.Condition()
        self.inq: list[bytes] = []
        self.backlog = 0
        self.stop = False


def set_ctty() -> None:  # runs in the child between fork and exec
    fcntl.ioctl(0, termios.TIOCSCTTY, 0)


def winsize(rows: int, cols: int) -> bytes:
    return struct.pack("HHHH", rows, cols, 0, 0)

