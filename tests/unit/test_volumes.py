"""Volumes in the rig manager (issue 29), over the fake backend: made with a real ext4
(mkfs.ext4 on a sparse file), attached by name at open, one writer or many readers,
released when the rig ends, and bad input that creates nothing."""

from __future__ import annotations

import subprocess
from typing import Any

import pytest

from rigd.errors import Conflict, FieldError, NotFound
from rigd.rigs.params import parse_open, volume_path_problem
from tests.unit import test_pressure
from tests.unit.test_pressure import World

pytestmark = pytest.mark.timeout(30)
world = test_pressure.world


async def create(world: World, name: str = "work", size_mb: int = 32) -> dict[str, Any]:
    return await world.api.call("volume.create", world.person,
                                {"workspace": "default", "name": name, "sizeMb": size_mb})


async def listed(world: World) -> list[dict[str, Any]]:
    return await world.api.call("volume.list", world.person, {"workspace": "default"})


async def test_a_volume_is_a_sparse_ext4_disk_listed_with_its_rigs(world: World) -> None:
    made = await create(world)
    assert made == {**made, "name": "work", "sizeMb": 32, "attachedTo": []}
    [image] = world.rigs.volumes.root.glob("*/work.img")
    assert image.stat().st_size == 32 << 20 and image.stat().st_blocks * 512 < 32 << 20  # sparse
    assert image.stat().st_mode & 0o777 == 0o600 and image.parent.stat().st_mode & 0o777 == 0o700
    probe = subprocess.run(["dumpe2fs", "-h", str(image)], capture_output=True, text=True, check=True)
    assert "Filesystem volume name:   work" in probe.stdout
    rig = await world.open(volumes=[{"name": "work", "path": "/workspace"}])
    assert rig["volumes"] == [{"name": "work", "path": "/workspace", "readOnly": False}]
    [machine] = world.terminal.machines
    assert [(v.name, v.path, v.read_only, v.image) for v in machine.spec.volumes] == [
        ("work", "/workspace", False, image)]
    assert (await listed(world))[0]["attachedTo"] == [rig["id"]]
    assert (await world.api.call("rig.log", world.person, {"rigId": rig["id"]}))[0]["args"]["volumes"] == [
        {"name": "work", "path": "/workspace", "readOnly": False}]


async def test_one_writer_or_many_readers_and_closing_releases(world: World) -> None:
    await create(world)
    writer = await world.open(volumes=[{"name": "work", "path": "/w"}])
    for ro in (False, True):
        with pytest.raises(FieldError, match=f"read-write to rig {writer['id']}") as exc:
            await world.open(volumes=[{"name": "work", "path": "/w", "readOnly": ro}])
        assert exc.value.field == "volumes[0].name"
    with pytest.raises(Conflict, match="attached to") as cexc:
        await world.api.call("volume.rm", world.person, {"workspace": "default", "name": "work"})
    assert cexc.value.data["rigs"] == [writer["id"]]
    with pytest.raises(FieldError, match="volumes attached"):
        await world.api.call("rig.fork", world.agent, {"rigId": writer["id"]})
    with pytest.raises(FieldError, match="volumes attached"):
        await world.api.call("snapshot.create", world.agent, {"rigId": writer["id"], "name": "s"})
    assert len(world.terminal.machines) == 1
    await world.api.call("rig.close", world.agent, {"rigId": writer["id"]})
    readers = [await world.open(volumes=[{"name": "work", "path": "/w", "readOnly": True}]) for _ in range(2)]
    assert sorted((await listed(world))[0]["attachedTo"]) == sorted(r["id"] for r in readers)
    with pytest.raises(FieldError, match="a writer needs it alone"):
        await world.open(volumes=[{"name": "work", "path": "/w"}])
    for r in readers:
        await world.api.call("rig.close", world.agent, {"rigId": r["id"]})
    await world.api.call("volume.rm", world.person, {"workspace": "default", "name": "work"})
    assert await listed(world) == []
    assert list(world.rigs.volumes.root.glob("*/work.*")) == []


async def test_a_missing_volume_a_duplicate_and_the_quota_create_nothing(world: World) -> None:
    with pytest.raises(NotFound) as nf:
        await world.open(volumes=[{"name": "nope", "path": "/w"}])
    assert nf.value.data["field"] == "volumes[0].name" and world.terminal.machines == []
    await create(world, "a", 16)
    with pytest.raises(Conflict) as dup:
        await create(world, "a", 16)
    assert dup.value.data["field"] == "name"
    with pytest.raises(FieldError, match=r"volumes\.quotaMb") as big:
        await create(world, "b", 50 * 1024)
    assert big.value.field == "sizeMb"
    assert [v["name"] for v in await listed(world)] == ["a"]
    assert sorted(p.name for p in world.rigs.volumes.root.glob("*/*")) == ["a.img", "a.json"]


