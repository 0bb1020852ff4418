"""The lanes against their named peers, measured in one run (``make bench``).

Issue 10's "How it is shown", each ratio against a peer measured in the
same run, on the same image, kernel, accelerator, memory and vCPUs (speed
targets live here, never in timed tests):

(1) **Files in and out.** A 256 MiB file of random bytes (made, and hashed,
    before any clock starts) dropped into a terminal rig through the lane
    (:meth:`LaneClient.upload`: ``POST /rig/files/<rigId>``, the whole call,
    the client's hashing pass included) and read back out
    (:meth:`LaneClient.download`: ``GET /rig/files/<rigId>?p=…``, saved to a
    host file), against Debian's ``qemu-ga`` in a raw QEMU of the same
    image: ``guest-file-open`` (mode ``w``) + ``guest-file-write`` chunks
    (base64) + ``guest-file-close``, and ``guest-file-open`` (``r``) +
    ``guest-file-read`` until ``eof`` (saved to a host file). qemu-ga is
    driven the way libvirt drives it: one command, then its reply. Its chunk
    size (1 MiB or 4 MiB per command; a read may ask for at most 48 MiB,
    qemu-ga's ``GUEST_FILE_READ_COUNT_MAX``) is chosen by a short probe run
    first; the probe's numbers are printed. Both sides' bytes are checked by
    sha256: the guests' own ``sha256sum`` after the uploads, the host's hash
    of what arrived after the downloads. Ratio rigd MB/s / qemu-ga MB/s;
    target ≥ 3 each way.
(2) **The server's memory during the upload**: VmRSS of the ``rigd serve``
    process, sampled from ``/proc/<pid>/status`` every 20 ms by a thread from
    just before to just after the upload (and VmHWM, reset just before
    through ``/proc/<pid>/clear_refs``, which no sample interval can miss).
    Growth = peak minus before; target ≤ 32 MiB.
(3) **Typing** 200 mixed characters (ASCII, shifted symbols, newlines, é ö
    世 …) into a focused xfce4-terminal running ``cat > file`` on a computer
    rig: ``rig.act computer_use type`` against ``xdotool type`` (its
    default 12 ms between keys) of the same text run in the guest through
    ``rig.act terminal_use exec``; both are one ``rig.act`` call, timed from
    request to answer, and what arrived in each file is checked. Ratio rigd /
    xdotool (below 1: rigd is faster); issue 10 names no target. The file
    is read once it holds the text or stops changing; then ctrl+d ends cat
    (a window that stays is closed by id and said so). Skipped with
    ``--no-desktop``, or, saying why, when there is no desktop image or the
    verb fails; ``--no-files`` runs (3) alone.

One server (``RIGD_WARM_STARTS=0``, so no snapshot build runs beside a
measurement) serves both rigs, one after the other. Every process started
here is killed by pid on the way out, also on errors, Ctrl-C and SIGTERM. A
missed target is printed "not met", never tuned away; exit 0 unless
``--strict``.
"""

from __future__ import annotations

import argparse
import base64
import hashlib
import json
import logging
import os
import shlex
import signal
import sys
import tempfile
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import trio

# _common (beside this script) puts this checkout first on sys.path, so it comes before rigd.
from _common import REAPER, BenchError, clean_up, fmt_ms, fmt_s, leaves, med, tail
from terminal import (
    Ctx,
    QGAClient,
    RawVM,
    drop_server,
    in_thread,
    raw_vm,
    rigd_close,
    start_qga,
    use_server,
)

from rigd.client.cli import ClientError
from rigd.client.lanes import LaneClient, LaneError
from rigd.errors import RigdError
from rigd.images import find_assets
from rigd.images.desktop import find_desktop
from rigd.images.pack import ensure_pack
from rigd.protocols.guest import Stream
from rigd.server.main import publish_assets

MIB = 1024 * 1024
TARGET_RATE = 3.0  # rigd / qemu-ga, MB/s, each way
TARGET_RSS_MIB = 32.0
#: qemu-ga's own cap on one guest-file-read (qga/commands.c GUEST_FILE_READ_COUNT_MAX).
QGA_READ_MAX = 48 * MIB
QGA_CHUNKS = (1 * MIB, 4 * MIB)
RSS_EVERY_S = 0.02
#: A transfer of the whole file, whichever side, under TCG.
TRANSFER_TIMEOUT_S = 1800
SESSION = {"DISPLAY": ":0", "XAUTHORITY": "/home/rig/.Xauthority"}

