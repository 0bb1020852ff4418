"""The newc writer: what the kernel needs to unpack our initramfs."""

from __future__ import annotations

import io
import stat

import pytest

from rigd.errors import RigdError
from rigd.images import cpio


def _write(entries: list[cpio.Entry], mtime: int = 0) -> bytes:
    buf = io.BytesIO()
    cpio.write_newc(entries, buf, mtime=mtime)
    return buf.getvalue()


def test_round_trip_keeps_types_modes_data_and_devices() -> None:
    entries = [
        cpio.directory("bin"),
        cpio.regular("bin/busybox", b"\x7fELF" + b"x" * 13, 0o755),
        cpio.symlink("bin/sh", "busybox"),
        cpio.directory("dev"),
        cpio.chardev("dev/console", 5, 1),
        cpio.regular("init", b"#!/bin/sh\n", 0o755),
    ]
    got = {e.path: e for e in cpio.read_newc(_write(entries))}
    assert got["bin/busybox"].data == b"\x7fELF" + b"x" * 13
    assert stat.S_IMODE(got["bin/busybox"].mode) == 0o755
    assert stat.S_ISLNK(got["bin/sh"].mode) and got["bin/sh"].data == b"busybox"
    assert stat.S_ISCHR(got["dev/console"].mode) and got["dev/console"].rdev == (5, 1)
    assert stat.S_ISDIR(got["dev"].mode)


def test_parents_come_first_and_output_is_deterministic() -> None:
    a = [cpio.regular("a/b", b"1"), cpio.directory("a"), cpio.regular("a-b", b"2")]
    b = list(reversed(a))
    assert _write(a) == _write(b)
    names = [e.path for e in cpio.read_newc(_write(a))]
    assert names.index("a") < names.index("a/b")


def test_layout_is_aligned_and_ends_with_the_trailer() -> None:
    data = _write([cpio.regular("x", b"abc")], mtime=1234)
    assert data.startswith(b"070701")
    assert len(data) % 4 == 0
    assert b"TRAILER!!!\0" in data[-16:]
    # mtime field (7th, hex) carries the fixed time, owners are root
    assert data[6 + 8 * 5 : 6 + 8 * 6] == b"%08X" % 1234
    assert data[6 + 8 * 2 : 6 + 8 * 4] == b"0" * 16


@pytest.mark.parametrize(
    ("entries", "fragment"),
    [
        ([cpio.regular("/abs", b"")], "relative"),
        ([cpio.regular("a/../b", b"")], "relative"),
        ([cpio.regular("x", b""), cpio.regular("x", b"")], "twice"),
        ([cpio.regular("nodir/x", b"")], "parent"),
        ([cpio.Entry("d", stat.S_IFDIR | 0o755, b"data")], "only files"),
    ],
)
def test_bad_entries_are_refused(entries: list[cpio.Entry], fragment: str) -> None:
    with pytest.raises(RigdError, match=fragment):
        _write(entries)
