"""Seats in the rig manager (issue 29), over the fake backend and a fake clock: one lasting
rig per seat (returned, or woken, by the next open), its volume at /workspace and its own
browser profile across rigs, parking without idle closes, one conversation holding it, a
hand-over to a person with no lease to lapse, and bad input that creates nothing."""

from __future__ import annotations

from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import pytest
import trio

from rigd.backends.fake import FakeBackend
from rigd.errors import Conflict, FieldError, Forbidden, NotFound
from rigd.model import Surface
from rigd.rigs.live import seat_profile_owner
from rigd.rigs.manager import CONTROL_LEASE_S
from rigd.rigs.params import parse_open
from tests.unit.test_pressure import World

pytestmark = pytest.mark.timeout(30)


@pytest.fixture
async def world(tmp_path: Path) -> AsyncIterator[World]:
    w = World(tmp_path)
    w.browser = FakeBackend()  # type: ignore[attr-defined]
    w.rigs.backends[Surface.BROWSER] = w.browser  # type: ignore[attr-defined]
    async with trio.open_nursery() as nursery:
        await nursery.start(w.rigs.run)
        yield w
        nursery.cancel_scope.cancel()
    w.stores.close()


async def seat_open(world: World, name: str = "ada", caller: Any = None, **params: Any) -> dict[str, Any]:
    return await world.open(caller, seat=name, **params)


async def seats(world: World) -> dict[str, dict[str, Any]]:
    return {s["name"]: s for s in await world.api.call("seat.list", world.person, {"workspace": "default"})}


async def seat_call(world: World, method: str, caller: Any = None, **params: Any) -> dict[str, Any]:
    return await world.api.call(method, caller or world.agent, {"workspace": "default", **params})


async def test_a_seat_is_one_lasting_rig_with_its_volume_at_workspace(world: World) -> None:
    first = await seat_open(world)
    assert first["seat"] == "ada" and first["conversation"] is None
    assert first["volumes"] == [{"name": "seat.ada", "path": "/workspace", "readOnly": False}]
    vols = await world.api.call("volume.list", world.person, {"workspace": "default"})
    assert [(v["name"], v["sizeMb"], v["attachedTo"]) for v in vols] == [("seat.ada", 2048, [first["id"]])]
    # The next open is the same machine; a parked one is woken for it.
    assert (await seat_open(world))["id"] == first["id"]
    await world.api.call("rig.park", world.agent, {"rigId": first["id"]})
    woken = await seat_open(world)
    assert woken["id"] == first["id"] and woken["phase"] == "ready", woken
    assert woken["phaseDetail"] == "woken by an open of seat 'ada'"
    assert len(world.terminal.machines) == 1
    # Idle: it parks, and stays parked past twice its interval (a plain rig would close).
    rig = world.rigs.live[first["id"]]
    await world.tick(rig.row.idle_s + 1)
    assert await world.phase(first["id"]) == "parked"
    await world.tick(5 * rig.row.idle_s)
    assert await world.phase(first["id"]) == "parked"
    listed = (await seats(world))["ada"]
    assert listed == {**listed, "surface": "terminal", "rigId": first["id"], "state": "parked",
                      "volume": "seat.ada", "path": "/workspace", "holder": None, "handedTo": None,
                      "owner": world.agent.user.id}
    # Closed (TTL, budget, a person): the next open is a new rig on the same volume.
    await world.api.call("rig.close", world.person, {"rigId": first["id"]})
    assert (await seats(world))["ada"]["state"] == "closed"
    second = await seat_open(world)
    assert second["id"] != first["id"] and second["seat"] == "ada"
    [_, machine] = world.terminal.machines
    assert [(v.name, v.path) for v in machine.spec.volumes] == [("seat.ada", "/workspace")]
    assert (await seats(world))["ada"]["rigId"] == second["id"]


