"""The rig manager: opens, drives, watches and closes rigs.

Each live rig is owned by one task in the manager's nursery. That task enters
the backend's ``open_machine`` context (boot), marks the rig ``ready``, and
then waits for one of two things: the machine dying on its own (the rig
becomes ``failed`` with ``backendFailure``), or a close, which cancels the
task so the backend tears the machine down in a shielded scope. Phase changes
go through :func:`rigd.lifecycle.check_transition` and are written to the
workspace database as they happen.

Visibility: every method resolves the rig through the caller's memberships;
a rig of a workspace the caller is not in answers exactly like a missing rig.

Under pressure (RIGS.md §6, §7, §12): a reaper task asks the pure functions
of :mod:`rigd.scheduler` every tick which rigs to park (vCPUs stopped, RAM
kept) and which to close (idle past twice the interval, or past the TTL);
opening a rig asks them whom to evict for the memory budget. A person may
take a control lease; while it holds, state-changing verbs from anyone else
are refused and observation verbs still run. Each rig has a ``state_lock``
that orders parking, waking and the start of an action, so a rig is never
parked under a running command.
"""

from __future__ import annotations

import contextlib
import dataclasses
import json
import logging
import os
import shutil
import signal
import time
from collections.abc import AsyncIterator, Callable
from contextlib import asynccontextmanager
from dataclasses import dataclass, field
from datetime import timedelta
from pathlib import Path
from typing import Any

import trio

from netgate.policy import Policy, build_policy
from rigd import lifecycle
from rigd.backends.base import ExecResult, Machine, MachineBackend, MachineSpec, NetSpec
from rigd.backends.procs import proc_alive
from rigd.errors import BackendError, Conflict, FieldError, Forbidden, NotFound, RigdError
from rigd.events import EventBus
from rigd.failure import describe_failure, leaves
from rigd.framing import untrusted_bytes
from rigd.model import (
    ACCEL_OF,
    BACKEND_OF,
    TOOL_SURFACES,
    Accel,
    Backend,
    CloseReason,
    Display,
    Phase,
    Surface,
    Tool,
)
from rigd.params import OpenParams, ident, integer, no_extra, obj, parse_open, string
from rigd.scheduler import Admit, Park, RigState, plan_admission, plan_idle
from rigd.store.aio import Stores
from rigd.store.server_db import User
from rigd.store.util import iso, new_id, utcnow
from rigd.store.workspace_db import RigRow, WorkspaceDB
from rigd.verbs import ParseContext, TerminalExec, audit_args, is_observation, parse_action
from rigd.verbs.base import DESKTOP_MIN

log = logging.getLogger("rigd.rigs")

#: Output kept per stream of an ``exec`` answered over RPC.
EXEC_OUTPUT_LIMIT = 2 * 1024 * 1024

#: Control leases (RIGS.md §12) and watch heartbeats (~2 s; lapse after ~10 s).
CONTROL_LEASE_S = 15 * 60
WATCH_LAPSE_S = 10.0
DEFAULT_MEMORY_BUDGET_MB = 12 * 1024
#: Gateway decisions waiting to be written to a rig's audit log.
NET_AUDIT_BUFFER = 1000

TCG_NOTE = (
    "running under TCG (software emulation): not a security boundary; "
    "for development and CI, not for hostile code"
)


@dataclass(frozen=True, slots=True)
class Caller:
    user: User
    #: The WebSocket session the call came on, if any (for notifications).
    session: Any = None

    @property
    def actor_kind(self) -> str:
        return self.user.kind

    @property
    def actor_id(self) -> str:
        return self.user.id


@dataclass(slots=True)
class LiveRig:
    row: RigRow
    db: WorkspaceDB
    machine: Machine | None = None
    scope: trio.CancelScope | None = None
    settled: trio.Event = field(default_factory=trio.Event)
    finished: trio.Event = field(default_factory=trio.Event)
    close_lock: trio.Lock = field(default_factory=trio.Lock)
    terminals: int = 0
    info: dict[str, Any] = field(default_factory=dict)
    params: OpenParams | None = None
    state_lock: trio.Lock = field(default_factory=trio.Lock)
    busy: int = 0
    last_active: float = 0.0
    expires_at: float = float("inf")
    watched_until: float | None = None
    lease_until: float | None = None
    last_agent: str | None = None
    policy: Policy | None = None
    net_audit: trio.MemorySendChannel[Any] | None = None
    net_audit_dropped: int = 0
    #: The rig's own nursery (net-audit writer, progress writes) while its task runs.
    nursery: trio.Nursery | None = None
    #: The console of the rig's last machine, for a failure after it is gone.
    last_console: Callable[[int], str] | None = None

    @property
    def phase(self) -> Phase:
        return Phase(self.row.phase)

    @property
    def person_controller(self) -> str | None:
        """The person holding control, if a lease is in force."""
        if self.row.controller_kind == "person" and self.lease_until is not None:
            return self.row.controller_id
        return None


