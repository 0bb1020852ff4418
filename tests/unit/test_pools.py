"""Pools (issue 28): the setting's parsing, the pure plan, and the manager taking, refilling,
evicting and replacing pooled rigs over the fake backend (real SQLite stores, a fake clock)."""

from __future__ import annotations

from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import pytest
import trio
import trio.testing

from rigd.backends.fake import FakeBackend
from rigd.errors import FieldError
from rigd.model import Accel, Engine, Phase, Surface
from rigd.rigs.api import RigApi
from rigd.rigs.manager import Caller, RigManager
from rigd.rigs.pool_service import POOL_WORKSPACE
from rigd.rigs.pools import (
    POOL_KEYS,
    Fill,
    Member,
    PoolKey,
    Request,
    Retire,
    check_fits,
    default_pools,
    next_retry,
    parse_pool_flag,
    parse_pool_sizes,
    plan_pools,
    pool_miss,
)
from rigd.store.aio import Stores
from tests.unit.test_pressure import Clock

pytestmark = pytest.mark.timeout(20)

TERMINAL = PoolKey(Surface.TERMINAL)
CHROMIUM = PoolKey(Surface.BROWSER, Engine.CHROMIUM)
FIREFOX = PoolKey(Surface.BROWSER, Engine.FIREFOX)
COMPUTER = PoolKey(Surface.COMPUTER)


# -- the setting --------------------------------------------------------------------------


def test_pool_sizes_parse_and_bad_values_name_the_setting() -> None:
    assert parse_pool_sizes({"browser:chromium": 1, "terminal": 2}) == {CHROMIUM: 1, TERMINAL: 2}
    assert [str(k) for k in POOL_KEYS] == ["terminal", "computer", "browser:chromium", "browser:firefox",
                                           "browser:webkit"]
    cases: list[tuple[object, str]] = [
        ([1], "pools"),
        ({"browser:opera": 1}, "pools.browser:opera"),
        ({"android": 1}, "pools.android"),
        ({"browser": 1}, "pools.browser"),
        ({"terminal": -1}, "pools.terminal"),
        ({"terminal": 1.5}, "pools.terminal"),
        ({"terminal": "2"}, "pools.terminal"),
        ({"terminal": True}, "pools.terminal"),
        ({"terminal": 9}, "pools.terminal"),
    ]
    for raw, field in cases:
        with pytest.raises(FieldError) as err:
            parse_pool_sizes(raw)
        assert err.value.data["field"] == field, raw


def test_the_serve_flag_takes_key_equals_n_or_none() -> None:
    assert parse_pool_flag("browser:firefox=2") == {FIREFOX: 2}
    assert parse_pool_flag("none") == dict.fromkeys(POOL_KEYS, 0)
    for bad in ("terminal", "terminal=x", "phone=1", "terminal=99"):
        with pytest.raises(FieldError) as err:
            parse_pool_flag(bad)
        assert err.value.data["field"].startswith("--pool"), bad


def test_pools_that_cannot_fit_the_budget_are_refused() -> None:
    check_fits({TERMINAL: 2, CHROMIUM: 1}, 4096)  # 1024 + 2048 fits
    with pytest.raises(FieldError) as err:
        check_fits({COMPUTER: 2, CHROMIUM: 1}, 8192)
    assert err.value.data["field"] == "pools" and "10240 MB" in err.value.message
    with pytest.raises(FieldError) as err:
        check_fits({TERMINAL: 1}, 256, "memoryBudgetMb")
    assert err.value.data["field"] == "memoryBudgetMb"


def test_default_pools_take_at_most_a_quarter_of_the_budget() -> None:
    assert {k: n for k, n in default_pools(12 * 1024).items() if n} == {TERMINAL: 1, CHROMIUM: 1}
    assert {k: n for k, n in default_pools(4096).items() if n} == {TERMINAL: 1}
    assert not any(default_pools(1024).values())


