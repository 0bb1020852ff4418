"""The rig manager: opens, drives, watches and closes rigs.

Each live rig is owned by one task in the manager's nursery. That task enters
the backend's ``open_machine`` context (boot), marks the rig ``ready``, and
then waits for one of two things: the machine dying on its own (the rig
becomes ``failed`` with ``backendFailure``), or a close, which cancels the
task so the backend tears the machine down in a shielded scope. Phase changes
go through :func:`rigd.rigs.lifecycle.check_transition` and are written to the
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
Why one module of this size: :class:`RigManager` is the one owner of the live rig table,
the admission lock (memory budget and eviction) and each rig's ``state_lock``; every flow
here (open, fork, open from a snapshot, a volume's attachments, park, wake, close, the
reaper) takes those locks in one order, and splitting the flows across modules would have
each reach back into the others' locks. What needs no lock is elsewhere: the pure plans
(:mod:`rigd.rigs.scheduler`, :mod:`rigd.rigs.lifecycle`), the stores
(:mod:`rigd.rigs.volumes`, :mod:`rigd.rigs.snapshots`), pools and seats.
"""

from __future__ import annotations

import dataclasses
import functools
import hashlib
import logging
import math
import time
from collections.abc import AsyncIterator, Awaitable, Callable, Mapping, Sequence
from contextlib import asynccontextmanager
from datetime import timedelta
from typing import Any

import trio

from netgate.errors import NetgateError
from netgate.policy import Policy, build_policy
from rigd.backends.base import (
    ExecResult,
    ForkImage,
    Machine,
    MachineBackend,
    MachineSpec,
    NetSpec,
    VolumeMount,
)
from rigd.backends.layout import LeftBehind, remove_tree
from rigd.browser.profiles import ProfileState, ProfileStore
from rigd.errors import BackendError, Conflict, FieldError, NotFound, RigdError, from_netgate, leaves
from rigd.model import (
    ACCEL_OF,
    DESKTOP_SESSION_USER,
    Accel,
    Backend,
    CloseReason,
    Phase,
    Surface,
)
from rigd.ports.hub import PortsHub
from rigd.ports.mux import MuxError
from rigd.protocols.input import Step
from rigd.rigs import lifecycle
from rigd.rigs.events import EventBus
from rigd.rigs.failure import describe_failure
from rigd.rigs.guard import (
    SNAPSHOT_QUOTA,
    SNAPSHOT_QUOTA_DEFAULT_MB,
    VOLUME_QUOTA,
    VOLUME_QUOTA_DEFAULT_MB,
    WorkspaceSettings,
    custom_image,
)
from rigd.rigs.live import (
    NET_AUDIT_BUFFER,
    Caller,
    LiveRig,
    egress_json,
    net_audit_sink,
    profile_owner,
    renewed_lease,
    rig_state,
    write_net_audit,
)
from rigd.rigs.params import OpenParams
from rigd.rigs.pool_service import POOL_WORKSPACE, PoolService
from rigd.rigs.pools import DEFAULT_MAX_AGE_S, PoolKey
from rigd.rigs.render import exec_json, rig_json
from rigd.rigs.scheduler import Admit, Park, counted, plan_admission, plan_idle
from rigd.rigs.snapshots import SnapshotShelf
from rigd.rigs.volumes import VolumeShelf
from rigd.store.aio import Stores
from rigd.store.util import iso, new_id, utcnow
from rigd.store.workspace_db import RigRow, WorkspaceDB
from rigd.verbs import Action, TerminalExec
from rigd.verbs.terminal import as_user

log = logging.getLogger("rigd.rigs")

#: Output kept per stream of an ``exec`` answered over RPC.
EXEC_OUTPUT_LIMIT = 2 * 1024 * 1024