class RigManager:
    def __init__(
        self,
        stores: Stores,
        backends: dict[Surface, MachineBackend],
        *,
        accel: Accel | None,
        accel_problem: str | None = None,
        events: EventBus | None = None,
        clock: Callable[[], float] = time.time,
        memory_budget_mb: int = DEFAULT_MEMORY_BUDGET_MB,
        tick_s: float = 1.0,
        network: str | None = None,
    ) -> None:
        self.stores = stores
        self.backends = backends
        self.accel = accel
        self.accel_problem = accel_problem
        self.events = events or EventBus(stores)
        self.clock = clock
        self.memory_budget_mb = memory_budget_mb
        self.tick_s = tick_s
        self.live: dict[str, LiveRig] = {}
        self._nursery: trio.Nursery | None = None
        self._open_locks: dict[tuple[str, str], trio.Lock] = {}
        self._admission = trio.Lock()
        #: How rigs reach the network: "gateway" (netgate), or None (no network at all).
        self.network = network

    # -- service lifetime -------------------------------------------------------

    async def run(self, *, task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED) -> None:
        await self.recover()
        try:
            async with trio.open_nursery() as nursery:
                self._nursery = nursery
                nursery.start_soon(self._reaper)
                task_status.started()
                try:
                    await trio.sleep_forever()
                finally:
                    # However the service ends, no machine outlives it.
                    await self.shutdown()
        finally:
            self._nursery = None

    async def shutdown(self) -> None:
        """Close every live rig with ``serverShutdown`` (used on SIGINT/SIGTERM)."""
        with trio.CancelScope(shield=True):
            async with trio.open_nursery() as nursery:
                for rig in list(self.live.values()):
                    nursery.start_soon(self._close, rig, CloseReason.SERVER_SHUTDOWN, None)

    async def recover(self) -> None:
        """Settle rigs a previous server left live (it crashed or was killed).

        A surviving QEMU is identified by pid *and* start time, so a recycled
        pid is never killed. Survivors close with ``serverShutdown``; rigs whose
        QEMU had already died close with ``backendFailure``.
        """
        data_dir = self.stores.data_dir
        for ws in await self.stores.run(self.stores.server.all_workspaces):
            db = await self.stores.workspace(ws.id)
            await self.stores.run(db.abandon_pending)
            for row in await self.stores.run(db.live_rigs):
                alive = row.pid is not None and proc_alive(row.pid, row.pid_start_ticks)
                if alive and row.pid is not None:
                    await _kill_pid(row.pid, row.pid_start_ticks)
                reason = CloseReason.SERVER_SHUTDOWN if alive else CloseReason.BACKEND_FAILURE
                await trio.to_thread.run_sync(_remove_runtime, data_dir, row.id)
                await self.stores.run(
                    db.update_rig, row.id, phase=Phase.CLOSED.value,
                    phase_detail="closed after a server restart",
                    close_reason=row.close_reason or reason.value, closed_at=iso(utcnow()),
                )
                log.info("recovered rig", extra={"rig": row.id, "reason": reason.value})
        await trio.to_thread.run_sync(_remove_orphans, data_dir)

    # -- visibility -------------------------------------------------------------

    async def _workspace_for(self, caller: Caller, ref: str) -> str:
        ws = await self.stores.run(self.stores.server.resolve_workspace, caller.user.id, ref)
        return ws.id

    async def _visible(self, caller: Caller, rig_id: str) -> tuple[RigRow, WorkspaceDB, LiveRig | None]:
        missing = NotFound(f"no rig {rig_id!r}", field="rigId")
        ws_id = await self.stores.run(self.stores.server.workspace_of_rig, rig_id)
        if ws_id is None:
            raise missing
        member = await self.stores.run(self.stores.server.is_member, ws_id, caller.user.id)
        if not member:
            raise missing
        live = self.live.get(rig_id)
        if live is not None:
            return live.row, live.db, live
        db = await self.stores.workspace(ws_id)
        return await self.stores.run(db.get_rig, rig_id), db, None

    # -- Rig JSON -----------------------------------------------------------------

    def rig_json(self, row: RigRow, live: LiveRig | None = None) -> dict[str, Any]:
        display = None
        if row.display_w is not None and row.display_h is not None:
            display = {"width": row.display_w, "height": row.display_h}
        controller = None
        if row.controller_kind and row.controller_id:
            controller = {"kind": row.controller_kind, "id": row.controller_id}
        notes: list[str] = []
        if row.accel == Accel.TCG.value:
            notes.append(TCG_NOTE)
        out: dict[str, Any] = {
            "id": row.id, "workspace": row.workspace_id, "conversation": row.conversation,
            "surface": row.surface, "engine": row.engine, "backend": row.backend,
            "accel": row.accel, "phase": row.phase, "phaseDetail": row.phase_detail,
            "closeReason": row.close_reason, "failure": row.failure, "display": display,
            "controller": controller, "memoryMb": row.memory_mb, "vcpus": row.vcpus,
            "createdAt": row.created_at, "lastActiveAt": row.last_active_at,
            "expiresAt": row.expires_at, "closedAt": row.closed_at, "image": row.image,
            "execImage": row.exec_image, "securityBoundary": row.accel != Accel.TCG.value,
            "pid": row.pid if row.phase != Phase.CLOSED.value else None,
            "notes": notes,
        }
        if live is not None and live.info:
            out.update(live.info)
        if live is not None and live.machine is not None:
            out["agentChannel"] = live.machine.channel_stats()
            out["residentMb"] = live.machine.resident_mb()
            out["network"] = live.machine.network_info()
        elif row.egress:
            out["network"] = {"mode": self.network or "gateway", **json.loads(row.egress)}
        else:
            out["network"] = {"mode": "none"}
        if live is not None:
            now = self.clock()
            out["pins"] = self._state(live, now).pins(now)
            if live.watched_until is not None and live.watched_until > now:
                out["watchedUntil"] = _iso_at(live.watched_until)
            if controller is not None and live.lease_until is not None:
                out["controller"] = {**controller, "until": _iso_at(live.lease_until)}
        if row.phase == Phase.FAILED.value or (row.close_reason == CloseReason.BACKEND_FAILURE.value
                                                and row.console_tail):
            out["consoleTail"] = (row.console_tail or "")[-2048:]
        return out

    # -- open -----------------------------------------------------------------------

    async def open(self, caller: Caller, raw: object) -> dict[str, Any]:
        params = parse_open(raw, frozenset(self.backends))
        ws_id = await self._workspace_for(caller, params.workspace)
        backend = self.backends.get(params.surface)
        if backend is None:
            raise FieldError("surface", f"{params.surface} rigs are not available on this server")
        if self.accel is None:
            raise RigdError(
                "this server has no working accelerator: "
                f"{self.accel_problem or 'none was found'}. Restart it with --accel tcg to use "
                "software emulation (not a security boundary)",
                field="accel",
            )
        if params.surface is Surface.COMPUTER:
            params = self._computer_backend(params, raw)
        db = await self.stores.workspace(ws_id)
        if params.conversation is not None and params.surface is Surface.TERMINAL:
            lock = self._open_locks.setdefault((ws_id, params.conversation), trio.Lock())
            async with lock:
                for rig in self.live.values():
                    r = rig.row
                    if (r.workspace_id == ws_id and r.conversation == params.conversation
                            and r.surface == Surface.TERMINAL.value and r.exec_image
                            and rig.phase in lifecycle.LIVE):
                        return await self._answer_open(rig, params.wait)
                rig = await self._start(caller, params, ws_id, db)
        else:
            rig = await self._start(caller, params, ws_id, db)
        return await self._answer_open(rig, params.wait)

    def _computer_backend(self, params: OpenParams, raw: object) -> OpenParams:
        """A computer rig runs on the server's accelerator (qemu-kvm, qemu-hvf, or
        qemu-tcg when the server was started with ``--accel tcg``) unless the
        caller names a backend; software emulation is used only when named."""
        assert self.accel is not None
        if params.display is not None and (params.display.width < DESKTOP_MIN.width
                                           or params.display.height < DESKTOP_MIN.height):
            raise FieldError("display", f"a desktop's mode is at least {DESKTOP_MIN.width}x"
                                        f"{DESKTOP_MIN.height} (set_display has the same floor)")
        named = isinstance(raw, dict) and raw.get("backend") is not None
        if not named:
            return dataclasses.replace(params, backend=BACKEND_OF[self.accel])
        want = ACCEL_OF[params.backend]
        if want is not Accel.TCG and want is not self.accel:
            raise FieldError(
                "backend",
                f"{params.backend} needs {want}, and this server runs with {self.accel}; "
                f"use {BACKEND_OF[self.accel]} (or qemu-tcg, software emulation)",
            )
        return params

    async def _answer_open(self, rig: LiveRig, wait: bool) -> dict[str, Any]:
        if wait:
            await rig.settled.wait()
        if rig.phase is Phase.FAILED:
            raise BackendError(
                f"rig {rig.row.id} failed to start: {rig.row.failure}", rig=self.rig_json(rig.row, rig)
            )
        return self.rig_json(rig.row, rig)

    def egress_policy(self, surface: Surface, allow: object, defaults: bool) -> Policy | None:
        """The rig's allowlist (errors name ``egress.allow[i]``); None without a network."""
        if self.network is None:
            if allow:
                raise FieldError(
                    "egress.allow",
                    "this server gives rigs no network (started with --network none, or its QEMU "
                    "has neither a usable tap nor user networking)",
                )
            return None
        return build_policy(surface.value, allow, defaults=defaults)

    async def _start(
        self, caller: Caller, params: OpenParams, ws_id: str, db: WorkspaceDB
    ) -> LiveRig:
        assert self._nursery is not None, "RigManager.run is not running"
        policy = self.egress_policy(params.surface, list(params.egress_allow), params.egress_defaults)
        async with self._admission:
            decision = plan_admission(
                [self._state(r, self.clock()) for r in self.live.values()],
                budget_mb=self.memory_budget_mb, need_mb=params.memory_mb, now=self.clock(),
            )
            if not isinstance(decision, Admit):
                raise Conflict(decision.reason, field="memoryMb", budgetMb=self.memory_budget_mb)
            for victim in decision.evict:
                rig = self.live.get(victim)
                if rig is not None:
                    await self._reap(rig, CloseReason.IDLE_TIMEOUT,
                                     f"evicted to make room in the {self.memory_budget_mb} MB budget")
            return await self._create(caller, params, ws_id, db, policy)

    async def _create(
        self, caller: Caller, params: OpenParams, ws_id: str, db: WorkspaceDB,
        policy: Policy | None,
    ) -> LiveRig:
        assert self._nursery is not None
        now = utcnow()
        rig_id = new_id("rig")
        row = RigRow(
            id=rig_id, workspace_id=ws_id, conversation=params.conversation,
            surface=params.surface.value, engine=params.engine.value if params.engine else None,
            backend=params.backend.value, accel=self.accel.value if self.accel else None,
            phase=Phase.PROVISIONING.value, phase_detail="queued", close_reason=None, failure=None,
            display_w=params.display.width if params.display else None,
            display_h=params.display.height if params.display else None,
            memory_mb=params.memory_mb, vcpus=params.vcpus, ttl_s=params.ttl_s,
            idle_s=params.idle_s, image=None,
            exec_image=params.surface is Surface.TERMINAL, created_by=caller.user.id,
            controller_kind=None, controller_id=None, created_at=iso(now),
            last_active_at=iso(now), expires_at=iso(now + timedelta(seconds=params.ttl_s)),
            closed_at=None, pid=None, pid_start_ticks=None, console_tail=None,
            egress=_egress_json(policy, params.egress_defaults),
        )
        await self.stores.run(db.insert_rig, row)
        await self.stores.run(self.stores.server.index_rig, rig_id, ws_id)
        rig = LiveRig(row=row, db=db, params=params, last_active=self.clock(),
                      expires_at=self.clock() + params.ttl_s, policy=policy)
        if caller.actor_kind == "agent":
            rig.last_agent = caller.actor_id
        self.live[rig_id] = rig
        await self.audit_event(rig, caller, "open", {"surface": row.surface,
                                                          "memoryMb": row.memory_mb,
                                                          "vcpus": row.vcpus})
        await self._nursery.start(self._rig_task, rig, self.backends[params.surface])
        return rig

    async def _rig_task(
        self, rig: LiveRig, backend: MachineBackend, *, task_status: trio.TaskStatus[None]
    ) -> None:
        """Own one rig for its whole life: the failure boundary around it.

        The rig's own tasks (the net-audit writer, progress writes) run in the
        rig's nursery, never the manager's; the machine's tasks (pumps, readers)
        run in the machine's. Whatever any of them raises — plain or grouped —
        fails this rig (``failed``/``backendFailure``, the error and the console
        tail in ``failure``) and goes no further: no other rig and not the server
        sees it. Only cancellation (a close, the server's end) passes through.
        """
        row = rig.row
        try:
            try:
                async with trio.open_nursery() as own:
                    rig.nursery = own
                    network = None
                    if rig.policy is not None:
                        send, receive = trio.open_memory_channel[Any](NET_AUDIT_BUFFER)
                        rig.net_audit = send
                        own.start_soon(self._net_audit_writer, rig, receive)
                        network = NetSpec(policy=rig.policy, audit=self._net_audit_sink(rig),
                                          workspace=row.workspace_id)
                    spec = MachineSpec(
                        rig_id=row.id, surface=Surface(row.surface), memory_mb=row.memory_mb,
                        vcpus=row.vcpus, network=network, accel=ACCEL_OF.get(Backend(row.backend)),
                        display=(row.display_w, row.display_h) if row.display_w and row.display_h else None,
                    )
                    with trio.CancelScope() as scope:
                        rig.scope = scope
                        task_status.started()
                        await self._machine_life(rig, backend, spec)
                    # The machine is gone: let the writer drain what the gateway said, then end.
                    if rig.net_audit is not None:
                        rig.net_audit.close()
            except* Exception as group:
                reason, console = describe_failure(group, rig.last_console)
                if not any(isinstance(e, RigdError) for e in leaves(group)):
                    log.error("a rig task failed", exc_info=group, extra={"rig": row.id})
                with trio.CancelScope(shield=True):
                    try:
                        await self._fail(rig, reason, console)
                    except Exception:  # the store failed too: the rig still ends, the server stays
                        log.exception("could not record a rig's failure", extra={"rig": row.id})
        finally:
            rig.machine = None
            rig.nursery = None
            rig.settled.set()
            rig.finished.set()
            if rig.net_audit is not None:
                rig.net_audit.close()

    async def _machine_life(self, rig: LiveRig, backend: MachineBackend, spec: MachineSpec) -> None:
        async with backend.open_machine(spec, self._progress_for(rig)) as machine:
            rig.machine = machine
            rig.last_console = machine.console_tail
            info = machine.info
            rig.info = {"confinement": dict(info.confinement), "boot": info.boot}
            await self._update(rig, pid=info.pid, pid_start_ticks=info.pid_start_ticks,
                               image=info.image, accel=info.accel.value)
            await self._transition(rig, Phase.READY, "ready")
            rig.settled.set()
            reason = await machine.wait_failed()
            await self._fail(rig, reason, machine.console_tail())

    # -- the gateway's decisions, into the rig's audit log ------------------------------

    def _net_audit_sink(self, rig: LiveRig) -> Callable[[Any], None]:
        def sink(event: Any) -> None:
            # Called by the gateway, on the event loop; must not block. A
            # guest flooding DNS cannot grow the server's memory: past the
            # buffer, decisions are counted, not kept.
            if rig.net_audit is None:
                return
            try:
                rig.net_audit.send_nowait(event)
            except trio.WouldBlock:
                rig.net_audit_dropped += 1
            except (trio.BrokenResourceError, trio.ClosedResourceError):
                pass

        return sink

    async def _net_audit_writer(self, rig: LiveRig, receive: trio.MemoryReceiveChannel[Any]) -> None:
        noted = 0
        async with receive:
            async for event in receive:
                args = {k: v for k, v in dataclasses.asdict(event).items() if v not in (None, 0, 0.0)}
                if rig.net_audit_dropped > noted:
                    args["droppedBefore"] = rig.net_audit_dropped - noted
                    noted = rig.net_audit_dropped
                seq = await self.stores.run(
                    rig.db.begin_action, rig.row.id, actor_kind="gateway", actor_id="netgate",
                    tool="netgate", verb=f"{event.kind}_{event.phase}", args=args,
                )
                await self.stores.run(
                    rig.db.finish_action, rig.row.id, seq,
                    outcome="ok" if event.allowed else "refused",
                    error=None if event.allowed else str(event.reason)[:300], duration_ms=int(
                        float(getattr(event, "duration_s", 0) or 0) * 1000),
                )

    # -- rig.egress ------------------------------------------------------------------------

    async def set_egress(self, caller: Caller, raw: object) -> dict[str, Any]:
        params = obj(raw)
        no_extra(params, {"rigId", "allow", "defaults"})
        rig_id = ident(params, "rigId")
        assert rig_id is not None
        allow = params.get("allow", [])
        if not isinstance(allow, list) or not all(isinstance(h, str) for h in allow):
            raise FieldError("allow", "must be a list of host names")
        defaults = params.get("defaults", True)
        if not isinstance(defaults, bool):
            raise FieldError("defaults", "must be true or false")
        row, _db, rig = await self._visible(caller, rig_id)
        if rig is None or rig.machine is None:
            raise Conflict(f"rig {rig_id} is {row.phase}; its allowlist can change only while it runs")
        self._check_control(rig, caller)
        try:
            policy = self.egress_policy(Surface(row.surface), allow, defaults)
        except FieldError as exc:
            raise FieldError(exc.field.replace("egress.", "", 1), exc.reason) from exc
        if policy is None:
            raise FieldError("allow", "this rig has no network")
        rig.machine.set_egress(policy)
        rig.policy = policy
        await self.audit_event(rig, caller, "egress", {"allow": allow, "defaults": defaults})
        await self._update(rig, egress=_egress_json(policy, defaults))
        return {"rigId": rig_id, "allow": list(policy.allow), "defaults": defaults}

    def _progress_for(self, rig: LiveRig) -> Callable[[str], None]:
        def apply(detail: str) -> None:
            if rig.phase is Phase.PROVISIONING:
                rig.row.phase_detail = detail
                if rig.nursery is not None:  # the rig's own task: its failure is the rig's
                    rig.nursery.start_soon(self._persist_detail, rig, detail)

        def progress(detail: str) -> None:
            try:
                trio.lowlevel.current_task()
            except RuntimeError:
                trio.from_thread.run_sync(apply, detail)
            else:
                apply(detail)

        return progress

    async def _persist_detail(self, rig: LiveRig, detail: str) -> None:
        if rig.row.phase_detail == detail:
            await self.stores.run(rig.db.update_rig, rig.row.id, phase_detail=detail)

    async def _update(self, rig: LiveRig, **changes: Any) -> None:
        for name, value in changes.items():
            setattr(rig.row, name, value)
        with trio.CancelScope(shield=True):
            await self.stores.run(rig.db.update_rig, rig.row.id, **changes)

    async def _transition(self, rig: LiveRig, target: Phase, detail: str, **changes: Any) -> None:
        lifecycle.check_transition(rig.phase, target)
        await self._update(rig, phase=target.value, phase_detail=detail, **changes)
        logging.getLogger(f"rigd.rig.{rig.row.id}").info(
            "phase", extra={"phase": target.value, "detail": detail}
        )
        await self.events.publish(rig.row.workspace_id, rig.row.id, "RigPhaseChanged",
                                  phase=target.value, phaseDetail=detail)

    async def _fail(self, rig: LiveRig, reason: str, console: str | None) -> None:
        if not lifecycle.can_transition(rig.phase, Phase.FAILED):
            return
        await self._transition(
            rig, Phase.FAILED, reason[:300], failure=reason[:2000],
            close_reason=CloseReason.BACKEND_FAILURE.value,
            console_tail=(console or "")[-4096:] or None,
        )
        rig.settled.set()

    # -- list / get / close -----------------------------------------------------------

    async def list_rigs(self, caller: Caller, raw: object) -> list[dict[str, Any]]:
        params = obj(raw)
        no_extra(params, {"workspace", "includeClosed"})
        ref = string(params, "workspace", max_len=128)
        assert ref is not None
        include_closed = params.get("includeClosed", False)
        if not isinstance(include_closed, bool):
            raise FieldError("includeClosed", "must be true or false")
        ws_id = await self._workspace_for(caller, ref)
        db = await self.stores.workspace(ws_id)
        rows = await self.stores.run(db.list_rigs, include_closed=include_closed)
        out = []
        for row in rows:
            live = self.live.get(row.id)
            out.append(self.rig_json(live.row if live else row, live))
        return out

    async def wait_settled(self, caller: Caller, rig_id: str) -> None:
        """Wait until a rig that is coming up is ready (or failed)."""
        _row, _db, live = await self._visible(caller, rig_id)
        if live is not None:
            await live.settled.wait()

    async def get(self, caller: Caller, raw: object) -> dict[str, Any]:
        params = obj(raw)
        no_extra(params, {"rigId"})
        rig_id = ident(params, "rigId")
        assert rig_id is not None
        row, _db, live = await self._visible(caller, rig_id)
        return self.rig_json(row, live)

    async def close(self, caller: Caller, raw: object) -> dict[str, Any]:
        params = obj(raw)
        no_extra(params, {"rigId"})
        rig_id = ident(params, "rigId")
        assert rig_id is not None
        row, db, live = await self._visible(caller, rig_id)
        if live is None:
            if row.phase == Phase.FAILED.value:
                # Failed before this server started: its machine is long gone.
                lifecycle.check_transition(Phase.FAILED, Phase.CLOSED)
                await self.stores.run(db.update_rig, rig_id, phase=Phase.CLOSED.value,
                                      phase_detail="closed", closed_at=iso(utcnow()))
                row = await self.stores.run(db.get_rig, rig_id)
            return self.rig_json(row)
        await self._close(live, CloseReason.REQUESTED, caller)
        return self.rig_json(live.row)

    async def _close(self, rig: LiveRig, reason: CloseReason, caller: Caller | None) -> None:
        with trio.CancelScope(shield=True):
            async with rig.close_lock:
                if rig.phase is Phase.CLOSED:
                    return
                if caller is not None:
                    await self.audit_event(rig, caller, "close", {"reason": reason.value})
                if rig.phase is not Phase.FAILED:
                    await self._transition(rig, Phase.CLOSING, "stopping the machine",
                                           close_reason=reason.value)
                if rig.scope is not None:
                    rig.scope.cancel()
                await rig.finished.wait()
                await self._transition(rig, Phase.CLOSED, "closed", closed_at=iso(utcnow()))
                self.live.pop(rig.row.id, None)
                await self.events.publish(rig.row.workspace_id, rig.row.id, "RigClosedEvent",
                                          reason=rig.row.close_reason)

    # -- act ----------------------------------------------------------------------------

    async def act(self, caller: Caller, raw: object) -> dict[str, Any]:
        params = obj(raw)
        no_extra(params, {"rigId", "tool", "action"})
        rig_id = ident(params, "rigId")
        assert rig_id is not None
        row, db, live = await self._visible(caller, rig_id)
        tool_raw = params.get("tool")
        action = params.get("action")
        tools = ", ".join(t.value for t in Tool)
        tool_name = tool_raw if isinstance(tool_raw, str) and len(tool_raw) <= 64 else "?"
        args = audit_args(tool_name, action)
        verb = args.get("action") if isinstance(args.get("action"), str) else "?"
        started = time.monotonic()
        seq = await self.stores.run(
            db.begin_action, rig_id, actor_kind=caller.actor_kind, actor_id=caller.actor_id,
            tool=tool_name, verb=str(verb)[:64], args=args,
        )
        outcome, error = "error", None
        try:
            if tool_raw not in Tool.__members__.values():
                raise FieldError("tool", f"must be one of {tools}")
            tool = Tool(str(tool_raw))
            surface = Surface(row.surface)
            if surface not in TOOL_SURFACES[tool]:
                raise FieldError("tool", f"a {surface} rig does not answer {tool}")
            display = None
            if row.display_w and row.display_h:
                display = Display(row.display_w, row.display_h)
            parsed = parse_action(tool.value, action, ParseContext(surface=surface, display=display))
            if isinstance(parsed, FieldError):
                raise parsed
            if live is None:
                outcome = "refused"
                lifecycle.require_phase(Phase(row.phase), frozenset({Phase.READY}), f"run {tool}.{verb}")
            assert live is not None
            if not is_observation(parsed):
                outcome = "refused"
                self._check_control(live, caller)
            outcome = "error"
            async with self._activity(live, caller, f"run {tool}.{verb}") as machine:
                result = await self._execute(live, machine, parsed)
            outcome = "ok"
            return result
        except RigdError as exc:
            error = exc.message[:500]
            raise
        finally:
            with trio.CancelScope(shield=True):
                await self.stores.run(
                    db.finish_action, rig_id, seq, outcome=outcome, error=error,
                    duration_ms=int((time.monotonic() - started) * 1000),
                )

    def _check_control(self, rig: LiveRig, caller: Caller) -> None:
        """Refuse a state change while a person other than the caller drives."""
        holder = rig.person_controller
        if holder is not None and holder != caller.user.id:
            raise Conflict(
                "a person is driving this rig; only observation verbs are allowed until they "
                "hand control back",
                controller={"kind": "person", "id": holder},
            )

    @asynccontextmanager
    async def _activity(self, rig: LiveRig, caller: Caller, doing: str) -> AsyncIterator[Machine]:
        """One action on a rig: wake it if parked, keep it from parking meanwhile,
        and count it as activity (for idleness, lease renewal and the controller)."""
        async with rig.state_lock:
            if rig.phase is Phase.PARKED:
                await self._wake(rig, "woken by an action")
            lifecycle.require_phase(rig.phase, frozenset({Phase.READY}), doing)
            machine = rig.machine
            if machine is None:
                raise Conflict(f"cannot {doing}: the machine is not running")
            rig.busy += 1
        try:
            yield machine
        finally:
            rig.busy -= 1
            with trio.CancelScope(shield=True):
                await self._touch(rig, caller)

    async def _touch(self, rig: LiveRig, caller: Caller | None = None) -> None:
        now = self.clock()
        rig.last_active = now
        changes: dict[str, Any] = {"last_active_at": iso(utcnow())}
        if caller is not None:
            if rig.person_controller == caller.user.id:
                rig.lease_until = now + CONTROL_LEASE_S
            elif caller.actor_kind == "agent":
                rig.last_agent = caller.actor_id
                if rig.person_controller is None and rig.row.controller_id != caller.actor_id:
                    changes.update(controller_kind="agent", controller_id=caller.actor_id)
        await self._update(rig, **changes)

    async def _wake(self, rig: LiveRig, why: str) -> None:
        """Resume a parked rig. Call with ``rig.state_lock`` held."""
        assert rig.machine is not None
        await rig.machine.wake()
        await self._transition(rig, Phase.READY, why)

    async def _park(self, rig: LiveRig, why: str, *, forced: bool = False) -> bool:
        async with rig.state_lock:
            if rig.phase is not Phase.READY or rig.machine is None or rig.busy:
                return False
            if not forced and (self.clock() - rig.last_active < rig.row.idle_s
                               or self._state(rig, self.clock()).pins(self.clock())):
                return False  # something happened since the decision
            try:
                await rig.machine.park()
            except BackendError as exc:
                log.warning("could not park", extra={"rig": rig.row.id, "error": exc.message})
                return False
            except Exception as exc:  # a bug in the machine fails its rig, never the reaper
                log.error("parking failed", exc_info=exc, extra={"rig": rig.row.id})
                await self._fail(rig, *describe_failure(exc, rig.last_console))
                return False
            await self._transition(rig, Phase.PARKED, why)
            return True

    async def _reap(self, rig: LiveRig, reason: CloseReason, why: str) -> None:
        """Close for idleness, TTL or memory, with a RigReaped event first."""
        if rig.phase in (Phase.CLOSING, Phase.CLOSED):
            return
        await self.events.publish(rig.row.workspace_id, rig.row.id, "RigReaped",
                                  reason=reason.value, why=why, agent=rig.last_agent)
        await self._close(rig, reason, None)

    def _state(self, rig: LiveRig, now: float) -> RigState:
        if rig.lease_until is not None and rig.lease_until <= now:
            controlled = False
        else:
            controlled = rig.person_controller is not None
        machine = rig.machine
        resident = rig.row.memory_mb if machine is None else (machine.resident_mb() or rig.row.memory_mb)
        return RigState(
            id=rig.row.id, phase=rig.phase, last_active=rig.last_active,
            expires_at=rig.expires_at, idle_s=rig.row.idle_s, resident_mb=resident,
            terminals=rig.terminals, watched_until=rig.watched_until,
            controlled_by_person=controlled, busy=rig.busy,
        )

    # -- the reaper -------------------------------------------------------------------

    async def _reaper(self) -> None:
        while True:
            await trio.sleep(self.tick_s)
            try:
                await self.reap_once()
            except RigdError as exc:
                log.warning("reaper step failed", extra={"error": exc.message})
            except Exception:  # one bad step must not end reaping (nor the server)
                log.exception("reaper step failed")

    async def reap_once(self) -> None:
        """One scheduling step: lapse leases, then park and close what is due."""
        now = self.clock()
        for rig in list(self.live.values()):
            if rig.lease_until is not None and rig.lease_until <= now and rig.person_controller:
                await self._set_person_control(rig, None, "lease expired")
        decisions = plan_idle([self._state(r, now) for r in self.live.values()], now)
        async with trio.open_nursery() as nursery:
            for decision in decisions:
                target = self.live.get(decision.rig_id)
                if target is None:
                    continue
                idle = int(now - target.last_active)
                if isinstance(decision, Park):
                    nursery.start_soon(self._park, target, f"parked after {idle} s without an action")
                else:
                    why = ("its hard lifetime ran out" if decision.reason is CloseReason.TTL_EXPIRED
                           else f"idle for {idle} s")
                    nursery.start_soon(self._reap, target, decision.reason, why)

    # -- control, watching, parking on request -----------------------------------------

    async def _set_person_control(self, rig: LiveRig, person: str | None, why: str) -> None:
        previous = rig.row.controller_id if rig.row.controller_kind == "person" else None
        if person is None:
            rig.lease_until = None
            kind, who = ("agent", rig.last_agent) if rig.last_agent else (None, None)
        else:
            rig.lease_until = self.clock() + CONTROL_LEASE_S
            kind, who = "person", person
        await self._update(rig, controller_kind=kind, controller_id=who)
        await self.events.publish(
            rig.row.workspace_id, rig.row.id, "RigControlChanged",
            controller={"kind": kind, "id": who} if who else None,
            previous={"kind": "person", "id": previous} if previous else None, why=why,
        )

    async def control(self, caller: Caller, raw: object) -> dict[str, Any]:
        params = obj(raw)
        no_extra(params, {"rigId", "op"})
        rig_id = ident(params, "rigId")
        op = params.get("op")
        if op not in ("take", "release"):
            raise FieldError("op", "must be 'take' or 'release'")
        assert rig_id is not None
        _row, _db, rig = await self._visible(caller, rig_id)
        if rig is None or rig.phase not in lifecycle.LIVE:
            raise Conflict(f"rig {rig_id} is not running; there is nothing to control")
        holder = rig.person_controller
        if op == "take":
            if caller.user.kind != "person":
                raise Forbidden("only a person can take control; agents drive without a lease")
            if holder is not None and holder != caller.user.id:
                raise Conflict("another person already holds control of this rig",
                               controller={"kind": "person", "id": holder})
            await self.audit_event(rig, caller, "control_take", {})
            await self._set_person_control(rig, caller.user.id, "taken")
        else:
            if holder is None:
                raise Conflict("nobody holds control of this rig")
            if holder != caller.user.id and not caller.user.is_admin:
                raise Forbidden("only the person holding control (or an admin) can release it")
            await self.audit_event(rig, caller, "control_release", {})
            await self._set_person_control(rig, None, "released")
        return self.rig_json(rig.row, rig)

    async def watch(self, caller: Caller, raw: object) -> dict[str, Any]:
        params = obj(raw)
        no_extra(params, {"rigId"})
        rig_id = ident(params, "rigId")
        assert rig_id is not None
        _row, _db, rig = await self._visible(caller, rig_id)
        if rig is None or rig.phase not in lifecycle.LIVE:
            raise Conflict(f"rig {rig_id} is not running; there is nothing to watch")
        now = self.clock()
        rig.watched_until = now + WATCH_LAPSE_S
        if rig.person_controller == caller.user.id:
            rig.lease_until = now + CONTROL_LEASE_S
        return {"rigId": rig_id, "phase": rig.row.phase, "watchedUntil": _iso_at(rig.watched_until)}

    async def view_rig(self, caller: Caller, rig_id: str) -> LiveRig:
        """The rig behind a live view: watched (pinned) from now, woken if parked."""
        return await self._lane_rig(caller, rig_id, "watch the screen", "woken by a watcher",
                                    watch=True)

    def keep_watched(self, rig: LiveRig) -> None:
        """A watcher is still there (called by the live view, in memory)."""
        rig.watched_until = self.clock() + WATCH_LAPSE_S

    async def live_input(self, rig: LiveRig, caller: Caller, machine: Any,
                         plan: list[Any], shape: dict[str, Any]) -> None:
        """A person's input from the live view: audited (by shape), then sent through QMP."""
        self._check_control(rig, caller)
        seq = await self.stores.run(
            rig.db.begin_action, rig.row.id, actor_kind=caller.actor_kind,
            actor_id=caller.actor_id, tool="live_view", verb=str(shape.get("type", "?")), args=shape,
        )
        outcome, error = "error", None
        try:
            async with self._activity(rig, caller, "send input"):
                await machine.send_plan(plan)
            outcome = "ok"
        except RigdError as exc:
            error = exc.message[:300]
            raise
        finally:
            with trio.CancelScope(shield=True):
                await self.stores.run(rig.db.finish_action, rig.row.id, seq, outcome=outcome,
                                      error=error, duration_ms=0)

    async def park(self, caller: Caller, raw: object) -> dict[str, Any]:
        params = obj(raw)
        no_extra(params, {"rigId"})
        rig_id = ident(params, "rigId")
        assert rig_id is not None
        _row, _db, rig = await self._visible(caller, rig_id)
        if rig is None:
            raise Conflict(f"rig {rig_id} is not running")
        self._check_control(rig, caller)
        if rig.phase is not Phase.PARKED:
            lifecycle.require_phase(rig.phase, frozenset({Phase.READY}), "park")
            if rig.busy:
                raise Conflict("the rig is running an action; park it when it is done")
            await self.audit_event(rig, caller, "park", {})
            await self._park(rig, "parked on request", forced=True)
        return self.rig_json(rig.row, rig)

    # -- ending things --------------------------------------------------------------------

    async def end_conversation(self, caller: Caller, raw: object) -> dict[str, Any]:
        params = obj(raw)
        no_extra(params, {"workspace", "conversation"})
        ref = string(params, "workspace", max_len=128)
        conversation = ident(params, "conversation")
        assert ref is not None
        ws_id = await self._workspace_for(caller, ref)
        rigs = [r for r in self.live.values()
                if r.row.workspace_id == ws_id and r.row.conversation == conversation]
        async with trio.open_nursery() as nursery:
            for rig in rigs:
                nursery.start_soon(self._close, rig, CloseReason.CONVERSATION_ENDED, caller)
        return {"closed": [r.row.id for r in rigs]}

    async def close_workspace(self, workspace_id: str) -> list[str]:
        """The workspace is gone (deleted, or its last member removed)."""
        rigs = [r for r in self.live.values() if r.row.workspace_id == workspace_id]
        async with trio.open_nursery() as nursery:
            for rig in rigs:
                nursery.start_soon(self._close, rig, CloseReason.WORKSPACE_GONE, None)
        return [r.row.id for r in rigs]

    async def retry(self, caller: Caller, raw: object) -> dict[str, Any]:
        """Replace a failed rig with a fresh machine opened the same way."""
        params = obj(raw)
        no_extra(params, {"rigId"})
        rig_id = ident(params, "rigId")
        assert rig_id is not None
        row, db, rig = await self._visible(caller, rig_id)
        if row.phase != Phase.FAILED.value and not (
            row.phase == Phase.CLOSED.value and row.close_reason == CloseReason.BACKEND_FAILURE.value
        ):
            raise Conflict(f"rig {rig_id} is {row.phase}; only a failed rig can be retried")
        if rig is not None:
            await self.audit_event(rig, caller, "retry", {})
            await self._close(rig, CloseReason.BACKEND_FAILURE, None)
        opened = rig.params if rig is not None and rig.params is not None else parse_open(
            {"workspace": row.workspace_id, "surface": row.surface,
             "conversation": row.conversation, "memoryMb": row.memory_mb, "vcpus": row.vcpus,
             "ttlS": row.ttl_s, "idleS": row.idle_s},
            frozenset(self.backends),
        )
        fresh = await self._start(caller, opened, row.workspace_id, db)
        answer = await self._answer_open(fresh, True)
        return {**answer, "retryOf": rig_id}

    # -- events ---------------------------------------------------------------------------

    async def events_since(self, caller: Caller, raw: object) -> list[dict[str, Any]]:
        params = obj(raw)
        no_extra(params, {"workspace", "afterId"})
        ref = string(params, "workspace", max_len=128)
        assert ref is not None
        after = integer(params, "afterId", 0, 2**62, 0)
        ws_id = await self._workspace_for(caller, ref)
        db = await self.stores.workspace(ws_id)
        return await self.stores.run(db.events, after_id=after)

    async def _execute(self, rig: LiveRig, machine: Machine, action: object) -> dict[str, Any]:
        if isinstance(action, TerminalExec):
            result = await self.exec(machine, action, max_output=EXEC_OUTPUT_LIMIT)
            return exec_json(result, EXEC_OUTPUT_LIMIT)
        answer = await machine.perform(action)
        display = answer.get("display")
        if (isinstance(display, dict) and isinstance(display.get("width"), int)
                and isinstance(display.get("height"), int)
                and (display["width"], display["height"]) != (rig.row.display_w, rig.row.display_h)):
            # The mode changed (set_display, or the guest itself): coordinates of
            # later actions are checked against the new one.
            await self._update(rig, display_w=display["width"], display_h=display["height"])
        return answer

    async def exec(self, machine: Machine, action: TerminalExec, *, max_output: int) -> ExecResult:
        return await machine.exec(
            list(action.program), cwd=action.cwd, env=action.env_dict or None, stdin=action.stdin,
            timeout_s=action.timeout_s, max_output=max_output,
        )

    async def audit_event(
        self, rig: LiveRig, caller: Caller, verb: str, args: dict[str, Any]
    ) -> None:
        with trio.CancelScope(shield=True):
            seq = await self.stores.run(
                rig.db.begin_action, rig.row.id, actor_kind=caller.actor_kind,
                actor_id=caller.actor_id, tool="rig", verb=verb, args=args,
            )
            await self.stores.run(rig.db.finish_action, rig.row.id, seq, outcome="ok",
                                  error=None, duration_ms=0)

    # -- audit log ------------------------------------------------------------------------

    async def actions(self, caller: Caller, raw: object) -> list[dict[str, Any]]:
        params = obj(raw)
        no_extra(params, {"rigId", "afterSeq"})
        rig_id = ident(params, "rigId")
        assert rig_id is not None
        after = params.get("afterSeq", 0)
        if not isinstance(after, int) or isinstance(after, bool) or after < 0:
            raise FieldError("afterSeq", "must be a non-negative integer")
        _row, db, _live = await self._visible(caller, rig_id)
        rows = await self.stores.run(db.actions, rig_id, after_seq=after)
        return [r.to_json() for r in rows]

    # -- terminals (PTY) ----------------------------------------------------------------

    async def terminal_rig(self, caller: Caller, rig_id: str) -> LiveRig:
        """The rig behind a PTY session: woken if parked; typing changes state, so
        a person's control lease is respected."""
        return await self._lane_rig(caller, rig_id, "open a terminal", "woken by a terminal",
                                    control=True)

    async def _lane_rig(self, caller: Caller, rig_id: str, doing: str, woken: str, *,
                        control: bool = False, watch: bool = False) -> LiveRig:
        """A running rig for a WebSocket lane, woken if parked (and pinned by a watcher)."""
        row, _db, live = await self._visible(caller, rig_id)
        if live is None or live.phase not in lifecycle.LIVE:
            raise Conflict(f"rig {rig_id} is {row.phase}; cannot {doing}")
        if control:
            self._check_control(live, caller)
        if watch:
            self.keep_watched(live)
        async with live.state_lock:
            if live.phase is Phase.PARKED:
                await self._wake(live, woken)
            lifecycle.require_phase(live.phase, frozenset({Phase.READY}), doing)
        if live.machine is None:
            raise Conflict(f"rig {rig_id}: the machine is not running")
        return live

    def note_activity(self, rig: LiveRig) -> None:
        """Cheap, in-memory activity (a keystroke in a terminal)."""
        rig.last_active = self.clock()


