"""``rig.fork`` in the rig manager, over the fake backend (issue 29): the copies' rows,
specs and audit logs, the frozen state's removal, and bad input that creates nothing."""

from __future__ import annotations

from typing import Any

import pytest
import trio

from rigd.backends.fake import FakeBackend
from rigd.errors import Conflict, FieldError, NotFound
from rigd.model import Surface
from rigd.rigs.guard import SNAPSHOT_QUOTA, WorkspaceSettings
from rigd.rigs.manager import Caller
from rigd.rigs.snapshots import SnapshotShelf
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


# -- named snapshots -------------------------------------------------------------------------


async def test_a_named_snapshot_opens_twice_and_goes_when_removed(world: World) -> None:
    parent = await world.open(surface="computer", display={"width": 1024, "height": 768}, memoryMb=2048)
    kept = await world.api.call("snapshot.create", world.agent, {"rigId": parent["id"], "name": "base-1"})
    assert kept["name"] == "base-1" and kept["surface"] == "computer" and kept["sourceRig"] == parent["id"]
    assert kept["bytes"] == len(b"fake disk") + len(b"fake memory")
    assert [s["name"] for s in await world.api.call("snapshot.list", world.person, {"workspace": "default"})] == [
        "base-1"]
    assert (await log_of(world, parent["id"]))[-1]["verb"] == "snapshot"
    opened = []
    for _ in range(2):
        rig = await world.open(surface="computer", snapshot="base-1")
        assert rig["phase"] == "ready" and rig["memoryMb"] == 2048
        assert rig["display"] == {"width": 1024, "height": 768}
        assert any("resumed from snapshot 'base-1'" in n for n in rig["notes"])
        assert (await log_of(world, rig["id"]))[0]["args"]["snapshot"] == "base-1"
        opened.append(rig["id"])
    machines = world.computer.machines[1:]
    assert [m.spec.fork.parent for m in machines if m.spec.fork] == ["snapshot base-1"] * 2
    await world.api.call("snapshot.rm", world.person, {"workspace": "default", "name": "base-1"})
    assert await world.api.call("snapshot.list", world.person, {"workspace": "default"}) == []
    with pytest.raises(NotFound):
        await world.open(surface="computer", snapshot="base-1")


async def test_snapshots_live_on_disk_and_a_damaged_one_fails_saying_which_file(world: World) -> None:
    parent = await world.open()
    for name in ("kept", "spoilt"):
        await world.api.call("snapshot.create", world.agent, {"rigId": parent["id"], "name": name})
    # Nothing of them is in memory: a new shelf on the same directory (as after a restart) has them.
    world.rigs.shelf = SnapshotShelf(world.rigs.shelf.root)
    names = [s["name"] for s in await world.api.call("snapshot.list", world.person, {"workspace": "default"})]
    assert names == ["kept", "spoilt"]
    spoilt = next(world.rigs.shelf.root.glob("*/spoilt/memory.zst"))
    spoilt.write_bytes(b"fake memorx")
    with pytest.raises(Conflict, match=r"memory\.zst is damaged"):
        await world.open(snapshot="spoilt")
    assert len(world.terminal.machines) == 1  # nothing else booted
    assert (await world.open(snapshot="kept"))["phase"] == "ready"
    # What a crash left half-made is swept at start; the kept ones stay.
    half = world.rigs.shelf.root / parent["workspace"] / ".tmp-x-1234"
    half.mkdir()
    world.rigs.shelf.sweep()
    assert not half.exists() and len(world.rigs.shelf.list(parent["workspace"])) == 2


@pytest.mark.parametrize("name", ["", "a/b", "..", "a..b", "x\x00y", "é", "n" * 65, ".hidden", 7])
async def test_bad_snapshot_names_are_field_errors_naming_name(world: World, name: object) -> None:
    parent = await world.open()
    with pytest.raises(FieldError) as exc:
        await world.api.call("snapshot.create", world.agent, {"rigId": parent["id"], "name": name})
    assert exc.value.field == "name"
    with pytest.raises(FieldError) as exc:
        await world.open(snapshot=name)
    assert exc.value.field == "snapshot"
    assert world.terminal.frozen == []


async def test_a_duplicate_name_a_full_quota_and_a_browser_rig_create_nothing(world: World) -> None:
    parent = await world.open()
    await world.api.call("snapshot.create", world.agent, {"rigId": parent["id"], "name": "one"})
    with pytest.raises(Conflict) as exc:
        await world.api.call("snapshot.create", world.agent, {"rigId": parent["id"], "name": "one"})
    assert exc.value.data["field"] == "name"

    async def quota(_ws: str) -> WorkspaceSettings:
        return WorkspaceSettings({SNAPSHOT_QUOTA: 0}, {})

    world.rigs.settings_of = quota
    with pytest.raises(Conflict, match=r"snapshots\.quotaMb") as exc:
        await world.api.call("snapshot.create", world.agent, {"rigId": parent["id"], "name": "two"})
    assert exc.value.data["quotaMb"] == 0
    world.rigs.settings_of = None
    world.rigs.backends[Surface.BROWSER] = FakeBackend()
    browser = await world.open(surface="browser")
    with pytest.raises(FieldError, match="profile") as fexc:
        await world.api.call("snapshot.create", world.agent, {"rigId": browser["id"], "name": "three"})
    assert fexc.value.field == "rigId"
    with pytest.raises(FieldError) as fexc:
        await world.open(surface="computer", snapshot="one")  # a terminal snapshot
    assert fexc.value.field == "snapshot"
    assert [s["name"] for s in await world.api.call("snapshot.list", world.person, {"workspace": "default"})] == [
        "one"]
    assert len(world.terminal.frozen) == 1
