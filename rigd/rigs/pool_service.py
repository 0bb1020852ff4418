"""Pools, the async half (issue 28): keep rigs booted before anyone asks, hand one over.

The plan is :func:`rigd.rigs.pools.plan_pools`; this module carries it out inside the rig
manager. A pooled rig is an ordinary :class:`~rigd.rigs.live.LiveRig` owned by the
manager's nursery — its own task is its failure boundary, the memory budget counts it, a
shutdown closes it — with three differences while no one owns it:

- its row lives in the pools' own database (:data:`POOL_WORKSPACE`, a workspace database
  that belongs to no workspace and is indexed under none), so no caller sees it;
- it has no owner, no conversation, a gate closed to everything and no profile;
- the scheduler never parks or idle-reaps it, and evicts it first for memory.

**Taking one** (:meth:`PoolService.take`, from :meth:`RigManager.start`): a ready rig of
the request's shape is marked taken before the first ``await`` (two opens at once get two
rigs), its row moves into the caller's workspace (provisioning, ``taking a pooled rig``)
with the caller's ``open`` row first in its log, then the machine gets the caller's
allowlist (live, as ``rig.egress``), display mode or viewport and browser profile (loaded
into the running engine as a restored profile is), and the rig turns ready. A hand-over
that fails closes that rig (its row says why) and the open boots one afresh, saying so in
its notes. The pool refills in the background.
"""

from __future__ import annotations

import dataclasses
import logging
from datetime import timedelta
from typing import TYPE_CHECKING, Any

import trio

from netgate.policy import Policy
from rigd.errors import RigdError
from rigd.model import BACKEND_OF, LIMITS, Backend, CloseReason, Phase, Surface
from rigd.rigs import lifecycle
from rigd.rigs.live import Caller, LiveRig, egress_json
from rigd.rigs.params import OpenParams
from rigd.rigs.pools import (
    POOL_KEYS,
    Fill,
    Member,
    PoolKey,
    Request,
    Retire,
    key_of,
    next_retry,
    plan_pools,
    pool_miss,
)
from rigd.store.util import iso, utcnow
from rigd.store.workspace_db import WorkspaceDB
from rigd.verbs import parse_action

if TYPE_CHECKING:
    from rigd.rigs.manager import RigManager

log = logging.getLogger("rigd.pools")

#: The pools' own database: a workspace database that belongs to no workspace.
POOL_WORKSPACE = "pool"
#: Who a pooled rig's row says created it, until it is taken.
POOL_OWNER = "pool"


