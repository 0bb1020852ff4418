"""Volumes (issue 29): ext4 disks of a workspace that outlive the rigs they are attached to
(``volume.create``, ``volume.list``, ``volume.rm``, ``rig.open {volumes}``).

A volume is ``<dataDir>/volumes/<workspace>/<name>.img`` — a sparse raw file with an ext4
filesystem made by the host when it is created (``mkfs.ext4`` on a fresh file: nothing a
guest wrote yet) — and ``<name>.json`` (its size, who made it, when). The directory is
root's only (0700): QEMU never opens a volume by path; the host opens it and passes the fd
(``-add-fd``), so a rig's uid reaches only the volumes attached to it. Attached, it is a
virtio-blk disk the guest agent mounts at the asked path (busybox ``mount`` of the tools
disk, so any image can); the host checks its filesystem before (``e2fsck`` as the rig's own
uid, on that fd: a hostile guest's filesystem is parsed by no privileged process). One
writer at a time, or any number of readers (ext4 has no shared writers). Synchronous: call
from a worker thread.
"""

from __future__ import annotations

import json
import logging
import os
import secrets
import subprocess
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from rigd.errors import Conflict, FieldError, NotFound, RigdError
from rigd.rigs.params import snapshot_name_problem
from rigd.rigs.snapshots import workspace_dir

log = logging.getLogger("rigd.volumes")

IMAGE_SUFFIX = ".img"
META_SUFFIX = ".json"
#: The smallest ext4 worth making (its journal alone is 4 MB at this size).
MIN_SIZE_MB = 16


@dataclass(frozen=True, slots=True)
class Volume:
    name: str
    workspace: str
    size_mb: int
    image: Path
    created_at: str
    created_by: str

    def to_json(self, attached_to: list[str]) -> dict[str, Any]:
        return {"name": self.name, "workspace": self.workspace, "sizeMb": self.size_mb,
                "createdAt": self.created_at, "attachedTo": attached_to}


class VolumeShelf:
    def __init__(self, root: Path, *, mkfs: str = "mkfs.ext4") -> None:
        self.root = root
        self.mkfs = mkfs
        root.mkdir(mode=0o700, parents=True, exist_ok=True)

    def _ws_dir(self, workspace: str) -> Path:
        return workspace_dir(self.root, workspace)

    def _paths(self, workspace: str, name: str, field: str = "name") -> tuple[Path, Path]:
        problem = snapshot_name_problem(name)
        if problem is not None:
            raise FieldError(field, problem)
        d = self._ws_dir(workspace)
        return d / f"{name}{IMAGE_SUFFIX}", d / f"{name}{META_SUFFIX}"

    def get(self, workspace: str, name: str, field: str = "name") -> Volume:
        image, meta_path = self._paths(workspace, name, field)
        try:
            meta = json.loads(meta_path.read_text())
        except FileNotFoundError:
            raise NotFound(f"no volume {name!r} in this workspace (volume.list lists them)",
                           field=field) from None
        except (OSError, ValueError) as exc:
            raise Conflict(f"volume {name!r}: its record is damaged ({exc})", field=field) from exc
        if not image.is_file():
            raise Conflict(f"volume {name!r}: its disk is missing", field=field)
        return Volume(name, workspace, int(meta["sizeMb"]), image, str(meta["createdAt"]),
                      str(meta["createdBy"]))

    def list(self, workspace: str) -> list[Volume]:
        d = self._ws_dir(workspace)
        if not d.is_dir():
            return []
        out = []
        for meta in sorted(d.glob(f"*{META_SUFFIX}")):
            try:
                out.append(self.get(workspace, meta.name[: -len(META_SUFFIX)]))
            except RigdError as exc:
                log.warning("unreadable volume", extra={"path": str(meta), "error": exc.message[:200]})
        return out

    def size_used_mb(self, workspace: str) -> int:
        return sum(v.size_mb for v in self.list(workspace))

    def create(self, workspace: str, name: str, size_mb: int, *, created_at: str, created_by: str) -> Volume:
        """A new volume with an empty ext4 filesystem; it exists whole or not at all."""
        image, meta_path = self._paths(workspace, name)
        image.parent.mkdir(mode=0o700, exist_ok=True)
        if meta_path.exists() or image.exists():
            raise Conflict(f"a volume named {name!r} exists in this workspace", field="name")
        tmp = image.with_name(f".tmp-{name}-{secrets.token_hex(4)}")
        try:
            fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_CLOEXEC, 0o600)
            try:
                os.ftruncate(fd, size_mb << 20)  # sparse: the host pays for what the guest writes
            finally:
                os.close(fd)
            result = subprocess.run([self.mkfs, "-q", "-F", "-m", "0", "-L", name[:16], str(tmp)],
                                    capture_output=True, timeout=120, check=False)
            if result.returncode != 0:
                raise RigdError(f"making the filesystem failed: "
                                f"{result.stderr.decode(errors='replace').strip()[-300:]}")
            meta_path.write_text(json.dumps({"name": name, "sizeMb": size_mb, "createdAt": created_at,
                                             "createdBy": created_by}))
            os.rename(tmp, image)
        except BaseException:
            tmp.unlink(missing_ok=True)
            meta_path.unlink(missing_ok=True)
            raise
        return self.get(workspace, name)

    def remove(self, workspace: str, name: str) -> None:
        volume = self.get(workspace, name)
        _image, meta_path = self._paths(workspace, name)
        meta_path.unlink()
        volume.image.unlink(missing_ok=True)

    def sweep(self) -> None:
        """At start: nothing is attached, so every volume is root's again; half-made ones go."""
        if not self.root.is_dir():
            return
        for ws in self.root.iterdir():
            if not ws.is_dir():
                continue
            for child in ws.iterdir():
                try:
                    if child.name.startswith(".tmp-"):
                        child.unlink()
                    elif child.suffix == IMAGE_SUFFIX and os.geteuid() == 0:
                        os.chown(child, 0, 0)
                except OSError as exc:
                    log.warning("volume sweep", extra={"path": str(child), "error": str(exc)[:200]})
