"""The file lanes on a real terminal rig: a real server, real QEMU under TCG, the agent
from the tools disk, files checked by sha256 inside the guest (RIGS.md §10)."""

from __future__ import annotations

import base64
import contextlib
import hashlib
import json
import os
import socket
import time
import urllib.parse
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from rigd.backends.lanes import PUT_CHUNK, PUT_PIPELINE, READ_WINDOW
from rigd.client.lanes import LaneClient, LaneError
from tests.integration.conftest import ClientError, Server, SharedServer, exec_, open_terminal

pytestmark = [pytest.mark.vm, pytest.mark.timeout(600)]


@pytest.fixture(scope="module")
def term(shared_servers: SharedServer) -> Iterator[tuple[Server, str]]:
    """A terminal rig for the module, on the worker's shared server."""
    srv = shared_servers.get()
    rig = open_terminal(srv)
    try:
        yield srv, rig["id"]
    finally:
        with contextlib.suppress(ClientError):
            srv.call("rig.close", {"rigId": rig["id"]})


def sh(srv: Server, rig: str, command: str) -> str:
    out = exec_(srv, rig, command=command, timeoutS=300)
    assert out["exitCode"] == 0, out
    return str(out["stdout"]["text"])


def lanes(srv: Server, token: str | None = None) -> LaneClient:
    return LaneClient(srv.url, token or srv.token, timeout=600)


def raw(srv: Server, method: str, path: str, *, headers: dict[str, str] | None = None,
        body: bytes = b"") -> tuple[int, dict[str, Any] | None]:
    import http.client

    parts = urllib.parse.urlsplit(srv.url)
    conn = http.client.HTTPConnection(parts.netloc, timeout=120)
    try:
        conn.request(method, path, body=body, headers=headers or {})
        resp = conn.getresponse()
        data = resp.read()
        return resp.status, json.loads(data) if data.startswith(b"{") else None
    finally:
        conn.close()


def test_a_drop_lands_in_drops_checked_and_comes_back_out(term: tuple[Server, str], tmp_path: Path) -> None:
    srv, rig = term
    sh(srv, rig, "mkdir -p /root/drops && printf old > /root/drops/notes.txt")
    # Eight times the lanes' windows (PUT_PIPELINE x PUT_CHUNK up, READ_WINDOW down): many
    # windows each way; the rate is bench/lanes.py's (a test only checks the bytes).
    big = tmp_path / "big.bin"
    big_bytes = 8 * max(PUT_PIPELINE * PUT_CHUNK, READ_WINDOW)
    with big.open("wb") as fh:
        fh.write(os.urandom(big_bytes))
    resume = tmp_path / "résumé 2.pdf"
    resume.write_bytes(b"%PDF-1.4 " + "héllo".encode() * 1000)
    notes = tmp_path / "notes.txt"
    notes.write_text("new notes\n")
    started = time.monotonic()
    answer = lanes(srv).upload(rig, [big, resume, notes])
    took = time.monotonic() - started
    assert answer["dir"] == "/root/drops" and answer["told"] == "none"
    paths = [s["path"] for s in answer["saved"]]
    assert paths == ["/root/drops/big.bin", "/root/drops/résumé 2.pdf", "/root/drops/2-notes.txt"]
    want = {p: hashlib.sha256(f.read_bytes()).hexdigest() for p, f in zip(paths, [big, resume, notes],
                                                                          strict=True)}
    assert {s["path"]: s["sha256"] for s in answer["saved"]} == want
    # Inside the guest, by the guest's own sha256sum; the old file is untouched.
    sums = sh(srv, rig, "cd /root/drops && sha256sum big.bin 'résumé 2.pdf' 2-notes.txt && cat notes.txt")
    for path, digest in want.items():
        assert f"{digest}  {path.rsplit('/', 1)[1]}" in sums
    assert sums.endswith("old")
    assert sh(srv, rig, "ls -A /root/drops | grep -c rigd-drop || true").strip() == "0"
    # And back out through the GET lane, checked against its Repr-Digest.
    out = lanes(srv).download(rig, "/root/drops/big.bin", tmp_path / "back.bin")
    assert out["sha256"] == want["/root/drops/big.bin"] and out["bytes"] == big_bytes
    out = lanes(srv).download(rig, "/root/drops/résumé 2.pdf", tmp_path)
    assert Path(out["path"]).name == "résumé 2.pdf" and out["sha256"] == want["/root/drops/résumé 2.pdf"]
    print(f"\n{big_bytes >> 20} MiB drop in {took:.1f} s")
    rows = srv.call("rig.log", {"rigId": rig})
    drop = next(r for r in rows if r["verb"] == "drop_files")
    assert drop["args"]["count"] == 3 and drop["args"]["files"][0]["path"] == "/root/drops/big.bin"
    assert "new notes" not in json.dumps(rows) and "héllo" not in json.dumps(rows)
    assert any(r["verb"] == "read_file" and r["args"]["bytes"] == big_bytes for r in rows), [(r["outcome"], r["args"]) for r in rows if r["verb"] == "read_file"]