#: 200 characters: letters, digits, shifted symbols, newlines, and some that are on no US key.
TYPED = (
    "Hello rig, 42 keys: The quick brown fox jumps over the lazy dog.\n"
    "Symbols ~!@#$%^&*()_+{}|:\"<>? and -=[]\\;',./`\n"
    "café, déjà vu, schön grün, Ölfeld; 世界 ok\n"
    "Zip 10115 Berlin, Größe 3 x 7 = 21; alles gut!!\n"
)
assert len(TYPED) == 200, len(TYPED)

log = logging.getLogger("bench")


def verdict_min(value: float, target: float) -> str:
    return f"target ≥ {target:g}: {'met' if value >= target else 'not met'}"


def verdict_max(value: float, target: float) -> str:
    return f"target ≤ {target:g}: {'met' if value <= target else 'not met'}"


def rate(nbytes: int, seconds: float) -> float:
    """MiB/s."""
    return nbytes / MIB / seconds if seconds > 0 else float("nan")


def fmt_rate(x: float) -> str:
    return f"{x:.1f} MiB/s"


# --- the server's resident memory -------------------------------------------------


def _status_kib(pid: int, key: bytes) -> int | None:
    try:
        with open(f"/proc/{pid}/status", "rb") as fh:
            for line in fh:
                if line.startswith(key):
                    return int(line.split()[1])
    except (OSError, ValueError, IndexError):
        return None
    return None


class RssSampler:
    """VmRSS of one process every ``every`` seconds, in a thread, between start and stop."""

    def __init__(self, pid: int, every: float = RSS_EVERY_S) -> None:
        self.pid = pid
        self.every = every
        self.samples: list[int] = []  # KiB
        self.hwm_reset = False
        self.hwm_kib: int | None = None
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="rss-sampler", daemon=True)

    def _run(self) -> None:
        while True:
            kib = _status_kib(self.pid, b"VmRSS:")
            if kib is not None:
                self.samples.append(kib)
            if self._stop.wait(self.every):
                return

    def start(self) -> None:
        try:  # "5": reset the peak resident set size (proc(5), clear_refs)
            Path(f"/proc/{self.pid}/clear_refs").write_text("5")
            self.hwm_reset = True
        except OSError:
            self.hwm_reset = False
        self._thread.start()
        while not self.samples and self._thread.is_alive():
            time.sleep(0.001)

    def stop(self) -> None:
        self._stop.set()
        self._thread.join()
        kib = _status_kib(self.pid, b"VmRSS:")
        if kib is not None:
            self.samples.append(kib)
        self.hwm_kib = _status_kib(self.pid, b"VmHWM:")

    @property
    def before_mib(self) -> float:
        return self.samples[0] / 1024 if self.samples else float("nan")

    @property
    def peak_mib(self) -> float:
        return max(self.samples) / 1024 if self.samples else float("nan")


# --- the qemu-ga peer's file commands ----------------------------------------------


class BulkQGA(QGAClient):
    """:class:`QGAClient`, reading multi-megabyte replies without rescanning its buffer.

    A 4 MiB ``guest-file-read`` answers one 5.6 MB line; looking for its
    newline from the start after every 64 KiB read would cost the peer time
    that is ours, not qemu-ga's.
    """

    def __init__(self, qga: QGAClient) -> None:
        super().__init__(qga.stream)
        self.buf = qga.buf
        self._scanned = 0

    async def receive(self) -> dict[str, Any]:
        while True:
            nl = self.buf.find(b"\n", self._scanned)
            if nl < 0:
                self._scanned = len(self.buf)
                data = await self.stream.receive_some(1 << 20)
                if not data:
                    raise BenchError("qemu-ga channel closed")
                self.buf += data
                continue
            line = bytes(self.buf[:nl]).strip(b"\xff \r\t")
            del self.buf[: nl + 1]
            self._scanned = 0
            if not line:
                continue
            try:
                msg = json.loads(line)
            except ValueError:
                continue
            if isinstance(msg, dict):
                return msg


async def qga_put(qga: BulkQGA, src: Path, guest_path: str, chunk: int, limit: int | None = None) -> float:
    """Write ``src`` (its first ``limit`` bytes) to ``guest_path``; the seconds it took."""
    t0 = time.perf_counter()
    handle = await qga.call("guest-file-open", {"path": guest_path, "mode": "w"})
    sent = 0
    with src.open("rb") as fh:
        while limit is None or sent < limit:
            data = fh.read(chunk if limit is None else min(chunk, limit - sent))
            if not data:
                break
            ret = await qga.call("guest-file-write",
                                 {"handle": handle, "buf-b64": base64.b64encode(data).decode()})
            if ret.get("count") != len(data):
                raise BenchError(f"qemu-ga wrote {ret.get('count')} of {len(data)} bytes")
            sent += len(data)
    await qga.call("guest-file-close", {"handle": handle})
    return time.perf_counter() - t0