def test_what_a_pooled_rig_cannot_serve_is_said() -> None:
    fits = Request(Surface.BROWSER, Engine.CHROMIUM, 2048, 2)
    assert pool_miss(fits, CHROMIUM) is None
    reasons = [
        pool_miss(Request(Surface.BROWSER, Engine.CHROMIUM, 4096, 2), CHROMIUM),
        pool_miss(Request(Surface.BROWSER, Engine.CHROMIUM, 2048, 4), CHROMIUM),
        pool_miss(Request(Surface.BROWSER, Engine.CHROMIUM, 2048, 2, custom_image=True), CHROMIUM),
        pool_miss(Request(Surface.COMPUTER, None, 4096, 4, other_backend=True), COMPUTER),
        pool_miss(Request(Surface.TERMINAL, None, 512, 2, brokered=True), TERMINAL),
    ]
    assert all(reasons), reasons
    assert "4096 MB" in str(reasons[0]) and "4 vCPUs" in str(reasons[1]) and "own image" in str(reasons[2])
    assert "backend" in str(reasons[3]) and "secrets" in str(reasons[4])


# -- the plan ---------------------------------------------------------------------------------


def m(rig_id: str, key: PoolKey = TERMINAL, phase: Phase = Phase.READY, born: float = 0.0) -> Member:
    return Member(rig_id, key, phase, born)


def test_a_pool_below_its_size_fills_one_rig_at_a_time_with_room() -> None:
    sizes = {TERMINAL: 2, CHROMIUM: 1}
    assert plan_pools(sizes, [], now=10, max_age_s=1800, room_mb=10_000) == [Fill(TERMINAL)]
    # One starting already: nothing more until it is up.
    assert plan_pools(sizes, [m("a", phase=Phase.PROVISIONING)], now=10, max_age_s=1800, room_mb=10_000) == []
    assert plan_pools(sizes, [m("a"), m("b")], now=10, max_age_s=1800, room_mb=10_000) == [Fill(CHROMIUM)]
    # No room for a browser without evicting anyone: it waits; nor before its retry time.
    assert plan_pools(sizes, [m("a"), m("b")], now=10, max_age_s=1800, room_mb=2000) == []
    assert plan_pools(sizes, [m("a"), m("b")], now=10, max_age_s=1800, room_mb=10_000,
                      retry_at={CHROMIUM: 11}) == []
    assert plan_pools({}, [], now=10, max_age_s=1800, room_mb=10_000) == []


def test_an_old_rig_is_replaced_before_it_is_retired_and_a_smaller_pool_sheds() -> None:
    old = m("old", born=0)
    # Past its age: a young one is filled first, and the old one kept meanwhile.
    assert plan_pools({TERMINAL: 1}, [old], now=2000, max_age_s=1800, room_mb=10_000) == [Fill(TERMINAL)]
    assert plan_pools({TERMINAL: 1}, [old, m("new", phase=Phase.PROVISIONING, born=2000)], now=2001,
                      max_age_s=1800, room_mb=10_000) == []
    acts = plan_pools({TERMINAL: 1}, [old, m("new", born=2000)], now=2010, max_age_s=1800, room_mb=10_000)
    assert [type(a) for a in acts] == [Retire] and acts[0].rig_id == "old"  # type: ignore[union-attr]
    # Made smaller: the newest (a starting one first) go.
    acts = plan_pools({TERMINAL: 1}, [m("a", born=1), m("b", born=2), m("c", phase=Phase.PROVISIONING, born=3)],
                      now=10, max_age_s=1800, room_mb=10_000)
    assert sorted(a.rig_id for a in acts if isinstance(a, Retire)) == ["b", "c"]
    # Size 0: everything goes, old or young.
    acts = plan_pools({TERMINAL: 0}, [m("a", born=0), m("b", born=1990)], now=2000, max_age_s=1800,
                      room_mb=10_000)
    assert sorted(a.rig_id for a in acts if isinstance(a, Retire)) == ["a", "b"]


def test_retries_back_off_to_a_cap() -> None:
    assert [next_retry(n) for n in (1, 2, 3)] == [30, 60, 120]
    assert next_retry(50) == 600


# -- the manager -------------------------------------------------------------------------------


