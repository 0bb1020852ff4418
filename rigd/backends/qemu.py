"""One QEMU process and everything that belongs to it: :class:`QemuMachine`.

A machine owns its QEMU (started confined as the rig's uid, see
:mod:`rigd.backends.confine`), its QMP connection, its guest-agent channel,
its serial console and QEMU's stderr, the hand-off of its egress gate, its
own nursery (every reader and pump runs there) and its teardown. What a
surface adds — the argv, the image, readiness beyond the agent's hello, the
verbs — comes from the machine's :class:`~rigd.backends.recipe.BootRecipe`
and the :class:`~rigd.backends.recipe.Driver` the recipe makes for it.

Use :func:`open_qemu_machine`: entering makes the machine (nothing runs yet;
call :meth:`QemuMachine.boot` or :meth:`QemuMachine.restore`), leaving tears
it down — QMP ``quit`` → SIGTERM → SIGKILL, each with a deadline, inside a
shielded scope — and writes its evidence (console, QMP transcript, stderr)
when the operator asked for it. An error from the caller's body leaves
unwrapped; an error from one of the machine's own tasks leaves as the
nursery's group, for the rig's failure boundary to read.

Why one module of this size: :class:`QemuMachine` owns one QEMU process and every
channel into it (QMP, the agent, the console, the lanes); its start, watch and teardown
share state that must not be split across modules.
"""

from __future__ import annotations

import base64
import contextlib
import dataclasses
import functools
import logging
import os
import shlex
import signal
import subprocess
import time
from collections.abc import AsyncIterator, Awaitable, Callable, Mapping, Sequence
from contextlib import asynccontextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

import trio

from netgate.gateway import close_fd
from netgate.policy import Policy
from netgate.usermode import SOCKET_NAME, UserGate
from rigd.backends.base import ExecResult, Frame, MachineInfo, MachineSpec, VolumeMount
from rigd.backends.confine import Identity, give
from rigd.backends.evidence import evidence_dir, write_evidence
from rigd.backends.gates import USER_SANDBOX, NetGate, NetworkConfig
from rigd.backends.guest_client import GuestConnection, iterate
from rigd.backends.lanes import DropReceiver, GuestLanes
from rigd.backends.microvm_argv import (
    PORTS_SOCKET,
    SANDBOX,
    default_tcg_threads,
    volume_argv,
    volume_serial,
)
from rigd.backends.procs import proc_start_ticks, resident_mb
from rigd.backends.qmp_client import QMPConnection
from rigd.backends.recipe import BootRecipe, Driver, ProfileTaker, RigPaths
from rigd.backends.ring import Ring
from rigd.backends.snapshot import (
    DISK_FILE,
    MEMORY_FILE,
    Snapshot,
    copy_disk,
    load_memory,
    rig_mac,
    rig_machine_id,
    save_memory,
    warm_starts_enabled,
)
from rigd.errors import BackendError, FieldError, GuestError, GuestRefused, RigdError
from rigd.frames import Changes, Lane, LiveScreen
from rigd.model import Accel, Surface
from rigd.nurseries import body_nursery
from rigd.protocols.guest import Stream

if TYPE_CHECKING:
    from rigd.browser.profiles import ProfileState
    from rigd.protocols.input import Step
    from rigd.verbs import Action


def timeouts_for(accel: Accel) -> tuple[float, float]:
    """(boot deadline, per-reply grace) in seconds; TCG is 10-50x slower.

    The grace is what a reply may take beyond the work's own time limit (the
    agent enforces an exec's timeout itself and answers at once).
    """
    if accel is Accel.TCG:
        return 180.0, 15.0
    return 60.0, 5.0


#: How long a warm start may take before the rig boots cold instead (it
#: normally takes well under a second, also under TCG).
RESTORE_DEADLINE_S = 30.0
#: How long a volume's filesystem check at attach, and its flush and unmount at close, may take.
VOLUME_CHECK_S = 120.0
VOLUME_UNMOUNT_S = 20.0