@dataclass(slots=True)
class Pulled:
    seconds: float
    bytes: int
    sha256: str


async def qga_get(qga: BulkQGA, guest_path: str, dest: Path, chunk: int) -> Pulled:
    """Read ``guest_path`` to ``dest`` on the host, ``chunk`` bytes a call, until eof."""
    if chunk > QGA_READ_MAX:
        raise BenchError(f"qemu-ga reads at most {QGA_READ_MAX} bytes a call")
    sha = hashlib.sha256()
    got = 0
    t0 = time.perf_counter()
    handle = await qga.call("guest-file-open", {"path": guest_path, "mode": "r"})
    with dest.open("wb") as fh:
        while True:
            ret = await qga.call("guest-file-read", {"handle": handle, "count": chunk})
            data = base64.b64decode(ret.get("buf-b64", ""))
            if len(data) != ret.get("count"):
                raise BenchError(f"qemu-ga said {ret.get('count')} bytes and sent {len(data)}")
            fh.write(data)
            sha.update(data)
            got += len(data)
            if ret.get("eof") or not data:
                break
    await qga.call("guest-file-close", {"handle": handle})
    return Pulled(time.perf_counter() - t0, got, sha.hexdigest())


async def agent_sh(vm: RawVM, command: str, timeout: float = 300) -> str:
    """A shell line in the raw peer, through its rigd agent (for checks, never timed)."""
    assert vm.guest is not None
    out = bytearray()

    def on_stream(ev: Stream) -> None:
        if ev.name == "out" and ev.body.get("fd") == 1:
            out.extend(ev.data[:65536])

    body = await vm.guest.request("exec", timeout=timeout + 30, on_stream=on_stream,
                                  argv=["sh", "-c", command], timeoutMs=int(timeout * 1000))
    if body.get("exitCode") != 0:
        raise BenchError(f"peer guest: {command!r} exited {body}: {tail(out)}")
    return out.decode(errors="replace")


# --- the rigd side -----------------------------------------------------------------


def rig_open(ctx: Ctx, surface: str, memory_mb: int) -> str:
    a = ctx.args
    rig = ctx.client.call("rig.open", {"workspace": "default", "surface": surface,
                                       "memoryMb": memory_mb, "vcpus": a.vcpus},
                          timeout=a.boot_timeout + 300)
    pid = rig.get("pid")
    if isinstance(pid, int):
        REAPER.add(pid, f"rigd qemu ({rig['id']})")
    if rig.get("phase") != "ready":
        raise BenchError(f"rig.open {surface} answered phase {rig.get('phase')}: {rig.get('failure')}")
    return str(rig["id"])


def rig_sh(ctx: Ctx, rig_id: str, command: str, timeout: float = 120) -> str:
    out = ctx.client.call("rig.act", {"rigId": rig_id, "tool": "terminal_use",
                                      "action": {"action": "exec", "command": command, "timeoutS": timeout}},
                          timeout=timeout + 60)
    if out.get("exitCode") != 0:
        raise BenchError(f"rig {rig_id}: {command!r} exited {out.get('exitCode')}: "
                         f"{str(out.get('stderr'))[-400:]}")
    return str(out["stdout"]["text"])


def sha256sum_in(text: str) -> str:
    return text.split()[0] if text.split() else ""


def lane_client(ctx: Ctx) -> LaneClient:
    srv = ctx.server
    if srv is None:
        raise BenchError("no server is running")
    return LaneClient(srv.url, srv.client.token, timeout=TRANSFER_TIMEOUT_S)


# --- (1) and (2): files ---------------------------------------------------------------


@dataclass(slots=True)
class FilesResult:
    size: int
    rigd_up: list[float] = field(default_factory=list)
    rigd_down: list[float] = field(default_factory=list)
    qga_up: list[float] = field(default_factory=list)
    qga_down: list[float] = field(default_factory=list)
    write_chunk: int = 0
    read_chunk: int = 0
    probe: dict[str, float] = field(default_factory=dict)  # "write 1 MiB" → MiB/s
    rss: list[RssSampler] = field(default_factory=list)
    lane_error: str | None = None


def make_payload(path: Path, size: int) -> str:
    sha = hashlib.sha256()
    with path.open("wb") as fh:
        left = size
        while left:
            data = os.urandom(min(MIB, left))
            fh.write(data)
            sha.update(data)
            left -= len(data)
    return sha.hexdigest()