async def test_a_browser_seat_keeps_the_seats_own_profile(world: World) -> None:
    browser: FakeBackend = world.browser  # type: ignore[attr-defined]
    rig = await seat_open(world, "scout", surface="browser")
    assert rig["profile"] == "scout"
    [machine] = browser.machines
    assert machine.spec.profile == (seat_profile_owner(world.ws.id), "scout")
    await world.api.call("rig.close", world.agent, {"rigId": rig["id"]})
    # Another member's open of the seat loads the same profile (the seat's, not the caller's).
    again = await seat_open(world, "scout", caller=world.person, surface="browser")
    assert browser.machines[1].spec.profile == machine.spec.profile and again["id"] != rig["id"]
    with pytest.raises(FieldError) as wrong:
        await seat_open(world, "scout")
    assert wrong.value.field == "surface" and "browser:chromium seat" in wrong.value.reason


async def test_one_conversation_holds_a_seat_at_a_time(world: World) -> None:
    rig = await seat_open(world, conversation="c1")
    assert (await seats(world))["ada"]["holder"]["conversation"] == "c1"
    assert (await seat_open(world, conversation="c1"))["id"] == rig["id"]
    with pytest.raises(Conflict) as held:
        await seat_open(world, conversation="c2")
    assert held.value.data["field"] == "seat" and held.value.data["holder"] == "c1"
    with pytest.raises(Conflict):
        await seat_call(world, "seat.acquire", name="ada", conversation="c2")
    with pytest.raises(Conflict):
        await seat_call(world, "seat.release", name="ada", conversation="c2")
    with pytest.raises(FieldError) as nameless:  # an agent names the conversation it releases
        await seat_call(world, "seat.release", name="ada")
    assert nameless.value.field == "conversation"
    freed = await seat_call(world, "seat.release", name="ada", conversation="c1")
    assert freed["holder"] is None
    assert (await seat_call(world, "seat.acquire", name="ada", conversation="c2"))["holder"]["conversation"] == "c2"
    # Ending the conversation frees the seat; its rig lives on for the next one.
    ended = await world.api.call("conversation.end", world.agent, {"workspace": "default", "conversation": "c2"})
    assert ended == {"closed": [], "seatsReleased": ["ada"]}
    assert (await seat_open(world, conversation="c3"))["id"] == rig["id"]
    log = await world.api.call("rig.log", world.person, {"rigId": rig["id"]})
    assert [r["verb"] for r in log if r["verb"].startswith("seat.")] == ["seat.release", "seat.acquire"]


async def test_a_seat_handed_to_a_person_is_theirs_until_they_hand_it_back(world: World) -> None:
    rig = await seat_open(world)
    handed = await seat_call(world, "seat.handOver", name="ada", to=world.person.user.id)
    assert handed["handedTo"]["id"] == world.person.user.id
    got = await world.api.call("rig.get", world.person, {"rigId": rig["id"]})
    assert got["controller"] == {"kind": "person", "id": world.person.user.id, "until": None}
    with pytest.raises(Conflict, match="a person is driving"):
        await world.exec(rig["id"])
    # No lease lapses while it is handed (a control taken with rig.control would, after 15 min).
    await world.tick(CONTROL_LEASE_S * 3)
    await world.api.call("rig.watch", world.person, {"rigId": rig["id"]})
    assert (await world.api.call("rig.get", world.person, {"rigId": rig["id"]}))["controller"]["until"] is None
    assert (await world.exec(rig["id"], world.person))["exitCode"] == 0
    with pytest.raises(Forbidden):
        await seat_call(world, "seat.handBack", world.other_person, name="ada")
    # A rig reopened while the seat is handed is the person's too.
    await world.api.call("rig.close", world.person, {"rigId": rig["id"]})
    reopened = await seat_open(world)
    assert reopened["controller"]["id"] == world.person.user.id
    # The person's release of control is the hand-back.
    await world.api.call("rig.control", world.person, {"rigId": reopened["id"], "op": "release"})
    assert (await seats(world))["ada"]["handedTo"] is None
    assert (await world.exec(reopened["id"]))["exitCode"] == 0
    with pytest.raises(Conflict, match="not handed"):
        await seat_call(world, "seat.handBack", world.person, name="ada")
    with pytest.raises(FieldError) as agent_to:
        await seat_call(world, "seat.handOver", name="ada", to=world.agent.user.id)
    assert agent_to.value.field == "to"


