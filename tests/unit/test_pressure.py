"""The rig manager under pressure, over the fake backend and a fake clock:
parking and waking, idle and TTL reaping, pins, control, the memory budget,
events, ending conversations and workspaces, and retry."""

from __future__ import annotations

from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import pytest
import trio

from rigd.backends.fake import FakeBackend
from rigd.errors import Conflict, Forbidden
from rigd.model import Accel, Surface
from rigd.rigs.api import RigApi
from rigd.rigs.manager import Caller, RigManager
from rigd.store.aio import Stores

pytestmark = pytest.mark.timeout(20)


class Clock:
    def __init__(self) -> None:
        self.now = 1_000_000.0

    def __call__(self) -> float:
        return self.now


class World:
    def __init__(self, tmp: Path, budget: int = 12 * 1024) -> None:
        self.stores = Stores(tmp)
        admin, ws, _ = self.stores.server.bootstrap()
        self.person = Caller(admin)
        self.agent = Caller(self.stores.server.create_user("bot", "agent"))
        self.stores.server.add_member(ws.id, self.agent.user.id)
        self.other_person = Caller(self.stores.server.create_user("bob", "person"))
        self.stores.server.add_member(ws.id, self.other_person.user.id)
        self.ws = ws
        self.clock = Clock()
        self.terminal = FakeBackend()
        self.computer = FakeBackend()
        self.rigs = RigManager(
            self.stores, {Surface.TERMINAL: self.terminal, Surface.COMPUTER: self.computer},
            accel=Accel.TCG, clock=self.clock, memory_budget_mb=budget, tick_s=3600,
        )
        self.api = RigApi(self.rigs)

    async def open(self, caller: Caller | None = None, **params: Any) -> dict[str, Any]:
        return await self.api.call("rig.open", caller or self.agent,
                                    {"workspace": "default", "surface": "terminal", **params})

    async def exec(self, rig_id: str, caller: Caller | None = None) -> dict[str, Any]:
        return await self.api.call("rig.act", caller or self.agent, {
            "rigId": rig_id, "tool": "terminal_use",
            "action": {"action": "exec", "argv": ["echo", "hi"]}})

    async def phase(self, rig_id: str) -> str:
        return str((await self.api.call("rig.get", self.person, {"rigId": rig_id}))["phase"])

    async def events(self) -> list[dict[str, Any]]:
        return await self.api.call("rig.events", self.person, {"workspace": "default"})

    async def tick(self, seconds: float) -> None:
        self.clock.now += seconds
        await self.rigs.reap_once()


async def _world(tmp_path: Path, budget: int = 12 * 1024) -> AsyncIterator[World]:
    w = World(tmp_path, budget)
    async with trio.open_nursery() as nursery:
        await nursery.start(w.rigs.run)
        yield w
        nursery.cancel_scope.cancel()
    w.stores.close()


@pytest.fixture
async def world(tmp_path: Path) -> AsyncIterator[World]:
    async for w in _world(tmp_path):
        yield w


@pytest.fixture
async def small(tmp_path: Path) -> AsyncIterator[World]:
    async for w in _world(tmp_path, budget=1000):
        yield w


async def test_idle_parks_an_action_wakes_then_twice_idle_reaps(world: World) -> None:
    rig = await world.open(idleS=60)
    await world.tick(59)
    assert await world.phase(rig["id"]) == "ready"
    await world.tick(2)
    assert await world.phase(rig["id"]) == "parked"
    assert world.terminal.machines[0].parked
    result = await world.exec(rig["id"])
    assert result["exitCode"] == 0 and not world.terminal.machines[0].parked
    got = await world.api.call("rig.get", world.person, {"rigId": rig["id"]})
    assert got["phase"] == "ready" and got["phaseDetail"] == "woken by an action"
    await world.tick(119)
    assert await world.phase(rig["id"]) == "parked"
    await world.tick(2)
    got = await world.api.call("rig.get", world.person, {"rigId": rig["id"]})
    assert got["phase"] == "closed" and got["closeReason"] == "idleTimeout"
    reaped = [e for e in await world.events() if e["type"] == "RigReaped"]
    assert reaped == [{**reaped[0], "reason": "idleTimeout", "agent": world.agent.user.id}]


