"""A rig while this server runs it, and who is calling: the values the rig
manager and the RPC edge share, and the rig's own net-audit lane."""

from __future__ import annotations

import dataclasses
import json
import math
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Protocol

import trio

from netgate.policy import Policy
from netgate.proxy import AuditEvent
from rigd.backends.base import ForkImage, Machine, VolumeMount
from rigd.browser.profiles import ProfileState
from rigd.model import Phase
from rigd.rigs.params import OpenParams
from rigd.rigs.pools import PoolKey
from rigd.rigs.scheduler import RigState
from rigd.store.server_db import User
from rigd.store.workspace_db import RigRow, WorkspaceDB

if TYPE_CHECKING:
    from rigd.store.aio import Stores

#: Gateway decisions waiting to be written to a rig's audit log.
NET_AUDIT_BUFFER = 1000


class Session(Protocol):
    """The WebSocket session a call came on (for notifications)."""

    def subscribe(self, workspace_id: str, channel: trio.MemoryReceiveChannel[dict[str, Any]]) -> None: ...


@dataclass(frozen=True, slots=True)
class Caller:
    user: User
    #: The WebSocket session the call came on, if any (for notifications).
    session: Session | None = None

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
    net_audit: trio.MemorySendChannel[AuditEvent] | None = None
    net_audit_dropped: int = 0
    #: The rig's own nursery (net-audit writer, progress writes) while its task runs.
    nursery: trio.Nursery | None = None
    #: sha256 of the guest's drag selection when a person's last press began (a
    #: drag-out that still carries it is a stale selection, RIGS.md §10).
    xdnd_at_press: bytes | None = None
    #: The console of the rig's last machine, for a failure after it is gone.
    last_console: Callable[[int], str] | None = None
    #: The pool that holds this rig while no one owns it (issue 28), and when it was started
    #: (the manager's clock); None once taken, or for a rig opened for a caller.
    pool_key: PoolKey | None = None
    pooled_at: float = 0.0
    #: The frozen parent this rig starts as a copy of (``rig.fork``), until it has started.
    fork: ForkImage | None = None
    #: A browser fork's seed (the parent engine's cookies, storage, tabs), for its fresh engine.
    seed: ProfileState | None = None
    #: The workspace volumes attached to this rig (issue 29).
    volumes: tuple[VolumeMount, ...] = ()

    @property
    def profile(self) -> str | None:
        """The browser profile the rig was opened with (None: a clean start)."""
        return self.params.profile if self.params is not None else None

    @property
    def phase(self) -> Phase:
        return Phase(self.row.phase)

    @property
    def person_controller(self) -> str | None:
        """The person holding control, if a lease is in force."""
        if self.row.controller_kind == "person" and self.lease_until is not None:
            return self.row.controller_id
        return None


def seat_profile_owner(workspace_id: str) -> str:
    """Whose profiles a workspace's seats keep (issue 29): the workspace's, not a caller's, so
    every conversation at a seat finds its logins. (A profile path part: letters, digits, _ -.)"""
    return f"seats-{workspace_id}"


def profile_owner(row: RigRow) -> str:
    """Whose browser profile a rig loads and saves: its seat's, or its opener's."""
    return seat_profile_owner(row.workspace_id) if row.seat is not None else row.created_by


def renewed_lease(rig: LiveRig, now: float, lease_s: float) -> float:
    """A person's control lease renewed by their activity; a seat handed to them has no end."""
    return rig.lease_until if rig.lease_until == math.inf else now + lease_s


def rig_state(rig: LiveRig, now: float) -> RigState:
    """What the scheduler's pure decisions see of a live rig."""
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
        controlled_by_person=controlled, busy=rig.busy, pooled=rig.pool_key is not None,
        seat=rig.row.seat is not None,
    )


# -- the gateway's decisions, into the rig's audit log ------------------------------


def net_audit_sink(rig: LiveRig) -> Callable[[AuditEvent], None]:
    def sink(event: AuditEvent) -> None:
        # Called by the gateway, on the event loop; must not block. A guest
        # flooding DNS cannot grow the server's memory: past the buffer,
        # decisions are counted, not kept.
        if rig.net_audit is None:
            return
        try:
            rig.net_audit.send_nowait(event)
        except trio.WouldBlock:
            rig.net_audit_dropped += 1
        except (trio.BrokenResourceError, trio.ClosedResourceError):
            pass

    return sink


async def write_net_audit(stores: Stores, rig: LiveRig,
                          receive: trio.MemoryReceiveChannel[AuditEvent]) -> None:
    """The rig's own task: each gateway decision becomes an audit row (actor ``gateway``)."""
    noted = 0
    async with receive:
        async for event in receive:
            args = {k: v for k, v in dataclasses.asdict(event).items() if v not in (None, 0, 0.0)}
            if rig.net_audit_dropped > noted:
                args["droppedBefore"] = rig.net_audit_dropped - noted
                noted = rig.net_audit_dropped
            seq = await stores.run(
                rig.db.begin_action, rig.row.id, actor_kind="gateway", actor_id="netgate",
                tool="netgate", verb=f"{event.kind}_{event.phase}", args=args,
            )
            await stores.run(
                rig.db.finish_action, rig.row.id, seq,
                outcome="ok" if event.allowed else "refused",
                error=None if event.allowed else str(event.reason)[:300], duration_ms=int(
                    float(getattr(event, "duration_s", 0) or 0) * 1000),
            )


def egress_json(policy: Policy | None, defaults: bool) -> str | None:
    """The allowlist as a rig's row keeps it."""
    if policy is None:
        return None
    return json.dumps({"allow": list(policy.allow), "defaults": defaults})