async def test_seat_rm_takes_its_volume_once_its_rig_is_closed(world: World) -> None:
    rig = await seat_open(world)
    with pytest.raises(Conflict) as running:
        await seat_call(world, "seat.rm", world.person, name="ada")
    assert running.value.data["rigId"] == rig["id"]
    await world.api.call("rig.close", world.person, {"rigId": rig["id"]})
    assert await seat_call(world, "seat.rm", world.person, name="ada") == {
        "name": "ada", "workspace": world.ws.id, "removed": True}
    assert await seats(world) == {}
    assert await world.api.call("volume.list", world.person, {"workspace": "default"}) == []
    with pytest.raises(NotFound):
        await seat_call(world, "seat.acquire", name="ada", conversation="c1")


async def test_a_volume_made_beforehand_is_the_seats(world: World) -> None:
    await world.api.call("volume.create", world.person, {"workspace": "default", "name": "seat.ada", "sizeMb": 64})
    await seat_open(world)
    [vol] = await world.api.call("volume.list", world.person, {"workspace": "default"})
    assert vol["sizeMb"] == 64


@pytest.mark.parametrize(("params", "field"), [
    ({"seat": "a/b"}, "seat"),
    ({"seat": "x" * 49}, "seat"),
    ({"seat": "a.b"}, "seat"),
    ({"seat": "ada", "snapshot": "s"}, "seat"),
    ({"seat": "ada", "surface": "browser", "profile": "p"}, "profile"),
    ({"seat": "ada", "volumes": [{"name": "v", "path": "/workspace/x"}]}, "volumes[0].path"),
    ({"seat": "ada", "volumes": [{"name": "v", "path": "/"}]}, "volumes[0].path"),
])
def test_bad_seat_opens_are_field_errors(params: dict[str, Any], field: str) -> None:
    with pytest.raises(FieldError) as exc:
        parse_open({"workspace": "default", "surface": "terminal", **params})
    assert exc.value.field == field


@pytest.mark.parametrize(("method", "params", "field"), [
    ("seat.acquire", {"name": "ada"}, "conversation"),
    ("seat.acquire", {"name": "", "conversation": "c"}, "name"),
    ("seat.handOver", {"name": "ada", "to": "usr_nobody"}, "to"),
    ("seat.rm", {"name": "ada", "extra": 1}, "extra"),
])
async def test_bad_seat_calls_are_field_errors(world: World, method: str, params: dict[str, Any],
                                               field: str) -> None:
    await seat_open(world)
    with pytest.raises(FieldError) as exc:
        await seat_call(world, method, **params)
    assert exc.value.field == field
    assert len(world.terminal.machines) == 1


async def test_a_named_agents_tool_calls_drive_its_seat_and_hold_it(world: World) -> None:
    """tools.call {seat}: the first call opens the seat's rig and holds the seat for its
    conversation; another conversation's call is refused naming the holder; terminal_use runs
    in a computer seat's own machine."""
    from rigd.tools.catalogue import Tools

    tools = Tools(world.api)
    exec_hi = {"action": "exec", "argv": ["echo", "hi"]}

    async def call(conversation: str, seat: str, name: str = "terminal_use") -> dict[str, Any]:
        with trio.fail_after(10):
            return await tools.call(world.agent, {"workspace": "default", "conversation": conversation,
                                                  "seat": seat, "name": name, "arguments": exec_hi})

    first = await call("c1", "ada")
    assert first["isError"] is False, first
    held = (await seats(world))["ada"]
    assert held["rigId"] == first["rigId"] and held["holder"]["conversation"] == "c1"
    assert (await call("c1", "ada"))["rigId"] == first["rigId"]
    refused = await call("c2", "ada")
    assert refused["isError"] is True and "held by conversation 'c1'" in refused["content"][0]["text"]
    # A computer seat (made by its first open): a terminal tool runs in its desktop.
    desk = await seat_open(world, "desk", surface="computer", conversation="c3")
    assert (await call("c3", "desk"))["rigId"] == desk["id"]
    assert [m.spec.surface for m in world.computer.machines] == [Surface.COMPUTER]
    with pytest.raises(FieldError) as bad:
        await tools.call(world.agent, {"workspace": "default", "conversation": "c1", "seat": "a/b",
                                       "name": "terminal_use", "arguments": exec_hi})
    assert bad.value.field == "seat"
