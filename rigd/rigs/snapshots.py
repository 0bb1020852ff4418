"""Named snapshots (issue 29): a rig's RAM and disk kept under its workspace, opened again
any number of times (``snapshot.create``, ``snapshot.list``, ``snapshot.rm``,
``rig.open {snapshot}``).

A snapshot is a frozen machine (:class:`rigd.backends.base.ForkImage`, the same pause as
``rig.fork``) moved into ``<dataDir>/snapshots/<workspace>/<name>/`` (root's only):
``memory.zst``, ``disk.qcow2`` — rebased by the backend onto the image at the bottom of
its chain, so a pack's warm-start snapshot being pruned never breaks it — and
``snapshot.json``: the machine's spec, the base image's identity, each file's size and
sha256, who took it from which rig. It is written under a temporary name and renamed into
place, so it exists whole or not at all, and it survives restarts (the directory is the
record). Opening one checks every file against its sha256 and the base image against its
identity first: a damaged snapshot fails its open saying which file, never boots anything
else. Synchronous: call from a worker thread.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import logging
import os
import re
import secrets
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from netgate.cleanup import remove_tree
from rigd.backends.base import ForkImage, MachineSpec
from rigd.backends.snapshot import DISK_FILE, MEMORY_FILE, META_FILE, file_identity
from rigd.errors import Conflict, FieldError, NotFound
from rigd.model import Accel, Surface
from rigd.rigs.params import snapshot_name_problem

log = logging.getLogger("rigd.snapshots.named")

#: Bumped when what a named snapshot holds changes (an older one is refused, saying so).
FORMAT = 1


def spec_json(spec: MachineSpec) -> dict[str, Any]:
    """What of a machine's spec a snapshot keeps: what its QEMU command line is made of."""
    return {"surface": spec.surface.value, "memoryMb": spec.memory_mb, "vcpus": spec.vcpus,
            "accel": spec.accel.value if spec.accel else None,
            "display": list(spec.display) if spec.display else None,
            "engine": spec.engine, "image": spec.image}


def spec_from_json(raw: dict[str, Any]) -> MachineSpec:
    display = raw.get("display")
    return MachineSpec(
        rig_id="snapshot", surface=Surface(raw["surface"]), memory_mb=int(raw["memoryMb"]),
        vcpus=int(raw["vcpus"]), accel=Accel(raw["accel"]) if raw.get("accel") else None,
        display=(int(display[0]), int(display[1])) if display else None,
        engine=raw.get("engine"), image=raw.get("image"),
    )


def _sha256(path: Path) -> str:
    h = hashlib.sha256()
    with path.open("rb") as f:
        while chunk := f.read(1 << 20):
            h.update(chunk)
    return h.hexdigest()


@dataclass(frozen=True, slots=True)
class Kept:
    """A snapshot as the shelf holds it."""

    dir: Path
    meta: dict[str, Any]

    def to_json(self) -> dict[str, Any]:
        m = self.meta
        return {"name": m["name"], "workspace": m["workspace"], "surface": m["spec"]["surface"],
                "bytes": m["bytes"], "createdAt": m["createdAt"], "sourceRig": m["sourceRig"],
                "memoryMb": m["spec"]["memoryMb"], "vcpus": m["spec"]["vcpus"]}


def workspace_dir(root: Path, workspace: str) -> Path:
    """A workspace's directory under a root-only store (snapshots, volumes)."""
    if not re.fullmatch(r"[A-Za-z0-9_.-]{1,128}", workspace) or workspace.startswith("."):
        raise FieldError("workspace", "is not a workspace id")
    return root / workspace


