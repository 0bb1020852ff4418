"""Warm starts: one memory snapshot per pack of a freshly booted, idle machine.

How this works
--------------
After the first cold boot of a pack (or when the server asks at start), the
backend boots one more machine in the background, exactly as it boots a rig,
waits for its agent, runs ``sync`` in the guest, stops the vCPUs and migrates
the machine's state over a Unix socket that the host listens on. The host
pipes the stream through ``zstd`` into ``memory.zst``: QEMU runs under
``-sandbox …,spawn=deny`` and cannot start a compressor itself (``exec:``
URIs), and QEMU 7.2 has no ``file:`` URI. The machine's own qcow2 overlay
(backed by the pack's ``rootfs.img``) becomes ``disk.qcow2``: a memory image is
only valid with the disk it was taken with, since the guest's page cache and
ext4 state describe those blocks.

A later rig of the pack gets a qcow2 overlay of ``disk.qcow2`` (its own
writes never reach the snapshot), starts QEMU with the same command line plus
``-incoming defer``, is told ``migrate-incoming unix:<rig dir>/migrate.sock``,
and the host feeds it ``zstd -d`` of ``memory.zst``. The source was stopped,
so the restored machine arrives paused; ``cont`` resumes it. The host then
says ``hello`` (which sets the stale guest clock) and ``reseed`` (a fresh
``/etc/machine-id``, host entropy credited to the guest RNG and the CRNG
reseeded, the rig's MAC on any virtio NIC), because every clone starts with
the snapshot's clock, identity and random state.

Keys and invalidation
---------------------
A snapshot lives in ``<pack dir>/snapshots/<key>/`` (``disk.qcow2``,
``memory.zst``, ``snapshot.json``). The key hashes everything a restore
depends on (:func:`snapshot_material`): the pack (its name, which carries the
image digest and toolkit revision, and the identity of ``rootfs.img``: inode,
size, mtime — a rebuilt pack is a different disk), the QEMU binary (version
line and file identity), the shape of the QEMU command line with every
per-rig path replaced by a placeholder (memory, vCPUs, machine, devices,
kernel command line), the kernel, initramfs and tools disk (their content
keys and sizes: the agent lives on the tools disk) and
:data:`SNAPSHOT_FORMAT`. Any change gives a new key: the old snapshot is
simply not found, the rig boots cold, and a new one is built. Snapshots
whose pack identity differs from the current pack's are deleted when a new
one is committed (:func:`plan_prune`); other variants (another memory size)
are kept, at most :data:`MAX_PER_PACK`, least recently used first out.

A snapshot is built in ``.tmp-<key>-<pid>-<rand>/`` under a non-blocking
``flock`` (another process building the same key is left to it) and renamed
into place, so it exists whole or not at all. One that fails to restore is
deleted (and rebuilt later): the rig falls back to a cold boot.
"""

from __future__ import annotations

import contextlib
import errno
import fcntl
import hashlib
import json
import logging
import os
import secrets
import socket
import subprocess
import time
from collections.abc import AsyncIterator, Iterator, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import trio

from netgate.cleanup import remove_tree
from rigd.backends.confine import Identity, make_shared_dir
from rigd.backends.qmp_client import QMPConnection
from rigd.errors import BackendError

#: Bumped whenever the way a snapshot is taken or restored changes.
SNAPSHOT_FORMAT = 1
#: Snapshots kept per pack (variants of memory size, vCPUs …).
MAX_PER_PACK = 4
DISK_FILE = "disk.qcow2"
MEMORY_FILE = "memory.zst"
META_FILE = "snapshot.json"
#: The environment switch: ``RIGD_WARM_STARTS=0`` makes every rig boot cold.
ENV_SWITCH = "RIGD_WARM_STARTS"
#: QEMU 7.2 throttles migration to 128 MiB/s by default; a stopped machine
#: saved to a local socket has no reason to be throttled.
SAVE_BANDWIDTH = 64 << 30


