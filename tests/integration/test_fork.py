"""``rig.fork`` on real rigs (issue 29): a terminal rig with a process counting in memory is
forked into three copies; each continues the count, shares the files from before the fork,
not the ones written after it, and has its own machine-id and RNG."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time

import pytest

from tests.integration.conftest import (
    Server,
    exec_,
    make_data_dir,
    open_terminal,
    reap,
    remove_tree,
    serving,
    start_server,
)

pytestmark = [pytest.mark.vm, pytest.mark.timeout(600)]

#: A process whose count lives only in its memory (a shell variable); it publishes "pid count".
COUNTER = ("setsid sh -c 'n=0; while :; do n=$((n+1)); echo \"$$ $n\" > /tmp/count.new && "
           "mv /tmp/count.new /tmp/count; sleep 0.5; done' </dev/null >/dev/null 2>&1 &")


def sh(srv: Server, rig_id: str, command: str) -> str:
    out = exec_(srv, rig_id, command=command)
    assert out["exitCode"] == 0, out
    assert out["stdout"]["untrusted"] is True
    return str(out["stdout"]["text"])


def count(srv: Server, rig_id: str) -> tuple[str, int]:
    pid, n = sh(srv, rig_id, "cat /tmp/count").split()
    return pid, int(n)


def wait_count(srv: Server, rig_id: str, above: int, deadline_s: float = 60) -> tuple[str, int]:
    deadline = time.monotonic() + deadline_s
    while True:
        got = count(srv, rig_id)
        if got[1] > above:
            return got
        assert time.monotonic() < deadline, f"{rig_id}: the counter stayed at {got} (wanted > {above})"
        time.sleep(0.2)


def test_a_terminal_fork_continues_processes_with_its_own_files_and_identity(shared_server: Server) -> None:
    srv = shared_server
    parent = open_terminal(srv)
    pid = parent["id"]
    sh(srv, pid, "echo before > /tmp/before && " + COUNTER)
    counter_pid, at_fork = wait_count(srv, pid, 3)

    t0 = time.monotonic()
    answer = srv.call("rig.fork", {"rigId": pid, "count": 3})
    copies = answer["rigs"]
    print(f"fork x3 → all ready in {time.monotonic() - t0:.1f} s")
    assert len(copies) == 3
    ids = [c["id"] for c in copies]
    for c in copies:
        assert c["phase"] == "ready", c
        assert c["forkedFrom"] == pid and c["surface"] == "terminal"
        assert any("as after fork(2)" in n for n in c["notes"])

    for rid in ids:
        # The process from before the fork runs on in each copy, from the parent's count.
        got_pid, first = count(srv, rid)
        assert got_pid == counter_pid and first >= at_fork
        assert wait_count(srv, rid, first)[0] == counter_pid
        assert sh(srv, rid, "cat /tmp/before") == "before\n"
    assert wait_count(srv, pid, at_fork)[0] == counter_pid  # and in the parent, which resumed

    # A file written after the fork in one copy is in no other copy, nor in the parent.
    sh(srv, ids[0], "echo mine > /tmp/after")
    for rid in [pid, *ids[1:]]:
        assert sh(srv, rid, "test -e /tmp/after && echo there || echo absent") == "absent\n"

    # Each of the four is its own machine: machine-id and the kernel RNG's output differ.
    machine_ids = {sh(srv, r, "cat /etc/machine-id").strip() for r in [pid, *ids]}
    randoms = {sh(srv, r, "head -c 32 /dev/urandom | od -An -tx1 | tr -d ' \\n'") for r in [pid, *ids]}
    assert len(machine_ids) == 4 and len(randoms) == 4, (machine_ids, randoms)

    log = srv.call("rig.log", {"rigId": ids[1]})
    assert log[0]["verb"] == "forkedFrom" and log[0]["args"]["rigId"] == pid
    fork_row = [r for r in srv.call("rig.log", {"rigId": pid}) if r["verb"] == "fork"]
    assert fork_row and fork_row[-1]["args"]["rigs"] == ids
    print(f"parent paused {fork_row[-1]['args']['pausedMs']} ms; "
          f"RAM {fork_row[-1]['args']['ramBytes'] >> 20} MiB")
    # The frozen state is gone once every copy is up.
    forks_dir = srv.data_dir / "rigs" / "forks"
    deadline = time.monotonic() + 10
    while any(forks_dir.iterdir()):
        assert time.monotonic() < deadline, list(forks_dir.iterdir())
        time.sleep(0.1)

    # A fork of a fork, through the CLI: its disk is a copy of the copy's (with /tmp/after).
    env = {**os.environ, "RIGD_URL": srv.url, "RIGD_TOKEN": srv.token}
    out = subprocess.run([sys.executable, "-m", "rigd", "fork", ids[0], "--json"], env=env,
                         capture_output=True, text=True, timeout=300, check=True)
    [grandchild] = json.loads(out.stdout)["rigs"]
    assert grandchild["forkedFrom"] == ids[0] and grandchild["phase"] == "ready", grandchild
    assert sh(srv, grandchild["id"], "cat /tmp/after") == "mine\n"
    assert wait_count(srv, grandchild["id"], at_fork)[0] == counter_pid
    for rid in [pid, *ids, grandchild["id"]]:
        srv.call("rig.close", {"rigId": rid})


def test_a_named_snapshot_and_a_volume_survive_a_killed_server() -> None:
    """snapshot.create keeps RAM and disk under the workspace; volume.create makes an ext4
    disk a terminal rig mounts where asked; a seat's rig has its volume at /workspace. A
    server killed with SIGKILL (the seat's rig writing) and started again lists all three:
    the snapshot resumes twice, each a machine of its own; the seat reopens as a new rig with
    what its volume had synced; a second writer is refused naming the field; a reader cannot
    write. (One server pair and one kill for all: each restart costs the test loop.)"""
    data_dir = make_data_dir()
    first = start_server(data_dir)
    try:
        srv = first
        parent = open_terminal(srv)
        sh(srv, parent["id"], "echo kept > /root/note && " + COUNTER)
        counter_pid, at_snapshot = wait_count(srv, parent["id"], 3)
        kept = srv.call("snapshot.create", {"rigId": parent["id"], "name": "after-setup"})
        assert kept["name"] == "after-setup" and kept["surface"] == "terminal", kept
        assert kept["sourceRig"] == parent["id"] and kept["bytes"] > 0
        err = srv.error("snapshot.create", {"rigId": parent["id"], "name": "../x"})
        assert err["data"]["field"] == "name", err

        # The seat's volume, made beforehand at a size of our own (a first open would make it).
        made = srv.call("volume.create", {"workspace": "default", "name": "seat.ada", "sizeMb": 64})
        assert made["sizeMb"] == 64 and made["attachedTo"] == []
        mount = [{"name": "seat.ada", "path": "/workspace"}]
        writer = open_terminal(srv, seat="ada", conversation="c1")
        assert writer["seat"] == "ada" and writer["volumes"] == [{**mount[0], "readOnly": False}], writer
        assert open_terminal(srv, seat="ada")["id"] == writer["id"]  # (the seat's one rig)
        assert "/workspace ext4 rw" in sh(srv, writer["id"], "cat /proc/mounts")
        sh(srv, writer["id"], "echo first > /workspace/a.txt && sync")
        err = srv.error("rig.open", {"workspace": "default", "surface": "terminal", "volumes": mount})
        assert err["data"]["field"] == "volumes[0].name" and writer["id"] in err["message"], err
        first.proc.send_signal(signal.SIGKILL)  # (the next server kills the QEMUs it left)
        first.proc.wait(timeout=30)

        with serving(data_dir) as srv:
            [listed] = srv.call("snapshot.list", {"workspace": "default"})
            assert listed["name"] == "after-setup" and listed["bytes"] == kept["bytes"]
            rigs = [srv.call("rig.open", {"workspace": "default", "surface": "terminal",
                                          "snapshot": "after-setup"}) for _ in range(2)]
            for rig in rigs:
                assert rig["phase"] == "ready", rig
                assert any("resumed from snapshot 'after-setup'" in n for n in rig["notes"])
                assert sh(srv, rig["id"], "cat /root/note") == "kept\n"
                pid, n = count(srv, rig["id"])
                assert pid == counter_pid and n >= at_snapshot
                assert wait_count(srv, rig["id"], n)[0] == counter_pid
            sh(srv, rigs[0]["id"], "echo one > /root/only-here")
            assert sh(srv, rigs[1]["id"], "test -e /root/only-here && echo there || echo absent") == "absent\n"
            assert len({sh(srv, r["id"], "cat /etc/machine-id") for r in rigs}) == 2
            err = srv.error("snapshot.rm", {"workspace": "default", "name": "missing"})
            assert err["data"]["field"] == "name", err
            srv.call("snapshot.rm", {"workspace": "default", "name": "after-setup"})
            assert srv.call("snapshot.list", {"workspace": "default"}) == []
            err = srv.error("rig.open", {"workspace": "default", "surface": "terminal",
                                         "snapshot": "after-setup"})
            assert err["data"]["field"] == "snapshot", err
            for rig in rigs:
                srv.call("rig.close", {"rigId": rig["id"]})

            [vol] = srv.call("volume.list", {"workspace": "default"})
            assert vol["name"] == "seat.ada" and vol["attachedTo"] == []
            [seat] = srv.call("seat.list", {"workspace": "default"})
            assert seat == {**seat, "name": "ada", "rigId": writer["id"], "state": "closed",
                            "holder": {"conversation": "c1", "since": seat["holder"]["since"]}}, seat
            err = srv.error("rig.open", {"workspace": "default", "surface": "terminal", "seat": "ada",
                                         "conversation": "c2"})
            assert err["data"]["field"] == "seat" and err["data"]["holder"] == "c1", err
            again = open_terminal(srv, seat="ada", conversation="c1")  # (a new rig: it replays the journal)
            assert again["id"] != writer["id"] and again["seat"] == "ada", again
            assert sh(srv, again["id"], "cat /workspace/a.txt") == "first\n"
            sh(srv, again["id"], "echo second >> /workspace/a.txt")
            srv.call("rig.close", {"rigId": again["id"]})  # (unmounted and flushed before QEMU quits)
            reader = open_terminal(srv, volumes=[{**mount[0], "readOnly": True}])
            assert sh(srv, reader["id"], "cat /workspace/a.txt") == "first\nsecond\n"
            out = exec_(srv, reader["id"], command="echo no > /workspace/b.txt")
            assert out["exitCode"] != 0 and "Read-only" in out["stderr"]["text"], out
            err = srv.error("volume.rm", {"workspace": "default", "name": "seat.ada"})
            assert err["data"]["rigs"] == [reader["id"]], err
            srv.call("rig.close", {"rigId": reader["id"]})
            srv.call("seat.rm", {"workspace": "default", "name": "ada"})  # (and its volume)
            assert srv.call("volume.list", {"workspace": "default"}) == []
            assert srv.call("seat.list", {"workspace": "default"}) == []
    finally:
        first.stop()
        reap(data_dir)
        remove_tree(data_dir)
