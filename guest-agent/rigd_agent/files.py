"""Files in both protocols, the pure parts: drop names (never over an existing file), paths,
handles, and the state of a drop (:class:`Drop`) and of a read (:class:`FileRead`).
"""

from __future__ import annotations

import hashlib
import os
import re
import stat
import threading
from collections.abc import Iterator
from typing import Any

from rigd_agent.base import BadRequest, Refused, field_str

DROP_MAX_OPEN = 64  # drops with an open temp file at once


DROP_PART_MAX = 512 * 1024  # raw bytes per file_put_data


DROP_FILE_MAX = 256 << 20  # bytes per dropped file


DROP_STALE_S = 3600.0  # an unowned temp file older than this is swept


DROP_NAME_TRIES = 9999  # name, 2-name, … 9999-name


DROP_B64_MAX = 4 * ((DROP_PART_MAX + 2) // 3)


READ_CHUNK = 256 * 1024  # raw bytes per file_read data event


READ_BUF = 1 << 20  # bytes per read(2) of the hashing pass


READ_STALL_S = 300.0  # a file_read the host stops acknowledging ends after this long


DROP_TEMP = re.compile(r"\.rigd-drop-[0-9a-f]{16}\.part\Z")


# A file_put_data line as GuestProtocol.send_request writes it, up to the base64
# (the line must end with '"}'). Numbers as JSON spells them: no leading zeros.
_INT = rb"(0|-?[1-9][0-9]{0,17})"


PUT_DATA_LINE = re.compile(
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
    if DROP_TEMP.match(name):
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

