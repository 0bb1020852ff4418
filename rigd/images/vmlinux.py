"""Extract the uncompressed ELF ``vmlinux`` from an x86 ``bzImage``.

Why: QEMU boots an ELF kernel that carries a PVH entry note directly in
32-bit protected mode (``-M microvm`` and q35 with ``-kernel``), skipping the
real-mode setup code and the in-guest decompressor. Under TCG that saves
about half a second per boot (HOST-NOTES).

How this works: a bzImage is the real-mode setup sectors followed by the
protected-mode stub and a compressed payload. Boot protocol 2.08+ records the
payload's offset and length in the setup header (``payload_offset`` at 0x248,
``payload_length`` at 0x24c, relative to the start of the protected-mode
code, which begins after ``setup_sects + 1`` sectors). The compressor is
recognised by the payload's magic. The kernel's build appends the
uncompressed size as four trailing bytes, which some decoders dislike, so they
are dropped. When the header is absent (an odd input), we fall back to what
the kernel's ``scripts/extract-vmlinux`` does: try every compressor magic
found in the file and keep the first result that is an ELF.

Debian's cloud kernel uses LZ4 (legacy frame), which Python's standard
library lacks: the blocks are decoded by the ``lz4`` package (the reference C
decoder, bounds-checked); only the legacy frame's walk (magic, then
size-prefixed blocks, which ``lz4.frame`` does not read) is here. zstd uses the
``zstd`` program (Python 3.11 has no zstd module).
"""

from __future__ import annotations

import bz2
import lzma
import shutil
import struct
import subprocess
import zlib
from collections.abc import Callable

import lz4.block

from rigd.errors import RigdError

_LZ4_LEGACY_MAGIC = 0x184C2102
_LZ4_LEGACY_BLOCK = 8 << 20  # a legacy frame's blocks decode to at most 8 MiB each
_ELF_MAGIC = b"\x7fELF"
_EM_X86_64 = 62
_PT_NOTE = 4
_XEN_ELFNOTE_PHYS32_ENTRY = 18  # the note QEMU looks for to PVH-boot an ELF


def lz4_block_decompress(src: bytes | memoryview) -> bytes:
    """Decode one LZ4 *block* of a legacy frame (at most 8 MiB of output).

    Legacy-frame blocks are independent (no match reaches into an earlier
    block), so each is decoded on its own.
    """
    try:
        out: bytes = lz4.block.decompress(src, uncompressed_size=_LZ4_LEGACY_BLOCK)
    except lz4.block.LZ4BlockError as exc:
        raise RigdError(f"corrupt LZ4 block: {exc}") from exc
    return out


def lz4_legacy_decompress(data: bytes | memoryview) -> bytes:
    """Decode an LZ4 legacy frame (magic 0x184C2102, then size-prefixed blocks).

    Stops at the end of input, at a block size that cannot be right (the
    trailing uncompressed-size word the kernel appends), or at a new magic.
    """
    data = memoryview(data)
    if len(data) < 4 or struct.unpack_from("<I", data, 0)[0] != _LZ4_LEGACY_MAGIC:
        raise RigdError("not an LZ4 legacy frame")
    out = bytearray()
    pos = 4
    while pos + 4 <= len(data):
        (size,) = struct.unpack_from("<I", data, pos)
        if size == _LZ4_LEGACY_MAGIC:
            pos += 4
            continue
        if size == 0 or pos + 4 + size > len(data):
            break
        out += lz4_block_decompress(data[pos + 4 : pos + 4 + size])
        pos += 4 + size
    if not out:
        raise RigdError("LZ4 legacy frame holds no blocks")
    return bytes(out)


def _gzip(data: bytes) -> bytes:
    d = zlib.decompressobj(wbits=16 + zlib.MAX_WBITS)
    return d.decompress(data)  # trailing bytes land in d.unused_data


def _xz(data: bytes) -> bytes:
    d = lzma.LZMADecompressor(format=lzma.FORMAT_XZ)
    return d.decompress(data)


def _lzma(data: bytes) -> bytes:
    d = lzma.LZMADecompressor(format=lzma.FORMAT_ALONE)
    return d.decompress(data)


def _bzip2(data: bytes) -> bytes:
    d = bz2.BZ2Decompressor()
    return d.decompress(data)


def _zstd(data: bytes) -> bytes:
    exe = shutil.which("zstd")
    if exe is None:
        raise RigdError("the kernel is zstd-compressed and the `zstd` program is not installed")
    # The kernel appends 4 size bytes after the zstd frame; zstd reports them as
    # garbage after a complete frame but has already written the output.
    res = subprocess.run([exe, "-dcq"], input=data, capture_output=True, check=False)
    if not res.stdout:
        raise RigdError(f"zstd could not decode the kernel payload: {res.stderr.decode().strip()}")
    return res.stdout


