"""The manifest of a computer-rig image (``rigd.image/v1``) and the marker inside one.

The desktop builder (:mod:`rigd.images.desktop`) writes both; the importer
(:mod:`rigd.images.importer`) reads them back. They live here, apart from
the importer, because they are part of what a desktop image *is*: the desktop
image's cache key names this module, not the importer, so a change to how
imports fetch or check files never rebuilds the image.
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass
from typing import Any

from rigd.errors import RigdError

FORMAT = "rigd.image/v1"
#: The marker inside an image (``/etc/rigd/image.json``), for bare-qcow2 imports.
MARKER_FORMAT = "rigd.image-marker/v1"
MARKER_PATH = "/etc/rigd/image.json"
MANIFEST_NAME = "rigd-image.json"

SURFACES = ("computer",)
MAX_DISK_BYTES = 256 << 30
MAX_BOOT_FILE_BYTES = 512 << 20
HEX64 = re.compile(r"^[0-9a-f]{64}$")
PLAIN_NAME = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._+-]{0,127}$")
_GUEST_PATH = re.compile(r"^/(?:[A-Za-z0-9._+-]+/)*[A-Za-z0-9._+-]+$")
_CMDLINE_ARG = re.compile(r"^[\x21-\x7e]{1,256}$")




@dataclass(frozen=True, slots=True)
class FileRef:
    file: str  # a plain file name beside the manifest
    sha256: str  # 64 lower-case hex digits
    size: int

    def to_json(self) -> dict[str, Any]:
        return {"file": self.file, "sha256": self.sha256, "size": self.size}


@dataclass(frozen=True, slots=True)
class ImageManifest:
    surface: str
    guest_protocol: int
    kernel_release: str
    cmdline: tuple[str, ...]
    width: int
    height: int
    disk: FileRef
    kernel: FileRef
    initrd: FileRef

    def to_json(self) -> dict[str, Any]:
        return {
            "format": FORMAT,
            "surface": self.surface,
            "guest_protocol": self.guest_protocol,
            "kernel_release": self.kernel_release,
            "cmdline": list(self.cmdline),
            "display": {"width": self.width, "height": self.height},
            "disk": self.disk.to_json(),
            "kernel": self.kernel.to_json(),
            "initrd": self.initrd.to_json(),
        }

    def dumps(self) -> str:
        return json.dumps(self.to_json(), indent=1, sort_keys=True) + "\n"


def _field(where: str, field: str, reason: str) -> RigdError:
    return RigdError(f"{where}: {field}: {reason}", path=where, field=field, reason=reason)


def _common_fields(raw: dict[str, Any], where: str) -> dict[str, Any]:
    surface = raw.get("surface")
    if surface not in SURFACES:
        raise _field(where, "surface", f"must be one of {', '.join(SURFACES)}, got {surface!r}")
    proto = raw.get("guest_protocol")
    if not isinstance(proto, int) or isinstance(proto, bool) or not 1 <= proto <= 1000:
        raise _field(where, "guest_protocol", f"must be a positive integer, got {proto!r}")
    release = raw.get("kernel_release")
    if not isinstance(release, str) or not PLAIN_NAME.match(release):
        raise _field(where, "kernel_release", f"invalid kernel release {release!r}")
    cmdline = raw.get("cmdline", [])
    if not isinstance(cmdline, list) or not all(
        isinstance(a, str) and _CMDLINE_ARG.match(a) for a in cmdline
    ):
        raise _field(where, "cmdline", "must be a list of printable arguments without spaces")
    display = raw.get("display")
    if not isinstance(display, dict):
        raise _field(where, "display", "must be an object with width and height")
    dims = []
    for k in ("width", "height"):
        v = display.get(k)
        if not isinstance(v, int) or isinstance(v, bool) or not 64 <= v <= 8192:
            raise _field(where, f"display.{k}", f"must be an integer 64..8192, got {v!r}")
        dims.append(v)
    return {
        "surface": surface,
        "guest_protocol": proto,
        "kernel_release": release,
        "cmdline": tuple(cmdline),
        "width": dims[0],
        "height": dims[1],
    }


def _load_json_object(text: str | bytes, where: str, fmt: str) -> dict[str, Any]:
    try:
        raw = json.loads(text)
    except (json.JSONDecodeError, UnicodeDecodeError) as exc:
        raise RigdError(f"{where}: not valid JSON: {exc}", path=where) from exc
    if not isinstance(raw, dict):
        raise RigdError(f"{where}: must be a JSON object", path=where)
    if raw.get("format") != fmt:
        raise _field(where, "format", f"must be {fmt!r}, got {raw.get('format')!r}")
    return raw


def parse_manifest(text: str | bytes, where: str = MANIFEST_NAME) -> ImageManifest:
    """Parse and validate a ``rigd.image/v1`` manifest; errors name the field."""
    raw = _load_json_object(text, where, FORMAT)
    common = _common_fields(raw, where)
    refs: dict[str, FileRef] = {}
    limits = {"disk": MAX_DISK_BYTES, "kernel": MAX_BOOT_FILE_BYTES, "initrd": MAX_BOOT_FILE_BYTES}
    for key, limit in limits.items():
        ref = raw.get(key)
        if not isinstance(ref, dict):
            raise _field(where, key, "must be an object with file, sha256 and size")
        name, sha, size = ref.get("file"), ref.get("sha256"), ref.get("size")
        if not isinstance(name, str) or not PLAIN_NAME.match(name) or name in (".", ".."):
            raise _field(where, f"{key}.file", f"must be a plain file name, got {name!r}")
        if not isinstance(sha, str) or not HEX64.match(sha):
            raise _field(where, f"{key}.sha256", f"must be 64 lower-case hex digits, got {sha!r}")
        if not isinstance(size, int) or isinstance(size, bool) or not 0 < size <= limit:
            raise _field(where, f"{key}.size", f"must be an integer 1..{limit}, got {size!r}")
        refs[key] = FileRef(name, sha, size)
    if len({r.file for r in refs.values()}) != 3:
        raise _field(where, "disk.file", "disk, kernel and initrd must be three different files")
    return ImageManifest(**common, disk=refs["disk"], kernel=refs["kernel"], initrd=refs["initrd"])


@dataclass(frozen=True, slots=True)
class ImageMarker:
    """``/etc/rigd/image.json`` inside an image: what a bare qcow2 says of itself."""

    surface: str
    guest_protocol: int
    kernel_release: str
    cmdline: tuple[str, ...]
    width: int
    height: int
    kernel_path: str  # absolute, inside the image (a bzImage or an ELF)
    initrd_path: str

    def to_json(self) -> dict[str, Any]:
        return {
            "format": MARKER_FORMAT,
            "surface": self.surface,
            "guest_protocol": self.guest_protocol,
            "kernel_release": self.kernel_release,
            "cmdline": list(self.cmdline),
            "display": {"width": self.width, "height": self.height},
            "kernel": self.kernel_path,
            "initrd": self.initrd_path,
        }


def parse_marker(text: str | bytes, where: str = MARKER_PATH) -> ImageMarker:
    raw = _load_json_object(text, where, MARKER_FORMAT)
    common = _common_fields(raw, where)
    paths = []
    for key in ("kernel", "initrd"):
        p = raw.get(key)
        if not isinstance(p, str) or not _GUEST_PATH.match(p) or ".." in p.split("/"):
            raise _field(where, key, f"must be an absolute normalised path in the image, got {p!r}")
        paths.append(p)
    return ImageMarker(**common, kernel_path=paths[0], initrd_path=paths[1])


__all__ = [
    "FORMAT",
    "HEX64",
    "MANIFEST_NAME",
    "MARKER_FORMAT",
    "MARKER_PATH",
    "MAX_BOOT_FILE_BYTES",
    "MAX_DISK_BYTES",
    "PLAIN_NAME",
    "SURFACES",
    "FileRef",
    "ImageManifest",
    "ImageMarker",
    "parse_manifest",
    "parse_marker",
]
