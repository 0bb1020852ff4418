"""The rig methods callers see (API.md ``rig.*``): access checks, rendering,
audit rows, and the rig manager's operations behind them.

Every method takes typed parameters, parsed at the server edge by
:mod:`rigd.params` (:data:`RIG_METHODS` says which parser serves which RPC
method). Visibility: every method resolves the rig through the caller's
memberships; a rig of a workspace the caller is not in answers exactly like a
missing rig. The lifecycle itself — booting, failing, closing, parking,
reaping, leases — is :class:`rigd.rigs.manager.RigManager`'s.
"""

from __future__ import annotations

import dataclasses
import time
from collections.abc import Awaitable, Callable
from typing import Any

import trio

from rigd.errors import BackendError, Conflict, FieldError, Forbidden, RigdError
from rigd.model import ACCEL_OF, BACKEND_OF, TOOL_SURFACES, Accel, CloseReason, Display, Phase, Surface, Tool
from rigd.ports.forwards import RigPorts
from rigd.ports.hub import PortsHub
from rigd.rigs import lifecycle
from rigd.rigs.live import Caller, LiveRig, renewed_lease
from rigd.rigs.logins import LoginRef, Logins, LoginSave, parse_login_ref, parse_login_save
from rigd.rigs.manager import CONTROL_LEASE_S, WATCH_LAPSE_S, RigManager, egress_json
from rigd.rigs.params import (
    ActParams,
    ControlParams,
    ConversationParams,
    DomainParams,
    EgressParams,
    EventsParams,
    ForkParams,
    ListParams,
    LogParams,
    OpenParams,
    PortShareParams,
    RigRef,
    SeatParams,
    SnapshotRef,
    VolumeCreate,
    parse_act,
    parse_control,
    parse_conversation,
    parse_domain_set,
    parse_domain_unset,
    parse_egress,
    parse_events,
    parse_fork,
    parse_list,
    parse_log,
    parse_open,
    parse_port_share,
    parse_rig_ref,
    parse_seat_acquire,
    parse_seat_hand_over,
    parse_seat_ref,
    parse_seat_release,
    parse_snapshot_create,
    parse_snapshot_rm,
    parse_volume_create,
    parse_workspace_ref,
)
from rigd.rigs.render import iso_at
from rigd.rigs.seats import Seats
from rigd.store.util import iso, utcnow
from rigd.verbs import ParseContext, audit_args, is_observation, parse_action
from rigd.verbs.base import DESKTOP_MIN
from rigd.verbs.browser import BrowserLogin


def conversation_rig(rig: LiveRig, ws_id: str, params: OpenParams) -> bool:
    """Whether ``rig`` is the live rig an open of ``params`` reuses: the conversation's
    terminal (booting the exec image), or its browser of the same engine (and profile, when
    the open names one)."""
    r = rig.row
    if r.workspace_id != ws_id or r.conversation != params.conversation or rig.phase not in lifecycle.LIVE:
        return False
    if params.surface is Surface.TERMINAL:
        return r.surface == Surface.TERMINAL.value and r.exec_image
    if params.surface is Surface.BROWSER:
        engine = params.engine.value if params.engine is not None else None
        # An open that names no profile takes the conversation's browser whatever its profile
        # (an agent's tools.call knows none); one that names a profile needs that one.
        return (r.surface == Surface.BROWSER.value and r.engine == engine
                and (params.profile is None or rig.profile == params.profile))
    return False


