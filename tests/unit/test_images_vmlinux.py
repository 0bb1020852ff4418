"""extract-vmlinux on synthetic bzImages (no real kernel needed)."""

from __future__ import annotations

import gzip
import lzma
import struct

import pytest

from rigd.errors import RigdError
from rigd.images.vmlinux import (
    extract_vmlinux,
    has_pvh_note,
    lz4_legacy_decompress,
)


def fake_elf(pvh: bool = True, size: int = 4096) -> bytes:
    """A minimal x86-64 ELF: header, one PT_NOTE program header, the note."""
    name = b"Xen\0"
    desc = struct.pack("<I", 0x1000000)
    note = struct.pack("<III", len(name), len(desc), 18 if pvh else 5) + name + desc
    phoff, note_off = 64, 64 + 56
    ehdr = bytearray(64)
    ehdr[:4] = b"\x7fELF"
    ehdr[4], ehdr[5], ehdr[6] = 2, 1, 1  # 64-bit, little-endian, version
    struct.pack_into("<HHI", ehdr, 16, 2, 62, 1)  # ET_EXEC, x86-64
    struct.pack_into("<Q", ehdr, 32, phoff)
    struct.pack_into("<HHH", ehdr, 52, 64, 56, 1)  # ehsize, phentsize, phnum
    phdr = struct.pack("<IIQQQQQQ", 4, 4, note_off, 0, 0, len(note), len(note), 4)
    body = bytes(ehdr) + phdr + note
    return body + bytes(range(256)) * ((size - len(body)) // 256 + 1)


def lz4_literal_block(data: bytes) -> bytes:
    """An LZ4 block that stores ``data`` as literals only (valid LZ4)."""
    n = len(data)
    if n < 15:
        return bytes([n << 4]) + data
    rest = n - 15
    ext = b"\xff" * (rest // 255) + bytes([rest % 255])
    return b"\xf0" + ext + data


def lz4_legacy_frame(*blocks: bytes) -> bytes:
    return struct.pack("<I", 0x184C2102) + b"".join(struct.pack("<I", len(b)) + b for b in blocks)


def lz4_legacy(data: bytes) -> bytes:
    return lz4_legacy_frame(lz4_literal_block(data))


def bzimage(payload: bytes, *, setup_sects: int = 4) -> bytes:
    """A bzImage-shaped file: setup sectors with a 2.08+ header, then the payload."""
    setup = bytearray((setup_sects + 1) * 512)
    setup[0x1F1] = setup_sects
    setup[0x202:0x206] = b"HdrS"
    struct.pack_into("<H", setup, 0x206, 0x20F)
    stub = b"\x90" * 300  # the decompressor stub before the payload
    full = payload + struct.pack("<I", 12345)  # the appended size word
    struct.pack_into("<II", setup, 0x248, len(stub), len(full))
    return bytes(setup) + stub + full + b"\0" * 64


@pytest.mark.parametrize(
    ("compress", "name"),
    [
        (lambda d: gzip.compress(d, mtime=0), "gzip"),
        (lambda d: lzma.compress(d, format=lzma.FORMAT_XZ), "xz"),
        (lz4_legacy, "lz4"),
    ],
)
def test_extracts_the_elf_from_each_compressor(compress: object, name: str) -> None:
    elf = fake_elf()
    out, used = extract_vmlinux(bzimage(compress(elf)))  # type: ignore[operator]
    assert out[: len(elf)] == elf
    assert used == name


def test_falls_back_to_scanning_without_a_setup_header() -> None:
    elf = fake_elf()
    blob = b"junk" * 100 + gzip.compress(elf, mtime=0) + b"tail"
    out, used = extract_vmlinux(blob)
    assert out == elf and used == "gzip"


def test_refuses_a_kernel_without_the_pvh_note() -> None:
    with pytest.raises(RigdError, match="PVH"):
        extract_vmlinux(bzimage(gzip.compress(fake_elf(pvh=False), mtime=0)))
    assert has_pvh_note(fake_elf(pvh=True))


def test_refuses_input_with_no_kernel_inside() -> None:
    with pytest.raises(RigdError, match="no ELF kernel"):
        extract_vmlinux(b"\0" * 4096)


def test_refuses_a_payload_that_is_not_an_elf() -> None:
    with pytest.raises(RigdError, match="not an ELF"):
        extract_vmlinux(bzimage(gzip.compress(b"hello" * 100, mtime=0)))


def test_lz4_matches_including_overlapping_copies() -> None:
    # token 0x14: 1 literal, match length 4+4=8; literal "a", offset 1 -> "a"*9,
    # then a final literal-only sequence of 11 bytes (the format wants the last
    # match to start 12 bytes before the end and the last 5 bytes literal).
    block = bytes([0x14]) + b"a" + struct.pack("<H", 1) + bytes([0xB0]) + b"bcdefghijkl"
    assert lz4_legacy_decompress(lz4_legacy_frame(block)) == b"a" * 9 + b"bcdefghijkl"


def test_lz4_rejects_an_offset_before_the_start() -> None:
    block = bytes([0x10]) + b"a" + struct.pack("<H", 5) + bytes([0x10]) + b"b"
    with pytest.raises(RigdError, match="corrupt LZ4 block"):
        lz4_legacy_decompress(lz4_legacy_frame(block))


def test_lz4_blocks_are_decoded_independently_and_joined() -> None:
    first, second = bytes(range(256)) * 3, b"tail" * 50
    assert lz4_legacy_decompress(lz4_legacy_frame(lz4_literal_block(first), lz4_literal_block(second))) \
        == first + second


def test_a_corrupt_lz4_kernel_payload_names_the_compressor() -> None:
    bad = lz4_legacy_frame(bytes([0x10]) + b"a" + struct.pack("<H", 5) + bytes([0x10]) + b"b")
    with pytest.raises(RigdError, match=r"kernel payload \(lz4\) failed to decompress"):
        extract_vmlinux(bzimage(bad))


def test_lz4_legacy_frame_round_trip() -> None:
    data = bytes(range(256)) * 40
    assert lz4_legacy_decompress(lz4_legacy(data)) == data