async def probe_chunks(qga: BulkQGA, vm: RawVM, src: Path, out: FilesResult, probe_bytes: int,
                       scratch: Path) -> None:
    """One write and one read of ``probe_bytes`` per chunk size; keep the faster of each."""
    best_w = best_r = (0.0, QGA_CHUNKS[0])
    for chunk in QGA_CHUNKS:
        dt = await qga_put(qga, src, "/root/qga-probe.bin", chunk, limit=probe_bytes)
        w = rate(probe_bytes, dt)
        await agent_sh(vm, "sync")
        pulled = await qga_get(qga, "/root/qga-probe.bin", scratch, chunk)
        r = rate(pulled.bytes, pulled.seconds)
        out.probe[f"write {chunk // MIB} MiB"] = w
        out.probe[f"read {chunk // MIB} MiB"] = r
        print(f"    probe  qemu-ga {chunk // MIB} MiB a call, {probe_bytes // MIB} MiB: "
              f"write {fmt_rate(w)}, read {fmt_rate(r)}", flush=True)
        best_w = max(best_w, (w, chunk))
        best_r = max(best_r, (r, chunk))
    await trio.Path(scratch).unlink(missing_ok=True)
    await agent_sh(vm, "rm -f /root/qga-probe.bin && sync")
    out.write_chunk, out.read_chunk = best_w[1], best_r[1]


async def measure_files(ctx: Ctx, work: Path) -> FilesResult:
    a = ctx.args
    size = a.file_mib * MIB
    out = FilesResult(size)
    src = work / "payload.bin"
    t = time.perf_counter()
    want = await trio.to_thread.run_sync(make_payload, src, size)
    print(f"(1) files: {a.file_mib} MiB of random bytes (sha256 {want[:16]}…, made in "
          f"{fmt_s(time.perf_counter() - t)}): rigd lanes  vs  qemu-ga guest-file-write/-read", flush=True)
    srv = ctx.server
    assert srv is not None
    rig_id = await in_thread(lambda: rig_open(ctx, "terminal", a.memory_mb))
    lanes = lane_client(ctx)
    back = work / "back.bin"
    try:
        async with raw_vm(ctx, qga=True, hello=True) as vm:
            qga = BulkQGA(await start_qga(vm))
            info = await qga.call("guest-info")
            print(f"    terminal rig {rig_id}; peer VM with qemu-ga {info.get('version')}", flush=True)
            await probe_chunks(qga, vm, src, out, min(a.probe_mib * MIB, size), work / "probe.bin")
            print(f"    qemu-ga chunks: write {out.write_chunk // MIB} MiB, read {out.read_chunk // MIB} MiB "
                  "(the faster in the probe)", flush=True)
            for i in range(a.rounds):
                for side in (("rigd", "qga") if i % 2 == 0 else ("qga", "rigd")):
                    if side == "rigd":
                        if out.lane_error is None:
                            await rigd_round(ctx, lanes, rig_id, src, back, want, out, i)
                    else:
                        await qga_round(qga, vm, src, back, want, out, i)
            await qga.stream.aclose()
    finally:
        back.unlink(missing_ok=True)
        with trio.CancelScope(shield=True):
            await rigd_close(ctx, rig_id)
            src.unlink(missing_ok=True)
    return out