# Magic → (name, decoder). Order matters only for the fallback scan.
_DECODERS: list[tuple[bytes, str, Callable[[bytes], bytes]]] = [
    (b"\x1f\x8b\x08", "gzip", _gzip),
    (b"\xfd7zXZ\x00", "xz", _xz),
    (b"\x28\xb5\x2f\xfd", "zstd", _zstd),
    (struct.pack("<I", _LZ4_LEGACY_MAGIC), "lz4", lz4_legacy_decompress),
    (b"BZh", "bzip2", _bzip2),
    (b"\x5d\x00\x00", "lzma", _lzma),
]


def check_elf(data: bytes, *, require_pvh: bool = True) -> None:
    """Raise unless ``data`` is an x86-64 ELF (with a PVH entry note if asked)."""
    if data[:4] != _ELF_MAGIC:
        raise RigdError("decompressed kernel is not an ELF file")
    if data[4] != 2 or data[5] != 1:
        raise RigdError("kernel ELF is not 64-bit little-endian")
    (machine,) = struct.unpack_from("<H", data, 18)
    if machine != _EM_X86_64:
        raise RigdError(f"kernel ELF is for machine {machine}, not x86-64 ({_EM_X86_64})")
    if require_pvh and not has_pvh_note(data):
        raise RigdError("kernel ELF has no PVH entry note (CONFIG_PVH=y is needed to PVH-boot it)")


def has_pvh_note(data: bytes) -> bool:
    """True when a PT_NOTE segment holds Xen note 18 (XEN_ELFNOTE_PHYS32_ENTRY)."""
    (phoff,) = struct.unpack_from("<Q", data, 32)
    phentsize, phnum = struct.unpack_from("<HH", data, 54)
    for k in range(phnum):
        base = phoff + k * phentsize
        (p_type,) = struct.unpack_from("<I", data, base)
        if p_type != _PT_NOTE:
            continue
        (off,) = struct.unpack_from("<Q", data, base + 8)
        (size,) = struct.unpack_from("<Q", data, base + 32)
        pos, end = off, off + size
        while pos + 12 <= end:
            namesz, descsz, ntype = struct.unpack_from("<III", data, pos)
            name = data[pos + 12 : pos + 12 + namesz].rstrip(b"\0")
            if name == b"Xen" and ntype == _XEN_ELFNOTE_PHYS32_ENTRY:
                return True
            pos += 12 + ((namesz + 3) & ~3) + ((descsz + 3) & ~3)
    return False


def _payload_from_header(image: bytes) -> bytes | None:
    if len(image) < 0x250 or image[0x202:0x206] != b"HdrS":
        return None
    (version,) = struct.unpack_from("<H", image, 0x206)
    if version < 0x208:
        return None
    setup_sects = image[0x1F1] or 4  # 0 means 4 (boot protocol)
    offset, length = struct.unpack_from("<II", image, 0x248)
    start = (setup_sects + 1) * 512 + offset
    if length < 8 or start + length > len(image):
        return None
    return image[start : start + length - 4]  # drop the appended size word


def extract_vmlinux(image: bytes, *, require_pvh: bool = True) -> tuple[bytes, str]:
    """Return ``(elf_bytes, compressor_name)`` for a bzImage (or a bare payload).

    Raises :class:`RigdError` naming what was tried when nothing yields an ELF.
    """
    if image[:4] == _ELF_MAGIC:
        check_elf(image, require_pvh=require_pvh)
        return image, "none"
    tried: list[str] = []
    payload = _payload_from_header(image)
    if payload is not None:
        for magic, name, decode in _DECODERS:
            if payload.startswith(magic):
                try:
                    out = decode(payload)
                except (RigdError, OSError, EOFError, lzma.LZMAError, zlib.error) as exc:
                    raise RigdError(f"kernel payload ({name}) failed to decompress: {exc}") from exc
                check_elf(out, require_pvh=require_pvh)
                return out, name
        tried.append("setup-header payload of unknown format")
    # Fallback: scan like scripts/extract-vmlinux.
    for magic, name, decode in _DECODERS:
        pos = image.find(magic)
        while pos != -1:
            try:
                out = decode(image[pos:])
            except (RigdError, OSError, EOFError, lzma.LZMAError, zlib.error, ValueError):
                out = b""
            if out[:4] == _ELF_MAGIC:
                check_elf(out, require_pvh=require_pvh)
                return out, name
            tried.append(f"{name}@{pos}")
            if len(tried) > 200:  # short magics (lzma) recur; give up rather than crawl
                break
            pos = image.find(magic, pos + 1)
    raise RigdError(
        "no ELF kernel found inside the bzImage", tried=tried[:20] or ["no compressor magic found"]
    )
