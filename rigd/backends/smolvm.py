"""The microVM backend (``smolvm``): terminal rigs on QEMU's ``microvm`` machine.

How a rig comes up (each step is what ``phaseDetail`` says while it runs):

1. ``unpacking image`` — the pinned OCI image is unpacked once into a pack
   (``<dataDir>/rigs/smolvm-packs/<digest>-tools-v1/rootfs.img``); later rigs
   find it there (``checking image``).
2. ``creating disk overlay`` — a thin qcow2 overlay of the pack under
   ``<dataDir>/rigs/run/``, owned by the rig's own uid.
3. ``booting kernel`` — QEMU starts confined (see :mod:`rigd.backends.confine`)
   with QMP, the serial console and the agent channel on Unix sockets in
   ``<dataDir>/rigs/smolvm/<rigId>/``.
4. ``waiting for the guest agent`` — the host says ``hello`` until the agent on
   the tools disk answers (it also sets the guest clock).

Teardown escalates inside a shielded scope: QMP ``quit`` → SIGTERM → SIGKILL,
each with a deadline, then the runtime directory and overlay are removed.
"""

from __future__ import annotations

import base64
import contextlib
import logging
import os
import shutil
import signal
import subprocess
import time
from collections.abc import AsyncIterator, Callable, Mapping, Sequence
from contextlib import asynccontextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import trio

from rigd.backends.base import ExecResult, MachineInfo, MachineSpec
from rigd.backends.confine import Identity, UidPool, give, make_private_dir, make_shared_dir
from rigd.backends.guest_client import GuestConnection, iterate
from rigd.backends.microvm_argv import microvm_argv
from rigd.backends.procs import proc_start_ticks, resident_mb
from rigd.backends.qmp_client import QMPConnection
from rigd.backends.ring import Ring
from rigd.errors import BackendError, FieldError, GuestError, GuestRefused, RigdError
from rigd.images import TerminalAssets
from rigd.model import Accel, Backend
from rigd.protocols.guest import Stream


def timeouts_for(accel: Accel) -> tuple[float, float]:
    """(boot deadline, per-reply grace) in seconds; TCG is 10-50x slower.

    The grace is what a reply may take beyond the work's own time limit (the
    agent enforces an exec's timeout itself and answers at once).
    """
    if accel is Accel.TCG:
        return 180.0, 15.0
    return 60.0, 5.0


@dataclass(slots=True)
class SmolvmConfig:
    data_dir: Path
    accel: Accel
    assets: TerminalAssets
    qemu: str = "qemu-system-x86_64"
    qemu_img: str = "qemu-img"


class SmolvmBackend:
    name = Backend.SMOLVM

    def __init__(
        self,
        config: SmolvmConfig,
        *,
        ensure_pack: Callable[[Callable[[str], None]], Path],
        uids: UidPool | None = None,
    ) -> None:
        self.config = config
        self._ensure_pack = ensure_pack
        self._pack_lock = trio.Lock()
        self.uids = uids or UidPool()
        rigs = config.data_dir / "rigs"
        self.state_dir = rigs / "smolvm"
        self.run_dir = rigs / "run"
        for d in (rigs, self.state_dir, self.run_dir):
            make_shared_dir(d)

    async def pack(self, progress: Callable[[str], None]) -> Path:
        async with self._pack_lock:
            return await trio.to_thread.run_sync(self._ensure_pack, progress)

    @asynccontextmanager
    async def open_machine(
        self, spec: MachineSpec, progress: Callable[[str], None]
    ) -> AsyncIterator[SmolvmMachine]:
        log = logging.getLogger(f"rigd.rig.{spec.rig_id}")
        identity = self.uids.acquire()
        rig_dir = self.state_dir / spec.rig_id
        overlay = self.run_dir / f"{spec.rig_id}.qcow2"
        machine: SmolvmMachine | None = None
        try:
            rootfs = await self.pack(progress)
            progress("creating disk overlay")
            make_private_dir(rig_dir, identity)
            await _run_quiet(
                [self.config.qemu_img, "create", "-q", "-f", "qcow2", "-F", "raw",
                 "-b", str(rootfs), str(overlay)],
                what="creating the disk overlay",
            )
            give(overlay, identity, 0o600)
            async with trio.open_nursery() as nursery:
                machine = SmolvmMachine(
                    spec=spec, config=self.config, identity=identity, rig_dir=rig_dir,
                    overlay=overlay, log=log, nursery=nursery,
                )
                try:
                    progress("booting kernel")
                    await machine.boot(progress)
                    yield machine
                finally:
                    await machine.shutdown()
                    nursery.cancel_scope.cancel()
        finally:
            with trio.CancelScope(shield=True):
                await trio.to_thread.run_sync(_remove, rig_dir, overlay)
                self.uids.release(identity)


