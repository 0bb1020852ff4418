"""Rigs under pressure with real QEMU and short intervals: park and wake,
idle reaping, watching, control, the memory budget, and the event stream."""

from __future__ import annotations

import json
import threading
import time
from typing import Any

import pytest
from websockets.sync.client import connect

from tests.integration.conftest import Server, exec_, open_terminal

pytestmark = [pytest.mark.vm, pytest.mark.timeout(300)]


@pytest.fixture
def server(shared_server: Server) -> Server:
    """The worker's shared server (tests/integration/conftest.py): none of these tests needs a
    fresh one, and each one's rigs are closed when it ends."""
    return shared_server



def wait_phase(server: Server, rig_id: str, phase: str, within: float) -> dict[str, Any]:
    deadline = time.monotonic() + within
    while True:
        rig = server.call("rig.get", {"rigId": rig_id})
        if rig["phase"] == phase or time.monotonic() > deadline:
            assert rig["phase"] == phase, rig
            return dict(rig)
        time.sleep(0.25)


def agent_token(server: Server, name: str = "bot") -> str:
    user = server.call("user.create", {"name": name, "kind": "agent"})
    server.call("member.add", {"workspace": "default", "user": user["id"]})
    return str(server.call("token.create", {"user": user["id"]})["token"])


def test_idle_parks_exec_wakes_then_twice_idle_closes_and_a_watched_rig_never_parks(server: Server) -> None:
    # Two rigs with the same 10 s idle time, side by side (the waits are the idle timer's own):
    # nobody acts on the first, so it parks and later closes; the second is only watched
    # (rig.watch every 2 s) for as long, and never parks.
    rig = open_terminal(server, idleS=10)
    watched_rig = open_terminal(server, idleS=10)
    watched: list[str] = []
    stop = threading.Event()

    def watch() -> None:
        while not stop.is_set():
            watched.append(server.call("rig.watch", {"rigId": watched_rig["id"]})["phase"])
            stop.wait(2)

    watcher = threading.Thread(target=watch, daemon=True)
    watcher.start()
    watch_started = time.monotonic()
    try:
        exec_(server, rig["id"], command="echo kept > /root/file; (sleep 100000 &) ; true")
        parked = wait_phase(server, rig["id"], "parked", within=20)
        assert "without an action" in parked["phaseDetail"]
        out = exec_(server, rig["id"], command="cat /root/file; pgrep -c -f 'sleep 100000'")
        assert out["stdout"]["text"] == "kept\n1\n"
        woken = server.call("rig.get", {"rigId": rig["id"]})
        assert woken["phase"] == "ready" and woken["phaseDetail"] == "woken by an action"
        started = time.monotonic()
        closed = wait_phase(server, rig["id"], "closed", within=40)
        assert closed["closeReason"] == "idleTimeout"
        assert 15 <= time.monotonic() - started <= 40
        assert not (server.data_dir / "rigs" / "run" / f"{rig['id']}.qcow2").exists()
    finally:
        stop.set()
        watcher.join(timeout=60)
    assert time.monotonic() - watch_started >= 25  # 2.5 idle times with no action, only watching
    assert watched and set(watched) == {"ready"}, watched
    got = server.call("rig.get", {"rigId": watched_rig["id"]})
    assert got["phase"] == "ready" and "someone is watching" in got["pins"]


def test_ten_park_wake_cycles_keep_files_and_processes(server: Server) -> None:
    rig = open_terminal(server)
    exec_(server, rig["id"], command="echo 42 > /root/answer; (sleep 100000 &); true")
    for _ in range(10):
        parked = server.call("rig.park", {"rigId": rig["id"]})
        assert parked["phase"] == "parked"
        out = exec_(server, rig["id"], command="cat /root/answer; pgrep -c -f 'sleep 100000'")
        assert out["stdout"]["text"] == "42\n1\n"
    log = server.call("rig.log", {"rigId": rig["id"]})
    assert sum(1 for a in log if a["verb"] == "park") == 10


def test_person_control_refuses_an_agent_exec_but_not_observation(server: Server) -> None:
    rig = open_terminal(server)
    bot = agent_token(server)
    exec_(server, rig["id"], token=bot, argv=["true"])
    assert server.call("rig.get", {"rigId": rig["id"]})["controller"]["kind"] == "agent"
    taken = server.call("rig.control", {"rigId": rig["id"], "op": "take"})
    assert taken["controller"]["kind"] == "person"
    err = server.error("rig.act", {"rigId": rig["id"], "tool": "terminal_use",
                                   "action": {"action": "exec", "argv": ["true"]}}, token=bot)
    assert "a person is driving" in err["message"]
    # Observations still work for the agent.
    listed = server.call("rig.list", {"workspace": "default"}, token=bot)
    assert next(r for r in listed if r["id"] == rig["id"])["controller"]["kind"] == "person"
    assert server.call("rig.watch", {"rigId": rig["id"]}, token=bot)["phase"] == "ready"
    tool = server.call("tools.call", {"workspace": "default", "conversation": "c", "name": "rig_list",
                                      "arguments": {}}, token=bot)
    assert tool["isError"] is False
    # The person's own exec runs; after hand-back the agent's does too.
    assert exec_(server, rig["id"], argv=["true"])["exitCode"] == 0
    server.call("rig.control", {"rigId": rig["id"], "op": "release"})
    assert exec_(server, rig["id"], token=bot, argv=["true"])["exitCode"] == 0


