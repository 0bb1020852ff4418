"""Import a computer-rig image into a data directory, pinned by sha256.

A computer rig boots a qcow2 disk by direct kernel boot, so an *image* is a
disk, the kernel and initramfs that boot it, and a few facts about it (its
guest protocol, its display size, the kernel command line it needs). Those
facts travel in a small JSON **manifest**, format ``rigd.image/v1``::

    {"format": "rigd.image/v1", "surface": "computer", "guest_protocol": 2,
     "kernel_release": "6.1.0-57-amd64", "cmdline": ["rw", ...],
     "display": {"width": 1280, "height": 800},
     "disk":   {"file": "desktop.qcow2", "sha256": "<64 hex>", "size": 123},
     "kernel": {"file": "vmlinux",       "sha256": "...", "size": ...},
     "initrd": {"file": "initrd.img",    "sha256": "...", "size": ...}}

``file`` names are plain file names beside the manifest (no directories).
The desktop builder (:mod:`rigd.images.desktop`) writes one next to the
qcow2 in its cache directory.

How an import works
-------------------
:func:`import_image` accepts a path, a ``file://`` URL or an ``http(s)://``
URL, and the sha256 the operator expects of *that* file. Everything is
fetched into a private staging directory ``<dataDir>/rigs/images/.import-*``
and hashed while it is written; nothing is looked at before the digest
matches. Then:

- the source is a **manifest**: each file it names is fetched from beside it
  (same directory, or the same URL path) and must match the manifest's own
  sha256 and size — the operator's digest pins the manifest, the manifest
  pins the rest;
- the source is a bare **qcow2**: the digest pins the disk, and the rest is
  read from inside it — the image's marker ``/etc/rigd/image.json`` names its
  kernel and initramfs, which are copied out (``qemu-img convert`` to a
  temporary raw file, then ``debugfs``; no mounts), and the kernel is
  unpacked to the ELF the rig boots.

Either way the disk must be a qcow2 **without a backing file** (a backing
file name would make QEMU open a path outside the data directory). The
staging directory is then renamed to ``<dataDir>/rigs/images/sha256-<hex>/``
holding ``disk.qcow2``, ``vmlinux``, ``initrd.img`` and ``rigd-image.json``
(the manifest with those names; it records the guest protocol). Any failure —
a digest mismatch first of all — removes the staging directory: an import
leaves either a complete image or nothing.

Paths: every file is written under a name we choose inside the staging
directory, created with ``O_NOFOLLOW|O_EXCL``; names from a manifest are
checked to be plain file names; the images directory itself must not be a
symlink. Nothing is ever written outside ``<dataDir>/rigs/images/``.
"""

from __future__ import annotations

import contextlib
import fcntl
import hashlib
import json
import os
import shutil
import subprocess
import tempfile
import time
import urllib.error
import urllib.parse
import urllib.request
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any, BinaryIO

from rigd.errors import FieldError, RigdError
from rigd.images.cache import READ_ONLY_MODE, remove_tree
from rigd.images.manifest import (
    FORMAT,
    HEX64,
    MANIFEST_NAME,
    MARKER_FORMAT,
    MARKER_PATH,
    MAX_DISK_BYTES,
    PLAIN_NAME,
    FileRef,
    ImageManifest,
    ImageMarker,
    parse_manifest,
    parse_marker,
)
from rigd.images.vmlinux import extract_vmlinux

DISK_NAME = "disk.qcow2"
KERNEL_NAME = "vmlinux"
INITRD_NAME = "initrd.img"

MAX_MANIFEST_BYTES = 1 << 20
HTTP_TIMEOUT_S = 60.0
#: Bytes per read: the unit of progress events and of cancellation checks.
CHUNK_BYTES = 1 << 20
_QCOW2_MAGIC = b"QFI\xfb"

Progress = Callable[[str], None]