def warm_starts_enabled(env: Mapping[str, str] | None = None) -> bool:
    """False when ``RIGD_WARM_STARTS`` is ``0``/``false``/``no``/``off``."""
    value = (os.environ if env is None else env).get(ENV_SWITCH, "1")
    return value.strip().lower() not in ("0", "false", "no", "off")


# --- per-rig identity (pure) ---------------------------------------------------


def rig_mac(rig_id: str) -> str:
    """The rig's MAC: locally administered, unicast, derived from the rig id."""
    h = hashlib.sha256(b"rigd-mac\0" + rig_id.encode()).digest()
    first = (h[0] & 0xFC) | 0x02
    return ":".join(f"{b:02x}" for b in (first, *h[1:6]))


def rig_machine_id(rig_id: str) -> str:
    """The rig's ``/etc/machine-id``: 32 lower-case hex digits, derived from the rig id."""
    return hashlib.sha256(b"rigd-machine-id\0" + rig_id.encode()).hexdigest()[:32]


# --- keys (pure) ---------------------------------------------------------------


def file_identity(st: os.stat_result) -> dict[str, int]:
    """Which file this is, as far as a snapshot cares: a rewrite changes it."""
    return {"ino": st.st_ino, "size": st.st_size, "mtimeNs": st.st_mtime_ns}


def snapshot_material(
    *,
    pack: str,
    rootfs: Mapping[str, int],
    qemu_version: str,
    qemu_binary: Mapping[str, int],
    argv_shape: Sequence[str],
    assets: Mapping[str, Mapping[str, Any]],
) -> dict[str, Any]:
    """Everything a restored machine depends on, as one JSON-able mapping.

    ``argv_shape`` is the QEMU command line with per-rig paths (sockets,
    overlay) and asset paths replaced by placeholders; ``assets`` names the
    kernel, initramfs and tools disk by content key and size.
    """
    return {
        "format": SNAPSHOT_FORMAT,
        "pack": {"name": pack, "rootfs": dict(rootfs)},
        "qemu": {"version": qemu_version, "binary": dict(qemu_binary)},
        "argv": list(argv_shape),
        "assets": {k: dict(v) for k, v in sorted(assets.items())},
    }


def snapshot_key(material: Mapping[str, Any]) -> str:
    """A short hex hash of the material (canonical JSON)."""
    blob = json.dumps(material, sort_keys=True, separators=(",", ":")).encode()
    return hashlib.sha256(blob).hexdigest()[:24]


@dataclass(frozen=True, slots=True)
class SnapshotEntry:
    """What the pruning decision needs to know about one stored snapshot."""

    key: str
    pack: Mapping[str, Any] | None  # the material's "pack" part; None if unreadable
    last_used: float


def plan_prune(
    entries: Sequence[SnapshotEntry], current: Mapping[str, Any], *, keep: int = MAX_PER_PACK
) -> list[str]:
    """Keys to delete: every snapshot of another pack identity (or unreadable),
    then the least recently used beyond ``keep``. The current key is never chosen.
    """
    current_key = snapshot_key(current)
    current_pack = current.get("pack")
    doomed = [e.key for e in entries if e.key != current_key and (e.pack is None or e.pack != current_pack)]
    alive = [e for e in entries if e.key not in doomed]
    alive.sort(key=lambda e: (e.key == current_key, e.last_used), reverse=True)
    doomed += [e.key for e in alive[max(keep, 1):] if e.key != current_key]
    return sorted(doomed)


#: After a failed build, or two failed restores of one key, wait this long.
RETRY_S = 600.0


def should_build(
    now: float, *, building: bool, build_failed_at: float | None, restore_failures: Sequence[float],
    retry_s: float = RETRY_S,
) -> bool:
    """Whether to start building a missing (or just discarded) snapshot now.

    Not while one is being built; not within ``retry_s`` of a failed build;
    not when snapshots of this key failed to restore twice within ``retry_s``
    (one failure may be a damaged file: it is rebuilt at once).
    """
    if building:
        return False
    if build_failed_at is not None and now - build_failed_at < retry_s:
        return False
    return sum(1 for t in restore_failures if now - t < retry_s) < 2


