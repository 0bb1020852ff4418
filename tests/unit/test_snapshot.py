"""Warm starts, the pure parts and the store: keys, invalidation, per-rig identity.

No VMs: the snapshot store is plain files in a temporary directory, and the
agent's ``reseed`` runs on the host over pipes (``--stdio --sysroot``).
"""

from __future__ import annotations

import dataclasses
import fcntl
import json
import os
import re
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from rigd.backends.base import MachineSpec
from rigd.backends.microvm_argv import microvm_argv
from rigd.backends.qemu import QemuConfig
from rigd.backends.smolvm import TerminalRecipe
from rigd.backends.snapshot import (
    DISK_FILE,
    MAX_PER_PACK,
    MEMORY_FILE,
    META_FILE,
    SnapshotEntry,
    SnapshotStore,
    file_identity,
    plan_prune,
    rig_mac,
    rig_machine_id,
    should_build,
    snapshot_key,
    snapshot_material,
    warm_starts_enabled,
)
from rigd.backends.warm import plan_sync
from rigd.errors import RigdError
from rigd.images import TerminalAssets
from rigd.model import Accel
from rigd.protocols.guest import Garbage, GuestProtocol, Ready, Reply
from tests.unit.test_agent import AgentHarness

# --- per-rig identity -------------------------------------------------------------


def test_rig_mac_is_a_stable_locally_administered_unicast_address() -> None:
    mac = rig_mac("rig_abc")
    assert re.fullmatch(r"[0-9a-f]{2}(:[0-9a-f]{2}){5}", mac)
    first = int(mac[:2], 16)
    assert first & 0x02 and not first & 0x01  # locally administered, unicast
    assert rig_mac("rig_abc") == mac
    macs = {rig_mac(f"rig_{i}") for i in range(2000)}
    assert len(macs) == 2000


def test_rig_machine_id_is_32_hex_digits_and_per_rig() -> None:
    ids = {rig_machine_id(f"rig_{i}") for i in range(1000)}
    assert len(ids) == 1000
    assert all(re.fullmatch(r"[0-9a-f]{32}", i) for i in ids)
    assert rig_machine_id("rig_x") == rig_machine_id("rig_x")


def argv(**kw: Any) -> list[str]:
    base: dict[str, Any] = dict(
        qemu="qemu", accel="tcg", memory_mb=512, vcpus=2, kernel=Path("/k"), initrd=Path("/i"),
        root_disk=Path("/r/root.qcow2"), tools_disk=Path("/t"), qmp_socket=Path("/r/q"),
        agent_socket=Path("/r/a"), console_socket=Path("/r/c"), tsc_khz=1000,
    )
    base.update(kw)
    return microvm_argv(**base)


def test_argv_takes_the_rig_mac_for_a_nic_and_an_incoming_migration() -> None:
    mac = rig_mac("rig_1")
    plain = argv(mac=mac)
    assert plain == argv()  # no NIC yet: the MAC changes nothing
    with_nic = argv(mac=mac, nic_netdev="net0")
    assert f"virtio-net-device,netdev=net0,mac={mac}" in with_nic
    restored = argv(mac=mac, incoming="defer")
    i = restored.index("-incoming")
    assert restored[i + 1] == "defer"
    assert restored[:i] + restored[i + 2 :] == plain  # the same machine, waiting for its state


@pytest.mark.parametrize(
    "kw",
    [
        {"mac": "02:00:00:00:00"},
        {"mac": "02:AA:00:00:00:01"},
        {"mac": "03:00:00:00:00:01"},  # multicast
        {"nic_netdev": "net0"},  # a NIC needs a MAC
        {"incoming": "tcp:0:4444"},
    ],
)
def test_argv_refuses_bad_mac_nic_and_incoming(kw: dict[str, Any]) -> None:
    with pytest.raises(RigdError):
        argv(**kw)


@pytest.mark.parametrize(
    ("value", "enabled"),
    [(None, True), ("1", True), ("yes", True), ("0", False), ("false", False), (" OFF ", False),
     ("no", False)],
)
def test_the_environment_switch(value: str | None, enabled: bool) -> None:
    env = {} if value is None else {"RIGD_WARM_STARTS": value}
    assert warm_starts_enabled(env) is enabled


