"""Terminal rigs against their named peers, measured in one run (``make bench``).

Three ratios, each against a peer measured in the same run, on the same image,
kernel, accelerator, memory and vCPUs (speed targets live here, never in timed
tests):

(a) ``rig.open`` → ready (the blocking RPC) against a raw
    ``qemu-system-x86_64`` running rigd's own QEMU command line (read from the
    rig's ``/proc/<pid>/cmdline``; only paths differ, and the NIC's backend
    is an empty QEMU hub instead of the egress gateway's tap), in two pairs:

    - **cold**: a server started with ``RIGD_WARM_STARTS=0`` (every rig boots
      its kernel) against the raw QEMU booting a fresh overlay of the same
      pack, timed from spawn to ``RIGD-AGENT-READY`` on the serial console;
    - **warm**: a server with warm starts (every sample checked to be
      restored) against the raw QEMU restoring the **same** snapshot the
      rigs restored, as rigd does (:mod:`rigd.backends.snapshot`): the same
      argv with ``-incoming defer`` on a fresh qcow2 overlay of the
      snapshot's ``disk.qcow2``, QMP ``migrate-incoming`` fed by ``zstd -d``
      of ``memory.zst`` (rigd's own :func:`load_memory`), ``cont``, timed
      from spawn to the agent's first ``hello`` answer.

    Target for each pair: ratio ≤ 1.3. The two servers run one after the
    other on one data directory (one pack), the cold one first, so the warm
    server's snapshot build never overlaps a cold sample.
(b) an exec round trip of ``true`` in **one** guest: the rigd agent's ``exec``
    (request → final reply, over :class:`GuestConnection`) against Debian's
    ``qemu-ga`` ``guest-exec`` + back-to-back ``guest-exec-status`` polls
    until ``exited``. Target: ratio ≤ 0.5. As context, ``rig.act`` exec over
    HTTP on a rig opened by the (warm) server is set against the same
    qemu-ga number.

Each side gets a warm-up, then ``--rounds`` interleaved rounds (the order of
the sides alternates); every sample and the medians are printed. A missed
target is reported as "not met", never tuned away.

Every process started here (the servers, raw QEMUs, and the servers' QEMUs,
whose pids ``rig.open`` reports) is killed by pid on the way out, also on
errors, Ctrl-C and SIGTERM.
"""

from __future__ import annotations

import argparse
import contextlib
import datetime
import functools
import itertools
import json
import logging
import os
import re
import secrets
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from collections.abc import AsyncIterator, Callable
from contextlib import asynccontextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import trio

# _common (beside this script) puts this checkout first on sys.path, so it comes before rigd.
from _common import (
    REAPER,
    BenchError,
    Server,
    clean_up,
    fmt_ms,
    fmt_s,
    leaves,
    med,
    start_server,
    stop_server,
    tail,
)

from rigd.backends.guest_client import GuestConnection
from rigd.backends.microvm_argv import default_tcg_threads, esc, microvm_argv
from rigd.backends.procs import proc_alive
from rigd.backends.qmp_client import QMPConnection
from rigd.backends.snapshot import DISK_FILE, ENV_SWITCH, MEMORY_FILE, META_FILE, load_memory
from rigd.client.cli import Client
from rigd.errors import GuestError
from rigd.images import TerminalAssets, find_assets
from rigd.images.pack import ensure_pack
from rigd.protocols.guest import Stream
from rigd.server.main import publish_assets

TARGET_OPEN = 1.3
TARGET_EXEC = 0.5
READY = b"RIGD-AGENT-READY"
BOOT_FAIL = b"RIGD-BOOT-FAIL"
QGA_PORT = "org.qemu.guest_agent.0"
MAX_OUTPUT = 2 * 1024 * 1024  # what rigd's rig.act passes (EXEC_OUTPUT_LIMIT)
SERIAL_BUS = "virtio-serial-device,max_ports=2"

log = logging.getLogger("bench")


def other_qemus() -> int:
    """QEMU processes on this host that are not ours (e.g. a CI run): noise to report."""
    n = 0
    for entry in os.listdir("/proc"):
        if entry.isdigit() and int(entry) not in REAPER.ever:
            with contextlib.suppress(OSError):
                if Path(f"/proc/{entry}/comm").read_text().startswith("qemu-system"):
                    n += 1
    return n


# --- numbers ---------------------------------------------------------------------


def verdict(ratio: float, target: float) -> str:
    return f"target ≤ {target}: {'met' if ratio <= target else 'not met'}"


# --- context ---------------------------------------------------------------------


@dataclass(slots=True)
class Ctx:
    args: argparse.Namespace
    assets: TerminalAssets  # the server's own published copies (hard links of the build cache)
    rootfs: Path
    data_dir: Path
    raw_root: Path
    server_log: Path  # both servers append to it
    server: Server | None = None  # the one running now
    overlay_s: list[float] = field(default_factory=list)
    close_s: list[float] = field(default_factory=list)
    other_qemus: int = 0

    @property
    def client(self) -> Client:
        if self.server is None:
            raise BenchError("no server is running")
        return self.server.client


# --- the raw-QEMU peer -----------------------------------------------------------


@dataclass(slots=True)
class RawVM:
    proc: trio.Process
    dir: Path
    spawned: float  # perf_counter at spawn
    ready_s: float = 0.0
    console: bytearray = field(default_factory=bytearray)
    hello_s: float | None = None
    load_s: float | None = None  # restores: migrate-incoming → completed
    guest: GuestConnection | None = None
    changed: trio.Event = field(default_factory=trio.Event)
    hello_done: trio.Event = field(default_factory=trio.Event)


