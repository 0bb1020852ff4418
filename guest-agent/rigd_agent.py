#!/usr/bin/env python3
"""rigd in-guest agent, wire protocol v1 (see docs/guest-protocol.md).

How this works
--------------
The agent reads one JSON request per line from its channel (a virtio-serial
port in a guest, stdin/stdout in tests), answers each with one final reply
line, and may stream events for a request before that reply.  Every request
that can block (exec, pty_open, pty_close, shutdown) runs on its own thread;
quick ones (ping, hello, pty_in, pty_resize) run inline on the reader thread
so their order is kept.  All writers share one lock on the channel, so lines
never interleave.

It runs from a read-only tools disk with its own interpreter and libc, inside
an image we know nothing about: it uses only the Python 3.11 standard
library, and every child it starts gets a clean environment (never the
interpreter's PYTHONHOME or library path) so the child runs on the image's
own libc.

In ``--pid1`` mode the process is the guest's init: it forks, the parent
stays PID 1, reaps every child forever and restarts the agent child when it
dies; the child runs the agent.  PID 1 must never exit (the kernel panics),
so its loop swallows every error.

The host is trusted, but lines can arrive garbled: nothing a line contains
may crash the agent.  Every line read is capped at 1 MiB.
"""

from __future__ import annotations

import argparse
import base64
import binascii
import contextlib
import fcntl
import json
import os
import re
import selectors
import shutil
import signal
import socket
import struct
import subprocess
import sys
import termios
import threading
import time
import traceback
from collections.abc import Callable
from typing import Any

PROTO = 1
AGENT = "rigd-agent/1"
PORT_NAME = "rigd.agent"
MAX_LINE = 1 << 20  # bytes per line, newline excluded, both directions
CHUNK = 48 * 1024  # raw bytes per streamed chunk (64 KiB once base64'd)
DEFAULT_MAX_OUTPUT = 2 << 20  # bytes per exec stream
LINGER_S = 1.0  # how long output is still forwarded after the leader exits
KILL_GIVE_UP_S = 5.0  # after SIGKILL, stop waiting for a process stuck in D state
PTY_CLOSE_GRACE_S = 1.0  # SIGHUP, then SIGKILL after this long
PTY_DRAIN_IDLE_S = 0.05  # after the shell exits, stop once the pty is quiet this long
PTY_DRAIN_MAX_S = 1.0
PTY_INPUT_BACKLOG = 4 << 20
MAX_ERROR_TEXT = 4096
CLEAN_PATH = "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"
TERM = "xterm-256color"
BUSYBOX = "/.rigd/bin/busybox"
RB_POWER_OFF = 0x4321FEDC
PR_SET_CHILD_SUBREAPER = 36
RNDADDENTROPY = 0x40085203  # _IOW('R', 0x03, int[2])
RNDRESEEDCRNG = 0x5207  # _IO('R', 0x07)
SIOCSIFHWADDR = 0x8924
ARPHRD_ETHER = 1
MACHINE_ID_FILES = ("etc/machine-id", "var/lib/dbus/machine-id")


def log(msg: str) -> None:
    """Diagnostics go to stderr (the console in a guest), never to the channel."""
    with contextlib.suppress(Exception):
        sys.stderr.write(f"rigd-agent[{os.getpid()}]: {msg}\n")
        sys.stderr.flush()


# --------------------------------------------------------------------------
# small helpers


class BadRequest(Exception):
    """A request is well-formed JSON but a field is missing or has a wrong type."""


class Refused(Exception):
    """A valid request that cannot be done here (bad cwd, unknown pty, …)."""


def clip(text: str, limit: int = MAX_ERROR_TEXT) -> str:
    return text if len(text) <= limit else text[:limit] + "…"


def describe_oserror(exc: OSError, what: str | None = None) -> str:
    """'no such file or directory: foo' — lower-case reason, then the culprit."""
    reason = (exc.strerror or str(exc) or type(exc).__name__).lower()
    name = what if what is not None else exc.filename
    if name is None:
        return reason
    if isinstance(name, bytes):
        name = name.decode("utf-8", "backslashreplace")
    return f"{reason}: {name}"


def clean_env(extra: dict[str, str] | None = None, term: str | None = None) -> dict[str, str]:
    """The only environment children ever see: nothing leaks from the agent's own."""
    env = {"PATH": CLEAN_PATH, "HOME": "/root", "LANG": "C.UTF-8"}
    if term is not None:
        env["TERM"] = term
    if extra:
        env.update(extra)
    return env


def default_cwd() -> str:
    return "/root" if os.path.isdir("/root") else "/"


def b64(data: bytes) -> str:
    return base64.b64encode(data).decode("ascii")


def _reject_constant(name: str) -> Any:
    raise ValueError(f"{name} is not JSON")


def field_int(
    req: dict[str, Any],
    name: str,
    *,
    default: int | None = None,
    lo: int | None = None,
    hi: int | None = None,
    required: bool = False,
) -> int | None:
    if name not in req or req[name] is None:
        if required:
            raise BadRequest(f"{name} is required")
        return default
    value = req[name]
    if type(value) is not int:
        raise BadRequest(f"{name} must be an integer")
    if (lo is not None and value < lo) or (hi is not None and value > hi):
        raise BadRequest(f"{name} must be between {lo} and {hi}")
    return value


def field_str(req: dict[str, Any], name: str) -> str | None:
    value = req.get(name)
    if value is None:
        return None
    if not isinstance(value, str) or "\0" in value:
        raise BadRequest(f"{name} must be a string without NUL")
    return value


