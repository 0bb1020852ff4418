"""The in-guest agent, run on the host over pipes (``--stdio``), driven by GuestProtocol.

No sockets and no VMs: the agent is a plain subprocess of the test, and every
byte it sends goes through the same sans-I/O parser the server uses.
"""

from __future__ import annotations

import os
import re
import shutil
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from rigd.protocols.guest import (
    AgentError,
    Event,
    Garbage,
    GuestProtocol,
    PtyExit,
    PtyOutput,
    Ready,
    Reply,
    Stream,
)
from tests.unit.guest_agent import AGENT


class AgentHarness:
    """One agent subprocess; a reader thread feeds its output to a GuestProtocol."""

    def __init__(self, argv: list[str], *, rfd: int, wfd: int, proc: subprocess.Popen[bytes]):
        self.argv = argv
        self.proc = proc
        self.rfd = rfd
        self.wfd = wfd
        self.proto = GuestProtocol()
        self.lock = threading.Lock()
        self.cond = threading.Condition(self.lock)
        self.events: list[Event] = []
        self.eof = False
        self.reader = threading.Thread(target=self._read, daemon=True)
        self.reader.start()

    @classmethod
    def stdio(
        cls, *extra: str, python: str = sys.executable, env: dict[str, str] | None = None,
        flags: tuple[str, ...] = ("-I",),
    ) -> AgentHarness:
        """A ``--stdio`` agent. Without ``env``: a terminal agent (protocol 1),
        whatever display the developer running the tests has. ``flags``: the interpreter's
        (``-I -S``: no site packages, as the tools disk's interpreter has none)."""
        if env is None:
            # A variable in the agent's own environment must never reach its children.
            env = {**os.environ, "RIGD_TEST_LEAK": "leaked", "PYTHONHOME": sys.prefix}
            env.pop("DISPLAY", None)
            env.pop("XAUTHORITY", None)
            extra = ("--session-env", "", *extra)
        argv = [python, *flags, str(AGENT), "--stdio", *extra]
        proc = subprocess.Popen(argv, stdin=subprocess.PIPE, stdout=subprocess.PIPE, env=env)
        assert proc.stdin is not None and proc.stdout is not None
        return cls(argv, rfd=proc.stdout.fileno(), wfd=proc.stdin.fileno(), proc=proc)

    def _read(self) -> None:
        while True:
            try:
                data = os.read(self.rfd, 65536)
            except OSError:
                data = b""
            with self.cond:
                if not data:
                    self.eof = True
                    self.cond.notify_all()
                    return
                self.events += self.proto.receive_data(data)
                self.cond.notify_all()

    # ---- sending

    def send_raw(self, data: bytes) -> None:
        view = memoryview(data)
        while view:
            view = view[os.write(self.wfd, view) :]

    def send(self, op: str, **fields: Any) -> int:
        with self.lock:
            rid, data = self.proto.send_request(op, **fields)
        self.send_raw(data)
        return rid

    # ---- waiting

    def wait_for(self, pred: Callable[[Event], bool], timeout: float = 10.0) -> Event:
        """Remove and return the first event matching ``pred``."""
        deadline = time.monotonic() + timeout
        with self.cond:
            while True:
                for i, event in enumerate(self.events):
                    if pred(event):
                        return self.events.pop(i)
                left = deadline - time.monotonic()
                if left <= 0 or self.eof:
                    raise AssertionError(f"no matching event; have {self.events!r}")
                self.cond.wait(left)

    def reply(self, rid: int, timeout: float = 10.0) -> Reply:
        event = self.wait_for(lambda e: isinstance(e, Reply) and e.id == rid, timeout)
        assert isinstance(event, Reply)
        return event

    def streams(self, rid: int) -> list[Stream]:
        with self.lock:
            found = [e for e in self.events if isinstance(e, Stream) and e.id == rid]
            self.events = [e for e in self.events if e not in found]
        return found

    def call(self, op: str, timeout: float = 10.0, **fields: Any) -> Reply:
        return self.reply(self.send(op, **fields), timeout)

    def exec(self, argv: list[str], timeout: float = 10.0, **fields: Any) -> ExecOutcome:
        rid = self.send("exec", argv=argv, **fields)
        reply = self.reply(rid, timeout)
        return ExecOutcome(reply, self.streams(rid))

    def garbage(self) -> list[Event]:
        with self.lock:
            return [e for e in self.events if isinstance(e, Garbage)]

    def close(self) -> None:
        with _suppress():
            os.close(self.wfd)
        try:
            self.proc.wait(timeout=5)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()
        self.reader.join(5)
        for pipe in (self.proc.stdin, self.proc.stdout):
            if pipe is not None:
                with _suppress():
                    pipe.close()