@dataclass(frozen=True, slots=True)
class ImportProgress:
    """Where an import is, for a progress bar.

    ``phase`` is the step in words (``"fetching <url>"``, ``"checking the
    disk"``, …). ``bytes`` counts every byte fetched so far by this import;
    ``total_bytes`` is what the whole import will fetch, when known: the first
    file's Content-Length or size, then — once a manifest is read — the
    manifest plus the sizes it pins. It is display only (a server may lie in
    Content-Length; the limits are enforced on the bytes themselves), and it
    falls back to ``None`` when more bytes arrive than it said.
    """

    phase: str
    bytes: int
    total_bytes: int | None


OnProgress = Callable[[ImportProgress], None]
#: Called between chunks and steps; whatever it raises stops the import (leaving nothing behind).
Check = Callable[[], None]


class _Meter:
    """The import's progress: phases as text (``say``) and as structured events, bytes, checks."""

    def __init__(self, say: Progress, on_progress: OnProgress | None, check: Check | None) -> None:
        self._say = say
        self._on = on_progress
        self._check = check or (lambda: None)
        self.phase = ""
        self.done = 0
        self.total: int | None = None

    def _emit(self) -> None:
        if self._on is not None:
            self._on(ImportProgress(self.phase, self.done, self.total))

    def step(self, phase: str) -> None:
        self._check()
        self.phase = phase
        self._say(phase)
        self._emit()

    def fetching(self, what: str, size_hint: int | None) -> None:
        if self.total is None and size_hint is not None:
            self.total = self.done + size_hint
        self.step(f"fetching {what}")

    def expect(self, more: int) -> None:
        """From now on the import fetches ``more`` bytes beyond those already counted."""
        self.total = self.done + more
        self._emit()

    def add(self, n: int) -> None:
        self.done += n
        if self.total is not None and self.done > self.total:
            self.total = None
        self._emit()
        self._check()

    def say(self, msg: str) -> None:
        self._say(msg)


# --------------------------------------------------------------------------
# the result


@dataclass(frozen=True, slots=True)
class ImportedImage:
    dir: Path  # <dataDir>/rigs/images/sha256-<hex>
    disk: Path  # disk.qcow2 (0444): each rig boots a thin overlay of it
    kernel: Path  # vmlinux (PVH ELF)
    initrd: Path  # initrd.img
    manifest: ImageManifest  # as stored in rigd-image.json
    sha256: str  # the digest the operator pinned (of the manifest or the bare qcow2)
    already_present: bool  # True when an earlier import of the same digest was found

    @property
    def guest_protocol(self) -> int:
        return self.manifest.guest_protocol


@dataclass(frozen=True, slots=True)
class BootChoice:
    """What computer rigs boot, and from what it was chosen."""

    imported: list[ImportedImage]  # every complete import, by digest
    boots: ImportedImage | None  # the one the next computer rig boots, when it is imported already
    #: A desktop build in the cache that is not imported yet (its manifest and sha256): when there
    #: is one, *it* is what the next rig boots — it imports it first — so ``boots`` is None.
    pending: tuple[Path, str] | None


def images_dir(data_dir: Path) -> Path:
    return data_dir / "rigs" / "images"


def normalise_sha256(value: str) -> str:
    """``"sha256:<hex>"`` or ``"<hex>"`` → lower-case hex; else a field error."""
    v = value.strip().lower().removeprefix("sha256:")
    if not HEX64.match(v):
        raise FieldError("sha256", f"must be 64 hex digits (optionally prefixed 'sha256:'), got {value!r}")
    return v


def load_imported(dir_: Path, sha256: str, *, already_present: bool = True) -> ImportedImage:
    manifest = parse_manifest((dir_ / MANIFEST_NAME).read_bytes(), str(dir_ / MANIFEST_NAME))
    return ImportedImage(
        dir=dir_,
        disk=dir_ / DISK_NAME,
        kernel=dir_ / KERNEL_NAME,
        initrd=dir_ / INITRD_NAME,
        manifest=manifest,
        sha256=sha256,
        already_present=already_present,
    )


