"""Scheduling decisions as pure functions: who parks, who is reaped, who is
evicted to make room (RIGS.md §6, §7).

Compute, then act: these functions take a snapshot of every rig's state and
the time, and return a list of decisions. They do no I/O and read no clock,
so they are tested with plain values; :mod:`rigd.rigs` carries the decisions
out.

Rules:

- **TTL.** A rig past its hard lifetime closes with ``ttlExpired``, whatever
  holds it.
- **Idle.** A rig with no action for its idle interval parks (vCPUs stopped,
  RAM kept); idle for twice the interval, it closes with ``idleTimeout``.
  A pinned rig — an open terminal, a live watcher, or a person holding
  control — neither parks nor closes for idleness.
- **Memory.** Opening a rig that would push the resident total past the
  budget evicts least-recently-used rigs, never one that is pinned or busy
  running an action; if that cannot make room the open is refused, naming the
  budget and what holds it. Pooled rigs (issue 28) go first, ready or still
  starting.
- **Seats.** A seat's rig (issue 29) parks when idle but is never closed for idleness.
- **Pools.** A pooled rig is owned by no one: it neither parks nor closes for
  idleness (its pool replaces it by age, :mod:`rigd.rigs.pools`).
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass

from rigd.model import CloseReason, Phase


@dataclass(frozen=True, slots=True)
class RigState:
    """What the scheduler knows of one rig. Times are seconds on one clock."""

    id: str
    phase: Phase
    last_active: float
    expires_at: float
    idle_s: float
    resident_mb: int
    terminals: int = 0
    watched_until: float | None = None
    controlled_by_person: bool = False
    busy: int = 0  # actions in flight
    #: A pooled rig (issue 28): owned by no one yet; never parked nor idle-reaped, and the
    #: first to be evicted for memory.
    pooled: bool = False
    #: A seat's rig (issue 29): parks when idle, never closed for idleness (TTL and memory
    #: still close it; its seat reopens it).
    seat: bool = False

    def watched(self, now: float) -> bool:
        return self.watched_until is not None and now < self.watched_until

    def pins(self, now: float) -> list[str]:
        """Why this rig may not be parked, idle-reaped or evicted (empty: it may)."""
        why = []
        if self.terminals:
            why.append("a terminal is open")
        if self.watched(now):
            why.append("someone is watching")
        if self.controlled_by_person:
            why.append("a person holds control")
        return why


@dataclass(frozen=True, slots=True)
class Park:
    rig_id: str


@dataclass(frozen=True, slots=True)
class Close:
    rig_id: str
    reason: CloseReason
    reaped: bool  # a RigReaped event is due (idle, TTL or memory)


Decision = Park | Close

RUNNING = frozenset({Phase.READY, Phase.PARKED})


def plan_idle(rigs: Iterable[RigState], now: float) -> list[Decision]:
    """Parks and closes due at ``now``."""
    out: list[Decision] = []
    for rig in rigs:
        if rig.phase not in RUNNING or rig.pooled:
            continue
        if now >= rig.expires_at:
            out.append(Close(rig.id, CloseReason.TTL_EXPIRED, reaped=True))
            continue
        if rig.pins(now) or rig.busy:
            continue
        idle = now - rig.last_active
        if idle >= 2 * rig.idle_s and not rig.seat:
            out.append(Close(rig.id, CloseReason.IDLE_TIMEOUT, reaped=True))
        elif idle >= rig.idle_s and rig.phase is Phase.READY:
            out.append(Park(rig.id))
    return out


@dataclass(frozen=True, slots=True)
class Admit:
    evict: tuple[str, ...]


@dataclass(frozen=True, slots=True)
class Refuse:
    reason: str


def counted(rigs: Sequence[RigState]) -> list[RigState]:
    """The rigs the memory budget counts: running (ready, parked) and starting."""
    return [r for r in rigs if r.phase in RUNNING or r.phase is Phase.PROVISIONING]


def plan_admission(
    rigs: Sequence[RigState], *, budget_mb: int, need_mb: int, now: float
) -> Admit | Refuse:
    """Room for a new rig of ``need_mb``: evict LRU rigs if needed, or refuse."""
    if need_mb > budget_mb:
        return Refuse(f"a rig of {need_mb} MB is larger than the whole memory budget "
                      f"of {budget_mb} MB")
    live = counted(rigs)
    used = sum(r.resident_mb for r in live)
    if used + need_mb <= budget_mb:
        return Admit(())
    # Pooled rigs first (starting ones too: a refill gives way to a caller), then the least
    # recently used of the rest.
    evictable = sorted(
        (r for r in live
         if (r.phase in RUNNING or r.pooled) and not r.pins(now) and not r.busy),
        key=lambda r: (not r.pooled, r.last_active, r.id),
    )
    chosen: list[str] = []
    for rig in evictable:
        if used + need_mb <= budget_mb:
            break
        chosen.append(rig.id)
        used -= rig.resident_mb
    if used + need_mb <= budget_mb:
        return Admit(tuple(chosen))
    holders = []
    for r in live:
        if r.id in chosen:
            continue
        why = r.pins(now) or (["running an action"] if r.busy else [])
        if r.phase is Phase.PROVISIONING:
            why = ["starting"]
        holders.append(f"{r.id} ({r.resident_mb} MB: {', '.join(why) or 'in use'})")
    return Refuse(
        f"the memory budget of {budget_mb} MB is full: {need_mb} MB more would need "
        f"{used + need_mb - budget_mb} MB that no idle rig can give back; held by "
        + "; ".join(holders)
    )
