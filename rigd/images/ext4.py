"""Raw ext4 images from a directory with ``mke2fs -d`` (no loop mounts, no root).

Bookworm's e2fsprogs cannot read a tarball with ``-d``, so callers unpack
first. The image is a sparse file: its apparent size includes the headroom,
its real size only the data.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import uuid
from pathlib import Path

from rigd.errors import RigdError

_BLOCK = 4096
MiB = 1 << 20
GiB = 1 << 30


def tree_usage(root: Path) -> tuple[int, int]:
    """``(bytes, inodes)`` the tree needs on ext4 (4 KiB blocks, rough but safe)."""
    total = 0
    inodes = 0
    for dirpath, dirnames, filenames in os.walk(root):
        inodes += 1
        total += _BLOCK
        for name in filenames + [d for d in dirnames if os.path.islink(os.path.join(dirpath, d))]:
            inodes += 1
            st = os.lstat(os.path.join(dirpath, name))
            total += -(-st.st_size // _BLOCK) * _BLOCK if st.st_size > 60 else 0
    return total, inodes


def _mke2fs() -> str:
    for cand in (shutil.which("mke2fs"), "/usr/sbin/mke2fs", "/sbin/mke2fs"):
        if cand and Path(cand).is_file():
            return cand
    raise RigdError("`mke2fs` is not installed (Debian package e2fsprogs)")


def make_ext4(
    src: Path,
    image: Path,
    *,
    size_bytes: int,
    label: str,
    journal: bool,
    inodes: int | None = None,
    seed: str | None = None,
    epoch: int | None = None,
    wrapper: list[str] | None = None,
) -> None:
    """Write ``image`` as an ext4 filesystem holding ``src``.

    ``seed`` fixes the filesystem UUID and directory hash seed and ``epoch``
    the times mke2fs stamps, so the same tree gives the same bytes.
    ``wrapper`` prefixes the command (``fakeroot -i state`` for a non-root
    build that must keep the tree's recorded owners).
    """
    size_bytes = -(-size_bytes // MiB) * MiB
    with image.open("wb") as f:
        f.truncate(size_bytes)  # sparse
    features = ["^has_journal"] if not journal else []
    opts = ["root_owner=0:0"]
    cmd = [
        *(wrapper or []),
        _mke2fs(),
        "-q",
        "-F",
        "-t",
        "ext4",
        "-b",
        str(_BLOCK),
        "-m",
        "0",
        "-L",
        label,
        "-d",
        str(src),
    ]
    if features:
        cmd += ["-O", ",".join(features)]
    if inodes:
        cmd += ["-N", str(inodes)]
    env = dict(os.environ)
    if seed is not None:
        u = str(uuid.uuid5(uuid.NAMESPACE_URL, f"rigd:{seed}"))
        cmd += ["-U", u]
        opts.append(f"hash_seed={u}")
    if epoch is not None:
        env["E2FSPROGS_FAKE_TIME"] = str(epoch)
    cmd += ["-E", ",".join(opts), str(image)]
    res = subprocess.run(cmd, capture_output=True, text=True, env=env, check=False)
    if res.returncode != 0:
        image.unlink(missing_ok=True)
        raise RigdError(f"mke2fs failed for {image.name}: {res.stderr.strip()[-2000:]}")