#: Control leases (RIGS.md §12) and watch heartbeats (~2 s; lapse after ~10 s).
CONTROL_LEASE_S = 15 * 60
WATCH_LAPSE_S = 10.0
DEFAULT_MEMORY_BUDGET_MB = 12 * 1024



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
        recover: Callable[[Sequence[LeftBehind]], Awaitable[set[str]]] | None = None,
        pools: Mapping[PoolKey, int] | None = None,
        pool_max_age_s: float = DEFAULT_MAX_AGE_S,
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
        self.open_locks: dict[tuple[str, str], trio.Lock] = {}
        self._admission = trio.Lock()
        #: How rigs reach the network: "gateway" (netgate), or None (no network at all).
        self.network = network
        #: The backends' crash recovery (kills survivors by pid + start time, removes runtime files).
        self._recover = recover
        #: A workspace's settings (rigd.guard), for its custom images; None: built-in images only.
        self.settings_of: Callable[[str], Awaitable[WorkspaceSettings]] | None = None
        #: Forwarded ports and dev domains (RIGS.md §8); None: the server forwards none.
        self.ports: PortsHub | None = None
        #: Whether a workspace has credential-broker secrets (its rigs then boot trusting the
        #: broker's CA, so no pooled rig serves it); None: no broker.
        self.brokered: Callable[[str], Awaitable[bool]] | None = None
        #: Rigs booted before anyone asks (issue 28; every pool 0 unless configured).
        self.pools = PoolService(self, pools or {}, max_age_s=pool_max_age_s)
        #: Named snapshots (issue 29), and the ones an open is restoring from now (never removed
        #: under it): (workspace, name) → rig ids.
        self.shelf = SnapshotShelf(stores.data_dir / "snapshots")
        self.snapshot_users: dict[tuple[str, str], set[str]] = {}
        self._snapshot_lock = trio.Lock()
        #: Volumes (issue 29) and the rigs they are attached to: (workspace, name) → {rig: readOnly}.
        self.volumes = VolumeShelf(stores.data_dir / "volumes")
        self.volume_users: dict[tuple[str, str], dict[str, bool]] = {}
        self._volume_lock = trio.Lock()

    # -- service lifetime -------------------------------------------------------

    async def run(self, *, task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED) -> None:
        await self.recover()
        try:
            async with trio.open_nursery() as nursery:
                self._nursery = nursery
                nursery.start_soon(self._reaper)
                nursery.start_soon(self.pools.run)
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
                    nursery.start_soon(self.close_rig, rig, CloseReason.SERVER_SHUTDOWN, None)

    async def recover(self) -> None:
        """Settle rigs a previous server left live (it crashed or was killed).

        The backends' recovery (one call: :meth:`rigd.backends.layout.Layout.recover`)
        kills what survived and removes every runtime file; here the store
        learns the outcome: survivors close with ``serverShutdown``, rigs whose
        QEMU had already died with ``backendFailure``, and pending audit rows
        become ``interrupted``.
        """
        left: list[tuple[WorkspaceDB, RigRow]] = []
        await trio.to_thread.run_sync(self.shelf.sweep)
        await trio.to_thread.run_sync(self.volumes.sweep)
        ws_ids = [ws.id for ws in await self.stores.run(self.stores.server.all_workspaces)]
        for ws_id in [*ws_ids, POOL_WORKSPACE]:  # the pools' own rows too
            db = await self.stores.workspace(ws_id)
            await self.stores.run(db.abandon_pending)
            left += [(db, row) for row in await self.stores.run(db.live_rigs)]
        alive: set[str] = set()
        if self._recover is not None:
            alive = await self._recover([LeftBehind(r.id, r.pid, r.pid_start_ticks) for _db, r in left])
        for db, row in left:
            reason = CloseReason.SERVER_SHUTDOWN if row.id in alive else CloseReason.BACKEND_FAILURE
            await self.stores.run(
                db.update_rig, row.id, phase=Phase.CLOSED.value,
                phase_detail="closed after a server restart",
                close_reason=row.close_reason or reason.value, closed_at=iso(utcnow()),
            )
            log.info("recovered rig", extra={"rig": row.id, "reason": reason.value})
            if db.workspace_id == POOL_WORKSPACE:  # never anyone's: nothing to keep
                await self.stores.run(db.delete_rig, row.id)

    # -- visibility -------------------------------------------------------------

    async def workspace_for(self, caller: Caller, ref: str) -> str:
        ws = await self.stores.run(self.stores.server.resolve_workspace, caller.user.id, ref)
        return ws.id

    async def visible(self, caller: Caller, rig_id: str) -> tuple[RigRow, WorkspaceDB, LiveRig | None]:
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

    def memory_in_use_mb(self) -> int:
        """What the memory budget counts now: the resident memory of running and starting rigs."""
        now = self.clock()
        return sum(s.resident_mb for s in counted([rig_state(r, now) for r in self.live.values()]))

    def rig_json(self, row: RigRow, live: LiveRig | None = None) -> dict[str, Any]:
        now = self.clock()
        pins = rig_state(live, now).pins(now) if live is not None else ()
        out = rig_json(row, live, now=now, network=self.network, pins=pins)
        ports = self.ports_json(row.id) if live is not None and live.machine is not None else None
        out["ports"] = ports["ports"] if ports is not None else []
        return out

    async def wait_settled(self, caller: Caller, rig_id: str) -> None:
        """Wait until a rig that is coming up is ready (or failed)."""
        _row, _db, live = await self.visible(caller, rig_id)
        if live is not None:
            await live.settled.wait()

    # -- open -----------------------------------------------------------------------

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
        try:
            return build_policy(surface.value, allow, defaults=defaults)
        except NetgateError as exc:
            raise from_netgate(exc) from None

    async def start(
        self, caller: Caller, params: OpenParams, ws_id: str, db: WorkspaceDB, *, seat: str | None = None
    ) -> LiveRig:
        assert self._nursery is not None, "RigManager.run is not running"
        policy = self.egress_policy(params.surface, list(params.egress_allow), params.egress_defaults)
        image_ref, image_note = None, None
        if self.settings_of is not None:
            image_ref, image_note = custom_image(await self.settings_of(ws_id), params.surface.value,
                                                 params.engine.value if params.engine else None)
        if params.snapshot is not None:
            return await self._start_from_snapshot(caller, params, ws_id, db, policy)
        taken, start_note = None, None
        if not params.volumes:  # (a pooled rig has no volume: it is one disk short)
            taken, start_note = await self.pools.take(caller, params, ws_id, db, policy,
                                                      custom=image_ref is not None)
        if taken is not None:
            return taken
        async with self._admission, self._volume_lock:
            mounts = await self._volume_mounts(ws_id, params)
            await self._make_room(params.memory_mb, field="memoryMb")
            row = self.new_row(params, ws_id, policy, created_by=caller.user.id, image_ref=image_ref,
                               image_note=image_note, start_note=start_note)
            row.seat = seat
            for m in mounts:
                self.volume_users.setdefault((ws_id, m.name), {})[row.id] = m.read_only
            try:
                return await self.launch(row, db, params, policy, caller=caller, volumes=mounts)
            except BaseException:
                self._release_volumes(ws_id, row.id, mounts)
                raise

    async def _make_room(self, need_mb: int, *, field: str, keep: LiveRig | None = None) -> None:
        """Admit ``need_mb`` more into the memory budget, evicting whom the scheduler names
        (never ``keep``); a conflict naming ``field`` when there is no room. Call with
        ``_admission`` held."""
        decision = plan_admission(
            [rig_state(r, self.clock()) for r in self.live.values()],
            budget_mb=self.memory_budget_mb, need_mb=need_mb, now=self.clock(),
        )
        if not isinstance(decision, Admit):
            raise Conflict(decision.reason, field=field, budgetMb=self.memory_budget_mb)
        for victim in decision.evict:
            rig = self.live.get(victim)
            if rig is not None and rig is not keep:
                await self._reap(rig, CloseReason.IDLE_TIMEOUT,
                                 f"evicted to make room in the {self.memory_budget_mb} MB budget")

    def new_row(self, params: OpenParams, ws_id: str, policy: Policy | None, *, created_by: str,
                image_ref: str | None = None, image_note: str | None = None,
                start_note: str | None = None) -> RigRow:
        """A new rig's row, provisioning, from its open's parameters."""
        now = utcnow()
        return RigRow(
            id=new_id("rig"), workspace_id=ws_id, conversation=params.conversation,
            surface=params.surface.value, engine=params.engine.value if params.engine else None,
            backend=params.backend.value, accel=self.accel.value if self.accel else None,
            phase=Phase.PROVISIONING.value, phase_detail="queued", close_reason=None, failure=None,
            display_w=params.display.width if params.display else None,
            display_h=params.display.height if params.display else None,
            memory_mb=params.memory_mb, vcpus=params.vcpus, ttl_s=params.ttl_s,
            idle_s=params.idle_s, image=None,
            exec_image=params.surface is Surface.TERMINAL, created_by=created_by,
            controller_kind=None, controller_id=None, created_at=iso(now),
            last_active_at=iso(now), expires_at=iso(now + timedelta(seconds=params.ttl_s)),
            closed_at=None, pid=None, pid_start_ticks=None, console_tail=None,
            egress=egress_json(policy, params.egress_defaults),
            image_ref=image_ref, image_note=image_note, start_note=start_note,
        )

    async def launch(self, row: RigRow, db: WorkspaceDB, params: OpenParams, policy: Policy | None, *,
                     caller: Caller | None = None, pool: PoolKey | None = None,
                     fork: ForkImage | None = None, seed: ProfileState | None = None,
                     volumes: tuple[VolumeMount, ...] = ()) -> LiveRig:
        """Store ``row``, write the caller's ``open`` row (a fork's copy: its ``forkedFrom``
        row), and start the rig's task (the machine boots in the background). A pooled rig
        (``pool``, no caller) is kept in the pools' own database and indexed under no
        workspace: no caller sees it until it is taken."""
        assert self._nursery is not None, "RigManager.run is not running"
        await self.stores.run(db.insert_rig, row)
        if pool is None:
            await self.stores.run(self.stores.server.index_rig, row.id, row.workspace_id)
        now = self.clock()
        rig = LiveRig(row=row, db=db, params=params, last_active=now,
                      expires_at=now + params.ttl_s if pool is None else float("inf"), policy=policy,
                      pool_key=pool, pooled_at=now, fork=fork, seed=seed, volumes=volumes)
        self.live[row.id] = rig
        if caller is not None:
            if caller.actor_kind == "agent":
                rig.last_agent = caller.actor_id
            if row.forked_from is not None:
                await self.audit_event(rig, caller, "forkedFrom", {
                    "rigId": row.forked_from, "surface": row.surface, "memoryMb": row.memory_mb,
                    "vcpus": row.vcpus, **({"pausedMs": round(fork.paused_s * 1000)} if fork else {})})
            else:
                await self.audit_event(rig, caller, "open", {
                    "surface": row.surface, "memoryMb": row.memory_mb, "vcpus": row.vcpus,
                    **({"snapshot": params.snapshot} if params.snapshot else {}),
                    **({"volumes": [{"name": v.name, "path": v.path, "readOnly": v.read_only}
                                    for v in volumes]} if volumes else {})})
        await self._nursery.start(self._rig_task, rig, self.backends[params.surface])
        return rig

    # -- fork (issue 29) -------------------------------------------------------------------

    async def fork(self, caller: Caller, rig_id: str, count: int) -> list[LiveRig]:
        """``count`` copies of a ready rig, owned by the caller, each behind its own gate with
        the parent's allowlist. Returns once every copy is ready or failed; nothing is created
        when the budget has no room.

        A terminal or computer rig is frozen once (RAM and a disk copy,
        :meth:`MachineBackend.freeze`) and resumes untouched; each copy restores that instant.
        A browser rig's running engine is never shared (its random state would be): each copy
        is a fresh browser rig of the same engine, seeded with the parent engine's cookies,
        local storage and open tab."""
        row, db, parent = await self.visible(caller, rig_id)
        not_ready = FieldError("rigId", f"rig {rig_id} is {row.phase}; only a ready rig can be forked"
                                        + (" (an action wakes it)" if row.phase == Phase.PARKED.value
                                           else ""))
        if parent is None or parent.phase is not Phase.READY or parent.machine is None:
            raise not_ready
        surface = Surface(row.surface)
        if surface not in (Surface.TERMINAL, Surface.COMPUTER, Surface.BROWSER):
            raise FieldError("rigId", f"a {surface} rig cannot be forked")
        self.check_control(parent, caller)
        if parent.volumes:
            names = ", ".join(v.name for v in parent.volumes)
            raise FieldError("rigId", f"rig {rig_id} has volumes attached ({names}); copies would share "
                                      "their disks: fork a rig without volumes")
        params = parent.params
        if params is None:
            raise Conflict(f"rig {rig_id} has no open parameters to copy")
        # (a copy belongs to no conversation, and keeps no named profile: one engine per profile)
        params = dataclasses.replace(params, conversation=None, wait=True, profile=None)
        backend = self.backends[surface]
        self.note_activity(parent)  # (the parent is in use: never the eviction's choice)
        children: list[LiveRig] = []
        image: ForkImage | None = None
        seed: ProfileState | None = None
        try:
            async with self._admission:
                await self._make_room(count * row.memory_mb, field="count", keep=parent)
                async with parent.state_lock:
                    machine = parent.machine
                    if parent.phase is not Phase.READY or machine is None:
                        raise not_ready
                    if surface is Surface.BROWSER:
                        seed = await machine.browser_state()
                    else:
                        image = await backend.freeze(machine)
                for _ in range(count):
                    copy = self.new_row(params, row.workspace_id, parent.policy, created_by=caller.user.id,
                                        image_ref=row.image_ref)
                    copy.display_w, copy.display_h = row.display_w, row.display_h
                    copy.exec_image = row.exec_image
                    copy.egress = row.egress
                    copy.forked_from = rig_id
                    children.append(await self.launch(copy, db, params, parent.policy, caller=caller,
                                                      fork=image, seed=seed))
            audit: dict[str, Any] = {"count": count, "rigs": [c.row.id for c in children]}
            if image is not None:
                audit.update(pausedMs=round(image.paused_s * 1000), ramBytes=image.ram_bytes)
            else:
                audit.update(engine=row.engine, freshEngines=True)
            await self.audit_event(parent, caller, "fork", audit)
        finally:
            if image is not None:
                # The frozen state serves the copies' restores; once each is up (or failed), it goes.
                assert self._nursery is not None
                self._nursery.start_soon(self._drop_fork_image, image, list(children))
        for child in children:
            await child.settled.wait()
        return children

    # -- volumes (issue 29) ----------------------------------------------------------------

    async def _volume_mounts(self, ws_id: str, params: OpenParams) -> tuple[VolumeMount, ...]:
        """The open's volumes, checked: each exists, and one writer or any readers at a time.
        Call with ``_volume_lock`` held (the caller registers the attachments)."""
        out = []
        for i, req in enumerate(params.volumes):
            field = f"volumes[{i}].name"
            vol = await trio.to_thread.run_sync(self.volumes.get, ws_id, req.name, field)
            users = self.volume_users.get((ws_id, req.name), {})
            writers = sorted(r for r, ro in users.items() if not ro)
            if writers:
                raise FieldError(field, f"volume {req.name!r} is attached read-write to rig {writers[0]}; "
                                        "one writer at a time, and no reader beside it")
            if users and not req.read_only:
                raise FieldError(field, f"volume {req.name!r} is attached read-only to "
                                        f"{', '.join(sorted(users))}; a writer needs it alone")
            out.append(VolumeMount(req.name, vol.image, req.path, req.read_only))
        return tuple(out)

    def _release_volumes(self, ws_id: str, rig_id: str, mounts: Sequence[VolumeMount]) -> None:
        for m in mounts:
            users = self.volume_users.get((ws_id, m.name))
            if users is not None:
                users.pop(rig_id, None)
                if not users:
                    self.volume_users.pop((ws_id, m.name), None)

    def attached(self, ws_id: str, name: str) -> list[str]:
        return sorted(self.volume_users.get((ws_id, name), {}))

    async def volume_create(self, caller: Caller, workspace: str, name: str, size_mb: int) -> dict[str, Any]:
        ws = await self.workspace_for(caller, workspace)
        quota = await self.setting_mb(ws, VOLUME_QUOTA, VOLUME_QUOTA_DEFAULT_MB)
        async with self._volume_lock:
            used = await trio.to_thread.run_sync(self.volumes.size_used_mb, ws)
            if used + size_mb > quota:
                raise FieldError("sizeMb", f"{size_mb} MB would bring this workspace's volumes to "
                                           f"{used + size_mb} MB, over its {quota} MB (volumes.quotaMb)")
            vol = await trio.to_thread.run_sync(functools.partial(
                self.volumes.create, ws, name, size_mb, created_at=iso(utcnow()), created_by=caller.user.id))
        return vol.to_json([])

    async def volume_list(self, caller: Caller, workspace: str) -> list[dict[str, Any]]:
        ws = await self.workspace_for(caller, workspace)
        listed = await trio.to_thread.run_sync(self.volumes.list, ws)
        return [v.to_json(self.attached(ws, v.name)) for v in listed]

    async def volume_rm(self, caller: Caller, workspace: str, name: str) -> dict[str, Any]:
        ws = await self.workspace_for(caller, workspace)
        async with self._volume_lock:
            users = self.attached(ws, name)
            if users:
                raise Conflict(f"volume {name!r} is attached to {', '.join(users)}; close "
                               f"{'it' if len(users) == 1 else 'them'} first", field="name", rigs=users)
            await trio.to_thread.run_sync(self.volumes.remove, ws, name)
        return {"name": name, "workspace": ws, "removed": True}

    # -- named snapshots (issue 29) -------------------------------------------------------

    async def setting_mb(self, ws_id: str, key: str, default: int) -> int:
        """A workspace's MB setting (a quota), or its default on a server without settings."""
        if self.settings_of is None:
            return default
        return int((await self.settings_of(ws_id)).values.get(key, default))

    async def snapshot_create(self, caller: Caller, rig_id: str, name: str) -> dict[str, Any]:
        """Keep a ready terminal or computer rig's RAM and disk as ``name`` in its workspace (one
        pause, as a fork's); counted against the workspace's ``snapshots.quotaMb``."""
        row, _db, rig = await self.visible(caller, rig_id)
        if rig is None or rig.phase is not Phase.READY or rig.machine is None:
            raise FieldError("rigId", f"rig {rig_id} is {row.phase}; only a ready rig can be snapshotted")
        surface = Surface(row.surface)
        if surface not in (Surface.TERMINAL, Surface.COMPUTER):
            raise FieldError("rigId", f"a {surface} rig's running engine is never kept (its random state "
                                      "would be shared); its cookies, storage and tabs are kept by "
                                      "opening it with a profile")
        self.check_control(rig, caller)
        if rig.volumes:
            raise FieldError("rigId", f"rig {rig_id} has volumes attached; a snapshot keeps one machine's "
                                      "disk, not its volumes: snapshot a rig without volumes")
        ws = row.workspace_id
        quota = await self.setting_mb(ws, SNAPSHOT_QUOTA, SNAPSHOT_QUOTA_DEFAULT_MB) << 20
        async with self._snapshot_lock:  # (one create at a time: quota and names stay true)
            used = await trio.to_thread.run_sync(self.shelf.bytes_used, ws)
            if used >= quota:
                raise Conflict(f"this workspace's snapshots use {used >> 20} MB of its {quota >> 20} MB "
                               "(snapshots.quotaMb); remove one first", field="name",
                               usedMb=used >> 20, quotaMb=quota >> 20)
            if await trio.to_thread.run_sync(self._snapshot_exists, ws, name):
                raise Conflict(f"a snapshot named {name!r} exists in this workspace; snapshot.rm it "
                               "first", field="name")
            async with rig.state_lock:
                machine = rig.machine
                if rig.phase is not Phase.READY or machine is None:
                    raise FieldError("rigId", f"rig {rig_id} is {rig.row.phase}; only a ready rig can be "
                                              "snapshotted")
                image = await self.backends[surface].freeze(machine, standalone=True)
            kept = await trio.to_thread.run_sync(functools.partial(
                self.shelf.commit, image, ws, name, created_at=iso(utcnow()), created_by=caller.user.id,
                base=image.base))
            if used + int(kept.meta["bytes"]) > quota:
                await trio.to_thread.run_sync(self.shelf.remove, ws, name)
                raise Conflict(f"snapshot {name!r} would take {int(kept.meta['bytes']) >> 20} MB; this "
                               f"workspace has {(quota - used) >> 20} MB of its {quota >> 20} MB left "
                               "(snapshots.quotaMb)", field="name", usedMb=used >> 20, quotaMb=quota >> 20)
        await self.audit_event(rig, caller, "snapshot", {"name": name, "bytes": kept.meta["bytes"],
                                                         "pausedMs": kept.meta["pausedMs"]})
        return kept.to_json()

    def _snapshot_exists(self, ws: str, name: str) -> bool:
        return self.shelf.dir_of(ws, name).exists()

    async def snapshot_list(self, caller: Caller, workspace: str) -> list[dict[str, Any]]:
        ws = await self.workspace_for(caller, workspace)
        return [k.to_json() for k in await trio.to_thread.run_sync(self.shelf.list, ws)]

    async def snapshot_rm(self, caller: Caller, workspace: str, name: str) -> dict[str, Any]:
        ws = await self.workspace_for(caller, workspace)
        async with self._snapshot_lock:
            users = sorted(self.snapshot_users.get((ws, name), ()))
            if users:
                raise Conflict(f"snapshot {name!r} is being opened by {', '.join(users)}; remove it once "
                               "they are up", field="name", rigs=users)
            await trio.to_thread.run_sync(self.shelf.remove, ws, name)
        return {"name": name, "workspace": ws, "removed": True}

    async def drop_profiles(self, owner: str, name: str) -> None:
        """Delete a profile of every engine (a removed seat's)."""
        await trio.to_thread.run_sync(ProfileStore(self.stores.data_dir).remove, owner, name)

    async def _start_from_snapshot(self, caller: Caller, params: OpenParams, ws_id: str, db: WorkspaceDB,
                                   policy: Policy | None) -> LiveRig:
        """``rig.open {snapshot}``: a rig restored from the named snapshot's RAM and disk, made
        unique as a fork's copy is; its memory, vCPUs and display are the snapshot's."""
        name = params.snapshot
        assert name is not None
        key = (ws_id, name)
        async with self._snapshot_lock:
            image = await trio.to_thread.run_sync(self.shelf.open, ws_id, name)
            if image.spec.surface is not params.surface:
                raise FieldError("snapshot", f"is a {image.spec.surface} snapshot; this open asks for a "
                                             f"{params.surface} rig")
            users = self.snapshot_users.setdefault(key, set())
            spec = image.spec
            params = dataclasses.replace(params, memory_mb=spec.memory_mb, vcpus=spec.vcpus)
            async with self._admission:
                await self._make_room(spec.memory_mb, field="memoryMb")
                row = self.new_row(params, ws_id, policy, created_by=caller.user.id, image_ref=spec.image,
                                   start_note=f"resumed from snapshot {name!r}: processes continue "
                                              "with the memory they had when it was taken; machine-id, "
                                              "MAC and kernel RNG are this rig's own")
                if spec.display is not None:
                    row.display_w, row.display_h = spec.display
                rig = await self.launch(row, db, params, policy, caller=caller, fork=image)
                users.add(row.id)

        async def release() -> None:
            await rig.settled.wait()
            rig.fork = None
            async with self._snapshot_lock:
                users.discard(row.id)
                if not users:
                    self.snapshot_users.pop(key, None)

        assert self._nursery is not None
        self._nursery.start_soon(release)
        return rig

    async def _drop_fork_image(self, image: ForkImage, children: Sequence[LiveRig]) -> None:
        for child in children:
            await child.settled.wait()
            child.fork = None
        await trio.to_thread.run_sync(remove_tree, image.dir)

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
                        own.start_soon(write_net_audit, self.stores, rig, receive)
                        network = NetSpec(policy=rig.policy, audit=net_audit_sink(rig),
                                          workspace=row.workspace_id)
                    if rig.fork is not None:
                        # A copy starts QEMU exactly as its parent did; only id, network and files differ.
                        spec = dataclasses.replace(rig.fork.spec, rig_id=row.id, network=network,
                                                   fork=rig.fork)
                    else:
                        spec = MachineSpec(
                            rig_id=row.id, surface=Surface(row.surface), memory_mb=row.memory_mb,
                            vcpus=row.vcpus, network=network, accel=ACCEL_OF.get(Backend(row.backend)),
                            display=((row.display_w, row.display_h) if row.display_w and row.display_h
                                     else None),
                            engine=row.engine,
                            profile=(profile_owner(row), rig.profile) if rig.profile else None,
                            image=row.image_ref, browser_state=rig.seed, volumes=rig.volumes,
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
            # The machine is gone (QEMU quit, its volumes unmounted): they may be attached again.
            self._release_volumes(row.workspace_id, row.id, rig.volumes)
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
            await self.update(rig, pid=info.pid, pid_start_ticks=info.pid_start_ticks,
                               image=info.image, accel=info.accel.value, start=info.boot)
            await self._transition(rig, Phase.READY, "ready")
            rig.settled.set()
            channel = machine.port_channel()
            if self.ports is None or channel is None:
                reason = await machine.wait_failed()
            else:
                # The rig's ports live exactly as long as its machine (gone at once on close).
                async with trio.open_nursery() as nursery:
                    nursery.start_soon(functools.partial(
                        self.ports.serve_rig, rig.row.id, channel,
                        functools.partial(self._run_in_guest, machine),
                        awake=lambda: rig.phase is Phase.READY,
                        on_connect=functools.partial(self._port_connection, rig)))
                    reason = await machine.wait_failed()
                    nursery.cancel_scope.cancel()
            await self._fail(rig, reason, machine.console_tail())

    @staticmethod
    async def _run_in_guest(machine: Machine, argv: tuple[str, ...]) -> None:
        """Run one of rigd's own helpers in the guest (not an agent's action: not audited)."""
        res = await machine.exec(argv, cwd=None, env=None, stdin=None, timeout_s=20, max_output=4096)
        if res.exit_code != 0:
            err = res.stderr.decode("utf-8", "replace").strip()[-300:]
            raise MuxError(f"starting {argv[-1].split()[0]} in the guest failed "
                           f"(exit {res.exit_code}): {err}")

    async def _port_connection(self, rig: LiveRig) -> None:
        """A connection through a rig's forward or dev domain: it is activity, and wakes a parked rig."""
        self.note_activity(rig)
        if rig.phase is Phase.PARKED:
            async with rig.state_lock:
                if rig.phase is Phase.PARKED:
                    await self.wake(rig, "woken by a connection to a forwarded port")

    def ports_json(self, rig_id: str) -> dict[str, Any] | None:
        return self.ports.describe(rig_id) if self.ports is not None else None

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

    async def update(self, rig: LiveRig, **changes: Any) -> None:
        for name, value in changes.items():
            setattr(rig.row, name, value)
        with trio.CancelScope(shield=True):
            await self.stores.run(rig.db.update_rig, rig.row.id, **changes)

    async def _transition(self, rig: LiveRig, target: Phase, detail: str, **changes: Any) -> None:
        lifecycle.check_transition(rig.phase, target)
        await self.update(rig, phase=target.value, phase_detail=detail, **changes)
        logging.getLogger(f"rigd.rig.{rig.row.id}").info(
            "phase", extra={"phase": target.value, "detail": detail}
        )
        await self.events.publish(rig.row.workspace_id, rig.row.id, "RigPhaseChanged",
                                  phase=target.value, phaseDetail=detail)

    async def mark_ready(self, rig: LiveRig, detail: str) -> None:
        """A rig that was handed over (a pooled rig, taken) is ready for its caller."""
        await self._transition(rig, Phase.READY, detail)

    async def _fail(self, rig: LiveRig, reason: str, console: str | None) -> None:
        if not lifecycle.can_transition(rig.phase, Phase.FAILED):
            return
        await self._transition(
            rig, Phase.FAILED, reason[:300], failure=reason[:2000],
            close_reason=CloseReason.BACKEND_FAILURE.value,
            console_tail=(console or "")[-4096:] or None,
        )
        rig.settled.set()

    async def close_rig(self, rig: LiveRig, reason: CloseReason, caller: Caller | None) -> None:
        with trio.CancelScope(shield=True):
            async with rig.close_lock:
                if rig.phase is Phase.CLOSED:
                    return
                if caller is not None:
                    await self.audit_event(rig, caller, "close", {"reason": reason.value})
                parked = rig.phase is Phase.PARKED
                if rig.phase is not Phase.FAILED:
                    await self._transition(rig, Phase.CLOSING, "stopping the machine",
                                           close_reason=reason.value)
                machine = rig.machine
                if rig.volumes and machine is not None:
                    # While the guest answers: flush and unmount what outlives the machine.
                    if parked:
                        try:
                            await machine.wake()
                        except RigdError as exc:
                            log.warning("could not wake to unmount volumes",
                                        extra={"rig": rig.row.id, "error": exc.message})
                    await machine.quiesce()
                if rig.scope is not None:
                    rig.scope.cancel()
                await rig.finished.wait()
                await self._transition(rig, Phase.CLOSED, "closed", closed_at=iso(utcnow()))
                self.live.pop(rig.row.id, None)
                await self.events.publish(rig.row.workspace_id, rig.row.id, "RigClosedEvent",
                                          reason=rig.row.close_reason)

    def check_control(self, rig: LiveRig, caller: Caller) -> None:
        """Refuse a state change while a person other than the caller drives."""
        holder = rig.person_controller
        if holder is not None and holder != caller.user.id:
            raise Conflict(
                "a person is driving this rig; only observation verbs are allowed until they "
                "hand control back",
                controller={"kind": "person", "id": holder},
            )

    @asynccontextmanager
    async def activity(self, rig: LiveRig, caller: Caller, doing: str) -> AsyncIterator[Machine]:
        """One action on a rig: wake it if parked, keep it from parking meanwhile,
        and count it as activity (for idleness, lease renewal and the controller)."""
        async with rig.state_lock:
            if rig.phase is Phase.PARKED:
                await self.wake(rig, "woken by an action")
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
                rig.lease_until = renewed_lease(rig, now, CONTROL_LEASE_S)
            elif caller.actor_kind == "agent":
                rig.last_agent = caller.actor_id
                if rig.person_controller is None and rig.row.controller_id != caller.actor_id:
                    changes.update(controller_kind="agent", controller_id=caller.actor_id)
        await self.update(rig, **changes)

    async def wake(self, rig: LiveRig, why: str) -> None:
        """Resume a parked rig. Call with ``rig.state_lock`` held."""
        assert rig.machine is not None
        await rig.machine.wake()
        await self._transition(rig, Phase.READY, why)

    async def park_rig(self, rig: LiveRig, why: str, *, forced: bool = False) -> bool:
        async with rig.state_lock:
            if rig.phase is not Phase.READY or rig.machine is None or rig.busy:
                return False
            if not forced and (self.clock() - rig.last_active < rig.row.idle_s
                               or rig_state(rig, self.clock()).pins(self.clock())):
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
        await self.close_rig(rig, reason, None)

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
                await self.set_person_control(rig, None, "lease expired")
        decisions = plan_idle([rig_state(r, now) for r in self.live.values()], now)
        async with trio.open_nursery() as nursery:
            for decision in decisions:
                target = self.live.get(decision.rig_id)
                if target is None:
                    continue
                idle = int(now - target.last_active)
                if isinstance(decision, Park):
                    nursery.start_soon(self.park_rig, target, f"parked after {idle} s without an action")
                else:
                    why = ("its hard lifetime ran out" if decision.reason is CloseReason.TTL_EXPIRED
                           else f"idle for {idle} s")
                    nursery.start_soon(self._reap, target, decision.reason, why)

    # -- control, watching, parking on request -----------------------------------------

    async def set_person_control(self, rig: LiveRig, person: str | None, why: str, *,
                                 handed: bool = False) -> None:
        """Give ``person`` control (a lease they renew by watching; ``handed``: a seat handed to
        them, with no lease to lapse until they hand it back), or take it back (None)."""
        previous = rig.row.controller_id if rig.row.controller_kind == "person" else None
        if person is None:
            rig.lease_until = None
            kind, who = ("agent", rig.last_agent) if rig.last_agent else (None, None)
        else:
            rig.lease_until = math.inf if handed else self.clock() + CONTROL_LEASE_S
            kind, who = "person", person
        await self.update(rig, controller_kind=kind, controller_id=who)
        await self.events.publish(
            rig.row.workspace_id, rig.row.id, "RigControlChanged",
            controller={"kind": kind, "id": who} if who else None,
            previous={"kind": "person", "id": previous} if previous else None, why=why,
        )

    async def view_rig(self, caller: Caller, rig_id: str) -> LiveRig:
        """The rig behind a live view: watched (pinned) from now, woken if parked."""
        return await self._lane_rig(caller, rig_id, "watch the screen", "woken by a watcher",
                                    watch=True)

    def keep_watched(self, rig: LiveRig) -> None:
        """A watcher is still there (called by the live view, in memory)."""
        rig.watched_until = self.clock() + WATCH_LAPSE_S

    async def live_input(self, rig: LiveRig, caller: Caller, machine: Machine,
                         plan: Sequence[Step], shape: dict[str, Any]) -> None:
        """A person's input from the live view: audited (by shape), then sent through QMP."""
        self.check_control(rig, caller)
        seq = await self.stores.run(
            rig.db.begin_action, rig.row.id, actor_kind=caller.actor_kind,
            actor_id=caller.actor_id, tool="live_view", verb=str(shape.get("type", "?")), args=shape,
        )
        outcome, error = "error", None
        try:
            async with self.activity(rig, caller, "send input"):
                if shape.get("type") == "button" and shape.get("down") is True:
                    await self.note_press(rig, machine)
                await machine.send_input(plan)
            outcome = "ok"
        except RigdError as exc:
            error = exc.message[:300]
            raise
        finally:
            with trio.CancelScope(shield=True):
                await self.stores.run(rig.db.finish_action, rig.row.id, seq, outcome=outcome,
                                      error=error, duration_ms=0)

    async def close_workspace(self, workspace_id: str) -> list[str]:
        """The workspace is gone (deleted, or its last member removed)."""
        rigs = [r for r in self.live.values() if r.row.workspace_id == workspace_id]
        async with trio.open_nursery() as nursery:
            for rig in rigs:
                nursery.start_soon(self.close_rig, rig, CloseReason.WORKSPACE_GONE, None)
        return [r.row.id for r in rigs]

    async def execute(self, rig: LiveRig, machine: Machine, action: Action) -> dict[str, Any]:
        if isinstance(action, TerminalExec):
            action = as_user(action, DESKTOP_SESSION_USER if rig.row.surface == Surface.COMPUTER else None)
            result = await self.exec(machine, action, max_output=EXEC_OUTPUT_LIMIT)
            return exec_json(result, EXEC_OUTPUT_LIMIT)
        answer = await machine.perform(action)
        display = answer.get("display")
        if (isinstance(display, dict) and isinstance(display.get("width"), int)
                and isinstance(display.get("height"), int)
                and (display["width"], display["height"]) != (rig.row.display_w, rig.row.display_h)):
            # The mode changed (set_display, or the guest itself): coordinates of
            # later actions are checked against the new one.
            await self.update(rig, display_w=display["width"], display_h=display["height"])
        return answer

    async def exec(self, machine: Machine, action: TerminalExec, *, max_output: int) -> ExecResult:
        return await machine.exec(
            list(action.program), cwd=action.cwd, env=action.env_dict or None, stdin=action.stdin,
            timeout_s=action.timeout_s, max_output=max_output,
        )

    async def audit_event(
        self, rig: LiveRig, caller: Caller, verb: str, args: dict[str, Any], *, tool: str = "rig",
        outcome: str = "ok", error: str | None = None,
    ) -> None:
        """One finished row of the rig's log (lanes: ``tool="lanes"``, shape only)."""
        with trio.CancelScope(shield=True):
            seq = await self.stores.run(
                rig.db.begin_action, rig.row.id, actor_kind=caller.actor_kind,
                actor_id=caller.actor_id, tool=tool, verb=verb, args=args,
            )
            await self.stores.run(rig.db.finish_action, rig.row.id, seq, outcome=outcome,
                                  error=error, duration_ms=0)

    # -- terminals (PTY) ----------------------------------------------------------------

    async def terminal_rig(self, caller: Caller, rig_id: str) -> LiveRig:
        """The rig behind a PTY session: woken if parked; typing changes state, so
        a person's control lease is respected."""
        return await self._lane_rig(caller, rig_id, "open a terminal", "woken by a terminal",
                                    control=True)

    async def _lane_rig(self, caller: Caller, rig_id: str, doing: str, woken: str, *,
                        control: bool = False, watch: bool = False) -> LiveRig:
        """A running rig for a WebSocket lane, woken if parked (and pinned by a watcher)."""
        row, _db, live = await self.visible(caller, rig_id)
        if live is None or live.phase not in lifecycle.LIVE:
            raise Conflict(f"rig {rig_id} is {row.phase}; cannot {doing}")
        if control:
            self.check_control(live, caller)
        if watch:
            self.keep_watched(live)
        async with live.state_lock:
            if live.phase is Phase.PARKED:
                await self.wake(live, woken)
            lifecycle.require_phase(live.phase, frozenset({Phase.READY}), doing)
        if live.machine is None:
            raise Conflict(f"rig {rig_id}: the machine is not running")
        return live

    def note_activity(self, rig: LiveRig) -> None:
        """Cheap, in-memory activity (a keystroke in a terminal)."""
        rig.last_active = self.clock()

    # -- lanes (clipboard and files over HTTP) ------------------------------------------

    async def lane_rig(self, caller: Caller, rig_id: str, doing: str, *, write: bool) -> LiveRig:
        """The rig behind a lane request: a write respects a person's control lease,
        a read is an observation."""
        return await self._lane_rig(caller, rig_id, doing, f"woken to {doing}", control=write)

    async def note_press(self, rig: LiveRig, machine: Machine) -> None:
        """A person's press begins: remember what the drag selection holds now, so a
        drag-out that still carries it is known to be stale."""
        lanes = machine.lanes()
        if lanes.missing("clipboard") is not None:
            return
        with trio.move_on_after(2):
            try:
                clip = await lanes.clipboard_get("xdnd")
            except RigdError:
                return
            rig.xdnd_at_press = None if clip is None else hashlib.sha256(clip.data).digest()

    @staticmethod
    def xdnd_is_stale(rig: LiveRig, payload: bytes) -> bool:
        return rig.xdnd_at_press == hashlib.sha256(payload).digest()


__all__ = ["CONTROL_LEASE_S", "WATCH_LAPSE_S", "Caller", "LiveRig", "RigManager", "egress_json"]