class SnapshotShelf:
    def __init__(self, root: Path) -> None:
        self.root = root
        root.mkdir(mode=0o700, parents=True, exist_ok=True)

    def _ws_dir(self, workspace: str) -> Path:
        return workspace_dir(self.root, workspace)

    def dir_of(self, workspace: str, name: str) -> Path:
        problem = snapshot_name_problem(name)
        if problem is not None:
            raise FieldError("name", problem)
        return self._ws_dir(workspace) / name

    def _read(self, d: Path) -> dict[str, Any]:
        meta = json.loads((d / META_FILE).read_text())
        if not isinstance(meta, dict) or meta.get("format") != FORMAT:
            raise ValueError(f"format {meta.get('format') if isinstance(meta, dict) else '?'}, "
                             f"this server reads {FORMAT}")
        return meta

    def list(self, workspace: str) -> list[Kept]:
        d = self._ws_dir(workspace)
        out: list[Kept] = []
        if not d.is_dir():
            return out
        for child in sorted(d.iterdir()):
            if child.name.startswith(".") or not child.is_dir():
                continue
            try:
                out.append(Kept(child, self._read(child)))
            except (OSError, ValueError, KeyError) as exc:
                log.warning("unreadable snapshot", extra={"path": str(child), "error": str(exc)[:200]})
        return out

    def bytes_used(self, workspace: str) -> int:
        return sum(int(k.meta.get("bytes", 0)) for k in self.list(workspace))

    def commit(self, image: ForkImage, workspace: str, name: str, *, created_at: str, created_by: str,
               base: Path | None) -> Kept:
        """Move a frozen machine onto the shelf as ``name`` (hashing its files); the frozen
        directory is gone afterwards, whatever happens."""
        final = self.dir_of(workspace, name)
        tmp = final.with_name(f".tmp-{name}-{secrets.token_hex(4)}")
        try:
            final.parent.mkdir(mode=0o700, exist_ok=True)
            if final.exists():
                raise Conflict(f"a snapshot named {name!r} exists in this workspace; snapshot.rm it first",
                               field="name")
            os.rename(image.dir, tmp)
            files: dict[str, dict[str, Any]] = {
                f: {"size": (tmp / f).stat().st_size, "sha256": _sha256(tmp / f)}
                for f in (DISK_FILE, MEMORY_FILE)}
            meta = {
                "format": FORMAT, "name": name, "workspace": workspace, "sourceRig": image.parent,
                "createdAt": created_at, "createdBy": created_by, "spec": spec_json(image.spec),
                "files": files, "bytes": sum(int(f["size"]) for f in files.values()),
                "base": ({"path": str(base), **file_identity(base.stat())} if base is not None else None),
                "pausedMs": round(image.paused_s * 1000),
            }
            meta_path = tmp / META_FILE
            meta_path.write_text(json.dumps(meta, indent=1))
            with meta_path.open("rb") as f:
                os.fsync(f.fileno())
            try:
                os.rename(tmp, final)  # (fails if a snapshot of that name appeared meanwhile)
            except OSError as exc:
                raise Conflict(f"a snapshot named {name!r} exists in this workspace", field="name") from exc
            return Kept(final, meta)
        finally:
            for leftover in (image.dir, tmp):
                if leftover.exists():
                    remove_tree(leftover, log=log)

    def open(self, workspace: str, name: str) -> ForkImage:
        """The snapshot as a frozen machine to restore, once every file checks; a damaged one
        (or one whose base image changed) is a :class:`Conflict` saying what."""
        d = self.dir_of(workspace, name)
        if not d.is_dir():
            raise NotFound(f"no snapshot {name!r} in this workspace (snapshot.list lists them)",
                           field="snapshot")
        try:
            meta = self._read(d)
        except (OSError, ValueError) as exc:
            raise Conflict(f"snapshot {name!r} cannot be opened: its {META_FILE} is damaged ({exc})",
                           field="snapshot") from exc
        for fname, want in meta["files"].items():
            path = d / fname
            try:
                size, digest = path.stat().st_size, _sha256(path)
            except OSError as exc:
                raise Conflict(f"snapshot {name!r} cannot be opened: {fname}: {exc.strerror}",
                               field="snapshot") from exc
            if size != want["size"] or digest != want["sha256"]:
                raise Conflict(f"snapshot {name!r} cannot be opened: {fname} is damaged (its size or "
                               "sha256 is not what was kept)", field="snapshot")
        base = meta.get("base")
        if base is not None:
            try:
                now = file_identity(Path(base["path"]).stat())
            except OSError:
                now = None
            if now is None or any(now[k] != base[k] for k in ("ino", "size", "mtimeNs")):
                raise Conflict(f"snapshot {name!r} cannot be opened: the image it was taken on "
                               f"({base['path']}) was rebuilt or removed since", field="snapshot")
        return ForkImage(dir=d, disk=d / DISK_FILE, memory=d / MEMORY_FILE,
                         spec=spec_from_json(meta["spec"]), parent=f"snapshot {name}",
                         paused_s=float(meta.get("pausedMs", 0)) / 1000)

    def remove(self, workspace: str, name: str) -> None:
        d = self.dir_of(workspace, name)
        if not d.is_dir():
            raise NotFound(f"no snapshot {name!r} in this workspace", field="name")
        gone = d.with_name(f".rm-{name}-{secrets.token_hex(4)}")
        os.rename(d, gone)  # gone from the list at once; the files follow
        remove_tree(gone, log=log)

    def sweep(self) -> None:
        """Remove what a crash left half-made (``.tmp-*``, ``.rm-*``) (server start)."""
        if not self.root.is_dir():
            return
        for ws in self.root.iterdir():
            if ws.is_dir():
                for child in ws.iterdir():
                    if child.name.startswith((".tmp-", ".rm-")):
                        with contextlib.suppress(OSError):
                            remove_tree(child, log=log)