def test_an_oversize_drop_and_bad_paths_are_refused(term: tuple[Server, str], tmp_path: Path) -> None:
    srv, rig = term
    auth = {"Authorization": f"Bearer {srv.token}"}
    status, body = raw(srv, "POST", f"/rig/files/{rig}", headers={
        **auth, "Content-Type": "multipart/form-data; boundary=x", "Content-Length": str(600 << 20)})
    assert status == 413 and body is not None and "512 MB" in body["error"]["message"]
    for path, reason in (("/root", "not a regular file: directory"),
                         ("/dev/zero", "not a regular file: character device"),
                         ("/no/such", "no such file")):
        p = base64.urlsafe_b64encode(path.encode()).decode().rstrip("=")
        status, body = raw(srv, "GET", f"/rig/files/{rig}?p={p}", headers=auth)
        assert status == 400 and body is not None, (path, status, body)
        assert body["error"]["data"]["field"] == "p" and reason in body["error"]["data"]["reason"], body
    status, body = raw(srv, "GET", f"/rig/files/{rig}?p=cmVs", headers=auth)  # "rel"
    assert status == 400 and body is not None and "absolute" in body["error"]["data"]["reason"]
    status, body = raw(srv, "GET", f"/rig/clipboard/{rig}", headers=auth)
    assert status == 404 and body is not None and "no clipboard" in body["error"]["message"]


def test_a_refused_upload_read_and_hung_up_fifty_times_logs_no_error(term: tuple[Server, str]) -> None:
    """A drop declared over the cap, its 413 read, the connection closed at once: the server's
    answer and hypercorn's end of the connection used to write one stream from two tasks
    (``BusyResourceError``, an ERROR traceback in about a quarter of tries)."""
    srv, rig = term
    parts = urllib.parse.urlsplit(srv.url)
    logged = len(srv.log())
    statuses = []
    for _ in range(50):
        with socket.create_connection((parts.hostname, parts.port), timeout=60) as sock:
            sock.sendall((f"POST /rig/files/{rig} HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer {srv.token}\r\n"
                          "Content-Type: multipart/form-data; boundary=b\r\nContent-Length: 629145600\r\n\r\n"
                          "--b\r\nContent-Disposition: form-data; name=\"f\"; filename=\"big.bin\"\r\n\r\n").encode())
            answer = b""
            while b"\r\n\r\n" not in answer or len(answer.split(b"\r\n\r\n", 1)[1]) < int(
                    answer.split(b"content-length: ", 1)[1].split(b"\r\n", 1)[0]):
                chunk = sock.recv(65536)
                if not chunk:
                    break
                answer += chunk
            statuses.append(answer.split(b"\r\n", 1)[0])
    assert set(statuses) == {b"HTTP/1.1 413 "}, set(statuses)
    # (an absence: watched for two seconds after the last answer, the server logging as it goes)
    deadline = time.monotonic() + 2
    while time.monotonic() < deadline:
        tail = srv.log()[logged:]
        assert "ERROR" not in tail and "Traceback" not in tail, tail[-3000:]
        time.sleep(0.2)