def field_argv(req: dict[str, Any], *, required: bool) -> list[str] | None:
    argv = req.get("argv")
    if argv is None:
        if required:
            raise BadRequest("argv is required")
        return None
    if not isinstance(argv, list) or not argv or not all(isinstance(a, str) and "\0" not in a for a in argv):
        raise BadRequest("argv must be a non-empty list of strings without NUL")
    if not argv[0]:
        raise BadRequest("argv[0] must not be empty")
    return argv


def field_env(req: dict[str, Any]) -> dict[str, str] | None:
    env = req.get("env")
    if env is None:
        return None
    if not isinstance(env, dict):
        raise BadRequest("env must be an object of strings")
    for key, value in env.items():
        if not key or "=" in key or "\0" in key:
            raise BadRequest(f"env key {clip(key, 100)!r} is not a valid name")
        if not isinstance(value, str) or "\0" in value:
            raise BadRequest(f"env[{clip(key, 100)!r}] must be a string without NUL")
    return env


def field_b64(req: dict[str, Any], name: str, *, required: bool = False) -> bytes | None:
    value = req.get(name)
    if value is None:
        if required:
            raise BadRequest(f"{name} is required")
        return None
    if not isinstance(value, str):
        raise BadRequest(f"{name} must be a base64 string")
    try:
        return base64.b64decode(value, validate=True)
    except (binascii.Error, ValueError):
        raise BadRequest(f"{name} is not valid base64") from None


def check_cwd(cwd: str) -> None:
    try:
        st = os.stat(cwd)
    except OSError as exc:
        raise Refused("cwd: " + describe_oserror(exc, cwd)) from None
    if not (st.st_mode & 0o170000 == 0o040000):
        raise Refused(f"cwd: not a directory: {cwd}")


def status_fields(returncode: int | None) -> dict[str, int | None]:
    if returncode is None:
        return {"exitCode": None, "signal": None}
    if returncode < 0:
        return {"exitCode": None, "signal": -returncode}
    return {"exitCode": returncode, "signal": None}


def kill_tree(leader: int, sig: int) -> None:
    """Signal the leader's process group and every process left in its session.

    The leader started with setsid(), so its pid names both its group and its
    session; job-control shells move jobs into other groups of the same
    session, which killpg alone would miss.
    """
    with contextlib.suppress(OSError):
        os.killpg(leader, sig)
    try:
        entries = os.listdir("/proc")
    except OSError:
        return
    for entry in entries:
        if not entry.isdigit():
            continue
        try:
            with open(f"/proc/{entry}/stat", "rb") as f:
                stat = f.read()
            # fields after the last ')' : state ppid pgrp session ...
            fields = stat[stat.rindex(b")") + 2 :].split()
            if int(fields[3]) == leader:
                os.kill(int(entry), sig)
        except (OSError, ValueError, IndexError):
            continue


def open_pidfd(pid: int) -> int | None:
    try:
        return os.pidfd_open(pid)
    except (AttributeError, OSError):
        return None


def close_quietly(fd: int | None) -> None:
    if fd is not None:
        with contextlib.suppress(OSError):
            os.close(fd)


# --------------------------------------------------------------------------
# framing


class LineReader:
    """Splits a byte stream into lines of at most ``max_line`` bytes.

    A longer line is dropped up to its next newline and reported once as
    ``None`` in the returned list.
    """

    def __init__(self, max_line: int = MAX_LINE) -> None:
        self.max_line = max_line
        self.buf = bytearray()
        self.discarding = False

    def reset(self) -> None:
        self.buf.clear()
        self.discarding = False

    def feed(self, data: bytes) -> list[bytes | None]:
        out: list[bytes | None] = []
        pos, n = 0, len(data)
        while pos < n:
            nl = data.find(b"\n", pos)
            end = nl if nl >= 0 else n
            if self.discarding:
                if nl >= 0:
                    self.discarding = False
            elif len(self.buf) + (end - pos) > self.max_line:
                self.buf.clear()
                out.append(None)
                self.discarding = nl < 0
            elif nl >= 0:
                self.buf += data[pos:end]
                out.append(bytes(self.buf))
                self.buf.clear()
            else:
                self.buf += data[pos:end]
            pos = end + 1 if nl >= 0 else n
        return out


class Channel:
    """The write side of the port: one lock, whole lines, nothing over the cap."""

    def __init__(self, wfd: int) -> None:
        self.wfd = wfd
        self.lock = threading.Lock()

    def swap(self, wfd: int) -> None:
        with self.lock:
            self.wfd = wfd

    def send(self, obj: dict[str, Any]) -> bool:
        line = json.dumps(obj, separators=(",", ":"), ensure_ascii=True).encode("ascii")
        if len(line) > MAX_LINE:
            if "id" in obj:
                obj = {"id": obj["id"], "ok": False, "error": "reply too large for one line"}
            else:
                obj = {"ev": "error", "error": "event too large for one line"}
            line = json.dumps(obj, separators=(",", ":")).encode("ascii")
        view = memoryview(line + b"\n")
        with self.lock:
            while view:
                try:
                    n = os.write(self.wfd, view)
                except BlockingIOError:
                    time.sleep(0.01)
                    continue
                except OSError as exc:
                    log(f"write to host failed: {exc}")
                    return False
                view = view[n:]
        return True


# --------------------------------------------------------------------------
# ptys


class Pty:
    def __init__(self, handle: int, proc: subprocess.Popen[bytes], master: int) -> None:
        self.handle = handle
        self.proc = proc
        self.master = master  # owned by the reader thread; closed under ``lock``
        self.in_fd = os.dup(master)  # owned by the writer thread
        self.lock = threading.Lock()
        self.closed = False
        self.cond = threading.Condition()
        self.inq: list[bytes] = []
        self.backlog = 0
        self.stop = False


