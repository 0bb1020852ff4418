"""Seats (issue 29): a named agent's one lasting rig in its workspace.

``rig.open {seat: NAME}`` opens the seat's rig, or returns it (woken if parked) when it
still runs: the same desktop, shells and engine. Whatever the rig, the seat keeps

- its **volume** ``seat.<NAME>`` (made on the first open, ``seats.volumeMb`` of the
  workspace's volume quota; made beforehand with ``volume.create`` it is used as it is),
  mounted read-write at ``/workspace``;
- its **browser profile** (a browser seat's cookies, storage and tabs), the seat's own
  rather than any caller's: every conversation that sits at the seat sees the same logins.

A seat's rig parks when idle and is never closed for idleness; one closed by its TTL, the
memory budget or a restart is opened afresh, with the same volume and profile, by the next
``rig.open {seat}``.

**Who holds it.** At most one conversation holds a seat at a time: ``seat.acquire``, or the
first ``rig.open {seat, conversation}``; ``seat.release`` or ``conversation.end`` frees it.
A seat held by one conversation refuses another's open, naming the holder.

**Handed to a person.** ``seat.handOver {to}`` gives a person control of the seat's rig for
as long as it is handed (no lease to lapse: agents only watch meanwhile, and a reopened rig
is theirs too); ``seat.handBack`` (or ``rig.control release``) returns it.

The seat's row lives in its workspace's database (``seats``), so seats survive restarts.
"""

from __future__ import annotations

import dataclasses
from typing import TYPE_CHECKING, Any

import trio

from rigd.errors import Conflict, FieldError, Forbidden, NotFound
from rigd.model import Phase, Surface
from rigd.rigs import lifecycle
from rigd.rigs.live import Caller, LiveRig, seat_profile_owner
from rigd.rigs.params import SEAT_PATH, OpenParams, SeatParams, VolumeRequest
from rigd.store.util import iso, utcnow
from rigd.store.workspace_db import SeatRow, WorkspaceDB

if TYPE_CHECKING:
    from rigd.rigs.manager import RigManager

#: A workspace setting: the size of a seat's volume when its first open makes it.
SEAT_VOLUME_MB = "seats.volumeMb"
SEAT_VOLUME_MB_DEFAULT = 2048


def seat_volume(name: str) -> str:
    """The volume a seat keeps at ``/workspace``."""
    return f"seat.{name}"


def describe(surface: str, engine: str | None) -> str:
    return f"{surface}:{engine}" if engine else surface