# --- keys -------------------------------------------------------------------------


def material(**over: Any) -> dict[str, Any]:
    base: dict[str, Any] = dict(
        pack="f8d0-tools-v1",
        rootfs={"ino": 7, "size": 100, "mtimeNs": 1},
        qemu_version="QEMU emulator version 7.2.22",
        qemu_binary={"ino": 9, "size": 5, "mtimeNs": 2},
        argv_shape=["-m", "512", "-smp", "2"],
        assets={"tools": {"key": "abc", "file": "tools.img", "size": 3}},
    )
    base.update(over)
    return snapshot_material(**base)


def test_the_key_is_stable_and_every_input_changes_it() -> None:
    key = snapshot_key(material())
    assert key == snapshot_key(material()) and re.fullmatch(r"[0-9a-f]{24}", key)
    changed = [
        material(pack="0000-tools-v2"),  # another image digest or toolkit revision
        material(rootfs={"ino": 7, "size": 100, "mtimeNs": 2}),  # the pack was rebuilt
        material(qemu_version="QEMU emulator version 8.0"),
        material(qemu_binary={"ino": 10, "size": 5, "mtimeNs": 2}),
        material(argv_shape=["-m", "1024", "-smp", "2"]),
        material(argv_shape=["-m", "512", "-smp", "4"]),
        material(assets={"tools": {"key": "abd", "file": "tools.img", "size": 3}}),  # a new agent
    ]
    keys = {snapshot_key(m) for m in changed}
    assert key not in keys and len(keys) == len(changed)


def test_prune_drops_other_pack_identities_and_unreadable_ones_and_keeps_the_current() -> None:
    current = material()
    cur_key = snapshot_key(current)
    other_shape = material(argv_shape=["-m", "1024"])
    stale = material(rootfs={"ino": 8, "size": 100, "mtimeNs": 1})
    entries = [
        SnapshotEntry(cur_key, current["pack"], last_used=1.0),
        SnapshotEntry(snapshot_key(other_shape), other_shape["pack"], last_used=5.0),
        SnapshotEntry(snapshot_key(stale), stale["pack"], last_used=9.0),
        SnapshotEntry("broken", None, last_used=9.0),
    ]
    assert plan_prune(entries, current) == sorted([snapshot_key(stale), "broken"])


def test_prune_keeps_at_most_max_per_pack_least_recently_used_out() -> None:
    current = material()
    cur_key = snapshot_key(current)
    variants = [material(argv_shape=["-m", str(600 + i)]) for i in range(MAX_PER_PACK + 2)]
    entries = [SnapshotEntry(cur_key, current["pack"], last_used=0.0)]
    entries += [SnapshotEntry(snapshot_key(v), v["pack"], last_used=float(i + 1)) for i, v in enumerate(variants)]
    doomed = plan_prune(entries, current)
    # The current one (even though least recently used) stays, plus the newest MAX_PER_PACK - 1.
    assert cur_key not in doomed
    assert doomed == sorted(snapshot_key(v) for v in variants[:3])


# --- the store ------------------------------------------------------------------


def build(store: SnapshotStore, key: str, mat: dict[str, Any], memory: bytes = b"m" * 100) -> None:
    with store.building(key) as tmp:
        assert tmp is not None
        (tmp / DISK_FILE).write_bytes(b"d" * 10)
        (tmp / MEMORY_FILE).write_bytes(memory)
        store.commit(tmp, key, mat, buildS=1.0)


def test_a_committed_snapshot_is_found_read_only_and_whole(tmp_path: Path) -> None:
    store = SnapshotStore(tmp_path / "snapshots")
    mat = material()
    key = snapshot_key(mat)
    assert store.find(key) is None
    build(store, key, mat)
    snap = store.find(key)
    assert snap is not None and snap.key == key
    assert snap.disk.stat().st_mode & 0o777 == 0o444
    assert snap.memory.stat().st_mode & 0o777 == 0o400
    assert snap.meta["material"] == mat and snap.meta["sizes"] == {DISK_FILE: 10, MEMORY_FILE: 100}
    assert [p.name for p in store.root.iterdir() if not p.name.startswith(".lock")] == [key]