def _set_ctty() -> None:  # runs in the child between fork and exec
    fcntl.ioctl(0, termios.TIOCSCTTY, 0)


def _winsize(rows: int, cols: int) -> bytes:
    return struct.pack("HHHH", rows, cols, 0, 0)


# --------------------------------------------------------------------------
# the agent


class Agent:
    def __init__(
        self, chan: Channel, *, may_set_clock: bool, may_power_off: bool, sysroot: str | None = None
    ) -> None:
        self.chan = chan
        self.may_set_clock = may_set_clock  # also: may seed the kernel RNG and set a MAC
        self.may_power_off = may_power_off
        self.sysroot = sysroot  # where /etc/machine-id is written; None: nowhere
        self.lock = threading.Lock()
        self.ptys: dict[int, Pty] = {}
        self.next_pty = 1
        self.procs: dict[int, subprocess.Popen[bytes]] = {}  # running exec leaders
        self.shutting_down = False
        self.workers: set[threading.Thread] = set()
        self.inline: dict[str, Callable[[int, dict[str, Any]], None]] = {
            "ping": self.op_ping,
            "hello": self.op_hello,
            "reseed": self.op_reseed,
            "pty_in": self.op_pty_in,
            "pty_resize": self.op_pty_resize,
        }
        self.threaded: dict[str, Callable[[int, dict[str, Any]], None]] = {
            "exec": self.op_exec,
            "pty_open": self.op_pty_open,
            "pty_close": self.op_pty_close,
            "shutdown": self.op_shutdown,
        }

    # ---- replies

    def ok(self, rid: int, **fields: Any) -> None:
        self.chan.send({"id": rid, "ok": True, **fields})

    def fail(self, rid: int, text: str) -> None:
        self.chan.send({"id": rid, "ok": False, "error": clip(text)})

    def bad_line(self, text: str) -> None:
        self.chan.send({"ev": "error", "error": clip("bad request: " + text)})

    # ---- dispatch

    def handle_line(self, line: bytes | None) -> None:
        """Never raises: whatever the line holds, the agent carries on."""
        try:
            self._handle_line(line)
        except Exception as exc:  # a bug here must not kill the agent
            log("internal error handling a line:\n" + traceback.format_exc())
            with contextlib.suppress(Exception):
                self.chan.send({"ev": "error", "error": clip(f"internal error: {exc!r}")})

    def _handle_line(self, line: bytes | None) -> None:
        if line is None:
            self.bad_line(f"line longer than {MAX_LINE} bytes")
            return
        try:
            req = json.loads(line.decode("utf-8"), parse_constant=_reject_constant)
        except UnicodeDecodeError:
            self.bad_line("line is not UTF-8")
            return
        except (ValueError, RecursionError) as exc:
            self.bad_line(f"not JSON ({clip(str(exc), 200)})")
            return
        if not isinstance(req, dict):
            self.bad_line("a request must be a JSON object")
            return
        rid = req.get("id")
        if type(rid) is not int:
            self.bad_line("id must be an integer")
            return
        op = req.get("op")
        if not isinstance(op, str):
            self.fail(rid, "bad request: op must be a string")
            return
        if op in self.inline:
            self.run(self.inline[op], rid, req)
        elif op in self.threaded:
            try:
                worker = threading.Thread(
                    target=self.run,
                    args=(self.threaded[op], rid, req),
                    name=f"{op}-{rid}",
                    daemon=True,
                )
                with self.lock:
                    self.workers.add(worker)
                worker.start()
            except RuntimeError as exc:  # cannot start a thread: out of resources
                self.fail(rid, f"cannot start {op}: {exc}")
        else:
            self.fail(rid, f"unknown op: {clip(op, 100)}")

    def run(self, fn: Callable[[int, dict[str, Any]], None], rid: int, req: dict[str, Any]) -> None:
        try:
            self._run(fn, rid, req)
        finally:
            with self.lock:
                self.workers.discard(threading.current_thread())

    def _run(self, fn: Callable[[int, dict[str, Any]], None], rid: int, req: dict[str, Any]) -> None:
        try:
            fn(rid, req)
        except BadRequest as exc:
            self.fail(rid, f"bad request: {exc}")
        except Refused as exc:
            self.fail(rid, str(exc))
        except OSError as exc:
            self.fail(rid, describe_oserror(exc))
        except Exception as exc:
            log(f"internal error in request {rid}:\n" + traceback.format_exc())
            self.fail(rid, f"internal error: {exc!r}")

    # ---- ops

    def op_ping(self, rid: int, req: dict[str, Any]) -> None:
        self.ok(rid)

    def op_hello(self, rid: int, req: dict[str, Any]) -> None:
        host_time = req.get("time")
        clock_set = False
        extra: dict[str, Any] = {}
        if host_time is not None:
            if type(host_time) not in (int, float) or not (0 < host_time < 1e11):
                raise BadRequest("time must be seconds since the epoch")
            skew = host_time - time.time()
            extra["clockSkewS"] = round(skew, 3)
            if abs(skew) > 1.0 and self.may_set_clock:
                try:
                    time.clock_settime(time.CLOCK_REALTIME, float(host_time))
                    clock_set = True
                except OSError as exc:
                    extra["clockError"] = describe_oserror(exc)
        u = os.uname()
        try:
            with open("/proc/uptime") as f:
                boot_s = float(f.read().split()[0])
        except (OSError, ValueError, IndexError):
            boot_s = time.monotonic()
        self.ok(
            rid,
            proto=PROTO,
            agent=AGENT,
            pid=os.getpid(),
            kernel=f"{u.sysname} {u.nodename} {u.release} {u.version} {u.machine}",
            hostname=u.nodename,
            bootS=boot_s,
            clockSet=clock_set,
            **extra,
        )

    def op_reseed(self, rid: int, req: dict[str, Any]) -> None:
        """Make this machine its own after a snapshot restore (docs/guest-protocol.md)."""
        machine_id = field_str(req, "machineId")
        if machine_id is not None and not re.fullmatch(r"[0-9a-f]{32}", machine_id):
            raise BadRequest("machineId must be 32 lower-case hex digits")
        entropy = field_b64(req, "entropy")
        if entropy is not None and not 16 <= len(entropy) <= 512:
            raise BadRequest("entropy must be 16 to 512 bytes")
        mac = field_str(req, "mac")
        if mac is not None and not re.fullmatch(r"[0-9a-f]{2}(:[0-9a-f]{2}){5}", mac):
            raise BadRequest("mac must be six lower-case hex pairs")
        out: dict[str, Any] = {"entropyCredited": False, "crngReseeded": False,
                               "machineIdFiles": [], "macSet": []}
        if entropy is not None and self.may_set_clock:
            out.update(seed_rng(entropy))
        if machine_id is not None and self.sysroot is not None:
            out.update(write_machine_id(self.sysroot, machine_id))
        if mac is not None and self.may_set_clock:
            out.update(set_mac(mac))
        self.ok(rid, **out)

    def op_exec(self, rid: int, req: dict[str, Any]) -> None:
        argv = field_argv(req, required=True)
        assert argv is not None
        cwd = field_str(req, "cwd")
        env = field_env(req)
        stdin = field_b64(req, "stdin")
        timeout_ms = field_int(req, "timeoutMs", lo=1, hi=2**40)
        max_out = field_int(req, "maxOutput", default=DEFAULT_MAX_OUTPUT, lo=0, hi=2**40)
        assert max_out is not None
        if cwd is not None:
            check_cwd(cwd)
        t0 = time.monotonic()
        proc = subprocess.Popen(
            argv,
            stdin=subprocess.PIPE if stdin is not None else subprocess.DEVNULL,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            cwd=cwd if cwd is not None else default_cwd(),
            env=clean_env(env),
            start_new_session=True,
            close_fds=True,
            bufsize=0,
        )
        with self.lock:
            self.procs[rid] = proc
        try:
            result = self._run_exec(rid, proc, stdin, timeout_ms, max_out, t0)
        finally:
            with self.lock:
                self.procs.pop(rid, None)
        self.ok(rid, **result)

    def _run_exec(
        self,
        rid: int,
        proc: subprocess.Popen[bytes],
        stdin: bytes | None,
        timeout_ms: int | None,
        max_out: int,
        t0: float,
    ) -> dict[str, Any]:
        assert proc.stdout is not None and proc.stderr is not None
        if stdin is not None:
            assert proc.stdin is not None
            threading.Thread(target=self._feed, args=(proc.stdin, stdin), daemon=True).start()
        sent = {1: 0, 2: 0}
        truncated = {1: False, 2: False}
        sel = selectors.DefaultSelector()
        pipes = {1: proc.stdout, 2: proc.stderr}
        for fd_no, pipe in pipes.items():
            sel.register(pipe, selectors.EVENT_READ, fd_no)
        pidfd = open_pidfd(proc.pid)
        if pidfd is not None:
            sel.register(pidfd, selectors.EVENT_READ, 0)
        deadline = t0 + timeout_ms / 1000 if timeout_ms is not None else None
        open_pipes = 2
        leader_done: float | None = None
        killed_at: float | None = None
        timed_out = False
        try:
            while open_pipes:
                now = time.monotonic()
                if leader_done is None and proc.poll() is not None:
                    leader_done = now
                    if pidfd is not None:
                        sel.unregister(pidfd)
                        close_quietly(pidfd)
                        pidfd = None
                if leader_done is not None and now - leader_done >= LINGER_S:
                    break  # a background process holds the pipes: stop waiting for EOF
                if leader_done is None and deadline is not None and now >= deadline:
                    kill_tree(proc.pid, signal.SIGKILL)
                    timed_out, killed_at, deadline = True, now, None
                if killed_at is not None and leader_done is None and now - killed_at > KILL_GIVE_UP_S:
                    break  # the leader ignores SIGKILL (stuck in the kernel): give up
                waits = []
                if leader_done is not None:
                    waits.append(leader_done + LINGER_S - now)
                elif deadline is not None:
                    waits.append(deadline - now)
                if leader_done is None and (pidfd is None or killed_at is not None):
                    waits.append(0.1)  # no pidfd: notice the leader's exit by polling
                timeout = max(0.0, min(waits)) if waits else None
                for key, _ in sel.select(timeout):
                    if key.data == 0:
                        continue  # pidfd readable: the leader exited; poll() above reaps it
                    try:
                        chunk = os.read(key.fd, CHUNK)
                    except BlockingIOError:
                        continue
                    except OSError:
                        chunk = b""
                    if not chunk:
                        sel.unregister(key.fileobj)
                        pipes.pop(key.data).close()
                        open_pipes -= 1
                        continue
                    fd_no = key.data
                    room = max_out - sent[fd_no]
                    if len(chunk) > room:
                        chunk = chunk[: max(room, 0)]
                        truncated[fd_no] = True
                    if chunk:
                        sent[fd_no] += len(chunk)
                        self.chan.send({"id": rid, "ev": "out", "fd": fd_no, "data": b64(chunk)})
        finally:
            sel.close()
            close_quietly(pidfd)
            for pipe in pipes.values():
                # Someone still holds the other end: keep draining so it never
                # blocks on a full pipe (and never gets SIGPIPE) after we are done.
                threading.Thread(target=self._drain, args=(pipe,), daemon=True).start()
        returncode = proc.poll()
        if returncode is None and killed_at is None:
            try:
                returncode = proc.wait(timeout=KILL_GIVE_UP_S)
            except subprocess.TimeoutExpired:
                returncode = None
        if returncode is None:
            threading.Thread(target=proc.wait, daemon=True).start()  # reap it later
        return {
            **status_fields(returncode),
            "timedOut": timed_out,
            "truncated": {"stdout": truncated[1], "stderr": truncated[2]},
            "durationMs": int((time.monotonic() - t0) * 1000),
        }

    @staticmethod
    def _feed(pipe: Any, data: bytes) -> None:
        try:
            view = memoryview(data)
            fd = pipe.fileno()
            while view:
                view = view[os.write(fd, view) :]
        except OSError:
            pass  # the child closed its stdin or died: not our error
        finally:
            with contextlib.suppress(OSError):
                pipe.close()

    @staticmethod
    def _drain(pipe: Any) -> None:
        try:
            while os.read(pipe.fileno(), 65536):
                pass
        except OSError:
            pass
        finally:
            with contextlib.suppress(OSError):
                pipe.close()

    # ---- ptys

    def op_pty_open(self, rid: int, req: dict[str, Any]) -> None:
        cols = field_int(req, "cols", default=80, lo=1, hi=65535)
        rows = field_int(req, "rows", default=24, lo=1, hi=65535)
        assert cols is not None and rows is not None
        argv = field_argv(req, required=False)
        cwd = field_str(req, "cwd")
        env = field_env(req)
        if cwd is not None:
            check_cwd(cwd)
        if argv is None:
            bash = shutil.which("bash", path=CLEAN_PATH)
            sh = shutil.which("sh", path=CLEAN_PATH)
            if bash:
                argv = [bash, "-l"]
            elif sh:
                argv = [sh]
            else:
                raise Refused("no shell in the image (neither bash nor sh on PATH)")
        master, slave = os.openpty()
        try:
            fcntl.ioctl(slave, termios.TIOCSWINSZ, _winsize(rows, cols))
            with contextlib.suppress(termios.error):
                attrs = termios.tcgetattr(slave)
                attrs[0] |= getattr(termios, "IUTF8", 0)
                termios.tcsetattr(slave, termios.TCSANOW, attrs)
            proc = subprocess.Popen(
                argv,
                stdin=slave,
                stdout=slave,
                stderr=slave,
                cwd=cwd if cwd is not None else default_cwd(),
                env=clean_env(env, term=TERM),
                start_new_session=True,
                preexec_fn=_set_ctty,
                close_fds=True,
            )
        except BaseException:
            close_quietly(master)
            raise
        finally:
            close_quietly(slave)
        os.set_blocking(master, False)
        with self.lock:
            handle = self.next_pty
            self.next_pty += 1
            pty = Pty(handle, proc, master)
            self.ptys[handle] = pty
        # The reply goes out before any pty_out for this handle.
        self.ok(rid, pty=handle)
        threading.Thread(target=self._pty_reader, args=(pty,), daemon=True).start()
        threading.Thread(target=self._pty_writer, args=(pty,), daemon=True).start()

    def _get_pty(self, req: dict[str, Any]) -> Pty:
        handle = field_int(req, "pty", required=True)
        with self.lock:
            pty = self.ptys.get(handle)  # type: ignore[arg-type]
        if pty is None or pty.closed:
            raise Refused(f"no such pty: {handle}")
        return pty

    def op_pty_in(self, rid: int, req: dict[str, Any]) -> None:
        pty = self._get_pty(req)
        data = field_b64(req, "data", required=True)
        assert data is not None
        with pty.cond:
            if pty.backlog + len(data) > PTY_INPUT_BACKLOG:
                raise Refused(f"pty {pty.handle}: input backlog full")
            pty.inq.append(data)
            pty.backlog += len(data)
            pty.cond.notify()
        self.ok(rid)

    def op_pty_resize(self, rid: int, req: dict[str, Any]) -> None:
        pty = self._get_pty(req)
        cols = field_int(req, "cols", required=True, lo=1, hi=65535)
        rows = field_int(req, "rows", required=True, lo=1, hi=65535)
        assert cols is not None and rows is not None
        with pty.lock:
            if pty.closed:
                raise Refused(f"no such pty: {pty.handle}")
            # The kernel sends SIGWINCH to the foreground process group.
            fcntl.ioctl(pty.master, termios.TIOCSWINSZ, _winsize(rows, cols))
        self.ok(rid)

    def op_pty_close(self, rid: int, req: dict[str, Any]) -> None:
        pty = self._get_pty(req)
        self._kill_pty(pty)
        self.ok(rid)

    def _kill_pty(self, pty: Pty) -> None:
        proc = pty.proc
        if proc.poll() is None:
            kill_tree(proc.pid, signal.SIGHUP)
            kill_tree(proc.pid, signal.SIGCONT)
            with contextlib.suppress(subprocess.TimeoutExpired):
                proc.wait(timeout=PTY_CLOSE_GRACE_S)
        kill_tree(proc.pid, signal.SIGKILL)

    def _pty_writer(self, pty: Pty) -> None:
        fd = pty.in_fd
        try:
            while True:
                with pty.cond:
                    while not pty.inq and not pty.stop:
                        pty.cond.wait()
                    if pty.stop:
                        return
                    data = pty.inq.pop(0)
                    pty.backlog -= len(data)
                view = memoryview(data)
                while view and not pty.stop:
                    try:
                        view = view[os.write(fd, view) :]
                    except BlockingIOError:
                        # The shell is not reading; wait, but notice a stop.
                        sel = selectors.DefaultSelector()
                        try:
                            sel.register(fd, selectors.EVENT_WRITE)
                            sel.select(0.2)
                        finally:
                            sel.close()
        except OSError:
            return  # the pty is gone
        finally:
            close_quietly(fd)

    def _pty_reader(self, pty: Pty) -> None:
        proc = pty.proc
        sel = selectors.DefaultSelector()
        sel.register(pty.master, selectors.EVENT_READ, "pty")
        pidfd = open_pidfd(proc.pid)
        if pidfd is not None:
            sel.register(pidfd, selectors.EVENT_READ, "pid")
        exited_at: float | None = None
        eof = False
        try:
            while not eof:
                if exited_at is None and proc.poll() is not None:
                    exited_at = time.monotonic()
                    if pidfd is not None:
                        sel.unregister(pidfd)
                        close_quietly(pidfd)
                        pidfd = None
                if exited_at is not None:
                    if time.monotonic() - exited_at > PTY_DRAIN_MAX_S:
                        break
                    timeout: float | None = PTY_DRAIN_IDLE_S
                else:
                    timeout = None if pidfd is not None else 0.1
                ready = sel.select(timeout)
                if not ready and exited_at is not None:
                    break  # the shell is gone and the pty went quiet
                for key, _ in ready:
                    if key.data != "pty":
                        continue
                    try:
                        data = os.read(pty.master, CHUNK)
                    except BlockingIOError:
                        continue
                    except OSError:
                        data = b""  # EIO: every slave end is closed
                    if not data:
                        eof = True
                        break
                    self.chan.send({"ev": "pty_out", "pty": pty.handle, "data": b64(data)})
        except Exception:
            log(f"pty {pty.handle} reader failed:\n" + traceback.format_exc())
        finally:
            sel.close()
            close_quietly(pidfd)
            with pty.lock:
                pty.closed = True
                close_quietly(pty.master)  # hangs up anything still holding the slave
            with pty.cond:
                pty.stop = True
                pty.cond.notify()
        try:
            returncode: int | None = proc.wait()
        except Exception:
            returncode = None
        with self.lock:
            self.ptys.pop(pty.handle, None)
        self.chan.send({"ev": "pty_exit", "pty": pty.handle, **status_fields(returncode)})

    # ---- shutdown

    def op_shutdown(self, rid: int, req: dict[str, Any]) -> None:
        self.shutting_down = True
        self.ok(rid)
        if not self.may_power_off:
            log("shutdown requested: exiting (this mode never powers the machine off)")
            self.terminate_children()
            os._exit(0)
        log("shutdown requested: syncing and powering off")
        self.terminate_children()
        os.sync()
        power_off()

    def finish(self, grace: float) -> None:
        """The host hung up: kill what runs, let in-flight requests answer, briefly."""
        self.terminate_children()
        deadline = time.monotonic() + grace
        with self.lock:
            workers = list(self.workers)
        for worker in workers:
            worker.join(max(0.0, deadline - time.monotonic()))

    def terminate_children(self) -> None:
        with self.lock:
            leaders = [p.pid for p in self.procs.values() if p.returncode is None]
            leaders += [p.proc.pid for p in self.ptys.values() if p.proc.returncode is None]
        for pid in leaders:
            kill_tree(pid, signal.SIGKILL)