async def rigd_round(ctx: Ctx, lanes: LaneClient, rig_id: str, src: Path, back: Path, want: str,
                     out: FilesResult, i: int) -> None:
    srv = ctx.server
    assert srv is not None
    await in_thread(lambda: rig_sh(ctx, rig_id, "rm -rf /root/drops && sync"))
    sampler = RssSampler(srv.proc.pid)
    await trio.to_thread.run_sync(sampler.start)

    def upload() -> tuple[float, dict[str, Any]]:
        t0 = time.perf_counter()
        answer = lanes.upload(rig_id, [src], show=False)
        return time.perf_counter() - t0, answer

    try:
        with trio.fail_after(TRANSFER_TIMEOUT_S):
            dt, answer = await in_thread(upload)
    except LaneError as exc:
        out.lane_error = str(exc)
        print(f"    round {i + 1}  rigd upload refused: {exc}", flush=True)
        return
    finally:
        await trio.to_thread.run_sync(sampler.stop)
    saved = answer["saved"][0]
    if saved["sha256"] != want or saved["bytes"] != out.size:
        raise BenchError(f"the lane saved {saved}, not {out.size} bytes with sha256 {want}")
    guest = await in_thread(lambda: rig_sh(ctx, rig_id, f"sha256sum {shlex.quote(saved['path'])} && sync",
                                           timeout=600))
    if sha256sum_in(guest) != want:
        raise BenchError(f"the rig's own sha256sum of {saved['path']} is {guest.strip()!r}, not {want}")
    out.rigd_up.append(dt)
    out.rss.append(sampler)

    def download() -> tuple[float, dict[str, Any]]:
        t0 = time.perf_counter()
        got = lanes.download(rig_id, saved["path"], back, show=False)
        return time.perf_counter() - t0, got

    with trio.fail_after(TRANSFER_TIMEOUT_S):
        ddt, got = await in_thread(download)
    if got["sha256"] != want or got["bytes"] != out.size:
        raise BenchError(f"the lane's download is {got}, not {out.size} bytes with sha256 {want}")
    await trio.Path(back).unlink()
    out.rigd_down.append(ddt)
    growth = sampler.peak_mib - sampler.before_mib
    print(f"    round {i + 1}  rigd lanes  up {fmt_rate(rate(out.size, dt))} ({fmt_s(dt)})   "
          f"down {fmt_rate(rate(out.size, ddt))} ({fmt_s(ddt)})   server RSS +{growth:.1f} MiB "
          f"(sha256 checked: agent, guest sha256sum, host)", flush=True)


async def qga_round(qga: BulkQGA, vm: RawVM, src: Path, back: Path, want: str, out: FilesResult,
                    i: int) -> None:
    path = "/root/qga-payload.bin"
    await agent_sh(vm, f"rm -f {path} && sync")
    with trio.fail_after(TRANSFER_TIMEOUT_S):
        dt = await qga_put(qga, src, path, out.write_chunk)
    guest = await agent_sh(vm, f"sha256sum {path} && sync", timeout=600)
    if sha256sum_in(guest) != want:
        raise BenchError(f"the peer's sha256sum of {path} is {guest.strip()!r}, not {want}")
    out.qga_up.append(dt)
    with trio.fail_after(TRANSFER_TIMEOUT_S):
        pulled = await qga_get(qga, path, back, out.read_chunk)
    if pulled.sha256 != want or pulled.bytes != out.size:
        raise BenchError(f"qemu-ga read {pulled.bytes} bytes with sha256 {pulled.sha256}, not {want}")
    await trio.Path(back).unlink()
    out.qga_down.append(pulled.seconds)
    print(f"    round {i + 1}  qemu-ga     up {fmt_rate(rate(out.size, dt))} ({fmt_s(dt)})   "
          f"down {fmt_rate(rate(out.size, pulled.seconds))} ({fmt_s(pulled.seconds)})   "
          "(sha256 checked: guest sha256sum, host)", flush=True)


# --- (3): typing -----------------------------------------------------------------------


#: Why (3) has no figure when the person asked for none.
NOT_ASKED = "--no-desktop"


@dataclass(slots=True)
class TypingResult:
    rigd: list[float] = field(default_factory=list)
    xdotool: list[float] = field(default_factory=list)
    via: set[str] = field(default_factory=set)
    arrived: dict[str, bool] = field(default_factory=dict)  # side → the file held exactly TYPED
    skipped: str | None = None


def wait_for(ctx: Ctx, rig_id: str, command: str, what: str, deadline_s: float) -> str:
    end = time.monotonic() + deadline_s
    while True:
        out = ctx.client.call("rig.act", {"rigId": rig_id, "tool": "terminal_use",
                                          "action": {"action": "exec", "command": command, "timeoutS": 30}},
                              timeout=120)
        if out.get("exitCode") == 0:
            return str(out["stdout"]["text"])
        if time.monotonic() > end:
            raise BenchError(f"{what}: not within {deadline_s:.0f} s ({command!r} → {out})")
        time.sleep(0.5)