def exec_json(result: ExecResult, limit: int) -> dict[str, Any]:
    out: dict[str, Any] = {
        "exitCode": result.exit_code,
        "signal": result.signal,
        "timedOut": result.timed_out,
        "durationMs": result.duration_ms,
        "stdout": untrusted_bytes(result.stdout, truncated=result.stdout_truncated, limit=limit),
        "stderr": untrusted_bytes(result.stderr, truncated=result.stderr_truncated, limit=limit),
    }
    if result.timed_out:
        out["note"] = "the command timed out; its whole process group was killed"
    return out


def _remove_runtime(data_dir: Path, rig_id: str) -> None:
    shutil.rmtree(data_dir / "rigs" / "smolvm" / rig_id, ignore_errors=True)
    (data_dir / "rigs" / "run" / f"{rig_id}.qcow2").unlink(missing_ok=True)


async def _kill_pid(pid: int, ticks: int | None) -> None:
    for sig, wait_s in ((signal.SIGTERM, 3.0), (signal.SIGKILL, 5.0)):
        if not proc_alive(pid, ticks):
            return
        try:
            os.kill(pid, sig)
        except ProcessLookupError:
            return
        deadline = trio.current_time() + wait_s
        # Not our child (its parent was the crashed server): nothing to wait on but /proc.
        while trio.current_time() < deadline and proc_alive(pid, ticks):  # noqa: ASYNC110
            await trio.sleep(0.05)


def _egress_json(policy: Policy | None, defaults: bool) -> str | None:
    if policy is None:
        return None
    return json.dumps({"allow": list(policy.allow), "defaults": defaults})


def _iso_at(epoch: float) -> str:
    from datetime import UTC, datetime

    return iso(datetime.fromtimestamp(epoch, UTC))


def _remove_orphans(data_dir: Path) -> None:
    """At start-up nothing is live: whatever runtime files or rig QEMUs remain
    (a crash between spawning QEMU and recording its pid) are orphans."""
    marker = f"{data_dir}/rigs/smolvm/".encode()
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
    for sub in ("smolvm", "run"):
        folder = data_dir / "rigs" / sub
        if folder.is_dir():
            for child in folder.iterdir():
                if child.is_dir():
                    shutil.rmtree(child, ignore_errors=True)
                else:
                    child.unlink(missing_ok=True)