@dataclass(slots=True)
class QemuConfig:
    """What every QEMU machine of a server shares."""

    data_dir: Path
    #: The server's accelerator (a computer rig may name another through its backend).
    accel: Accel
    qemu: str = "qemu-system-x86_64"
    qemu_img: str = "qemu-img"
    zstd: str = "zstd"
    e2fsck: str = "e2fsck"
    #: Restore rigs from memory snapshots (``RIGD_WARM_STARTS=0`` turns it off).
    warm_starts: bool = dataclasses.field(default_factory=warm_starts_enabled)
    #: Give every rig a NIC behind its own egress gateway (None: no network at all).
    network: NetworkConfig | None = None
    #: TCG's vCPU threading ("single" | "multi"; ``rigd serve --tcg-threads``), for TCG rigs.
    tcg_threads: str = dataclasses.field(default_factory=default_tcg_threads)


@asynccontextmanager
async def open_qemu_machine(
    *, spec: MachineSpec, recipe: BootRecipe, config: QemuConfig, identity: Identity,
    paths: RigPaths, gateway: NetGate | None, log: logging.Logger,
    on_started: Callable[[int, int | None], None] | None = None,
) -> AsyncIterator[QemuMachine]:
    """A machine with its own nursery, torn down (and its evidence kept) on the way out."""
    async with body_nursery() as nursery:
        machine = QemuMachine(spec=spec, recipe=recipe, config=config, identity=identity,
                              paths=paths, gateway=gateway, log=log, nursery=nursery)
        machine.on_started = on_started
        try:
            yield machine
        finally:
            await machine.shutdown()


async def run_quiet(argv: list[str], *, what: str) -> None:
    try:
        result = await trio.run_process(argv, capture_stdout=True, capture_stderr=True, check=False)
    except OSError as exc:
        raise BackendError(f"{what}: cannot run {argv[0]}: {exc.strerror}") from exc
    if result.returncode != 0:
        err = result.stderr.decode("utf-8", "replace").strip()[-500:]
        raise BackendError(f"{what} failed: {err}")


async def make_overlay(qemu_img: str, overlay: Path, backing: Path, fmt: str, identity: Identity, *,
                       what: str = "creating the disk overlay") -> None:
    """A thin qcow2 over ``backing``, owned by the rig's uid."""
    await run_quiet(
        [qemu_img, "create", "-q", "-f", "qcow2", "-F", fmt,
         "-b", str(await trio.Path(backing).resolve()), str(overlay)],
        what=what,
    )
    give(overlay, identity, 0o600)


#: Why a machine without an X session has no clipboard lane, by surface.
NO_CLIPBOARD = {
    Surface.TERMINAL: "a terminal rig has no clipboard (it has no X session); use the file lane",
    Surface.BROWSER: "a browser rig's clipboard is its page's: use browser_use clipboard_read and "
                     "clipboard_write (on https pages), or the file lane",
}


