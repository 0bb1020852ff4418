"""Starting the agent: on stdin/stdout (host tests), on the virtio-serial port, or as the
guest's PID 1 (reap every child forever, keep one agent child alive).
"""

from __future__ import annotations

import argparse
import contextlib
import os
import signal
import sys
import threading
import time
import traceback

from rigd_agent.agent import Agent
from rigd_agent.base import close_quietly, log
from rigd_agent.channel import Channel, LineReader, announce_console, open_port
from rigd_agent.desktop import Desktop
from rigd_agent.system import become_subreaper, write_pidfile
from rigd_agent.x11 import SESSION_ENV_FILE, read_session_env


def make_desktop(session_env: str | None) -> Desktop | None:
    """The X session this agent serves, if it knows one (docs/guest-protocol.md, protocol 2)."""
    env = read_session_env(session_env, os.environ)
    if not env:
        return None
    desktop = Desktop(env)
    threading.Thread(target=desktop.warm_up, name="warm-up", daemon=True).start()
    return desktop


def serve_stdio(sysroot: str | None = None, session_env: str | None = None) -> None:
    # Keep the protocol on private fds and point 0/1 elsewhere, so a stray
    # print() can never corrupt the channel.
    rfd, wfd = os.dup(0), os.dup(1)
    null = os.open(os.devnull, os.O_RDONLY)
    os.dup2(null, 0)
    os.close(null)
    os.dup2(2, 1)
    sys.stdout = sys.stderr
    chan = Channel(wfd)
    agent = Agent(chan, may_set_clock=False, may_power_off=False, sysroot=sysroot,
                  desktop=make_desktop(session_env))
    reader = LineReader()
    chan.send(agent.ready_event())
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
    spec: str,
    *,
    console: str | None,
    set_clock: bool,
    power: bool,
    sysroot: str | None = "/",
    session_env: str | None = None,
) -> None:
    fd = open_port(spec)
    chan = Channel(fd)
    agent = Agent(chan, may_set_clock=set_clock, may_power_off=power, sysroot=sysroot,
                  desktop=make_desktop(session_env))
    reader = LineReader()
    # The console line first: the ready line blocks until the host is connected.
    announce_console(console)
    chan.send(agent.ready_event())
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
            chan.send(agent.ready_event())
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
                   sysroot=args.sysroot or "/", session_env=args.session_env)
        code = 0
    except BaseException:
        with contextlib.suppress(BaseException):
            log("agent child failed:\n" + traceback.format_exc())
    finally:
        os._exit(code)


def parse_args(argv: list[str]) -> argparse.Namespace:
    p = argparse.ArgumentParser(prog="rigd_agent", description="rigd in-guest agent (proto 1; 2 with X)")
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
    p.add_argument("--session-env", default=SESSION_ENV_FILE, metavar="PATH",
                   help="KEY=VALUE file naming the X session (DISPLAY, XAUTHORITY); '' for none")
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
        serve_stdio(args.sysroot, args.session_env)
    else:
        serve_port(args.port, console=args.console, set_clock=not args.no_clock, power=not args.no_poweroff,
                   sysroot=args.sysroot or "/", session_env=args.session_env)