def with_qga(argv: list[str], sock: Path) -> list[str]:
    """Add a qemu-ga port on the argv's own virtio-serial bus (it has room for one port only)."""
    idx = [i for i, a in enumerate(argv) if a == SERIAL_BUS]
    if len(idx) != 1:
        raise BenchError(f"expected one {SERIAL_BUS!r} in the microvm argv, found {len(idx)}")
    argv = list(argv)
    argv[idx[0]] = "virtio-serial-device,max_ports=4"
    return [
        *argv,
        "-chardev", f"socket,id=qga,path={sock},server=on,wait=off",
        "-device", f"virtserialport,chardev=qga,name={QGA_PORT}",
    ]


def _option_value(opts: str, key: str) -> str | None:
    """``key``'s value in a QEMU option string (``a=1,b=x,,y``: a doubled comma is a comma)."""
    for part in re.split(r"(?<!,),(?!,)", opts):
        name, eq, value = part.partition("=")
        if eq and name == key:
            return value.replace(",,", ",")
    return None


def peer_argv(rig_argv: list[str], *, vm_dir: Path, overlay: Path) -> list[str]:
    """rigd's QEMU command line (as ``/proc/<pid>/cmdline`` shows it), for a raw peer.

    Everything stays but what is the rig's own: its directory (sockets) becomes
    ``vm_dir``, its overlay becomes ``overlay``, and a ``-netdev`` (the egress
    gateway's tap by fd, or user networking relayed to the rig's gateway)
    becomes an empty hub of the same id, so the guest has the same NIC (a
    snapshot of it restores) and nothing on the host is touched.
    """
    qmp = next((_option_value(v, "path") for o, v in itertools.pairwise(rig_argv)
                if o == "-chardev" and _option_value(v, "id") == "qmp"), None)
    if not qmp:
        raise BenchError(f"no QMP socket in rigd's QEMU command line: {rig_argv}")
    rig_dir = str(Path(qmp).parent)
    out = [rig_argv[0]]
    root_disk = None
    for opt, value in itertools.pairwise(rig_argv):
        if opt == "-drive" and _option_value(value, "id") == "root":
            root_disk = _option_value(value, "file")
            value = value.replace(f"file={esc(root_disk or '')},", f"file={esc(overlay)},")
        elif opt == "-netdev":
            value = f"hubport,id={esc(_option_value(value, 'id') or 'net0')},hubid=0"
        out.append(value.replace(rig_dir + "/", f"{vm_dir}/"))
    left = [v for v in out if rig_dir in v or (root_disk and root_disk in v)]
    if root_disk is None or left:
        raise BenchError(f"cannot make a peer of rigd's QEMU command line (root disk {root_disk!r}, "
                         f"left: {left}): {rig_argv}")
    return out


async def _make_overlay(ctx: Ctx, overlay: Path, backing: Path | None = None) -> None:
    """A qcow2 overlay of the pack's rootfs (raw) or of a snapshot's disk (qcow2)."""
    fmt = "raw" if backing is None else "qcow2"
    backing = (backing or ctx.rootfs).resolve()  # rigd writes backing paths resolved too
    t = time.perf_counter()
    res = await trio.run_process(
        [ctx.args.qemu_img, "create", "-q", "-f", "qcow2", "-F", fmt, "-b", str(backing), str(overlay)],
        capture_stdout=True, capture_stderr=True, check=False,
    )
    if res.returncode != 0:
        raise BenchError(f"qemu-img create failed: {res.stderr.decode(errors='replace')[-400:]}")
    ctx.overlay_s.append(time.perf_counter() - t)


async def _rigd_style_hello(vm: RawVM, nursery: trio.Nursery) -> None:
    """Connect to the agent socket and say hello the way SmolvmMachine.boot does (1 s per try)."""
    stream = await _connect(vm, vm.dir / "agent.sock")
    vm.guest = GuestConnection(stream, log=log)
    await nursery.start(vm.guest.run)
    while True:
        try:
            await vm.guest.request("hello", timeout=1.0, time=time.time())
        except GuestError:
            if vm.guest.closed:
                vm.hello_done.set()
                return
            continue
        vm.hello_s = time.perf_counter() - vm.spawned
        vm.hello_done.set()
        return