def seed_rng(data: bytes) -> dict[str, Any]:
    """Credit host entropy to the kernel pool and force the CRNG to reseed.

    A restored snapshot carries its RNG state: without this, clones would
    draw the same "random" numbers until the kernel reseeds on its own.
    """
    out: dict[str, Any] = {}
    try:
        fd = os.open("/dev/urandom", os.O_WRONLY | os.O_CLOEXEC)
    except OSError as exc:
        return {"rngError": describe_oserror(exc)}
    try:
        try:
            # struct rand_pool_info { int entropy_count; int buf_size; __u32 buf[]; }
            fcntl.ioctl(fd, RNDADDENTROPY, struct.pack("ii", len(data) * 8, len(data)) + data)
            out["entropyCredited"] = True
        except OSError as exc:
            os.write(fd, data)  # mixed in, at least, though not credited
            out["rngError"] = describe_oserror(exc, "RNDADDENTROPY")
        try:
            fcntl.ioctl(fd, RNDRESEEDCRNG)
            out["crngReseeded"] = True
        except OSError as exc:
            out["rngError"] = describe_oserror(exc, "RNDRESEEDCRNG")
    finally:
        os.close(fd)
    return out


def write_machine_id(sysroot: str, machine_id: str) -> dict[str, Any]:
    """Write ``/etc/machine-id`` (and dbus's copy when it is a file of its own)."""
    written: list[str] = []
    errors: list[str] = []
    for rel in MACHINE_ID_FILES:
        path = os.path.join(sysroot, rel)
        optional = rel != MACHINE_ID_FILES[0]
        if os.path.islink(path) or (optional and not os.path.exists(path)):
            continue  # e.g. dbus's link to /etc/machine-id, or no dbus at all
        if not os.path.isdir(os.path.dirname(path)):
            continue
        tmp = f"{path}.rigd-{os.getpid()}"
        try:
            fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_NOFOLLOW | os.O_CLOEXEC, 0o444)
            try:
                os.write(fd, (machine_id + "\n").encode())
                os.fsync(fd)
            finally:
                os.close(fd)
            os.replace(tmp, path)
            written.append("/" + rel)
        except OSError as exc:
            with contextlib.suppress(OSError):
                os.unlink(tmp)
            errors.append(describe_oserror(exc, "/" + rel))
    out: dict[str, Any] = {"machineIdFiles": written}
    if errors:
        out["machineIdError"] = "; ".join(errors)
    return out


