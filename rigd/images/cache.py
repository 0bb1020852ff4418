"""Where built assets live, how they are keyed, and how they are made atomically.

Every heavy output goes under ``${RIGD_CACHE_DIR:-$HOME/.cache/rigd}``, never
in the clone. An asset lives in ``<cache>/<kind>/<key>/`` where ``key`` is a
hash of everything that decides its bytes: the recipe files, the lock files,
the builder modules (and for the tools disk, the agent source) — and of
nothing else, so that a change elsewhere (the importer, the CLI, the agent
for an image that does not carry it) never rebuilds an image. Changing any
of them makes a new key, so a stale asset is never served; an unchanged
recipe finds the finished directory and the build is a no-op.

A build writes into ``<cache>/<kind>/.tmp-<key>-<pid>/`` and renames it into
place, holding an exclusive ``flock`` on ``<cache>/<kind>/.lock`` so that two
builders of the same kind do not race (the second finds the result). A failed
build removes its temporary directory: a half-built asset never has a final
name.
"""

from __future__ import annotations

import fcntl
import hashlib
import os
import shutil
from collections.abc import Callable, Iterable, Iterator
from contextlib import contextmanager
from pathlib import Path

from rigd.errors import RigdError

Log = Callable[[str], None]

#: Files that are world-readable: QEMU may run as a per-rig uid (rigd/backends/confine.py).
READ_ONLY_MODE = 0o444


def default_cache_dir() -> Path:
    env = os.environ.get("RIGD_CACHE_DIR")
    if env:
        return Path(env).expanduser()
    return Path.home() / ".cache" / "rigd"


def repo_root() -> Path:
    """The checkout that holds ``images/`` (the recipes) and ``guest-agent/``."""
    root = Path(__file__).resolve().parents[2]
    if not (root / "images").is_dir():
        raise RigdError(
            f"image recipes not found at {root / 'images'}; "
            "rigd must run from its source tree to build or find the terminal image",
            path=str(root / "images"),
        )
    return root


def builder_sources(*modules: str) -> list[Path]:
    """Paths of builder modules in this package (by module file stem).

    A key names only the modules whose code decides an asset's bytes. This
    module is not among them: it decides where an asset is kept and how it
    is keyed (a change to :func:`recipe_key` changes every key by itself).
    """
    here = Path(__file__).resolve().parent
    return [here / f"{m}.py" for m in modules]


def recipe_key(files: Iterable[Path], *, root: Path, extra: Iterable[str] = ()) -> str:
    """A short hex hash of the files' paths (relative to ``root``) and contents.

    A missing file hashes as absent (so that adding it changes the key).
    """
    h = hashlib.sha256()
    for path in sorted(set(files)):
        try:
            rel = path.resolve().relative_to(root.resolve()).as_posix()
        except ValueError:
            rel = path.as_posix()
        h.update(rel.encode() + b"\0")
        if path.is_file():
            h.update(b"F" + hashlib.sha256(path.read_bytes()).digest())
        else:
            h.update(b"-")
    for item in extra:
        h.update(b"X" + item.encode() + b"\0")
    return h.hexdigest()[:20]


def sha256_file(path: Path) -> str:
    h = hashlib.sha256()
    with path.open("rb") as f:
        while chunk := f.read(1 << 20):
            h.update(chunk)
    return h.hexdigest()


@contextmanager
def _locked(path: Path) -> Iterator[None]:
    path.parent.mkdir(parents=True, exist_ok=True)
    with path.open("a") as f:
        fcntl.flock(f, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(f, fcntl.LOCK_UN)


def remove_tree(path: Path) -> None:
    """Remove a directory tree even where a build left read-only dirs inside."""
    if not path.exists() and not path.is_symlink():
        return

    def onerror(func: Callable[..., object], p: str, _exc: object) -> None:
        os.chmod(os.path.dirname(p), 0o755)  # noqa: S103 - our own temp dir, made writable to delete
        if os.path.isdir(p) and not os.path.islink(p):
            os.chmod(p, 0o755)  # noqa: S103
        func(p)

    if path.is_dir() and not path.is_symlink():
        shutil.rmtree(path, onerror=onerror)
    else:
        path.unlink()


def cached_build(kind_dir: Path, key: str, what: str, build: Callable[[Path], None], log: Log) -> Path:
    """Return ``kind_dir/key``, building it with ``build(tmpdir)`` if absent."""
    final = kind_dir / key
    if final.is_dir():
        log(f"{what}: cached ({final})")
        return final
    with _locked(kind_dir / ".lock"):
        if final.is_dir():  # another builder finished while we waited
            log(f"{what}: cached ({final})")
            return final
        # Holding the lock, any temp dir is a crashed builder's leftover.
        for stale in kind_dir.glob(".tmp-*"):
            remove_tree(stale)
        tmp = kind_dir / f".tmp-{key}-{os.getpid()}"
        tmp.mkdir()
        try:
            build(tmp)
            tmp.chmod(0o755)
            os.rename(tmp, final)
        except BaseException:
            remove_tree(tmp)
            raise
    return final