@asynccontextmanager
async def raw_vm(
    ctx: Ctx, *, qga: bool = False, hello: bool = False, like: list[str] | None = None,
    snapshot: Path | None = None,
) -> AsyncIterator[RawVM]:
    """Start the peer on a fresh overlay; the overlay is made before the clock starts.

    The argv is :func:`microvm_argv`'s, or with ``like`` the one rigd ran
    (:func:`peer_argv`). Cold (no ``snapshot``): ready = ``RIGD-AGENT-READY``
    on the console; with ``hello`` the agent channel is also opened and
    greeted as rigd does. With ``snapshot`` (a snapshot directory; ``like``
    must then be a restored rig's argv, ``-incoming defer`` included), the
    overlay is over the snapshot's disk and the machine is restored as rigd
    restores one (:func:`_restore`); ready = the agent's first ``hello`` answer.
    """
    a = ctx.args
    if snapshot is not None and (like is None or "-incoming" not in like or qga):
        raise BenchError("a restore needs the argv of a restored rig (with -incoming), and no qemu-ga")
    vm_dir = Path(tempfile.mkdtemp(prefix="raw-", dir=ctx.raw_root))
    errf = os.open(vm_dir / "qemu.err", os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    proc: trio.Process | None = None
    try:
        overlay = vm_dir / "overlay.qcow2"
        await _make_overlay(ctx, overlay, None if snapshot is None else snapshot / DISK_FILE)
        if like is not None:
            argv = peer_argv(like, vm_dir=vm_dir, overlay=overlay)
        else:
            argv = microvm_argv(
                qemu=a.qemu, accel=a.accel, memory_mb=a.memory_mb, vcpus=a.vcpus,
                tcg_threads=default_tcg_threads(),
                kernel=ctx.assets.kernel, initrd=ctx.assets.initrd, root_disk=overlay,
                tools_disk=ctx.assets.tools, qmp_socket=vm_dir / "qmp.sock",
                agent_socket=vm_dir / "agent.sock", console_socket=vm_dir / "console.sock",
            )
        if qga:
            argv = with_qga(argv, vm_dir / "qga.sock")
        async with trio.open_nursery() as nursery:
            spawned = time.perf_counter()
            proc = await trio.lowlevel.open_process(
                argv, stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=errf,
                start_new_session=True, cwd=str(vm_dir),
            )
            REAPER.add(proc.pid, "raw qemu")
            vm = RawVM(proc=proc, dir=vm_dir, spawned=spawned)
            try:
                with trio.fail_after(a.boot_timeout):
                    if snapshot is not None:
                        await _restore(vm, nursery, snapshot)
                    else:
                        if hello:
                            nursery.start_soon(_rigd_style_hello, vm, nursery)
                        stream = await _connect(vm, vm.dir / "console.sock")
                        nursery.start_soon(_drain, vm, stream)
                        while READY not in vm.console:
                            await _console_event(vm)
                        vm.ready_s = time.perf_counter() - spawned
                        if hello:
                            await vm.hello_done.wait()
            except trio.TooSlowError:
                raise BenchError(
                    f"raw VM not ready within {a.boot_timeout} s; console: {tail(vm.console)}; "
                    f"stderr: {tail((vm.dir / 'qemu.err').read_bytes())}"
                ) from None
            try:
                yield vm
            finally:
                nursery.cancel_scope.cancel()
    finally:
        with trio.CancelScope(shield=True):
            if proc is not None:
                if proc.returncode is None:
                    with contextlib.suppress(ProcessLookupError):
                        os.kill(proc.pid, signal.SIGKILL)
                await proc.wait()
                REAPER.discard(proc.pid)
            os.close(errf)
            shutil.rmtree(vm_dir, ignore_errors=True)


async def _restore(vm: RawVM, nursery: trio.Nursery, snapshot: Path) -> None:
    """What ``SmolvmMachine.restore`` does, in its order, minus rigd's own ``reseed``.

    The sockets, QMP (negotiated), the console and the agent channel; then
    ``migrate-incoming`` fed by ``zstd -d`` of ``memory.zst``; ``cont``; then
    ``hello`` (1 s per try) until the agent answers: that answer is ready.
    """
    for name in ("qmp.sock", "agent.sock", "console.sock"):
        while not (vm.dir / name).exists():
            if vm.proc.poll() is not None:
                raise BenchError(f"raw QEMU exited at start: {tail((vm.dir / 'qemu.err').read_bytes())}")
            await trio.sleep(0.002)
    qmp = await QMPConnection.connect(vm.dir / "qmp.sock", log=log)
    await nursery.start(qmp.run)
    await qmp.handshake(timeout=30)
    nursery.start_soon(_drain, vm, await trio.open_unix_socket(str(vm.dir / "console.sock")))
    vm.guest = GuestConnection(await trio.open_unix_socket(str(vm.dir / "agent.sock")), log=log)
    await nursery.start(vm.guest.run)
    t = time.perf_counter()
    try:
        await load_memory(qmp, listen=vm.dir / "migrate.sock", memory=snapshot / MEMORY_FILE)
    except Exception as exc:  # a BackendError, or the QMP connection dropping with QEMU
        raise BenchError(f"raw restore failed: {exc}; stderr: "
                         f"{tail((vm.dir / 'qemu.err').read_bytes())}") from None
    vm.load_s = time.perf_counter() - t
    await qmp.execute("cont")
    while True:
        try:
            await vm.guest.request("hello", timeout=1.0, time=time.time())
        except GuestError:
            if vm.guest.closed or vm.proc.poll() is not None:
                err = tail((vm.dir / "qemu.err").read_bytes())
                raise BenchError(f"raw restored VM died: {err}") from None
            continue
        vm.ready_s = vm.hello_s = time.perf_counter() - vm.spawned
        return


async def _connect(vm: RawVM, sock: Path) -> trio.SocketStream:
    """Connect to one of QEMU's server sockets as soon as it listens (the file comes first)."""
    while True:
        if vm.proc.poll() is not None:
            raise BenchError(f"raw QEMU exited at start: {tail((vm.dir / 'qemu.err').read_bytes())}")
        try:
            return await trio.open_unix_socket(str(sock))
        except (FileNotFoundError, ConnectionRefusedError):
            await trio.sleep(0.002)


async def _drain(vm: RawVM, stream: trio.SocketStream) -> None:
    """Keep reading the console (an unread console would stall the guest's serial output)."""
    async with stream:
        while True:
            try:
                data = await stream.receive_some(65536)
            except (trio.BrokenResourceError, trio.ClosedResourceError):
                data = b""
            vm.console += data or b"\n[console closed]"
            if len(vm.console) > 256 * 1024:
                del vm.console[: len(vm.console) - 128 * 1024]
            vm.changed.set()
            vm.changed = trio.Event()
            if not data:
                return


async def _console_event(vm: RawVM) -> None:
    """Wait for more console output; fail on a boot failure or a dead QEMU."""
    if BOOT_FAIL in vm.console or vm.console.endswith(b"[console closed]") or vm.proc.poll() is not None:
        raise BenchError(
            f"raw VM did not boot (QEMU {vm.proc.returncode}); console: {tail(vm.console)}; "
            f"stderr: {tail((vm.dir / 'qemu.err').read_bytes())}"
        )
    with trio.move_on_after(0.5):
        await vm.changed.wait()


# --- the qemu-ga peer ------------------------------------------------------------


class QGAClient:
    """qemu-ga's JSON protocol: one command per line out, one JSON reply per line back."""

    def __init__(self, stream: trio.SocketStream) -> None:
        self.stream = stream
        self.buf = bytearray()

    async def send(self, cmd: str, args: dict[str, Any] | None = None) -> None:
        msg: dict[str, Any] = {"execute": cmd}
        if args is not None:
            msg["arguments"] = args
        await self.stream.send_all(json.dumps(msg).encode() + b"\n")

    async def receive(self) -> dict[str, Any]:
        while True:
            nl = self.buf.find(b"\n")
            if nl >= 0:
                line = bytes(self.buf[:nl]).strip(b"\xff \r\t")
                del self.buf[: nl + 1]
                if not line:
                    continue
                try:
                    msg = json.loads(line)
                except ValueError:
                    continue
                if isinstance(msg, dict):
                    return msg
                continue
            data = await self.stream.receive_some(65536)
            if not data:
                raise BenchError("qemu-ga channel closed")
            self.buf += data

    async def call(self, cmd: str, args: dict[str, Any] | None = None) -> Any:
        await self.send(cmd, args)
        msg = await self.receive()
        if "error" in msg:
            raise BenchError(f"qemu-ga {cmd}: {msg['error']}")
        return msg.get("return")

    async def sync(self, timeout: float) -> None:
        """guest-sync until our id comes back: flushes whatever was in the channel."""
        with trio.fail_after(timeout):
            while True:
                token = secrets.randbelow(1 << 31)
                await self.send("guest-sync", {"id": token})
                with trio.move_on_after(1.0):
                    while True:
                        msg = await self.receive()
                        if msg.get("return") == token:
                            return


async def start_qga(vm: RawVM) -> QGAClient:
    assert vm.guest is not None
    script = (
        "dev=; for p in /sys/class/virtio-ports/*; do "
        f'[ "$(cat $p/name 2>/dev/null)" = {QGA_PORT} ] && dev=/dev/${{p##*/}}; done; '
        '[ -n "$dev" ] || { echo "no virtio port named ' + QGA_PORT + '" >&2; exit 3; }; '
        "mkdir -p /run/qga; "
        "exec /usr/sbin/qemu-ga -m virtio-serial -p $dev -d -f /run/qga/qga.pid -t /run/qga -l /run/qga/log"
    )
    err = bytearray()

    def on_stream(ev: Stream) -> None:
        if ev.data:
            err.extend(ev.data[:4096])

    body = await vm.guest.request(
        "exec", timeout=60, on_stream=on_stream, argv=["sh", "-c", script], timeoutMs=30000
    )
    if body.get("exitCode") != 0:
        raise BenchError(f"starting qemu-ga failed ({body}): {tail(err)}")
    qga = QGAClient(await _connect(vm, vm.dir / "qga.sock"))
    await qga.sync(timeout=60)
    return qga


# --- one sample of each side -------------------------------------------------------


def _ignore(_ev: Stream) -> None:
    pass


@dataclass(slots=True)
class AgentSample:
    seconds: float
    guest_ms: int  # the agent's own durationMs: spawn → reaped, inside the guest


async def agent_exec(vm: RawVM) -> AgentSample:
    assert vm.guest is not None
    t0 = time.perf_counter()
    body = await vm.guest.request(
        "exec", timeout=90, on_stream=_ignore, argv=["true"], timeoutMs=60000, maxOutput=MAX_OUTPUT
    )
    dt = time.perf_counter() - t0
    if body.get("exitCode") != 0:
        raise BenchError(f"rigd agent: true exited {body}")
    return AgentSample(dt, int(body.get("durationMs") or 0))


async def agent_ping(vm: RawVM) -> float:
    assert vm.guest is not None
    t0 = time.perf_counter()
    await vm.guest.request("ping", timeout=30)
    return time.perf_counter() - t0


async def qga_ping(qga: QGAClient) -> float:
    t0 = time.perf_counter()
    await qga.call("guest-ping")
    return time.perf_counter() - t0


@dataclass(slots=True)
class QGASample:
    seconds: float
    polls: int


async def qga_exec(qga: QGAClient) -> QGASample:
    t0 = time.perf_counter()
    ret = await qga.call("guest-exec", {"path": "/bin/true", "capture-output": True})
    pid = ret["pid"]
    polls = 0
    while True:
        polls += 1
        st = await qga.call("guest-exec-status", {"pid": pid})
        if st.get("exited"):
            break
    dt = time.perf_counter() - t0
    if st.get("exitcode") != 0:
        raise BenchError(f"qemu-ga: /bin/true exited {st}")
    return QGASample(dt, polls)


async def in_thread(fn: Callable[[], Any]) -> Any:
    return await trio.to_thread.run_sync(fn, abandon_on_cancel=True)


async def http_exec(ctx: Ctx, rig_id: str) -> float:
    def call() -> tuple[float, Any]:
        t0 = time.perf_counter()
        res = ctx.client.call("rig.act", {"rigId": rig_id, "tool": "terminal_use",
                                          "action": {"action": "exec", "argv": ["true"]}})
        return time.perf_counter() - t0, res

    dt, res = await in_thread(call)
    if res.get("exitCode") != 0:
        raise BenchError(f"rig.act: true exited {res}")
    return float(dt)


@dataclass(slots=True)
class OpenSample:
    seconds: float
    rig_id: str
    boot: str  # "warm" (restored from a snapshot) or "cold", as the Rig says
    argv: list[str]  # its QEMU's command line (/proc/<pid>/cmdline)
    started_epoch: float
    ended_epoch: float


def cmdline(pid: int) -> list[str]:
    try:
        raw = Path(f"/proc/{pid}/cmdline").read_bytes()
    except OSError as exc:
        raise BenchError(f"cannot read the command line of rigd's QEMU {pid}: {exc}") from exc
    return [os.fsdecode(arg) for arg in raw.split(b"\0")[:-1]]


async def rigd_open(ctx: Ctx) -> OpenSample:
    a = ctx.args

    def call() -> tuple[float, float, float, Any]:
        e0, t0 = time.time(), time.perf_counter()
        res = ctx.client.call("rig.open", {"workspace": "default", "surface": "terminal",
                                           "memoryMb": a.memory_mb, "vcpus": a.vcpus},
                              timeout=a.boot_timeout + 60)
        return time.perf_counter() - t0, e0, time.time(), res

    dt, e0, e1, rig = await in_thread(call)
    pid = rig.get("pid")
    if isinstance(pid, int):
        REAPER.add(pid, f"rigd qemu ({rig['id']})")
    if rig.get("phase") != "ready" or not isinstance(pid, int):
        raise BenchError(f"rig.open answered phase {rig.get('phase')} (pid {pid}): {rig.get('failure')}")
    return OpenSample(float(dt), rig["id"], str(rig.get("boot")), cmdline(pid), e0, e1)


async def rigd_close(ctx: Ctx, rig_id: str) -> None:
    t0 = time.perf_counter()
    await in_thread(lambda: ctx.client.call("rig.close", {"rigId": rig_id}))
    ctx.close_s.append(time.perf_counter() - t0)
    # The machine must be gone before the next sample starts.
    for pid, t in list(REAPER.pids.items()):
        if t.what.endswith(f"({rig_id})"):
            with trio.fail_after(30):
                while proc_alive(pid, t.ticks):  # noqa: ASYNC110 - not our child: /proc is all there is
                    await trio.sleep(0.02)
            REAPER.discard(pid)


@dataclass(slots=True)
class RawSample:
    seconds: float  # spawn → ready
    load_s: float | None  # restores: the memory load alone


async def raw_open(ctx: Ctx, like: list[str], snapshot: Path | None) -> RawSample:
    async with raw_vm(ctx, like=like, snapshot=snapshot) as vm:
        return RawSample(vm.ready_s, vm.load_s)


# --- the server's log: where rig.open's time goes ---------------------------------

_LOG_LINE = re.compile(
    r"^(\d{4}-\d\d-\d\d \d\d:\d\d:\d\d,\d{3}) \w+ rigd\.rig\.(\S+) qemu started", re.MULTILINE
)


def qemu_start_epochs(server_log: Path) -> dict[str, float]:
    out: dict[str, float] = {}
    with contextlib.suppress(OSError):
        for m in _LOG_LINE.finditer(server_log.read_text(errors="replace")):
            when = datetime.datetime.strptime(m.group(1), "%Y-%m-%d %H:%M:%S,%f")
            out[m.group(2)] = when.timestamp()  # naive = local time, as logging wrote it
    return out


_RESTORED = re.compile(r" rigd\.rig\.(\S+) restored (.*)$", re.MULTILINE)


def restores(server_log: Path) -> dict[str, dict[str, str]]:
    """Per restored rig, the fields of its ``restored`` line (``snapshot``, ``load_s`` …)."""
    out: dict[str, dict[str, str]] = {}
    with contextlib.suppress(OSError):
        for m in _RESTORED.finditer(server_log.read_text(errors="replace")):
            out[m.group(1)] = dict(f.split("=", 1) for f in m.group(2).split() if "=" in f)
    return out


def snapshot_keys(ctx: Ctx) -> set[str]:
    """The committed snapshots of the pack (where SmolvmBackend keeps them: beside rootfs.img)."""
    root = ctx.rootfs.parent / "snapshots"
    return {p.parent.name for p in root.glob(f"*/{META_FILE}") if not p.parent.name.startswith(".")}


# --- the two measurements ------------------------------------------------------------


def _order(i: int, sides: list[str]) -> list[str]:
    k = i % len(sides)
    return sides[k:] + sides[:k]


@dataclass(slots=True)
class OpenResult:
    kind: str  # "cold" or "warm"
    rigd: list[float]
    raw: list[float]
    pre_qemu: list[float]
    post_qemu: list[float]
    like: list[str]  # the rig argv the raw peer ran (paths swapped by peer_argv)
    snapshot: Path | None = None
    rigd_load: list[float] = field(default_factory=list)
    raw_load: list[float] = field(default_factory=list)
    left_out: int = 0  # warm side: rigs that booted cold (not counted)


async def wait_new_snapshot(ctx: Ctx, known: set[str]) -> None:
    timeout = ctx.args.boot_timeout + 300
    with trio.move_on_after(timeout):
        while not snapshot_keys(ctx) - known:
            srv = ctx.server
            if srv is None or srv.proc.poll() is not None:
                raise BenchError(f"the warm server died: {tail(ctx.server_log.read_bytes(), 1500)}")
            await trio.sleep(0.5)
        return
    raise BenchError(f"the warm server built no snapshot within {timeout:.0f} s: "
                     f"{tail(ctx.server_log.read_bytes(), 1500)}")


async def warm_up_open(ctx: Ctx, kind: str) -> OpenSample:
    """One rigd open (closed again) that came up ``kind``; on the warm server, wait for its snapshot."""
    for _ in range(3):
        known = snapshot_keys(ctx)
        s = await rigd_open(ctx)
        await rigd_close(ctx, s.rig_id)
        if s.boot == kind:
            return s
        if kind == "cold":
            raise BenchError(f"the {ENV_SWITCH}=0 server restored rig {s.rig_id} from a snapshot")
        print(f"    warm-up   rigd {fmt_s(s.seconds)}, booted {s.boot}: waiting for the pack's snapshot",
              flush=True)
        await wait_new_snapshot(ctx, known)
    raise BenchError(f"the warm server's rigs are not restored: {tail(ctx.server_log.read_bytes(), 1500)}")


async def measure_open(ctx: Ctx, kind: str) -> OpenResult:
    warm = kind == "warm"
    if warm:
        print("(a) warm: rig.open → ready (restored)  vs  raw qemu -incoming defer + migrate-incoming "
              "← zstd -d of the same snapshot, cont → agent's first hello answered", flush=True)
    else:
        print(f"(a) cold: rig.open → ready ({ENV_SWITCH}=0 server)  vs  raw qemu spawn → "
              "RIGD-AGENT-READY", flush=True)
    w = await warm_up_open(ctx, kind)
    snapshot = None
    if warm:
        key = restores(ctx.server_log).get(w.rig_id, {}).get("snapshot")
        if key is None or key not in snapshot_keys(ctx):
            raise BenchError(f"rig {w.rig_id} was restored, but from which snapshot? (log says {key!r})")
        snapshot = ctx.rootfs.parent / "snapshots" / key
    wr = await raw_open(ctx, w.argv, snapshot)
    print(f"    warm-up   rigd {fmt_s(w.seconds)}   raw {fmt_s(wr.seconds)}", flush=True)
    out = OpenResult(kind, [], [], [], [], w.argv, snapshot)
    samples: list[OpenSample] = []
    for i in range(ctx.args.rounds):
        got: dict[str, float] = {}
        for side in _order(i, ["rigd", "raw"]):
            if side == "rigd":
                s = await rigd_open(ctx)
                await rigd_close(ctx, s.rig_id)
                if s.boot != kind:
                    if not warm:
                        raise BenchError(f"the {ENV_SWITCH}=0 server restored rig {s.rig_id}")
                    out.left_out += 1
                    continue
                if warm:
                    fields = restores(ctx.server_log).get(s.rig_id, {})
                    if snapshot is None or fields.get("snapshot") != snapshot.name:
                        raise BenchError(f"rig {s.rig_id} was restored from snapshot "
                                         f"{fields.get('snapshot')!r}, not {snapshot}")
                    with contextlib.suppress(KeyError, ValueError):
                        out.rigd_load.append(float(fields["load_s"]))
                samples.append(s)
                got[side] = s.seconds
            else:
                r = await raw_open(ctx, w.argv, snapshot)
                got[side] = r.seconds
                if r.load_s is not None:
                    out.raw_load.append(r.load_s)
        ctx.other_qemus = max(ctx.other_qemus, other_qemus())
        out.raw.append(got["raw"])
        if "rigd" not in got:
            print(f"    round {i + 1}   rigd booted cold (left out)   raw {fmt_s(got['raw'])}", flush=True)
            continue
        out.rigd.append(got["rigd"])
        print(f"    round {i + 1}   rigd {fmt_s(got['rigd'])}   raw {fmt_s(got['raw'])}   "
              f"ratio {got['rigd'] / got['raw']:.2f}", flush=True)
    starts = qemu_start_epochs(ctx.server_log)
    out.pre_qemu = [starts[s.rig_id] - s.started_epoch for s in samples if s.rig_id in starts]
    out.post_qemu = [s.ended_epoch - starts[s.rig_id] for s in samples if s.rig_id in starts]
    print(f"    median    rigd {fmt_s(med(out.rigd))}   raw {fmt_s(med(out.raw))}", flush=True)
    return out


@dataclass(slots=True)
class ExecResult:
    agent: list[float]
    qga: list[float]
    http: list[float]
    polls: list[int]
    agent_guest_ms: list[float]
    agent_ping: list[float]
    qga_ping: list[float]
    qga_boot_ready: float
    qga_boot_hello: float | None


async def measure_exec(ctx: Ctx) -> ExecResult:
    print("(b) exec `true` round trip: rigd agent exec  vs  qemu-ga guest-exec(+status polls), "
          "same guest; rig.act over HTTP as context", flush=True)
    opened = await rigd_open(ctx)  # the HTTP path needs a rig of the server's own
    try:
        async with raw_vm(ctx, qga=True, hello=True) as vm:
            print(f"    peer VM: console ready {fmt_s(vm.ready_s)} after spawn, rigd-style hello "
                  f"answered at {fmt_s(vm.hello_s or float('nan'))}", flush=True)
            qga = await start_qga(vm)
            info = await qga.call("guest-info")
            print(f"    qemu-ga {info.get('version')} answering on {QGA_PORT}", flush=True)
            for _ in range(3):  # warm-up: page cache, first fork/exec of each path
                await agent_exec(vm)
                await qga_exec(qga)
                await http_exec(ctx, opened.rig_id)
            agent: list[float] = []
            qgas: list[float] = []
            http: list[float] = []
            polls: list[int] = []
            guest_ms: list[float] = []
            for i in range(ctx.args.exec_rounds):
                got: dict[str, float] = {}
                for side in _order(i, ["agent", "qga", "http"]):
                    if side == "agent":
                        a = await agent_exec(vm)
                        got[side] = a.seconds
                        guest_ms.append(a.guest_ms)
                    elif side == "qga":
                        q = await qga_exec(qga)
                        got[side] = q.seconds
                        polls.append(q.polls)
                    else:
                        got[side] = await http_exec(ctx, opened.rig_id)
                agent.append(got["agent"])
                qgas.append(got["qga"])
                http.append(got["http"])
                print(f"    round {i + 1:<3} rigd agent {fmt_ms(got['agent']):>8}   "
                      f"qemu-ga {fmt_ms(got['qga']):>8} ({polls[-1]} polls)   "
                      f"rig.act/HTTP {fmt_ms(got['http']):>8}", flush=True)
            ctx.other_qemus = max(ctx.other_qemus, other_qemus())
            print(f"    median    rigd agent {fmt_ms(med(agent))}   qemu-ga {fmt_ms(med(qgas))}   "
                  f"rig.act/HTTP {fmt_ms(med(http))}", flush=True)
            # Context: the channels alone, no process spawned (interleaved too).
            pings: dict[str, list[float]] = {"agent": [], "qga": []}
            for i in range(max(ctx.args.exec_rounds, 10)):
                for side in _order(i, ["agent", "qga"]):
                    pings[side].append(await agent_ping(vm) if side == "agent" else await qga_ping(qga))
            await qga.stream.aclose()
            return ExecResult(agent, qgas, http, polls, guest_ms, pings["agent"], pings["qga"],
                              vm.ready_s, vm.hello_s)
    finally:
        with trio.CancelScope(shield=True):
            await rigd_close(ctx, opened.rig_id)


async def bench_main(ctx: Ctx) -> int:
    """run_bench, with SIGTERM turned into KeyboardInterrupt at a safe point (a task)."""
    rc: list[int] = []

    async def on_sigterm(task_status: trio.TaskStatus[None]) -> None:
        with trio.open_signal_receiver(signal.SIGTERM) as signals:
            task_status.started()
            async for _ in signals:
                raise KeyboardInterrupt

    async with trio.open_nursery() as nursery:
        await nursery.start(on_sigterm)
        rc.append(await run_bench(ctx))
        nursery.cancel_scope.cancel()
    return rc[0]


def pack_check_seconds(assets: TerminalAssets, data_dir: Path, n: int = 5) -> float:
    times = []
    for _ in range(n):
        t = time.perf_counter()
        ensure_pack(assets, data_dir)
        times.append(time.perf_counter() - t)
    return med(times)


async def use_server(ctx: Ctx, name: str, *, warm: bool) -> None:
    start = functools.partial(start_server, ctx.args, name, ctx.data_dir, warm=warm)
    srv = ctx.server = await trio.to_thread.run_sync(start)
    print(f"rigd serve ({name}: {ENV_SWITCH}={int(warm)}) pid {srv.proc.pid} at {srv.url}, "
          f"data {ctx.data_dir}", flush=True)


async def drop_server(ctx: Ctx) -> None:
    with trio.CancelScope(shield=True):
        if ctx.server is not None:
            await trio.to_thread.run_sync(stop_server, ctx.server)
            ctx.server = None


def argv_shape(argv: list[str]) -> list[str]:
    """A rig's argv with what is its own (directory, overlay, MAC) replaced by placeholders."""
    shape = peer_argv(argv, vm_dir=Path("/@rig"), overlay=Path("/@disk"))
    return [re.sub(r"mac=[0-9a-f:]{17}", "mac=@mac", x) for x in shape]


def _netdev(argv: list[str]) -> str:
    """The rig's NIC backend, for the record (what the peer's empty hub stands in for)."""
    for opt, value in itertools.pairwise(argv):
        if opt == "-netdev":
            return value.split(",", 1)[0]
    return "none"


async def run_bench(ctx: Ctx) -> int:
    a = ctx.args
    pack_s = await trio.to_thread.run_sync(pack_check_seconds, ctx.assets, ctx.data_dir)
    # Cold first: the warm server builds its snapshot at start, which must not overlap a cold sample.
    await use_server(ctx, "cold", warm=False)
    try:
        cold = await measure_open(ctx, "cold")
    finally:
        await drop_server(ctx)
    await use_server(ctx, "warm", warm=True)
    try:
        warm = await measure_open(ctx, "warm")
        execs = await measure_exec(ctx)
    finally:
        await drop_server(ctx)

    ratios = {o.kind: med(o.rigd) / med(o.raw) for o in (cold, warm)}
    r_exec = med(execs.agent) / med(execs.qga)
    r_http = med(execs.http) / med(execs.qga)
    digest = ctx.assets.image_digest
    print()
    print(f"terminal bench (accel {a.accel}, {a.memory_mb} MB, {a.vcpus} vCPU, image {digest[:19]}…, "
          f"kernel {ctx.assets.kernel_release})")
    print(f"(a) open→ready, cold   rigd {fmt_s(med(cold.rigd))}   raw qemu boot    {fmt_s(med(cold.raw))}   "
          f"ratio {ratios['cold']:.2f}  ({verdict(ratios['cold'], TARGET_OPEN)})")
    print(f"    open→ready, warm   rigd {fmt_s(med(warm.rigd))}   raw qemu restore {fmt_s(med(warm.raw))}   "
          f"ratio {ratios['warm']:.2f}  ({verdict(ratios['warm'], TARGET_OPEN)})"
          + (f"; {warm.left_out} rigd opens booted cold and were left out" if warm.left_out else ""))
    print(f"(b) exec rtt     rigd agent {fmt_ms(med(execs.agent))}   qemu-ga guest-exec "
          f"{fmt_ms(med(execs.qga))}   ratio {r_exec:.2f}  ({verdict(r_exec, TARGET_EXEC)})")
    print(f"    rig.act over HTTP {fmt_ms(med(execs.http))} vs qemu-ga {fmt_ms(med(execs.qga))}: "
          f"ratio {r_http:.2f}")
    print("context:")
    print(f"    rounds: {a.rounds} opens per side and pair + {a.exec_rounds} execs per side, after warm-ups; "
          "medians")
    cold_shape, warm_shape = argv_shape(cold.like), argv_shape(warm.like)
    added = " ".join(x for x in warm_shape if x not in cold_shape) or "nothing"
    dropped = " ".join(x for x in cold_shape if x not in warm_shape)
    print(f"    raw peers run rigd's own QEMU argv (/proc/<pid>/cmdline; paths swapped, the NIC's "
          f"{_netdev(cold.like)} backend an empty hub); a restored rig's argv adds {added} to a cold "
          f"rig's" + (f" and drops {dropped}" if dropped else ""))
    for o, peer in ((cold, "raw spawn → ready line"), (warm, "raw spawn → first hello")):
        if o.pre_qemu:
            print(f"    {o.kind} rig.open split (server log, ms clock): RPC → QEMU spawned "
                  f"{fmt_ms(med(o.pre_qemu))} (queue, db, pack check, gateway, overlay, uid); QEMU spawned → "
                  f"RPC answered {fmt_s(med(o.post_qemu))} ({peer} {fmt_s(med(o.raw))})")
    if warm.snapshot is not None:
        meta = json.loads((warm.snapshot / META_FILE).read_text())
        print(f"    snapshot {warm.snapshot.name}: memory.zst "
              f"{(warm.snapshot / MEMORY_FILE).stat().st_size / 1e6:.0f} MB, built in "
              f"{meta.get('buildS')} s; "
              f"memory load (migrate-incoming → completed) rigd {fmt_ms(med(warm.rigd_load))} (server log), "
              f"raw {fmt_ms(med(warm.raw_load))}")
    print(f"    warm pack check (ensure_pack, in-process) {fmt_ms(pack_s)}; qemu-img create overlay "
          f"{fmt_ms(med(ctx.overlay_s))} (raw peers: before the clock); rig.close (untimed for the ratio) "
          f"{fmt_s(med(ctx.close_s))}")
    hello = execs.qga_boot_hello
    if hello is not None:
        print(f"    peer VM with a rigd-style hello loop: ready line {fmt_s(execs.qga_boot_ready)}, "
              f"hello answered {fmt_s(hello)} after spawn (+{fmt_ms(hello - execs.qga_boot_ready)})")
    print(f"    qemu-ga status polls per exec: median {med([float(p) for p in execs.polls]):.0f} "
          f"(back-to-back)")
    print(f"    rigd agent's own durationMs (spawn → reaped, in the guest): median "
          f"{med(execs.agent_guest_ms):.0f} ms of its {fmt_ms(med(execs.agent))} round trip")
    print(f"    channel alone (no spawn): rigd agent ping {fmt_ms(med(execs.agent_ping))}, "
          f"qemu-ga guest-ping {fmt_ms(med(execs.qga_ping))}")
    load = os.getloadavg()
    print(f"    host: {os.cpu_count()} CPUs, load {load[0]:.2f}/{load[1]:.2f}/{load[2]:.2f}; "
          f"other QEMUs running during the run (not ours): up to {ctx.other_qemus}")
    missed = any(r > TARGET_OPEN for r in ratios.values()) or r_exec > TARGET_EXEC or warm.left_out
    if a.strict and missed:
        return 1
    return 0


# --- main --------------------------------------------------------------------------


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0] if __doc__ else None)
    p.add_argument("--rounds", type=int, default=5, help="measured rounds per side (default 5)")
    p.add_argument("--exec-rounds", type=int, default=None, help="rounds for (b) (default: --rounds)")
    p.add_argument("--accel", default="tcg", choices=["tcg", "kvm"], help="default tcg")
    p.add_argument("--memory-mb", type=int, default=512)
    p.add_argument("--vcpus", type=int, default=2)
    p.add_argument("--qemu", default="qemu-system-x86_64")
    p.add_argument("--qemu-img", default="qemu-img")
    p.add_argument("--boot-timeout", type=float, default=180.0, help="seconds per boot (TCG is slow)")
    p.add_argument("--data-dir", help="a data directory to use and keep (default: a temporary one "
                   "under /var/tmp, removed afterwards)")
    p.add_argument("--keep", action="store_true", help="keep the temporary data directory (and server log)")
    p.add_argument("--strict", action="store_true", help="exit 1 when a target is not met")
    args = p.parse_args(argv)
    if args.rounds < 1:
        p.error("--rounds must be at least 1")
    if args.exec_rounds is None:
        args.exec_rounds = args.rounds
    return args


