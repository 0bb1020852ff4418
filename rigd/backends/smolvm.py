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
   the tools disk answers (it also sets the guest clock), then ``reseed``: the
   rig's own ``/etc/machine-id``, fresh entropy, its MAC.

Warm starts (:mod:`rigd.backends.snapshot`): when the pack has a memory
snapshot for this machine shape, step 2 makes the overlay over the snapshot's
disk and step 3 is ``restoring snapshot`` (QEMU with ``-incoming defer`` fed
the saved state) instead of ``booting kernel``; ``MachineInfo.boot`` says
``warm``. A restore that fails falls back to a cold boot (logged, and the
snapshot is deleted). After the first cold boot of a shape with no snapshot,
one is built in the background. ``RIGD_WARM_STARTS=0`` (or
``SmolvmConfig.warm_starts=False``) turns all of this off.

Teardown escalates inside a shielded scope: QMP ``quit`` → SIGTERM → SIGKILL,
each with a deadline, then the runtime directory and overlay are removed.
"""

from __future__ import annotations

import base64
import contextlib
import contextvars
import dataclasses
import functools
import logging
import os
import shutil
import signal
import ssl
import subprocess
import time
from collections.abc import AsyncIterator, Awaitable, Callable, Mapping, Sequence
from contextlib import asynccontextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import trio

from netgate.broker import SecretStore
from netgate.gateway import Gateway, GatewayError, close_fd, open_gateway
from netgate.policy import build_policy
from netgate.topology import ADDRESSING
from netgate.usermode import SANDBOX as USER_SANDBOX
from netgate.usermode import SOCKET_NAME, UserGate, guest_net_arg, helper_python, open_user_gate
from netgate.usermode import netdev as user_netdev
from rigd.backends.base import ExecResult, MachineInfo, MachineSpec, NetSpec
from rigd.backends.confine import Identity, UidPool, give, make_private_dir, make_shared_dir
from rigd.backends.guest_client import GuestConnection, iterate
from rigd.backends.microvm_argv import SANDBOX, microvm_argv
from rigd.backends.procs import proc_alive, proc_start_ticks, resident_mb
from rigd.backends.qmp_client import QMPConnection
from rigd.backends.ring import Ring
from rigd.backends.snapshot import (
    Snapshot,
    SnapshotStore,
    file_identity,
    load_memory,
    rig_mac,
    rig_machine_id,
    save_memory,
    should_build,
    snapshot_key,
    snapshot_material,
    warm_starts_enabled,
)
from rigd.errors import BackendError, FieldError, GuestError, GuestRefused, RigdError
from rigd.images import TerminalAssets
from rigd.model import Accel, Backend, Surface
from rigd.protocols.guest import Stream


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


@dataclass(slots=True)
class SmolvmConfig:
    data_dir: Path
    accel: Accel
    assets: TerminalAssets
    qemu: str = "qemu-system-x86_64"
    qemu_img: str = "qemu-img"
    zstd: str = "zstd"
    #: Restore rigs from per-pack memory snapshots (``RIGD_WARM_STARTS=0`` turns it off).
    warm_starts: bool = dataclasses.field(default_factory=warm_starts_enabled)
    #: Give every rig a NIC behind its own egress gateway (None: no network at all).
    network: NetworkConfig | None = None


#: A rig's egress gate: a gateway namespace (root) or QEMU user networking relayed to the same proxy.
NetGate = Gateway | UserGate


@dataclass(frozen=True, slots=True)
class NetworkConfig:
    """How rigs reach the network: through netgate, one gate per rig.

    ``mode`` ``"gateway"``: a gateway namespace per rig, the tap handed to
    QEMU by fd (needs root). ``"user"``: QEMU's user networking with
    ``restrict=on`` relayed to the same proxy and DNS (no privileges needed;
    QEMU's sandbox then allows spawn, see :mod:`netgate.usermode`).
    """

    #: Upstream DNS server for the gateway's own lookups (None: /etc/resolv.conf).
    resolver: tuple[str, int] | None = None
    #: Dial out of this namespace instead of the server's (tests: the fake internet).
    upstream_netns: str | None = None
    #: The credential broker (secrets injected for bound hosts).
    broker: SecretStore | None = None
    prefix: str = "rigd"
    #: CA bundle for verifying brokered hosts (None: the system's CAs).
    upstream_ca: Path | None = None
    mode: str = "gateway"
    #: The interpreter of user mode's relay helper (None: :func:`netgate.usermode.helper_python`).
    helper_python: str | None = None

    def __post_init__(self) -> None:
        if self.mode not in ("gateway", "user"):
            raise ValueError(f"network mode {self.mode!r} is not 'gateway' or 'user'")


@dataclass(frozen=True, slots=True)
class WarmPlan:
    """Where a machine of one shape stands with warm starts (made in a worker thread)."""

    store: SnapshotStore
    key: str
    material: dict[str, Any]
    snapshot: Snapshot | None


def rig_argv(
    config: SmolvmConfig,
    *,
    memory_mb: int,
    vcpus: int,
    rig_dir: Path,
    overlay: Path,
    mac: str | None,
    incoming: bool = False,
    kernel: Path | None = None,
    initrd: Path | None = None,
    tools: Path | None = None,
    tap_fd: int | str | None = None,
) -> list[str]:
    """The QEMU command line of a rig (asset paths overridable for the key's placeholders).

    With networking on, the NIC's backend is the gateway's tap, passed by fd
    (``tap_fd``; ``"@fd"`` in a snapshot key), and the guest is told its
    addresses on the kernel command line (``rigd.net=``, read by the tools
    disk's init). In user mode the NIC is slirp (``restrict=on``) whose
    guestfwd helpers hand connections to ``<rig_dir>/net.sock``, and the
    sandbox allows spawn (:data:`netgate.usermode.SANDBOX`).
    """
    assets = config.assets
    net = net_argv(config, rig_dir, tap_fd)
    return microvm_argv(
        qemu=config.qemu, accel=str(config.accel), memory_mb=memory_mb, vcpus=vcpus,
        kernel=kernel or assets.kernel, initrd=initrd or assets.initrd, root_disk=overlay,
        tools_disk=tools or assets.tools, qmp_socket=rig_dir / "qmp.sock",
        agent_socket=rig_dir / "agent.sock", console_socket=rig_dir / "console.sock",
        mac=mac, incoming="defer" if incoming else None, **net,
    )


def net_argv(config: SmolvmConfig, rig_dir: Path, tap_fd: int | str | None) -> dict[str, Any]:
    """The NIC part of a rig's QEMU command line (``{}`` without a network):
    ``netdev`` (id ``net0``), ``nic_netdev``, the guest's ``rigd.net=``
    (``cmdline_extra``) and, in user mode, the sandbox that allows spawn."""
    cfg = config.network
    if cfg is not None and cfg.mode == "user":
        return {
            "netdev": user_netdev(rig_dir / SOCKET_NAME, python=cfg.helper_python or helper_python()),
            "nic_netdev": "net0",
            "cmdline_extra": [guest_net_arg()],
            "sandbox_opts": USER_SANDBOX,
        }
    if cfg is not None:
        a = ADDRESSING
        return {
            "netdev": f"tap,id=net0,fd={tap_fd},vhost=off",
            "nic_netdev": "net0",
            "cmdline_extra": [f"rigd.net={a.guest}/{a.prefixlen},{a.gateway},{a.dns}"],
        }
    return {}


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
        self.log = logging.getLogger("rigd.smolvm")
        self._qemu_id: tuple[str, dict[str, int]] | None = None
        self._background: trio.Nursery | None = None
        self._building: set[str] = set()
        self._build_failed: dict[str, float] = {}
        #: Restore failures per key (monotonic times), for :func:`should_build`.
        self._restore_failed: dict[str, list[float]] = {}
        self._recover_builds()

    def _recover_builds(self) -> None:
        """Kill snapshot-build QEMUs a crashed server left behind (pid *and* start time).

        Rigs are recovered from the database; a build machine is not a rig, so
        its pid is kept in ``<state dir>/snap_….pid`` (a root-owned
        directory the QEMU uid cannot write to, so the file cannot be forged).
        """
        for pidfile in sorted(self.state_dir.glob("snap_*.pid")):
            try:
                pid_s, ticks_s = pidfile.read_text().split()
                pid, ticks = int(pid_s), int(ticks_s)
            except (OSError, ValueError):
                pid, ticks = 0, 0
            if pid > 0 and proc_alive(pid, ticks):
                with contextlib.suppress(ProcessLookupError):
                    os.kill(pid, signal.SIGKILL)
                self.log.warning("killed a snapshot build left by a previous server", extra={"pid": pid})
            shutil.rmtree(self.state_dir / pidfile.stem, ignore_errors=True)
            pidfile.unlink(missing_ok=True)

    async def pack(self, progress: Callable[[str], None]) -> Path:
        async with self._pack_lock:
            return await trio.to_thread.run_sync(self._ensure_pack, progress)

    # -- background work ----------------------------------------------------

    async def run(self, *, task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED) -> None:
        """Own the backend's background work (snapshot builds) until cancelled.

        Start it with ``nursery.start(backend.run)`` next to the rig manager.
        Without it, builds run as Trio system tasks (cancelled when the run ends).
        """
        async with trio.open_nursery() as nursery:
            self._background = nursery
            task_status.started()
            try:
                await trio.sleep_forever()
            finally:
                self._background = None

    def _spawn(self, fn: Callable[[], Awaitable[None]], name: str) -> None:
        async def guarded() -> None:
            try:
                await fn()
            except trio.Cancelled:
                raise
            except Exception:  # a background failure must never take the server down
                self.log.exception("background task failed", extra={"task": name})

        if self._background is not None:
            self._background.start_soon(guarded, name=name)
        else:
            # (a system task would otherwise start in an empty context)
            trio.lowlevel.spawn_system_task(guarded, name=name, context=contextvars.copy_context())

    # -- warm starts ----------------------------------------------------------

    async def _qemu_identity(self) -> tuple[str, dict[str, int]]:
        if self._qemu_id is None:
            try:
                result = await trio.run_process(
                    [self.config.qemu, "--version"], capture_stdout=True, capture_stderr=True, check=False
                )
                version = result.stdout.decode("utf-8", "replace").splitlines()[0].strip()
            except (OSError, IndexError) as exc:
                raise BackendError(f"cannot ask {self.config.qemu} for its version: {exc}") from exc
            path = shutil.which(self.config.qemu) or self.config.qemu
            st = await trio.Path(path).stat()
            self._qemu_id = (version, file_identity(st))
        return self._qemu_id

    async def warm_plan(self, memory_mb: int, vcpus: int, rootfs: Path) -> WarmPlan:
        """The snapshot key of this machine shape and the snapshot, if one is ready."""
        version, binary = await self._qemu_identity()
        return await trio.to_thread.run_sync(self._warm_plan_sync, memory_mb, vcpus, rootfs, version, binary)

    def _warm_plan_sync(
        self, memory_mb: int, vcpus: int, rootfs: Path, version: str, binary: dict[str, int]
    ) -> WarmPlan:
        shape, assets = self._snapshot_shape(memory_mb, vcpus)
        material = snapshot_material(
            pack=rootfs.parent.name,
            rootfs=file_identity(rootfs.stat()),
            qemu_version=version,
            qemu_binary=binary,
            argv_shape=shape[1:],
            assets=assets,
        )
        key = snapshot_key(material)
        store = SnapshotStore(rootfs.parent / "snapshots", log=self.log)
        return WarmPlan(store, key, material, store.find(key))

    # -- what differs between machine kinds (DesktopBackend overrides these) --------

    #: The surface of the machines this backend boots (snapshot builds are of it).
    surface = Surface.TERMINAL
    #: The format of the file :meth:`_backing` returns.
    backing_format = "raw"

    def _snapshot_shape(self, memory_mb: int, vcpus: int) -> tuple[list[str], dict[str, Any]]:
        """The argv of this shape with placeholders for per-rig paths, and the assets' identity."""
        assets = self.config.assets
        shape = rig_argv(
            self.config, memory_mb=memory_mb, vcpus=vcpus, rig_dir=Path("/@rig"),
            overlay=Path("/@disk"), mac=None if self.config.network is None else "02:00:00:00:00:00",
            kernel=Path("/@kernel"), initrd=Path("/@initrd"), tools=Path("/@tools"), tap_fd="@fd",
        )
        return shape, {
            name: {"key": path.parent.name, "file": path.name, "size": path.stat().st_size}
            for name, path in (("kernel", assets.kernel), ("initrd", assets.initrd),
                               ("tools", assets.tools))
        }

    async def _backing(self, progress: Callable[[str], None]) -> tuple[Path, str]:
        """The file every rig's overlay is backed by, and its format."""
        return await self.pack(progress), self.backing_format

    def _warm_eligible(self, spec: MachineSpec) -> bool:
        """Whether a rig of this spec may start from (and seed) a snapshot."""
        return self.config.warm_starts

    def _new_machine(self, **kw: Any) -> SmolvmMachine:
        return SmolvmMachine(**kw)

    async def warm_snapshot(self, memory_mb: int, vcpus: int) -> None:
        """Make sure a snapshot of this shape exists or is being built (server start)."""
        if not self.config.warm_starts:
            return
        rootfs = await self.pack(lambda step: self.log.info("pack", extra={"step": step}))
        plan = await self.warm_plan(memory_mb, vcpus, rootfs)
        if plan.snapshot is None:
            self._schedule_build(plan, memory_mb, vcpus, rootfs)

    def _schedule_build(self, plan: WarmPlan, memory_mb: int, vcpus: int, rootfs: Path) -> None:
        key = plan.key
        if not should_build(time.monotonic(), building=key in self._building,
                            build_failed_at=self._build_failed.get(key),
                            restore_failures=self._restore_failed.get(key, ())):
            return
        self._building.add(key)

        async def build() -> None:
            try:
                await self._build_snapshot(plan, memory_mb, vcpus, rootfs)
            except (RigdError, OSError) as exc:
                self._build_failed[key] = time.monotonic()
                reason = exc.message if isinstance(exc, RigdError) else str(exc)
                self.log.warning("snapshot build failed; rigs of this shape boot cold",
                                 extra={"snapshot": key, "reason": reason[:300]})
            except BaseException:
                self._build_failed[key] = time.monotonic()
                raise
            finally:
                self._building.discard(key)

        self._spawn(build, f"snapshot-{key}")

    async def _build_snapshot(self, plan: WarmPlan, memory_mb: int, vcpus: int, rootfs: Path) -> None:
        """Boot an idle machine of this shape, save it, and commit the snapshot."""
        key, store = plan.key, plan.store
        log = logging.getLogger(f"rigd.snapshot.{key}")
        t0 = time.monotonic()
        with contextlib.ExitStack() as stack:
            tmp = await trio.to_thread.run_sync(stack.enter_context, store.building(key))
            if tmp is None:
                return  # built, or being built by another process
            identity = self.uids.acquire()
            # Short: a Unix socket path must fit in 108 bytes (rig dirs are "rig_" + 24).
            rig_dir = self.state_dir / f"snap_{key[:16]}"
            pidfile = rig_dir.with_name(rig_dir.name + ".pid")
            disk = tmp / "disk.qcow2"
            try:
                await trio.to_thread.run_sync(shutil.rmtree, rig_dir, True)
                make_private_dir(rig_dir, identity)
                await _run_quiet(
                    [self.config.qemu_img, "create", "-q", "-f", "qcow2", "-F", self.backing_format,
                     "-b", str(await trio.Path(rootfs).resolve()), str(disk)],
                    what="creating the snapshot disk",
                )
                give(disk, identity, 0o600)
                spec = MachineSpec(rig_id=f"snapshot-{key}", surface=self.surface,
                                   memory_mb=memory_mb, vcpus=vcpus)
                log.info("building a snapshot", extra={"memory_mb": memory_mb, "vcpus": vcpus})
                failure: RigdError | OSError | None = None
                async with (
                    self._gateway(f"snapshot-{key}", None, _no_progress) as gateway,
                    trio.open_nursery() as nursery,
                ):
                    machine = self._new_machine(
                        spec=spec, config=self.config, identity=identity, rig_dir=rig_dir,
                        overlay=disk, log=log, nursery=nursery, gateway=gateway,
                    )
                    machine.on_started = functools.partial(_write_pidfile, pidfile)
                    try:
                        await machine.boot(_no_progress, personalize=False)
                        boot_s = time.monotonic() - t0
                        sent = await machine.save(tmp / "memory.zst")
                    except (RigdError, OSError) as exc:
                        failure = exc  # raised outside the nursery, unwrapped
                    finally:
                        await machine.shutdown()
                        nursery.cancel_scope.cancel()
                if failure is not None:
                    raise failure
                snap = await trio.to_thread.run_sync(
                    lambda: store.commit(tmp, key, plan.material, bootS=round(boot_s, 2),
                                         buildS=round(time.monotonic() - t0, 2), ramBytesSent=sent)
                )
            finally:
                with trio.CancelScope(shield=True):
                    await trio.to_thread.run_sync(shutil.rmtree, rig_dir, True)
                    await trio.to_thread.run_sync(_unlink, pidfile)
                    self.uids.release(identity)
        removed = await trio.to_thread.run_sync(store.prune, plan.material)
        log.info("snapshot built", extra={
            "seconds": round(time.monotonic() - t0, 2), "memory_bytes": snap.meta["sizes"]["memory.zst"],
            "pruned": ",".join(removed) or "-",
        })

    # -- machines -------------------------------------------------------------

    @asynccontextmanager
    async def open_machine(
        self, spec: MachineSpec, progress: Callable[[str], None]
    ) -> AsyncIterator[SmolvmMachine]:
        async with (
            self._gateway(spec.rig_id, spec.network, progress) as gateway,
            self._open_machine(spec, progress, gateway) as machine,
        ):
            yield machine

    @asynccontextmanager
    async def _gateway(
        self, rig_id: str, net: NetSpec | None, progress: Callable[[str], None]
    ) -> AsyncIterator[NetGate | None]:
        """The rig's egress gate for the machine's whole life (None: no network)."""
        cfg = self.config.network
        if cfg is None:
            yield None
            return
        progress("opening the egress gateway")
        policy = net.policy if net is not None else build_policy("computer", defaults=False)
        broker = None
        if cfg.broker is not None and net is not None:
            has_secrets = await trio.to_thread.run_sync(cfg.broker.list, net.workspace)
            broker = cfg.broker if has_secrets else None
        upstream_ssl = (ssl.create_default_context(cafile=str(cfg.upstream_ca))
                        if cfg.upstream_ca is not None else None)
        if cfg.mode == "user":
            async with open_user_gate(
                rig_id, policy, audit=net.audit if net is not None else _drop_audit,
                resolver_address=cfg.resolver, upstream_netns=cfg.upstream_netns, broker=broker,
                workspace=net.workspace if net is not None else None, upstream_ssl=upstream_ssl,
            ) as gate:
                yield gate
            return
        try:
            async with open_gateway(
                rig_id, policy, audit=net.audit if net is not None else _drop_audit,
                resolver_address=cfg.resolver, upstream_netns=cfg.upstream_netns, broker=broker,
                workspace=net.workspace if net is not None else None, prefix=cfg.prefix,
                guest_mac=rig_mac(rig_id), upstream_ssl=upstream_ssl,
            ) as gateway:
                yield gateway
        except GatewayError as exc:
            raise BackendError(f"the egress gateway failed: {exc}") from exc

    @asynccontextmanager
    async def _open_machine(
        self, spec: MachineSpec, progress: Callable[[str], None], gateway: NetGate | None
    ) -> AsyncIterator[SmolvmMachine]:
        log = logging.getLogger(f"rigd.rig.{spec.rig_id}")
        identity = self.uids.acquire()
        rig_dir = self.state_dir / spec.rig_id
        overlay = self.run_dir / f"{spec.rig_id}.qcow2"
        try:
            rootfs, fmt = await self._backing(progress)
            plan: WarmPlan | None = None
            if self._warm_eligible(spec):
                try:
                    plan = await self.warm_plan(spec.memory_mb, spec.vcpus, rootfs)
                except (OSError, BackendError) as exc:
                    log.warning("warm starts unavailable", extra={"reason": str(exc)[:300]})
            make_private_dir(rig_dir, identity)

            if plan is not None and plan.snapshot is not None:
                snap = plan.snapshot
                progress("creating disk overlay")
                failure: RigdError | OSError | None = None
                restored = False
                try:
                    await self._make_overlay(overlay, snap.disk, "qcow2", identity)
                except (BackendError, OSError) as exc:
                    failure = exc
                if failure is None:
                    async with trio.open_nursery() as nursery:
                        machine = self._new_machine(
                            spec=spec, config=self.config, identity=identity, rig_dir=rig_dir,
                            overlay=overlay, log=log, nursery=nursery, gateway=gateway,
                        )
                        try:
                            try:
                                progress("restoring snapshot")
                                log.info("warm start", extra={"snapshot": snap.key})
                                await machine.restore(progress, snap)
                            except (BackendError, OSError) as exc:
                                failure = exc
                            else:
                                restored = True
                                self._restore_failed.pop(snap.key, None)
                                await trio.to_thread.run_sync(plan.store.touch, snap.key)
                                yield machine
                        finally:
                            await machine.shutdown()
                            nursery.cancel_scope.cancel()
                if restored:
                    return
                reason = failure.message if isinstance(failure, RigdError) else str(failure)
                log.warning("warm start failed; booting cold", extra={"snapshot": snap.key,
                                                                       "reason": reason[:300]})
                self._restore_failed.setdefault(snap.key, []).append(time.monotonic())
                await trio.to_thread.run_sync(plan.store.discard, snap.key, f"restore failed: {reason}")
                await trio.to_thread.run_sync(_remove, rig_dir, overlay)
                make_private_dir(rig_dir, identity)

            progress("creating disk overlay")
            await self._make_overlay(overlay, rootfs, fmt, identity)
            boot_failure: RigdError | OSError | None = None
            async with trio.open_nursery() as nursery:
                machine = self._new_machine(
                    spec=spec, config=self.config, identity=identity, rig_dir=rig_dir,
                    overlay=overlay, log=log, nursery=nursery, gateway=gateway,
                )
                try:
                    try:
                        progress("booting kernel")
                        await machine.boot(progress)
                    except (RigdError, OSError) as exc:
                        # Raised below, outside the nursery: inside it the
                        # error would reach the caller wrapped in an ExceptionGroup.
                        boot_failure = exc
                    else:
                        if plan is not None:  # none yet, or the one there failed to restore
                            self._schedule_build(plan, spec.memory_mb, spec.vcpus, rootfs)
                        yield machine
                finally:
                    await machine.shutdown()
                    nursery.cancel_scope.cancel()
            if boot_failure is not None:
                raise boot_failure
        finally:
            with trio.CancelScope(shield=True):
                await trio.to_thread.run_sync(_remove, rig_dir, overlay)
                self.uids.release(identity)

    async def _make_overlay(self, overlay: Path, backing: Path, fmt: str, identity: Identity) -> None:
        await _run_quiet(
            [self.config.qemu_img, "create", "-q", "-f", "qcow2", "-F", fmt,
             "-b", str(await trio.Path(backing).resolve()), str(overlay)],
            what="creating the disk overlay",
        )
        give(overlay, identity, 0o600)


def _no_progress(_step: str) -> None:
    pass


def _drop_audit(_event: Any) -> None:
    pass


def _write_pidfile(path: Path, pid: int, ticks: int | None) -> None:
    tmp = path.with_name(path.name + ".tmp")
    tmp.write_text(f"{pid} {ticks or 0}\n")
    os.replace(tmp, path)


def _unlink(path: Path) -> None:
    path.unlink(missing_ok=True)


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
        gateway: NetGate | None = None,
    ) -> None:
        self.spec = spec
        self.gateway = gateway
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
        self._stderr_done = trio.Event()
        self._shutting_down = False
        self.boot_deadline, self.grace = timeouts_for(config.accel)
        self.guest_kernel: str | None = None
        #: The agent's last ``hello`` answer (protocol, features, display).
        self.hello: dict[str, Any] = {}
        #: Called with (pid, start ticks) as soon as QEMU runs (snapshot builds record it).
        self.on_started: Callable[[int, int | None], None] | None = None
        confinement = identity.describe()
        confinement["seccomp"] = USER_SANDBOX if isinstance(gateway, UserGate) else SANDBOX
        self.info = MachineInfo(
            backend=Backend.SMOLVM, accel=config.accel, pid=None, pid_start_ticks=None,
            image=config.assets.image_digest, confinement=confinement,
            security_boundary=config.accel is not Accel.TCG,
        )

    # -- boot ---------------------------------------------------------------

    def argv(self, *, incoming: bool = False, tap_fd: int | None = None) -> list[str]:
        return rig_argv(
            self.config, memory_mb=self.spec.memory_mb, vcpus=self.spec.vcpus, rig_dir=self.rig_dir,
            overlay=self.overlay, mac=rig_mac(self.spec.rig_id), incoming=incoming, tap_fd=tap_fd,
        )

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
        argv = self.argv(incoming=incoming, tap_fd=tap_fd)
        try:
            self.proc = await trio.lowlevel.open_process(
                argv, stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL,
                stderr=subprocess.PIPE, start_new_session=True, cwd=str(self.rig_dir),
                pass_fds=(tap_fd,) if tap_fd is not None else (), **extra,
            )
        except OSError as exc:
            raise BackendError(f"cannot start QEMU ({argv[0]}): {exc.strerror}") from exc
        finally:
            if tap_fd is not None:
                close_fd(tap_fd)
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
        self.qmp = await QMPConnection.connect(self.rig_dir / "qmp.sock", log=self.log)
        await self._nursery.start(self.qmp.run)
        await self.qmp.handshake(timeout=30)
        await self._nursery.start(self._pump_console)
        stream = await trio.open_unix_socket(str(self.rig_dir / "agent.sock"))
        self.guest = GuestConnection(stream, log=self.log)
        await self._nursery.start(self.guest.run)

    async def boot(self, progress: Callable[[str], None], *, personalize: bool = True) -> None:
        """Cold boot: the kernel starts from scratch."""
        await self._start_qemu()
        with trio.move_on_after(self.boot_deadline) as deadline:
            await self._connect()
            progress("waiting for the guest agent")
            await self._hello()
            if personalize:
                await self._personalize(warm=False)
        if deadline.cancelled_caught:
            raise BackendError(
                f"the guest agent did not come up within {int(self.boot_deadline)} s",
                console=self.console_tail(2048),
            )

    async def restore(self, progress: Callable[[str], None], snapshot: Snapshot) -> None:
        """Warm start: QEMU waits for a migration stream; the host feeds it the snapshot."""
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
        script = (
            "mkdir -p /usr/local/share/ca-certificates && "
            "cat > /usr/local/share/ca-certificates/rigd-gateway.crt && "
            "{ update-ca-certificates >/dev/null 2>&1 || "
            "cat /usr/local/share/ca-certificates/rigd-gateway.crt >> /etc/ssl/certs/ca-certificates.crt; }"
        )
        result = await self.exec(["/bin/sh", "-c", script], cwd=None, env=None,
                                 stdin=pem.encode(), timeout_s=60, max_output=4096)
        if result.exit_code != 0:
            self.log.warning("could not install the gateway CA in the guest",
                             extra={"stderr": result.stderr[-200:].decode(errors="replace")})

    def set_egress(self, policy: Any) -> None:
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

    async def _wait_sockets(self) -> None:
        names = ("qmp.sock", "agent.sock", "console.sock")
        while not all((self.rig_dir / n).exists() for n in names):
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
