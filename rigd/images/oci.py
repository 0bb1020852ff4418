"""OCI image layouts: write one (from a rootfs tarball), read and verify one.

Writing: the layout holds ``oci-layout``, ``index.json`` and
``blobs/sha256/<hex>`` for one gzip layer, a config and a manifest. The gzip
header carries no name and a zero mtime, and JSON is written with sorted keys
and no spaces, so the same tarball always yields the same manifest digest.

Reading treats the layout as untrusted: a digest must look like
``sha256:<64 hex>`` before it becomes a path, every blob's size and sha256 are
checked against its descriptor before use, and only known media types are
accepted.
"""

from __future__ import annotations

import gzip
import hashlib
import json
import os
import re
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from rigd.errors import RigdError

MT_MANIFEST = "application/vnd.oci.image.manifest.v1+json"
MT_INDEX = "application/vnd.oci.image.index.v1+json"
MT_CONFIG = "application/vnd.oci.image.config.v1+json"
MT_LAYER_GZIP = "application/vnd.oci.image.layer.v1.tar+gzip"
MT_LAYER_ZSTD = "application/vnd.oci.image.layer.v1.tar+zstd"
MT_LAYER_TAR = "application/vnd.oci.image.layer.v1.tar"
_DOCKER_MANIFEST = "application/vnd.docker.distribution.manifest.v2+json"
_DOCKER_LIST = "application/vnd.docker.distribution.manifest.list.v2+json"
_DOCKER_LAYER_GZIP = "application/vnd.docker.image.rootfs.diff.tar.gzip"
_DOCKER_CONFIG = "application/vnd.docker.container.image.v1+json"

#: Layer media type → compression ("gzip", "zstd" or "none").
LAYER_COMPRESSION = {
    MT_LAYER_GZIP: "gzip",
    _DOCKER_LAYER_GZIP: "gzip",
    MT_LAYER_ZSTD: "zstd",
    MT_LAYER_TAR: "none",
}

_DIGEST_RE = re.compile(r"^sha256:([0-9a-f]{64})$")
_MAX_JSON = 4 << 20  # manifests/configs/indexes are small; refuse to slurp a huge blob


def parse_digest(digest: object, *, field: str = "digest") -> str:
    """Return the hex of a ``sha256:<hex>`` digest or raise naming the field."""
    if not isinstance(digest, str) or not (m := _DIGEST_RE.match(digest)):
        raise RigdError(f"{field}: {digest!r} is not a sha256 digest", field=field)
    return m.group(1)


@dataclass(frozen=True, slots=True)
class Descriptor:
    media_type: str
    digest: str
    size: int

    @classmethod
    def from_json(cls, raw: object, field: str) -> Descriptor:
        if not isinstance(raw, dict):
            raise RigdError(f"{field}: must be an object", field=field)
        mt, digest, size = raw.get("mediaType"), raw.get("digest"), raw.get("size")
        if not isinstance(mt, str):
            raise RigdError(f"{field}.mediaType: missing", field=f"{field}.mediaType")
        parse_digest(digest, field=f"{field}.digest")
        if not isinstance(size, int) or isinstance(size, bool) or size < 0:
            raise RigdError(f"{field}.size: {size!r} is not a size", field=f"{field}.size")
        assert isinstance(digest, str)
        return cls(mt, digest, size)

    def to_json(self) -> dict[str, Any]:
        return {"mediaType": self.media_type, "digest": self.digest, "size": self.size}


@dataclass(frozen=True, slots=True)
class Manifest:
    digest: str
    config: Descriptor
    layers: tuple[Descriptor, ...]


def blob_path(layout: Path, digest: str) -> Path:
    return layout / "blobs" / "sha256" / parse_digest(digest)


def _canonical(doc: dict[str, Any]) -> bytes:
    return json.dumps(doc, sort_keys=True, separators=(",", ":")).encode()


def _put_blob(layout: Path, data: bytes) -> str:
    digest = "sha256:" + hashlib.sha256(data).hexdigest()
    p = blob_path(layout, digest)
    p.write_bytes(data)
    return digest


