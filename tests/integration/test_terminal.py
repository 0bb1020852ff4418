"""Terminal rigs end to end: a real rigd server, real QEMU under TCG, the
locally built image and kernel, and the guest agent from the tools disk."""

from __future__ import annotations

import hashlib
import os
import time
from pathlib import Path

import pytest

from tests.integration.conftest import Server, exec_, open_terminal

pytestmark = [pytest.mark.vm, pytest.mark.timeout(300)]


@pytest.fixture
def server(shared_server: Server) -> Server:
    """The worker's shared server (tests/integration/conftest.py): none of these tests needs a
    fresh one, and each one's rigs are closed when it ends."""
    return shared_server



def text(stream: dict[str, object]) -> str:
    assert stream["untrusted"] is True
    return str(stream["text"])


def test_exec_uname_exit_codes_stdin_env_cwd(server: Server) -> None:
    rig = open_terminal(server)
    assert rig["accel"] == "tcg" and rig["securityBoundary"] is False
    assert any("not a security boundary" in n for n in rig["notes"])
    assert rig["execImage"] is True and rig["image"].startswith("sha256:")

    out = exec_(server, rig["id"], argv=["uname", "-a"])
    assert out["exitCode"] == 0
    assert text(out["stdout"]).startswith("Linux rig ")

    out = exec_(server, rig["id"], command="echo to-stderr >&2; exit 3")
    assert out["exitCode"] == 3 and text(out["stderr"]) == "to-stderr\n"

    out = exec_(server, rig["id"], command="cat; echo \"$GREETING\"; pwd", stdin="from stdin\n",
                env={"GREETING": "hello"}, cwd="/tmp")
    assert text(out["stdout"]) == "from stdin\nhello\n/tmp\n"

    err = server.error("rig.act", {"rigId": rig["id"], "tool": "terminal_use",
                                   "action": {"action": "exec", "argv": ["no-such-binary"]}})
    assert err["data"]["field"] == "action.argv" and "no such file" in err["data"]["reason"]
    err = server.error("rig.act", {"rigId": rig["id"], "tool": "terminal_use",
                                   "action": {"action": "exec", "argv": ["ls"], "cwd": "/nowhere"}})
    assert err["data"]["field"] == "action.cwd"

    tools = exec_(server, rig["id"], command="for t in bash git curl socat gcc make python3 jq rsync tar xz zstd unzip "
                                             "vi nano less file ps; "
                                             "do command -v $t >/dev/null || echo missing $t; done")
    assert text(tools["stdout"]) == ""


def test_timeout_kills_the_process_group(server: Server) -> None:
    rig = open_terminal(server)
    started = time.monotonic()
    out = exec_(server, rig["id"], command="sleep 300 & sleep 301 & sleep 302", timeoutS=3)
    assert out["timedOut"] is True and "process group was killed" in out["note"]
    assert time.monotonic() - started < 60
    left = exec_(server, rig["id"], command="ps -eo args | grep '^sleep 30' || true")
    assert text(left["stdout"]) == ""


def test_large_output_intact_and_truncated_past_limit(server: Server) -> None:
    rig = open_terminal(server)
    one_mb = exec_(server, rig["id"], command="yes 0123456789abcdef | head -c 1048576")
    data = text(one_mb["stdout"]).encode()
    assert len(data) == 1048576 and one_mb["stdout"]["truncated"] is False
    assert hashlib.sha256(data).hexdigest() == hashlib.sha256((b"0123456789abcdef\n" * 61681)[:1048576]).hexdigest()

    big = exec_(server, rig["id"], command="head -c 3000000 /dev/zero | tr '\\0' x")
    assert big["stdout"]["truncated"] is True and big["stdout"]["bytes"] == 2 * 1024 * 1024
    assert "truncated" in big["stdout"]["note"]


def test_two_rigs_cannot_see_each_other(server: Server) -> None:
    a = open_terminal(server)
    b = open_terminal(server)
    exec_(server, a["id"], command="echo secret-a > /root/only-in-a")
    seen = exec_(server, b["id"], command="ls /root/only-in-a 2>&1; cat /proc/cmdline")
    assert "No such file" in text(seen["stdout"])
    # On the host: each QEMU runs as its own unprivileged uid, and its disk
    # overlay and sockets belong to it alone.
    run = server.data_dir / "rigs" / "run"
    uids = set()
    for rig in (a, b):
        status = Path(f"/proc/{rig['pid']}/status").read_text()
        uid = int(status.split("\nUid:")[1].split()[0])
        assert uid != 0
        uids.add(uid)
        overlay = (run / f"{rig['id']}.qcow2").stat()
        assert overlay.st_uid == uid and overlay.st_mode & 0o077 == 0
        rig_dir = (server.data_dir / "rigs" / "smolvm" / rig["id"]).stat()
        assert rig_dir.st_uid == uid and rig_dir.st_mode & 0o077 == 0
    assert len(uids) == 2


