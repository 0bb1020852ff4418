"""Warm packs: a boot-ready root filesystem made from an OCI image.

A pack lives in ``<dataDir>/rigs/smolvm-packs/<digesthex>-tools-v1/``::

    rootfs.img   raw ext4 with the image's files (+2 GiB sparse headroom);
                 each rig boots a qcow2 overlay backed by it, so it is read-only
    pack.json    what it was made from

How this works: the layout is untrusted, so the manifest and every layer
blob are checked (size and sha256) before anything is unpacked. Layers are
applied in order into a temporary tree with GNU tar (about twice as fast as
Python's tarfile), each preceded by its whiteouts: ``.wh..wh..opq`` empties
the directory it sits in, ``.wh.<name>`` deletes ``<name>`` from the layers
below; whiteout files themselves are never extracted. A layer after the first
may not write through a symlink already in the tree (a crafted image could
otherwise point tar outside the tree); GNU tar already guards symlinks within
one archive. ``mke2fs -d`` then makes the image, and the finished directory is
renamed into place, so a pack either exists whole or not at all; concurrent
callers wait on a lock and find it.

Ownership: as root, tar keeps the image's numeric owners. As another user the
tree is unpacked and imaged inside one ``fakeroot`` session, so owners and
device nodes still reach the ext4 image.

The functions are synchronous: the server calls them from a worker thread.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import tarfile
import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from pathlib import Path, PurePosixPath

from rigd.errors import RigdError
from rigd.images import oci
from rigd.images.assets import TerminalAssets
from rigd.images.cache import READ_ONLY_MODE, cached_build, remove_tree
from rigd.images.ext4 import GiB, make_ext4, tree_usage

#: The terminal toolkit revision (RIGS.md §3): a pack warmed for another
#: revision of the toolkit must never serve a rig that expects this one.
REVISION = "tools-v1"
HEADROOM = 2 * GiB
PACK_FORMAT = 1

Progress = Callable[[str], None]

_WH = ".wh."
_OPAQUE = ".wh..wh..opq"


def _noop(_step: str) -> None:
    pass


def pack_dir(data_dir: Path, digest: str, *, revision: str = REVISION, kind: str = "smolvm-packs") -> Path:
    """``<dataDir>/rigs/<kind>/<digesthex>-<revision>``: a pack is keyed by its image and
    the revision of what the rig expects in it (``tools-v1``; a browser's engine and audio lane)."""
    return data_dir / "rigs" / kind / f"{oci.parse_digest(digest)}-{revision}"


# --- whiteouts (pure) -------------------------------------------------------


@dataclass(frozen=True, slots=True)
class WhiteoutPlan:
    opaque: tuple[str, ...]  # directories whose lower contents are removed ("" = root)
    remove: tuple[str, ...]  # paths removed from the lower layers


def normalize_member(name: str) -> str:
    """A tar member name as a clean relative path; raise if it escapes."""
    p = PurePosixPath(name.lstrip("/"))
    parts = [x for x in p.parts if x != "."]
    if any(x == ".." for x in parts):
        raise RigdError(f"image layer member {name!r} escapes the root", member=name)
    return "/".join(parts)


def plan_whiteouts(names: Iterable[str]) -> WhiteoutPlan:
    opaque: list[str] = []
    remove: list[str] = []
    for raw in names:
        name = normalize_member(raw)
        parent, _, base = name.rpartition("/")
        if base == _OPAQUE:
            opaque.append(parent)
        elif base.startswith(_WH):
            target = base[len(_WH) :]
            if not target or target in (".", ".."):
                raise RigdError(f"image layer has a malformed whiteout {raw!r}", member=raw)
            remove.append(f"{parent}/{target}" if parent else target)
    return WhiteoutPlan(tuple(sorted(set(opaque))), tuple(sorted(set(remove))))


def _parents(rel: str) -> list[str]:
    parts = rel.split("/")
    return ["/".join(parts[:i]) for i in range(1, len(parts))]


def check_no_symlink_parents(tree: Path, names: Iterable[str]) -> None:
    """Raise if any name's parent directory in ``tree`` is a symlink."""
    checked: set[str] = set()
    for name in names:
        for prefix in _parents(name):
            if prefix in checked:
                continue
            checked.add(prefix)
            if (tree / prefix).is_symlink():
                raise RigdError(
                    f"image layer writes {name!r} through the symlink {prefix!r}, "
                    "which could point outside the root; such layers are not supported",
                    member=name,
                )


def apply_whiteouts(tree: Path, plan: WhiteoutPlan) -> None:
    """Apply ``plan`` to the lower layers already unpacked in ``tree``."""
    check_no_symlink_parents(tree, [f"{d}/x" if d else "x" for d in plan.opaque])
    check_no_symlink_parents(tree, plan.remove)
    for d in plan.opaque:
        target = tree / d if d else tree
        if target.is_dir() and not target.is_symlink():
            for child in target.iterdir():
                remove_tree(child)
    for rel in plan.remove:
        target = tree / rel
        if target.is_symlink() or target.exists():
            remove_tree(target)


# --- unpacking --------------------------------------------------------------


def _layer_names(blob: Path, compression: str) -> list[str]:
    """Member names of a layer (Python's tarfile reads headers; GNU tar extracts)."""
    if compression == "zstd":
        if shutil.which("zstd") is None:
            raise RigdError("the image has zstd layers and the `zstd` program is not installed")
        proc = subprocess.Popen(["zstd", "-dcq", str(blob)], stdout=subprocess.PIPE)
        assert proc.stdout is not None
        try:
            with tarfile.open(fileobj=proc.stdout, mode="r|") as src:
                return [normalize_member(m.name) for m in src]
        except (tarfile.TarError, OSError, EOFError) as exc:
            raise RigdError(f"layer {blob.name[:12]} is not a valid zstd tar: {exc}") from exc
        finally:
            proc.kill()
            proc.wait()
    try:
        with tarfile.open(blob, mode="r|gz" if compression == "gzip" else "r|") as src:
            return [normalize_member(m.name) for m in src]
    except (tarfile.TarError, OSError, EOFError) as exc:
        raise RigdError(f"layer {blob.name[:12]} is not a valid tar: {exc}") from exc


def _tar_argv(blob: Path, tree: Path, compression: str) -> list[str]:
    argv = [
        "tar",
        "-x",
        "-f",
        str(blob),
        "-C",
        str(tree),
        "--numeric-owner",
        "--same-owner",
        "--same-permissions",
        "--xattrs",
        "--xattrs-include=*",
        f"--exclude={_WH}*",
    ]
    if compression == "gzip":
        argv.append("--use-compress-program=pigz" if shutil.which("pigz") else "--gzip")
    elif compression == "zstd":
        if shutil.which("zstd") is None:
            raise RigdError("the image has zstd layers and the `zstd` program is not installed")
        argv.append("--zstd")
    return argv


def _fakeroot(state: Path) -> list[str]:
    if os.geteuid() == 0:
        return []
    exe = shutil.which("fakeroot")
    if exe is None:
        raise RigdError(
            "building a pack as a non-root user needs `fakeroot` (apt-get install "
            "fakeroot) to keep the image's file owners"
        )
    return [exe, "-s", str(state), *(["-i", str(state)] if state.exists() else [])]


def unpack_layers(layout: Path, manifest: oci.Manifest, tree: Path, state: Path) -> None:
    for i, layer in enumerate(manifest.layers):
        blob = oci.blob_path(layout, layer.digest)
        compression = oci.LAYER_COMPRESSION[layer.media_type]
        if i > 0:  # the first layer lands in an empty tree: nothing to white out or escape through
            names = _layer_names(blob, compression)
            check_no_symlink_parents(tree, names)
            apply_whiteouts(tree, plan_whiteouts(names))
        res = subprocess.run(
            [*_fakeroot(state), *_tar_argv(blob, tree, compression)],
            capture_output=True,
            text=True,
            check=False,
        )
        if res.returncode != 0:
            raise RigdError(
                f"unpacking layer {i} ({layer.digest}) failed: {res.stderr.strip()[-2000:]}", layer=i
            )


# --- the pack ---------------------------------------------------------------


#: Changes a pack's tree before it is imaged (the tree, the fakeroot state file).
Finish = Callable[[Path, Path], None]


def run_as_root(state: Path, argv: list[str]) -> None:
    """``argv`` as root over a pack's tree: directly when root, else in its fakeroot session
    (so owners it sets reach the image)."""
    res = subprocess.run([*_fakeroot(state), *argv], capture_output=True, text=True, check=False)
    if res.returncode != 0:
        raise RigdError(f"{argv[0]} failed on the pack's tree: {res.stderr.strip()[-500:]}")


def _build(layout: Path, digest: str, out: Path, progress: Progress, revision: str,
           finish: Finish | None = None) -> None:
    t0 = time.monotonic()
    progress("verifying image")
    manifest = oci.load_manifest(layout, digest)
    oci.verify_blob(layout, manifest.config)
    for layer in manifest.layers:
        oci.verify_blob(layout, layer)
    progress("unpacking image")
    tree = out / ".tree"
    tree.mkdir()
    state = out / ".fakeroot"
    unpack_layers(layout, manifest, tree, state)
    if finish is not None:
        finish(tree, state)
    progress("making root filesystem")
    used, inodes = tree_usage(tree)
    size = used + HEADROOM
    make_ext4(
        tree,
        out / "rootfs.img",
        size_bytes=size,
        label="rig-root",
        journal=True,
        inodes=max(size // 16384, inodes * 2 + 16384),
        seed=f"pack:{digest}",
        wrapper=_fakeroot(state) if os.geteuid() != 0 else None,
    )
    remove_tree(tree)
    state.unlink(missing_ok=True)
    (out / "rootfs.img").chmod(READ_ONLY_MODE)
    doc = {
        "format": PACK_FORMAT,
        "revision": revision,
        "image_digest": digest,
        "layers": [layer.digest for layer in manifest.layers],
        "rootfs": "rootfs.img",
        "rootfs_bytes": (out / "rootfs.img").stat().st_size,
        "content_bytes": used,
        "build_seconds": round(time.monotonic() - t0, 1),
    }
    (out / "pack.json").write_text(json.dumps(doc, indent=1) + "\n")


def ensure_pack(
    image: TerminalAssets | Path,
    data_dir: Path,
    progress: Progress = _noop,
    *,
    digest: str | None = None,
    revision: str = REVISION,
    kind: str = "smolvm-packs",
    finish: Finish | None = None,
) -> Path:
    """Return the path of the pack's ``rootfs.img``, building the pack if needed.

    ``image`` is either the built :class:`TerminalAssets` or an OCI layout
    directory, in which case ``digest`` (the manifest's ``sha256:…``) pins
    which image in it to use. ``revision`` and ``kind`` place it (:func:`pack_dir`);
    ``finish`` may change the unpacked tree before it is imaged (the revision must say so).
    """
    if isinstance(image, TerminalAssets):
        layout, digest = image.oci_layout, digest or image.image_digest
    else:
        layout = image
        if digest is None:
            raise RigdError("ensure_pack: a digest is required with an OCI layout path", field="digest")
    final = pack_dir(data_dir, digest, revision=revision, kind=kind)
    d = cached_build(final.parent, final.name, "pack",
                     lambda out: _build(layout, digest, out, progress, revision, finish), _noop)
    rootfs = d / "rootfs.img"
    if not rootfs.is_file() or not (d / "pack.json").is_file():
        raise RigdError(f"pack {d} is incomplete; delete it to rebuild", path=str(d))
    return rootfs


def read_pack(data_dir: Path, digest: str) -> dict[str, object] | None:
    """The pack's ``pack.json`` if the pack exists."""
    p = pack_dir(data_dir, digest) / "pack.json"
    try:
        doc = json.loads(p.read_text())
    except (OSError, json.JSONDecodeError):
        return None
    return doc if isinstance(doc, dict) else None