def type_once(ctx: Ctx, rig_id: str, side: str, n: int) -> tuple[float, str | None, str, str]:
    """Open a terminal running ``cat > file``, type TYPED into it, end cat.

    (seconds of the typing call, the verb's ``via``, what the file holds, a note).
    """
    title = f"rigd-type-{side}-{n}"
    path = f"/tmp/{title}.txt"
    rig_sh(ctx, rig_id, f"rm -f {path}; setsid -f xfce4-terminal --disable-server "
                        f"--geometry 100x30+80+80 --title {title} -x sh -c {shlex.quote(f'cat > {path}')} "
                        ">/dev/null 2>&1")
    wait_for(ctx, rig_id, f"test -e {path} && DISPLAY=:0 XAUTHORITY=/home/rig/.Xauthority "
                          f"xdotool getactivewindow getwindowname | grep -qx {title}",
             f"the terminal {title} to have the focus", 240)
    time.sleep(0.5)
    via: str | None = None
    t0 = time.perf_counter()
    if side == "rigd":
        typed = ctx.client.call("rig.act", {"rigId": rig_id, "tool": "computer_use",
                                            "action": {"action": "type", "text": TYPED}}, timeout=600)
        dt = time.perf_counter() - t0
        via = str(typed.get("via"))
        if typed.get("dropped"):
            raise BenchError(f"computer_use type dropped characters: {typed}")
    else:
        res = ctx.client.call("rig.act", {"rigId": rig_id, "tool": "terminal_use", "action": {
            "action": "exec", "argv": ["xdotool", "type", TYPED], "env": SESSION, "timeoutS": 300}},
            timeout=600)
        dt = time.perf_counter() - t0
        if res.get("exitCode") != 0:
            raise BenchError(f"xdotool type exited {res.get('exitCode')}: {str(res.get('stderr'))[-400:]}")
    # cat writes each line as its newline arrives, and TYPED ends in one: the file is complete
    # once it holds TYPED, or has stopped changing (then what arrived is reported as it is).
    got = settled_file(ctx, rig_id, path)
    # Then one ctrl+d ends cat (and the terminal with it); a window that stays is closed by id.
    ctx.client.call("rig.act", {"rigId": rig_id, "tool": "computer_use",
                                "action": {"action": "key", "text": "ctrl+d"}}, timeout=120)
    search = f"DISPLAY=:0 XAUTHORITY=/home/rig/.Xauthority xdotool search --name '^{title}$'"
    try:
        wait_for(ctx, rig_id, f"! {search}", f"the terminal {title} to close after ctrl+d", 30)
        note = ""
    except BenchError:
        note = "its window stayed open after ctrl+d (closed by the bench)"
        ctx.client.call("rig.act", {"rigId": rig_id, "tool": "terminal_use", "action": {
            "action": "exec", "command": f"{search} windowkill || true", "timeoutS": 30}}, timeout=120)
    return dt, via, got, note


def settled_file(ctx: Ctx, rig_id: str, path: str, quiet_s: float = 5.0, deadline_s: float = 90.0) -> str:
    """The file's text once it equals TYPED, or once it has not changed for ``quiet_s``."""
    end = time.monotonic() + deadline_s
    last, since = None, time.monotonic()
    while True:
        res = ctx.client.call("rig.act", {"rigId": rig_id, "tool": "terminal_use", "action": {
            "action": "exec", "argv": ["cat", path]}}, timeout=120)
        text = str(res["stdout"]["text"])
        if text == TYPED:
            return text
        if text != last:
            last, since = text, time.monotonic()
        if time.monotonic() - since >= quiet_s or time.monotonic() > end:
            return text
        time.sleep(0.5)


def _diff(want: str, got: str) -> str:
    pairs = enumerate(zip(want, got, strict=False))
    at = next((i for i, (x, y) in pairs if x != y), min(len(want), len(got)))
    return (f"{len(got)} of {len(want)} characters, first difference at character {at}: "
            f"wanted {want[at:at + 12]!r}, got {got[at:at + 12]!r}")


async def measure_typing(ctx: Ctx) -> TypingResult:
    out = TypingResult()
    print("(3) typing 200 characters into a focused terminal: computer_use type  vs  xdotool type "
          "in the guest (terminal_use exec)", flush=True)
    try:
        find_desktop()
    except RigdError as exc:
        out.skipped = f"no desktop image ({exc}; `make images-desktop` builds it)"
        print(f"    skipped: {out.skipped}", flush=True)
        return out
    a = ctx.args
    t = time.perf_counter()
    try:
        rig_id = await in_thread(lambda: rig_open(ctx, "computer", a.desktop_memory_mb))
    except (BenchError, ClientError, RigdError, OSError) as exc:
        out.skipped = f"the computer rig did not open: {str(exc)[:400]}"
        print(f"    skipped: {out.skipped}", flush=True)
        return out
    print(f"    computer rig {rig_id} ready in {fmt_s(time.perf_counter() - t)}", flush=True)
    try:
        for i in range(a.rounds):
            for side in (("rigd", "xdotool") if i % 2 == 0 else ("xdotool", "rigd")):
                try:
                    dt, via, got, note = await in_thread(lambda s=side, n=i: type_once(ctx, rig_id, s, n))
                except Exception as exc:  # the verb's refusal, a ClientError, a window that never came
                    what = "computer_use type" if side == "rigd" else "xdotool type"
                    out.skipped = f"{what} (or its terminal window) failed: {str(exc)[:400]}"
                    print(f"    stopped: {out.skipped}", flush=True)
                    return out
                ok = got == TYPED
                out.arrived[side] = out.arrived.get(side, True) and ok
                (out.rigd if side == "rigd" else out.xdotool).append(dt)
                if via is not None:
                    out.via.add(via)
                print(f"    round {i + 1}  {side:8s} {fmt_s(dt)}" + (f" (via {via})" if via else "")
                      + ("   arrived intact" if ok else f"   arrived DIFFERENT: {_diff(TYPED, got)}")
                      + (f"; {note}" if note else ""), flush=True)
    finally:
        with trio.CancelScope(shield=True):
            await rigd_close(ctx, rig_id)
    return out