def _remove(rig_dir: Path, overlay: Path) -> None:
    shutil.rmtree(rig_dir, ignore_errors=True)
    overlay.unlink(missing_ok=True)


async def _run_quiet(argv: list[str], *, what: str) -> None:
    try:
        result = await trio.run_process(argv, capture_stdout=True, capture_stderr=True, check=False)
    except OSError as exc:
        raise BackendError(f"{what}: cannot run {argv[0]}: {exc.strerror}") from exc
    if result.returncode != 0:
        err = result.stderr.decode("utf-8", "replace").strip()[-500:]
        raise BackendError(f"{what} failed: {err}")


class SmolvmMachine:
    def __init__(
        self,
        *,
        spec: MachineSpec,
        config: SmolvmConfig,
        identity: Identity,
        rig_dir: Path,
        overlay: Path,
        log: logging.Logger,
        nursery: trio.Nursery,
    ) -> None:
        self.spec = spec
        self.config = config
        self.identity = identity
        self.rig_dir = rig_dir
        self.overlay = overlay
        self.log = log
        self._nursery = nursery
        self.console = Ring(64 * 1024)
        self.stderr = Ring(16 * 1024)
        self.proc: trio.Process | None = None
        self.qmp: QMPConnection | None = None
        self.guest: GuestConnection | None = None
        self._exited = trio.Event()
        self._shutting_down = False
        self.boot_deadline, self.grace = timeouts_for(config.accel)
        self.guest_kernel: str | None = None
        self.info = MachineInfo(
            backend=Backend.SMOLVM, accel=config.accel, pid=None, pid_start_ticks=None,
            image=config.assets.image_digest, confinement=identity.describe(),
            security_boundary=config.accel is not Accel.TCG,
        )

    # -- boot ---------------------------------------------------------------

    def argv(self) -> list[str]:
        assets = self.config.assets
        return microvm_argv(
            qemu=self.config.qemu, accel=str(self.config.accel),
            memory_mb=self.spec.memory_mb, vcpus=self.spec.vcpus,
            kernel=assets.kernel, initrd=assets.initrd, root_disk=self.overlay,
            tools_disk=assets.tools, qmp_socket=self.rig_dir / "qmp.sock",
            agent_socket=self.rig_dir / "agent.sock",
            console_socket=self.rig_dir / "console.sock",
        )

    async def boot(self, progress: Callable[[str], None]) -> None:
        argv = self.argv()
        ident = self.identity
        extra: dict[str, Any] = {}
        if ident.per_rig:
            extra = {"user": ident.uid, "group": ident.gid, "extra_groups": list(ident.extra_groups)}
        try:
            self.proc = await trio.lowlevel.open_process(
                argv, stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL,
                stderr=subprocess.PIPE, start_new_session=True, cwd=str(self.rig_dir), **extra,
            )
        except OSError as exc:
            raise BackendError(f"cannot start QEMU ({argv[0]}): {exc.strerror}") from exc
        self.info = MachineInfo(
            backend=self.info.backend, accel=self.info.accel, pid=self.proc.pid,
            pid_start_ticks=proc_start_ticks(self.proc.pid), image=self.info.image,
            confinement=self.info.confinement, security_boundary=self.info.security_boundary,
        )
        self.log.info("qemu started", extra={"pid": self.proc.pid})
        self._nursery.start_soon(self._watch_process)
        self._nursery.start_soon(self._pump_stderr)

        with trio.move_on_after(self.boot_deadline) as deadline:
            await self._wait_sockets()
            self.qmp = await QMPConnection.connect(self.rig_dir / "qmp.sock", log=self.log)
            await self._nursery.start(self.qmp.run)
            await self.qmp.handshake(timeout=30)
            await self._nursery.start(self._pump_console)
            stream = await trio.open_unix_socket(str(self.rig_dir / "agent.sock"))
            self.guest = GuestConnection(stream, log=self.log)
            await self._nursery.start(self.guest.run)
            progress("waiting for the guest agent")
            await self._hello()
        if deadline.cancelled_caught:
            raise BackendError(
                f"the guest agent did not come up within {int(self.boot_deadline)} s",
                console=self.console_tail(2048),
            )

    async def _wait_sockets(self) -> None:
        names = ("qmp.sock", "agent.sock", "console.sock")
        while not all((self.rig_dir / n).exists() for n in names):
            if self._exited.is_set():
                raise BackendError(f"QEMU exited while starting: {self._death_reason()}")
            await trio.sleep(0.01)

    async def _hello(self) -> None:
        """Say hello until the agent answers.

        The agent announces itself with a ``ready`` line when it opens its
        port; a hello sent before that may sit unread or be lost, so a ready
        line cuts the current attempt short and a fresh hello goes at once.
        """
        guest = self.guest
        assert guest is not None
        answer: list[dict[str, Any]] = []

        async def attempt(done: trio.CancelScope) -> None:
            with contextlib.suppress(GuestError):
                answer.append(await guest.request("hello", timeout=1.0, time=time.time()))
            done.cancel()

        async def on_ready(tick: trio.Event, done: trio.CancelScope) -> None:
            await tick.wait()
            done.cancel()

        while not answer:
            if self._exited.is_set():
                raise BackendError(f"QEMU exited during boot: {self._death_reason()}")
            if guest.closed:
                raise BackendError("the guest agent channel closed during boot")
            async with trio.open_nursery() as nursery:
                nursery.start_soon(attempt, nursery.cancel_scope)
                nursery.start_soon(on_ready, guest.ready_tick(), nursery.cancel_scope)
        kernel = answer[0].get("kernel")
        self.guest_kernel = kernel[:300] if isinstance(kernel, str) else None

    async def _watch_process(self) -> None:
        assert self.proc is not None
        await self.proc.wait()
        self._exited.set()
        if not self._shutting_down:
            self.log.warning("qemu exited", extra={"returncode": self.proc.returncode})

    async def _pump_stderr(self) -> None:
        assert self.proc is not None and self.proc.stderr is not None
        async with self.proc.stderr:
            while True:
                data = await self.proc.stderr.receive_some(4096)
                if not data:
                    return
                self.stderr.feed(data)

    async def _pump_console(self, *, task_status: trio.TaskStatus[None]) -> None:
        stream = await trio.open_unix_socket(str(self.rig_dir / "console.sock"))
        task_status.started()
        async with stream:
            while True:
                try:
                    data = await stream.receive_some(65536)
                except (trio.BrokenResourceError, trio.ClosedResourceError):
                    return
                if not data:
                    return
                self.console.feed(data)

    def _death_reason(self) -> str:
        code = None if self.proc is None else self.proc.returncode
        if code is not None and code < 0:
            try:
                what = f"killed by {signal.Signals(-code).name}"
            except ValueError:
                what = f"killed by signal {-code}"
        else:
            what = f"exit status {code}"
        err = self.stderr.tail(400).strip()
        return what + (f"; QEMU said: {err}" if err else "")

    # -- the Machine interface ----------------------------------------------

    async def wait_failed(self) -> str:
        await self._exited.wait()
        return f"QEMU {self._death_reason()}"

    def console_tail(self, max_bytes: int = 4096) -> str:
        return self.console.tail(max_bytes)

    async def perform(self, action: Any) -> dict[str, Any]:
        verb = getattr(action, "verb", "?")
        raise FieldError("action.action", f"a terminal rig answers only exec, not {verb}")

    async def park(self) -> None:
        if self.qmp is None:
            raise BackendError("the machine is not running")
        await self.qmp.execute("stop", timeout=self.grace)

    async def wake(self) -> None:
        if self.qmp is None:
            raise BackendError("the machine is not running")
        await self.qmp.execute("cont", timeout=self.grace)

    def resident_mb(self) -> int:
        return 0 if self.proc is None else resident_mb(self.proc.pid)

    def channel_stats(self) -> dict[str, int]:
        if self.guest is None:
            return {}
        s = self.guest.stats
        return {"garbageEvents": s.garbage_events, "garbageBytes": s.garbage_bytes,
                "orphanReplies": s.orphan_replies, "agentRestarts": max(0, s.ready_lines - 1)}

    def _guest(self) -> GuestConnection:
        if self.guest is None or self.guest.closed or self._exited.is_set():
            raise BackendError("the machine is not running")
        return self.guest

    async def exec(
        self,
        argv: Sequence[str],
        *,
        cwd: str | None,
        env: Mapping[str, str] | None,
        stdin: bytes | None,
        timeout_s: float,
        max_output: int,
    ) -> ExecResult:
        guest = self._guest()
        out = bytearray()
        err = bytearray()
        trunc = {1: False, 2: False}

        def on_stream(event: Stream) -> None:
            if event.name != "out":
                return
            fd = event.body.get("fd")
            buf = out if fd == 1 else err if fd == 2 else None
            if buf is None or event.data is None:
                return
            room = max_output - len(buf)
            if len(event.data) > room:
                trunc[1 if buf is out else 2] = True
            if room > 0:
                buf += event.data[:room]

        fields: dict[str, Any] = {
            "argv": list(argv), "timeoutMs": int(timeout_s * 1000), "maxOutput": max_output,
        }
        if cwd is not None:
            fields["cwd"] = cwd
        if env:
            fields["env"] = dict(env)
        if stdin is not None:
            fields["stdin"] = base64.b64encode(stdin).decode()
        try:
            body = await guest.request(
                "exec", timeout=timeout_s + self.grace, on_stream=on_stream, **fields
            )
        except GuestRefused as exc:
            # The program or directory does not exist in the guest: the
            # caller's argument, so name it.
            field = "action.cwd" if exc.reason.startswith("cwd:") else "action.argv"
            raise FieldError(field, f"the rig cannot run this: {exc.reason}") from exc
        truncated = body.get("truncated")
        truncated = truncated if isinstance(truncated, dict) else {}
        return ExecResult(
            exit_code=_int_or_none(body.get("exitCode")),
            signal=_int_or_none(body.get("signal")),
            timed_out=body.get("timedOut") is True,
            stdout=bytes(out),
            stderr=bytes(err),
            stdout_truncated=trunc[1] or truncated.get("stdout") is True,
            stderr_truncated=trunc[2] or truncated.get("stderr") is True,
            duration_ms=_int_or_none(body.get("durationMs")) or 0,
        )

    @asynccontextmanager
    async def open_pty(self, *, cols: int, rows: int) -> AsyncIterator[GuestPty]:
        guest = self._guest()
        body = await guest.request("pty_open", timeout=self.grace, cols=cols, rows=rows)
        pty = _int_or_none(body.get("pty"))
        if pty is None:
            raise GuestError("guest agent answered pty_open without a pty handle")
        session = GuestPty(guest, pty, self.grace)
        try:
            yield session
        finally:
            await session.aclose()

    # -- teardown -------------------------------------------------------------

    async def shutdown(self) -> None:
        """Stop QEMU for good: quit → SIGTERM → SIGKILL, each with a deadline."""
        self._shutting_down = True
        with trio.CancelScope(shield=True):
            if self.guest is not None:
                await self.guest.aclose()
            proc = self.proc
            if proc is None:
                return
            if proc.returncode is None and self.qmp is not None:
                with trio.move_on_after(3):
                    with contextlib.suppress(BackendError):
                        await self.qmp.send_only("quit")
                    await proc.wait()
            for sig, wait_s in ((signal.SIGTERM, 3.0), (signal.SIGKILL, 10.0)):
                if proc.returncode is not None:
                    break
                with contextlib.suppress(ProcessLookupError):
                    os.kill(proc.pid, sig)
                with trio.move_on_after(wait_s):
                    await proc.wait()
            if self.qmp is not None:
                await self.qmp.aclose()
            if proc.returncode is None:
                raise RigdError(f"QEMU pid {proc.pid} survived SIGKILL")