@pytest.mark.parametrize(("raw", "field"), [
    ({"name": "w", "sizeMb": 8}, "sizeMb"), ({"name": "w", "sizeMb": "16"}, "sizeMb"), ({"name": "w"}, "sizeMb"),
    ({"name": "../w", "sizeMb": 16}, "name"), ({"name": "w", "sizeMb": 16, "x": 1}, "x"),
])
async def test_bad_volume_create_input_is_a_field_error(world: World, raw: dict[str, Any], field: str) -> None:
    with pytest.raises(FieldError) as exc:
        await world.api.call("volume.create", world.person, {"workspace": "default", **raw})
    assert exc.value.field == field
    assert await listed(world) == []


@pytest.mark.parametrize(("volumes", "field"), [
    ([{"name": "w", "path": "relative"}], "volumes[0].path"),
    ([{"name": "w", "path": "/"}], "volumes[0].path"),
    ([{"name": "w", "path": "/proc/x"}], "volumes[0].path"),
    ([{"name": "w", "path": "/.rigd"}], "volumes[0].path"),
    ([{"name": "w", "path": "/a/../etc"}], "volumes[0].path"),
    ([{"name": "w", "path": "/a b"}], "volumes[0].path"),
    ([{"name": "w", "path": "/w"}, {"name": "v", "path": "/w/inner"}], "volumes[1].path"),
    ([{"name": "w", "path": "/w"}, {"name": "w", "path": "/v"}], "volumes[1].name"),
    ([{"name": "w", "path": "/w", "readOnly": "yes"}], "volumes[0].readOnly"),
    ([{"name": "a/b", "path": "/w"}], "volumes[0].name"),
    ({"name": "w"}, "volumes"),
])
def test_bad_volume_mounts_are_field_errors(volumes: object, field: str) -> None:
    with pytest.raises(FieldError) as exc:
        parse_open({"workspace": "default", "surface": "terminal", "volumes": volumes})
    assert exc.value.field == field


def test_every_surface_takes_volumes_and_good_paths_pass() -> None:
    for surface in ("terminal", "computer", "browser"):
        opened = parse_open({"workspace": "default", "surface": surface,
                             "volumes": [{"name": "v", "path": "/workspace"}]})
        assert [(v.name, v.path) for v in opened.volumes] == [("v", "/workspace")]
    assert all(volume_path_problem(p) is None for p in ("/workspace", "/home/rig/data", "/srv/a.b-c_d"))


def test_volumes_reach_qemu_as_fds_never_as_paths() -> None:
    from rigd.backends.microvm_argv import volume_argv

    argv = volume_argv([False, True], [[7, 8], [9]])
    assert argv == [
        "-add-fd", "fd=7,set=10,opaque=volume0.0", "-add-fd", "fd=8,set=10,opaque=volume0.1",
        "-drive", "id=vol0,file=/dev/fdset/10,format=raw,if=none,readonly=off,discard=unmap",
        "-device", "virtio-blk-device,drive=vol0,serial=rigd-vol0",
        "-add-fd", "fd=9,set=11,opaque=volume1.0",
        "-drive", "id=vol1,file=/dev/fdset/11,format=raw,if=none,readonly=on,discard=unmap",
        "-device", "virtio-blk-device,drive=vol1,serial=rigd-vol1",
    ]
    with pytest.raises(ValueError):
        volume_argv([False], [])
    # A desktop (q35) takes them on PCI.
    assert volume_argv([True], [[5]], bus="pci")[-1] == "virtio-blk-pci,drive=vol0,serial=rigd-vol0"


async def test_a_close_quiesces_a_rig_with_volumes_first_even_a_parked_one(world: World) -> None:
    await create(world)
    rig = await world.open(volumes=[{"name": "work", "path": "/w"}])
    await world.api.call("rig.park", world.agent, {"rigId": rig["id"]})
    [machine] = world.terminal.machines
    await world.api.call("rig.close", world.agent, {"rigId": rig["id"]})
    assert machine.quiesced and not machine.parked
    plain = await world.open()
    await world.api.call("rig.close", world.agent, {"rigId": plain["id"]})
    assert not world.terminal.machines[1].quiesced