def write_layout(
    layout: Path,
    rootfs_tar: Path,
    *,
    epoch: int,
    config: dict[str, Any],
    annotations: dict[str, str] | None = None,
    gzip_level: int = 6,
) -> str:
    """Write a one-layer OCI layout from ``rootfs_tar``; return the manifest digest."""
    blobs = layout / "blobs" / "sha256"
    blobs.mkdir(parents=True, exist_ok=True)
    tmp_layer = blobs / ".layer.tmp"
    diff = hashlib.sha256()
    comp = hashlib.sha256()

    class _HashingWriter:
        def __init__(self, f: Any) -> None:
            self.f = f
            self.size = 0

        def write(self, b: bytes) -> int:
            comp.update(b)
            self.size += len(b)
            return int(self.f.write(b))

        def flush(self) -> None:
            self.f.flush()

    with tmp_layer.open("wb") as raw:
        hw = _HashingWriter(raw)
        # filename="" and mtime=0 keep the gzip header free of build-time facts.
        with (
            gzip.GzipFile(
                filename="",
                mode="wb",
                fileobj=hw,
                compresslevel=gzip_level,
                mtime=0,
            ) as gz,
            rootfs_tar.open("rb") as src,
        ):
            while chunk := src.read(1 << 20):
                diff.update(chunk)
                gz.write(chunk)
    layer = Descriptor(MT_LAYER_GZIP, "sha256:" + comp.hexdigest(), hw.size)
    os.replace(tmp_layer, blob_path(layout, layer.digest))

    created = datetime.fromtimestamp(epoch, UTC).strftime("%Y-%m-%dT%H:%M:%SZ")
    cfg = {
        "architecture": "amd64",
        "os": "linux",
        "created": created,
        "config": config,
        "rootfs": {"type": "layers", "diff_ids": ["sha256:" + diff.hexdigest()]},
        "history": [{"created": created, "created_by": "rigd images build (mmdebstrap)"}],
    }
    cfg_bytes = _canonical(cfg)
    cfg_desc = Descriptor(MT_CONFIG, _put_blob(layout, cfg_bytes), len(cfg_bytes))
    manifest: dict[str, Any] = {
        "schemaVersion": 2,
        "mediaType": MT_MANIFEST,
        "config": cfg_desc.to_json(),
        "layers": [layer.to_json()],
    }
    if annotations:
        manifest["annotations"] = annotations
    man_bytes = _canonical(manifest)
    man_digest = _put_blob(layout, man_bytes)
    index = {
        "schemaVersion": 2,
        "mediaType": MT_INDEX,
        "manifests": [
            {
                "mediaType": MT_MANIFEST,
                "digest": man_digest,
                "size": len(man_bytes),
                "annotations": {"org.opencontainers.image.ref.name": "latest"},
            }
        ],
    }
    (layout / "oci-layout").write_text('{"imageLayoutVersion":"1.0.0"}')
    (layout / "index.json").write_bytes(_canonical(index))
    return man_digest


def verify_blob(layout: Path, desc: Descriptor) -> Path:
    """Check a blob's size and sha256 against its descriptor; return its path."""
    path = blob_path(layout, desc.digest)
    try:
        st = path.lstat()
    except FileNotFoundError as exc:
        raise RigdError(f"image blob {desc.digest} is missing from {layout}", digest=desc.digest) from exc
    if not path.is_file() or path.is_symlink():
        raise RigdError(f"image blob {desc.digest} is not a regular file", digest=desc.digest)
    if st.st_size != desc.size:
        raise RigdError(
            f"image blob {desc.digest} is {st.st_size} bytes, its descriptor says {desc.size}",
            digest=desc.digest,
        )
    h = hashlib.sha256()
    with path.open("rb") as f:
        while chunk := f.read(1 << 20):
            h.update(chunk)
    if "sha256:" + h.hexdigest() != desc.digest:
        raise RigdError(
            f"image blob {desc.digest} is corrupt: its content hashes to sha256:{h.hexdigest()}",
            digest=desc.digest,
        )
    return path


def _read_json_blob(layout: Path, desc: Descriptor) -> dict[str, Any]:
    if desc.size > _MAX_JSON:
        raise RigdError(f"image blob {desc.digest} is too large for a manifest ({desc.size} B)")
    data = verify_blob(layout, desc).read_bytes()
    try:
        doc = json.loads(data)
    except (json.JSONDecodeError, UnicodeDecodeError) as exc:
        raise RigdError(f"image blob {desc.digest} is not JSON", digest=desc.digest) from exc
    if not isinstance(doc, dict):
        raise RigdError(f"image blob {desc.digest} is not a JSON object", digest=desc.digest)
    return doc


def load_manifest(layout: Path, digest: str, *, platform: str = "linux/amd64") -> Manifest:
    """Load and verify the manifest ``digest`` (an index is resolved to ``platform``)."""
    parse_digest(digest)
    path = blob_path(layout, digest)
    if not path.is_file():
        raise RigdError(f"manifest {digest} not found in {layout}", digest=digest)
    desc = Descriptor(MT_MANIFEST, digest, path.stat().st_size)
    doc = _read_json_blob(layout, desc)  # verifies sha256 == digest
    mt = doc.get("mediaType", MT_MANIFEST)
    if mt in (MT_INDEX, _DOCKER_LIST) or "manifests" in doc:
        os_, arch = platform.split("/", 1)
        for i, m in enumerate(doc.get("manifests") or []):
            p = m.get("platform") if isinstance(m, dict) else None
            if isinstance(p, dict) and p.get("os") == os_ and p.get("architecture") == arch:
                sub = Descriptor.from_json(m, f"manifests[{i}]")
                return load_manifest(layout, sub.digest, platform=platform)
        raise RigdError(f"image index {digest} has no {platform} manifest", digest=digest)
    if mt not in (MT_MANIFEST, _DOCKER_MANIFEST):
        raise RigdError(f"{digest}: unsupported manifest media type {mt!r}", digest=digest)
    config = Descriptor.from_json(doc.get("config"), "config")
    if config.media_type not in (MT_CONFIG, _DOCKER_CONFIG):
        raise RigdError(f"config: unsupported media type {config.media_type!r}")
    raw_layers = doc.get("layers")
    if not isinstance(raw_layers, list):
        raise RigdError("layers: must be a list", field="layers")
    layers = tuple(Descriptor.from_json(x, f"layers[{i}]") for i, x in enumerate(raw_layers))
    for i, layer in enumerate(layers):
        if layer.media_type not in LAYER_COMPRESSION:
            raise RigdError(
                f"layers[{i}]: unsupported media type {layer.media_type!r}", field=f"layers[{i}].mediaType"
            )
    return Manifest(digest, config, layers)


def load_config(layout: Path, manifest: Manifest) -> dict[str, Any]:
    return _read_json_blob(layout, manifest.config)