async def test_watch_and_terminal_pin_but_ttl_still_applies(world: World) -> None:
    watched = await world.open(idleS=60, ttlS=600)
    pinned = await world.open(idleS=60, ttlS=600)
    world.rigs.live[pinned["id"]].terminals = 1
    for _ in range(20):
        await world.api.call("rig.watch", world.person, {"rigId": watched["id"]})
        await world.tick(9)
    assert await world.phase(watched["id"]) == "ready"
    assert await world.phase(pinned["id"]) == "ready"
    await world.tick(15)  # the last watch lapsed; 195 s without an action is past 2 x 60
    assert await world.phase(watched["id"]) == "closed"
    await world.tick(600)
    got = await world.api.call("rig.get", world.person, {"rigId": pinned["id"]})
    assert got["closeReason"] == "ttlExpired"


async def test_person_control_refuses_other_state_changes_not_observations(world: World) -> None:
    rig = await world.open(surface="computer")
    with pytest.raises(Forbidden):
        await world.api.call("rig.control", world.agent, {"rigId": rig["id"], "op": "take"})
    taken = await world.api.call("rig.control", world.person, {"rigId": rig["id"], "op": "take"})
    assert taken["controller"]["kind"] == "person" and taken["controller"]["id"] == world.person.user.id
    with pytest.raises(Conflict) as refused:
        await world.api.call("rig.act", world.agent, {"rigId": rig["id"], "tool": "computer_use",
                                           "action": {"action": "left_click", "coordinate": [5, 5]}})
    assert "a person is driving" in refused.value.message
    with pytest.raises(Conflict):
        await world.api.call("rig.control", world.other_person, {"rigId": rig["id"], "op": "take"})
    seen = await world.api.call("rig.act", world.agent, {"rigId": rig["id"], "tool": "computer_use",
                                              "action": {"action": "screenshot"}})
    assert seen == {"performed": "screenshot"}
    mine = await world.api.call("rig.act", world.person, {"rigId": rig["id"], "tool": "computer_use",
                                               "action": {"action": "left_click", "coordinate": [5, 5]}})
    assert mine == {"performed": "left_click"}
    log = await world.api.call("rig.log", world.person, {"rigId": rig["id"]})
    assert [(a["verb"], a["outcome"]) for a in log[-4:]] == [
        ("control_take", "ok"), ("left_click", "refused"), ("screenshot", "ok"), ("left_click", "ok")]
    listed = await world.api.call("rig.list", world.agent, {"workspace": "default"})
    assert listed[0]["controller"]["kind"] == "person"
    await world.api.call("rig.control", world.person, {"rigId": rig["id"], "op": "release"})
    assert (await world.api.call("rig.act", world.agent, {"rigId": rig["id"], "tool": "computer_use",
            "action": {"action": "left_click", "coordinate": [5, 5]}})) == {"performed": "left_click"}
    controls = [e for e in await world.events() if e["type"] == "RigControlChanged"]
    assert [e["why"] for e in controls] == ["taken", "released"]


async def test_control_lease_lapses(world: World) -> None:
    rig = await world.open()
    await world.api.call("rig.control", world.person, {"rigId": rig["id"], "op": "take"})
    await world.tick(14 * 60)
    await world.api.call("rig.watch", world.person, {"rigId": rig["id"]})  # a heartbeat renews it
    await world.tick(14 * 60)
    with pytest.raises(Conflict):
        await world.exec(rig["id"])
    await world.tick(2 * 60)
    assert (await world.exec(rig["id"]))["exitCode"] == 0
    controls = [e for e in await world.events() if e["type"] == "RigControlChanged"]
    assert controls[-1]["why"] == "lease expired"