class _suppress:
    def __enter__(self) -> None:
        return None

    def __exit__(self, *exc: object) -> bool:
        return True


class ExecOutcome:
    def __init__(self, reply: Reply, streams: list[Stream]) -> None:
        self.reply = reply
        self.body = reply.body
        self.streams = streams
        self.stdout = b"".join(s.data for s in streams if s.body.get("fd") == 1)
        self.stderr = b"".join(s.data for s in streams if s.body.get("fd") == 2)


@pytest.fixture
def agent() -> Iterator[AgentHarness]:
    harness = AgentHarness.stdio()
    try:
        ready = harness.wait_for(lambda e: isinstance(e, Ready))
        assert ready == Ready(1, "rigd-agent/1", harness.proc.pid, ("files",))
        yield harness
    finally:
        harness.close()
    assert harness.garbage() == []  # the agent itself never sends garbage


def gone(pid: int) -> bool:
    """Dead: no such process, or a zombie waiting for its (foreign) reaper."""
    try:
        with open(f"/proc/{pid}/stat", "rb") as f:
            stat = f.read()
    except FileNotFoundError:
        return True
    return stat[stat.rindex(b")") + 2 :].split()[0] in (b"Z", b"X")


def wait_gone(pid: int, timeout: float = 5.0) -> bool:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if gone(pid):
            return True
        time.sleep(0.05)
    return gone(pid)


# --------------------------------------------------------------------------
# basics


@pytest.mark.timeout(20)
def test_ping(agent: AgentHarness) -> None:
    assert agent.call("ping") == Reply(1, True, {}, None)


@pytest.mark.timeout(20)
def test_hello_reports_the_guest_and_leaves_the_host_clock_alone(agent: AgentHarness) -> None:
    reply = agent.call("hello", time=time.time() + 3600)
    assert reply.ok
    body = reply.body
    assert body["proto"] == 1 and body["agent"] == "rigd-agent/1"
    assert body["kernel"].startswith(os.uname().sysname)
    assert body["hostname"] == os.uname().nodename
    assert body["bootS"] > 0
    assert body["clockSet"] is False  # --stdio never touches the clock
    assert 3590 < body["clockSkewS"] < 3610


@pytest.mark.timeout(20)
def test_unknown_op_is_refused(agent: AgentHarness) -> None:
    reply = agent.call("format_disk")
    assert not reply.ok and reply.error == "unknown op: format_disk"


# --------------------------------------------------------------------------
# exec


@pytest.mark.timeout(20)
def test_exec_echo(agent: AgentHarness) -> None:
    out = agent.exec(["echo", "hello", "world"])
    assert out.reply.ok
    assert out.stdout == b"hello world\n" and out.stderr == b""
    assert out.body["exitCode"] == 0 and out.body["signal"] is None
    assert out.body["timedOut"] is False
    assert out.body["truncated"] == {"stdout": False, "stderr": False}
    assert isinstance(out.body["durationMs"], int)


