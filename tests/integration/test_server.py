"""The server's faces: RPC over HTTP and WebSocket, size limits, access
control, the PTY lane, agent tools and the CLI, against real rigs."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import urllib.error
import urllib.request

import pytest
from websockets.exceptions import ConnectionClosed
from websockets.sync.client import connect

from tests.integration.conftest import REPO, Server, open_terminal

pytestmark = [pytest.mark.vm, pytest.mark.timeout(300)]


@pytest.fixture
def server(shared_server: Server) -> Server:
    """The worker's shared server (tests/integration/conftest.py): none of these tests needs a
    fresh one, and each one's rigs are closed when it ends."""
    return shared_server



def ws_url(server: Server, path: str) -> str:
    return server.url.replace("http://", "ws://") + path


def auth(token: str) -> dict[str, str]:
    return {"Authorization": f"Bearer {token}"}


def test_admin_token_and_server_json(fresh_server: Server) -> None:
    server = fresh_server  # what a new server's data directory holds: its own
    assert (server.data_dir / "admin.token").stat().st_mode & 0o777 == 0o600
    assert json.loads((server.data_dir / "server.json").read_text())["url"] == server.url
    assert [w["name"] for w in server.call("workspace.list")] == ["default"]
    info = server.call("server.info")
    assert info["accel"] == "tcg" and "terminal" in info["surfaces"]
    assert info["engines"] == ["chromium", "firefox", "webkit"]
    # The token never reaches the log.
    assert server.token not in server.log()


def test_rpc_over_websocket_and_inbound_limits(server: Server) -> None:
    with connect(ws_url(server, "/rpc"), additional_headers=auth(server.token)) as ws:
        ws.send(json.dumps({"jsonrpc": "2.0", "id": 7, "method": "workspace.list"}))
        reply = json.loads(ws.recv(timeout=30))
        assert reply["id"] == 7 and reply["result"][0]["name"] == "default"
        ws.send(json.dumps({"jsonrpc": "2.0", "id": 8, "method": "rig.get", "params": {"rigId": 5}}))
        reply = json.loads(ws.recv(timeout=30))
        assert reply["error"]["data"]["field"] == "rigId"
        ws.send("x" * (300 * 1024))
        with pytest.raises(ConnectionClosed) as closed:
            ws.recv(timeout=30)
    assert closed.value.rcvd is not None and closed.value.rcvd.code == 1009

    body = json.dumps({"jsonrpc": "2.0", "id": 1, "method": "workspace.list", "params": {"pad": "x" * 300_000}})
    req = urllib.request.Request(server.url + "/rpc", data=body.encode(), method="POST", headers=auth(server.token))
    with pytest.raises(urllib.error.HTTPError) as http:
        urllib.request.urlopen(req, timeout=30)
    http.value.close()
    assert http.value.code == 413

    req = urllib.request.Request(server.url + "/rpc", data=b"{}", method="POST")
    with pytest.raises(urllib.error.HTTPError) as http:
        urllib.request.urlopen(req, timeout=30)
    http.value.close()
    assert http.value.code == 401


def test_outsider_cannot_see_list_act_or_close(server: Server) -> None:
    rig = open_terminal(server)
    user = server.call("user.create", {"name": "outsider", "kind": "agent"})
    token = server.call("token.create", {"user": user["id"]})["token"]
    server.call("workspace.create", {"name": "elsewhere"})
    server.call("member.add", {"workspace": "elsewhere", "user": "outsider"})
    missing = server.error("rig.get", {"rigId": "rig_000000000000000000000000"}, token=token)
    for method, params in (
        ("rig.get", {"rigId": rig["id"]}),
        ("rig.close", {"rigId": rig["id"]}),
        ("rig.log", {"rigId": rig["id"]}),
        ("rig.terminalUrl", {"rigId": rig["id"]}),
        ("rig.act", {"rigId": rig["id"], "tool": "terminal_use", "action": {"action": "exec", "argv": ["true"]}}),
    ):
        err = server.error(method, params, token=token)
        assert err["code"] == missing["code"] and err["data"] == missing["data"], (method, err)
    err = server.error("rig.list", {"workspace": "default"}, token=token)
    assert err["data"]["field"] == "workspace"
    assert server.call("rig.list", {"workspace": "elsewhere"}, token=token) == []
    err = server.error("workspace.create", {"name": "mine"}, token=token)
    assert err["code"] == -32003
    with pytest.raises(Exception) as refused:
        connect(ws_url(server, f"/rig/term/{rig['id']}"), additional_headers=auth(token), open_timeout=30)
    assert "404" in str(refused.value)
    # The rig is still there for its own workspace.
    assert server.call("rig.get", {"rigId": rig["id"]})["phase"] == "ready"