async def test_memory_budget_evicts_lru_and_refuses_when_all_pinned(small: World) -> None:
    a = await small.open(memoryMb=400)
    small.clock.now += 10
    b = await small.open(memoryMb=400)
    small.terminal.machines[0].rss_mb = 300
    small.terminal.machines[1].rss_mb = 300
    small.clock.now += 10
    c = await small.open(memoryMb=400)  # 300 + 300 + 400 = 1000: fits
    assert await small.phase(a["id"]) == "ready"
    small.terminal.machines[2].rss_mb = 300
    d = await small.open(memoryMb=400)  # needs room: a is least recently used
    assert await small.phase(a["id"]) == "closed"
    got = await small.api.call("rig.get", small.person, {"rigId": a["id"]})
    assert got["closeReason"] == "idleTimeout"
    reaped = [e for e in await small.events() if e["type"] == "RigReaped"]
    assert reaped[0]["rigId"] == a["id"] and "budget" in reaped[0]["why"]
    for rig in (b, c, d):
        await small.api.call("rig.watch", small.person, {"rigId": rig["id"]})
    small.terminal.machines[3].rss_mb = 300
    with pytest.raises(Conflict) as refused:
        await small.open(memoryMb=400)
    assert "1000 MB" in refused.value.message and "someone is watching" in refused.value.message
    assert refused.value.data["field"] == "memoryMb"


async def test_events_are_persisted_in_order_and_opening_is_not_one(world: World) -> None:
    rig = await world.open()
    await world.api.call("rig.close", world.agent, {"rigId": rig["id"]})
    events = await world.events()
    assert [e["type"] for e in events] == ["RigPhaseChanged", "RigPhaseChanged", "RigPhaseChanged",
                                           "RigClosedEvent"]
    assert [e["phase"] for e in events[:3]] == ["ready", "closing", "closed"]
    assert events[-1]["reason"] == "requested"
    assert [e["id"] for e in events] == sorted(e["id"] for e in events)
    assert await world.api.call("rig.events", world.person, {"workspace": "default",
                                                        "afterId": events[1]["id"]}) == events[2:]


async def test_conversation_end_and_workspace_gone(world: World) -> None:
    a = await world.open(conversation="c1")
    b = await world.open(conversation="c2")
    ended = await world.api.call("conversation.end", world.agent, {"workspace": "default", "conversation": "c1"})
    assert ended == {"closed": [a["id"]], "seatsReleased": []}
    assert (await world.api.call("rig.get", world.person, {"rigId": a["id"]}))["closeReason"] == "conversationEnded"
    assert await world.rigs.close_workspace(world.ws.id) == [b["id"]]
    assert (await world.api.call("rig.get", world.person, {"rigId": b["id"]}))["closeReason"] == "workspaceGone"


async def test_retry_boots_a_fresh_machine(world: World) -> None:
    rig = await world.open(conversation="c9")
    world.terminal.machines[0].died.set()
    with trio.fail_after(5):
        while await world.phase(rig["id"]) != "failed":
            await trio.sleep(0.01)
    failed = await world.api.call("rig.get", world.person, {"rigId": rig["id"]})
    assert failed["consoleTail"] == "fake console\n"
    fresh = await world.api.call("rig.retry", world.agent, {"rigId": rig["id"]})
    assert fresh["retryOf"] == rig["id"] and fresh["id"] != rig["id"] and fresh["phase"] == "ready"
    assert fresh["conversation"] == "c9"
    assert await world.phase(rig["id"]) == "closed"
    with pytest.raises(Conflict):
        await world.api.call("rig.retry", world.agent, {"rigId": fresh["id"]})
    # A plain open in the conversation reuses the fresh one, never the failed.
    again = await world.open(conversation="c9")
    assert again["id"] == fresh["id"]