def test_tiny_memory_budget_evicts_lru_and_refuses_when_pinned(fresh_server: Server) -> None:
    # Its own server: it changes the server-wide budget, and eviction would pick other tests' rigs.
    server = fresh_server
    a = open_terminal(server)
    b = open_terminal(server)
    exec_(server, b["id"], argv=["true"])  # b is now more recently used than a
    used = sum(server.call("rig.get", {"rigId": r["id"]})["residentMb"] for r in (a, b))
    # 64 MB short of room for c: a guest's RSS drifts by a few MB between this reading and
    # the admission (1 MB short once let c in without evicting); evicting a frees far more.
    server.call("server.configure", {"memoryBudgetMb": used + 512 - 64})
    c = open_terminal(server)
    evicted = server.call("rig.get", {"rigId": a["id"]})
    assert evicted["phase"] == "closed" and evicted["closeReason"] == "idleTimeout"
    assert server.call("rig.get", {"rigId": b["id"]})["phase"] == "ready"
    for rig in (b, c):
        server.call("rig.watch", {"rigId": rig["id"]})
    used = sum(server.call("rig.get", {"rigId": r["id"]})["residentMb"] for r in (b, c))
    server.call("server.configure", {"memoryBudgetMb": used + 256})
    err = server.error("rig.open", {"workspace": "default", "surface": "terminal"})
    assert err["data"]["field"] == "memoryMb" and "memory budget" in err["message"]
    assert "someone is watching" in err["message"]
    events = server.call("rig.events", {"workspace": "default"})
    reaped = [e for e in events if e["type"] == "RigReaped"]
    assert [e["rigId"] for e in reaped] == [a["id"]]


def test_events_arrive_in_order_on_a_websocket(server: Server) -> None:
    url = server.url.replace("http://", "ws://") + "/rpc"
    with connect(url, additional_headers={"Authorization": f"Bearer {server.token}"}) as ws:
        ws.send(json.dumps({"jsonrpc": "2.0", "id": 1, "method": "events.subscribe",
                            "params": {"workspace": "default"}}))
        assert json.loads(ws.recv(timeout=30))["result"]["subscribed"] is True
        rig = open_terminal(server)
        server.call("rig.control", {"rigId": rig["id"], "op": "take"})
        server.call("rig.park", {"rigId": rig["id"]})
        server.call("rig.close", {"rigId": rig["id"]})
        seen: list[dict[str, Any]] = []
        while not seen or seen[-1]["type"] != "RigClosedEvent":
            msg = json.loads(ws.recv(timeout=60))
            assert msg["method"] == "rig.event"
            seen.append(msg["params"])
    kinds = [(e["type"], e.get("phase")) for e in seen]
    assert kinds == [
        ("RigPhaseChanged", "ready"), ("RigControlChanged", None), ("RigPhaseChanged", "parked"),
        ("RigPhaseChanged", "closing"), ("RigPhaseChanged", "closed"), ("RigClosedEvent", None),
    ]
    assert [e["id"] for e in seen] == sorted(e["id"] for e in seen)
    assert seen[-1]["reason"] == "requested"
    assert server.call("rig.events", {"workspace": "default"})[-len(seen):] == seen


def test_conversation_end_closes_its_rigs(server: Server) -> None:
    rig = open_terminal(server, conversation="talk-1")
    other = open_terminal(server, conversation="talk-2")
    ended = server.call("conversation.end", {"workspace": "default", "conversation": "talk-1"})
    assert ended["closed"] == [rig["id"]]
    assert server.call("rig.get", {"rigId": rig["id"]})["closeReason"] == "conversationEnded"
    assert server.call("rig.get", {"rigId": other["id"]})["phase"] == "ready"
    ws = server.call("workspace.create", {"name": "temp"})
    mine = server.call("rig.open", {"workspace": "temp", "surface": "terminal"})
    gone = server.call("workspace.delete", {"workspace": "temp"})
    assert gone["closedRigs"] == [mine["id"]] and gone["workspace"] == ws["id"]
    err = server.error("rig.get", {"rigId": mine["id"]})
    assert err["data"]["field"] == "rigId"  # no members left: invisible like a missing rig