@pytest.mark.timeout(20)
def test_exec_nonzero_exit_and_signal(agent: AgentHarness) -> None:
    out = agent.exec(["sh", "-c", "echo oops >&2; exit 7"])
    assert out.body["exitCode"] == 7 and out.body["signal"] is None
    assert out.stderr == b"oops\n"
    out = agent.exec(["sh", "-c", "kill -TERM $$"])
    assert out.body["exitCode"] is None and out.body["signal"] == signal.SIGTERM


@pytest.mark.timeout(20)
def test_exec_stdin_is_passed_through(agent: AgentHarness) -> None:
    data = bytes(range(256)) * 300  # binary, bigger than a pipe buffer
    out = agent.exec(["cat"], stdin=data)
    assert out.body["exitCode"] == 0 and out.stdout == data
    # Without stdin the child reads EOF at once instead of hanging.
    out = agent.exec(["cat"])
    assert out.body["exitCode"] == 0 and out.stdout == b""


@pytest.mark.timeout(20)
def test_exec_env_and_cwd(agent: AgentHarness, tmp_path: Path) -> None:
    script = 'printf "%s|%s|%s|%s|%s" "$FOO" "$(pwd)" "$HOME" "$LANG" "$PATH"; echo; env'
    out = agent.exec(["sh", "-c", script], env={"FOO": "bar baz"}, cwd=str(tmp_path))
    assert out.body["exitCode"] == 0
    first, _, env_dump = out.stdout.decode().partition("\n")
    foo, cwd, home, lang, path = first.split("|")
    assert foo == "bar baz"
    assert os.path.realpath(cwd) == os.path.realpath(tmp_path)
    assert (home, lang) == ("/root", "C.UTF-8")
    assert path == "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"
    # The clean environment: nothing of the agent's own leaks into children.
    assert "RIGD_TEST_LEAK" not in env_dump
    assert "PYTHONHOME" not in env_dump and "LD_LIBRARY_PATH" not in env_dump


@pytest.mark.timeout(20)
def test_exec_timeout_kills_the_whole_process_group(agent: AgentHarness) -> None:
    started = time.monotonic()
    out = agent.exec(["sh", "-c", "sleep 100 & echo $!; sleep 100"], timeoutMs=500)
    assert time.monotonic() - started < 5
    assert out.body["timedOut"] is True
    assert out.body["exitCode"] is None and out.body["signal"] == signal.SIGKILL
    background = int(out.stdout.split()[0])
    assert wait_gone(background), f"background sleep {background} survived the timeout"


@pytest.mark.timeout(20)
def test_exec_one_mebibyte_of_stdout_arrives_intact(agent: AgentHarness) -> None:
    size = 1 << 20
    prog = f"import sys; sys.stdout.buffer.write(bytes(i * 7 % 251 for i in range({size})))"
    out = agent.exec([sys.executable, "-c", prog])
    assert out.body["exitCode"] == 0
    assert out.stdout == bytes(i * 7 % 251 for i in range(size))
    assert out.body["truncated"] == {"stdout": False, "stderr": False}
    assert all(len(s.data) <= 48 * 1024 for s in out.streams)


@pytest.mark.timeout(20)
def test_exec_max_output_truncates_but_keeps_draining(agent: AgentHarness) -> None:
    # 4 MiB on stdout against a 1000-byte cap: the child must still finish
    # normally (never blocked on a full pipe, never SIGPIPE'd).
    out = agent.exec(["sh", "-c", "head -c 4194304 /dev/zero; echo done >&2"], maxOutput=1000)
    assert out.body["exitCode"] == 0 and out.body["signal"] is None
    assert out.stdout == b"\0" * 1000
    assert out.stderr == b"done\n"
    assert out.body["truncated"] == {"stdout": True, "stderr": False}


@pytest.mark.timeout(20)
def test_exec_default_max_output_is_two_mebibytes(agent: AgentHarness) -> None:
    out = agent.exec(["head", "-c", str(3 << 20), "/dev/zero"])
    assert len(out.stdout) == 2 << 20 and out.body["truncated"]["stdout"] is True


