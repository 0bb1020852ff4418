#!/usr/bin/env python3
"""rigd in-guest agent, wire protocols 1 and 2 (see docs/guest-protocol.md).

How this works
--------------
The agent reads one JSON request per line from its channel (a virtio-serial
port in a guest, stdin/stdout in tests), answers each with one final reply
line, and may stream events for a request before that reply.  Every request
that can block (exec, pty_open, pty_close, shutdown, file_read, …) runs on
its own thread; quick ones (ping, hello, pty_in, pty_resize, the file_put_*
writes, file_ack) run inline on the reader thread so their order is kept.
All writers share one lock on the channel, so lines never interleave.

Files travel in both protocols: a drop is written to a temporary file,
verified against the host's sha256 and only then linked under a name that
was free (never over an existing file); a read is hashed, then streamed
under the host's credit (``file_ack``).

It runs from a read-only tools disk with its own interpreter and libc, inside
an image we know nothing about: it uses only the Python 3.11 standard
library, and every child it starts gets a clean environment (never the
interpreter's PYTHONHOME or library path) so the child runs on the image's
own libc.

In ``--pid1`` mode the process is the guest's init: it forks, the parent
stays PID 1, reaps every child forever and restarts the agent child when it
dies; the child runs the agent.  PID 1 must never exit (the kernel panics),
so its loop swallows every error.

The host is trusted, but lines can arrive garbled: nothing a line contains
may crash the agent.  Every line read is capped at 1 MiB.
"""

from __future__ import annotations

import argparse
import base64
import binascii
import contextlib
import errno
import fcntl
import hashlib
import json
import os
import pwd
import re
import secrets
import selectors
import shutil
import signal
import socket
import stat
import struct
import subprocess
import sys
import termios
import threading
import time
import traceback
from collections.abc import Callable, Iterator
from typing import Any

PROTO = 1  # the terminal agent: exec, ptys, reseed
PROTO_DESKTOP = 2  # with an X session: frames, pointer, modes, selections (docs/guest-protocol.md)
PORT_NAME = "rigd.agent"
MAX_LINE = 1 << 20  # bytes per line, newline excluded, both directions
CHUNK = 48 * 1024  # raw bytes per streamed chunk (64 KiB once base64'd)
DEFAULT_MAX_OUTPUT = 2 << 20  # bytes per exec stream
LINGER_S = 1.0  # how long output is still forwarded after the leader exits
KILL_GIVE_UP_S = 5.0  # after SIGKILL, stop waiting for a process stuck in D state
PTY_CLOSE_GRACE_S = 1.0  # SIGHUP, then SIGKILL after this long
PTY_DRAIN_IDLE_S = 0.05  # after the shell exits, stop once the pty is quiet this long
PTY_DRAIN_MAX_S = 1.0
PTY_INPUT_BACKLOG = 4 << 20
MAX_ERROR_TEXT = 4096
# hello sets the clock when it is further off than this: a restored snapshot's clock is stale by
# the time since the snapshot, a cold boot's by up to a second (the RTC counts whole seconds).
CLOCK_SLACK_S = 0.25
CLEAN_PATH = "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"
TERM = "xterm-256color"
BUSYBOX = "/.rigd/bin/busybox"
RB_POWER_OFF = 0x4321FEDC
PR_SET_CHILD_SUBREAPER = 36
RNDADDENTROPY = 0x40085203  # _IOW('R', 0x03, int[2])
RNDRESEEDCRNG = 0x5207  # _IO('R', 0x07)
SIOCSIFHWADDR = 0x8924
ARPHRD_ETHER = 1
MACHINE_ID_FILES = ("etc/machine-id", "var/lib/dbus/machine-id")


def log(msg: str) -> None:
    """Diagnostics go to stderr (the console in a guest), never to the channel."""
    with contextlib.suppress(Exception):
        sys.stderr.write(f"rigd-agent[{os.getpid()}]: {msg}\n")
        sys.stderr.flush()


# --------------------------------------------------------------------------
# small helpers


class BadRequest(Exception):
    """A request is well-formed JSON but a field is missing or has a wrong type."""


class Refused(Exception):
    """A valid request that cannot be done here (bad cwd, unknown pty, …)."""


def clip(text: str, limit: int = MAX_ERROR_TEXT) -> str:
    return text if len(text) <= limit else text[:limit] + "…"


def describe_oserror(exc: OSError, what: str | None = None) -> str:
    """'no such file or directory: foo' — lower-case reason, then the culprit."""
    reason = (exc.strerror or str(exc) or type(exc).__name__).lower()
    name = what if what is not None else exc.filename
    if name is None:
        return reason
    if isinstance(name, bytes):
        name = name.decode("utf-8", "backslashreplace")
    return f"{reason}: {name}"


def clean_env(extra: dict[str, str] | None = None, term: str | None = None) -> dict[str, str]:
    """The only environment children ever see: nothing leaks from the agent's own."""
    env = {"PATH": CLEAN_PATH, "HOME": "/root", "LANG": "C.UTF-8"}
    if term is not None:
        env["TERM"] = term
    if extra:
        env.update(extra)
    return env


def default_cwd() -> str:
    return "/root" if os.path.isdir("/root") else "/"


def b64(data: bytes) -> str:
    return base64.b64encode(data).decode("ascii")


def _reject_constant(name: str) -> Any:
    raise ValueError(f"{name} is not JSON")


def field_int(
    req: dict[str, Any],
    name: str,
    *,
    default: int | None = None,
    lo: int | None = None,
    hi: int | None = None,
    required: bool = False,
) -> int | None:
    if name not in req or req[name] is None:
        if required:
            raise BadRequest(f"{name} is required")
        return default
    value = req[name]
    if type(value) is not int:
        raise BadRequest(f"{name} must be an integer")
    if (lo is not None and value < lo) or (hi is not None and value > hi):
        if hi is None:
            raise BadRequest(f"{name} must be at least {lo}")
        raise BadRequest(f"{name} must be between {lo} and {hi}")
    return value


def field_str(req: dict[str, Any], name: str) -> str | None:
    value = req.get(name)
    if value is None:
        return None
    if not isinstance(value, str) or "\0" in value:
        raise BadRequest(f"{name} must be a string without NUL")
    return value


def field_argv(req: dict[str, Any], *, required: bool) -> list[str] | None:
    argv = req.get("argv")
    if argv is None:
        if required:
            raise BadRequest("argv is required")
        return None
    if not isinstance(argv, list) or not argv or not all(isinstance(a, str) and "\0" not in a for a in argv):
        raise BadRequest("argv must be a non-empty list of strings without NUL")
    if not argv[0]:
        raise BadRequest("argv[0] must not be empty")
    return argv


def field_env(req: dict[str, Any]) -> dict[str, str] | None:
    env = req.get("env")
    if env is None:
        return None
    if not isinstance(env, dict):
        raise BadRequest("env must be an object of strings")
    for key, value in env.items():
        if not key or "=" in key or "\0" in key:
            raise BadRequest(f"env key {clip(key, 100)!r} is not a valid name")
        if not isinstance(value, str) or "\0" in value:
            raise BadRequest(f"env[{clip(key, 100)!r}] must be a string without NUL")
    return env


def field_b64(req: dict[str, Any], name: str, *, required: bool = False) -> bytes | None:
    value = req.get(name)
    if value is None:
        if required:
            raise BadRequest(f"{name} is required")
        return None
    if not isinstance(value, str):
        raise BadRequest(f"{name} must be a base64 string")
    try:
        return base64.b64decode(value, validate=True)
    except (binascii.Error, ValueError):
        raise BadRequest(f"{name} is not valid base64") from None


def field_bool(req: dict[str, Any], name: str, *, default: bool) -> bool:
    value = req.get(name)
    if value is None:
        return default
    if type(value) is not bool:
        raise BadRequest(f"{name} must be a boolean")
    return value


def field_choice(req: dict[str, Any], name: str, choices: tuple[str, ...], *, default: str) -> str:
    value = req.get(name)
    if value is None:
        return default
    if value not in choices:
        raise BadRequest(f"{name} must be one of {', '.join(choices)}")
    return str(value)


def _ms(seconds: float) -> int:
    return int(seconds * 1000)


def check_cwd(cwd: str) -> None:
    try:
        st = os.stat(cwd)
    except OSError as exc:
        raise Refused("cwd: " + describe_oserror(exc, cwd)) from None
    if not (st.st_mode & 0o170000 == 0o040000):
        raise Refused(f"cwd: not a directory: {cwd}")


def status_fields(returncode: int | None) -> dict[str, int | None]:
    if returncode is None:
        return {"exitCode": None, "signal": None}
    if returncode < 0:
        return {"exitCode": None, "signal": -returncode}
    return {"exitCode": returncode, "signal": None}


def kill_tree(leader: int, sig: int) -> None:
    """Signal the leader's process group and every process left in its session.

    The leader started with setsid(), so its pid names both its group and its
    session; job-control shells move jobs into other groups of the same
    session, which killpg alone would miss.
    """
    with contextlib.suppress(OSError):
        os.killpg(leader, sig)
    try:
        entries = os.listdir("/proc")
    except OSError:
        return
    for entry in entries:
        if not entry.isdigit():
            continue
        try:
            with open(f"/proc/{entry}/stat", "rb") as f:
                stat = f.read()
            # fields after the last ')' : state ppid pgrp session ...
            fields = stat[stat.rindex(b")") + 2 :].split()
            if int(fields[3]) == leader:
                os.kill(int(entry), sig)
        except (OSError, ValueError, IndexError):
            continue


def open_pidfd(pid: int) -> int | None:
    try:
        return os.pidfd_open(pid)
    except (AttributeError, OSError):
        return None


