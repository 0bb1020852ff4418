"""After `kill -9` of the server, the next start settles the rigs it left:
survivors are stopped (identified by pid and start time) and closed with
serverShutdown; nothing is left behind and the audit sequence keeps growing."""

from __future__ import annotations

import os
import signal
import time
from pathlib import Path

import pytest

from tests.integration.conftest import (
    exec_,
    make_data_dir,
    open_terminal,
    qemu_pids_for,
    reap,
    remove_tree,
    start_server,
)

pytestmark = [pytest.mark.vm, pytest.mark.timeout(300)]


def test_restart_after_kill9_closes_survivors(tmp_path: Path) -> None:
    data_dir = make_data_dir()
    first = start_server(data_dir)
    second = None
    try:
        rig = open_terminal(first)
        exec_(first, rig["id"], argv=["true"])
        first.proc.send_signal(signal.SIGKILL)
        first.proc.wait(30)
        assert rig["pid"] in qemu_pids_for(str(data_dir))  # QEMU outlived its server

        second = start_server(data_dir)
        deadline = time.monotonic() + 30
        while qemu_pids_for(str(data_dir)) and time.monotonic() < deadline:
            time.sleep(0.1)
        assert qemu_pids_for(str(data_dir)) == []
        got = second.call("rig.get", {"rigId": rig["id"]})
        assert got["phase"] == "closed" and got["closeReason"] == "serverShutdown"
        assert not (data_dir / "rigs" / "smolvm" / rig["id"]).exists()
        assert not (data_dir / "rigs" / "run" / f"{rig['id']}.qcow2").exists()
        log = second.call("rig.log", {"rigId": rig["id"]})
        assert [(a["seq"], a["verb"], a["outcome"]) for a in log] == [(1, "open", "ok"), (2, "exec", "ok")]

        # New rigs work, and a new rig's own sequence starts fresh while the
        # old rig's stays intact.
        fresh = open_terminal(second)
        assert fresh["id"] != rig["id"]
        assert os.path.exists(f"/proc/{fresh['pid']}")
    finally:
        for srv in (first, second):
            if srv is not None:
                srv.stop()
        leaked = reap(data_dir)
        remove_tree(data_dir)
        assert not leaked


def test_sigterm_closes_every_rig_and_leaves_no_qemu() -> None:
    data_dir = make_data_dir()
    srv = start_server(data_dir)
    restarted = None
    try:
        rigs = [open_terminal(srv) for _ in range(2)]
        assert {r["pid"] for r in rigs} <= set(qemu_pids_for(str(data_dir)))
        assert srv.stop(signal.SIGTERM) == 0
        assert qemu_pids_for(str(data_dir)) == []
        restarted = start_server(data_dir)
        for rig in rigs:
            got = restarted.call("rig.get", {"rigId": rig["id"]})
            assert got["phase"] == "closed" and got["closeReason"] == "serverShutdown"
        events = restarted.call("rig.events", {"workspace": "default"})
        assert sorted(e["rigId"] for e in events if e["type"] == "RigClosedEvent") == sorted(
            r["id"] for r in rigs)
    finally:
        for s in (srv, restarted):
            if s is not None:
                s.stop()
        leaked = reap(data_dir)
        remove_tree(data_dir)
        assert not leaked