# --- the store -----------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class Snapshot:
    key: str
    dir: Path
    meta: Mapping[str, Any]

    @property
    def disk(self) -> Path:
        return self.dir / DISK_FILE

    @property
    def memory(self) -> Path:
        return self.dir / MEMORY_FILE


class SnapshotStore:
    """The snapshots of one pack: ``<pack dir>/snapshots/``. Synchronous (call from a thread)."""

    def __init__(self, root: Path, *, log: logging.Logger | None = None) -> None:
        self.root = root
        self.log = log or logging.getLogger("rigd.snapshot")

    def find(self, key: str) -> Snapshot | None:
        """The committed snapshot for ``key``, or None. A damaged one is deleted."""
        d = self.root / key
        try:
            meta = json.loads((d / META_FILE).read_text())
        except FileNotFoundError:
            return None
        except (OSError, ValueError) as exc:
            self.discard(key, f"unreadable {META_FILE}: {exc}")
            return None
        problem = _check_meta(meta, key, d)
        if problem:
            self.discard(key, problem)
            return None
        return Snapshot(key, d, meta)

    def touch(self, key: str) -> None:
        """Mark ``key`` as used now (its directory's mtime orders pruning)."""
        with contextlib.suppress(OSError):
            os.utime(self.root / key)

    def discard(self, key: str, reason: str) -> None:
        d = self.root / key
        if not d.exists():
            return
        trash = self.root / f".trash-{key}-{os.getpid()}-{secrets.token_hex(4)}"
        try:
            d.rename(trash)
        except OSError:
            return  # someone else moved it first
        self.log.warning("snapshot discarded", extra={"snapshot": key, "reason": reason[:300]})
        remove_tree(trash, log=self.log)

    def entries(self) -> list[SnapshotEntry]:
        out = []
        try:
            names = sorted(os.listdir(self.root))
        except FileNotFoundError:
            return []
        for name in names:
            if name.startswith("."):
                continue
            d = self.root / name
            try:
                last_used = d.stat().st_mtime
            except OSError:
                continue
            pack: Mapping[str, Any] | None
            try:
                material = json.loads((d / META_FILE).read_text())["material"]
                pack = material["pack"] if isinstance(material.get("pack"), dict) else None
            except (OSError, ValueError, KeyError, TypeError):
                pack = None
            out.append(SnapshotEntry(name, pack, last_used))
        return out

    def prune(self, current: Mapping[str, Any]) -> list[str]:
        doomed = plan_prune(self.entries(), current)
        for key in doomed:
            self.discard(key, "stale: the pack changed, or too many snapshots")
        return doomed

    @contextlib.contextmanager
    def building(self, key: str) -> Iterator[Path | None]:
        """A fresh temporary directory to build ``key`` in, under an exclusive lock.

        Yields None when another process holds the lock or the snapshot
        already exists. The directory is removed on the way out unless it was
        committed.
        """
        make_shared_dir(self.root)
        lock_path = self.root / f".lock-{key}"
        fd = os.open(lock_path, os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o600)
        try:
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            except BlockingIOError:
                yield None
                return
            if (self.root / key).exists():
                yield None
                return
            self._sweep(key)
            tmp = self.root / f".tmp-{key}-{os.getpid()}-{secrets.token_hex(4)}"
            make_shared_dir(tmp)
            try:
                yield tmp
            finally:
                if tmp.exists():
                    remove_tree(tmp, log=self.log)
        finally:
            os.close(fd)

    def _sweep(self, key: str) -> None:
        """Remove what dead builders of ``key`` left (called holding its lock)."""
        for name in os.listdir(self.root):
            if name.startswith((f".tmp-{key}-", f".trash-{key}-")):
                pid = name.split("-")[2] if name.count("-") >= 3 else ""
                if pid.isdigit() and int(pid) != os.getpid() and _pid_exists(int(pid)):
                    continue
                remove_tree(self.root / name, log=self.log)

    def commit(self, tmp: Path, key: str, material: Mapping[str, Any], **facts: Any) -> Snapshot:
        """Seal the built files (read-only, synced) and rename ``tmp`` to ``key``."""
        disk, memory = tmp / DISK_FILE, tmp / MEMORY_FILE
        os.chown(disk, os.getuid(), os.getgid())
        os.chmod(disk, 0o444)  # rig uids read it as their overlay's backing file
        os.chmod(memory, 0o400)  # only the host reads it
        meta = {
            "format": SNAPSHOT_FORMAT, "key": key, "material": dict(material),
            "sizes": {DISK_FILE: disk.stat().st_size, MEMORY_FILE: memory.stat().st_size},
            "createdAt": time.time(), **facts,
        }
        meta_path = tmp / META_FILE
        meta_path.write_text(json.dumps(meta, indent=1, sort_keys=True) + "\n")
        os.chmod(meta_path, 0o444)
        for path in (disk, memory, meta_path, tmp):
            _fsync(path)
        os.rename(tmp, self.root / key)
        _fsync(self.root)
        return Snapshot(key, self.root / key, meta)