def close_quietly(fd: int | None) -> None:
    if fd is not None:
        with contextlib.suppress(OSError):
            os.close(fd)


# --------------------------------------------------------------------------
# framing


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


# --------------------------------------------------------------------------
# ptys


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


def _set_ctty() -> None:  # runs in the child between fork and exec
    fcntl.ioctl(0, termios.TIOCSCTTY, 0)


def _winsize(rows: int, cols: int) -> bytes:
    return struct.pack("HHHH", rows, cols, 0, 0)


# --------------------------------------------------------------------------
# files (both protocols): drops into the guest, reads out of it
#
# A drop is written to a temporary file next to its destination, checked
# against the host's sha256, and only then linked under its final name
# (os.link never replaces an existing file: a taken name moves on to
# "2-name", "3-name", …). A read is hashed once, then streamed in chunks
# under the host's credit (file_ack), so a slow download never fills the
# channel.

DROP_MAX_OPEN = 64  # drops with an open temp file at once
DROP_PART_MAX = 512 * 1024  # raw bytes per file_put_data
DROP_FILE_MAX = 256 << 20  # bytes per dropped file
DROP_STALE_S = 3600.0  # an unowned temp file older than this is swept
DROP_NAME_TRIES = 9999  # name, 2-name, … 9999-name
DROP_B64_MAX = 4 * ((DROP_PART_MAX + 2) // 3)
READ_CHUNK = 256 * 1024  # raw bytes per file_read data event
READ_BUF = 1 << 20  # bytes per read(2) of the hashing pass
READ_STALL_S = 300.0  # a file_read the host stops acknowledging ends after this long
_DROP_TEMP = re.compile(r"\.rigd-drop-[0-9a-f]{16}\.part\Z")
# A file_put_data line as GuestProtocol.send_request writes it, up to the base64
# (the line must end with '"}'). Numbers as JSON spells them: no leading zeros.
_INT = rb"(0|-?[1-9][0-9]{0,17})"
_PUT_DATA_LINE = re.compile(
    rb'\{"id":' + _INT + rb',"op":"file_put_data","handle":' + _INT + rb',"offset":' + _INT + rb',"data":"'
)
_SHA256_HEX = re.compile(r"[0-9a-f]{64}\Z")
FILE_KINDS = {
    stat.S_IFDIR: "directory",
    stat.S_IFCHR: "character device",
    stat.S_IFBLK: "block device",
    stat.S_IFIFO: "fifo",
    stat.S_IFSOCK: "socket",
}


def check_drop_name(name: object) -> str:
    """A file name a drop may take in its directory, or a BadRequest naming the flaw."""
    if not isinstance(name, str) or not name:
        raise BadRequest("name must be a non-empty string")
    if name in (".", ".."):
        raise BadRequest(f"name must not be {name!r}")
    if "/" in name:
        raise BadRequest("name must not contain /")
    if "\0" in name:
        raise BadRequest("name must not contain NUL")
    if any(ord(c) < 0x20 or ord(c) == 0x7F for c in name):
        raise BadRequest("name must not contain control characters")
    try:
        size = len(name.encode("utf-8"))
    except UnicodeEncodeError:
        raise BadRequest("name is not valid Unicode (lone surrogate)") from None
    if size > 255:
        raise BadRequest(f"name is {size} bytes of UTF-8, over 255")
    if _DROP_TEMP.match(name):
        # such a file would be swept as a stale temporary an hour later
        raise BadRequest("name is reserved for the agent's temporary files")
    return name


def final_names(name: str) -> Iterator[str]:
    """The names a committed drop tries, in order: name, 2-name, … 9999-name."""
    yield name
    for k in range(2, DROP_NAME_TRIES + 1):
        yield f"{k}-{name}"


def file_kind(mode: int) -> str:
    return FILE_KINDS.get(stat.S_IFMT(mode), f"mode {stat.S_IFMT(mode):o}")


def field_sha256(req: dict[str, Any], name: str) -> str:
    value = req.get(name)
    if not isinstance(value, str) or not _SHA256_HEX.match(value):
        raise BadRequest(f"{name} must be 64 lower-case hex digits")
    return value


def field_path(req: dict[str, Any], name: str) -> str | None:
    """A string field naming a file: without NUL, and encodable as a file name."""
    value = field_str(req, name)
    if value is not None:
        try:
            os.fsencode(value)
        except UnicodeEncodeError:
            raise BadRequest(f"{name} is not valid Unicode (lone surrogate)") from None
    return value


def field_handles(req: dict[str, Any]) -> list[int]:
    value = req.get("handles")
    if not isinstance(value, list) or not all(type(h) is int for h in value):
        raise BadRequest("handles must be a list of integers")
    if len(set(value)) != len(value):
        raise BadRequest("handles must not repeat")
    return value


def open_dir(path: str) -> int:
    return os.open(path, os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)


def make_dirs(path: str, uid: int, gid: int) -> None:
    """Create ``path`` and its missing parents, each owned by ``uid``:``gid``, mode 0755."""
    missing: list[str] = []
    here = path
    while not os.path.isdir(here):
        if os.path.lexists(here) and not os.path.islink(here):
            raise Refused(f"not a directory: {here}")
        missing.append(here)
        parent = os.path.dirname(here)
        if parent == here:
            break
        here = parent
    for each in reversed(missing):
        try:
            os.mkdir(each, 0o755)
        except FileExistsError:
            if os.path.isdir(each):
                continue  # made meanwhile: not ours to chown
            raise Refused(f"not a directory: {each}") from None
        fd = os.open(each, os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC)
        try:
            os.fchown(fd, uid, gid)
            os.fchmod(fd, 0o755)  # the umask had its say in mkdir
        finally:
            os.close(fd)


class Drop:
    """One uploaded file: its temp file, until committed or aborted.

    ``fd`` is open until file_put_close; ``digest`` is set once the close
    verified the host's byte count and sha256. ``lock`` serialises the I/O
    of this drop (writes on the reader thread, the close on its own).
    """

    def __init__(
        self, handle: int, directory: str, dfd: int, temp: str, name: str, fd: int, ino: int
    ) -> None:
        self.handle = handle
        self.dir = directory  # resolved, absolute
        self.dfd = dfd  # the directory, held: every name below is relative to it
        st = os.fstat(dfd)
        self.dir_id = (st.st_dev, st.st_ino)
        self.temp = temp
        self.name = name
        self.path = os.path.join(directory, name)  # for messages
        self.fd: int | None = fd
        self.ino = ino
        self.written = 0
        self.sha = hashlib.sha256()
        self.digest: str | None = None
        self.gone = False
        self.lock = threading.Lock()


class FileRead:
    """A file_read in flight: the host's credit, and whether it was cancelled."""

    def __init__(self, window: int) -> None:
        self.window = window
        self.acked = 0  # the host consumed this much
        self.sent = 0
        self.cancelled = False
        self.cond = threading.Condition()


# --------------------------------------------------------------------------
# the desktop (guest protocol 2): an X session the agent can see
#
# Everything here runs only when the agent knows an X display (DISPLAY from
# its own environment or the image's session file).  The third-party modules
# it uses (python3-pil, python3-xlib) and tools (xrandr, xclip) are imported
# or looked up lazily, so the agent still starts on the terminal tools disk,
# whose interpreter has nothing but the standard library.

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
_DISPLAY_NAME = re.compile(r"(?P<host>[^:]*):(?P<num>\d+)(?:\.\d+)?\Z")


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


def _resample_box() -> Any:
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


def _x_error_text(exc: BaseException) -> str:
    text = str(exc).strip().replace("\n", " ")
    return clip(f"{type(exc).__name__}: {text}" if text else type(exc).__name__, 300)


class Desktop:
    """The X session of a computer rig, as root sees it.

    One python-xlib connection is kept for quick queries (pointer, screen
    size, selection owners) and re-made when the X server restarts; frames
    are grabbed by Pillow's XCB code (C: faster than python-xlib's
    ``get_image`` under emulation); selections are read on a connection of
    their own (they need events); xclip owns written selections.
    """

    def __init__(self, env: dict[str, str]) -> None:
        self.env = dict(env)
        self.name = env["DISPLAY"]
        # python-xlib and Xcb read these from the process environment. The
        # agent's own environment is never handed to children.
        os.environ["DISPLAY"] = self.name
        if env.get("XAUTHORITY"):
            os.environ["XAUTHORITY"] = env["XAUTHORITY"]
        self.xlock = threading.Lock()
        self.mode_lock = threading.Lock()
        self.clip_lock = threading.Lock()
        self._dpy: Any = None
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
        m = _DISPLAY_NAME.match(self.name)
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
            why = _x_error_text(exc)
            raise Refused(f"display not ready: cannot connect to {self.name} ({why})") from None

    def x(self, fn: Callable[[Any], Any]) -> Any:
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
                        raise Refused(f"display not ready: {_x_error_text(exc)}") from None
        raise AssertionError("unreachable")

    def geometry(self) -> tuple[int, int]:
        def q(d: Any) -> tuple[int, int]:
            g = d.screen().root.get_geometry()  # fresh: the setup block goes stale after xrandr
            return int(g.width), int(g.height)

        return tuple(self.x(q))  # type: ignore[return-value]

    def pointer(self) -> tuple[int, int, int, int]:
        """``(x, y, screen width, screen height)`` of the pointer."""

        def q(d: Any) -> tuple[int, int, int, int]:
            root = d.screen().root
            p = root.query_pointer()
            g = root.get_geometry()
            return int(p.root_x), int(p.root_y), int(g.width), int(g.height)

        return tuple(self.x(q))  # type: ignore[return-value]

    def selection_owner(self, atom_name: str) -> int:
        def q(d: Any) -> int:
            owner = d.get_selection_owner(d.intern_atom(atom_name))
            return int(getattr(owner, "id", owner) or 0)

        return int(self.x(q))

    # ---- frames

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
                raise Refused(f"display not ready: {_x_error_text(exc)}") from None
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
            raise Refused(f"display not ready: {_x_error_text(exc)}") from None
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
                raise Refused(f"keymap_bind: X error {_x_error_text(err)}")
            return len(pairs), per

        return tuple(self.x(q))  # type: ignore[return-value]


def _xrandr_ok(res: subprocess.CompletedProcess[bytes], what: str) -> None:
    if res.returncode != 0:
        err = res.stderr.decode("utf-8", "replace").strip()
        raise Refused(f"set_display: xrandr {what} failed: {clip(err, 300) or f'exit {res.returncode}'}")


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


# --------------------------------------------------------------------------
# the agent


class Agent:
    def __init__(
        self,
        chan: Channel,
        *,
        may_set_clock: bool,
        may_power_off: bool,
        sysroot: str | None = None,
        desktop: Desktop | None = None,
    ) -> None:
        self.chan = chan
        self.desktop = desktop  # None: a terminal rig (protocol 1), the desktop ops say "no display"
        self.proto = PROTO_DESKTOP if desktop is not None else PROTO
        self.agent_name = f"rigd-agent/{self.proto}"
        self.may_set_clock = may_set_clock  # also: may seed the kernel RNG and set a MAC
        self.may_power_off = may_power_off
        self.sysroot = sysroot  # where /etc/machine-id is written; None: nowhere
        self.lock = threading.Lock()
        self.ptys: dict[int, Pty] = {}
        self.next_pty = 1
        self.procs: dict[int, subprocess.Popen[bytes]] = {}  # running exec leaders
        self.clip_parts: dict[str, tuple[str, bytearray]] = {}  # clipboard_write parts held until the last
        self.files_lock = threading.Lock()  # guards the two tables below (and next_drop)
        self.drops: dict[int, Drop] = {}
        self.next_drop = 1
        self.reads: dict[int, FileRead] = {}  # file_read request id -> its flow control
        self.shutting_down = False
        self.workers: set[threading.Thread] = set()
        self.watches: dict[int, DamageWatch] = {}  # damage_watch request id -> its watch
        self.inline: dict[str, Callable[[int, dict[str, Any]], None]] = {
            "ping": self.op_ping,
            "hello": self.op_hello,
            "reseed": self.op_reseed,
            "pty_in": self.op_pty_in,
            "pty_resize": self.op_pty_resize,
            # files: the writes of a drop must keep their order; acks must never wait
            "file_put_open": self.op_file_put_open,
            "file_put_data": self.op_file_put_data,
            "file_commit": self.op_file_commit,
            "file_abort": self.op_file_abort,
            "file_ack": self.op_file_ack,
            "file_read_cancel": self.op_file_read_cancel,
            "damage_stop": self.op_damage_stop,
        }
        self.threaded: dict[str, Callable[[int, dict[str, Any]], None]] = {
            "exec": self.op_exec,
            "pty_open": self.op_pty_open,
            "pty_close": self.op_pty_close,
            "shutdown": self.op_shutdown,
            "file_put_close": self.op_file_put_close,  # fsync
            "file_read": self.op_file_read,
            # protocol 2: they talk to the X server or run xrandr/xclip, so they may block
            "screen": self.op_screen,
            "screenshot": self.op_screen,
            "cursor": self.op_cursor,
            "display": self.op_display,
            "set_display": self.op_set_display,
            "clipboard_read": self.op_clipboard_read,
            "clipboard_write": self.op_clipboard_write,
            "keymap_bind": self.op_keymap_bind,
            "damage_watch": self.op_damage_watch,
        }

    def features(self) -> list[str]:
        """What this agent can do: the desktop's (protocol 2), then what every agent does."""
        return [*(self.desktop.features() if self.desktop is not None else ()), *FEATURES]

    def ready_event(self) -> dict[str, Any]:
        ev: dict[str, Any] = {"ev": "ready", "proto": self.proto, "agent": self.agent_name}
        ev["pid"] = os.getpid()
        ev["features"] = self.features()
        return ev

    def child_env(self, extra: dict[str, str] | None, term: str | None = None) -> dict[str, str]:
        """The clean environment, the X session's (desktop only), then the request's."""
        if self.desktop is None:
            return clean_env(extra, term=term)
        return clean_env({**self.desktop.env, **(extra or {})}, term=term)

    # ---- replies

    def ok(self, rid: int, **fields: Any) -> None:
        self.chan.send({"id": rid, "ok": True, **fields})

    def fail(self, rid: int, text: str) -> None:
        self.chan.send({"id": rid, "ok": False, "error": clip(text)})

    def bad_line(self, text: str) -> None:
        self.chan.send({"ev": "error", "error": clip("bad request: " + text)})

    # ---- dispatch

    def handle_line(self, line: bytes | None) -> None:
        """Never raises: whatever the line holds, the agent carries on."""
        try:
            self._handle_line(line)
        except Exception as exc:  # a bug here must not kill the agent
            log("internal error handling a line:\n" + traceback.format_exc())
            with contextlib.suppress(Exception):
                self.chan.send({"ev": "error", "error": clip(f"internal error: {exc!r}")})

    def _handle_line(self, line: bytes | None) -> None:
        if line is None:
            self.bad_line(f"line longer than {MAX_LINE} bytes")
            return
        if line.startswith(b'{"id":') and line.endswith(b'"}'):
            m = _PUT_DATA_LINE.match(line)
            if m is not None:
                # The bulk of a drop, as the host encodes it: skip json.loads
                # of the big string. Strict base64 of the rest proves the line
                # was exactly this JSON object (no quote or backslash hides in
                # it); anything else takes the general path below.
                try:
                    data = binascii.a2b_base64(memoryview(line)[m.end() : -2], strict_mode=True)
                except (binascii.Error, ValueError):
                    data = None
                if data is not None:
                    req = {"handle": int(m.group(2)), "offset": int(m.group(3))}
                    self.run(self.op_file_put_data, int(m.group(1)), req, data)
                    return
        try:
            req = json.loads(line.decode("utf-8"), parse_constant=_reject_constant)
        except UnicodeDecodeError:
            self.bad_line("line is not UTF-8")
            return
        except (ValueError, RecursionError) as exc:
            self.bad_line(f"not JSON ({clip(str(exc), 200)})")
            return
        if not isinstance(req, dict):
            self.bad_line("a request must be a JSON object")
            return
        rid = req.get("id")
        if type(rid) is not int:
            self.bad_line("id must be an integer")
            return
        op = req.get("op")
        if not isinstance(op, str):
            self.fail(rid, "bad request: op must be a string")
            return
        if op in self.inline:
            self.run(self.inline[op], rid, req)
        elif op in self.threaded:
            if op == "file_read":
                # Known before its thread runs, so a file_read_cancel right behind it finds it.
                with self.files_lock:
                    self.reads[rid] = FileRead(1)
            try:
                worker = threading.Thread(
                    target=self.run,
                    args=(self.threaded[op], rid, req),
                    name=f"{op}-{rid}",
                    daemon=True,
                )
                with self.lock:
                    self.workers.add(worker)
                worker.start()
            except RuntimeError as exc:  # cannot start a thread: out of resources
                with self.files_lock:
                    self.reads.pop(rid, None)
                self.fail(rid, f"cannot start {op}: {exc}")
        else:
            self.fail(rid, f"unknown op: {clip(op, 100)}")

    def run(self, fn: Callable[..., None], rid: int, req: dict[str, Any], *args: Any) -> None:
        try:
            self._run(fn, rid, req, *args)
        finally:
            with self.lock:
                self.workers.discard(threading.current_thread())

    def _run(self, fn: Callable[..., None], rid: int, req: dict[str, Any], *args: Any) -> None:
        try:
            fn(rid, req, *args)
        except BadRequest as exc:
            self.fail(rid, f"bad request: {exc}")
        except Refused as exc:
            self.fail(rid, str(exc))
        except OSError as exc:
            self.fail(rid, describe_oserror(exc))
        except Exception as exc:
            log(f"internal error in request {rid}:\n" + traceback.format_exc())
            self.fail(rid, f"internal error: {exc!r}")

    # ---- ops

    def op_ping(self, rid: int, req: dict[str, Any]) -> None:
        self.ok(rid)

    def op_hello(self, rid: int, req: dict[str, Any]) -> None:
        host_time = req.get("time")
        clock_set = False
        extra: dict[str, Any] = {}
        if host_time is not None:
            if type(host_time) not in (int, float) or not (0 < host_time < 1e11):
                raise BadRequest("time must be seconds since the epoch")
            skew = host_time - time.time()
            extra["clockSkewS"] = round(skew, 3)
            if abs(skew) > CLOCK_SLACK_S and self.may_set_clock:
                try:
                    time.clock_settime(time.CLOCK_REALTIME, float(host_time))
                    clock_set = True
                except OSError as exc:
                    extra["clockError"] = describe_oserror(exc)
        u = os.uname()
        try:
            with open("/proc/uptime") as f:
                boot_s = float(f.read().split()[0])
        except (OSError, ValueError, IndexError):
            boot_s = time.monotonic()
        extra["features"] = self.features()
        if self.desktop is not None:
            extra["display"] = self.desktop.name
            extra["displayReady"] = self.desktop.reachable()
        self.ok(
            rid,
            proto=self.proto,
            agent=self.agent_name,
            pid=os.getpid(),
            kernel=f"{u.sysname} {u.nodename} {u.release} {u.version} {u.machine}",
            hostname=u.nodename,
            bootS=boot_s,
            clockSet=clock_set,
            **extra,
        )

    def op_reseed(self, rid: int, req: dict[str, Any]) -> None:
        """Make this machine its own after a snapshot restore (docs/guest-protocol.md)."""
        machine_id = field_str(req, "machineId")
        if machine_id is not None and not re.fullmatch(r"[0-9a-f]{32}", machine_id):
            raise BadRequest("machineId must be 32 lower-case hex digits")
        entropy = field_b64(req, "entropy")
        if entropy is not None and not 16 <= len(entropy) <= 512:
            raise BadRequest("entropy must be 16 to 512 bytes")
        mac = field_str(req, "mac")
        if mac is not None and not re.fullmatch(r"[0-9a-f]{2}(:[0-9a-f]{2}){5}", mac):
            raise BadRequest("mac must be six lower-case hex pairs")
        out: dict[str, Any] = {"entropyCredited": False, "crngReseeded": False,
                               "machineIdFiles": [], "macSet": []}
        if entropy is not None and self.may_set_clock:
            out.update(seed_rng(entropy))
        if machine_id is not None and self.sysroot is not None:
            out.update(write_machine_id(self.sysroot, machine_id))
        if mac is not None and self.may_set_clock:
            out.update(set_mac(mac))
        self.ok(rid, **out)

    def op_exec(self, rid: int, req: dict[str, Any]) -> None:
        argv = field_argv(req, required=True)
        assert argv is not None
        cwd = field_str(req, "cwd")
        env = field_env(req)
        stdin = field_b64(req, "stdin")
        timeout_ms = field_int(req, "timeoutMs", lo=1, hi=2**40)
        max_out = field_int(req, "maxOutput", default=DEFAULT_MAX_OUTPUT, lo=0, hi=2**40)
        assert max_out is not None
        if cwd is not None:
            check_cwd(cwd)
        t0 = time.monotonic()
        proc = subprocess.Popen(
            argv,
            stdin=subprocess.PIPE if stdin is not None else subprocess.DEVNULL,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            cwd=cwd if cwd is not None else default_cwd(),
            env=self.child_env(env),
            start_new_session=True,
            close_fds=True,
            bufsize=0,
        )
        with self.lock:
            self.procs[rid] = proc
        try:
            result = self._run_exec(rid, proc, stdin, timeout_ms, max_out, t0)
        finally:
            with self.lock:
                self.procs.pop(rid, None)
        self.ok(rid, **result)

    def _run_exec(
        self,
        rid: int,
        proc: subprocess.Popen[bytes],
        stdin: bytes | None,
        timeout_ms: int | None,
        max_out: int,
        t0: float,
    ) -> dict[str, Any]:
        assert proc.stdout is not None and proc.stderr is not None
        if stdin is not None:
            assert proc.stdin is not None
            threading.Thread(target=self._feed, args=(proc.stdin, stdin), daemon=True).start()
        sent = {1: 0, 2: 0}
        truncated = {1: False, 2: False}
        sel = selectors.DefaultSelector()
        pipes = {1: proc.stdout, 2: proc.stderr}
        for fd_no, pipe in pipes.items():
            sel.register(pipe, selectors.EVENT_READ, fd_no)
        pidfd = open_pidfd(proc.pid)
        if pidfd is not None:
            sel.register(pidfd, selectors.EVENT_READ, 0)
        deadline = t0 + timeout_ms / 1000 if timeout_ms is not None else None
        open_pipes = 2
        leader_done: float | None = None
        killed_at: float | None = None
        timed_out = False
        try:
            while open_pipes:
                now = time.monotonic()
                if leader_done is None and proc.poll() is not None:
                    leader_done = now
                    if pidfd is not None:
                        sel.unregister(pidfd)
                        close_quietly(pidfd)
                        pidfd = None
                if leader_done is not None and now - leader_done >= LINGER_S:
                    break  # a background process holds the pipes: stop waiting for EOF
                if leader_done is None and deadline is not None and now >= deadline:
                    kill_tree(proc.pid, signal.SIGKILL)
                    timed_out, killed_at, deadline = True, now, None
                if killed_at is not None and leader_done is None and now - killed_at > KILL_GIVE_UP_S:
                    break  # the leader ignores SIGKILL (stuck in the kernel): give up
                waits = []
                if leader_done is not None:
                    waits.append(leader_done + LINGER_S - now)
                elif deadline is not None:
                    waits.append(deadline - now)
                if leader_done is None and (pidfd is None or killed_at is not None):
                    waits.append(0.1)  # no pidfd: notice the leader's exit by polling
                timeout = max(0.0, min(waits)) if waits else None
                for key, _ in sel.select(timeout):
                    if key.data == 0:
                        continue  # pidfd readable: the leader exited; poll() above reaps it
                    try:
                        chunk = os.read(key.fd, CHUNK)
                    except BlockingIOError:
                        continue
                    except OSError:
                        chunk = b""
                    if not chunk:
                        sel.unregister(key.fileobj)
                        pipes.pop(key.data).close()
                        open_pipes -= 1
                        continue
                    fd_no = key.data
                    room = max_out - sent[fd_no]
                    if len(chunk) > room:
                        chunk = chunk[: max(room, 0)]
                        truncated[fd_no] = True
                    if chunk:
                        sent[fd_no] += len(chunk)
                        self.chan.send({"id": rid, "ev": "out", "fd": fd_no, "data": b64(chunk)})
        finally:
            sel.close()
            close_quietly(pidfd)
            for pipe in pipes.values():
                # Someone still holds the other end: keep draining so it never
                # blocks on a full pipe (and never gets SIGPIPE) after we are done.
                threading.Thread(target=self._drain, args=(pipe,), daemon=True).start()
        returncode = proc.poll()
        if returncode is None and killed_at is None:
            try:
                returncode = proc.wait(timeout=KILL_GIVE_UP_S)
            except subprocess.TimeoutExpired:
                returncode = None
        if returncode is None:
            threading.Thread(target=proc.wait, daemon=True).start()  # reap it later
        return {
            **status_fields(returncode),
            "timedOut": timed_out,
            "truncated": {"stdout": truncated[1], "stderr": truncated[2]},
            "durationMs": int((time.monotonic() - t0) * 1000),
        }

    @staticmethod
    def _feed(pipe: Any, data: bytes) -> None:
        try:
            view = memoryview(data)
            fd = pipe.fileno()
            while view:
                view = view[os.write(fd, view) :]
        except OSError:
            pass  # the child closed its stdin or died: not our error
        finally:
            with contextlib.suppress(OSError):
                pipe.close()

    @staticmethod
    def _drain(pipe: Any) -> None:
        try:
            while os.read(pipe.fileno(), 65536):
                pass
        except OSError:
            pass
        finally:
            with contextlib.suppress(OSError):
                pipe.close()

    # ---- ptys

    def op_pty_open(self, rid: int, req: dict[str, Any]) -> None:
        cols = field_int(req, "cols", default=80, lo=1, hi=65535)
        rows = field_int(req, "rows", default=24, lo=1, hi=65535)
        assert cols is not None and rows is not None
        argv = field_argv(req, required=False)
        cwd = field_str(req, "cwd")
        env = field_env(req)
        if cwd is not None:
            check_cwd(cwd)
        if argv is None:
            bash = shutil.which("bash", path=CLEAN_PATH)
            sh = shutil.which("sh", path=CLEAN_PATH)
            if bash:
                argv = [bash, "-l"]
            elif sh:
                argv = [sh]
            else:
                raise Refused("no shell in the image (neither bash nor sh on PATH)")
        master, slave = os.openpty()
        try:
            fcntl.ioctl(slave, termios.TIOCSWINSZ, _winsize(rows, cols))
            with contextlib.suppress(termios.error):
                attrs = termios.tcgetattr(slave)
                attrs[0] |= getattr(termios, "IUTF8", 0)
                termios.tcsetattr(slave, termios.TCSANOW, attrs)
            proc = subprocess.Popen(
                argv,
                stdin=slave,
                stdout=slave,
                stderr=slave,
                cwd=cwd if cwd is not None else default_cwd(),
                env=self.child_env(env, term=TERM),
                start_new_session=True,
                preexec_fn=_set_ctty,
                close_fds=True,
            )
        except BaseException:
            close_quietly(master)
            raise
        finally:
            close_quietly(slave)
        os.set_blocking(master, False)
        with self.lock:
            handle = self.next_pty
            self.next_pty += 1
            pty = Pty(handle, proc, master)
            self.ptys[handle] = pty
        # The reply goes out before any pty_out for this handle.
        self.ok(rid, pty=handle)
        threading.Thread(target=self._pty_reader, args=(pty,), daemon=True).start()
        threading.Thread(target=self._pty_writer, args=(pty,), daemon=True).start()

    def _get_pty(self, req: dict[str, Any]) -> Pty:
        handle = field_int(req, "pty", required=True)
        with self.lock:
            pty = self.ptys.get(handle)  # type: ignore[arg-type]
        if pty is None or pty.closed:
            raise Refused(f"no such pty: {handle}")
        return pty

    def op_pty_in(self, rid: int, req: dict[str, Any]) -> None:
        pty = self._get_pty(req)
        data = field_b64(req, "data", required=True)
        assert data is not None
        with pty.cond:
            if pty.backlog + len(data) > PTY_INPUT_BACKLOG:
                raise Refused(f"pty {pty.handle}: input backlog full")
            pty.inq.append(data)
            pty.backlog += len(data)
            pty.cond.notify()
        self.ok(rid)

    def op_pty_resize(self, rid: int, req: dict[str, Any]) -> None:
        pty = self._get_pty(req)
        cols = field_int(req, "cols", required=True, lo=1, hi=65535)
        rows = field_int(req, "rows", required=True, lo=1, hi=65535)
        assert cols is not None and rows is not None
        with pty.lock:
            if pty.closed:
                raise Refused(f"no such pty: {pty.handle}")
            # The kernel sends SIGWINCH to the foreground process group.
            fcntl.ioctl(pty.master, termios.TIOCSWINSZ, _winsize(rows, cols))
        self.ok(rid)

    def op_pty_close(self, rid: int, req: dict[str, Any]) -> None:
        pty = self._get_pty(req)
        self._kill_pty(pty)
        self.ok(rid)

    def _kill_pty(self, pty: Pty) -> None:
        proc = pty.proc
        if proc.poll() is None:
            kill_tree(proc.pid, signal.SIGHUP)
            kill_tree(proc.pid, signal.SIGCONT)
            with contextlib.suppress(subprocess.TimeoutExpired):
                proc.wait(timeout=PTY_CLOSE_GRACE_S)
        kill_tree(proc.pid, signal.SIGKILL)

    def _pty_writer(self, pty: Pty) -> None:
        fd = pty.in_fd
        try:
            while True:
                with pty.cond:
                    while not pty.inq and not pty.stop:
                        pty.cond.wait()
                    if pty.stop:
                        return
                    data = pty.inq.pop(0)
                    pty.backlog -= len(data)
                view = memoryview(data)
                while view and not pty.stop:
                    try:
                        view = view[os.write(fd, view) :]
                    except BlockingIOError:
                        # The shell is not reading; wait, but notice a stop.
                        sel = selectors.DefaultSelector()
                        try:
                            sel.register(fd, selectors.EVENT_WRITE)
                            sel.select(0.2)
                        finally:
                            sel.close()
        except OSError:
            return  # the pty is gone
        finally:
            close_quietly(fd)

    def _pty_reader(self, pty: Pty) -> None:
        proc = pty.proc
        sel = selectors.DefaultSelector()
        sel.register(pty.master, selectors.EVENT_READ, "pty")
        pidfd = open_pidfd(proc.pid)
        if pidfd is not None:
            sel.register(pidfd, selectors.EVENT_READ, "pid")
        exited_at: float | None = None
        eof = False
        try:
            while not eof:
                if exited_at is None and proc.poll() is not None:
                    exited_at = time.monotonic()
                    if pidfd is not None:
                        sel.unregister(pidfd)
                        close_quietly(pidfd)
                        pidfd = None
                if exited_at is not None:
                    if time.monotonic() - exited_at > PTY_DRAIN_MAX_S:
                        break
                    timeout: float | None = PTY_DRAIN_IDLE_S
                else:
                    timeout = None if pidfd is not None else 0.1
                ready = sel.select(timeout)
                if not ready and exited_at is not None:
                    break  # the shell is gone and the pty went quiet
                for key, _ in ready:
                    if key.data != "pty":
                        continue
                    try:
                        data = os.read(pty.master, CHUNK)
                    except BlockingIOError:
                        continue
                    except OSError:
                        data = b""  # EIO: every slave end is closed
                    if not data:
                        eof = True
                        break
                    self.chan.send({"ev": "pty_out", "pty": pty.handle, "data": b64(data)})
        except Exception:
            log(f"pty {pty.handle} reader failed:\n" + traceback.format_exc())
        finally:
            sel.close()
            close_quietly(pidfd)
            with pty.lock:
                pty.closed = True
                close_quietly(pty.master)  # hangs up anything still holding the slave
            with pty.cond:
                pty.stop = True
                pty.cond.notify()
        try:
            returncode: int | None = proc.wait()
        except Exception:
            returncode = None
        with self.lock:
            self.ptys.pop(pty.handle, None)
        self.chan.send({"ev": "pty_exit", "pty": pty.handle, **status_fields(returncode)})

    # ---- the desktop (protocol 2)

    def need_desktop(self, feature: str) -> Desktop:
        if self.desktop is None:
            raise Refused(NO_DISPLAY)
        self.desktop.need(feature)
        return self.desktop

    def send_bulk(self, rid: int, data: bytes) -> dict[str, Any]:
        """``data`` inline when small, else as ``data`` stream events (offset, ≤ 48 KiB each)."""
        if len(data) <= INLINE_MAX:
            return {"data": b64(data)}
        return {"chunks": self._chunks(rid, data)}

    def op_screen(self, rid: int, req: dict[str, Any]) -> None:
        max_w = field_int(req, "maxWidth", default=SCREEN_DEFAULT[0], lo=16, hi=SCREEN_MAX[0])
        max_h = field_int(req, "maxHeight", default=SCREEN_DEFAULT[1], lo=16, hi=SCREEN_MAX[1])
        quality = field_int(req, "quality", default=75, lo=1, hi=100)
        fmt = field_choice(req, "format", ("jpeg", "png"), default="jpeg")
        mark = field_bool(req, "markCursor", default=True)
        assert max_w is not None and max_h is not None and quality is not None
        desk = self.need_desktop("screen")
        t0 = time.monotonic()
        image = desk.grab()
        t_grab = time.monotonic()
        cursor: list[int] | None = None
        if desk.has_xlib:
            with contextlib.suppress(Refused):
                x, y, _, _ = desk.pointer()
                cursor = [x, y]
        width, height = image.size
        image_w, image_h, scale = fit_size(width, height, max_w, max_h)
        if (image_w, image_h) != (width, height):
            image = image.resize((image_w, image_h), _resample_box())
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
                "grabMs": _ms(t_grab - t0),
                "scaleMs": _ms(t_scale - t_grab),
                "encodeMs": _ms(t_enc - t_scale),
                "totalMs": _ms(time.monotonic() - t0),
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
                    _xrandr_ok(desk.run_xrandr("--addmode", output, name), "--addmode")
                _xrandr_ok(desk.run_xrandr("--output", output, "--mode", name), "--output --mode")
                info = desk.query_modes()
        self.ok(rid, **info, changed=(info["width"], info["height"]) != before)

    def op_clipboard_read(self, rid: int, req: dict[str, Any]) -> None:
        which = field_choice(req, "selection", tuple(SELECTIONS), default="clipboard")
        accept = field_accept(req)
        desk = self.need_desktop("clipboard_read")
        if "image" in accept:
            desk.need("clipboard_image")
        if "uris" in accept:
            desk.need("clipboard_files")
        got = desk.read_selection(which, accept)
        media = media_type(got["target"])
        if media in IMAGE_TARGETS:
            if got["truncated"]:
                raise Refused("image over 16 MiB")
            self.ok(rid, selection=which, owner=got["owner"], target=got["target"], bytes=len(got["data"]),
                    truncated=False, mediaType=media, targets=got["targets"],
                    **self.send_bulk(rid, got["data"]))  # fmt: skip
            return
        text = decode_selection(got["data"], got["target"])
        raw = text.encode("utf-8")
        if len(raw) > MAX_CLIPBOARD:  # a STRING owner's Latin-1 grew in UTF-8
            raw = raw[:MAX_CLIPBOARD].decode("utf-8", "ignore").encode("utf-8")
            text = raw.decode("utf-8")
            got["truncated"] = True
        fields: dict[str, Any] = {"selection": which, "owner": got["owner"], "target": got["target"],
                                  "bytes": len(raw), "truncated": got["truncated"], "mediaType": media,
                                  "targets": got["targets"]}  # fmt: skip
        if len(json.dumps(text)) <= INLINE_MAX:  # ASCII-only JSON: \uXXXX escapes count
            fields["text"] = text
        else:
            fields["chunks"] = self._chunks(rid, raw)  # UTF-8 bytes
        self.ok(rid, **fields)

    def _chunks(self, rid: int, data: bytes) -> int:
        chunks = 0
        for offset in range(0, len(data), CHUNK):
            piece = b64(data[offset : offset + CHUNK])
            self.chan.send({"id": rid, "ev": "data", "offset": offset, "data": piece})
            chunks += 1
        return chunks

    def op_clipboard_write(self, rid: int, req: dict[str, Any]) -> None:
        media = field_choice(req, "mediaType", MEDIA_TYPES, default="text/plain")
        if media in IMAGE_TARGETS:
            if req.get("text") is not None:
                raise BadRequest(f"text is not for {media}: send data")
            value = req.get("data")
            if not isinstance(value, str):
                raise BadRequest("data is required and must be a base64 string")
            if len(value) > DROP_B64_MAX:
                raise BadRequest(f"data is over {INLINE_MAX} bytes in one part")
            try:
                data = binascii.a2b_base64(value, strict_mode=True)
            except (binascii.Error, ValueError):
                raise BadRequest("data is not valid base64") from None
            if len(data) > INLINE_MAX:
                raise BadRequest(f"data is over {INLINE_MAX} bytes in one part")
            limit, feature = MAX_CLIPBOARD_IMAGE, "clipboard_image"
        else:
            if req.get("data") is not None:
                raise BadRequest(f"data is not for {media}: send text")
            text = req.get("text")
            if not isinstance(text, str):
                raise BadRequest("text is required and must be a string")
            try:
                data = text.encode("utf-8")
            except UnicodeEncodeError:
                raise BadRequest("text is not valid Unicode (lone surrogate)") from None
            limit = MAX_CLIPBOARD
            feature = "clipboard_write" if media == "text/plain" else "clipboard_files"
        which = field_choice(req, "selection", ("clipboard", "primary"), default="clipboard")
        continues = field_bool(req, "continues", default=False)
        desk = self.need_desktop("clipboard_write")
        desk.need(feature)
        # A payload too long for one request line comes in parts: every part
        # but the last says continues=true and is held (per selection) until then.
        with self.lock:
            held_media, held = self.clip_parts.pop(which, (media, bytearray()))
            if held_media != media:
                raise BadRequest(f"mediaType {media} does not continue the held {held_media} parts: dropped")
            total = len(held) + len(data)
            if total > limit:
                what = "data is" if media in IMAGE_TARGETS else "text is"
                unit = "bytes" if media in IMAGE_TARGETS else "bytes of UTF-8"
                raise BadRequest(f"{what} {total} {unit}, over the {limit}-byte limit")
            held += data
            if continues:
                self.clip_parts[which] = (media, held)
                self.ok(rid, selection=which, bytes=total, pending=True, mediaType=media)
                return
        desk.write_selection(which, bytes(held), media)
        self.ok(rid, selection=which, bytes=total, pending=False, mediaType=media)

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

    # ---- files: drops (file_put_*, file_commit, file_abort)

    def op_file_put_open(self, rid: int, req: dict[str, Any]) -> None:
        where = field_path(req, "dir")
        if not where:
            raise BadRequest("dir is required: an absolute path or ~/…")
        name = check_drop_name(req.get("name"))
        owner = field_str(req, "owner")
        if owner is None:
            owner = "root"
        if not owner or len(owner) > 256:
            raise BadRequest("owner must be a user name")
        try:
            user = pwd.getpwnam(owner)
        except KeyError:
            raise Refused(f"no such user: {clip(owner, 100)}") from None
        if where == "~" or where.startswith("~/"):
            where = user.pw_dir + where[1:]
        if not where.startswith("/"):
            raise BadRequest("dir must be absolute or start with ~/")
        where = os.path.normpath(where)
        with self.files_lock:
            if sum(d.fd is not None for d in self.drops.values()) >= DROP_MAX_OPEN:
                raise Refused("too many open drops")
        make_dirs(where, user.pw_uid, user.pw_gid)
        resolved = os.path.realpath(where)
        dfd = open_dir(resolved)
        try:
            self._sweep_drops(dfd)
            temp = f".rigd-drop-{secrets.token_hex(8)}.part"
            flags = os.O_CREAT | os.O_EXCL | os.O_WRONLY | os.O_NOFOLLOW | os.O_CLOEXEC
            fd = os.open(temp, flags, 0o600, dir_fd=dfd)
        except BaseException:
            os.close(dfd)
            raise
        try:
            os.fchown(fd, user.pw_uid, user.pw_gid)
            ino = os.fstat(fd).st_ino
        except BaseException:
            os.close(fd)
            with contextlib.suppress(OSError):
                os.unlink(temp, dir_fd=dfd)
            os.close(dfd)
            raise
        with self.files_lock:
            handle = self.next_drop
            self.next_drop += 1
            self.drops[handle] = Drop(handle, resolved, dfd, temp, name, fd, ino)
        self.ok(rid, handle=handle, dir=resolved)

    def _sweep_drops(self, dfd: int) -> None:
        """Remove temp files of this directory that no drop owns and nobody wrote for an hour."""
        st = os.fstat(dfd)
        here = (st.st_dev, st.st_ino)
        with self.files_lock:
            owned = {d.temp for d in self.drops.values() if d.dir_id == here}
        now = time.time()
        with contextlib.suppress(OSError), os.scandir(dfd) as entries:
            for entry in entries:
                if not _DROP_TEMP.match(entry.name) or entry.name in owned:
                    continue
                with contextlib.suppress(OSError):
                    st = entry.stat(follow_symlinks=False)
                    if stat.S_ISREG(st.st_mode) and now - st.st_mtime > DROP_STALE_S:
                        os.unlink(entry.name, dir_fd=dfd)

    def _drop(self, req: dict[str, Any]) -> Drop:
        handle = field_int(req, "handle", required=True)
        with self.files_lock:
            drop = self.drops.get(handle)  # type: ignore[arg-type]
        if drop is None:
            raise Refused(f"no such drop: {handle}")
        return drop

    def _remove_drop(self, drop: Drop) -> None:
        """Delete the drop's temp file and forget it. Holds ``drop.lock``."""
        if drop.gone:
            return
        drop.gone = True
        if drop.fd is not None:
            close_quietly(drop.fd)
            drop.fd = None
        with contextlib.suppress(OSError):
            os.unlink(drop.temp, dir_fd=drop.dfd)
        self._forget_drop(drop)

    def _forget_drop(self, drop: Drop) -> None:
        drop.gone = True
        with self.files_lock:
            self.drops.pop(drop.handle, None)
        close_quietly(drop.dfd)

    def op_file_put_data(self, rid: int, req: dict[str, Any], data: bytes | None = None) -> None:
        """``data``: already decoded by the fast path in ``_handle_line``."""
        offset = field_int(req, "offset", required=True, lo=0)
        if data is None:
            value = req.get("data")
            if not isinstance(value, str):
                raise BadRequest("data is required and must be a base64 string")
            if len(value) > DROP_B64_MAX:
                raise BadRequest(f"data is over {DROP_PART_MAX} bytes")
            try:
                data = binascii.a2b_base64(value, strict_mode=True)  # the fastest decoder in the stdlib
            except (binascii.Error, ValueError):
                raise BadRequest("data is not valid base64") from None
        if len(data) > DROP_PART_MAX:
            raise BadRequest(f"data is over {DROP_PART_MAX} bytes")
        drop = self._drop(req)
        with drop.lock:
            if drop.gone:
                raise Refused(f"no such drop: {drop.handle}")
            if drop.fd is None:
                raise Refused(f"drop {drop.handle} is closed")
            if offset != drop.written:
                raise Refused(f"offset {offset} does not follow {drop.written}")
            if drop.written + len(data) > DROP_FILE_MAX:
                self._remove_drop(drop)
                raise Refused(f"drop {drop.handle} is over the {DROP_FILE_MAX}-byte limit: removed it")
            view = memoryview(data)
            try:
                while view:
                    view = view[os.write(drop.fd, view) :]
            except OSError as exc:
                # What reached the file is unknown now: the drop cannot be finished.
                self._remove_drop(drop)
                raise Refused(describe_oserror(exc, drop.path) + ": removed the drop") from None
            drop.sha.update(data)
            drop.written += len(data)
            total = drop.written
        self.ok(rid, bytes=total)

    def op_file_put_close(self, rid: int, req: dict[str, Any]) -> None:
        nbytes = field_int(req, "bytes", required=True, lo=0)
        digest = field_sha256(req, "sha256")
        drop = self._drop(req)
        with drop.lock:
            if drop.gone:
                raise Refused(f"no such drop: {drop.handle}")
            if drop.fd is None:
                raise Refused(f"drop {drop.handle} is already closed")
            fd, drop.fd = drop.fd, None
            try:
                os.fsync(fd)
            except OSError as exc:
                self._remove_drop(drop)
                raise Refused(describe_oserror(exc, drop.path) + ": removed the drop") from None
            finally:
                close_quietly(fd)
            got = drop.sha.hexdigest()
            if (got, drop.written) != (digest, nbytes):
                self._remove_drop(drop)
                raise Refused(f"digest mismatch: the guest wrote {drop.written} bytes with sha256 {got}; "
                              f"the host sent {nbytes} bytes with sha256 {digest}")  # fmt: skip
            drop.digest = got
            written = drop.written
        self.ok(rid, bytes=written, sha256=got)

    def op_file_commit(self, rid: int, req: dict[str, Any]) -> None:
        handles = field_handles(req)
        with self.files_lock:
            drops = [self.drops.get(h) for h in handles]
        for handle, drop in zip(handles, drops, strict=True):
            if drop is None or drop.gone:
                raise Refused(f"no such drop: {handle}; nothing was committed")
            if drop.digest is None:
                raise Refused(f"drop {handle} is not closed and verified; nothing was committed")
        chosen: list[tuple[Drop, str]] = []
        try:
            for drop in drops:
                assert drop is not None
                chosen.append((drop, self._link_final(drop)))
        except (OSError, Refused) as exc:
            for drop, final in chosen:  # a name os.link made is ours: take it back
                with contextlib.suppress(OSError):
                    os.unlink(final, dir_fd=drop.dfd)
            why = describe_oserror(exc) if isinstance(exc, OSError) else str(exc)
            raise Refused(f"commit failed, nothing was committed: {why}") from None
        paths: list[str] = []
        for drop, final in chosen:
            with contextlib.suppress(OSError):
                os.unlink(drop.temp, dir_fd=drop.dfd)
            self._publish_mode(drop, final)
            paths.append(os.path.join(drop.dir, final))
            self._forget_drop(drop)
        self.ok(rid, paths=paths)

    @staticmethod
    def _link_final(drop: Drop) -> str:
        """Link the temp file under the first free final name: never over an existing file."""
        for final in final_names(drop.name):
            try:
                os.link(drop.temp, final, src_dir_fd=drop.dfd, dst_dir_fd=drop.dfd, follow_symlinks=False)
            except FileExistsError:
                continue
            except OSError as exc:
                raise OSError(exc.errno, exc.strerror, os.path.join(drop.dir, final)) from None
            return final
        raise Refused(f"no free name for {drop.name} in {drop.dir} (up to {DROP_NAME_TRIES}-{drop.name})")

    @staticmethod
    def _publish_mode(drop: Drop, final: str) -> None:
        """chmod 0644 the committed file — through an fd of the very inode we wrote."""
        with contextlib.suppress(OSError):
            flags = os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_NOCTTY | os.O_CLOEXEC
            fd = os.open(final, flags, dir_fd=drop.dfd)
            try:
                if os.fstat(fd).st_ino == drop.ino:
                    os.fchmod(fd, 0o644)
            finally:
                os.close(fd)

    def op_file_abort(self, rid: int, req: dict[str, Any]) -> None:
        handles = field_handles(req)
        with self.files_lock:
            drops = [d for d in (self.drops.pop(h, None) for h in handles) if d is not None]
        for drop in drops:
            with drop.lock:
                self._remove_drop(drop)
        self.ok(rid, removed=len(drops))

    # ---- files: reads (file_read, file_ack, file_read_cancel)

    def op_file_read(self, rid: int, req: dict[str, Any]) -> None:
        try:
            path = field_path(req, "path")
            if not path or not path.startswith("/"):
                raise BadRequest("path must be an absolute path")
            limit = field_int(req, "maxBytes", required=True, lo=0, hi=2**53)
            window = field_int(req, "window", required=True, lo=1, hi=2**53)
            assert limit is not None and window is not None
            with self.files_lock:
                state = self.reads.setdefault(rid, FileRead(window))
            with state.cond:
                state.window = window
            self._file_read(rid, path, limit, state)
        finally:
            with self.files_lock:
                self.reads.pop(rid, None)

    def _file_read(self, rid: int, path: str, limit: int, state: FileRead) -> None:
        try:
            # O_NONBLOCK: opening a FIFO must not wait for a writer.
            fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK | os.O_NOCTTY | os.O_CLOEXEC)
        except OSError as exc:
            if exc.errno == errno.ENXIO:  # a socket cannot be opened at all
                with contextlib.suppress(OSError):
                    if stat.S_ISSOCK(os.stat(path).st_mode):
                        raise Refused("not a regular file: socket") from None
            raise
        try:
            st = os.fstat(fd)
            if not stat.S_ISREG(st.st_mode):
                raise Refused(f"not a regular file: {file_kind(st.st_mode)}")
            if st.st_size > limit:
                raise Refused(f"file is {st.st_size} bytes, over the limit of {limit}")
            size, digest = self._hash_file(fd, limit, state)
            self.chan.send({"id": rid, "ev": "meta", "bytes": size, "sha256": digest,
                            "name": os.path.basename(path), "mode": stat.S_IMODE(st.st_mode)})  # fmt: skip
            sent, digest = self._send_file(rid, fd, size, state)
        finally:
            os.close(fd)
        self.ok(rid, bytes=sent, sha256=digest)

    @staticmethod
    def _hash_file(fd: int, limit: int, state: FileRead) -> tuple[int, str]:
        """The first pass: size and sha256 of what the file holds now (up to ``limit``)."""
        sha = hashlib.sha256()
        buf = bytearray(READ_BUF)
        view = memoryview(buf)
        size = 0
        while True:
            if state.cancelled:
                raise Refused("cancelled")
            n = os.readv(fd, [view])
            if not n:
                return size, sha.hexdigest()
            size += n
            if size > limit:  # grew since the fstat (or a /proc-like file with no size)
                raise Refused(f"file is at least {size} bytes, over the limit of {limit}")
            sha.update(view[:n])

    def _send_file(self, rid: int, fd: int, size: int, state: FileRead) -> tuple[int, str]:
        """The second pass: ``data`` events in order, never more than the window past the acks."""
        sha = hashlib.sha256()
        buf = bytearray(READ_CHUNK)
        view = memoryview(buf)
        os.lseek(fd, 0, os.SEEK_SET)
        prefix = b'{"id":%d,"ev":"data","offset":' % rid
        offset = 0
        while offset < size:
            with state.cond:
                stalled = time.monotonic() + READ_STALL_S
                while not state.cancelled and state.acked + state.window <= offset:
                    acked = state.acked
                    state.cond.wait(min(5.0, stalled - time.monotonic()))
                    if state.acked != acked:
                        stalled = time.monotonic() + READ_STALL_S
                    elif time.monotonic() >= stalled:
                        raise Refused(f"the host acknowledged nothing for {READ_STALL_S:.0f} s")
                if state.cancelled:
                    raise Refused("cancelled")
                want = min(READ_CHUNK, size - offset, state.acked + state.window - offset)
            n = os.readv(fd, [view[:want]])
            if not n:
                break  # shrank since the first pass: the reply's count says so
            with state.cond:
                state.sent = offset + n  # before the write: an ack may overtake our return from it
            piece = view[:n]
            sha.update(piece)
            # Built by hand: base64 needs no JSON escaping, and json.dumps of a
            # big string costs more than the encoding itself.
            line = [prefix, b"%d" % offset, b',"data":"', binascii.b2a_base64(piece, newline=False), b'"}\n']
            if not self.chan.send_parts(line):
                raise Refused("the channel to the host failed")
            offset += n
        return offset, sha.hexdigest()

    def op_file_ack(self, rid: int, req: dict[str, Any]) -> None:
        read = field_int(req, "read", required=True)
        offset = field_int(req, "offset", required=True, lo=0)
        assert offset is not None
        with self.files_lock:
            state = self.reads.get(read)  # type: ignore[arg-type]
        if state is None:
            self.ok(rid, known=False)
            return
        with state.cond:
            # never credit more than was sent: the window stays the window
            state.acked = max(state.acked, min(offset, state.sent))
            state.cond.notify_all()
        self.ok(rid, known=True)

    def op_file_read_cancel(self, rid: int, req: dict[str, Any]) -> None:
        read = field_int(req, "read", required=True)
        with self.files_lock:
            state = self.reads.get(read)  # type: ignore[arg-type]
        if state is not None:
            with state.cond:
                state.cancelled = True
                state.cond.notify_all()
        self.ok(rid)

    # ---- shutdown

    def op_shutdown(self, rid: int, req: dict[str, Any]) -> None:
        self.shutting_down = True
        self.ok(rid)
        if not self.may_power_off:
            log("shutdown requested: exiting (this mode never powers the machine off)")
            self.terminate_children()
            os._exit(0)
        log("shutdown requested: syncing and powering off")
        self.terminate_children()
        os.sync()
        power_off()

    def finish(self, grace: float) -> None:
        """The host hung up: kill what runs, let in-flight requests answer, briefly."""
        self.terminate_children()
        with self.lock:
            watches = list(self.watches.values())
        for watch in watches:
            watch.cancel()
        with self.files_lock:
            reads = list(self.reads.values())
        for state in reads:
            with state.cond:
                state.cancelled = True
                state.cond.notify_all()
        deadline = time.monotonic() + grace
        with self.lock:
            workers = list(self.workers)
        for worker in workers:
            worker.join(max(0.0, deadline - time.monotonic()))

    def terminate_children(self) -> None:
        with self.lock:
            leaders = [p.pid for p in self.procs.values() if p.returncode is None]
            leaders += [p.proc.pid for p in self.ptys.values() if p.proc.returncode is None]
        for pid in leaders:
            kill_tree(pid, signal.SIGKILL)