class World:
    def __init__(self, tmp: Path, budget: int, pools: dict[PoolKey, int]) -> None:
        self.stores = Stores(tmp)
        admin, ws, _ = self.stores.server.bootstrap()
        self.person = Caller(admin)
        self.agent = Caller(self.stores.server.create_user("bot", "agent"))
        self.stores.server.add_member(ws.id, self.agent.user.id)
        self.ws = ws
        self.clock = Clock()
        self.terminal = FakeBackend()
        self.browser = FakeBackend()
        self.rigs = RigManager(
            self.stores, {Surface.TERMINAL: self.terminal, Surface.BROWSER: self.browser},
            accel=Accel.TCG, clock=self.clock, memory_budget_mb=budget, tick_s=3600, pools=pools,
            network="gateway",
        )
        self.api = RigApi(self.rigs)

    async def settle(self) -> None:
        """Run the pools' step until no pooled rig is starting (the fake machines boot at once;
        the stores' writes run on threads, so this polls rather than waits for blocked tasks)."""
        with trio.fail_after(5):
            for _ in range(10):
                await self.rigs.pools.step()
                while any(r.phase is Phase.PROVISIONING for r in self.rigs.live.values()):
                    await trio.sleep(0.005)
                await trio.testing.wait_all_tasks_blocked()

    def pooled(self, key: PoolKey = TERMINAL) -> list[str]:
        return [r.row.id for r in self.rigs.pools.members() if r.pool_key == key and r.phase is Phase.READY]

    async def open(self, **params: Any) -> dict[str, Any]:
        return await self.api.call("rig.open", self.agent,
                                   {"workspace": "default", "surface": "terminal", **params})


async def _world(tmp_path: Path, budget: int = 12 * 1024,
                 pools: dict[PoolKey, int] | None = None) -> AsyncIterator[World]:
    w = World(tmp_path, budget, pools if pools is not None else {TERMINAL: 1})
    async with trio.open_nursery() as nursery:
        await nursery.start(w.rigs.run)
        yield w
        nursery.cancel_scope.cancel()
    w.stores.close()


@pytest.fixture
async def world(tmp_path: Path) -> AsyncIterator[World]:
    async for w in _world(tmp_path):
        yield w


async def test_an_open_takes_the_pooled_rig_with_its_callers_settings_and_the_pool_refills(
        world: World) -> None:
    await world.settle()
    pooled = world.pooled()
    assert len(pooled) == 1
    machine = world.terminal.machines[0]
    # Unowned: closed to the network, seen by no caller.
    assert machine.policy is not None and not machine.policy.allow
    assert await world.api.call("rig.list", world.person, {"workspace": "default"}) == []
    rig = await world.open(conversation="c1", egress={"allow": ["example.com"], "defaults": False},
                           ttlS=600)
    assert rig["id"] == pooled[0] and rig["start"] == "pool" and rig["phase"] == "ready"
    assert rig["conversation"] == "c1" and rig["workspace"] == world.ws.id
    assert machine.policy.allow == ("example.com",)
    # Its log opens with the caller's row; nothing from its time in the pool.
    log = await world.api.call("rig.log", world.person, {"rigId": rig["id"]})
    assert [(r["seq"], r["verb"], r["actor"]["id"]) for r in log][:1] == [(1, "open", world.agent.user.id)]
    assert log[0]["args"]["start"] == "pool" and all(r["tool"] != "netgate" for r in log)
    # The pool refills behind it; the taken rig is an ordinary rig of the workspace now.
    await world.settle()
    assert len(world.pooled()) == 1 and world.pooled()[0] != rig["id"]
    assert [r["id"] for r in await world.api.call("rig.list", world.person, {"workspace": "default"})] == [rig["id"]]
    info = world.rigs.pools.describe()
    assert info == [{"key": "terminal", "size": 1, "ready": 1, "filling": 0, "taken": 1, "evicted": 0,
                     "error": None}]
    # The same conversation reuses its rig rather than taking another.
    again = await world.open(conversation="c1")
    assert again["id"] == rig["id"]


async def test_two_opens_at_once_get_two_rigs_and_an_empty_pool_says_so(tmp_path: Path) -> None:
    async for w in _world(tmp_path, pools={TERMINAL: 2}):
        await w.settle()
        assert len(w.pooled()) == 2
        got: list[dict[str, Any]] = []
        async with trio.open_nursery() as nursery:
            for _ in range(3):
                nursery.start_soon(_append, got, w)
        starts = sorted(str(r["start"]) for r in got)
        assert len({r["id"] for r in got}) == 3 and starts == ["cold", "pool", "pool"]
        third = next(r for r in got if r["start"] == "cold")
        assert any("the terminal pool had no ready rig" in n for n in third["notes"]), third["notes"]


async def _append(out: list[dict[str, Any]], w: World) -> None:
    out.append(await w.open())