class QemuMachine:
    def __init__(
        self,
        *,
        spec: MachineSpec,
        recipe: BootRecipe,
        config: QemuConfig,
        identity: Identity,
        paths: RigPaths,
        log: logging.Logger,
        nursery: trio.Nursery,
        gateway: NetGate | None = None,
    ) -> None:
        self.spec = spec
        self.recipe = recipe
        self.gateway = gateway
        self.config = config
        self.identity = identity
        self.paths = paths
        self.log = log
        self._nursery = nursery
        self.console = Ring(64 * 1024)
        self.stderr = Ring(16 * 1024)
        self.proc: trio.Process | None = None
        self.qmp: QMPConnection | None = None
        self.guest: GuestConnection | None = None
        self._exited = trio.Event()
        self._stderr_done = trio.Event()
        self._shutting_down = False
        #: Started to restore a snapshot (``-incoming``), not to boot.
        self._incoming = False
        #: The volumes were flushed and unmounted (before a close).
        self._volumes_released = False
        who = recipe.identity(spec)
        self.accel = who.accel
        _boot, self.grace = timeouts_for(who.accel)
        self.boot_deadline = recipe.boot_deadline_s(spec)
        self.guest_kernel: str | None = None
        #: The agent's last ``hello`` answer (protocol, features, display).
        self.hello: dict[str, Any] = {}
        #: Called with (pid, start ticks) as soon as QEMU runs (snapshot builds record it).
        self.on_started: Callable[[int, int | None], None] | None = None
        confinement = identity.describe()
        confinement["seccomp"] = USER_SANDBOX if isinstance(gateway, UserGate) else SANDBOX
        self.info = MachineInfo(
            backend=who.backend, accel=who.accel, pid=None, pid_start_ticks=None,
            image=who.image, confinement=confinement, security_boundary=who.accel is not Accel.TCG,
        )
        self.driver: Driver = recipe.driver(self)

    @property
    def rig_dir(self) -> Path:
        return self.paths.rig_dir

    @property
    def shutting_down(self) -> bool:
        """Whether the machine is being torn down (a driver's lost connection is then expected)."""
        return self._shutting_down

    async def start_task(self, fn: Callable[..., Awaitable[Any]], *args: Any) -> Any:
        """Start a driver's long-lived task in the machine's nursery (``nursery.start``): what it
        raises fails the machine, and the machine's teardown cancels it."""
        return await self._nursery.start(fn, *args)

    # -- boot ---------------------------------------------------------------

    def argv(self, *, incoming: bool = False, tap_fd: int | None = None,
             volume_fds: Sequence[Sequence[int]] = ()) -> list[str]:
        argv = self.recipe.argv(self.spec, self.paths, mac=rig_mac(self.spec.rig_id),
                                incoming=incoming, tap_fd=tap_fd)
        if self.spec.volumes:
            argv += volume_argv([v.read_only for v in self.spec.volumes], volume_fds,
                                bus=self.recipe.volume_bus)
        return argv

    async def _open_volumes(self) -> list[list[int]]:
        """Open each volume for QEMU (the fds it gets). A writer's file is the rig's uid's while
        attached, and its filesystem is checked as that uid first (``e2fsck -p`` on the fd):
        what a guest wrote is parsed by no privileged process. A filesystem with errors it
        cannot mend fails the open naming the volume. A reader's is checked by the guest
        kernel at its read-only mount."""
        groups: list[list[int]] = []
        try:
            for vol in self.spec.volumes:
                group: list[int] = []
                groups.append(group)
                for mode in ((os.O_RDONLY,) if vol.read_only else (os.O_RDWR, os.O_RDONLY)):
                    try:
                        group.append(os.open(vol.image, mode | os.O_CLOEXEC))
                    except OSError as exc:
                        raise BackendError(f"volume {vol.name}: cannot open its disk: "
                                           f"{exc.strerror}") from exc
                if not vol.read_only:  # (a reader's disk is the kernel's to check, read-only, at mount)
                    if self.identity.per_rig:
                        os.fchown(group[0], self.identity.uid, self.identity.gid)
                    await self._check_volume(vol, group[0])
        except BaseException:
            for fd in (fd for g in groups for fd in g):
                close_fd(fd)
            raise
        return groups

    async def _check_volume(self, vol: VolumeMount, fd: int) -> None:
        ident = self.identity
        extra: dict[str, Any] = {}
        if ident.per_rig:
            extra = {"user": ident.uid, "group": ident.gid, "extra_groups": []}
        argv = [self.config.e2fsck, "-p", f"/proc/self/fd/{fd}"]
        try:
            with trio.fail_after(VOLUME_CHECK_S):
                result = await trio.run_process(argv, capture_stdout=True, capture_stderr=True, check=False,
                                                pass_fds=(fd,), **extra)
        except OSError as exc:
            raise BackendError(f"volume {vol.name}: cannot run {argv[0]}: {exc.strerror}") from exc
        except trio.TooSlowError:
            raise BackendError(f"volume {vol.name}: checking its filesystem took over "
                               f"{VOLUME_CHECK_S:.0f} s") from None
        said = (result.stdout + result.stderr).decode(errors="replace").strip()[-300:]
        # e2fsck: 0 clean, 1 errors corrected, 2 corrected (reboot: not ours), 4+ left or failed.
        if result.returncode >= 4:
            raise BackendError(f"volume {vol.name}: its filesystem has errors e2fsck did not mend "
                               f"(exit {result.returncode}): {said}")
        if result.returncode in (1, 2):
            self.log.warning("volume filesystem mended", extra={"volume": vol.name, "e2fsck": said})

    async def _mount_volumes(self) -> None:
        """Mount each volume at its path in the guest (the tools disk's busybox: any image)."""
        for i, vol in enumerate(self.spec.volumes):
            serial = volume_serial(i)
            script = (
                "bb=/.rigd/bin/busybox; dev=; for d in /sys/block/vd*; do "
                f"[ \"$($bb cat $d/serial 2>/dev/null)\" = {serial} ] && dev=/dev/${{d##*/}}; done; "
                f"[ -n \"$dev\" ] || {{ echo 'no disk with serial {serial}' >&2; exit 3; }}; "
                f"$bb mkdir -p {shlex.quote(vol.path)} && "
                f"$bb mount -t ext4 -o {'ro' if vol.read_only else 'rw'},nodev,nosuid \"$dev\" "
                f"{shlex.quote(vol.path)}"
            )
            owner = self.recipe.volume_owner
            if owner is not None and not vol.read_only:
                # The session user's to write (its top directory only: what is inside stays whose it is).
                script += f" && $bb chown {shlex.quote(owner)}: {shlex.quote(vol.path)}"
            result = await self.exec(["/.rigd/bin/busybox", "sh", "-c", script], cwd=None, env=None,
                                     stdin=None, timeout_s=60, max_output=4096)
            if result.exit_code != 0:
                err = result.stderr.decode(errors="replace").strip()[-300:]
                hint = ("; its journal needs a replay a reader cannot make: attach it read-write once"
                        if vol.read_only and "Read-only" in err else "")
                raise BackendError(f"volume {vol.name}: mounting it at {vol.path} failed "
                                   f"(exit {result.exit_code}): {err}{hint}")

    async def quiesce(self) -> None:
        if self.spec.volumes and not self._volumes_released:
            await self._unmount_volumes()

    async def _unmount_volumes(self) -> None:
        """Flush and unmount the volumes before QEMU quits (a quit is a power cut otherwise)."""
        if self.guest is None or self.guest.closed:
            return
        self._volumes_released = True
        paths = " ".join(shlex.quote(v.path) for v in reversed(self.spec.volumes))
        with trio.move_on_after(VOLUME_UNMOUNT_S):
            with contextlib.suppress(RigdError):
                await self.exec(["/.rigd/bin/busybox", "sh", "-c",
                                 f"/.rigd/bin/busybox sync; for p in {paths}; do "
                                 "/.rigd/bin/busybox umount \"$p\" || /.rigd/bin/busybox sync; done"],
                                cwd=None, env=None, stdin=None, timeout_s=VOLUME_UNMOUNT_S,
                                max_output=4096)

    def _return_volumes(self) -> None:
        """A writer's volume is root's again once QEMU is gone (a reader's never left root)."""
        if not self.identity.per_rig:
            return
        for vol in self.spec.volumes:
            if vol.read_only:
                continue
            with contextlib.suppress(OSError):
                os.chown(vol.image, 0, 0)

    async def _start_qemu(self, *, incoming: bool = False) -> None:
        ident = self.identity
        extra: dict[str, Any] = {}
        if ident.per_rig:
            extra = {"user": ident.uid, "group": ident.gid, "extra_groups": list(ident.extra_groups)}
        # The gateway makes the tap inside its namespace; QEMU only gets the fd. In user
        # mode QEMU's relay helpers hand connections over on a socket in the rig's directory.
        tap_fd = None
        if isinstance(self.gateway, UserGate):
            await self.gateway.listen(self.rig_dir / SOCKET_NAME, owner_uid=ident.uid)
        elif self.gateway is not None:
            tap_fd = await self.gateway.open_tap_fd()
        volume_fds: list[list[int]] = []
        try:
            volume_fds = await self._open_volumes()
            argv = self.argv(incoming=incoming, tap_fd=tap_fd, volume_fds=volume_fds)
            self.proc = await trio.lowlevel.open_process(
                argv, stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL,
                stderr=subprocess.PIPE, start_new_session=True, cwd=str(self.rig_dir),
                pass_fds=(*((tap_fd,) if tap_fd is not None else ()),
                          *(fd for g in volume_fds for fd in g)),
                **extra,
            )
        except OSError as exc:
            raise BackendError(f"cannot start QEMU ({self.config.qemu}): {exc.strerror}") from exc
        finally:
            if tap_fd is not None:
                close_fd(tap_fd)
            for fd in (fd for g in volume_fds for fd in g):
                close_fd(fd)
        self.info = dataclasses.replace(
            self.info, pid=self.proc.pid, pid_start_ticks=proc_start_ticks(self.proc.pid)
        )
        self.log.info("qemu started", extra={"pid": self.proc.pid})
        if self.on_started is not None:
            self.on_started(self.proc.pid, self.info.pid_start_ticks)
        self._nursery.start_soon(self._watch_process)
        self._nursery.start_soon(self._pump_stderr)

    async def _connect(self) -> None:
        """QMP (negotiated), the console pump and the agent channel."""
        await self._wait_sockets()
        self.qmp = await QMPConnection.connect(self.paths.qmp, log=self.log)
        await self._nursery.start(self.qmp.run)
        await self.qmp.handshake(timeout=30)
        await self._nursery.start(self._pump_console)
        stream = await trio.open_unix_socket(str(self.paths.agent))
        self.guest = GuestConnection(stream, log=self.log)
        await self._nursery.start(self.guest.run)

    async def boot(self, progress: Callable[[str], None], *, personalize: bool = True,
                   surface: bool = True) -> None:
        """Cold boot: the kernel starts from scratch; returns when the surface is ready
        (``surface=False``: once the agent answers, for a standby snapshot)."""
        started = trio.current_time()
        await self._start_qemu()
        with trio.move_on_after(self.boot_deadline) as deadline:
            await self._connect()
            progress("waiting for the guest agent")
            await self._hello()
            if personalize:
                await self._personalize(warm=False)
            if self.spec.volumes:
                await self._mount_volumes()
        if deadline.cancelled_caught:
            raise BackendError(
                f"the guest agent did not come up within {int(self.boot_deadline)} s",
                console=self.console_tail(2048),
            )
        if not surface:
            return
        left = self.boot_deadline - (trio.current_time() - started)
        await self.driver.ready(progress, warm=False, left_s=left)

    async def restore(self, progress: Callable[[str], None], snapshot: Snapshot) -> None:
        """Warm start: QEMU waits for a migration stream; the host feeds it the snapshot."""
        self._incoming = True
        await self._start_qemu(incoming=True)
        try:
            with trio.move_on_after(RESTORE_DEADLINE_S) as deadline:
                await self._restore(progress, snapshot)
        except BackendError as exc:
            # QEMU exits when it cannot load a stream; its stderr says why.
            with trio.move_on_after(1):
                await self._exited.wait()
                await self._stderr_done.wait()
            if self._exited.is_set():
                raise BackendError(f"QEMU exited while restoring: {self._death_reason()}") from exc
            raise
        if deadline.cancelled_caught:
            raise BackendError(f"restoring the snapshot took over {int(RESTORE_DEADLINE_S)} s")
        if self._exited.is_set():
            raise BackendError(f"QEMU exited while restoring: {self._death_reason()}")
        self.info = dataclasses.replace(self.info, boot="warm")
        # From a standby point the surface starts as after a cold boot (``warm`` tells a driver
        # that its surface is already running).
        await self.driver.ready(progress, warm=not self.recipe.snapshot_at_hello, left_s=self.boot_deadline)

    async def _restore(self, progress: Callable[[str], None], snapshot: Snapshot) -> None:
        await self._connect()
        assert self.qmp is not None
        t0 = time.monotonic()
        await load_memory(self.qmp, listen=self.rig_dir / "migrate.sock", memory=snapshot.memory,
                          zstd=self.config.zstd)
        loaded_s = time.monotonic() - t0
        await self.qmp.execute("cont", timeout=self.grace)
        progress("waiting for the guest agent")
        hello = await self._hello()
        await self._personalize(warm=True)
        self.log.info("restored", extra={
            "snapshot": snapshot.key, "load_s": round(loaded_s, 3),
            "clock_skew_s": hello.get("clockSkewS"), "clock_set": hello.get("clockSet"),
        })

    async def _personalize(self, *, warm: bool) -> None:
        """Give the guest its own machine-id, entropy and MAC (a clone shares the
        snapshot's), and its gateway's CA when the broker may intercept TLS."""
        guest = self.guest
        assert guest is not None
        if self.gateway is not None and self.gateway.ca_pem is not None:
            await self._trust_ca(self.gateway.ca_pem)
        rig_id = self.spec.rig_id
        try:
            body = await guest.request(
                "reseed", timeout=self.grace, machineId=rig_machine_id(rig_id),
                entropy=base64.b64encode(os.urandom(64)).decode(), mac=rig_mac(rig_id),
            )
        except GuestError as exc:
            if warm:
                raise BackendError(f"the restored guest could not be made unique: {exc.message}") from exc
            self.log.warning("reseed failed", extra={"reason": exc.message[:200]})
            return
        problems = [f"{k}: {v}" for k, v in body.items() if k.endswith("Error")]
        # An image without /etc has no machine-id to share; a failed write, or an
        # RNG left as the snapshot had it, would leave this clone a twin.
        if warm and (not body.get("crngReseeded") or "machineIdError" in body):
            raise BackendError("the restored guest could not be made unique: " + ("; ".join(problems) or
                                                                                  "the RNG was not reseeded"))
        if problems:
            self.log.warning("reseed incomplete", extra={"reason": "; ".join(problems)[:300]})

    async def _trust_ca(self, pem: str) -> None:
        """Install the rig's broker CA in the guest's trust store (only that CA;
        it signs leaves only for the hosts whose secrets the gateway injects)."""
        # Not update-ca-certificates: it rehashes every CA in the image, one
        # openssl process each (~30-60 s under TCG, measured), which pushed a
        # brokered rig's restore past its deadline. The bundle is what curl,
        # Python and OpenSSL read; the hash link serves tools that use the
        # directory; a later update-ca-certificates keeps the CA (it lives in
        # /usr/local/share/ca-certificates).
        crt = "/usr/local/share/ca-certificates/rigd-gateway.crt"
        script = (
            f"mkdir -p /usr/local/share/ca-certificates /etc/ssl/certs && cat > {crt} && "
            f"cat {crt} >> /etc/ssl/certs/ca-certificates.crt && "
            f"{{ h=$(openssl x509 -hash -noout -in {crt} 2>/dev/null) && "
            f"ln -sf {crt} /etc/ssl/certs/$h.0 || true; }}"
        )
        result = await self.exec(["/bin/sh", "-c", script], cwd=None, env=None,
                                 stdin=pem.encode(), timeout_s=60, max_output=4096)
        if result.exit_code != 0:
            self.log.warning("could not install the gateway CA in the guest",
                             extra={"stderr": result.stderr[-200:].decode(errors="replace")})

    def set_egress(self, policy: Policy) -> None:
        if self.gateway is None:
            raise BackendError("this rig has no network (the server runs with --network none)")
        self.gateway.set_allowlist(policy)

    def network_info(self) -> dict[str, Any]:
        if self.gateway is None:
            return {"mode": "none"}
        if isinstance(self.gateway, UserGate):
            return {"mode": "user", "allow": list(self.gateway.policy.allow),
                    "brokered": self.gateway.ca_pem is not None, **self.gateway.describe()}
        return {"mode": "gateway", "allow": list(self.gateway.policy.allow),
                "brokered": self.gateway.ca_pem is not None}

    async def save(self, out: Path) -> int:
        """Stop the machine and write its state to ``out``; return the bytes QEMU sent.

        The guest syncs its disks first, so the snapshot's disk holds what its
        page cache says; the agent channel stays connected, so the restored
        agent is blocked in a read and answers the first hello at once.
        """
        guest, qmp = self.guest, self.qmp
        assert guest is not None and qmp is not None
        await guest.request("exec", timeout=30 + self.grace, argv=["sync"], timeoutMs=30_000)
        await qmp.execute("stop", timeout=self.grace)
        with trio.fail_after(120):
            return await save_memory(qmp, listen=self.rig_dir / "save.sock", owner=self.identity,
                                     out=out, zstd=self.config.zstd)

    async def freeze(self, into: Path) -> tuple[float, int]:
        """Stop the vCPUs, write the RAM to ``into``/memory.zst while the overlay is copied to
        ``into``/disk.qcow2, resume; return (seconds paused, RAM bytes QEMU sent).

        A stopped QEMU has drained and flushed its disks (``stop`` does both), so the copy is
        the disk the saved RAM describes; no guest ``sync`` is needed, as for a migration.
        ``cont`` after a completed migration takes the disks back. The guest clock stood
        still meanwhile: a ``hello`` sets it again.
        """
        qmp, guest = self.qmp, self.guest
        if qmp is None or guest is None:
            raise BackendError("the machine is not running")
        t0 = time.monotonic()
        sent, saved = 0, False
        await qmp.execute("stop", timeout=self.grace)
        try:
            async with trio.open_nursery() as nursery:
                nursery.start_soon(functools.partial(
                    trio.to_thread.run_sync, copy_disk, self.paths.overlay, into / DISK_FILE))
                with trio.fail_after(120):
                    sent = await save_memory(qmp, listen=self.rig_dir / "save.sock", owner=self.identity,
                                             out=into / MEMORY_FILE, zstd=self.config.zstd)
            saved = True
        finally:
            with trio.CancelScope(shield=True):
                if not saved:  # a migration still running would keep the disks
                    with contextlib.suppress(BackendError):
                        await qmp.execute("migrate_cancel", timeout=self.grace)
                await qmp.execute("cont", timeout=self.grace)
        paused = time.monotonic() - t0
        with contextlib.suppress(GuestError):
            await guest.request("hello", timeout=self.grace, time=time.time())
        return paused, sent

    async def _wait_sockets(self) -> None:
        paths = self.paths
        while not all(p.exists() for p in (paths.qmp, paths.agent, paths.console)):
            if self._exited.is_set():
                raise BackendError(f"QEMU exited while starting: {self._death_reason()}")
            await trio.sleep(0.01)

    async def _hello(self) -> dict[str, Any]:
        """Say hello until the agent answers; return its answer.

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
        self.hello = answer[0]
        kernel = answer[0].get("kernel")
        self.guest_kernel = kernel[:300] if isinstance(kernel, str) else None
        return answer[0]

    async def _watch_process(self) -> None:
        assert self.proc is not None
        await self.proc.wait()
        self._exited.set()
        if not self._shutting_down:
            self.log.warning("qemu exited", extra={"returncode": self.proc.returncode})

    async def _pump_stderr(self) -> None:
        assert self.proc is not None and self.proc.stderr is not None
        try:
            async with self.proc.stderr:
                while True:
                    data = await self.proc.stderr.receive_some(4096)
                    if not data:
                        return
                    self.stderr.feed(data)
        finally:
            self._stderr_done.set()

    async def _pump_console(self, *, task_status: trio.TaskStatus[None]) -> None:
        stream = await trio.open_unix_socket(str(self.paths.console))
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

    @property
    def display(self) -> tuple[int, int] | None:
        return self.driver.display

    async def perform(self, action: Action) -> dict[str, Any]:
        return await self.driver.perform(action)

    async def take_profile(self, owner: str, name: str) -> None:
        if not isinstance(self.driver, ProfileTaker):
            raise FieldError("profile", f"a {self.recipe.surface} rig keeps no browser profile")
        await self.driver.take_profile(owner, name)

    async def browser_state(self) -> ProfileState:
        if not isinstance(self.driver, ProfileTaker):
            raise FieldError("rigId", f"a {self.recipe.surface} rig has no browser engine")
        return await self.driver.browser_state()

    async def still(self, *, max_w: int, max_h: int, fmt: str = "jpeg", quality: int = 75,
                    mark_cursor: bool = True) -> Frame:
        return await self.driver.still(max_w=max_w, max_h=max_h, fmt=fmt, quality=quality,
                                       mark_cursor=mark_cursor)

    def open_changes(self) -> contextlib.AbstractAsyncContextManager[Changes | None]:
        """The live view's change notices (:class:`rigd.frames.LiveScreen`); None: poll."""
        if isinstance(self.driver, LiveScreen):
            return self.driver.open_changes()
        return _no_changes()

    async def live_still(self, *, max_w: int, max_h: int, quality: int) -> tuple[Frame, Lane]:
        """A live-view still from the driver's fastest lane (its only one, if it has no choice)."""
        if isinstance(self.driver, LiveScreen):
            return await self.driver.live_still(max_w=max_w, max_h=max_h, quality=quality)
        frame = await self.still(max_w=max_w, max_h=max_h, quality=quality)
        return frame, Lane(frame.source, "the machine's only lane", {})

    async def send_input(self, steps: Sequence[Step]) -> None:
        await self.driver.send_input(steps)

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

    def port_channel(self) -> Path | None:
        if self.recipe.surface is not Surface.TERMINAL:
            return None
        return self.rig_dir / PORTS_SOCKET

    def lanes(self) -> GuestLanes:
        feats = self.hello.get("features")
        features = frozenset(f for f in feats if isinstance(f, str)) if isinstance(feats, list) \
            else frozenset[str]()
        receiver = self.driver if isinstance(self.driver, DropReceiver) else None
        return GuestLanes(self.channel, lambda: features, self.driver.drop_target,
                          grace=self.grace, screen=self.recipe.surface is Surface.COMPUTER,
                          no_clipboard=NO_CLIPBOARD.get(self.recipe.surface, NO_CLIPBOARD[Surface.TERMINAL]),
                          drop_event=receiver.drop_event if receiver is not None else None)

    def channel(self) -> GuestConnection:
        """The agent channel of a running machine (a BackendError otherwise)."""
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
        guest = self.channel()
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
        guest = self.channel()
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
            if self.spec.volumes and self.proc is not None and self.proc.returncode is None:
                await self.quiesce()
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
            await self._keep_evidence()
            self._return_volumes()
            if proc.returncode is None:
                raise RigdError(f"QEMU pid {proc.pid} survived SIGKILL")

    async def _keep_evidence(self) -> None:
        """The console, QMP transcript and QEMU's stderr, under ``$RIGD_EVIDENCE_DIR``
        when the operator (or a test harness) set it; nothing otherwise."""
        if evidence_dir() is None:
            return
        # A rig whose restore failed boots again cold: keep both machines' evidence.
        name = self.spec.rig_id + ("-restore" if self._incoming else "")
        await trio.to_thread.run_sync(functools.partial(
            write_evidence, name, console=self.console.tail(self.console.capacity),
            qmp=self.qmp.transcript() if self.qmp is not None else "",
            stderr=self.stderr.tail(self.stderr.capacity), log=self.log,
        ))


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


@asynccontextmanager
async def _no_changes() -> AsyncIterator[Changes | None]:
    yield None