def list_imported(data_dir: Path) -> list[ImportedImage]:
    """Every complete import in the data directory (unreadable ones are skipped)."""
    out: list[ImportedImage] = []
    base = images_dir(data_dir)
    if not base.is_dir():
        return out
    for d in sorted(base.glob("sha256-*")):
        with contextlib.suppress(RigdError, OSError):
            out.append(load_imported(d, d.name.removeprefix("sha256-")))
    return out


# --------------------------------------------------------------------------
# fetching


class _Source:
    """Where bytes come from: a local directory or a base URL."""

    def __init__(self, source: str) -> None:
        parsed = urllib.parse.urlsplit(source)
        self.url: str | None = None
        self.path: Path | None = None
        if parsed.scheme in ("http", "https"):
            if not parsed.netloc:
                raise FieldError("source", f"URL {source!r} has no host")
            self.url = source
        elif parsed.scheme == "file":
            if parsed.netloc not in ("", "localhost"):
                raise FieldError("source", f"file URL {source!r} names a host")
            self.path = Path(urllib.parse.unquote(parsed.path))
        elif parsed.scheme == "":
            self.path = Path(source).expanduser()
        else:
            raise FieldError("source", f"scheme {parsed.scheme!r} is not supported (path, file://, http(s)://)")
        if self.path is not None and not self.path.is_file():
            raise FieldError("source", f"{self.path} is not a file")

    def describe(self) -> str:
        return self.url if self.url is not None else str(self.path)

    def sibling(self, name: str) -> _Source:
        """The file ``name`` beside this one (``name`` is a checked plain name)."""
        if not PLAIN_NAME.match(name):
            raise RigdError(f"refusing file name {name!r}: not a plain file name", file=name)
        if self.url is not None:
            return _Source(urllib.parse.urljoin(self.url, urllib.parse.quote(name)))
        assert self.path is not None
        return _Source(str(self.path.parent / name))

    @contextlib.contextmanager
    def open(self) -> Iterator[tuple[BinaryIO, int | None]]:
        """The bytes, and how many there will be when the source says (a file's size, Content-Length)."""
        if self.path is not None:
            with self.path.open("rb") as f:
                yield f, os.fstat(f.fileno()).st_size
            return
        assert self.url is not None
        req = urllib.request.Request(self.url, headers={"User-Agent": "rigd-image-import"})  # noqa: S310 - scheme checked: http(s) only
        try:
            resp = urllib.request.urlopen(req, timeout=HTTP_TIMEOUT_S)  # noqa: S310 - scheme checked above
        except urllib.error.HTTPError as exc:
            exc.close()
            raise RigdError(
                f"cannot download {self.url}: HTTP {exc.code} {exc.reason}", url=self.url
            ) from exc
        except (urllib.error.URLError, OSError) as exc:
            raise RigdError(f"cannot download {self.url}: {exc}", url=self.url) from exc
        with resp:
            length = resp.headers.get("Content-Length", "")
            yield resp, int(length) if length.isdigit() and len(length) < 20 else None


def check_source(source: str) -> str:
    """Check that ``source`` names something :func:`import_image` can read (a scheme it
    supports, an existing file); returns it as an import describes it. Raises
    :class:`FieldError` on ``source``. Touches the file system, never the network."""
    return _Source(source).describe()


