"""The store of pulled images: an OCI image layout under the data directory
(``blobs/sha256/<hex>`` verified and read-only, ``blobs/sha256/.partial/<hex>`` a fetch in
progress locked by its fetcher, ``index.json`` one entry per pulled reference with its pinned
digest). :class:`BlobStore` fetches a blob through a :class:`rigd.images.registry.RegistryClient`
only when absent, resumes a partial one with ``Range``, and renames it into place only
after its size and sha256 match the descriptor (see :mod:`rigd.images.registry`).
"""

from __future__ import annotations

import contextlib
import fcntl
import hashlib
import json
import logging
import os
import re
import time
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import trio

from rigd.errors import FieldError, RigdError
from rigd.images import oci
from rigd.images.registry import (
    INDEX_ANNOTATION,
    MAX_DOCUMENT_BYTES,
    NOTIFY_BYTES,
    PULLED_ANNOTATION,
    READ_CHUNK,
    REF_ANNOTATION,
    OnProgress,
    Progress,
    Reference,
    RegistryClient,
    RegistryError,
    error_text,
    parse_reference,
)

log = logging.getLogger("rigd.images.registry")


class BlobStore:
    """An OCI image layout of pulled images: ``blobs/sha256/<hex>`` (verified, read-only),
    ``blobs/sha256/.partial/<hex>`` (a fetch in progress, locked by its fetcher) and
    ``index.json`` (one entry per pulled reference, with its pinned digest)."""

    def __init__(self, root: Path) -> None:
        self.root = root
        self.blobs = root / "blobs" / "sha256"
        self.partial = self.blobs / ".partial"
        self.partial.mkdir(parents=True, exist_ok=True)
        layout = root / "oci-layout"
        if not layout.exists():
            layout.write_text('{"imageLayoutVersion":"1.0.0"}')
        self._locks: dict[str, trio.Lock] = {}

    def path(self, digest: str) -> Path:
        return oci.blob_path(self.root, digest)

    def has(self, desc: oci.Descriptor) -> bool:
        p = self.path(desc.digest)
        return p.is_file() and not p.is_symlink() and p.stat().st_size == desc.size

    async def put_document(self, body: bytes, digest: str) -> None:
        """A manifest or index already checked against ``digest``: stored as its blob."""
        if "sha256:" + hashlib.sha256(body).hexdigest() != digest:
            raise RegistryError(f"document does not hash to {digest}")
        await trio.to_thread.run_sync(self._write_whole, body, digest)

    def _write_whole(self, body: bytes, digest: str) -> None:
        final = self.path(digest)
        if final.is_file() and final.stat().st_size == len(body):
            return
        tmp = self.partial / f"{oci.parse_digest(digest)}.doc.{os.getpid()}"
        tmp.write_bytes(body)
        os.chmod(tmp, 0o444)
        os.replace(tmp, final)

    async def fetch(self, client: RegistryClient, ref: Reference, desc: oci.Descriptor,
                    progress: Progress, notify: OnProgress) -> bool:
        """Make ``desc`` present and verified; True if bytes were fetched for it."""
        hexd = oci.parse_digest(desc.digest)
        lock = self._locks.setdefault(hexd, trio.Lock())
        async with lock:
            if self.has(desc):
                progress.done_bytes += desc.size
                progress.reused_bytes += desc.size
                notify(progress)
                return False
            part = self.partial / hexd
            fd = await trio.to_thread.run_sync(_open_locked, part)
            try:
                return await self._fetch_locked(client, ref, desc, fd, part, progress, notify)
            finally:
                os.close(fd)

    async def _fetch_locked(self, client: RegistryClient, ref: Reference, desc: oci.Descriptor, fd: int,
                            part: Path, progress: Progress, notify: OnProgress) -> bool:
        if self.has(desc):  # another process finished it while we waited for the lock
            progress.done_bytes += desc.size
            progress.reused_bytes += desc.size
            return False
        have = os.fstat(fd).st_size
        if have > desc.size:
            os.ftruncate(fd, 0)
            have = 0
        hasher = await trio.to_thread.run_sync(_hash_prefix, fd, have)
        extra = [("Range", f"bytes={have}-")] if have else []
        async with client.get(ref, f"blobs/{desc.digest}", "*/*", follow=True, extra=extra) as resp:
            if resp.status == 206 and have:
                start = _content_range_start(resp.header("content-range"))
                if start != have:
                    raise RegistryError(f"{ref.name}: a resumed {desc.digest[:19]} came back from byte "
                                        f"{start}, not {have}")
            elif resp.status == 200:
                if have:  # the registry sends the whole blob: start over
                    os.ftruncate(fd, 0)
                    hasher = hashlib.sha256()
                    have = 0
            else:
                body = await resp.read(MAX_DOCUMENT_BYTES)
                raise RegistryError(f"{ref.name}: blob {desc.digest[:19]}…: HTTP {resp.status}"
                                    f"{': ' + error_text(body) if body else ''}", status=resp.status)
            progress.done_bytes += have
            progress.reused_bytes += have
            os.lseek(fd, have, os.SEEK_SET)
            size = have
            last, last_size = 0.0, size
            while (data := await resp.next_chunk()) is not None:
                size += len(data)
                if size > desc.size:
                    await trio.to_thread.run_sync(_discard, fd, part)
                    raise RegistryError(f"{ref.name}: blob {desc.digest} is larger than its {desc.size} "
                                        "bytes; refused and deleted")
                hasher.update(data)
                await trio.to_thread.run_sync(_write_all, fd, data)
                progress.done_bytes += len(data)
                progress.fetched_bytes += len(data)
                now = time.monotonic()
                if now - last > 0.25 or size - last_size >= NOTIFY_BYTES:
                    last, last_size = now, size
                    notify(progress)
        if size != desc.size or "sha256:" + hasher.hexdigest() != desc.digest:
            await trio.to_thread.run_sync(_discard, fd, part)
            raise RegistryError(f"{ref.name}: blob {desc.digest} does not match its descriptor ({size} bytes "
                                f"hashing to sha256:{hasher.hexdigest()}); refused and deleted",
                                digest=desc.digest)
        await trio.to_thread.run_sync(_seal, fd, part, self.path(desc.digest))
        notify(progress)
        return True

    # -- the index of pulled references ---------------------------------------------------------

    def _index(self) -> dict[str, Any]:
        try:
            doc = json.loads((self.root / "index.json").read_text())
        except FileNotFoundError:
            return {"schemaVersion": 2, "mediaType": oci.MT_INDEX, "manifests": []}
        except (OSError, json.JSONDecodeError) as exc:
            raise RigdError(f"{self.root / 'index.json'} is unreadable: {exc}") from exc
        if not isinstance(doc, dict) or not isinstance(doc.get("manifests"), list):
            raise RigdError(f"{self.root / 'index.json'} is not an image index")
        return doc

    def _write_index(self, doc: dict[str, Any]) -> None:
        tmp = self.root / f".index.json.{os.getpid()}"
        tmp.write_text(json.dumps(doc, indent=1, sort_keys=True) + "\n")
        with open(tmp, "rb") as f:
            os.fsync(f.fileno())
        os.replace(tmp, self.root / "index.json")

    def record(self, ref: Reference, digest: str, index_digest: str | None) -> None:
        """Name ``digest`` as ``ref`` in ``index.json`` (one entry per reference name and tag)."""
        with _store_lock(self.root):
            doc = self._index()
            name = _ref_key(ref)
            kept = [m for m in doc["manifests"] if _recorded_as(m) != name]
            annotations = {REF_ANNOTATION: name, "io.rigd.image.pinned": str(ref),
                           PULLED_ANNOTATION: datetime.now(UTC).strftime("%Y-%m-%dT%H:%M:%SZ")}
            if index_digest is not None:
                annotations[INDEX_ANNOTATION] = index_digest
            size = self.path(digest).stat().st_size
            kept.append({"mediaType": oci.MT_MANIFEST, "digest": digest, "size": size,
                         "annotations": annotations})
            doc["manifests"] = kept
            self._write_index(doc)

    def images(self) -> list[dict[str, Any]]:
        """The pulled references: name, pinned reference, digest, pulled-at, layer bytes."""
        out = []
        for m in self._index()["manifests"]:
            if not isinstance(m, dict):
                continue
            notes = m.get("annotations") or {}
            digest = m.get("digest")
            size = 0
            with contextlib.suppress(RigdError, OSError):
                manifest = oci.load_manifest(self.root, str(digest))
                size = sum(layer.size for layer in manifest.layers)
            out.append({"reference": notes.get(REF_ANNOTATION), "pinned": notes.get("io.rigd.image.pinned"),
                        "digest": digest, "indexDigest": notes.get(INDEX_ANNOTATION),
                        "pulled": notes.get(PULLED_ANNOTATION), "layerBytes": size})
        return out

    def find(self, value: str) -> dict[str, Any] | None:
        """A pulled image by its reference (as parsed) or its digest."""
        for image in self.images():
            if value in (image["digest"], image["reference"], image["pinned"]):
                return image
        try:
            key = _ref_key(parse_reference(value))
        except FieldError:
            return None
        return next((i for i in self.images() if i["reference"] == key), None)

    def remove(self, value: str) -> list[str]:
        """Forget a pulled reference and delete the blobs no other pulled image uses."""
        with _store_lock(self.root):
            image = self.find(value)
            if image is None:
                raise RigdError(f"no pulled image {value!r}", field="ref")
            doc = self._index()
            doc["manifests"] = [m for m in doc["manifests"] if _recorded_as(m) != image["reference"]]
            self._write_index(doc)
            return self._collect(doc)

    def _collect(self, doc: dict[str, Any]) -> list[str]:
        keep: set[str] = set()
        for m in doc["manifests"]:
            digest = m.get("digest") if isinstance(m, dict) else None
            with contextlib.suppress(RigdError, OSError):
                manifest = oci.load_manifest(self.root, str(digest))
                keep |= {manifest.digest, manifest.config.digest}
                keep |= {layer.digest for layer in manifest.layers}
                index = (m.get("annotations") or {}).get(INDEX_ANNOTATION)
                if index:
                    keep.add(index)
        removed = []
        for p in self.blobs.iterdir():
            if p.is_file() and f"sha256:{p.name}" not in keep:
                p.unlink()
                removed.append(f"sha256:{p.name}")
        return removed