@pytest.mark.timeout(20)
def test_exec_missing_binary_or_bad_cwd_is_a_readable_refusal(agent: AgentHarness) -> None:
    reply = agent.call("exec", argv=["definitely-not-a-binary-xyz"])
    assert not reply.ok
    assert reply.error == "no such file or directory: definitely-not-a-binary-xyz"
    reply = agent.call("exec", argv=["true"], cwd="/no/such/dir")
    assert not reply.ok and reply.error == "cwd: no such file or directory: /no/such/dir"
    reply = agent.call("exec", argv=[])
    assert not reply.ok and reply.error is not None and reply.error.startswith("bad request:")
    reply = agent.call("exec", argv=["true"], env={"A": 1})
    assert not reply.ok and reply.error is not None and "env" in reply.error
    assert agent.call("ping").ok


@pytest.mark.timeout(20)
def test_execs_run_concurrently(agent: AgentHarness) -> None:
    started = time.monotonic()
    rids = [agent.send("exec", argv=["sleep", "1"]) for _ in range(4)]
    # A quick request is not stuck behind the slow ones.
    assert agent.call("ping", timeout=0.9).ok
    for rid in rids:
        assert agent.reply(rid).body["exitCode"] == 0
    assert time.monotonic() - started < 3


@pytest.mark.timeout(20)
def test_exec_does_not_wait_forever_for_a_background_holder(agent: AgentHarness) -> None:
    # The background sleep keeps stdout open; the reply still comes soon after
    # the leader exits, and the sleep is left running (servers are legitimate).
    out = agent.exec(["sh", "-c", "sleep 30 & echo $!"], timeout=8)
    assert out.body["exitCode"] == 0 and out.body["durationMs"] < 5000
    background = int(out.stdout.split()[0])
    assert not gone(background)
    os.kill(background, signal.SIGKILL)


# --------------------------------------------------------------------------
# robustness


@pytest.mark.timeout(20)
def test_garbage_lines_do_not_kill_the_agent(agent: AgentHarness) -> None:
    hostile = [
        b"not json\n",
        b"\xff\xfe\xfa\n",
        b"[1, 2, 3]\n",
        b"{}\n",
        b'{"id": "seven", "op": "ping"}\n',
        b'{"id": true, "op": "ping"}\n',
        b'{"id": 1e400, "op": "ping"}\n',
        b'{"id": NaN, "op": "ping"}\n',
        b"[" * 50_000 + b"\n",
        b"\n",
        b"x" * (3 << 20) + b"\n",  # over the 1 MiB cap
    ]
    for data in hostile:
        agent.send_raw(data)
    for _ in hostile:
        event = agent.wait_for(lambda e: isinstance(e, AgentError))
        assert isinstance(event, AgentError) and event.text.startswith("bad request:")
    rid = agent.send("ping")
    assert agent.reply(rid).ok
    # Well-formed lines with bad fields get an error reply for their id.
    with agent.lock:
        for rid in (99997, 99998, 99999):
            agent.proto.pending[rid] = "x"  # the raw lines below bypass send_request
    agent.send_raw(b'{"id": 99999, "op": 5}\n')
    agent.send_raw(b'{"id": 99998, "op": "exec", "argv": "ls"}\n')
    agent.send_raw(b'{"id": 99997, "op": "pty_in", "pty": 1, "data": "***"}\n')
    for rid in (99997, 99998, 99999):
        reply = agent.reply(rid)
        assert not reply.ok and reply.error is not None
    assert agent.proc.poll() is None
    assert agent.call("ping").ok


@pytest.mark.timeout(20)
def test_a_request_split_across_writes_is_reassembled(agent: AgentHarness) -> None:
    with agent.lock:
        rid, data = agent.proto.send_request("exec", argv=["echo", "split"])
    for i in range(len(data)):
        agent.send_raw(data[i : i + 1])
    assert agent.reply(rid).ok
    assert b"".join(s.data for s in agent.streams(rid)) == b"split\n"