def _fetch(src: _Source, dest: Path, limit: int, meter: _Meter) -> tuple[str, int]:
    """Copy ``src`` to the new file ``dest`` (never following a link); return (sha256, size)."""
    h = hashlib.sha256()
    size = 0
    fd = os.open(dest, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC, 0o600)
    last = time.monotonic()
    try:
        with os.fdopen(fd, "wb") as out, src.open() as (f, length):
            meter.fetching(src.describe(), length)
            while chunk := f.read(CHUNK_BYTES):
                size += len(chunk)
                if size > limit:
                    raise RigdError(
                        f"{src.describe()} is larger than the {limit} bytes allowed", source=src.describe()
                    )
                h.update(chunk)
                out.write(chunk)
                meter.add(len(chunk))
                if time.monotonic() - last > 5:
                    meter.say(f"fetching {src.describe()}: {size >> 20} MiB")
                    last = time.monotonic()
    except OSError as exc:
        raise RigdError(f"cannot read {src.describe()}: {exc}", source=src.describe()) from exc
    return h.hexdigest(), size


def _mismatch(what: str, src: _Source, expected: str, actual: str) -> RigdError:
    return RigdError(
        f"sha256 mismatch for {what} {src.describe()}: expected {expected}, got {actual}; "
        "nothing was imported",
        source=src.describe(),
        expected=expected,
        actual=actual,
    )


# --------------------------------------------------------------------------
# checks on the disk and reading a bare qcow2


def _qemu_img() -> str:
    exe = shutil.which("qemu-img")
    if exe is None:
        raise RigdError("`qemu-img` is not installed (Debian package qemu-utils)")
    return exe


def check_qcow2(path: Path) -> dict[str, Any]:
    """Refuse anything but a standalone qcow2 (no backing file, no data file)."""
    with path.open("rb") as f:
        if f.read(4) != _QCOW2_MAGIC:
            raise RigdError(f"{path.name} is not a qcow2 image", file=path.name)
    res = subprocess.run(
        [_qemu_img(), "info", "--output=json", "-f", "qcow2", str(path)],
        capture_output=True,
        text=True,
        check=False,
    )
    if res.returncode != 0:
        raise RigdError(f"qemu-img cannot read the disk: {res.stderr.strip()[-1000:]}")
    info: dict[str, Any] = json.loads(res.stdout)
    if info.get("format") != "qcow2":
        raise RigdError(f"the disk is {info.get('format')!r}, not qcow2")
    if "backing-filename" in info or "full-backing-filename" in info:
        raise RigdError(
            "the disk names a backing file; an imported image must be standalone "
            f"(backing file {info.get('backing-filename')!r})"
        )
    data_file = (info.get("format-specific") or {}).get("data", {}).get("data-file")
    if data_file:
        raise RigdError(f"the disk names an external data file {data_file!r}; refusing")
    return info


def _debugfs() -> str:
    for cand in (shutil.which("debugfs"), "/usr/sbin/debugfs", "/sbin/debugfs"):
        if cand and Path(cand).is_file():
            return cand
    raise RigdError("`debugfs` is not installed (Debian package e2fsprogs)")


def read_from_ext4(image: Path, guest_path: str, dest: Path) -> None:
    """Copy one regular file out of a raw ext4 image (no mount) to the new file ``dest``."""
    res = subprocess.run(
        [_debugfs(), "-R", f"stat {guest_path}", str(image)], capture_output=True, text=True, check=False
    )
    if res.returncode != 0 or "Type: regular" not in res.stdout:
        raise RigdError(f"the image has no regular file {guest_path}", path=guest_path)
    res = subprocess.run(
        [_debugfs(), "-R", f"dump {guest_path} {dest}", str(image)],
        capture_output=True,
        text=True,
        check=False,
    )
    if res.returncode != 0 or not dest.is_file() or dest.is_symlink():
        raise RigdError(f"cannot copy {guest_path} out of the image: {res.stderr.strip()[-500:]}")