class PoolService:
    def __init__(self, rigs: RigManager, sizes: dict[PoolKey, int] | Any, *, max_age_s: float) -> None:
        self.rigs = rigs
        self.sizes: dict[PoolKey, int] = {k: int(sizes.get(k, 0)) for k in POOL_KEYS}
        self.max_age_s = max_age_s
        self._failures: dict[PoolKey, int] = {}
        self._retry_at: dict[PoolKey, float] = {}
        self._errors: dict[PoolKey, str] = {}
        #: Pooled rigs this service started and has not let go of yet: id → pool.
        self._known: dict[str, PoolKey] = {}
        self._poke = trio.Event()
        #: Rigs handed over, and pooled rigs evicted for memory, since the server started.
        self.taken: dict[PoolKey, int] = dict.fromkeys(POOL_KEYS, 0)
        self.evicted: dict[PoolKey, int] = dict.fromkeys(POOL_KEYS, 0)

    # -- settings ---------------------------------------------------------------------

    def configure(self, sizes: dict[PoolKey, int], max_age_s: float | None = None) -> None:
        """New sizes (already checked against the budget); the pools follow at once."""
        self.sizes.update(sizes)
        if max_age_s is not None:
            self.max_age_s = max_age_s
        for key, size in sizes.items():
            if size == 0:  # an emptied pool forgets its failures
                self._errors.pop(key, None)
                self._failures.pop(key, None)
                self._retry_at.pop(key, None)
        self.poke()

    def poke(self) -> None:
        self._poke.set()

    def members(self) -> list[LiveRig]:
        return [r for r in self.rigs.live.values() if r.pool_key is not None]

    # -- the filler -------------------------------------------------------------------------

    async def run(self) -> None:
        """Fill, replace and retire pooled rigs, at every tick of the manager and whenever
        a take or a setting pokes. A failed step is logged; the next one runs."""
        try:
            await self._forget_closed()
        except (RigdError, OSError):
            log.exception("could not tidy the pools' database")
        while True:
            with trio.move_on_after(self.rigs.tick_s):
                await self._poke.wait()
            self._poke = trio.Event()
            try:
                await self.step()
            except RigdError as exc:
                log.warning("pool step failed", extra={"error": exc.message})
            except Exception:  # one bad step must not end the pools (nor the server)
                log.exception("pool step failed")

    async def step(self) -> None:
        rigs = self.rigs
        if not any(self.sizes.values()) and not self._known and not self.members():
            return  # no pools: nothing to do (and no database to touch)
        now = rigs.clock()
        db = await rigs.stores.workspace(POOL_WORKSPACE)
        mine = self.members()
        # Pooled rigs closed by someone else (evicted for memory) leave no row.
        for gone, key in list(self._known.items()):
            if gone not in rigs.live:
                self.evicted[key] += 1
                log.info("pooled rig evicted for memory", extra={"pool": str(key), "rig": gone})
                await rigs.stores.run(db.delete_rig, gone)
                del self._known[gone]
        for rig in mine:
            if rig.phase is Phase.FAILED:
                self._failed(rig, now)
                rig.pool_key = None
                await self._close(rig, db)
            elif rig.phase is Phase.READY and rig.pool_key in self._failures:
                key = rig.pool_key
                log.info("pool filled again", extra={"pool": str(key), "rig": rig.row.id})
                self._failures.pop(key, None)
                self._errors.pop(key, None)
                self._retry_at.pop(key, None)
        if rigs.accel is None:
            return  # nothing boots on this server (rig.open says why)
        members = [Member(r.row.id, r.pool_key, r.phase, r.pooled_at) for r in self.members()
                   if r.pool_key is not None and r.phase in (Phase.PROVISIONING, Phase.READY)]
        room = rigs.memory_budget_mb - rigs.memory_in_use_mb()
        for action in plan_pools(self.sizes, members, now=now, max_age_s=self.max_age_s,
                                 room_mb=room, retry_at=self._retry_at):
            if isinstance(action, Fill):
                await self._fill(action.key, db)
            elif isinstance(action, Retire):
                old = rigs.live.get(action.rig_id)
                if old is not None and old.pool_key is not None:
                    log.info("pooled rig retired", extra={"rig": old.row.id, "why": action.why})
                    old.pool_key = None  # before any await: a take cannot pick it now
                    await self._close(old, db)

    def _failed(self, rig: LiveRig, now: float) -> None:
        key = rig.pool_key
        assert key is not None
        n = self._failures.get(key, 0) + 1
        self._failures[key] = n
        self._retry_at[key] = now + next_retry(n)
        reason = (rig.row.failure or rig.row.phase_detail or "failed")[:500]
        self._errors[key] = reason
        log.warning("a pooled rig failed; its pool tries again later", extra={
            "pool": str(key), "rig": rig.row.id, "failures": n, "reason": reason[:300],
            "retry_in_s": round(next_retry(n))})

    async def _fill(self, key: PoolKey, db: WorkspaceDB) -> None:
        rigs = self.rigs
        params = self.pooled_params(key)
        policy = rigs.egress_policy(key.surface, [], False)  # closed to everything until taken
        row = rigs.new_row(params, POOL_WORKSPACE, policy, created_by=POOL_OWNER)
        row.phase_detail = "queued for its pool"
        rig = await rigs.launch(row, db, params, policy, pool=key)
        self._known[rig.row.id] = key
        log.info("filling a pool", extra={"pool": str(key), "rig": row.id})

    async def _close(self, rig: LiveRig, db: WorkspaceDB) -> None:
        await self.rigs.close_rig(rig, CloseReason.REQUESTED, None)
        self._known.pop(rig.row.id, None)
        with trio.CancelScope(shield=True):
            await self.rigs.stores.run(db.delete_rig, rig.row.id)

    async def _forget_closed(self) -> None:
        db = await self.rigs.stores.workspace(POOL_WORKSPACE)
        for row in await self.rigs.stores.run(db.list_rigs):
            if row.phase == Phase.CLOSED.value:
                await self.rigs.stores.run(db.delete_rig, row.id)

    def backend_of(self, key: PoolKey) -> Backend:
        if key.surface is Surface.COMPUTER and self.rigs.accel is not None:
            return BACKEND_OF[self.rigs.accel]
        return Backend.SMOLVM

    def pooled_params(self, key: PoolKey) -> OpenParams:
        """The shape every rig of a pool boots with: the surface's defaults (RIGS.md §7)."""
        limits = LIMITS[key.surface]
        return OpenParams(
            workspace=POOL_WORKSPACE, surface=key.surface, conversation=None, engine=key.engine,
            backend=self.backend_of(key), display=limits.display, memory_mb=key.memory_mb,
            vcpus=limits.vcpus, ttl_s=limits.ttl_s, idle_s=limits.idle_s, egress_allow=(),
            egress_defaults=False, wait=False,
        )

    # -- taking one ---------------------------------------------------------------------------

    async def take(self, caller: Caller, params: OpenParams, ws_id: str, db: WorkspaceDB,
                   policy: Policy | None, *, custom: bool) -> tuple[LiveRig | None, str | None]:
        """A pooled rig handed over for ``params``, or (None, why none was: the Rig's note;
        None when the request's shape has no pool)."""
        key = key_of(params.surface, params.engine)
        if key is None or not self.sizes.get(key):
            return None, None
        brokered = await self.rigs.brokered(ws_id) if self.rigs.brokered is not None else False
        miss = pool_miss(Request(params.surface, params.engine, params.memory_mb, params.vcpus,
                                 other_backend=params.backend is not self.backend_of(key),
                                 custom_image=custom, brokered=brokered), key)
        if miss is not None:
            return None, f"not from the {key} pool: {miss}"
        ready = sorted((r for r in self.members()
                        if r.pool_key == key and r.phase is Phase.READY and r.machine is not None),
                       key=lambda r: r.pooled_at)
        if not ready:
            filling = sum(1 for r in self.members() if r.pool_key == key and r.phase is Phase.PROVISIONING)
            return None, f"the {key} pool had no ready rig ({filling} starting); opened afresh"
        rig = ready[0]
        rig.pool_key = None  # taken, before any await: a second open gets another rig
        self._known.pop(rig.row.id, None)
        self.poke()
        try:
            await self._hand_over(rig, caller, params, ws_id, db, policy)
        except Exception as exc:
            why = exc.message if isinstance(exc, RigdError) else f"{type(exc).__name__}: {exc}"
            log.warning("a pooled rig failed its hand-over; opening afresh",
                        exc_info=not isinstance(exc, RigdError),
                        extra={"rig": rig.row.id, "pool": str(key), "reason": why[:300]})
            with trio.CancelScope(shield=True):
                if rig.phase in lifecycle.LIVE:
                    await self.rigs.update(rig, phase_detail=f"the hand-over failed: {why[:200]}")
                await self.rigs.close_rig(rig, CloseReason.BACKEND_FAILURE, None)
            return None, f"a pooled rig failed its hand-over ({why[:200]}); opened afresh"
        self.taken[key] += 1
        return rig, None

    async def _hand_over(self, rig: LiveRig, caller: Caller, params: OpenParams, ws_id: str,
                         db: WorkspaceDB, policy: Policy | None) -> None:
        rigs = self.rigs
        machine = rig.machine
        assert machine is not None
        pool_db = rig.db
        now = utcnow()
        row = dataclasses.replace(
            rig.row, workspace_id=ws_id, conversation=params.conversation, created_by=caller.user.id,
            phase=Phase.PROVISIONING.value, phase_detail="taking a pooled rig", ttl_s=params.ttl_s,
            idle_s=params.idle_s, created_at=iso(now), last_active_at=iso(now),
            expires_at=iso(now + timedelta(seconds=params.ttl_s)),
            egress=egress_json(policy, params.egress_defaults), start="pool", start_note=None,
        )
        # The row moves into the caller's workspace first, so its log opens with the caller's row.
        await rigs.stores.run(db.insert_rig, row)
        await rigs.stores.run(rigs.stores.server.index_rig, row.id, ws_id)
        clock = rigs.clock()
        rig.row, rig.db, rig.params, rig.policy = row, db, params, policy
        rig.last_active, rig.expires_at = clock, clock + params.ttl_s
        if caller.actor_kind == "agent":
            rig.last_agent = caller.actor_id
        with trio.CancelScope(shield=True):
            await rigs.stores.run(pool_db.delete_rig, row.id)
        await rigs.audit_event(rig, caller, "open", {"surface": row.surface, "memoryMb": row.memory_mb,
                                                          "vcpus": row.vcpus, "start": "pool"})
        async with rig.state_lock:
            if policy is not None:
                machine.set_egress(policy)
            want, booted = params.display, (rig.row.display_w, rig.row.display_h)
            if want is not None and booted[0] is not None and booted != (want.width, want.height):
                verb = "set_viewport" if params.surface is Surface.BROWSER else "set_display"
                tool = "browser_use" if params.surface is Surface.BROWSER else "computer_use"
                action = parse_action(tool, {"action": verb, "width": want.width, "height": want.height})
                if isinstance(action, RigdError):
                    raise action
                await machine.perform(action)
            if params.profile is not None:
                await machine.take_profile(caller.user.id, params.profile)
        shown = machine.display or ((want.width, want.height) if want is not None else None)
        if shown is not None:
            await rigs.update(rig, display_w=shown[0], display_h=shown[1])
        await rigs.mark_ready(rig, "ready (taken from its pool)")
        log.info("pooled rig taken", extra={"rig": row.id, "workspace": ws_id,
                                            "pool": str(key_of(params.surface, params.engine))})

    # -- what server.info says -------------------------------------------------------------------

    def describe(self) -> list[dict[str, Any]]:
        rigs = self.rigs
        now = rigs.clock()
        room = rigs.memory_budget_mb - rigs.memory_in_use_mb()
        out: list[dict[str, Any]] = []
        for key in POOL_KEYS:
            mine = [r for r in self.members() if r.pool_key == key]
            size = self.sizes.get(key, 0)
            if not size and not mine:
                continue
            ready = [r for r in mine if r.phase is Phase.READY]
            filling = [r for r in mine if r.phase is Phase.PROVISIONING]
            entry: dict[str, Any] = {"key": str(key), "size": size, "ready": len(ready),
                                     "filling": len(filling), "taken": self.taken[key],
                                     "evicted": self.evicted[key], "error": self._errors.get(key)}
            if rigs.accel is None:
                entry["error"] = "this server has no working accelerator: nothing is pooled"
            if filling:
                entry["progress"] = filling[0].row.phase_detail
            retry = self._retry_at.get(key)
            if retry is not None and retry > now:
                entry["retryInS"] = round(retry - now)
            if len(ready) + len(filling) < size and key.memory_mb > room and not filling:
                entry["waiting"] = f"for room in the {rigs.memory_budget_mb} MB memory budget"
            out.append(entry)
        return out


__all__ = ["POOL_OWNER", "POOL_WORKSPACE", "PoolService"]