# --- the run -----------------------------------------------------------------------------


def report_files(files: FilesResult) -> bool:
    """Print (1) and (2); whether a target was missed."""
    up_q, down_q = rate(files.size, med(files.qga_up)), rate(files.size, med(files.qga_down))
    w, r = files.write_chunk // MIB, files.read_chunk // MIB
    if files.lane_error is not None:
        print(f"(1) files: the rigd lane refused the upload: {files.lane_error}")
        print(f"    qemu-ga alone: guest-file-write ({w} MiB a call) {fmt_rate(up_q)}, "
              f"guest-file-read ({r} MiB a call) {fmt_rate(down_q)}")
        return True
    up_r, down_r = rate(files.size, med(files.rigd_up)), rate(files.size, med(files.rigd_down))
    ratio_up, ratio_down = up_r / up_q, down_r / down_q
    print(f"(1) upload    rigd lane {fmt_rate(up_r)}   qemu-ga guest-file-write ({w} MiB a call) "
          f"{fmt_rate(up_q)}   ratio {ratio_up:.2f}  ({verdict_min(ratio_up, TARGET_RATE)})")
    print(f"    download  rigd lane {fmt_rate(down_r)}   qemu-ga guest-file-read ({r} MiB a call) "
          f"{fmt_rate(down_q)}   ratio {ratio_down:.2f}  ({verdict_min(ratio_down, TARGET_RATE)})")
    worst = max(files.rss, key=lambda s: s.peak_mib - s.before_mib)
    growth = worst.peak_mib - worst.before_mib
    hwm = ""
    if worst.hwm_reset and worst.hwm_kib is not None:
        hwm = (f"; VmHWM (reset just before) {worst.hwm_kib / 1024:.1f} MiB = "
               f"+{worst.hwm_kib / 1024 - worst.before_mib:.1f} MiB")
    print(f"(2) server RSS during the upload: before {worst.before_mib:.1f} MiB, peak {worst.peak_mib:.1f} "
          f"MiB, growth {growth:.1f} MiB  ({verdict_max(growth, TARGET_RSS_MIB)})  "
          f"[{len(worst.samples)} samples every {RSS_EVERY_S * 1000:.0f} ms{hwm}]")
    return ratio_up < TARGET_RATE or ratio_down < TARGET_RATE or growth > TARGET_RSS_MIB


def report_typing(typing: TypingResult) -> bool:
    """Print (3): the ratio, or why there is none (and what was measured before it stopped);
    True when a figure that was asked for is missing."""
    intact = ", ".join(f"{s} {'intact' if ok else 'DIFFERENT'}" for s, ok in typing.arrived.items())
    via = "/".join(sorted(typing.via)) or "-"
    if typing.skipped is None and typing.rigd and typing.xdotool:
        ratio = med(typing.rigd) / med(typing.xdotool)
        print(f"(3) typing 200 chars  rigd computer_use type {fmt_s(med(typing.rigd))} (via {via})   "
              f"xdotool type {fmt_s(med(typing.xdotool))}   ratio {ratio:.2f} (below 1: rigd is faster; "
              f"issue 10 names no target)   [{intact}]")
        return False
    print(f"(3) typing: no ratio ({typing.skipped})")
    if typing.rigd or typing.xdotool:
        print(f"    measured before that: rigd {[fmt_s(x) for x in typing.rigd]} (via {via}), "
              f"xdotool {[fmt_s(x) for x in typing.xdotool]}   [{intact}]")
    return typing.skipped != NOT_ASKED