def _unpack_bare_qcow2(disk: Path, stage: Path, meter: _Meter) -> ImageMarker:
    """Copy the marker, kernel and initramfs out of a bare qcow2 into ``stage``."""
    raw = stage / ".raw"
    meter.step("unpacking: reading the image's boot files (qemu-img convert to a temporary raw file)")
    res = subprocess.run(
        [_qemu_img(), "convert", "-f", "qcow2", "-O", "raw", str(disk), str(raw)],
        capture_output=True,
        text=True,
        check=False,
    )
    if res.returncode != 0:
        raise RigdError(f"qemu-img convert failed: {res.stderr.strip()[-1000:]}")
    try:
        meter.step("unpacking: copying the kernel and initramfs out of the image")
        read_from_ext4(raw, MARKER_PATH, stage / ".marker")
        marker = parse_marker((stage / ".marker").read_bytes())
        read_from_ext4(raw, marker.kernel_path, stage / ".kernel")
        read_from_ext4(raw, marker.initrd_path, stage / INITRD_NAME)
    finally:
        raw.unlink(missing_ok=True)
    elf, _ = extract_vmlinux((stage / ".kernel").read_bytes())
    (stage / KERNEL_NAME).write_bytes(elf)
    for name in (".kernel", ".marker"):
        (stage / name).unlink()
    return marker


# --------------------------------------------------------------------------
# the import


def _images_dir_checked(data_dir: Path) -> Path:
    base = images_dir(data_dir)
    for p in (data_dir / "rigs", base):
        if p.is_symlink():
            raise RigdError(f"{p} is a symlink; refusing to import through it", path=str(p))
    base.mkdir(parents=True, exist_ok=True)
    with contextlib.suppress(OSError):
        (data_dir / "rigs").chmod(0o711)  # rig uids traverse, never list
    base.chmod(0o711)
    return base


