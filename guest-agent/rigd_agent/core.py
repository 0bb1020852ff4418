"""The agent's core: the channel's replies, dispatch (inline ops keep their order; the rest
run on threads of their own), ``ping``/``hello``/``reseed``, shutdown, and the state every
concern's ops share. A line can never crash it.
"""

from __future__ import annotations

import binascii
import contextlib
import json
import os
import re
import signal
import subprocess
import threading
import time
import traceback
from collections.abc import Callable
from typing import Any

from rigd_agent.base import (
    CHUNK,
    CLOCK_SLACK_S,
    MAX_LINE,
    PROTO,
    PROTO_DESKTOP,
    BadRequest,
    Refused,
    b64,
    clean_env,
    clip,
    describe_oserror,
    field_b64,
    field_str,
    kill_tree,
    log,
    reject_constant,
)
from rigd_agent.channel import Channel
from rigd_agent.desktop import Desktop, use_image_packages
from rigd_agent.files import PUT_DATA_LINE, Drop, FileRead
from rigd_agent.ptys import Pty
from rigd_agent.system import power_off, seed_rng, set_mac, write_machine_id
from rigd_agent.x11 import FEATURES, INLINE_MAX, MAX_OTHER_DISPLAYS, NO_DISPLAY, DamageWatch


class AgentCore:
    def __init__(
        self,
        chan: Channel,
        *,
        may_set_clock: bool,
        may_power_off: bool,
        sysroot: str | None = None,
        desktop: Desktop | None = None,
    ) -> None:
        self.chan = chan
        self.desktop = desktop  # None: a terminal rig (protocol 1), the desktop ops say "no display"
        #: X displays of the rig's own besides the session's, by name (``screen {display}``).
        self.displays: dict[str, Desktop] = {}
        self.proto = PROTO_DESKTOP if desktop is not None else PROTO
        self.agent_name = f"rigd-agent/{self.proto}"
        self.may_set_clock = may_set_clock  # also: may seed the kernel RNG and set a MAC
        self.may_power_off = may_power_off
        self.sysroot = sysroot  # where /etc/machine-id is written; None: nowhere
        self.lock = threading.Lock()
        self.ptys: dict[int, Pty] = {}
        self.next_pty = 1
        self.procs: dict[int, subprocess.Popen[bytes]] = {}  # running exec leaders
        self.clip_parts: dict[str, tuple[str, bytearray]] = {}  # clipboard_write parts held until the last
        self.files_lock = threading.Lock()  # guards the two tables below (and next_drop)
        self.drops: dict[int, Drop] = {}
        self.next_drop = 1
        self.reads: dict[int, FileRead] = {}  # file_read request id -> its flow control
        self.shutting_down = False
        self.workers: set[threading.Thread] = set()
        self.watches: dict[int, DamageWatch] = {}  # damage_watch request id -> its watch
        #: op -> handler: run on the reader thread (order kept), or on a thread of their own.
        #: Filled by :class:`rigd_agent.agent.Agent` from every concern's ops.
        self.inline: dict[str, Callable[..., None]] = {}
        self.threaded: dict[str, Callable[..., None]] = {}

    def features(self) -> list[str]:
        """What this agent can do: the desktop's (protocol 2), then what every agent does."""
        return [*(self.desktop.features() if self.desktop is not None else ()), *FEATURES]

    def ready_event(self) -> dict[str, Any]:
        ev: dict[str, Any] = {"ev": "ready", "proto": self.proto, "agent": self.agent_name}
        ev["pid"] = os.getpid()
        ev["features"] = self.features()
        return ev

    def child_env(self, extra: dict[str, str] | None, term: str | None = None) -> dict[str, str]:
        """The clean environment, the X session's (desktop only), then the request's."""
        if self.desktop is None:
            return clean_env(extra, term=term)
        return clean_env({**self.desktop.env, **(extra or {})}, term=term)

    def ok(self, rid: int, **fields: Any) -> None:
        self.chan.send({"id": rid, "ok": True, **fields})

    def fail(self, rid: int, text: str) -> None:
        self.chan.send({"id": rid, "ok": False, "error": clip(text)})

    def bad_line(self, text: str) -> None:
        self.chan.send({"ev": "error", "error": clip("bad request: " + text)})

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
        if line.startswith(b'{"id":') and line.endswith(b'"}'):
            m = PUT_DATA_LINE.match(line)
            if m is not None:
                # The bulk of a drop, as the host encodes it: skip json.loads
                # of the big string. Strict base64 of the rest proves the line
                # was exactly this JSON object (no quote or backslash hides in
                # it); anything else takes the general path below.
                try:
                    data = binascii.a2b_base64(memoryview(line)[m.end() : -2], strict_mode=True)
                except (binascii.Error, ValueError):
                    data = None
                if data is not None:
                    req = {"handle": int(m.group(2)), "offset": int(m.group(3))}
                    self.run(self.inline["file_put_data"], int(m.group(1)), req, data)
                    return
        try:
            req = json.loads(line.decode("utf-8"), parse_constant=reject_constant)
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
            if op == "file_read":
                # Known before its thread runs, so a file_read_cancel right behind it finds it.
                with self.files_lock:
                    self.reads[rid] = FileRead(1)
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
                with self.files_lock:
                    self.reads.pop(rid, None)
                self.fail(rid, f"cannot start {op}: {exc}")
        else:
            self.fail(rid, f"unknown op: {clip(op, 100)}")

    def run(self, fn: Callable[..., None], rid: int, req: dict[str, Any], *args: Any) -> None:
        try:
            self._run(fn, rid, req, *args)
        finally:
            with self.lock:
                self.workers.discard(threading.current_thread())

    def _run(self, fn: Callable[..., None], rid: int, req: dict[str, Any], *args: Any) -> None:
        try:
            fn(rid, req, *args)
        except BadRequest as exc:
            self.fail(rid, f"bad request: {exc}")
        except Refused as exc:
            self.fail(rid, str(exc))
        except OSError as exc:
            self.fail(rid, describe_oserror(exc))
        except Exception as exc:
            log(f"internal error in request {rid}:\n" + traceback.format_exc())
            self.fail(rid, f"internal error: {exc!r}")

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
            if abs(skew) > CLOCK_SLACK_S and self.may_set_clock:
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
        extra["features"] = self.features()
        if self.desktop is not None:
            extra["display"] = self.desktop.name
            extra["displayReady"] = self.desktop.reachable()
        self.ok(
            rid,
            proto=self.proto,
            agent=self.agent_name,
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

    def need_desktop(self, feature: str) -> Desktop:
        if self.desktop is None:
            raise Refused(NO_DISPLAY)
        self.desktop.need(feature)
        return self.desktop

    def display_desktop(self, name: str | None, feature: str) -> Desktop:
        """The session's desktop (``name`` None or its own), or another local X display of the
        rig's own, as a browser rig's engine display: made on first use (at most
        MAX_OTHER_DISPLAYS), with the image's Pillow when this interpreter has none."""
        if name is None or (self.desktop is not None and self.desktop.name == name):
            return self.need_desktop(feature)
        with self.lock:
            desk = self.displays.get(name)
            if desk is None:
                if len(self.displays) >= MAX_OTHER_DISPLAYS:
                    raise Refused(f"at most {MAX_OTHER_DISPLAYS} other displays")
                use_image_packages()
                desk = self.displays[name] = Desktop({"DISPLAY": name}, session=False)
        desk.need(feature)  # (a display that is not up says so when it is read: "display not ready")
        return desk

    def send_bulk(self, rid: int, data: bytes) -> dict[str, Any]:
        """``data`` inline when small, else as ``data`` stream events (offset, ≤ 48 KiB each)."""
        if len(data) <= INLINE_MAX:
            return {"data": b64(data)}
        return {"chunks": self._chunks(rid, data)}

    def _chunks(self, rid: int, data: bytes) -> int:
        chunks = 0
        for offset in range(0, len(data), CHUNK):
            piece = b64(data[offset : offset + CHUNK])
            self.chan.send({"id": rid, "ev": "data", "offset": offset, "data": piece})
            chunks += 1
        return chunks

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
        with self.lock:
            watches = list(self.watches.values())
        for watch in watches:
            watch.cancel()
        with self.files_lock:
            reads = list(self.reads.values())
        for state in reads:
            with state.cond:
                state.cancelled = True
                state.cond.notify_all()
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

