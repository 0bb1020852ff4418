"""Ports and dev domains on real terminal rigs (RIGS.md §8): servers started by
``exec`` inside the guest are found by the multiplexer, forwarded to the
host's loopback, reached by curl and a WebSocket client, and routed by dev
domain over HTTP and HTTPS with the server's own CA."""

from __future__ import annotations

import os
import socket
import stat
import subprocess
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from websockets.sync.client import connect as ws_connect

from tests.integration.conftest import REPO, Server, exec_, make_data_dir, open_terminal, serving

pytestmark = [pytest.mark.vm, pytest.mark.timeout(900)]

#: A WebSocket echo server with the guest's own python3 and its standard library only.
WS_ECHO = r'''
import base64, hashlib, socket, struct, threading
GUID = b"258EAFA5-E914-47DA-95CA-C5AB0DC85B11"
def serve(c):
    head = b""
    while b"\r\n\r\n" not in head:
        d = c.recv(4096)
        if not d: return
        head += d
    key = [l.split(b":", 1)[1].strip() for l in head.split(b"\r\n") if l.lower().startswith(b"sec-websocket-key:")][0]
    acc = base64.b64encode(hashlib.sha1(key + GUID).digest())
    c.sendall(b"HTTP/1.1 101 Switching Protocols\r\nUpgrade: websocket\r\nConnection: Upgrade\r\n"
              b"Sec-WebSocket-Accept: " + acc + b"\r\n\r\n")
    f = c.makefile("rb")
    while True:
        b0, b1 = f.read(2)
        n = b1 & 127
        if n == 126: n = struct.unpack(">H", f.read(2))[0]
        elif n == 127: n = struct.unpack(">Q", f.read(8))[0]
        mask = f.read(4)
        data = bytes(x ^ mask[i % 4] for i, x in enumerate(f.read(n)))
        op = b0 & 15
        if op == 8:
            c.sendall(b"\x88\x00"); return
        reply = b"echo:" + data
        hdr = bytes([0x80 | op]) + (bytes([len(reply)]) if len(reply) < 126 else b"\x7e" + struct.pack(">H", len(reply)))
        c.sendall(hdr + reply)
s = socket.socket(); s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
s.bind(("127.0.0.1", 8765)); s.listen(16)
while True:
    c, _ = s.accept()
    threading.Thread(target=serve, args=(c,), daemon=True).start()
'''

#: Fifteen more listeners (9001-9015): with 8000 and 8765 that makes 17.
MANY = r'''
import socket, time
socks = []
for p in range(9001, 9016):
    s = socket.socket(); s.bind(("127.0.0.1", p)); s.listen(1); socks.append(s)
open("/tmp/many.ready", "w").close()
time.sleep(3600)
'''


def sh(srv: Server, rig: str, command: str, timeout: int = 120) -> str:
    out = exec_(srv, rig, command=command, timeoutS=timeout)
    assert out["exitCode"] == 0, out
    return str(out["stdout"]["text"])


def wait_ports(srv: Server, rig: str, want: set[int], *, gone: bool = False,
               deadline_s: float = 30.0) -> tuple[dict[str, Any], float]:
    """rig.ports once every port in ``want`` is forwarded (or, with ``gone``, none is)."""
    t0 = time.monotonic()
    while True:
        answer = srv.call("rig.ports", {"rigId": rig})
        have = {p["guestPort"] for p in answer["ports"]}
        if (not gone and want <= have) or (gone and not want & have):
            return answer, time.monotonic() - t0
        assert time.monotonic() - t0 < deadline_s, f"ports {want} (gone={gone}) after {deadline_s} s: {answer}"
        time.sleep(0.25)