async def run_bench(ctx: Ctx) -> int:
    a = ctx.args
    work = ctx.data_dir / "bench-lanes"
    work.mkdir(exist_ok=True)
    await use_server(ctx, "lanes", warm=False)
    try:
        files = None if a.no_files else await measure_files(ctx, work)
        typing = TypingResult(skipped=NOT_ASKED) if a.no_desktop else await measure_typing(ctx)
    finally:
        await drop_server(ctx)

    print()
    print(f"lanes bench (accel {a.accel}, {a.memory_mb} MB terminal guests, {a.vcpus} vCPU, image "
          f"{ctx.assets.image_digest[:19]}…, {a.file_mib} MiB file, {a.rounds} round(s), medians)")
    missed = False
    if files is None:
        print("(1), (2) files: skipped (--no-files)")
    else:
        missed = report_files(files)
    # A figure that could not be measured fails the bench (exit 1) whatever --strict says:
    # "no ratio" must never pass for a result.
    unmeasured = report_typing(typing)
    print("context:")
    if files is not None:
        print("    qemu-ga probe (" + ", ".join(f"{k} {fmt_rate(v)}" for k, v in files.probe.items())
              + "); one command at a time, as libvirt sends them")
        print("    upload = LaneClient.upload whole (client hashing pass, multipart POST, agent digest "
              "check, commit); download = LaneClient.download to a host file (Repr-Digest checked)")
        print("    guests synced (untimed) before every transfer")
    print(f"    rig.close {fmt_ms(med(ctx.close_s))}")
    load = os.getloadavg()
    print(f"    host: {os.cpu_count()} CPUs, load {load[0]:.2f}/{load[1]:.2f}/{load[2]:.2f}")
    return 1 if (a.strict and missed) or unmeasured else 0


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


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0] if __doc__ else None)
    p.add_argument("--rounds", type=int, default=1, help="transfers and typings per side (default 1)")
    p.add_argument("--file-mib", type=int, default=256, help="the file's size (default 256, the lane's cap)")
    p.add_argument("--probe-mib", type=int, default=32, help="MiB per qemu-ga chunk-size probe (default 32)")
    p.add_argument("--no-desktop", action="store_true", help="skip (3), the typing on a computer rig")
    p.add_argument("--no-files", action="store_true", help="skip (1) and (2), the file lanes")
    p.add_argument("--accel", default="tcg", choices=["tcg", "kvm"], help="default tcg")
    p.add_argument("--memory-mb", type=int, default=512, help="the terminal rig and the peer VM")
    p.add_argument("--desktop-memory-mb", type=int, default=2048)
    p.add_argument("--vcpus", type=int, default=2)
    p.add_argument("--qemu", default="qemu-system-x86_64")
    p.add_argument("--qemu-img", default="qemu-img")
    p.add_argument("--boot-timeout", type=float, default=180.0, help="seconds per boot (TCG is slow)")
    p.add_argument("--keep", action="store_true", help="keep the temporary data directory (and server log)")
    p.add_argument("--strict", action="store_true", help="exit 1 when a target is not met")
    args = p.parse_args(argv)
    if args.rounds < 1:
        p.error("--rounds must be at least 1")
    if not 1 <= args.file_mib <= 256:
        p.error("--file-mib must be 1 to 256 (a lane file is at most 256 MiB)")
    return args


def _sigterm(_signum: int, _frame: object) -> None:
    raise KeyboardInterrupt


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    logging.basicConfig(level=logging.WARNING, format="%(levelname)s %(name)s %(message)s")
    signal.signal(signal.SIGTERM, _sigterm)
    data_dir = Path(tempfile.mkdtemp(prefix="rigd-bench-lanes-", dir="/var/tmp")).resolve()
    os.chmod(data_dir, 0o711)  # per-rig QEMU uids traverse it
    server_log = data_dir / "bench-server.log"
    ctx: Ctx | None = None
    rc = 1
    say: Callable[[str], None] = lambda step: print(f"pack: {step}", flush=True)  # noqa: E731
    try:
        cache_assets = find_assets()
        t = time.perf_counter()
        rootfs = ensure_pack(cache_assets, data_dir, say)
        print(f"pack {rootfs} ({time.perf_counter() - t:.1f} s)", flush=True)
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
        elif all(isinstance(e, BenchError | RigdError) for e in found):
            for e in found:
                print(f"bench: {e}", file=sys.stderr)
            rc = 1
        else:
            raise  # a bug: the traceback, after the clean-up below
    finally:
        rc = clean_up(ctx.server if ctx is not None else None, rc, server_log=server_log,
                      data_dir=data_dir, keep=args.keep)
    return rc


if __name__ == "__main__":
    sys.exit(main())