def seed_rng(data: bytes) -> dict[str, Any]:
    """Credit host entropy to the kernel pool and force the CRNG to reseed.

    A restored snapshot carries its RNG state: without this, clones would
    draw the same "random" numbers until the kernel reseeds on its own.
    """
    out: dict[str, Any] = {}
    try:
        fd = os.open("/dev/urandom", os.O_WRONLY | os.O_CLOEXEC)
    except OSError as exc:
        return {"rngError": describe_oserror(exc)}
    try:
        try:
            # struct rand_pool_info { int entropy_count; int buf_size; __u32 buf[]; }
            fcntl.ioctl(fd, RNDADDENTROPY, struct.pack("ii", len(data) * 8, len(data)) + data)
            out["entropyCredited"] = True
        except OSError as exc:
            os.write(fd, data)  # mixed in, at least, though not credited
            out["rngError"] = describe_oserror(exc, "RNDADDENTROPY")
        try:
            fcntl.ioctl(fd, RNDRESEEDCRNG)
            out["crngReseeded"] = True
        except OSError as exc:
            out["rngError"] = describe_oserror(exc, "RNDRESEEDCRNG")
    finally:
        os.close(fd)
    return out


def write_machine_id(sysroot: str, machine_id: str) -> dict[str, Any]:
    """Write ``/etc/machine-id`` (and dbus's copy when it is a file of its own)."""
    written: list[str] = []
    errors: list[str] = []
    for rel in MACHINE_ID_FILES:
        path = os.path.join(sysroot, rel)
        optional = rel != MACHINE_ID_FILES[0]
        if os.path.islink(path) or (optional and not os.path.exists(path)):
            continue  # e.g. dbus's link to /etc/machine-id, or no dbus at all
        if not os.path.isdir(os.path.dirname(path)):
            continue
        tmp = f"{path}.rigd-{os.getpid()}"
        try:
            fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_NOFOLLOW | os.O_CLOEXEC, 0o444)
            try:
                os.write(fd, (machine_id + "\n").encode())
                os.fsync(fd)
            finally:
                os.close(fd)
            os.replace(tmp, path)
            written.append("/" + rel)
        except OSError as exc:
            with contextlib.suppress(OSError):
                os.unlink(tmp)
            errors.append(describe_oserror(exc, "/" + rel))
    out: dict[str, Any] = {"machineIdFiles": written}
    if errors:
        out["machineIdError"] = "; ".join(errors)
    return out