def test_pty_over_websocket(server: Server) -> None:
    rig = open_terminal(server)
    signed = server.call("rig.terminalUrl", {"rigId": rig["id"]})
    with connect(ws_url(server, signed["path"] + "&cols=100&rows=30"), max_size=2**20) as ws:
        ws.send(json.dumps({"type": "resize", "cols": 120, "rows": 40}))
        ws.send(b"stty size; echo pty-$((6*7))\n")
        seen = b""
        while b"pty-42" not in seen or b"40 120" not in seen:
            msg = ws.recv(timeout=60)
            assert isinstance(msg, bytes), msg
            seen += msg
        ws.send(json.dumps({"type": "input", "data": "exit 5\n"}))
        while True:
            msg = ws.recv(timeout=60)
            if isinstance(msg, str):
                assert json.loads(msg) == {"type": "exit", "exitCode": 5, "signal": None}
                break
    log = server.call("rig.log", {"rigId": rig["id"]})
    verbs = [a["verb"] for a in log]
    assert verbs[-2:] == ["terminal_open", "terminal_close"]
    assert log[-1]["args"]["inputBytes"] > 0 and "pty-" not in json.dumps(log)
    # A signature for this rig's terminal does not open another rig's.
    other = open_terminal(server)
    with pytest.raises(Exception) as refused:
        connect(ws_url(server, signed["path"].replace(rig["id"], other["id"])), open_timeout=30)
    assert "401" in str(refused.value)


def test_agent_tools(server: Server) -> None:
    listed = server.call("tools.list")
    names = [t["function"]["name"] for t in listed["tools"]]
    assert names == ["rig_list", "rig_close", "terminal_use", "computer_use", "browser_use"]
    assert listed["metadata"]["terminal_use"]["actionClasses"] == ["enclosureControl", "networkEgress", "processSpawn"]
    assert listed["metadata"]["rig_list"]["actionClasses"] == []
    call = {"workspace": "default", "conversation": "conv-1", "name": "terminal_use"}
    first = server.call("tools.call", {**call, "arguments": json.dumps({"action": "exec", "command": "echo $((6*7))"})})
    assert first["isError"] is False and "exit code: 0" in first["content"][0]["text"]
    assert "42" in first["content"][0]["text"] and "<untrusted-output" in first["content"][0]["text"]
    second = server.call("tools.call", {**call, "arguments": {"action": "exec", "argv": ["hostname"]}})
    assert second["rigId"] == first["rigId"]
    bad = server.call("tools.call", {**call, "arguments": {"action": "exec", "timeoutS": -1, "argv": ["x"]}})
    assert bad["isError"] is True and "action.timeoutS" in bad["content"][0]["text"]
    listing = server.call("tools.call", {**call, "name": "rig_list", "arguments": {}})
    assert first["rigId"] in listing["content"][0]["text"]
    closing = server.call("tools.call", {**call, "name": "rig_close", "arguments": {"rigId": first["rigId"]}})
    assert closing["isError"] is False
    unknown = server.call("tools.call", {**call, "name": "rig_close", "arguments": {"rigId": "rig_nope"}})
    assert unknown["isError"] is True


def test_cli_open_act_list_close(server: Server) -> None:
    env = {**os.environ, "RIGD_URL": server.url, "RIGD_TOKEN": server.token}

    def rigd(*args: str) -> subprocess.CompletedProcess[str]:
        return subprocess.run([sys.executable, "-m", "rigd", *args], env=env, cwd=REPO,
                              capture_output=True, text=True, timeout=240)

    opened = rigd("open", "--surface", "terminal")
    assert opened.returncode == 0, opened.stderr
    rig = json.loads(opened.stdout)
    ran = rigd("act", rig["id"], "exec", "--", "uname", "-a")
    assert ran.returncode == 0 and ran.stdout.startswith("Linux rig "), ran
    failed = rigd("act", rig["id"], "exec", "-c", "exit 4")
    assert failed.returncode == 4
    assert rig["id"] in rigd("list").stdout
    assert json.loads(rigd("close", rig["id"]).stdout)["phase"] == "closed"
    bad = rigd("act", rig["id"], "exec", "--", "true")
    assert bad.returncode == 2 and "closed" in bad.stderr