@contextlib.contextmanager
def _lock(base: Path) -> Iterator[None]:
    with (base / ".lock").open("a") as f:
        fcntl.flock(f, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(f, fcntl.LOCK_UN)


def import_image(
    source: str | Path,
    sha256: str,
    data_dir: Path,
    *,
    progress: Progress | None = None,
    on_progress: OnProgress | None = None,
    check: Check | None = None,
) -> ImportedImage:
    """Import a computer image from ``source`` if its sha256 is ``sha256``.

    ``source`` is a path, a ``file://`` or an ``http(s)://`` URL of either a
    ``rigd.image/v1`` manifest or a bare qcow2 (see the module docstring).
    ``sha256`` is ``"<hex>"`` or ``"sha256:<hex>"`` of that file. Returns the
    imported image (``already_present`` when the same digest was imported
    before; nothing is fetched then). Raises :class:`RigdError` — for a
    digest mismatch one that names the expected and the actual digest — and
    leaves nothing behind in that case. Synchronous and slow (it copies
    gigabytes): the server calls it from a worker thread.

    ``progress`` gets the steps as text (every 5 s also the MiB so far);
    ``on_progress`` gets an :class:`ImportProgress` at every step and every
    chunk read. ``check`` is called between chunks and steps; an exception
    from it stops the import and is re-raised, with the staging directory
    removed — that is how an import is cancelled.
    """
    meter = _Meter(progress or (lambda _msg: None), on_progress, check)
    want = normalise_sha256(sha256)
    src = _Source(str(source))
    base = _images_dir_checked(data_dir)
    final = base / f"sha256-{want}"
    if not final.is_symlink() and (final / MANIFEST_NAME).is_file():
        meter.step(f"already imported: {final}")
        return load_imported(final, want)
    stage = Path(tempfile.mkdtemp(prefix=".import-", dir=base))
    try:
        first = stage / ".source"
        got, size = _fetch(src, first, MAX_DISK_BYTES, meter)
        if got != want:
            raise _mismatch("the image", src, want, got)
        with first.open("rb") as f:
            head = f.read(4)
        if head == _QCOW2_MAGIC:
            meter.step("checking the disk (qemu-img info)")
            check_qcow2(first)
            os.rename(first, stage / DISK_NAME)
            marker = _unpack_bare_qcow2(stage / DISK_NAME, stage, meter)
            manifest = ImageManifest(
                surface=marker.surface,
                guest_protocol=marker.guest_protocol,
                kernel_release=marker.kernel_release,
                cmdline=marker.cmdline,
                width=marker.width,
                height=marker.height,
                disk=FileRef(DISK_NAME, want, size),
                kernel=_ref(stage / KERNEL_NAME),
                initrd=_ref(stage / INITRD_NAME),
            )
        else:
            if size > MAX_MANIFEST_BYTES:
                raise RigdError(f"{src.describe()} is neither a qcow2 image nor a rigd image manifest")
            text = first.read_bytes()
            if not text.lstrip().startswith(b"{"):
                raise RigdError(f"{src.describe()} is neither a qcow2 image nor a rigd image manifest")
            theirs = parse_manifest(text, src.describe())
            parts = ((theirs.disk, DISK_NAME), (theirs.kernel, KERNEL_NAME), (theirs.initrd, INITRD_NAME))
            meter.expect(sum(ref.size for ref, _name in parts))
            for ref, name in parts:
                part = src.sibling(ref.file)
                got, n = _fetch(part, stage / name, ref.size, meter)
                if got != ref.sha256:
                    raise _mismatch(f"{ref.file} (pinned by the manifest)", part, ref.sha256, got)
                if n != ref.size:
                    raise RigdError(f"{part.describe()}: size {n}, the manifest says {ref.size}")
            meter.step("checking the disk (qemu-img info)")
            check_qcow2(stage / DISK_NAME)
            manifest = ImageManifest(
                surface=theirs.surface,
                guest_protocol=theirs.guest_protocol,
                kernel_release=theirs.kernel_release,
                cmdline=theirs.cmdline,
                width=theirs.width,
                height=theirs.height,
                disk=FileRef(DISK_NAME, theirs.disk.sha256, theirs.disk.size),
                kernel=FileRef(KERNEL_NAME, theirs.kernel.sha256, theirs.kernel.size),
                initrd=FileRef(INITRD_NAME, theirs.initrd.sha256, theirs.initrd.size),
            )
            first.unlink()
        meter.step("storing the image")
        (stage / MANIFEST_NAME).write_text(manifest.dumps())
        for name in (DISK_NAME, KERNEL_NAME, INITRD_NAME, MANIFEST_NAME):
            (stage / name).chmod(READ_ONLY_MODE)
        stage.chmod(0o711)  # rig uids open the files by name, never list
        with _lock(base):
            # A concurrent import of the same digest may have finished first.
            if not final.is_symlink() and (final / MANIFEST_NAME).is_file():
                remove_tree(stage)
                return load_imported(final, want)
            if final.exists() or final.is_symlink():
                remove_tree(final)  # an incomplete leftover: no manifest inside
            os.rename(stage, final)
    except BaseException:
        remove_tree(stage)
        raise
    meter.say(f"imported {final} (guest protocol {manifest.guest_protocol})")
    return ImportedImage(
        dir=final,
        disk=final / DISK_NAME,
        kernel=final / KERNEL_NAME,
        initrd=final / INITRD_NAME,
        manifest=manifest,
        sha256=want,
        already_present=False,
    )


def _ref(path: Path) -> FileRef:
    h = hashlib.sha256()
    with path.open("rb") as f:
        while chunk := f.read(1 << 20):
            h.update(chunk)
    return FileRef(path.name, h.hexdigest(), path.stat().st_size)


__all__ = [
    "FORMAT",
    "MANIFEST_NAME",
    "MARKER_FORMAT",
    "MARKER_PATH",
    "BootChoice",
    "FileRef",
    "ImageManifest",
    "ImageMarker",
    "ImportProgress",
    "ImportedImage",
    "check_qcow2",
    "check_source",
    "images_dir",
    "import_image",
    "list_imported",
    "load_imported",
    "normalise_sha256",
    "parse_manifest",
    "parse_marker",
]