def test_an_abandoned_download_stops_the_guest_reader_and_is_audited_aborted(term: tuple[Server, str]) -> None:
    srv, rig = term
    sh(srv, rig, "truncate -s 100M /root/big100")
    parts = urllib.parse.urlsplit(srv.url)
    p = base64.urlsafe_b64encode(b"/root/big100").decode().rstrip("=")
    with socket.create_connection((parts.hostname, parts.port), timeout=120) as sock:
        sock.sendall(f"GET /rig/files/{rig}?p={p} HTTP/1.1\r\nHost: x\r\n"
                     f"Authorization: Bearer {srv.token}\r\n\r\n".encode())
        got = 0
        while got < (1 << 20):
            chunk = sock.recv(65536)
            assert chunk, "the download ended early"
            got += len(chunk)
    # The guest's reader lets go of the file (its descriptor closes) …
    agent_fds = "ls -l /proc/$(cat /run/rigd-agent.pid)/fd /proc/$(cat /run/rigd-agent.pid)/task/*/fd 2>/dev/null"
    deadline = time.monotonic() + 60
    while "/root/big100" in sh(srv, rig, agent_fds):
        assert time.monotonic() < deadline, "the guest still reads the file a minute after the client left"
        time.sleep(0.5)
    # … and the audit says what was delivered, not the file's size.
    deadline = time.monotonic() + 30
    while not (rows := [r for r in srv.call("rig.log", {"rigId": rig})
                        if r["verb"] == "read_file" and r["args"].get("path") == "/root/big100"]):
        assert time.monotonic() < deadline, "no read_file row"
        time.sleep(0.5)
    row = rows[-1]
    assert row["outcome"] == "aborted", row
    assert 0 < row["args"]["bytes"] < 100 << 20, row
    # The bytes the guest still had in flight are dropped; the rig is none the worse.
    assert srv.call("rig.get", {"rigId": rig})["phase"] == "ready"
    sh(srv, rig, "rm -f /root/big100")


def test_a_file_that_changes_while_read_never_ends_as_a_complete_200(term: tuple[Server, str]) -> None:
    """A guest loop rewrites the first bytes of a 16 MB file in place with a counter, so they
    change between the digest pass and the bytes (the agent reads one fd twice): a client
    either sees an error or a body short of its Content-Length (the connection closes), never
    a complete 200 whose Repr-Digest does not match. (It read /proc/self/status, which changed
    between the passes only when the agent's main thread happened to be switched out.)"""
    srv, rig = term
    sh(srv, rig, "rm -f /root/stop-changing && head -c 16M /dev/zero > /root/changing && "
                 "setsid sh -c 'i=0; while [ ! -e /root/stop-changing ]; do i=$((i+1)); "
                 "exec 3<>/root/changing; printf %012d $i >&3; exec 3>&-; done' "
                 "</dev/null >/dev/null 2>&1 & echo $! > /root/changer.pid")
    try:
        seen = _read_changing(srv, rig)
    finally:
        sh(srv, rig, "touch /root/stop-changing; kill $(cat /root/changer.pid) 2>/dev/null; "
                     "rm -f /root/changing; true")
    assert any(status == 200 and not complete for status, complete in seen), seen
    assert srv.call("rig.get", {"rigId": rig})["phase"] == "ready"


def _read_changing(srv: Server, rig: str) -> list[tuple[int, bool]]:
    import http.client

    p = base64.urlsafe_b64encode(b"/root/changing").decode().rstrip("=")
    parts = urllib.parse.urlsplit(srv.url)
    seen = []
    for _ in range(3):
        conn = http.client.HTTPConnection(parts.netloc, timeout=120)
        try:
            conn.request("GET", f"/rig/files/{rig}?p={p}", headers={"Authorization": f"Bearer {srv.token}"})
            resp = conn.getresponse()
            try:
                data, complete = resp.read(), True
            except http.client.IncompleteRead as exc:
                data, complete = exc.partial, False
            if resp.status == 200 and complete:
                want = resp.headers["repr-digest"]
                assert want == f"sha-256=:{base64.b64encode(hashlib.sha256(data).digest()).decode()}:", \
                    "a complete 200 whose digest does not match its body"
            seen.append((resp.status, complete))
        finally:
            conn.close()
    return seen


