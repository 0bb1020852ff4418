"""A deterministic writer for the cpio "newc" format the Linux initramfs reads.

How this works: each entry is a 110-byte ASCII header (magic ``070701`` and
thirteen 8-digit hex fields), the NUL-terminated name, padding to 4 bytes,
the data, padding to 4 bytes. The archive ends with an entry named
``TRAILER!!!``. We write everything ourselves instead of calling ``cpio`` so
that the output depends only on the entries: owners are 0, times are one fixed
value, inode numbers are assigned in order, and entries are sorted so that a
directory always precedes what it contains (the kernel creates files in
archive order and does not make missing parent directories).

Device nodes (``/dev/console``) are written as headers alone, which is why the
initramfs can be built without root.
"""

from __future__ import annotations

import stat
from dataclasses import dataclass
from typing import BinaryIO

from rigd.errors import RigdError

_MAGIC = b"070701"
_TRAILER = "TRAILER!!!"


@dataclass(frozen=True, slots=True)
class Entry:
    """One archive member. ``path`` is relative, without a leading slash."""

    path: str
    mode: int  # full st_mode: file type bits plus permissions
    data: bytes = b""
    rdev: tuple[int, int] = (0, 0)  # (major, minor) for device nodes; a symlink's data is its target


def directory(path: str, perm: int = 0o755) -> Entry:
    return Entry(path, stat.S_IFDIR | perm)


def regular(path: str, data: bytes, perm: int = 0o644) -> Entry:
    return Entry(path, stat.S_IFREG | perm, data)


def symlink(path: str, target: str) -> Entry:
    return Entry(path, stat.S_IFLNK | 0o777, target.encode())


def chardev(path: str, major: int, minor: int, perm: int = 0o600) -> Entry:
    return Entry(path, stat.S_IFCHR | perm, rdev=(major, minor))


def _check_path(path: str) -> None:
    parts = path.split("/")
    if not path or path.startswith("/") or any(p in ("", ".", "..") for p in parts):
        raise RigdError(f"cpio entry path {path!r} must be relative and normalised", path=path)


def _header(
    *, ino: int, mode: int, nlink: int, mtime: int, size: int, rdev: tuple[int, int], namesize: int
) -> bytes:
    fields = (
        ino,
        mode,
        0,  # uid
        0,  # gid
        nlink,
        mtime,
        size,
        0,  # devmajor
        0,  # devminor
        rdev[0],
        rdev[1],
        namesize,
        0,  # check (unused by newc)
    )
    return _MAGIC + b"".join(b"%08X" % f for f in fields)


def _pad(n: int) -> bytes:
    return b"\0" * (-n % 4)


def write_newc(entries: list[Entry], out: BinaryIO, *, mtime: int = 0) -> None:
    """Write ``entries`` as a newc archive; entries are sorted by path first.

    Sorting by path component tuples puts ``a`` before ``a/b``, so parents are
    always created first. Duplicate paths are an error (the kernel would keep
    the last one silently).
    """
    for e in entries:
        _check_path(e.path)
    ordered = sorted(entries, key=lambda e: e.path.split("/"))
    seen: set[str] = set()
    for e in ordered:
        if e.path in seen:
            raise RigdError(f"cpio entry {e.path!r} appears twice", path=e.path)
        seen.add(e.path)
        parent = e.path.rpartition("/")[0]
        if parent and parent not in seen:
            raise RigdError(f"cpio entry {e.path!r} has no parent directory entry {parent!r}", path=e.path)
        if not (stat.S_ISREG(e.mode) or stat.S_ISLNK(e.mode)) and e.data:
            raise RigdError(f"cpio entry {e.path!r}: only files and symlinks carry data")
    for ino, e in enumerate(ordered, start=1):
        name = e.path.encode() + b"\0"
        nlink = 2 if stat.S_ISDIR(e.mode) else 1
        out.write(
            _header(
                ino=ino,
                mode=e.mode,
                nlink=nlink,
                mtime=mtime,
                size=len(e.data),
                rdev=e.rdev,
                namesize=len(name),
            )
        )
        out.write(name + _pad(110 + len(name)))
        out.write(e.data + _pad(len(e.data)))
    name = _TRAILER.encode() + b"\0"
    out.write(_header(ino=0, mode=0, nlink=1, mtime=0, size=0, rdev=(0, 0), namesize=len(name)))
    out.write(name + _pad(110 + len(name)))


def read_newc(data: bytes) -> list[Entry]:
    """Parse a newc archive (used by tests and to inspect a built initramfs)."""
    out: list[Entry] = []
    pos = 0
    while True:
        if data[pos : pos + 6] != _MAGIC:
            raise RigdError(f"not a newc cpio archive at offset {pos}")
        f = [int(data[pos + 6 + 8 * i : pos + 14 + 8 * i], 16) for i in range(13)]
        mode, size, rmaj, rmin, namesize = f[1], f[6], f[9], f[10], f[11]
        pos += 110
        name = data[pos : pos + namesize - 1].decode()
        pos += namesize + (-(110 + namesize) % 4)
        body = data[pos : pos + size]
        pos += size + (-size % 4)
        if name == _TRAILER:
            return out
        out.append(Entry(name, mode, body, (rmaj, rmin)))
