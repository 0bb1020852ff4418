"""Warm starts end to end: a real server restores rigs from its pack's memory snapshot.

Each test gets a data directory with a **private** pack directory (the shared
test pack's ``rootfs.img`` hard-linked into it, so no image is unpacked), so
its snapshots start from nothing and never disturb other tests' snapshots.
The first rig boots cold and makes the server build a snapshot in the
background; later rigs are restored from it.
"""

from __future__ import annotations

import contextlib
import os
import re
import shutil
import signal
import subprocess
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from rigd.backends.snapshot import META_FILE, rig_machine_id
from rigd.images import find_assets
from rigd.images.pack import ensure_pack
from tests.integration.conftest import (
    Server,
    exec_,
    make_data_dir,
    open_terminal,
    qemu_pids_for,
    reap,
    remove_tree,
    serving,
    start_server,
)

pytestmark = [pytest.mark.vm, pytest.mark.timeout(600)]

SNAPSHOT_WAIT_S = 240


def text(stream: dict[str, object]) -> str:
    assert stream["untrusted"] is True
    return str(stream["text"])


def private_pack_data_dir() -> tuple[Path, Path]:
    """A data directory whose pack is its own (a hard link of the shared test pack)."""
    d = make_data_dir()
    try:
        shared = ensure_pack(find_assets(), d).resolve()  # builds the shared pack if missing
        packs = d / "rigs" / "smolvm-packs"
        packs.unlink()
        packs.mkdir(mode=0o711)
        pack = packs / shared.parent.name
        pack.mkdir(mode=0o711)
        os.link(shared, pack / "rootfs.img")
        shutil.copy2(shared.parent / "pack.json", pack / "pack.json")
    except BaseException:
        remove_tree(d)
        raise
    return d, pack / "rootfs.img"


@pytest.fixture
def warm() -> Iterator[tuple[Server, Path]]:
    data_dir, rootfs = private_pack_data_dir()
    env_before = os.environ.pop("RIGD_WARM_STARTS", None)
    try:
        with serving(data_dir) as srv:
            yield srv, rootfs
    finally:
        if env_before is not None:
            os.environ["RIGD_WARM_STARTS"] = env_before


def snapshots(rootfs: Path) -> list[str]:
    root = rootfs.parent / "snapshots"
    if not root.is_dir():
        return []
    return sorted(p.name for p in root.iterdir() if not p.name.startswith(".") and (p / META_FILE).exists())


def wait_snapshot(rootfs: Path, other_than: frozenset[str] | set[str] = frozenset()) -> str:
    deadline = time.monotonic() + SNAPSHOT_WAIT_S
    while time.monotonic() < deadline:
        fresh = [k for k in snapshots(rootfs) if k not in other_than]
        if fresh:
            return fresh[0]
        time.sleep(0.2)
    raise AssertionError(f"no snapshot was built within {SNAPSHOT_WAIT_S} s")


def open_and_exec(srv: Server) -> tuple[dict[str, Any], float]:
    """rig.open (blocking) → the first exec answered; seconds as the caller sees them."""
    t0 = time.monotonic()
    rig = open_terminal(srv)
    out = exec_(srv, rig["id"], argv=["echo", "first"])
    took = time.monotonic() - t0
    assert out["exitCode"] == 0 and text(out["stdout"]) == "first\n"
    return rig, took


def boot_of(srv: Server, rig: dict[str, Any]) -> str:
    """How the rig came up: the Rig's ``boot`` field once shown, else the server log."""
    if "boot" in rig:
        return str(rig["boot"])
    log = srv.log()
    if re.search(rf"rigd\.rig\.{re.escape(rig['id'])} restored\b", log):
        return "warm"
    return "cold"


def sh(srv: Server, rig_id: str, command: str) -> str:
    out = exec_(srv, rig_id, command=command)
    assert out["exitCode"] == 0, out
    return text(out["stdout"])