class Seats:
    def __init__(self, rigs: RigManager) -> None:
        self.rigs = rigs
        #: One open (or hand-over) of a seat at a time: a seat never has two rigs.
        self._locks: dict[tuple[str, str], trio.Lock] = {}

    def _lock(self, ws_id: str, name: str) -> trio.Lock:
        return self._locks.setdefault((ws_id, name), trio.Lock())

    def live_rig(self, seat: SeatRow) -> LiveRig | None:
        """The seat's rig while it has a machine (or is getting one)."""
        rig = self.rigs.live.get(seat.rig_id) if seat.rig_id is not None else None
        if rig is None or rig.phase not in lifecycle.LIVE:
            return None
        return rig

    async def _seat(self, db: WorkspaceDB, name: str, field: str = "name") -> SeatRow:
        seat = await self.rigs.stores.run(db.get_seat, name)
        if seat is None:
            raise NotFound(f"no seat {name!r} in this workspace (rig.open {{seat}} makes one)", field=field)
        return seat

    # -- open -----------------------------------------------------------------------------

    async def open(self, caller: Caller, params: OpenParams, ws_id: str, db: WorkspaceDB) -> LiveRig:
        """The seat's running rig (woken if parked), or a new one with its volume and profile."""
        name = params.seat
        assert name is not None
        engine = params.engine.value if params.engine is not None else None
        run = self.rigs.stores.run
        async with self._lock(ws_id, name):
            seat = await run(db.get_seat, name)
            if seat is None:
                seat = SeatRow(name=name, surface=params.surface.value, engine=engine,
                               created_by=caller.user.id, created_at=iso(utcnow()))
                await run(db.insert_seat, seat)
            elif (seat.surface, seat.engine) != (params.surface.value, engine):
                field = "engine" if seat.surface == params.surface.value else "surface"
                raise FieldError(field, f"seat {name!r} is a {describe(seat.surface, seat.engine)} seat; "
                                        "open it as one (or use another seat name)")
            if params.conversation is not None and seat.holder not in (None, params.conversation):
                raise Conflict(f"seat {name!r} is held by conversation {seat.holder!r} since "
                               f"{seat.held_since}; it is free once that conversation releases it",
                               field="seat", holder=seat.holder)
            rig = self.live_rig(seat)
            if rig is None:
                rig = await self._start(caller, params, seat, ws_id, db)
            elif rig.phase is Phase.PARKED:
                async with rig.state_lock:
                    if rig.phase is Phase.PARKED:
                        await self.rigs.wake(rig, f"woken by an open of seat {name!r}")
            if params.conversation is not None and seat.holder is None:
                await run(db.update_seat, name, holder=params.conversation, held_since=iso(utcnow()))
        return rig

    async def _start(self, caller: Caller, params: OpenParams, seat: SeatRow, ws_id: str,
                     db: WorkspaceDB) -> LiveRig:
        volume = seat_volume(seat.name)
        if not await trio.to_thread.run_sync(self._volume_exists, ws_id, volume):
            size = await self.rigs.setting_mb(ws_id, SEAT_VOLUME_MB, SEAT_VOLUME_MB_DEFAULT)
            try:
                await self.rigs.volume_create(caller, ws_id, volume, size)
            except FieldError as exc:
                raise FieldError("seat", f"seat {seat.name!r} needs its volume {volume!r}: {exc.reason}") \
                    from exc
        opened = dataclasses.replace(
            params, conversation=None, profile=seat.name if params.surface is Surface.BROWSER else None,
            volumes=(VolumeRequest(volume, SEAT_PATH), *params.volumes))
        rig = await self.rigs.start(caller, opened, ws_id, db, seat=seat.name)
        await self.rigs.stores.run(db.update_seat, seat.name, rig_id=rig.row.id)
        seat.rig_id = rig.row.id
        if seat.handed_to is not None:
            await self.rigs.set_person_control(rig, seat.handed_to, f"seat {seat.name!r} is handed to them",
                                               handed=True)
        return rig

    def _volume_exists(self, ws_id: str, name: str) -> bool:
        try:
            self.rigs.volumes.get(ws_id, name)
        except NotFound:
            return False
        return True

    # -- list, hold, hand over ------------------------------------------------------------

    def seat_json(self, ws_id: str, seat: SeatRow) -> dict[str, Any]:
        rig = self.live_rig(seat)
        state = rig.row.phase if rig is not None else ("closed" if seat.rig_id else "new")
        return {
            "name": seat.name, "workspace": ws_id, "surface": seat.surface, "engine": seat.engine,
            "owner": seat.created_by, "createdAt": seat.created_at, "rigId": seat.rig_id, "state": state,
            "holder": ({"conversation": seat.holder, "since": seat.held_since}
                       if seat.holder is not None else None),
            "handedTo": ({"id": seat.handed_to, "at": seat.handed_at}
                         if seat.handed_to is not None else None),
            "volume": seat_volume(seat.name), "path": SEAT_PATH,
            "profile": seat.name if seat.surface == Surface.BROWSER.value else None,
        }

    async def listing(self, caller: Caller, workspace: str) -> list[dict[str, Any]]:
        ws_id = await self.rigs.workspace_for(caller, workspace)
        db = await self.rigs.stores.workspace(ws_id)
        return [self.seat_json(ws_id, s) for s in await self.rigs.stores.run(db.list_seats)]

    async def kind_of(self, caller: Caller, workspace: str, name: str) -> tuple[Surface, str | None] | None:
        """The surface and engine of a seat (one row), or None before its first open."""
        ws_id = await self.rigs.workspace_for(caller, workspace)
        db = await self.rigs.stores.workspace(ws_id)
        seat = await self.rigs.stores.run(db.get_seat, name)
        return None if seat is None else (Surface(seat.surface), seat.engine)

    async def _resolve(self, caller: Caller, params: SeatParams) -> tuple[str, WorkspaceDB]:
        ws_id = await self.rigs.workspace_for(caller, params.workspace)
        return ws_id, await self.rigs.stores.workspace(ws_id)

    async def acquire(self, caller: Caller, params: SeatParams) -> dict[str, Any]:
        ws_id, db = await self._resolve(caller, params)
        async with self._lock(ws_id, params.name):
            seat = await self._seat(db, params.name)
            if seat.holder not in (None, params.conversation):
                raise Conflict(f"seat {params.name!r} is held by conversation {seat.holder!r} since "
                               f"{seat.held_since}", field="conversation", holder=seat.holder)
            if seat.holder is None:
                seat.holder, seat.held_since = params.conversation, iso(utcnow())
                await self.rigs.stores.run(db.update_seat, seat.name, holder=seat.holder,
                                           held_since=seat.held_since)
                await self._audit(seat, caller, "seat.acquire", {"conversation": seat.holder})
        return self.seat_json(ws_id, seat)

    async def release(self, caller: Caller, params: SeatParams) -> dict[str, Any]:
        """Free a seat: its holder's conversation, or any member naming none (a person freeing
        a seat an agent left held)."""
        ws_id, db = await self._resolve(caller, params)
        async with self._lock(ws_id, params.name):
            seat = await self._seat(db, params.name)
            if params.conversation is not None and seat.holder not in (None, params.conversation):
                raise Conflict(f"seat {params.name!r} is held by conversation {seat.holder!r}, not "
                               f"{params.conversation!r}", field="conversation", holder=seat.holder)
            if params.conversation is None and seat.holder is not None and caller.user.kind != "person" \
                    and not caller.user.is_admin:
                raise FieldError("conversation", f"is required: the conversation holding seat "
                                                 f"{params.name!r} releases it (a person may free it)")
            if seat.holder is not None:
                await self._audit(seat, caller, "seat.release", {"conversation": seat.holder})
                seat.holder = seat.held_since = None
                await self.rigs.stores.run(db.update_seat, seat.name, holder=None, held_since=None)
        return self.seat_json(ws_id, seat)

    async def release_conversation(self, ws_id: str, conversation: str) -> list[str]:
        """``conversation.end``: the seats it held are free."""
        db = await self.rigs.stores.workspace(ws_id)
        freed = []
        for seat in await self.rigs.stores.run(db.list_seats):
            if seat.holder == conversation:
                async with self._lock(ws_id, seat.name):
                    await self.rigs.stores.run(db.update_seat, seat.name, holder=None, held_since=None)
                freed.append(seat.name)
        return freed

    async def hand_over(self, caller: Caller, params: SeatParams) -> dict[str, Any]:
        """Give a person the seat: control of its rig, pinned (no lease lapses) until handed back."""
        ws_id, db = await self._resolve(caller, params)
        to = params.to or caller.user.id
        server = self.rigs.stores.server
        try:
            person = await self.rigs.stores.run(server.get_user, to)
        except NotFound:
            raise FieldError("to", f"no user {to!r}") from None
        if person.kind != "person" or not await self.rigs.stores.run(server.is_member, ws_id, to):
            raise FieldError("to", f"{to!r} is not a person in this workspace; a seat is handed to a person")
        async with self._lock(ws_id, params.name):
            seat = await self._seat(db, params.name)
            if seat.handed_to not in (None, to):
                raise Conflict(f"seat {params.name!r} is handed to {seat.handed_to}; they hand it back first",
                               field="name", handedTo=seat.handed_to)
            seat.handed_to, seat.handed_at = to, iso(utcnow())
            await self.rigs.stores.run(db.update_seat, seat.name, handed_to=to, handed_at=seat.handed_at)
            rig = self.live_rig(seat)
            if rig is not None:
                await self.rigs.audit_event(rig, caller, "seat.handOver", {"seat": seat.name, "to": to})
                await self.rigs.set_person_control(rig, to, f"seat {seat.name!r} handed over", handed=True)
        return self.seat_json(ws_id, seat)

    async def hand_back(self, caller: Caller, params: SeatParams) -> dict[str, Any]:
        ws_id, db = await self._resolve(caller, params)
        async with self._lock(ws_id, params.name):
            seat = await self._seat(db, params.name)
            await self._hand_back(caller, db, seat)
        return self.seat_json(ws_id, seat)

    async def hand_back_rig(self, caller: Caller, rig: LiveRig) -> bool:
        """``rig.control release`` on a handed seat's rig is its hand-back; False: no seat handed."""
        name = rig.row.seat
        if name is None:
            return False
        async with self._lock(rig.row.workspace_id, name):
            seat = await self.rigs.stores.run(rig.db.get_seat, name)
            if seat is None or seat.handed_to is None:
                return False
            await self._hand_back(caller, rig.db, seat)
        return True

    async def _hand_back(self, caller: Caller, db: WorkspaceDB, seat: SeatRow) -> None:
        if seat.handed_to is None:
            raise Conflict(f"seat {seat.name!r} is not handed to anyone", field="name")
        if seat.handed_to != caller.user.id and not caller.user.is_admin:
            raise Forbidden(f"seat {seat.name!r} is handed to {seat.handed_to}; only they (or an admin) "
                            "hand it back")
        seat.handed_to = seat.handed_at = None
        await self.rigs.stores.run(db.update_seat, seat.name, handed_to=None, handed_at=None)
        rig = self.live_rig(seat)
        if rig is not None:
            await self.rigs.audit_event(rig, caller, "seat.handBack", {"seat": seat.name})
            await self.rigs.set_person_control(rig, None, f"seat {seat.name!r} handed back")

    async def remove(self, caller: Caller, params: SeatParams) -> dict[str, Any]:
        """Forget a seat whose rig is not running; its volume goes with it (its profile too)."""
        ws_id, db = await self._resolve(caller, params)
        async with self._lock(ws_id, params.name):
            seat = await self._seat(db, params.name)
            rig = self.live_rig(seat)
            if rig is not None:
                raise Conflict(f"seat {params.name!r} has rig {rig.row.id} running; close it first",
                               field="name", rigId=rig.row.id)
            volume = seat_volume(seat.name)
            if await trio.to_thread.run_sync(self._volume_exists, ws_id, volume):
                await self.rigs.volume_rm(caller, ws_id, volume)
            await self.rigs.drop_profiles(seat_profile_owner(ws_id), seat.name)
            await self.rigs.stores.run(db.delete_seat, seat.name)
        return {"name": params.name, "workspace": ws_id, "removed": True}

    async def _audit(self, seat: SeatRow, caller: Caller, verb: str, args: dict[str, Any]) -> None:
        rig = self.live_rig(seat)
        if rig is not None:
            await self.rigs.audit_event(rig, caller, verb, {"seat": seat.name, **args})