def set_mac(mac: str) -> dict[str, Any]:
    """Give the first virtio NIC the rig's MAC (its device state came from the snapshot)."""
    try:
        names = sorted(os.listdir("/sys/class/net"))
    except OSError:
        return {"macSet": []}
    for name in names:
        try:
            driver = os.path.basename(os.readlink(f"/sys/class/net/{name}/device/driver"))
        except OSError:
            continue
        if driver != "virtio_net":
            continue
        ifreq = struct.pack("16sH6s8x", name.encode()[:15], ARPHRD_ETHER, bytes.fromhex(mac.replace(":", "")))
        try:
            with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as s:
                fcntl.ioctl(s.fileno(), SIOCSIFHWADDR, ifreq)
        except OSError as exc:
            return {"macSet": [], "macError": describe_oserror(exc, name)}
        return {"macSet": [name]}
    return {"macSet": []}


def power_off() -> None:
    try:
        import ctypes

        libc = ctypes.CDLL(None, use_errno=True)
        libc.reboot(ctypes.c_int(RB_POWER_OFF))
        log(f"reboot(RB_POWER_OFF) failed: errno {ctypes.get_errno()}")
    except Exception as exc:
        log(f"reboot() via ctypes unavailable: {exc!r}")
    if os.path.exists(BUSYBOX):
        with contextlib.suppress(Exception):
            subprocess.run([BUSYBOX, "poweroff", "-f"], env=clean_env(), check=False)
    log("could not power off")