async def test_a_request_a_pooled_rig_cannot_serve_opens_afresh_saying_why(world: World) -> None:
    await world.settle()
    rig = await world.open(memoryMb=1024)
    assert rig["start"] == "cold" and rig["id"] not in world.pooled()
    assert any("not from the terminal pool: 1024 MB was asked for" in n for n in rig["notes"]), rig["notes"]
    assert len(world.pooled()) == 1


async def test_size_zero_behaves_as_today_and_a_pool_can_be_configured_live(tmp_path: Path) -> None:
    async for w in _world(tmp_path, pools={}):
        await w.settle()
        assert w.terminal.machines == []
        rig = await w.open()
        assert rig["start"] == "cold" and rig["notes"] == ["running under TCG (software emulation): not a "
                                                           "security boundary; for development and CI, not "
                                                           "for hostile code"]
        w.rigs.pools.configure({TERMINAL: 1})
        await w.settle()
        assert len(w.pooled()) == 1
        w.rigs.pools.configure({TERMINAL: 0})
        await w.settle()
        assert w.pooled() == [] and w.rigs.pools.describe() == []
        pool_db = await w.stores.workspace(POOL_WORKSPACE)
        assert pool_db.list_rigs() == []  # a retired rig leaves no row


async def test_pooled_rigs_are_evicted_first_and_never_parked(tmp_path: Path) -> None:
    async for w in _world(tmp_path, budget=1500, pools={TERMINAL: 1}):
        await w.settle()
        pooled = w.pooled()
        mine = await w.open(memoryMb=512, conversation="x")  # the pooled one
        assert mine["id"] == pooled[0]
        await w.settle()  # refilled: two rigs of 100 MB resident each (the fake's)
        refill = w.pooled()[0]
        for machine in w.terminal.machines:
            machine.rss_mb = 512
        # A rig that needs the room evicts the pooled rig, not the caller's older one.
        big = await w.open(memoryMb=768, conversation="y")
        assert big["start"] == "cold"
        assert refill not in w.rigs.live and mine["id"] in w.rigs.live
        await w.rigs.pools.step()
        assert w.rigs.pools.describe()[0]["evicted"] == 1
        # Idle past their interval: the caller's rigs park, a pooled one never does.
        for machine in w.terminal.machines:
            machine.rss_mb = 100
        await w.settle()
        assert len(w.pooled()) == 1
        w.clock.now += 50 * 60
        await w.rigs.reap_once()
        for r in w.rigs.live.values():
            assert (r.phase is Phase.READY) == (r.pool_key is not None), (r.row.id, r.phase)


async def test_a_pooled_rig_that_dies_is_replaced_never_handed_out(world: World) -> None:
    await world.settle()
    first = world.pooled()[0]
    world.terminal.machines[0].died.set()
    await trio.testing.wait_all_tasks_blocked()
    world.clock.now += 1
    # (the rig's failure is written on a store thread: a loaded host can take a while)
    with trio.fail_after(5):
        while True:
            await world.settle()
            info = world.rigs.pools.describe()[0]
            if info["error"] is not None:
                break
            await trio.sleep(0.01)
    # The failure starts the back-off: the pool says why and when it tries again.
    assert info["error"] == "fake machine died" and info["retryInS"] == 30 and info["ready"] == 0
    rig = await world.open()
    assert rig["id"] != first and rig["start"] == "cold"
    world.clock.now += 31
    await world.settle()
    assert len(world.pooled()) == 1
    assert world.rigs.pools.describe()[0]["error"] is None


async def test_a_pool_whose_image_fails_to_build_says_why(world: World) -> None:
    world.terminal.fail_boot = "building the image failed: mmdebstrap exited 1"
    await world.settle()
    info = world.rigs.pools.describe()[0]
    assert info["error"] == "building the image failed: mmdebstrap exited 1" and info["ready"] == 0


async def test_a_browser_take_gets_its_viewport_and_the_callers_profile(tmp_path: Path) -> None:
    async for w in _world(tmp_path, pools={CHROMIUM: 1}):
        await w.settle()
        machine = w.browser.machines[0]
        rig = await w.open(surface="browser", profile="work", display={"width": 1024, "height": 768})
        assert rig["start"] == "pool" and rig["profile"] == "work"
        assert machine.profile == (w.agent.user.id, "work") and machine.performed == ["set_viewport"]
