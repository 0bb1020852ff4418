"""Where QEMU rigs keep their files, and the crash recovery that knows it.

``<dataDir>/rigs/smolvm/<rigId>/`` is a rig's private runtime directory
(sockets, pidless state; 0700, owned by the rig's uid) and
``<dataDir>/rigs/run/<rigId>.qcow2`` its disk overlay; snapshot builds use
``smolvm/snap_<key16>/`` with their pid in ``smolvm/snap_<key16>.pid`` (a
root-owned directory the QEMU uid cannot write, so the file cannot be forged);
a fork's frozen parent is ``forks/<parent>-<rand>/`` (RAM and a disk copy,
root's only) until its copies have restored.

:meth:`Layout.recover` is the one call the rig manager makes at start: it
kills what a crashed server left running (identified by pid *and* start time,
so a recycled pid is never killed), then removes every runtime file, since
at start nothing is live. Cleanup that fails is logged, never silent.
"""

from __future__ import annotations

import contextlib
import logging
import os
import signal
from collections.abc import AsyncIterator, Sequence
from contextlib import asynccontextmanager
from dataclasses import dataclass
from pathlib import Path

import trio

from netgate import cleanup
from rigd.backends.confine import Identity, UidPool, make_private_dir, make_shared_dir
from rigd.backends.procs import proc_alive
from rigd.backends.recipe import RigPaths

log = logging.getLogger("rigd.layout")


@dataclass(frozen=True, slots=True)
class LeftBehind:
    """A rig the store still calls live at start-up, and the QEMU it recorded."""

    rig_id: str
    pid: int | None
    pid_start_ticks: int | None


class Layout:
    def __init__(self, data_dir: Path) -> None:
        self.data_dir = data_dir
        rigs = data_dir / "rigs"
        self.state_dir = rigs / "smolvm"
        self.run_dir = rigs / "run"
        #: Frozen machines of ``rig.fork`` (root's only: QEMU never opens these files).
        self.forks_dir = rigs / "forks"
        for d in (rigs, self.state_dir, self.run_dir):
            make_shared_dir(d)
        self.forks_dir.mkdir(mode=0o700, exist_ok=True)

    def rig_paths(self, rig_id: str) -> RigPaths:
        return RigPaths(self.state_dir / rig_id, self.run_dir / f"{rig_id}.qcow2")

    def build_dir(self, key: str) -> tuple[Path, Path]:
        """A snapshot build's runtime directory and pid file (short: a Unix socket
        path must fit in 108 bytes, and rig directories are "rig_" + 24)."""
        rig_dir = self.state_dir / f"snap_{key[:16]}"
        return rig_dir, rig_dir.with_name(rig_dir.name + ".pid")

    @asynccontextmanager
    async def rig_files(self, rig_id: str, uids: UidPool) -> AsyncIterator[tuple[RigPaths, Identity]]:
        """A uid of the rig's own and its private directory, for the machine's life."""
        identity = uids.acquire()
        paths = self.rig_paths(rig_id)
        try:
            make_private_dir(paths.rig_dir, identity)
            yield paths, identity
        finally:
            with trio.CancelScope(shield=True):
                await trio.to_thread.run_sync(remove_files, paths)
                uids.release(identity)

    async def recover(self, left: Sequence[LeftBehind]) -> set[str]:
        """Settle what a previous server left; return the ids whose QEMU was still alive
        (and is now killed). Everything under the runtime directories is removed."""
        alive: set[str] = set()
        for rig in left:
            if rig.pid is not None and proc_alive(rig.pid, rig.pid_start_ticks):
                await kill_pid(rig.pid, rig.pid_start_ticks)
                alive.add(rig.rig_id)
            await trio.to_thread.run_sync(remove_files, self.rig_paths(rig.rig_id))
        await trio.to_thread.run_sync(self._recover_builds)
        await trio.to_thread.run_sync(self._remove_orphans)
        return alive

    def _recover_builds(self) -> None:
        """Kill snapshot-build QEMUs a crashed server left behind (pid *and* start time)."""
        for pidfile in sorted(self.state_dir.glob("snap_*.pid")):
            try:
                pid_s, ticks_s = pidfile.read_text().split()
                pid, ticks = int(pid_s), int(ticks_s)
            except (OSError, ValueError):
                pid, ticks = 0, 0
            if pid > 0 and proc_alive(pid, ticks):
                with contextlib.suppress(ProcessLookupError):
                    os.kill(pid, signal.SIGKILL)
                log.warning("killed a snapshot build left by a previous server", extra={"pid": pid})
            remove_tree(self.state_dir / pidfile.stem)
            unlink(pidfile)

    def _remove_orphans(self) -> None:
        """At start-up nothing is live: whatever runtime files or rig QEMUs remain
        (a crash between spawning QEMU and recording its pid) are orphans."""
        marker = f"{self.state_dir}/".encode()
        for entry in Path("/proc").iterdir():
            if not entry.name.isdigit():
                continue
            try:
                cmdline = (entry / "cmdline").read_bytes()
            except OSError:
                continue
            if b"qemu-system" in cmdline and marker in cmdline:
                with contextlib.suppress(ProcessLookupError):
                    os.kill(int(entry.name), signal.SIGKILL)
                log.warning("killed an orphan QEMU", extra={"pid": int(entry.name)})
        for folder in (self.state_dir, self.run_dir, self.forks_dir):
            if folder.is_dir():
                for child in folder.iterdir():
                    if child.is_dir():
                        remove_tree(child)
                    else:
                        unlink(child)


def remove_tree(path: Path) -> None:
    """Remove a directory tree; a failure is logged (with the path), not raised."""
    cleanup.remove_tree(path, log=log)


def unlink(path: Path) -> None:
    """Remove a file; a failure other than its absence is logged, not raised."""
    try:
        path.unlink(missing_ok=True)
    except OSError as exc:
        log.warning("cleanup failed", extra={"path": str(path), "error": str(exc)[:200]})


def remove_files(paths: RigPaths) -> None:
    remove_tree(paths.rig_dir)
    unlink(paths.overlay)


async def kill_pid(pid: int, ticks: int | None) -> None:
    """SIGTERM, then SIGKILL, a process that is not our child (its parent was a crashed server)."""
    for sig, wait_s in ((signal.SIGTERM, 3.0), (signal.SIGKILL, 5.0)):
        if not proc_alive(pid, ticks):
            return
        try:
            os.kill(pid, sig)
        except ProcessLookupError:
            return
        deadline = trio.current_time() + wait_s
        # Nothing to wait on but /proc.
        while trio.current_time() < deadline and proc_alive(pid, ticks):  # noqa: ASYNC110
            await trio.sleep(0.05)
    if proc_alive(pid, ticks):
        log.warning("a QEMU left by a previous server survived SIGKILL", extra={"pid": pid})