def test_a_client_that_hangs_up_mid_upload_leaves_nothing(term: tuple[Server, str]) -> None:
    srv, rig = term
    sh(srv, rig, "rm -rf /root/drops && mkdir -p /root/drops")
    parts = urllib.parse.urlsplit(srv.url)
    head = (b"--b\r\nContent-Disposition: form-data; name=\"f\"; filename=\"half.bin\"\r\n\r\n")
    sock = socket.create_connection((parts.hostname, parts.port), timeout=60)
    sock.sendall((f"POST /rig/files/{rig} HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer {srv.token}\r\n"
                  f"Content-Type: multipart/form-data; boundary=b\r\nContent-Length: {64 << 20}\r\n\r\n").encode()
                 + head + b"z" * (8 << 20))
    # The temporary file exists while the upload streams in …
    deadline = time.monotonic() + 120
    while "rigd-drop" not in sh(srv, rig, "ls -A /root/drops"):
        assert time.monotonic() < deadline, "the drop never reached the guest"
        time.sleep(0.2)
    sock.close()
    # … and is gone once the server saw the client leave.
    deadline = time.monotonic() + 120
    while (listing := sh(srv, rig, "ls -A /root/drops")).strip():
        assert time.monotonic() < deadline, f"left behind: {listing}"
        time.sleep(0.2)
    rows = srv.call("rig.log", {"rigId": rig})
    assert any(r["verb"] == "drop_files" and r["outcome"] == "error" for r in rows)


def test_control_and_signatures_guard_the_writes(term: tuple[Server, str], tmp_path: Path) -> None:
    srv, rig = term
    f = tmp_path / "a.txt"
    f.write_text("a")
    ws = srv.call("workspace.list")[0]["id"]
    bob = srv.call("user.create", {"name": f"bob-{os.getpid()}", "kind": "person"})
    srv.call("member.add", {"workspace": ws, "user": bob["id"]})
    bob_token = srv.call("token.create", {"user": bob["id"]})["token"]
    sh(srv, rig, "echo seen > /root/seen.txt")
    srv.call("rig.control", {"rigId": rig, "op": "take"}, token=bob_token)
    try:
        with pytest.raises(LaneError, match="HTTP 409"):
            lanes(srv).upload(rig, [f])
        # Reading is an observation: allowed while bob drives.
        assert lanes(srv).download(rig, "/root/seen.txt", tmp_path / "seen.txt")["bytes"] == 5
        assert lanes(srv, bob_token).upload(rig, [f])["saved"][0]["name"] == "a.txt"
    finally:
        srv.call("rig.control", {"rigId": rig, "op": "release"}, token=bob_token)
    view = srv.call("rig.terminalUrl", {"rigId": rig})["path"].split("?", 1)[1]
    status, body = raw(srv, "GET", f"/rig/files/{rig}?{view}&p=L3Jvb3Qvc2Vlbi50eHQ")
    assert status == 401 and body is not None
    signed = srv.call("rig.filesUrl", {"rigId": rig})
    status, body = raw(srv, "GET", signed["path"] + "&p=L3Jvb3Qvc2Vlbi50eHQ")
    assert status == 200 and body is None


def test_the_cli_copies_both_ways_and_a_files_signature_opens_no_terminal(
        term: tuple[Server, str], tmp_path: Path) -> None:
    import subprocess
    import sys

    from websockets.exceptions import InvalidStatus
    from websockets.sync.client import connect

    srv, rig = term
    src = tmp_path / "from-host.txt"
    src.write_text("über die Grenze\n")
    cli = [sys.executable, "-m", "rigd"]
    opts = ["--url", srv.url, "--token", srv.token]
    done = subprocess.run([*cli, "cp", *opts, str(src), f"{rig}:"], capture_output=True, text=True,
                          timeout=300, check=False)
    assert done.returncode == 0, done.stderr
    saved = json.loads(done.stdout)["saved"][0]
    assert saved["path"].startswith("/root/drops/") and saved["path"].endswith("from-host.txt")
    assert sh(srv, rig, f"cat '{saved['path']}'") == "über die Grenze\n"
    back = tmp_path / "back.txt"
    done = subprocess.run([*cli, "cp", *opts, f"{rig}:{saved['path']}", str(back)], capture_output=True,
                          text=True, timeout=300, check=False)
    assert done.returncode == 0, done.stderr
    assert back.read_text() == "über die Grenze\n"
    done = subprocess.run([*cli, "clip", *opts, "get", rig], capture_output=True, text=True, timeout=120,
                          check=False)
    assert done.returncode == 2 and "no clipboard" in done.stderr
    # A rig-files signature is refused on the terminal lane (and the PTY stays closed).
    files = srv.call("rig.filesUrl", {"rigId": rig})["path"].split("?", 1)[1]
    ws = srv.url.replace("http://", "ws://") + f"/rig/term/{rig}?{files}"
    with pytest.raises(InvalidStatus) as refused:
        connect(ws, open_timeout=30).close()
    assert refused.value.response.status_code == 401