def _recorded_as(entry: object) -> str | None:
    """The reference an ``index.json`` entry was pulled as."""
    notes = entry.get("annotations") if isinstance(entry, dict) else None
    name = notes.get(REF_ANNOTATION) if isinstance(notes, dict) else None
    return name if isinstance(name, str) else None


def _ref_key(ref: Reference) -> str:
    """What a pull is recorded under: the name with its tag (or its digest when it has no tag)."""
    return f"{ref.name}:{ref.tag}" if ref.tag is not None else f"{ref.name}@{ref.digest}"


@contextlib.contextmanager
def _store_lock(root: Path) -> Any:
    fd = os.open(root / ".lock", os.O_RDWR | os.O_CREAT, 0o600)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX)
        yield
    finally:
        os.close(fd)


def _open_locked(part: Path) -> int:
    """The partial file of a blob, opened and locked for this fetcher (waits for another)."""
    fd = os.open(part, os.O_RDWR | os.O_CREAT | os.O_NOFOLLOW, 0o600)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX)
    except OSError:
        os.close(fd)
        raise
    return fd


def _hash_prefix(fd: int, n: int) -> Any:
    h = hashlib.sha256()
    os.lseek(fd, 0, os.SEEK_SET)
    left = n
    while left:
        data = os.read(fd, min(READ_CHUNK, left))
        if not data:
            break
        h.update(data)
        left -= len(data)
    return h


def _write_all(fd: int, data: bytes) -> None:
    view = memoryview(data)
    while view:
        n = os.write(fd, view)
        view = view[n:]


def _discard(fd: int, part: Path) -> None:
    os.ftruncate(fd, 0)
    with contextlib.suppress(FileNotFoundError):
        part.unlink()


def _seal(fd: int, part: Path, final: Path) -> None:
    os.fsync(fd)
    os.fchmod(fd, 0o444)
    os.replace(part, final)


def _content_range_start(value: str | None) -> int | None:
    m = re.match(r"^bytes (\d+)-\d+/(?:\d+|\*)$", (value or "").strip())
    return int(m.group(1)) if m else None


__all__ = ["BlobStore"]