@pytest.mark.timeout(20)
def test_shutdown_in_stdio_mode_answers_then_exits_without_powering_off(
    agent: AgentHarness,
) -> None:
    assert agent.call("shutdown").ok
    assert agent.proc.wait(timeout=5) == 0


# --------------------------------------------------------------------------
# ptys


class PtyScreen:
    """Everything one pty printed, searched by regex from a moving mark."""

    def __init__(self, agent: AgentHarness, pty: int) -> None:
        self.agent = agent
        self.pty = pty
        self.buf = b""
        self.mark = 0

    def expect(self, pattern: bytes, timeout: float = 10.0) -> re.Match[bytes]:
        deadline = time.monotonic() + timeout
        regex = re.compile(pattern)
        while True:
            found = regex.search(self.buf, self.mark)
            if found:
                self.mark = found.end()
                return found
            event = self.agent.wait_for(
                lambda e: isinstance(e, PtyOutput) and e.pty == self.pty,
                deadline - time.monotonic(),
            )
            assert isinstance(event, PtyOutput)
            self.buf += event.data


SHELL = ["bash", "--norc", "--noprofile"]


@pytest.mark.timeout(20)
def test_pty_echo_resize_and_close(agent: AgentHarness) -> None:
    reply = agent.call("pty_open", cols=80, rows=24, argv=SHELL)
    assert reply.ok
    pty = reply.body["pty"]
    assert isinstance(pty, int)
    screen = PtyScreen(agent, pty)

    assert agent.call("pty_in", pty=pty, data=b"echo hi\n").ok
    screen.expect(rb"echo hi\r\n")  # the tty echoes the input...
    screen.expect(rb"(?<=[\r\n])hi\r\n")  # ...then the shell prints its output (after a
    # bracketed-paste escape and a bare \r, hence no ^ anchors here)

    agent.call("pty_in", pty=pty, data=b"stty size; echo TERM=$TERM\n")
    screen.expect(rb"(?<=[\r\n])24 80\r\n")
    screen.expect(rb"(?<=[\r\n])TERM=xterm-256color\r\n")

    assert agent.call("pty_resize", pty=pty, cols=132, rows=43).ok
    agent.call("pty_in", pty=pty, data=b"stty size\n")
    screen.expect(rb"(?<=[\r\n])43 132\r\n")

    # A job-control shell puts a background job in its own process group,
    # yet pty_close still takes it down.
    agent.call("pty_in", pty=pty, data=b"sleep 100 & echo BG=$!\n")
    background = int(screen.expect(rb"(?<=[\r\n])BG=(\d+)\r\n").group(1))

    close = agent.call("pty_close", pty=pty)
    assert close.ok
    exit_event = agent.wait_for(lambda e: isinstance(e, PtyExit) and e.pty == pty)
    assert isinstance(exit_event, PtyExit)
    assert exit_event.signal is not None or exit_event.exit_code is not None
    assert wait_gone(background)
    # The handle is gone: further input is refused, not crashed on.
    reply = agent.call("pty_in", pty=pty, data=b"x")
    assert not reply.ok and reply.error == f"no such pty: {pty}"


@pytest.mark.timeout(20)
def test_pty_default_shell_and_exit_status(agent: AgentHarness) -> None:
    if shutil.which("bash") is None:
        pytest.skip("no bash on this host")
    reply = agent.call("pty_open", cols=100, rows=30)
    assert reply.ok
    pty = reply.body["pty"]
    agent.call("pty_in", pty=pty, data=b"exit 3\n")
    event = agent.wait_for(lambda e: isinstance(e, PtyExit) and e.pty == pty)
    assert event == PtyExit(pty, 3, None)


@pytest.mark.timeout(20)
def test_pty_open_with_a_missing_program_is_refused(agent: AgentHarness) -> None:
    reply = agent.call("pty_open", cols=80, rows=24, argv=["no-such-shell-xyz"])
    assert not reply.ok and reply.error == "no such file or directory: no-such-shell-xyz"
    assert agent.call("ping").ok