def _sigterm(_signum: int, _frame: object) -> None:
    raise KeyboardInterrupt


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    logging.basicConfig(level=logging.WARNING, format="%(levelname)s %(name)s %(message)s")
    signal.signal(signal.SIGTERM, _sigterm)
    own_dir = args.data_dir is None
    data_dir = Path(args.data_dir or tempfile.mkdtemp(prefix="rigd-bench-", dir="/var/tmp")).resolve()
    data_dir.mkdir(parents=True, exist_ok=True)
    os.chmod(data_dir, 0o711)  # per-rig QEMU uids traverse it
    server_log = data_dir / "bench-server.log"
    ctx: Ctx | None = None
    rc = 1
    try:
        cache_assets = find_assets()
        t = time.perf_counter()
        rootfs = ensure_pack(cache_assets, data_dir, lambda step: print(f"pack: {step}", flush=True))
        print(f"pack {rootfs} ({time.perf_counter() - t:.1f} s)", flush=True)
        # The very files the servers' rigs boot (hard links into the build cache).
        assets = publish_assets(cache_assets, data_dir)
        ctx = Ctx(args=args, assets=assets, rootfs=rootfs, data_dir=data_dir,
                  raw_root=data_dir / "bench-raw", server_log=server_log)
        ctx.raw_root.mkdir(exist_ok=True)
        rc = trio.run(bench_main, ctx)
    except BaseException as exc:
        found = leaves(exc)
        if any(isinstance(e, KeyboardInterrupt) for e in found):
            print("bench: interrupted", file=sys.stderr)
            rc = 130
        elif all(isinstance(e, BenchError) for e in found):
            for e in found:
                print(f"bench: {e}", file=sys.stderr)
            rc = 1
        else:
            raise  # a bug: the traceback, after the clean-up below
    finally:
        rc = clean_up(ctx.server if ctx is not None else None, rc, server_log=server_log,
                      data_dir=data_dir, keep=args.keep, own_dir=own_dir)
    return rc


if __name__ == "__main__":
    sys.exit(main())