def _check_meta(meta: object, key: str, d: Path) -> str | None:
    if not isinstance(meta, dict):
        return f"{META_FILE} is not an object"
    if meta.get("format") != SNAPSHOT_FORMAT or meta.get("key") != key:
        return f"{META_FILE} is for format {meta.get('format')!r} / key {meta.get('key')!r}"
    sizes = meta.get("sizes")
    if not isinstance(sizes, dict):
        return f"{META_FILE} has no sizes"
    for name in (DISK_FILE, MEMORY_FILE):
        try:
            size = (d / name).stat().st_size
        except OSError:
            return f"{name} is missing"
        if size != sizes.get(name):
            return f"{name} is {size} bytes, not {sizes.get(name)}"
    return None


def _pid_exists(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def _unlink(path: Path) -> None:
    with contextlib.suppress(FileNotFoundError):
        os.unlink(path)


def copy_disk(src: Path, dst: Path) -> int:
    """Copy a disk file to a new ``dst`` (0600), in the kernel where it can
    (``copy_file_range``: a reflink on XFS/btrfs, no user-space buffers on ext4); return bytes."""
    fd_in = os.open(src, os.O_RDONLY | os.O_CLOEXEC)
    try:
        fd_out = os.open(dst, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_CLOEXEC, 0o600)
        try:
            size, done = os.fstat(fd_in).st_size, 0
            try:
                while done < size:
                    n = os.copy_file_range(fd_in, fd_out, size - done)
                    if n == 0:
                        break
                    done += n
            except OSError as exc:
                if exc.errno not in (errno.EXDEV, errno.ENOSYS, errno.EOPNOTSUPP, errno.EINVAL):
                    raise
                while chunk := os.pread(fd_in, 1 << 20, done):
                    os.pwrite(fd_out, chunk, done)
                    done += len(chunk)
            return done
        finally:
            os.close(fd_out)
    finally:
        os.close(fd_in)


def _fsync(path: Path) -> None:
    fd = os.open(path, os.O_RDONLY | os.O_CLOEXEC)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


# --- moving memory in and out of QEMU -------------------------------------------------


async def _wait_migration(qmp: QMPConnection, what: str, helper: trio.Process) -> dict[str, Any]:
    """Poll ``query-migrate`` until it completes (return its answer) or fails (raise).

    ``helper`` is the zstd process at the other end of the stream: if it
    fails, QEMU sees the stream end and fails too, but it says why first.
    """
    delay = 0.002
    while True:
        info = await qmp.execute("query-migrate", timeout=10)
        status = info.get("status") if isinstance(info, dict) else None
        if status == "completed":
            return dict(info)
        if status in ("failed", "cancelled"):
            detail = info.get("error-desc", status)
            raise BackendError(f"{what}: migration {status}: {detail}")
        if helper.poll() not in (None, 0):
            raise BackendError(f"{what}: zstd exited with {helper.returncode}")
        await trio.sleep(delay)
        delay = min(delay * 2, 0.05)


@contextlib.asynccontextmanager
async def _zstd(argv: list[str], *, stdin: int, stdout: int, what: str) -> AsyncIterator[trio.Process]:
    """Run ``zstd`` on the given fds; on the way out it must have exited 0 (or is killed)."""
    try:
        proc = await trio.lowlevel.open_process(argv, stdin=stdin, stdout=stdout, stderr=subprocess.PIPE)
    except OSError as exc:
        raise BackendError(f"{what}: cannot run {argv[0]}: {exc.strerror}") from exc
    try:
        yield proc
        with trio.move_on_after(30):
            await proc.wait()
        if proc.returncode != 0:
            err: bytes | bytearray = b""
            if proc.returncode is not None and proc.stderr is not None:
                with trio.move_on_after(1):
                    err = await proc.stderr.receive_some(4096)
            detail = err.decode("utf-8", "replace").strip()[-300:]
            raise BackendError(f"{what}: {argv[0]} exited with {proc.returncode}: {detail}")
    finally:
        with trio.CancelScope(shield=True):
            if proc.returncode is None:
                proc.kill()
                await proc.wait()
            if proc.stderr is not None:
                await proc.stderr.aclose()


async def save_memory(
    qmp: QMPConnection, *, listen: Path, owner: Identity, out: Path, zstd: str = "zstd"
) -> int:
    """Migrate the (stopped) machine's state into ``out`` (zstd); return the bytes QEMU sent.

    The host listens on ``listen`` (a path the QEMU uid may connect to) and
    QEMU connects to it; ``zstd`` reads the socket directly.
    """
    _unlink(listen)
    sock = trio.socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    with sock:
        await sock.bind(str(listen))
        sock.listen(1)
        if owner.per_rig:
            os.chown(listen, owner.uid, owner.gid)
        await qmp.execute("migrate-set-parameters", {"max-bandwidth": SAVE_BANDWIDTH})
        await qmp.execute("migrate", {"uri": f"unix:{listen}"})
        with trio.move_on_after(30) as scope:
            conn, _ = await sock.accept()
        if scope.cancelled_caught:
            raise BackendError("saving a snapshot: QEMU did not connect to the migration socket")
    _unlink(listen)
    info: dict[str, Any] = {}
    with conn:
        os.set_blocking(conn.fileno(), True)  # zstd reads it with plain blocking reads
        fd = os.open(out, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_CLOEXEC, 0o600)
        try:
            async with _zstd([zstd, "-q", "-3", "-c"], stdin=conn.fileno(), stdout=fd,
                             what="saving a snapshot") as helper:
                conn.close()  # zstd holds the stream now
                info = await _wait_migration(qmp, "saving a snapshot", helper)
        finally:
            os.close(fd)
    ram = info.get("ram")
    return int(ram.get("transferred", 0)) if isinstance(ram, dict) else 0


async def load_memory(qmp: QMPConnection, *, listen: Path, memory: Path, zstd: str = "zstd") -> None:
    """Feed ``memory`` (zstd) to a QEMU started with ``-incoming defer``; return once loaded.

    QEMU listens on ``listen`` (in the rig's own directory); the host connects
    and ``zstd -d`` writes the stream straight into the socket. The machine
    stays paused (the snapshot was taken stopped): the caller sends ``cont``.
    """
    await qmp.execute("migrate-incoming", {"uri": f"unix:{listen}"})
    conn = trio.socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    with conn:
        deadline = trio.current_time() + 10
        while True:
            try:
                await conn.connect(str(listen))
                break
            except (FileNotFoundError, ConnectionRefusedError) as exc:
                if trio.current_time() > deadline:
                    raise BackendError(f"restoring a snapshot: cannot reach QEMU's socket: {exc}") from exc
                await trio.sleep(0.002)
        os.set_blocking(conn.fileno(), True)
        fd = os.open(memory, os.O_RDONLY | os.O_CLOEXEC)
        try:
            async with _zstd([zstd, "-q", "-d", "-c"], stdin=fd, stdout=conn.fileno(),
                             what="restoring a snapshot") as helper:
                # zstd holds the stream now: when it ends (or fails), QEMU sees the end.
                conn.close()
                await _wait_migration(qmp, "restoring a snapshot", helper)
        finally:
            os.close(fd)