def test_every_qemu_thread_runs_under_seccomp(server: Server) -> None:
    rig = open_terminal(server)
    tasks = list(Path(f"/proc/{rig['pid']}/task").iterdir())
    assert len(tasks) > 1
    for task in tasks:
        status = (task / "status").read_text()
        seccomp = [line for line in status.splitlines() if line.startswith("Seccomp:")]
        assert seccomp == ["Seccomp:\t2"], (task, seccomp)
    cmdline = Path(f"/proc/{rig['pid']}/cmdline").read_bytes().split(b"\0")
    sandbox = cmdline[cmdline.index(b"-sandbox") + 1].decode()
    for opt in ("obsolete=deny", "elevateprivileges=deny", "spawn=deny", "resourcecontrol=deny"):
        assert opt in sandbox


def test_close_leaves_no_process_or_files_but_keeps_audit_rows(server: Server) -> None:
    rig = open_terminal(server)
    exec_(server, rig["id"], argv=["true"])
    pid = rig["pid"]
    closed = server.call("rig.close", {"rigId": rig["id"]})
    assert closed["phase"] == "closed" and closed["closeReason"] == "requested"
    assert not Path(f"/proc/{pid}").exists() or "qemu" not in Path(f"/proc/{pid}/cmdline").read_text(errors="replace")
    assert not (server.data_dir / "rigs" / "smolvm" / rig["id"]).exists()
    assert not (server.data_dir / "rigs" / "run" / f"{rig['id']}.qcow2").exists()
    log = server.call("rig.log", {"rigId": rig["id"]})
    assert [(a["tool"], a["verb"]) for a in log] == [("rig", "open"), ("terminal_use", "exec"), ("rig", "close")]
    again = server.call("rig.get", {"rigId": rig["id"]})
    assert again["phase"] == "closed"


def test_killed_qemu_turns_failed_backend_failure(server: Server) -> None:
    rig = open_terminal(server)
    os.kill(rig["pid"], 9)
    deadline = time.monotonic() + 5
    got = server.call("rig.get", {"rigId": rig["id"]})
    while got["phase"] != "failed" and time.monotonic() < deadline:
        time.sleep(0.1)
        got = server.call("rig.get", {"rigId": rig["id"]})
    assert got["phase"] == "failed" and got["closeReason"] == "backendFailure"
    assert "SIGKILL" in got["failure"]
    err = server.error("rig.act", {"rigId": rig["id"], "tool": "terminal_use",
                                   "action": {"action": "exec", "argv": ["true"]}})
    assert "failed" in err["message"]
    closed = server.call("rig.close", {"rigId": rig["id"]})
    assert closed["phase"] == "closed"
    assert not (server.data_dir / "rigs" / "smolvm" / rig["id"]).exists()


def test_malformed_actions_name_the_field(server: Server) -> None:
    rig = open_terminal(server)
    cases = [
        ({"action": "exec"}, "action"),
        ({"action": "exec", "argv": ["ls"], "timeoutS": 99999}, "action.timeoutS"),
        ({"action": "exec", "argv": "ls"}, "action.argv"),
        ({"action": "exec", "argv": ["ls"], "env": {"BAD NAME": "x"}}, "action.env"),
        ({"action": "fly"}, "action.action"),
        ("not an object", "action"),
    ]
    for action, field in cases:
        err = server.error("rig.act", {"rigId": rig["id"], "tool": "terminal_use", "action": action})
        assert err["code"] == -32602, err
        assert err["data"]["field"].startswith(field), (action, err)
        assert err["data"]["reason"]
    err = server.error("rig.act", {"rigId": rig["id"], "tool": "pogo_use", "action": {}})
    assert err["data"]["field"] == "tool"
    err = server.error("rig.open", {"workspace": "default", "surface": "terminal", "memoryMb": 10**6})
    assert err["data"] == {"field": "memoryMb", "reason": "must be an integer between 256 and 4096 MB"}