def set_mac(mac: str) -> dict[str, Any]:
    """Give the first virtio NIC the rig's MAC (its device state came from the snapshot)."""
    try:
        names = sorted(os.listdir("/sys/class/net"))
    except OSError:
        return {"macSet": []}
    for name in names:
        try:
            driver = os.path.basename(os.readlink(f"/sys/class/net/{name}/device/driver"))
        except OSError:
            continue
        if driver != "virtio_net":
            continue
        ifreq = struct.pack("16sH6s8x", name.encode()[:15], ARPHRD_ETHER, bytes.fromhex(mac.replace(":", "")))
        try:
            with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as s:
                fcntl.ioctl(s.fileno(), SIOCSIFHWADDR, ifreq)
        except OSError as exc:
            return {"macSet": [], "macError": describe_oserror(exc, name)}
        return {"macSet": [name]}
    return {"macSet": []}


def power_off() -> None:
    try:
        import ctypes

        libc = ctypes.CDLL(None, use_errno=True)
        libc.reboot(ctypes.c_int(RB_POWER_OFF))
        log(f"reboot(RB_POWER_OFF) failed: errno {ctypes.get_errno()}")
    except Exception as exc:
        log(f"reboot() via ctypes unavailable: {exc!r}")
    # The syscall needs CAP_SYS_BOOT, which root has in both kinds of image;
    # these are for the odd guest where it is refused anyway. The terminal
    # tools disk has busybox; a desktop image has systemd (and no busybox).
    for argv in ([BUSYBOX, "poweroff", "-f"], ["systemctl", "poweroff", "--force"], ["poweroff", "-f"]):
        if argv[0].startswith("/") and not os.path.exists(argv[0]):
            continue
        with contextlib.suppress(Exception):
            subprocess.run(argv, env=clean_env(), check=False, timeout=30,
                           stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
            time.sleep(5)  # a poweroff that was accepted takes the machine down meanwhile
    log("could not power off")


# --------------------------------------------------------------------------
# the port


def find_port() -> str | None:
    direct = f"/dev/virtio-ports/{PORT_NAME}"
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
                if f.read().strip() == PORT_NAME:
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


def make_desktop(session_env: str | None) -> Desktop | None:
    """The X session this agent serves, if it knows one (docs/guest-protocol.md, protocol 2)."""
    env = read_session_env(session_env, os.environ)
    if not env:
        return None
    desktop = Desktop(env)
    threading.Thread(target=desktop.warm_up, name="warm-up", daemon=True).start()
    return desktop


def serve_stdio(sysroot: str | None = None, session_env: str | None = None) -> None:
    # Keep the protocol on private fds and point 0/1 elsewhere, so a stray
    # print() can never corrupt the channel.
    rfd, wfd = os.dup(0), os.dup(1)
    null = os.open(os.devnull, os.O_RDONLY)
    os.dup2(null, 0)
    os.close(null)
    os.dup2(2, 1)
    sys.stdout = sys.stderr
    chan = Channel(wfd)
    agent = Agent(chan, may_set_clock=False, may_power_off=False, sysroot=sysroot,
                  desktop=make_desktop(session_env))
    reader = LineReader()
    chan.send(agent.ready_event())
    while True:
        try:
            data = os.read(rfd, 65536)
        except InterruptedError:
            continue
        except OSError as exc:
            log(f"read failed: {exc}")
            data = b""
        if not data:
            break
        for line in reader.feed(data):
            agent.handle_line(line)
    agent.finish(grace=2.0)
    os._exit(0)


def serve_port(
    spec: str,
    *,
    console: str | None,
    set_clock: bool,
    power: bool,
    sysroot: str | None = "/",
    session_env: str | None = None,
) -> None:
    fd = open_port(spec)
    chan = Channel(fd)
    agent = Agent(chan, may_set_clock=set_clock, may_power_off=power, sysroot=sysroot,
                  desktop=make_desktop(session_env))
    reader = LineReader()
    # The console line first: the ready line blocks until the host is connected.
    announce_console(console)
    chan.send(agent.ready_event())
    idle = 0.0
    while True:
        try:
            data = os.read(fd, 65536)
        except (InterruptedError, BlockingIOError):
            continue
        except OSError as exc:
            log(f"port read failed ({exc}); reopening")
            new_fd = open_port(spec)
            chan.swap(new_fd)
            close_quietly(fd)
            fd = new_fd
            reader.reset()
            chan.send(agent.ready_event())
            continue
        if not data:
            # virtio-serial reads return 0 while no host is connected: the
            # partial line (if any) is lost; poll gently until one connects.
            reader.reset()
            idle = min(idle + 0.01, 0.1)
            time.sleep(idle)
            continue
        idle = 0.0
        for line in reader.feed(data):
            agent.handle_line(line)


# --------------------------------------------------------------------------
# PID 1


def become_subreaper() -> None:
    """Outside a real PID 1 (tests), adopt orphans so the reaping is still ours."""
    with contextlib.suppress(Exception):
        import ctypes

        ctypes.CDLL(None).prctl(PR_SET_CHILD_SUBREAPER, 1, 0, 0, 0)


def write_pidfile(path: str | None, pid: int) -> None:
    if not path:
        return
    try:
        os.makedirs(os.path.dirname(path) or ".", exist_ok=True)
        tmp = f"{path}.tmp"
        with open(tmp, "w") as f:
            f.write(f"{pid}\n")
        os.replace(tmp, path)
    except OSError as exc:
        log(f"cannot write {path}: {exc}")


def run_pid1(args: argparse.Namespace) -> None:
    """Stay PID 1 forever: reap everything, keep one agent child alive."""
    for sig in (
        signal.SIGINT,
        signal.SIGTERM,
        signal.SIGHUP,
        signal.SIGTSTP,
        signal.SIGTTIN,
        signal.SIGTTOU,
        signal.SIGPIPE,
    ):
        with contextlib.suppress(Exception):
            signal.signal(sig, signal.SIG_IGN)
    if os.getpid() != 1:
        become_subreaper()
    agent_pid: int | None = None
    started = 0.0
    backoff = 0.0
    next_start = 0.0
    announce = True
    while True:
        try:
            if agent_pid is None:
                delay = next_start - time.monotonic()
                if delay > 0:
                    time.sleep(delay)
                started = time.monotonic()
                agent_pid = spawn_agent_child(args, console=args.console if announce else None)
                announce = False
                write_pidfile(args.pidfile, agent_pid)
            try:
                pid, status = os.waitpid(-1, 0)
            except ChildProcessError:
                time.sleep(1.0)
                continue
            if pid == agent_pid:
                agent_pid = None
                lived = time.monotonic() - started
                backoff = 0.2 if lived > 30 or backoff == 0 else min(backoff * 2, 10.0)
                next_start = time.monotonic() + backoff
                log(f"agent child {pid} died (wait status {status}); restarting in {backoff:.1f}s")
        except BaseException:  # PID 1 must never exit
            with contextlib.suppress(BaseException):
                log("pid1 loop error:\n" + traceback.format_exc())
                time.sleep(1.0)


def spawn_agent_child(args: argparse.Namespace, *, console: str | None) -> int:
    pid = os.fork()
    if pid:
        return pid
    code = 1
    try:
        for sig in (signal.SIGTERM, signal.SIGHUP, signal.SIGTSTP, signal.SIGTTIN, signal.SIGTTOU):
            signal.signal(sig, signal.SIG_DFL)
        # SIGINT must not stay ignored: ignored signals survive exec into children.
        signal.signal(signal.SIGINT, signal.default_int_handler)
        with contextlib.suppress(OSError):
            os.setsid()
        serve_port(args.port, console=console, set_clock=not args.no_clock, power=not args.no_poweroff,
                   sysroot=args.sysroot or "/", session_env=args.session_env)
        code = 0
    except BaseException:
        with contextlib.suppress(BaseException):
            log("agent child failed:\n" + traceback.format_exc())
    finally:
        os._exit(code)


# --------------------------------------------------------------------------


def parse_args(argv: list[str]) -> argparse.Namespace:
    p = argparse.ArgumentParser(prog="rigd_agent", description="rigd in-guest agent (proto 1; 2 with X)")
    mode = p.add_mutually_exclusive_group(required=True)
    mode.add_argument("--stdio", action="store_true", help="speak on stdin/stdout (host tests)")
    mode.add_argument("--port", metavar="auto|PATH", help="the virtio-serial port to speak on")
    p.add_argument("--pid1", action="store_true", help="be init: reap, supervise the agent")
    p.add_argument("--pidfile", default="/run/rigd-agent.pid", help="where --pid1 writes the agent's pid")
    p.add_argument("--console", default="/dev/console", help="where RIGD-AGENT-READY goes ('' for nowhere)")
    p.add_argument("--no-clock", action="store_true",
                   help="never set the clock on hello, seed the kernel RNG or set a MAC (reseed)")
    p.add_argument("--sysroot", default=None,
                   help="where reseed writes etc/machine-id (port mode: /; --stdio: nowhere unless given)")
    p.add_argument("--no-poweroff", action="store_true", help="shutdown exits instead of powering off")
    p.add_argument("--session-env", default=SESSION_ENV_FILE, metavar="PATH",
                   help="KEY=VALUE file naming the X session (DISPLAY, XAUTHORITY); '' for none")
    args = p.parse_args(argv)
    if args.pid1 and args.stdio:
        p.error("--pid1 needs --port")
    return args


def main(argv: list[str] | None = None) -> None:
    try:
        args = parse_args(sys.argv[1:] if argv is None else argv)
    except SystemExit:
        if os.getpid() != 1:
            raise
        # PID 1 must not exit over a bad command line: fall back to the defaults.
        args = parse_args(["--pid1", "--port", "auto"])
    if args.pid1:
        run_pid1(args)
    elif args.stdio:
        serve_stdio(args.sysroot, args.session_env)
    else:
        serve_port(args.port, console=args.console, set_clock=not args.no_clock, power=not args.no_poweroff,
                   sysroot=args.sysroot or "/", session_env=args.session_env)


if __name__ == "__main__":
    main()