# --------------------------------------------------------------------------
# the port


def find_port() -> str | None:
    direct = f"/dev/virtio-ports/{PORT_NAME}"
    if os.path.exists(direct):
        return direct
    base = "/sys/class/virtio-ports"
    try:
        names = sorted(os.listdir(base))
    except OSError:
        return None
    for vport in names:
        try:
            with open(f"{base}/{vport}/name") as f:
                if f.read().strip() == PORT_NAME:
                    return f"/dev/{vport}"
        except OSError:
            continue
    return None


def open_port(spec: str) -> int:
    """Open the channel device, retrying forever (it may appear late or be held)."""
    delay = 0.05
    last_complaint = ""
    while True:
        path = find_port() if spec == "auto" else spec
        complaint = ""
        if path is None:
            complaint = f"no virtio port named {PORT_NAME} yet"
        else:
            try:
                fd = os.open(path, os.O_RDWR | os.O_NOCTTY | os.O_CLOEXEC)
            except OSError as exc:
                complaint = f"cannot open {path}: {describe_oserror(exc, '')}".rstrip(": ")
            else:
                if os.isatty(fd):
                    with contextlib.suppress(termios.error):
                        import tty

                        tty.setraw(fd)
                return fd
        if complaint != last_complaint:
            log(complaint + " (retrying)")
            last_complaint = complaint
        time.sleep(delay)
        delay = min(delay * 2, 2.0)