def curl(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(["curl", "-sS", "--max-time", "30", *args], capture_output=True, text=True,
                          timeout=60, check=False)


def refused(port: int) -> bool:
    try:
        socket.create_connection(("127.0.0.1", port), timeout=5).close()
    except ConnectionRefusedError:
        return True
    return False


@pytest.fixture(scope="module")
def ported() -> Iterator[tuple[Server, str, dict[str, Any], float]]:
    with serving(make_data_dir(), "--allow-lan-ports") as srv:
        rig = open_terminal(srv)["id"]
        sh(srv, rig, "mkdir -p /srv/www && echo 'hello from rig A' > /srv/www/index.html")
        exec_(srv, rig, command="cat > /tmp/ws.py", stdin=WS_ECHO, timeoutS=60)
        sh(srv, rig, "cd /srv/www && (setsid python3 -m http.server 8000 --bind 127.0.0.1 "
                     ">/tmp/http.log 2>&1 &) && (setsid python3 /tmp/ws.py >/tmp/ws.log 2>&1 &)")
        answer, took = wait_ports(srv, rig, {8000, 8765})
        yield srv, rig, answer, took


def test_servers_in_the_guest_are_forwarded_and_answer_on_the_host(
        ported: tuple[Server, str, dict[str, Any], float]) -> None:
    srv, rig, answer, took = ported
    print(f"\nboth ports forwarded {took:.1f} s after the servers started")
    assert took < 15, f"discovery took {took:.1f} s (it polls every ~4 s)"
    http = next(p for p in answer["ports"] if p["guestPort"] == 8000)
    assert http["url"] == f"http://127.0.0.1:{http['hostPort']}/" and http["shared"] is False
    res = curl(http["url"])
    assert res.returncode == 0 and res.stdout == "hello from rig A\n", res
    ws = next(p for p in answer["ports"] if p["guestPort"] == 8765)
    with ws_connect(f"ws://127.0.0.1:{ws['hostPort']}/", open_timeout=30) as conn:
        conn.send("héllo 世界")
        assert conn.recv(timeout=30) == "echo:héllo 世界"
    # The Rig says the same.
    got = srv.call("rig.get", {"rigId": rig})
    assert {p["guestPort"] for p in got["ports"]} >= {8000, 8765}
    info = srv.call("server.info")
    assert isinstance(info["devHttpPort"], int) and isinstance(info["devHttpsPort"], int)


def test_a_17th_port_is_listed_as_not_forwarded_and_a_closed_port_is_unforwarded(
        ported: tuple[Server, str, dict[str, Any], float]) -> None:
    srv, rig, _answer, _took = ported
    exec_(srv, rig, command="cat > /tmp/many.py", stdin=MANY, timeoutS=60)
    sh(srv, rig, "rm -f /tmp/many.ready; (setsid python3 /tmp/many.py >/tmp/many.log 2>&1 &); "
                 "for i in $(seq 100); do [ -e /tmp/many.ready ] && exit 0; sleep 0.2; done; exit 1")
    answer, _ = wait_ports(srv, rig, set(range(9001, 9015)))
    assert len(answer["ports"]) == 16
    assert [p["guestPort"] for p in answer["notForwarded"]] == [9015]
    assert answer["listening"] == 17
    host_port = next(p["hostPort"] for p in answer["ports"] if p["guestPort"] == 9001)
    sh(srv, rig, "pkill -f /tmp/many.py")
    answer, took = wait_ports(srv, rig, set(range(9001, 9016)), gone=True)
    print(f"\nunforwarded {took:.1f} s after the listeners closed")
    assert answer["notForwarded"] == [] and refused(host_port)


#: A guest that opens thousands of listening ports.
FLOOD = r'''
import resource, socket, time
resource.setrlimit(resource.RLIMIT_NOFILE, (8192, 8192))
socks = []
for p in range(20000, 23000):
    s = socket.socket(); s.bind(("127.0.0.1", p)); s.listen(1); socks.append(s)
open("/tmp/flood.ready", "w").close()
time.sleep(3600)
'''


def test_a_guest_with_thousands_of_ports_gets_sixteen_forwards(
        ported: tuple[Server, str, dict[str, Any], float]) -> None:
    srv, rig, _answer, _took = ported
    exec_(srv, rig, command="cat > /tmp/flood.py", stdin=FLOOD, timeoutS=60)
    sh(srv, rig, "rm -f /tmp/flood.ready; (setsid python3 /tmp/flood.py >/tmp/flood.log 2>&1 &); "
                 "for i in $(seq 300); do [ -e /tmp/flood.ready ] && exit 0; sleep 0.2; done; "
                 "cat /tmp/flood.log; exit 1", timeout=120)
    deadline = time.monotonic() + 30
    while (answer := srv.call("rig.ports", {"rigId": rig}))["listening"] < 3000:
        assert time.monotonic() < deadline, answer
        time.sleep(0.5)
    assert len(answer["ports"]) == 16 and {8000, 8765} <= {p["guestPort"] for p in answer["ports"]}
    assert len(answer["notForwarded"]) == 64 and answer["listening"] == 3002
    assert "not forwarded" in srv.log()
    sh(srv, rig, "pkill -f /tmp/flood.py")
    wait_ports(srv, rig, set(range(20000, 23000)), gone=True)
    res = curl(next(p["url"] for p in answer["ports"] if p["guestPort"] == 8000))
    assert res.stdout == "hello from rig A\n", res


def test_rig_ports_refuses_bad_input_naming_the_field(
        ported: tuple[Server, str, dict[str, Any], float]) -> None:
    srv, rig, _answer, _took = ported
    for params, field in (
        ({"rigId": rig, "name": "App.test", "guestPort": 8000}, "name"),
        ({"rigId": rig, "name": "app.example", "guestPort": 8000}, "name"),
        ({"rigId": rig, "name": "a" * 64 + ".test", "guestPort": 8000}, "name"),
        ({"rigId": rig, "name": "a..test", "guestPort": 8000}, "name"),
        ({"rigId": rig, "name": "", "guestPort": 8000}, "name"),
        ({"rigId": rig, "name": "x.test", "guestPort": 70000}, "guestPort"),
        ({"rigId": rig, "name": "x.test", "guestPort": 0}, "guestPort"),
        ({"rigId": rig, "name": "x.test", "guestPort": 4444}, "guestPort"),
        ({"rigId": rig, "name": "x.test"}, "guestPort"),
    ):
        err = srv.error("rig.domain.set", params)
        assert err["data"]["field"] == field, (params, err)
    err = srv.error("rig.domain.set", {"rigId": rig, "name": "x.test", "guestPort": 4444})
    assert "does not listen on port 4444" in err["message"]
    err = srv.error("rig.port.share", {"rigId": rig, "guestPort": 4444, "lan": True})
    assert err["data"]["field"] == "guestPort"
    err = srv.error("rig.port.share", {"rigId": rig, "guestPort": 8000})
    assert err["data"]["field"] == "lan"


def test_a_port_shared_on_the_local_network_answers_there_until_unshared(
        ported: tuple[Server, str, dict[str, Any], float]) -> None:
    srv, rig, _answer, _took = ported
    shared = srv.call("rig.port.share", {"rigId": rig, "guestPort": 8000, "lan": True})
    assert shared["shared"] is True and isinstance(shared["lanPort"], int)
    assert shared["lanPort"] != shared["hostPort"]
    res = curl(f"http://127.0.0.1:{shared['lanPort']}/")
    assert res.returncode == 0 and res.stdout == "hello from rig A\n", res
    log = srv.call("rig.log", {"rigId": rig})
    assert any(r["verb"] == "port.share" and r["args"] == {"guestPort": 8000, "lan": True} for r in log)
    back = srv.call("rig.port.share", {"rigId": rig, "guestPort": 8000, "lan": False})
    assert back["shared"] is False and back["lanPort"] is None
    deadline = time.monotonic() + 10
    while not refused(shared["lanPort"]):
        assert time.monotonic() < deadline, "the LAN listener outlived its unshare"
        time.sleep(0.1)


def test_dev_domains_route_http_and_https_by_host_and_stay_with_their_rig(
        ported: tuple[Server, str, dict[str, Any], float], tmp_path: Path) -> None:
    srv, rig, _answer, _took = ported
    info = srv.call("server.info")
    http_port, https_port = info["devHttpPort"], info["devHttpsPort"]
    mapped = srv.call("rig.domain.set", {"rigId": rig, "name": "app.test", "guestPort": 8000})
    assert mapped["url"] == f"http://app.test:{http_port}/"
    assert mapped["httpsUrl"] == f"https://app.test:{https_port}/"
    srv.call("rig.domain.set", {"rigId": rig, "name": "ws.localhost", "guestPort": 8765})
    err = srv.error("rig.domain.set", {"rigId": rig, "name": "app.test", "guestPort": 8765})
    assert err["data"]["field"] == "name" and "mapped already" in err["message"]

    # The CA, as a person would fetch it.
    ca = subprocess.run([str(REPO / ".venv" / "bin" / "rigd"), "ca", "--data-dir", str(srv.data_dir)],
                        capture_output=True, text=True, timeout=60, check=True)
    assert ca.stdout.startswith("-----BEGIN CERTIFICATE-----") and "PRIVATE" not in ca.stdout
    ca_file = tmp_path / "ca.pem"
    ca_file.write_text(ca.stdout)
    tls = srv.data_dir / "rigs" / "tls"
    assert stat.S_IMODE(os.stat(tls / "ca.key").st_mode) == 0o600
    assert stat.S_IMODE(os.stat(tls / "leaf.key").st_mode) == 0o600

    res = curl("--resolve", f"app.test:{https_port}:127.0.0.1", f"https://app.test:{https_port}/",
               "--cacert", str(ca_file))
    assert res.returncode == 0 and res.stdout == "hello from rig A\n", res
    res = curl("--resolve", f"app.test:{http_port}:127.0.0.1", f"http://app.test:{http_port}/")
    assert res.returncode == 0 and res.stdout == "hello from rig A\n", res
    res = curl("-o", "/dev/null", "-w", "%{http_code}", "--resolve", f"nope.test:{http_port}:127.0.0.1",
               f"http://nope.test:{http_port}/")
    assert res.stdout == "404", res
    # A WebSocket passes through a dev domain.
    sock = socket.create_connection(("127.0.0.1", http_port), timeout=30)
    with ws_connect(f"ws://ws.localhost:{http_port}/", sock=sock, open_timeout=30) as conn:
        conn.send("through the domain")
        assert conn.recv(timeout=30) == "echo:through the domain"

    # The CA key never reaches the guest: not in any file the guest can read where files live.
    key_line = (tls / "ca.key").read_text().splitlines()[1]
    found = exec_(srv, rig, command=f"grep -rlF '{key_line}' /root /tmp /etc /srv /home /var /.rigd "
                                    "2>/dev/null; true", timeoutS=300)
    assert found["stdout"]["text"] == "", found

    # A second rig: its own port 8000, its own name; neither is reachable through the other's.
    other = open_terminal(srv)["id"]
    try:
        sh(srv, other, "mkdir -p /srv/www && echo 'hello from rig B' > /srv/www/index.html && cd /srv/www "
                       "&& (setsid python3 -m http.server 8000 --bind 127.0.0.1 >/tmp/http.log 2>&1 &)")
        other_ports, _ = wait_ports(srv, other, {8000})
        err = srv.error("rig.domain.set", {"rigId": other, "name": "app.test", "guestPort": 8000})
        assert err["data"]["field"] == "name" and "another rig" in err["message"]
        srv.call("rig.domain.set", {"rigId": other, "name": "b.test", "guestPort": 8000})
        for name, text in (("app.test", "hello from rig A\n"), ("b.test", "hello from rig B\n")):
            res = curl("--resolve", f"{name}:{https_port}:127.0.0.1", f"https://{name}:{https_port}/",
                       "--cacert", str(ca_file))
            assert res.returncode == 0 and res.stdout == text, (name, res)
        b_host_port = next(p["hostPort"] for p in other_ports["ports"] if p["guestPort"] == 8000)
        a_host_port = next(p["hostPort"] for p in srv.call("rig.ports", {"rigId": rig})["ports"]
                           if p["guestPort"] == 8000)
        assert b_host_port != a_host_port
        assert curl(f"http://127.0.0.1:{b_host_port}/").stdout == "hello from rig B\n"
    finally:
        srv.call("rig.close", {"rigId": other})
    # Closed: its forward and its name are gone at once; rig A's stay.
    assert refused(b_host_port)
    res = curl("-o", "/dev/null", "-w", "%{http_code}", "--resolve", f"b.test:{http_port}:127.0.0.1",
               f"http://b.test:{http_port}/")
    assert res.stdout == "404", res
    assert curl(f"http://127.0.0.1:{a_host_port}/").stdout == "hello from rig A\n"
    assert srv.call("rig.domain.unset", {"rigId": rig, "name": "ws.localhost"})["removed"] is True
    err = srv.error("rig.ports", {"rigId": other})
    assert "closed" in err["message"]


def test_a_connection_to_a_parked_rig_wakes_it(ported: tuple[Server, str, dict[str, Any], float]) -> None:
    srv, rig, _answer, _took = ported
    url = next(p["url"] for p in srv.call("rig.ports", {"rigId": rig})["ports"] if p["guestPort"] == 8000)
    assert srv.call("rig.park", {"rigId": rig})["phase"] == "parked"
    res = curl(url)
    assert res.returncode == 0 and res.stdout == "hello from rig A\n", res
    got = srv.call("rig.get", {"rigId": rig})
    assert got["phase"] == "ready" and "connection to a forwarded port" in got["phaseDetail"], got