def test_a_damaged_snapshot_is_discarded_not_served(tmp_path: Path) -> None:
    store = SnapshotStore(tmp_path / "snapshots")
    mat = material()
    key = snapshot_key(mat)
    build(store, key, mat)
    memory = store.root / key / MEMORY_FILE
    os.chmod(memory, 0o600)
    memory.write_bytes(b"m" * 50)  # truncated
    assert store.find(key) is None
    assert not (store.root / key).exists()
    build(store, key, mat)
    meta = store.root / key / META_FILE
    os.chmod(meta, 0o644)
    meta.write_text("{not json")
    assert store.find(key) is None and not (store.root / key).exists()


def test_a_failed_build_leaves_nothing_and_a_held_lock_skips_the_build(tmp_path: Path) -> None:
    store = SnapshotStore(tmp_path / "snapshots")
    key = snapshot_key(material())
    with pytest.raises(RuntimeError), store.building(key) as tmp:
        assert tmp is not None
        (tmp / DISK_FILE).write_bytes(b"half")
        raise RuntimeError("QEMU died")
    assert [p.name for p in store.root.iterdir()] == [f".lock-{key}"]
    # Another process building the same key holds the lock: this one steps aside.
    fd = os.open(store.root / f".lock-{key}", os.O_RDWR)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX)
        with store.building(key) as tmp:
            assert tmp is None
    finally:
        os.close(fd)
    # Leftovers of a dead builder are swept when the key is built next.
    dead = store.root / f".tmp-{key}-999999999-abcd"
    dead.mkdir()
    build(store, key, material())
    assert not dead.exists()
    with store.building(key) as tmp:
        assert tmp is None  # already built


def test_a_new_pack_identity_prunes_the_old_snapshot_on_commit(tmp_path: Path) -> None:
    store = SnapshotStore(tmp_path / "snapshots")
    old, new = material(), material(rootfs={"ino": 7, "size": 100, "mtimeNs": 99})
    build(store, snapshot_key(old), old)
    build(store, snapshot_key(new), new)
    assert store.prune(new) == [snapshot_key(old)]
    assert store.find(snapshot_key(old)) is None and store.find(snapshot_key(new)) is not None


# --- the backend's key: a pack change invalidates, a rig's paths do not ---------------


@pytest.fixture
def backend(tmp_path: Path) -> Iterator[tuple[TerminalRecipe, Path]]:
    cache = tmp_path / "cache"
    files = {}
    for name, key in (("vmlinux", "k1"), ("initrd.img", "i1"), ("tools.img", "t1")):
        (cache / key).mkdir(parents=True)
        files[name] = cache / key / name
        files[name].write_bytes(name.encode())
    assets = TerminalAssets(kernel=files["vmlinux"], initrd=files["initrd.img"], tools=files["tools.img"],
                            oci_layout=tmp_path, image_digest="sha256:" + "0" * 64, kernel_release="6.1")
    pack = tmp_path / "data" / "rigs" / "smolvm-packs" / ("0" * 64 + "-tools-v1")
    pack.mkdir(parents=True)
    rootfs = pack / "rootfs.img"
    rootfs.write_bytes(b"ext4")
    config = QemuConfig(data_dir=tmp_path / "data", accel=Accel.TCG, warm_starts=True)
    yield TerminalRecipe(config, assets, rootfs), rootfs


def warm(recipe: TerminalRecipe, memory_mb: int = 512, vcpus: int = 2, version: str = "QEMU 7.2") -> Any:
    spec = MachineSpec(rig_id="rig_x", surface=recipe.surface, memory_mb=memory_mb, vcpus=vcpus)
    return plan_sync(recipe, spec, version, {"ino": 1, "size": 1, "mtimeNs": 1})


def plan_key(be: TerminalRecipe, rootfs: Path, memory_mb: int = 512, vcpus: int = 2,
             version: str = "QEMU 7.2") -> str:
    return str(warm(be, memory_mb, vcpus, version).key)