class GuestPty:
    def __init__(self, guest: GuestConnection, pty: int, grace: float) -> None:
        self._guest = guest
        self.pty = pty
        self._grace = grace
        self._out = guest.open_pty_route(pty)
        self._closed = False

    async def write(self, data: bytes) -> None:
        await self._guest.request(
            "pty_in", timeout=self._grace, pty=self.pty, data=base64.b64encode(data).decode()
        )

    async def resize(self, cols: int, rows: int) -> None:
        await self._guest.request("pty_resize", timeout=self._grace, pty=self.pty, cols=cols, rows=rows)

    def output(self) -> AsyncIterator[bytes]:
        return iterate(self._out)

    @property
    def exit_status(self) -> dict[str, int | None] | None:
        return self._guest.pty_exit(self.pty)

    async def aclose(self) -> None:
        if self._closed:
            return
        self._closed = True
        with (
            trio.CancelScope(shield=True),
            trio.move_on_after(self._grace),
            contextlib.suppress(GuestError),
        ):
            await self._guest.request("pty_close", timeout=self._grace, pty=self.pty)
        self._guest.drop_pty_route(self.pty)


def _int_or_none(value: object) -> int | None:
    if isinstance(value, int) and not isinstance(value, bool) and -(2**63) <= value < 2**63:
        return value
    return None
