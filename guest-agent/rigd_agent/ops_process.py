"""``exec`` (a process with streamed output, stdin, limits and a kill on cancel) and the PTY
ops (``pty_open``/``in``/``resize``/``close``) with their reader and writer threads.
"""

from __future__ import annotations

import contextlib
import fcntl
import os
import selectors
import shutil
import signal
import subprocess
import termios
import threading
import time
import traceback
from typing import Any

from rigd_agent.base import (
    CHUNK,
    CLEAN_PATH,
    DEFAULT_MAX_OUTPUT,
    KILL_GIVE_UP_S,
    LINGER_S,
    PTY_CLOSE_GRACE_S,
    PTY_DRAIN_IDLE_S,
    PTY_DRAIN_MAX_S,
    PTY_INPUT_BACKLOG,
    TERM,
    Refused,
    b64,
    check_cwd,
    close_quietly,
    default_cwd,
    field_argv,
    field_b64,
    field_env,
    field_int,
    field_str,
    kill_tree,
    log,
    open_pidfd,
    status_fields,
)
from rigd_agent.core import AgentCore
from rigd_agent.ptys import Pty, set_ctty, winsize


class ProcessOps(AgentCore):
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
            env=self.child_env(env),
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
            fcntl.ioctl(slave, termios.TIOCSWINSZ, winsize(rows, cols))
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
                env=self.child_env(env, term=TERM),
                start_new_session=True,
                preexec_fn=set_ctty,
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
            fcntl.ioctl(pty.master, termios.TIOCSWINSZ, winsize(rows, cols))
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