def test_the_backend_key_follows_pack_shape_qemu_and_tools(backend: tuple[TerminalRecipe, Path]) -> None:
    be, rootfs = backend
    key = plan_key(be, rootfs)
    assert plan_key(be, rootfs) == key
    assert plan_key(be, rootfs, memory_mb=1024) != key
    assert plan_key(be, rootfs, vcpus=1) != key
    assert plan_key(be, rootfs, version="QEMU 8.0") != key
    # A rebuilt pack (same name, new file) is a new disk: the old snapshot is not used.
    rootfs.unlink()
    rootfs.write_bytes(b"ext4 again")
    pack_changed = plan_key(be, rootfs)
    assert pack_changed != key
    # A new tools disk (a new agent) has a new content key.
    tools = be.assets.tools
    new_tools = tools.parent.parent / "t2" / "tools.img"
    new_tools.parent.mkdir()
    new_tools.write_bytes(b"tools.img")
    be = dataclasses.replace(be, assets=dataclasses.replace(be.assets, tools=new_tools))
    assert plan_key(be, rootfs) != pack_changed


def test_a_simulated_pack_change_makes_the_old_snapshot_unused_then_pruned(
    backend: tuple[TerminalRecipe, Path],
) -> None:
    be, rootfs = backend
    plan = warm(be)
    assert plan.snapshot is None and plan.store.root == rootfs.parent / "snapshots"
    build(plan.store, plan.key, plan.material)
    again = warm(be)
    assert again.snapshot is not None and again.snapshot.key == plan.key
    os.utime(rootfs, ns=(1, 1))  # the pack changed under the same name
    changed = warm(be)
    assert changed.key != plan.key and changed.snapshot is None
    build(changed.store, changed.key, changed.material)
    assert changed.store.prune(changed.material) == [plan.key]


def test_snapshot_material_names_the_pack_and_the_rootfs(tmp_path: Path) -> None:
    f = tmp_path / "rootfs.img"
    f.write_bytes(b"x")
    ident = file_identity(f.stat())
    assert set(ident) == {"ino", "size", "mtimeNs"} and ident["size"] == 1
    m = material(rootfs=ident)
    assert json.loads(json.dumps(m)) == m  # JSON-able, as stored in snapshot.json


# --- the agent's reseed op ---------------------------------------------------------


@pytest.fixture
def sysroot_agent(tmp_path: Path) -> Iterator[tuple[AgentHarness, Path]]:
    root = tmp_path / "root"
    (root / "etc").mkdir(parents=True)
    (root / "etc" / "machine-id").write_text("")  # images ship it empty
    harness = AgentHarness.stdio("--sysroot", str(root))
    try:
        harness.wait_for(lambda e: isinstance(e, Ready))
        yield harness, root
    finally:
        harness.close()
    assert harness.garbage() == []


@pytest.mark.timeout(20)
def test_reseed_writes_the_machine_id_and_leaves_host_state_alone(
    sysroot_agent: tuple[AgentHarness, Path],
) -> None:
    agent, root = sysroot_agent
    mid = rig_machine_id("rig_1")
    reply = agent.call("reseed", machineId=mid, entropy=os.urandom(64), mac=rig_mac("rig_1"))
    assert reply.ok, reply
    # --stdio never seeds the host's RNG nor touches its NICs.
    assert reply.body == {"entropyCredited": False, "crngReseeded": False,
                          "machineIdFiles": ["/etc/machine-id"], "macSet": []}
    assert (root / "etc" / "machine-id").read_text() == mid + "\n"
    # dbus's copy: rewritten when it is a file of its own, left alone when it is a link.
    dbus = root / "var" / "lib" / "dbus"
    dbus.mkdir(parents=True)
    (dbus / "machine-id").write_text("0" * 32 + "\n")
    mid2 = rig_machine_id("rig_2")
    reply = agent.call("reseed", machineId=mid2)
    assert reply.body["machineIdFiles"] == ["/etc/machine-id", "/var/lib/dbus/machine-id"]
    assert (dbus / "machine-id").read_text() == mid2 + "\n"
    (dbus / "machine-id").unlink()
    (dbus / "machine-id").symlink_to("/etc/machine-id")
    reply = agent.call("reseed", machineId=rig_machine_id("rig_3"))
    assert reply.body["machineIdFiles"] == ["/etc/machine-id"]
    assert (dbus / "machine-id").is_symlink()