def announce_console(console: str | None) -> None:
    if not console:
        return
    try:
        fd = os.open(console, os.O_WRONLY | os.O_NOCTTY | os.O_APPEND | os.O_CREAT, 0o644)
    except OSError as exc:
        log(f"cannot write to {console}: {exc}")
        return
    try:
        os.write(fd, b"RIGD-AGENT-READY\n")
    except OSError as exc:
        log(f"cannot write to {console}: {exc}")
    finally:
        os.close(fd)


def ready_event() -> dict[str, Any]:
    return {"ev": "ready", "proto": PROTO, "agent": AGENT, "pid": os.getpid()}


def serve_stdio(sysroot: str | None = None) -> None:
    # Keep the protocol on private fds and point 0/1 elsewhere, so a stray
    # print() can never corrupt the channel.
    rfd, wfd = os.dup(0), os.dup(1)
    null = os.open(os.devnull, os.O_RDONLY)
    os.dup2(null, 0)
    os.close(null)
    os.dup2(2, 1)
    sys.stdout = sys.stderr
    chan = Channel(wfd)
    agent = Agent(chan, may_set_clock=False, may_power_off=False, sysroot=sysroot)
    reader = LineReader()
    chan.send(ready_event())
    while True:
        try:
            data = os.read(rfd, 65536)
        except InterruptedError:
            continue
        except OSError as exc:
            log(f"read failed: {exc}")
            data = b""
        if not data:
            break
        for line in reader.feed(data):
            agent.handle_line(line)
    agent.finish(grace=2.0)
    os._exit(0)


def serve_port(
    spec: str, *, console: str | None, set_clock: bool, power: bool, sysroot: str | None = "/"
) -> None:
    fd = open_port(spec)
    chan = Channel(fd)
    agent = Agent(chan, may_set_clock=set_clock, may_power_off=power, sysroot=sysroot)
    reader = LineReader()
    # The console line first: the ready line blocks until the host is connected.
    announce_console(console)
    chan.send(ready_event())
    idle = 0.0
    while True:
        try:
            data = os.read(fd, 65536)
        except (InterruptedError, BlockingIOError):
            continue
        except OSError as exc:
            log(f"port read failed ({exc}); reopening")
            new_fd = open_port(spec)
            chan.swap(new_fd)
            close_quietly(fd)
            fd = new_fd
            reader.reset()
            chan.send(ready_event())
            continue
        if not data:
            # virtio-serial reads return 0 while no host is connected: the
            # partial line (if any) is lost; poll gently until one connects.
            reader.reset()
            idle = min(idle + 0.01, 0.1)
            time.sleep(idle)
            continue
        idle = 0.0
        for line in reader.feed(data):
            agent.handle_line(line)


