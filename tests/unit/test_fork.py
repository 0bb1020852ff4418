"""``rig.fork`` in the rig manager, over the fake backend (issue 29): the copies' rows,
specs and audit logs, the frozen state's removal, and bad input that creates nothing."""

from __future__ import annotations

from typing import Any

import pytest
import trio

from rigd.backends.fake import FakeBackend
from rigd.errors import Conflict, FieldError, NotFound
from rigd.model import Surface
from rigd.rigs.manager import Caller
from tests.unit import test_pressure
from tests.unit.test_pressure import World

pytestmark = pytest.mark.timeout(20)
#: The pressure tests' worlds (a fake backend, a fake clock; ``small`` has a 1000 MB budget).
world, small = test_pressure.world, test_pressure.small


async def fork(world: World, raw: dict[str, Any], caller: Caller | None = None) -> dict[str, Any]:
    return await world.api.call("rig.fork", caller or world.agent, raw)


async def log_of(world: World, rig_id: str) -> list[dict[str, Any]]:
    return await world.api.call("rig.log", world.person, {"rigId": rig_id})


async def test_three_copies_of_a_terminal_rig(world: World) -> None:
    world.rigs.network = "gateway"
    parent = await world.open(memoryMb=512, vcpus=1, egress={"allow": ["example.com"]})
    answer = await fork(world, {"rigId": parent["id"], "count": 3})
    copies = answer["rigs"]
    assert len(copies) == 3 and len({c["id"] for c in copies} | {parent["id"]}) == 4
    for copy in copies:
        assert copy["forkedFrom"] == parent["id"] and copy["phase"] == "ready"
        assert copy["memoryMb"] == 512 and copy["surface"] == "terminal"
        assert copy["conversation"] is None
        assert copy["network"]["allow"] == parent["network"]["allow"]
        assert any(n.startswith(f"forked from {parent['id']}: processes that were running") for n in copy["notes"])
        rows = await log_of(world, copy["id"])
        assert rows[0]["verb"] == "forkedFrom" and rows[0]["args"]["rigId"] == parent["id"]
        assert rows[0]["actor"]["id"] == world.agent.user.id
    # Each copy's machine started from the parent's spec, with its own id, and the parent's frozen state.
    first, *rest = world.terminal.machines
    assert first.spec.rig_id == parent["id"] and first.spec.fork is None
    for machine, copy in zip(rest, copies, strict=True):
        assert machine.spec.rig_id == copy["id"] and machine.spec.memory_mb == 512
        assert machine.spec.fork is not None and machine.spec.fork.parent == parent["id"]
    parent_rows = await log_of(world, parent["id"])
    assert parent_rows[-1]["verb"] == "fork"
    assert parent_rows[-1]["args"]["rigs"] == [c["id"] for c in copies]
    assert (await world.api.call("rig.get", world.person, {"rigId": parent["id"]}))["phase"] == "ready"
    # Once every copy is up, the frozen state is gone (no copy needs it any more).
    [image] = world.terminal.frozen
    with trio.fail_after(5):
        while image.dir.exists():
            await trio.sleep(0.01)


async def test_count_defaults_to_one_and_copies_of_a_computer_keep_its_display(world: World) -> None:
    parent = await world.open(surface="computer", display={"width": 1024, "height": 768})
    [copy] = (await fork(world, {"rigId": parent["id"]}))["rigs"]
    assert copy["display"] == {"width": 1024, "height": 768} and copy["surface"] == "computer"
    assert world.computer.machines[-1].spec.display == world.computer.machines[0].spec.display


@pytest.mark.parametrize(("raw", "field"), [
    ({"count": 0}, "count"), ({"count": 9}, "count"), ({"count": "3"}, "count"),
    ({"count": True}, "count"), ({"count": 2.5}, "count"), ({"copies": 2}, "copies"),
])
async def test_bad_input_names_the_field_and_creates_nothing(world: World, raw: dict[str, Any],
                                                             field: str) -> None:
    parent = await world.open()
    with pytest.raises(FieldError) as exc:
        await fork(world, {"rigId": parent["id"], **raw})
    assert exc.value.field == field
    assert len(world.terminal.machines) == 1 and world.terminal.frozen == []


async def test_a_parked_or_closed_rig_is_refused_naming_rig_id(world: World) -> None:
    parked = await world.open()
    await world.api.call("rig.park", world.agent, {"rigId": parked["id"]})
    with pytest.raises(FieldError) as exc:
        await fork(world, {"rigId": parked["id"], "count": 2})
    assert exc.value.field == "rigId" and "parked" in exc.value.reason
    closed = await world.open()
    await world.api.call("rig.close", world.agent, {"rigId": closed["id"]})
    with pytest.raises(FieldError) as exc:
        await fork(world, {"rigId": closed["id"]})
    assert exc.value.field == "rigId" and "closed" in exc.value.reason
    assert world.terminal.frozen == [] and len(world.terminal.machines) == 2


async def test_no_room_in_the_budget_creates_nothing(small: World) -> None:
    parent = await small.open(memoryMb=512)
    with pytest.raises(Conflict) as exc:
        await fork(small, {"rigId": parent["id"], "count": 2})
    assert exc.value.data["field"] == "count" and exc.value.data["budgetMb"] == 1000
    assert small.terminal.frozen == [] and len(small.terminal.machines) == 1
    assert [r["id"] for r in await small.api.call("rig.list", small.person, {"workspace": "default"})] == [
        parent["id"]]


async def test_a_backend_that_cannot_fork_and_a_person_driving_are_conflicts(world: World) -> None:
    parent = await world.open()
    world.terminal.refuse_fork = "this machine cannot be forked"
    with pytest.raises(Conflict, match="cannot be forked"):
        await fork(world, {"rigId": parent["id"]})
    world.terminal.refuse_fork = None
    await world.api.call("rig.control", world.person, {"rigId": parent["id"], "op": "take"})
    with pytest.raises(Conflict, match="a person is driving"):
        await fork(world, {"rigId": parent["id"]}, world.agent)
    assert len(world.terminal.machines) == 1
    [copy] = (await fork(world, {"rigId": parent["id"]}, world.person))["rigs"]
    assert copy["forkedFrom"] == parent["id"]


async def test_a_rig_of_another_workspace_is_not_found(world: World) -> None:
    parent = await world.open()
    outsider = Caller(world.stores.server.create_user("mallory", "agent"))
    with pytest.raises(NotFound) as exc:
        await fork(world, {"rigId": parent["id"]}, outsider)
    assert exc.value.data["field"] == "rigId"


async def test_a_browser_fork_seeds_fresh_engines_with_the_parent_engines_state(world: World) -> None:
    browsers = FakeBackend()
    world.rigs.backends[Surface.BROWSER] = browsers
    parent = await world.open(surface="browser", engine="chromium", profile="work")
    copies = (await fork(world, {"rigId": parent["id"], "count": 2}))["rigs"]
    assert [c["forkedFrom"] for c in copies] == [parent["id"]] * 2
    assert browsers.frozen == []  # a running engine is never frozen and shared
    for copy, machine in zip(copies, browsers.machines[1:], strict=True):
        assert copy["engine"] == "chromium" and "profile" not in copy  # the profile stays the parent's
        assert any("a fresh engine with the parent's cookies" in n for n in copy["notes"])
        assert machine.spec.fork is None and machine.spec.profile is None
        assert machine.spec.browser_state is not None
        assert machine.spec.browser_state.tabs == [f"https://example.com/{parent['id']}"]
    row = (await log_of(world, parent["id"]))[-1]
    assert row["verb"] == "fork" and row["args"]["freshEngines"] is True