@pytest.mark.timeout(20)
@pytest.mark.parametrize(
    ("fields", "error"),
    [
        ({"machineId": "ABC"}, "machineId must be 32 lower-case hex digits"),
        ({"entropy": b"short"}, "entropy must be 16 to 512 bytes"),
        ({"entropy": 5}, "entropy must be a base64 string"),
        ({"mac": "02:00:00:00:00:0G"}, "mac must be six lower-case hex pairs"),
    ],
)
def test_reseed_refuses_bad_fields(
    sysroot_agent: tuple[AgentHarness, Path], fields: dict[str, Any], error: str
) -> None:
    agent, root = sysroot_agent
    reply = agent.call("reseed", **fields)
    assert not reply.ok and reply.error == f"bad request: {error}"
    assert (root / "etc" / "machine-id").read_text() == ""


@pytest.mark.timeout(20)
def test_reseed_without_a_sysroot_writes_nothing(tmp_path: Path) -> None:
    harness = AgentHarness.stdio()
    try:
        harness.wait_for(lambda e: isinstance(e, Ready))
        reply = harness.call("reseed", machineId=rig_machine_id("rig_1"))
        assert reply.ok and reply.body["machineIdFiles"] == []
    finally:
        harness.close()


def test_a_malformed_reseed_reply_fails_the_request() -> None:
    proto = GuestProtocol()
    rid, _ = proto.send_request("reseed", machineId="0" * 32)
    bad = {"id": rid, "ok": True, "entropyCredited": True, "crngReseeded": "yes",
           "machineIdFiles": [], "macSet": []}
    events = proto.receive_data(json.dumps(bad).encode() + b"\n")
    assert isinstance(events[0], Garbage)
    assert isinstance(events[1], Reply) and not events[1].ok
    assert events[1].error is not None and "malformed reseed reply" in events[1].error
    rid, _ = proto.send_request("reseed", machineId="0" * 32)
    good = {"id": rid, "ok": True, "entropyCredited": True, "crngReseeded": True,
            "machineIdFiles": ["/etc/machine-id"], "macSet": []}
    assert proto.receive_data(json.dumps(good).encode() + b"\n") == [
        Reply(rid, True, {k: v for k, v in good.items() if k not in ("id", "ok")}, None)
    ]


# --- when to build -------------------------------------------------------------------


def test_should_build_throttles_failed_builds_and_repeated_restore_failures() -> None:
    assert should_build(100.0, building=False, build_failed_at=None, restore_failures=[])
    assert not should_build(100.0, building=True, build_failed_at=None, restore_failures=[])
    # A failed build waits out the retry interval.
    assert not should_build(100.0, building=False, build_failed_at=90.0, restore_failures=[], retry_s=60)
    assert should_build(200.0, building=False, build_failed_at=90.0, restore_failures=[], retry_s=60)
    # One failed restore (a damaged file?) is rebuilt at once; two in a row are not.
    assert should_build(100.0, building=False, build_failed_at=None, restore_failures=[95.0], retry_s=60)
    assert not should_build(100.0, building=False, build_failed_at=None, restore_failures=[80.0, 95.0],
                            retry_s=60)
    assert should_build(200.0, building=False, build_failed_at=None, restore_failures=[80.0, 95.0],
                        retry_s=60)


def test_plans_are_warm_only_with_a_snapshot_and_a_failed_restore_still_seeds(
    backend: tuple[TerminalRecipe, Path],
) -> None:
    from rigd.backends.recipe import cold_plan, plan_open

    be, rootfs = backend
    none_yet = warm(be)
    plan = plan_open(be, none_yet)
    assert plan.snapshot is None and plan.backing == rootfs and plan.backing_format == "raw"
    assert plan.warm is none_yet  # a cold boot of this shape seeds its snapshot
    build(none_yet.store, none_yet.key, none_yet.material)
    ready = warm(be)
    plan = plan_open(be, ready)
    assert plan.snapshot is not None and plan.backing == ready.snapshot.disk and plan.backing_format == "qcow2"
    after = cold_plan(be, plan.warm)  # the restore failed: boot cold, build the shape again
    assert after.snapshot is None and after.backing == rootfs and after.warm is ready
    assert plan_open(be, None).warm is None  # a shape that may not start warm seeds nothing
