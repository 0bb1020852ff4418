"""The server's WebSockets under floods, over real sockets: a real rigd HTTP
server (app, hypercorn, stores, rig manager) on the fake backend
(tests/integration/fake_server.py), so no VM is needed: what is tested is
the transport, and the fake's computer rig streams stills that change on
every grab.

- The live view: a client floods pings while frames stream; every binary
  message follows its own header, whole, with no pong in between.
- The RPC WebSocket: a client sends 10 000 requests without reading; it gets
  the in-flight limit's error for the requests past it, every request is
  answered once, and the server's RSS stays within a few MB.
"""

from __future__ import annotations

import json
import shutil
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
from websockets.sync.client import connect

from tests.integration.conftest import REPO, Server, make_data_dir

pytestmark = pytest.mark.timeout(180)

LIMIT = 64  # rigd.server.app.MAX_IN_FLIGHT, as a client knows it: from the error
REQUESTS = 10_000


@pytest.fixture
def fake_server() -> Iterator[Server]:
    data_dir = make_data_dir()
    log_path = data_dir / "server.log"
    with open(log_path, "ab") as log:
        proc = subprocess.Popen([sys.executable, "-m", "tests.integration.fake_server", str(data_dir)],
                                stdout=log, stderr=subprocess.STDOUT, cwd=REPO)
    srv: Server | None = None
    try:
        deadline = time.monotonic() + 60
        while srv is None:
            assert proc.poll() is None, f"the fake server exited:\n{log_path.read_text()}"
            assert time.monotonic() < deadline, "the fake server wrote no server.json"
            try:
                url = json.loads((data_dir / "server.json").read_text())["url"]
                srv = Server(data_dir, proc, url, (data_dir / "admin.token").read_text().strip(), log_path)
            except (OSError, ValueError, KeyError):
                time.sleep(0.05)
        yield srv
    finally:
        if proc.poll() is None:
            proc.send_signal(signal.SIGTERM)
            try:
                proc.wait(30)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait(10)
        shutil.rmtree(data_dir, ignore_errors=True)


def ws_url(server: Server, path: str) -> str:
    return server.url.replace("http://", "ws://") + path


def rss_kb(pid: int) -> int:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1])
    raise AssertionError(f"no VmRSS for {pid}")