# --------------------------------------------------------------------------
# --pid1 supervision, with a pty standing in for the virtio-serial port


@pytest.mark.timeout(30)
def test_pid1_mode_restarts_the_agent_and_reaps_orphans(tmp_path: Path) -> None:
    master, slave = os.openpty()
    pidfile = tmp_path / "agent.pid"
    console = tmp_path / "console"
    argv = [
        sys.executable, "-I", str(AGENT), "--pid1", "--port", os.ttyname(slave),
        "--pidfile", str(pidfile), "--console", str(console), "--no-clock", "--no-poweroff",
    ]  # fmt: skip
    proc = subprocess.Popen(argv, stdin=subprocess.DEVNULL)
    harness = AgentHarness(argv, rfd=master, wfd=master, proc=proc)
    try:
        first = harness.wait_for(lambda e: isinstance(e, Ready))
        assert isinstance(first, Ready) and first.pid != proc.pid
        assert int(pidfile.read_text()) == first.pid
        assert console.read_bytes() == b"RIGD-AGENT-READY\n"
        assert harness.call("ping").ok

        # An orphan left behind by a command is reaped by the supervisor.
        out = harness.exec(["sh", "-c", "sleep 0.3 & echo $!"])
        orphan = int(out.stdout.split()[0])
        deadline = time.monotonic() + 5
        while os.path.exists(f"/proc/{orphan}") and time.monotonic() < deadline:
            time.sleep(0.05)
        assert not os.path.exists(f"/proc/{orphan}"), "orphan was not reaped"

        # The agent dies; the supervisor starts a new one, which says ready again.
        os.kill(first.pid, signal.SIGKILL)
        second = harness.wait_for(lambda e: isinstance(e, Ready))
        assert isinstance(second, Ready) and second.pid not in (first.pid, proc.pid)
        deadline = time.monotonic() + 5
        while int(pidfile.read_text()) != second.pid and time.monotonic() < deadline:
            time.sleep(0.05)
        assert int(pidfile.read_text()) == second.pid
        assert harness.call("ping").ok
        assert proc.poll() is None
        assert console.read_bytes() == b"RIGD-AGENT-READY\n"  # announced once per boot
    finally:
        with _suppress():
            os.kill(int(pidfile.read_text()), signal.SIGKILL)
        proc.kill()  # the supervisor ignores SIGTERM, as PID 1 must
        proc.wait()
        os.close(slave)
        os.close(master)
        harness.reader.join(5)


@pytest.mark.timeout(20)
def test_port_mode_waits_for_a_late_port_and_survives_host_silence(tmp_path: Path) -> None:
    # The port does not exist yet: the agent must keep retrying, not exit.
    link = tmp_path / "rigd.agent"
    master, slave = os.openpty()
    argv = [
        sys.executable, "-I", str(AGENT), "--port", str(link),
        "--console", "", "--no-clock", "--no-poweroff",
    ]  # fmt: skip
    proc = subprocess.Popen(argv, stdin=subprocess.DEVNULL)
    harness = AgentHarness(argv, rfd=master, wfd=master, proc=proc)
    try:
        time.sleep(0.5)
        assert proc.poll() is None
        link.symlink_to(os.ttyname(slave))
        ready = harness.wait_for(lambda e: isinstance(e, Ready))
        assert isinstance(ready, Ready) and ready.pid == proc.pid
        out = harness.exec(["echo", "over the port"])
        assert out.stdout == b"over the port\n"
        # A tty port is put in raw mode: a canonical-mode tty would cut this
        # 130 KB request line at 4 KiB and echo it back.
        data = bytes(range(256)) * 400
        out = harness.exec(["cat"], stdin=data)
        assert out.stdout == data
    finally:
        proc.kill()
        proc.wait()
        os.close(slave)
        os.close(master)
        harness.reader.join(5)