def test_later_rigs_are_restored_unique_and_isolated(warm: tuple[Server, Path]) -> None:
    srv, rootfs = warm
    assert snapshots(rootfs) == []
    cold, cold_s = open_and_exec(srv)
    assert boot_of(srv, cold) == "cold"
    key = wait_snapshot(rootfs)

    a, warm_a_s = open_and_exec(srv)
    b, warm_b_s = open_and_exec(srv)
    print(f"open → first exec: cold {cold_s:.2f} s, warm {warm_a_s:.2f} s / {warm_b_s:.2f} s "
          f"(snapshot {key})")
    assert boot_of(srv, a) == "warm" and boot_of(srv, b) == "warm"
    assert max(warm_a_s, warm_b_s) < cold_s
    assert f"rigd.rig.{a['id']} warm start" in srv.log()

    # phaseDetail while it comes up (polled, so a step may be missed; never "booting kernel").
    opening = srv.call("rig.open", {"workspace": "default", "surface": "terminal", "wait": False})
    seen = [opening["phaseDetail"]]
    while opening["phase"] == "provisioning":
        opening = srv.call("rig.get", {"rigId": opening["id"]})
        if opening["phaseDetail"] != seen[-1]:
            seen.append(opening["phaseDetail"])
    print(f"phaseDetail of a warm start: {seen}")
    assert opening["phase"] == "ready" and "booting kernel" not in seen
    assert set(seen) <= {"queued", "opening the egress gateway", "checking image",
                         "creating disk overlay", "restoring snapshot", "waiting for the guest agent",
                         "ready"}
    srv.call("rig.close", {"rigId": opening["id"]})

    # The clock was stale in the snapshot; hello set it.
    for rig in (a, b):
        before = time.time()
        guest = float(sh(srv, rig["id"], "date +%s.%N"))
        after = time.time()
        assert before - 3 < guest < after + 3, (before, guest, after)

    # Each clone is its own machine.
    ids = {r["id"]: sh(srv, r["id"], "cat /etc/machine-id").strip() for r in (cold, a, b)}
    for rig_id, mid in ids.items():
        assert mid == rig_machine_id(rig_id)
    boot_ids = {r["id"]: sh(srv, r["id"], "cat /proc/sys/kernel/random/boot_id").strip() for r in (a, b)}
    print(f"boot_id: {boot_ids}")
    assert boot_ids[a["id"]] != boot_ids[b["id"]]
    rand = {r["id"]: sh(srv, r["id"], "head -c 32 /dev/urandom | od -An -tx1 | tr -d ' \\n'") for r in (a, b)}
    assert rand[a["id"]] != rand[b["id"]]

    # Their disks are their own, and the snapshot's disk is untouched.
    sh(srv, a["id"], "echo only-in-a > /root/a.txt && sync")
    assert sh(srv, a["id"], "cat /root/a.txt") == "only-in-a\n"
    assert sh(srv, b["id"], "test -e /root/a.txt && echo present || echo absent") == "absent\n"

    # Closing a warm rig removes its runtime directory and overlay; the snapshot stays.
    runtime = srv.data_dir / "rigs" / "smolvm" / a["id"]
    overlay = srv.data_dir / "rigs" / "run" / f"{a['id']}.qcow2"
    assert runtime.exists() and overlay.exists()
    backing = subprocess.run(["qemu-img", "info", "-U", "--output=json", str(overlay)],
                             capture_output=True, text=True, check=True).stdout
    assert f"snapshots/{key}/disk.qcow2" in backing
    srv.call("rig.close", {"rigId": a["id"]})
    assert not runtime.exists() and not overlay.exists()
    assert snapshots(rootfs) == [key]
    assert sh(srv, b["id"], "echo still") == "still\n"


def test_a_changed_pack_invalidates_the_snapshot(warm: tuple[Server, Path]) -> None:
    srv, rootfs = warm
    first, _ = open_and_exec(srv)
    assert boot_of(srv, first) == "cold"
    old = wait_snapshot(rootfs)
    srv.call("rig.close", {"rigId": first["id"]})

    # The pack changes under the same name: same bytes here, but a new file
    # (new inode and mtime), as a rebuilt pack would be.
    tmp = rootfs.with_name("rootfs.img.new")
    subprocess.run(["cp", "--sparse=always", str(rootfs), str(tmp)], check=True)
    os.chmod(tmp, 0o444)
    os.replace(tmp, rootfs)

    after, _ = open_and_exec(srv)
    assert boot_of(srv, after) == "cold"  # the old snapshot is not used for the new pack
    new = wait_snapshot(rootfs, other_than={old})
    assert new != old
    deadline = time.monotonic() + 30
    while old in snapshots(rootfs) and time.monotonic() < deadline:
        time.sleep(0.1)
    assert snapshots(rootfs) == [new]  # the stale one was pruned
    again, _ = open_and_exec(srv)
    assert boot_of(srv, again) == "warm"