def test_live_view_frames_stay_whole_under_a_ping_flood(fake_server: Server) -> None:
    rig = fake_server.call("rig.open", {"workspace": "default", "surface": "computer"})
    assert rig["phase"] == "ready", rig
    signed = fake_server.call("rig.viewUrl", {"rigId": rig["id"]})
    with connect(ws_url(fake_server, signed["path"]), max_size=2**22, open_timeout=30) as ws:
        hello = json.loads(ws.recv(timeout=30))
        assert hello["type"] == "hello" and hello["display"] == {"width": 1280, "height": 800}
        stop = threading.Event()
        pings = [0]
        # As fast as the server answers, with up to 32 pings unanswered: a
        # flood of the socket, not of the server's TCP buffer (a backlog of
        # tens of thousands of pings would be answered long after the test).
        unanswered = threading.Semaphore(32)

        def flood() -> None:
            while not stop.is_set():
                if unanswered.acquire(timeout=0.1):
                    ws.send('{"type": "ping"}')
                    pings[0] += 1

        flooder = threading.Thread(target=flood, daemon=True)
        flooder.start()
        try:
            frames, pongs, pongs_between_frames = 0, 0, 0
            header: dict[str, int] | None = None
            seen_pong = False
            while frames < 40:
                msg = ws.recv(timeout=30)
                if isinstance(msg, bytes):
                    assert header is not None, f"a binary message ({len(msg)} bytes) without a frame header"
                    assert len(msg) == header["bytes"]
                    # The fake's still is its grab number, over and over: whole, and this frame's.
                    assert msg == header["seq"].to_bytes(8, "big") * (len(msg) // 8)
                    header = None
                    frames += 1
                    pongs_between_frames += seen_pong
                    seen_pong = False
                    continue
                event = json.loads(msg)
                assert header is None, f"a {event['type']!r} message landed between frame {header} and its bytes"
                if event["type"] == "frame":
                    assert event["seq"] == frames + 1 and event["mediaType"] == "image/jpeg"
                    header = {"seq": event["seq"], "bytes": event["bytes"]}
                else:
                    assert event == {"type": "pong"}, event
                    pongs += 1
                    seen_pong = True
                    unanswered.release()
        finally:
            stop.set()
            flooder.join(30)
    # The flood was on while frames streamed: pongs went out between most frames.
    assert pings[0] >= pongs > frames and pongs_between_frames >= frames // 2, (pings, pongs, pongs_between_frames)
    # The view's close is audited with what it sent, once the server sees the socket end.
    deadline = time.monotonic() + 30
    while not (closes := [a for a in fake_server.call("rig.log", {"rigId": rig["id"]})
                          if a["verb"] == "view_close"]):
        assert time.monotonic() < deadline, "the live view's close was never audited"
        time.sleep(0.05)
    print(f"\nlive view: {frames} frames, {pongs} pongs ({pings[0]} pings), a pong between "
          f"{pongs_between_frames} pairs of frames")
    assert closes[-1]["args"]["frames"] >= 40


def test_rpc_websocket_bounds_requests_a_client_does_not_read(fake_server: Server) -> None:
    pid = fake_server.proc.pid
    request = '{{"jsonrpc": "2.0", "id": {}, "method": "tools.list"}}'
    auth = {"Authorization": f"Bearer {fake_server.token}"}
    with connect(ws_url(fake_server, "/rpc"), additional_headers=auth, max_size=2**22, open_timeout=30) as ws:
        # Warm up (the first replies allocate what every later one reuses), then measure.
        for i in range(-LIMIT, 0):
            ws.send(request.format(i))
        expected = None
        for _ in range(LIMIT):
            reply = json.loads(ws.recv(timeout=30))
            assert "result" in reply, reply
            expected = reply["result"]
        reply_bytes = len(json.dumps(expected))
        before = rss_kb(pid)
        peak = before

        sent = [0]

        def send_all() -> None:
            for i in range(REQUESTS):
                ws.send(request.format(i))
                sent[0] += 1

        sender = threading.Thread(target=send_all, daemon=True)
        sender.start()
        # Read nothing until every request is sent or the server stops taking
        # them (the sender makes no progress for a second).
        last, still_since = -1, time.monotonic()
        while sender.is_alive() and time.monotonic() - still_since < 1.0:
            peak = max(peak, rss_kb(pid))
            if sent[0] != last:
                last, still_since = sent[0], time.monotonic()
            sender.join(0.05)
        stalled_at = sent[0]

        answers: dict[int, dict[str, object]] = {}
        while len(answers) < REQUESTS:
            reply = json.loads(ws.recv(timeout=60))
            assert reply["id"] not in answers, f"request {reply['id']} answered twice"
            answers[reply["id"]] = reply
            if len(answers) % 500 == 0:
                peak = max(peak, rss_kb(pid))
        sender.join(30)
        after = rss_kb(pid)

    refused = [r for r in answers.values() if "error" in r]
    ran = [r for r in answers.values() if "result" in r]
    assert sorted(answers) == list(range(REQUESTS)) and len(refused) + len(ran) == REQUESTS
    assert refused, "no request was refused"
    for r in refused:
        err = r["error"]
        assert isinstance(err, dict) and err["code"] == -32029
        assert f"the limit is {LIMIT}" in err["message"] and err["data"]["limit"] == LIMIT
    assert all(r["result"] == expected for r in ran)
    growth_mb = (peak - before) / 1024
    print(f"\nRPC flood: {REQUESTS} requests ({reply_bytes} B replies), sender stalled at {stalled_at}; "
          f"{len(ran)} ran, {len(refused)} refused; server RSS {before / 1024:.1f} MB before, "
          f"peak +{growth_mb:.1f} MB, after {after / 1024:.1f} MB")
    # Unbounded, the replies alone would hold ~reply_bytes * REQUESTS (tens of MB and more).
    assert growth_mb < 8, f"server RSS grew {growth_mb:.1f} MB under the flood"