# --------------------------------------------------------------------------
# PID 1


def become_subreaper() -> None:
    """Outside a real PID 1 (tests), adopt orphans so the reaping is still ours."""
    with contextlib.suppress(Exception):
        import ctypes

        ctypes.CDLL(None).prctl(PR_SET_CHILD_SUBREAPER, 1, 0, 0, 0)


def write_pidfile(path: str | None, pid: int) -> None:
    if not path:
        return
    try:
        os.makedirs(os.path.dirname(path) or ".", exist_ok=True)
        tmp = f"{path}.tmp"
        with open(tmp, "w") as f:
            f.write(f"{pid}\n")
        os.replace(tmp, path)
    except OSError as exc:
        log(f"cannot write {path}: {exc}")


def run_pid1(args: argparse.Namespace) -> None:
    """Stay PID 1 forever: reap everything, keep one agent child alive."""
    for sig in (
        signal.SIGINT,
        signal.SIGTERM,
        signal.SIGHUP,
        signal.SIGTSTP,
        signal.SIGTTIN,
        signal.SIGTTOU,
        signal.SIGPIPE,
    ):
        with contextlib.suppress(Exception):
            signal.signal(sig, signal.SIG_IGN)
    if os.getpid() != 1:
        become_subreaper()
    agent_pid: int | None = None
    started = 0.0
    backoff = 0.0
    next_start = 0.0
    announce = True
    while True:
        try:
            if agent_pid is None:
                delay = next_start - time.monotonic()
                if delay > 0:
                    time.sleep(delay)
                started = time.monotonic()
                agent_pid = spawn_agent_child(args, console=args.console if announce else None)
                announce = False
                write_pidfile(args.pidfile, agent_pid)
            try:
                pid, status = os.waitpid(-1, 0)
            except ChildProcessError:
                time.sleep(1.0)
                continue
            if pid == agent_pid:
                agent_pid = None
                lived = time.monotonic() - started
                backoff = 0.2 if lived > 30 or backoff == 0 else min(backoff * 2, 10.0)
                next_start = time.monotonic() + backoff
                log(f"agent child {pid} died (wait status {status}); restarting in {backoff:.1f}s")
        except BaseException:  # PID 1 must never exit
            with contextlib.suppress(BaseException):
                log("pid1 loop error:\n" + traceback.format_exc())
                time.sleep(1.0)


def spawn_agent_child(args: argparse.Namespace, *, console: str | None) -> int:
    pid = os.fork()
    if pid:
        return pid
    code = 1
    try:
        for sig in (signal.SIGTERM, signal.SIGHUP, signal.SIGTSTP, signal.SIGTTIN, signal.SIGTTOU):
            signal.signal(sig, signal.SIG_DFL)
        # SIGINT must not stay ignored: ignored signals survive exec into children.
        signal.signal(signal.SIGINT, signal.default_int_handler)
        with contextlib.suppress(OSError):
            os.setsid()
        serve_port(args.port, console=console, set_clock=not args.no_clock, power=not args.no_poweroff,
                   sysroot=args.sysroot or "/")
        code = 0
    except BaseException:
        with contextlib.suppress(BaseException):
            log("agent child failed:\n" + traceback.format_exc())
    finally:
        os._exit(code)


# --------------------------------------------------------------------------


def parse_args(argv: list[str]) -> argparse.Namespace:
    p = argparse.ArgumentParser(prog="rigd_agent", description="rigd in-guest agent (proto 1)")
    mode = p.add_mutually_exclusive_group(required=True)
    mode.add_argument("--stdio", action="store_true", help="speak on stdin/stdout (host tests)")
    mode.add_argument("--port", metavar="auto|PATH", help="the virtio-serial port to speak on")
    p.add_argument("--pid1", action="store_true", help="be init: reap, supervise the agent")
    p.add_argument("--pidfile", default="/run/rigd-agent.pid", help="where --pid1 writes the agent's pid")
    p.add_argument("--console", default="/dev/console", help="where RIGD-AGENT-READY goes ('' for nowhere)")
    p.add_argument("--no-clock", action="store_true",
                   help="never set the clock on hello, seed the kernel RNG or set a MAC (reseed)")
    p.add_argument("--sysroot", default=None,
                   help="where reseed writes etc/machine-id (port mode: /; --stdio: nowhere unless given)")
    p.add_argument("--no-poweroff", action="store_true", help="shutdown exits instead of powering off")
    args = p.parse_args(argv)
    if args.pid1 and args.stdio:
        p.error("--pid1 needs --port")
    return args


def main(argv: list[str] | None = None) -> None:
    try:
        args = parse_args(sys.argv[1:] if argv is None else argv)
    except SystemExit:
        if os.getpid() != 1:
            raise
        # PID 1 must not exit over a bad command line: fall back to the defaults.
        args = parse_args(["--pid1", "--port", "auto"])
    if args.pid1:
        run_pid1(args)
    elif args.stdio:
        serve_stdio(args.sysroot)
    else:
        serve_port(args.port, console=args.console, set_clock=not args.no_clock, power=not args.no_poweroff,
                   sysroot=args.sysroot or "/")


if __name__ == "__main__":
    main()