def test_a_snapshot_that_fails_to_restore_falls_back_to_a_cold_boot(warm: tuple[Server, Path]) -> None:
    srv, rootfs = warm
    first, _ = open_and_exec(srv)
    key = wait_snapshot(rootfs)
    memory = rootfs.parent / "snapshots" / key / "memory.zst"
    size = memory.stat().st_size
    os.chmod(memory, 0o600)
    memory.write_bytes(b"\0" * size)  # same size, garbage: only the restore can tell

    rig, _ = open_and_exec(srv)  # still opens, cold
    assert boot_of(srv, rig) == "cold"
    log = srv.log()
    assert re.search(rf"rigd\.rig\.{re.escape(rig['id'])} warm start failed; booting cold", log), log[-3000:]
    rebuilt = wait_snapshot(rootfs)  # discarded, then built again in the background
    assert rebuilt == key and (rootfs.parent / "snapshots" / key / "memory.zst").read_bytes()[:4] != b"\0" * 4
    again, _ = open_and_exec(srv)
    assert boot_of(srv, again) == "warm"
    assert sh(srv, first["id"], "echo ok") == "ok\n"


def test_a_snapshot_build_left_by_a_killed_server_is_killed_at_restart() -> None:
    data_dir, rootfs = private_pack_data_dir()
    first = start_server(data_dir)
    second = None
    try:
        rig = open_terminal(first)
        # Catch a snapshot build running: the server starts one at start and a cold
        # open starts one; either may already be done (a build takes ~3 s), so a
        # finished snapshot is discarded and a cold open starts the next build.
        deadline = time.monotonic() + 90
        builders: list[int] = []
        while not builders:
            assert time.monotonic() < deadline, "no snapshot build started"
            builders = qemu_pids_for(str(data_dir / "rigs" / "smolvm" / "snap_"))
            if builders:
                # Freeze the build so it cannot finish between here and the server's kill
                # (a build takes ~3 s); one that ended before it was frozen does not count.
                for pid in builders:
                    with contextlib.suppress(ProcessLookupError):
                        os.kill(pid, signal.SIGSTOP)
                builders = [pid for pid in builders if pid in qemu_pids_for(str(data_dir))]
            if not builders and snapshots(rootfs):
                shutil.rmtree(rootfs.parent / "snapshots" / snapshots(rootfs)[0], ignore_errors=True)
                extra = open_terminal(first)  # cold now: schedules a build
                assert first.call("rig.get", {"rigId": extra["id"]})["boot"] == "cold"
            time.sleep(0.02)
        first.proc.send_signal(signal.SIGKILL)
        first.proc.wait(30)
        assert set(builders) <= set(qemu_pids_for(str(data_dir)))  # it outlived its server

        second = start_server(data_dir)
        deadline = time.monotonic() + 30
        while set(builders) & set(qemu_pids_for(str(data_dir))) and time.monotonic() < deadline:
            time.sleep(0.1)
        # The orphan is gone; the new server may already be building afresh
        # (it snapshots the default shape at start), which is the retry.
        assert not set(builders) & set(qemu_pids_for(str(data_dir)))
        assert second.call("rig.get", {"rigId": rig["id"]})["phase"] == "closed"
        again = open_terminal(second)
        wait_snapshot(rootfs)
        assert not [p.name for p in (rootfs.parent / "snapshots").iterdir() if p.name.startswith(".tmp-")]
        second.call("rig.close", {"rigId": again["id"]})
    finally:
        for srv in (first, second):
            if srv is not None:
                srv.stop()
        leaked = reap(data_dir)
        remove_tree(data_dir)
        assert not leaked