class RigApi:
    def __init__(self, rigs: RigManager) -> None:
        self.rigs = rigs
        self.seats = Seats(rigs)
        self.logins = Logins(rigs)

    async def call(self, method: str, caller: Caller, raw: object) -> Any:
        """Parse ``raw`` as the RPC method's parameters and run it: the server's method
        table, the agent tools and tests all come in here."""
        parse, name = RIG_METHODS[method]
        handler: Callable[[Caller, Any], Awaitable[Any]] = getattr(self, name)
        return await handler(caller, parse(raw))

    # -- open -----------------------------------------------------------------------

    async def open(self, caller: Caller, params: OpenParams) -> dict[str, Any]:
        ws_id = await self.rigs.workspace_for(caller, params.workspace)
        backend = self.rigs.backends.get(params.surface)
        if backend is None:
            raise FieldError("surface", f"{params.surface} rigs are not available on this server")
        if self.rigs.accel is None:
            raise RigdError(
                "this server has no working accelerator: "
                f"{self.rigs.accel_problem or 'none was found'}. Restart it with --accel tcg to use "
                "software emulation (not a security boundary)",
                field="accel",
            )
        if params.surface is Surface.COMPUTER:
            params = self._computer_backend(params)
        db = await self.rigs.stores.workspace(ws_id)
        if params.seat is not None:  # (the seat's one rig, its own volume and profile)
            return await self._answer_open(await self.seats.open(caller, params, ws_id, db), params.wait)
        if params.profile is not None:
            # A profile is one browser's at a time (two engines writing one profile lose saves).
            for rig in self.rigs.live.values():
                if (rig.profile == params.profile and rig.row.created_by == caller.user.id
                        and rig.phase in lifecycle.LIVE and not conversation_rig(rig, ws_id, params)):
                    raise Conflict(f"profile {params.profile!r} is in use by rig {rig.row.id}; close it "
                                   "first, or open without a profile", field="profile", rigId=rig.row.id)
        if (params.conversation is not None and params.surface in (Surface.TERMINAL, Surface.BROWSER)
                and params.snapshot is None):  # (a snapshot's rig is always a new one)
            # A conversation holds one terminal, and one browser per engine: an open reuses it.
            lock = self.rigs.open_locks.setdefault((ws_id, params.conversation), trio.Lock())
            async with lock:
                for rig in self.rigs.live.values():
                    if conversation_rig(rig, ws_id, params):
                        return await self._answer_open(rig, params.wait)
                rig = await self.rigs.start(caller, params, ws_id, db)
        else:
            rig = await self.rigs.start(caller, params, ws_id, db)
        return await self._answer_open(rig, params.wait)

    def _computer_backend(self, params: OpenParams) -> OpenParams:
        """A computer rig runs on the server's accelerator (qemu-kvm, qemu-hvf, or
        qemu-tcg when the server was started with ``--accel tcg``) unless the
        caller names a backend; software emulation is used only when named."""
        assert self.rigs.accel is not None
        if params.display is not None and (params.display.width < DESKTOP_MIN.width
                                           or params.display.height < DESKTOP_MIN.height):
            raise FieldError("display", f"a desktop's mode is at least {DESKTOP_MIN.width}x"
                                        f"{DESKTOP_MIN.height} (set_display has the same floor)")
        if not params.backend_named:
            return dataclasses.replace(params, backend=BACKEND_OF[self.rigs.accel])
        want = ACCEL_OF[params.backend]
        if want is not Accel.TCG and want is not self.rigs.accel:
            raise FieldError(
                "backend",
                f"{params.backend} needs {want}, and this server runs with {self.rigs.accel}; "
                f"use {BACKEND_OF[self.rigs.accel]} (or qemu-tcg, software emulation)",
            )
        return params

    async def _answer_open(self, rig: LiveRig, wait: bool) -> dict[str, Any]:
        if wait:
            await rig.settled.wait()
        if rig.phase is Phase.FAILED:
            raise BackendError(
                f"rig {rig.row.id} failed to start: {rig.row.failure}", rig=self.rigs.rig_json(rig.row, rig)
            )
        return self.rigs.rig_json(rig.row, rig)

    # -- list / get / close -----------------------------------------------------------

    async def list_rigs(self, caller: Caller, params: ListParams) -> list[dict[str, Any]]:
        ws_id = await self.rigs.workspace_for(caller, params.workspace)
        db = await self.rigs.stores.workspace(ws_id)
        rows = await self.rigs.stores.run(db.list_rigs, include_closed=params.include_closed)
        out = []
        for row in rows:
            live = self.rigs.live.get(row.id)
            out.append(self.rigs.rig_json(live.row if live else row, live))
        return out

    async def get(self, caller: Caller, ref: RigRef) -> dict[str, Any]:
        rig_id = ref.rig_id
        row, _db, live = await self.rigs.visible(caller, rig_id)
        return self.rigs.rig_json(row, live)

    async def close(self, caller: Caller, ref: RigRef) -> dict[str, Any]:
        rig_id = ref.rig_id
        row, db, live = await self.rigs.visible(caller, rig_id)
        if live is None:
            if row.phase == Phase.FAILED.value:
                # Failed before this server started: its machine is long gone.
                lifecycle.check_transition(Phase.FAILED, Phase.CLOSED)
                await self.rigs.stores.run(db.update_rig, rig_id, phase=Phase.CLOSED.value,
                                      phase_detail="closed", closed_at=iso(utcnow()))
                row = await self.rigs.stores.run(db.get_rig, rig_id)
            return self.rigs.rig_json(row)
        await self.rigs.close_rig(live, CloseReason.REQUESTED, caller)
        return self.rigs.rig_json(live.row)

    # -- rig.egress ------------------------------------------------------------------------

    async def set_egress(self, caller: Caller, params: EgressParams) -> dict[str, Any]:
        rig_id, allow, defaults = params.rig_id, list(params.allow), params.defaults
        row, _db, rig = await self.rigs.visible(caller, rig_id)
        if rig is None or rig.machine is None:
            raise Conflict(f"rig {rig_id} is {row.phase}; its allowlist can change only while it runs")
        self.rigs.check_control(rig, caller)
        try:
            policy = self.rigs.egress_policy(Surface(row.surface), allow, defaults)
        except FieldError as exc:
            raise FieldError(exc.field.replace("egress.", "", 1), exc.reason) from exc
        if policy is None:
            raise FieldError("allow", "this rig has no network")
        rig.machine.set_egress(policy)
        rig.policy = policy
        await self.rigs.audit_event(rig, caller, "egress", {"allow": allow, "defaults": defaults})
        await self.rigs.update(rig, egress=egress_json(policy, defaults))
        return {"rigId": rig_id, "allow": list(policy.allow), "defaults": defaults}

    # -- act ----------------------------------------------------------------------------

    async def act(self, caller: Caller, params: ActParams) -> dict[str, Any]:
        rig_id = params.rig_id
        row, db, live = await self.rigs.visible(caller, rig_id)
        tool_raw = params.tool
        action = params.action
        tools = ", ".join(t.value for t in Tool)
        tool_name = tool_raw if isinstance(tool_raw, str) and len(tool_raw) <= 64 else "?"
        args = audit_args(tool_name, action)
        verb = args.get("action") if isinstance(args.get("action"), str) else "?"
        started = time.monotonic()
        seq = await self.rigs.stores.run(
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
                self.rigs.check_control(live, caller)
            outcome = "error"
            if isinstance(parsed, BrowserLogin):  # the saved password, opened only for a rig that runs it
                parsed = await self.logins.with_password(row.workspace_id, parsed)
            async with self.rigs.activity(live, caller, f"run {tool}.{verb}") as machine:
                result = await self.rigs.execute(live, machine, parsed)
            outcome = "ok"
            return result
        except RigdError as exc:
            error = exc.message[:500]
            raise
        finally:
            with trio.CancelScope(shield=True):
                await self.rigs.stores.run(
                    db.finish_action, rig_id, seq, outcome=outcome, error=error,
                    duration_ms=int((time.monotonic() - started) * 1000),
                )

    async def control(self, caller: Caller, params: ControlParams) -> dict[str, Any]:
        rig_id, op = params.rig_id, params.op
        _row, _db, rig = await self.rigs.visible(caller, rig_id)
        if rig is None or rig.phase not in lifecycle.LIVE:
            raise Conflict(f"rig {rig_id} is not running; there is nothing to control")
        holder = rig.person_controller
        if op == "take":
            if caller.user.kind != "person":
                raise Forbidden("only a person can take control; agents drive without a lease")
            if holder is not None and holder != caller.user.id:
                raise Conflict("another person already holds control of this rig",
                               controller={"kind": "person", "id": holder})
            await self.rigs.audit_event(rig, caller, "control_take", {})
            await self.rigs.set_person_control(rig, caller.user.id, "taken")
        else:
            if await self.seats.hand_back_rig(caller, rig):  # (a handed seat's release is its hand-back)
                return self.rigs.rig_json(rig.row, rig)
            if holder is None:
                raise Conflict("nobody holds control of this rig")
            if holder != caller.user.id and not caller.user.is_admin:
                raise Forbidden("only the person holding control (or an admin) can release it")
            await self.rigs.audit_event(rig, caller, "control_release", {})
            await self.rigs.set_person_control(rig, None, "released")
        return self.rigs.rig_json(rig.row, rig)

    async def watch(self, caller: Caller, ref: RigRef) -> dict[str, Any]:
        rig_id = ref.rig_id
        _row, _db, rig = await self.rigs.visible(caller, rig_id)
        if rig is None or rig.phase not in lifecycle.LIVE:
            raise Conflict(f"rig {rig_id} is not running; there is nothing to watch")
        now = self.rigs.clock()
        rig.watched_until = now + WATCH_LAPSE_S
        if rig.person_controller == caller.user.id:
            rig.lease_until = renewed_lease(rig, now, CONTROL_LEASE_S)
        return {"rigId": rig_id, "phase": rig.row.phase, "watchedUntil": iso_at(rig.watched_until),
                "controller": self.rigs.rig_json(rig.row, rig)["controller"]}

    async def fork(self, caller: Caller, params: ForkParams) -> dict[str, Any]:
        """``rig.fork``: the copies, each as a Rig (with ``forkedFrom``)."""
        children = await self.rigs.fork(caller, params.rig_id, params.count)
        return {"rigs": [self.rigs.rig_json(c.row, c) for c in children]}

    # -- named snapshots (issue 29) ---------------------------------------------------------

    async def snapshot_create(self, caller: Caller, ref: SnapshotRef) -> dict[str, Any]:
        assert ref.rig_id is not None
        return await self.rigs.snapshot_create(caller, ref.rig_id, ref.name)

    async def snapshot_list(self, caller: Caller, params: ListParams) -> list[dict[str, Any]]:
        return await self.rigs.snapshot_list(caller, params.workspace)

    async def snapshot_rm(self, caller: Caller, ref: SnapshotRef) -> dict[str, Any]:
        assert ref.workspace is not None
        return await self.rigs.snapshot_rm(caller, ref.workspace, ref.name)

    # -- volumes (issue 29) -----------------------------------------------------------------

    async def volume_create(self, caller: Caller, params: VolumeCreate) -> dict[str, Any]:
        return await self.rigs.volume_create(caller, params.workspace, params.name, params.size_mb)

    async def volume_list(self, caller: Caller, params: ListParams) -> list[dict[str, Any]]:
        return await self.rigs.volume_list(caller, params.workspace)

    async def volume_rm(self, caller: Caller, ref: SnapshotRef) -> dict[str, Any]:
        assert ref.workspace is not None
        return await self.rigs.volume_rm(caller, ref.workspace, ref.name)

    # -- seats (issue 29) -------------------------------------------------------------------

    async def seat_list(self, caller: Caller, params: ListParams) -> list[dict[str, Any]]:
        return await self.seats.listing(caller, params.workspace)

    async def seat_acquire(self, caller: Caller, params: SeatParams) -> dict[str, Any]:
        return await self.seats.acquire(caller, params)

    async def seat_release(self, caller: Caller, params: SeatParams) -> dict[str, Any]:
        return await self.seats.release(caller, params)

    async def seat_hand_over(self, caller: Caller, params: SeatParams) -> dict[str, Any]:
        return await self.seats.hand_over(caller, params)

    async def seat_hand_back(self, caller: Caller, params: SeatParams) -> dict[str, Any]:
        return await self.seats.hand_back(caller, params)

    async def seat_rm(self, caller: Caller, params: SeatParams) -> dict[str, Any]:
        return await self.seats.remove(caller, params)

    # -- saved logins (issue 30) ------------------------------------------------------------

    async def login_save(self, caller: Caller, params: LoginSave) -> dict[str, Any]:
        return await self.logins.save(caller, params)

    async def login_list(self, caller: Caller, params: ListParams) -> list[dict[str, Any]]:
        return await self.logins.listing(caller, params.workspace)

    async def login_rm(self, caller: Caller, params: LoginRef) -> dict[str, Any]:
        return await self.logins.remove(caller, params)

    async def park(self, caller: Caller, ref: RigRef) -> dict[str, Any]:
        rig_id = ref.rig_id
        _row, _db, rig = await self.rigs.visible(caller, rig_id)
        if rig is None:
            raise Conflict(f"rig {rig_id} is not running")
        self.rigs.check_control(rig, caller)
        if rig.phase is not Phase.PARKED:
            lifecycle.require_phase(rig.phase, frozenset({Phase.READY}), "park")
            if rig.busy:
                raise Conflict("the rig is running an action; park it when it is done")
            await self.rigs.audit_event(rig, caller, "park", {})
            await self.rigs.park_rig(rig, "parked on request", forced=True)
        return self.rigs.rig_json(rig.row, rig)

    # -- ports and dev domains (RIGS.md §8) -------------------------------------------------

    async def _ports_rig(self, caller: Caller, rig_id: str, *,
                         change: bool) -> tuple[LiveRig, PortsHub, RigPorts]:
        """A running terminal rig, the server's ports and the rig's own (-32009 otherwise)."""
        row, _db, rig = await self.rigs.visible(caller, rig_id)
        if row.surface != Surface.TERMINAL.value:
            raise Conflict(f"rig {rig_id} is a {row.surface} rig; only terminal rigs forward ports")
        hub = self.rigs.ports
        ports = hub.rigs.get(row.id) if hub is not None else None
        if rig is None or rig.machine is None or hub is None or ports is None:
            raise Conflict(f"rig {rig_id} is {row.phase}; its ports exist only while it runs")
        if change:
            self.rigs.check_control(rig, caller)
        return rig, hub, ports

    async def ports(self, caller: Caller, ref: RigRef) -> dict[str, Any]:
        rig, hub, _ports = await self._ports_rig(caller, ref.rig_id, change=False)
        out = hub.describe(rig.row.id)
        assert out is not None
        return {"rigId": rig.row.id, **out, "devHttpPort": hub.dev_http_port,
                "devHttpsPort": hub.dev_https_port}

    async def share_port(self, caller: Caller, params: PortShareParams) -> dict[str, Any]:
        rig, _hub, ports = await self._ports_rig(caller, params.rig_id, change=True)
        ports.share(params.guest_port, params.lan)
        await self.rigs.audit_event(rig, caller, "port.share",
                                    {"guestPort": params.guest_port, "lan": params.lan})
        return next(p for p in ports.describe()["ports"] if p["guestPort"] == params.guest_port)

    async def set_domain(self, caller: Caller, params: DomainParams) -> dict[str, Any]:
        rig, hub, _ports = await self._ports_rig(caller, params.rig_id, change=True)
        out = await hub.set_domain(rig.row.id, params.name, params.guest_port)
        await self.rigs.audit_event(rig, caller, "domain.set",
                                    {"name": params.name, "guestPort": params.guest_port})
        return {"rigId": rig.row.id, **out}

    async def unset_domain(self, caller: Caller, params: DomainParams) -> dict[str, Any]:
        rig, hub, _ports = await self._ports_rig(caller, params.rig_id, change=True)
        if not hub.domains.unset(rig.row.id, params.name):
            raise FieldError("name", f"{params.name} is not mapped in rig {rig.row.id}")
        await self.rigs.audit_event(rig, caller, "domain.unset", {"name": params.name})
        return {"rigId": rig.row.id, "name": params.name, "removed": True}

    # -- ending things --------------------------------------------------------------------

    async def end_conversation(self, caller: Caller, params: ConversationParams) -> dict[str, Any]:
        conversation = params.conversation
        ws_id = await self.rigs.workspace_for(caller, params.workspace)
        rigs = [r for r in self.rigs.live.values()
                if r.row.workspace_id == ws_id and r.row.conversation == conversation]
        async with trio.open_nursery() as nursery:
            for rig in rigs:
                nursery.start_soon(self.rigs.close_rig, rig, CloseReason.CONVERSATION_ENDED, caller)
        # A seat's rig outlives the conversation; the seat is free for the next one.
        freed = await self.seats.release_conversation(ws_id, conversation)
        return {"closed": [r.row.id for r in rigs], "seatsReleased": freed}

    async def retry(self, caller: Caller, ref: RigRef) -> dict[str, Any]:
        """Replace a failed rig with a fresh machine opened the same way."""
        rig_id = ref.rig_id
        row, db, rig = await self.rigs.visible(caller, rig_id)
        if row.phase != Phase.FAILED.value and not (
            row.phase == Phase.CLOSED.value and row.close_reason == CloseReason.BACKEND_FAILURE.value
        ):
            raise Conflict(f"rig {rig_id} is {row.phase}; only a failed rig can be retried")
        if rig is not None:
            await self.rigs.audit_event(rig, caller, "retry", {})
            await self.rigs.close_rig(rig, CloseReason.BACKEND_FAILURE, None)
        opened = rig.params if rig is not None and rig.params is not None else parse_open(
            {"workspace": row.workspace_id, "surface": row.surface,
             "conversation": row.conversation, "memoryMb": row.memory_mb, "vcpus": row.vcpus,
             "ttlS": row.ttl_s, "idleS": row.idle_s},
            frozenset(self.rigs.backends),
        )
        fresh = await self.rigs.start(caller, opened, row.workspace_id, db)
        answer = await self._answer_open(fresh, True)
        return {**answer, "retryOf": rig_id}

    # -- events ---------------------------------------------------------------------------

    async def events_since(self, caller: Caller, params: EventsParams) -> list[dict[str, Any]]:
        ws_id = await self.rigs.workspace_for(caller, params.workspace)
        db = await self.rigs.stores.workspace(ws_id)
        return await self.rigs.stores.run(db.events, after_id=params.after_id)

    # -- audit log ------------------------------------------------------------------------

    async def actions(self, caller: Caller, params: LogParams) -> list[dict[str, Any]]:
        _row, db, _live = await self.rigs.visible(caller, params.rig_id)
        rows = await self.rigs.stores.run(db.actions, params.rig_id, after_seq=params.after_seq,
                                          before_seq=params.before_seq, limit=params.limit)
        return [r.to_json() for r in rows]


#: RPC method → (the parser of its parameters, the RigApi method that runs it).
RIG_METHODS: dict[str, tuple[Callable[[object], Any], str]] = {
    "rig.open": (parse_open, "open"),
    "rig.list": (parse_list, "list_rigs"),
    "rig.get": (parse_rig_ref, "get"),
    "rig.close": (parse_rig_ref, "close"),
    "rig.act": (parse_act, "act"),
    "rig.log": (parse_log, "actions"),
    "rig.control": (parse_control, "control"),
    "rig.egress": (parse_egress, "set_egress"),
    "rig.watch": (parse_rig_ref, "watch"),
    "rig.park": (parse_rig_ref, "park"),
    "rig.fork": (parse_fork, "fork"),
    "snapshot.create": (parse_snapshot_create, "snapshot_create"),
    "snapshot.list": (parse_workspace_ref, "snapshot_list"),
    "snapshot.rm": (parse_snapshot_rm, "snapshot_rm"),
    "volume.create": (parse_volume_create, "volume_create"),
    "volume.list": (parse_workspace_ref, "volume_list"),
    "volume.rm": (parse_snapshot_rm, "volume_rm"),
    "seat.list": (parse_workspace_ref, "seat_list"),
    "seat.acquire": (parse_seat_acquire, "seat_acquire"),
    "seat.release": (parse_seat_release, "seat_release"),
    "seat.handOver": (parse_seat_hand_over, "seat_hand_over"),
    "seat.handBack": (parse_seat_ref, "seat_hand_back"),
    "seat.rm": (parse_seat_ref, "seat_rm"),
    "login.save": (parse_login_save, "login_save"),
    "login.list": (parse_workspace_ref, "login_list"),
    "login.rm": (parse_login_ref, "login_rm"),
    "rig.retry": (parse_rig_ref, "retry"),
    "rig.events": (parse_events, "events_since"),
    "rig.ports": (parse_rig_ref, "ports"),
    "rig.port.share": (parse_port_share, "share_port"),
    "rig.domain.set": (parse_domain_set, "set_domain"),
    "rig.domain.unset": (parse_domain_unset, "unset_domain"),
    "conversation.end": (parse_conversation, "end_conversation"),
}
