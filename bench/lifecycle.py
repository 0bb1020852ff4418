"""Rig lifecycle costs, measured in one run (``make bench``).

(1) **Warm start.** ``rig.open`` → first ``exec true`` answered, as a caller
    sees it, on a server with warm starts (later rigs restored from the pack's
    memory snapshot) against a server started with ``RIGD_WARM_STARTS=0``
    (every rig boots its kernel). Same image, kernel, accelerator, memory and
    vCPUs; the two servers have their own data directories sharing the pack
    (hard link), and the rounds alternate sides. Target: cold / warm ≥ 5
    under TCG. Each warm sample is checked to really be warm.
(2) **Park and wake.** QMP ``stop`` / ``cont`` round trips on a raw QEMU
    started from :func:`microvm_argv` (the pure hypervisor cost), then the
    agent's first ``ping`` after ``cont``. When the server offers
    ``rig.park``, also the server's path: ``rig.park`` (the RPC), and an exec
    on a parked rig (which wakes it) against an exec on a ready one.
(3) **Resident MB per parked terminal rig**: VmRSS of the QEMU process of
    parked rigs, warm-started and cold-booted (server rigs parked with
    ``rig.park`` when it exists, else raw VMs parked with QMP ``stop``).

A missed target is reported as "not met", never tuned away. Every process
started here — the two servers, their QEMUs (pids from the Rig), raw QEMUs —
is killed by pid on the way out, also on errors, Ctrl-C and SIGTERM.
"""

from __future__ import annotations

import argparse
import contextlib
import functools
import json
import logging
import os
import re
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from collections.abc import AsyncIterator
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
    fmt_ms,
    fmt_s,
    leaves,
    med,
    start_server,
    stop_server,
    tail,
)

from rigd.backends.guest_client import GuestConnection
from rigd.backends.microvm_argv import default_tcg_threads, microvm_argv
from rigd.backends.procs import proc_alive, resident_mb
from rigd.backends.qmp_client import QMPConnection
from rigd.backends.snapshot import ENV_SWITCH, META_FILE, load_memory
from rigd.client.cli import ClientError
from rigd.errors import GuestError
from rigd.images import TerminalAssets, find_assets
from rigd.images.pack import ensure_pack
from rigd.server.main import publish_assets

TARGET_WARM = 5.0
log = logging.getLogger("bench")


def rig_open(srv: Server, args: argparse.Namespace) -> dict[str, Any]:
    rig = srv.client.call("rig.open", {"workspace": "default", "surface": "terminal",
                                       "memoryMb": args.memory_mb, "vcpus": args.vcpus},
                          timeout=args.boot_timeout + 60)
    pid = rig.get("pid")
    if isinstance(pid, int):
        REAPER.add(pid, f"qemu of {rig['id']}")
        srv.rig_pids[rig["id"]] = pid
    if rig.get("phase") != "ready":
        raise BenchError(f"rig.open ({srv.name}) answered {rig.get('phase')}: {rig.get('failure')}")
    return dict(rig)


def rig_exec(srv: Server, rig_id: str, argv: list[str] | None = None) -> dict[str, Any]:
    out = srv.client.call("rig.act", {"rigId": rig_id, "tool": "terminal_use",
                                      "action": {"action": "exec", "argv": argv or ["true"]}})
    if out.get("exitCode") != 0:
        raise BenchError(f"exec on {rig_id} ({srv.name}) answered {out}")
    return dict(out)


def rig_close(srv: Server, rig_id: str) -> None:
    srv.client.call("rig.close", {"rigId": rig_id})
    pid = srv.rig_pids.pop(rig_id, None)
    if pid is not None:
        ticks = REAPER.ticks(pid)
        deadline = time.monotonic() + 30
        while proc_alive(pid, ticks) and time.monotonic() < deadline:
            time.sleep(0.02)
        REAPER.discard(pid)


def boot_of(srv: Server, rig: dict[str, Any]) -> str:
    """How the rig came up: its ``boot`` field once the Rig shows it, else the server log."""
    if isinstance(rig.get("boot"), str):
        return str(rig["boot"])
    return "warm" if re.search(rf"rigd\.rig\.{re.escape(rig['id'])} restored\b", srv.log()) else "cold"


def open_to_first_exec(srv: Server, args: argparse.Namespace) -> tuple[float, dict[str, Any]]:
    t0 = time.perf_counter()
    rig = rig_open(srv, args)
    rig_exec(srv, rig["id"])
    return time.perf_counter() - t0, rig


def snapshot_dirs(data_dir: Path) -> list[Path]:
    return sorted(p.parent for p in (data_dir / "rigs" / "smolvm-packs").glob(f"*/snapshots/*/{META_FILE}"))


def wait_snapshot(srv: Server, timeout: float = 300) -> Path:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        found = snapshot_dirs(srv.data_dir)
        if found:
            return found[0]
        if srv.proc.poll() is not None:
            raise BenchError(f"rigd serve ({srv.name}) died: {tail(srv.log(), 1500)}")
        time.sleep(0.2)
    raise BenchError(f"the warm server built no snapshot within {timeout:.0f} s: {tail(srv.log(), 1500)}")


# --- (1) warm start vs cold boot -----------------------------------------------------


@dataclass(slots=True)
class WarmResult:
    warm: list[float]
    cold: list[float]
    not_warm: int
    snapshot: Path
    snapshot_meta: dict[str, Any]


def measure_warm(args: argparse.Namespace, warm: Server, cold: Server) -> WarmResult:
    print("(1) rig.open → first exec answered: warm start (snapshot restore) vs cold boot "
          f"({ENV_SWITCH}=0 server)", flush=True)
    s, rig = open_to_first_exec(warm, args)  # the first rig of the pack boots cold, then a snapshot is built
    rig_close(warm, rig["id"])
    t = time.perf_counter()
    snap = wait_snapshot(warm)
    meta = json.loads((snap / META_FILE).read_text())
    print(f"    warm-up: first rig {fmt_s(s)} ({boot_of(warm, rig)}); snapshot {snap.name} ready "
          f"{fmt_s(time.perf_counter() - t)} later (built in {meta.get('buildS')} s, memory "
          f"{(snap / 'memory.zst').stat().st_size / 1e6:.0f} MB zstd)", flush=True)
    for srv in (warm, cold):
        s, rig = open_to_first_exec(srv, args)
        rig_close(srv, rig["id"])
        print(f"    warm-up {srv.name}: {fmt_s(s)} ({boot_of(srv, rig)})", flush=True)
    warms: list[float] = []
    colds: list[float] = []
    not_warm = 0
    for i in range(args.rounds):
        got: dict[str, float] = {}
        for srv in (warm, cold) if i % 2 == 0 else (cold, warm):
            s, rig = open_to_first_exec(srv, args)
            kind = boot_of(srv, rig)
            rig_close(srv, rig["id"])
            if srv is warm and kind != "warm":
                not_warm += 1
            if srv is cold and kind != "cold":
                raise BenchError(f"the {ENV_SWITCH}=0 server restored rig {rig['id']}")
            got[srv.name] = s
        warms.append(got["warm"])
        colds.append(got["cold"])
        print(f"    round {i + 1:<3} warm {fmt_s(got['warm'])}   cold {fmt_s(got['cold'])}   "
              f"cold/warm {got['cold'] / got['warm']:.1f}x", flush=True)
    print(f"    median    warm {fmt_s(med(warms))}   cold {fmt_s(med(colds))}", flush=True)
    return WarmResult(warms, colds, not_warm, snap, meta)


# --- (2) park and wake ------------------------------------------------------------------


@dataclass(slots=True)
class RawVM:
    proc: trio.Process
    dir: Path
    qmp: QMPConnection
    guest: GuestConnection


async def _wait_path(path: Path, proc: trio.Process, what: str) -> None:
    while not await trio.Path(path).exists():  # QEMU creates it: nothing to wait on but the file
        if proc.poll() is not None:
            raise BenchError(f"raw QEMU exited before {what} appeared")
        await trio.sleep(0.005)


@asynccontextmanager
async def raw_vm(args: argparse.Namespace, assets: TerminalAssets, rootfs: Path, root: Path,
                 snapshot: Path | None = None) -> AsyncIterator[RawVM]:
    """A QEMU with rigd's argv (as root, no per-rig uid), cold or restored from ``snapshot``."""
    vm_dir = Path(tempfile.mkdtemp(prefix="raw-", dir=root))
    errf = os.open(vm_dir / "qemu.err", os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    proc: trio.Process | None = None
    try:
        overlay = vm_dir / "overlay.qcow2"
        backing, fmt = (snapshot / "disk.qcow2", "qcow2") if snapshot else (rootfs, "raw")
        res = await trio.run_process(
            [args.qemu_img, "create", "-q", "-f", "qcow2", "-F", fmt, "-b", str(backing), str(overlay)],
            capture_stdout=True, capture_stderr=True, check=False,
        )
        if res.returncode != 0:
            raise BenchError(f"qemu-img create failed: {tail(res.stderr, 1500)}")
        argv = microvm_argv(
            qemu=args.qemu, accel=args.accel, memory_mb=args.memory_mb, vcpus=args.vcpus,
            tcg_threads=default_tcg_threads(),
            kernel=assets.kernel, initrd=assets.initrd, root_disk=overlay, tools_disk=assets.tools,
            qmp_socket=vm_dir / "qmp.sock", agent_socket=vm_dir / "agent.sock",
            console_socket=vm_dir / "console.sock", incoming="defer" if snapshot else None,
        )
        async with trio.open_nursery() as nursery:
            proc = await trio.lowlevel.open_process(argv, stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL,
                                                    stderr=errf, start_new_session=True, cwd=str(vm_dir))
            REAPER.add(proc.pid, "raw qemu")
            try:
                with trio.fail_after(args.boot_timeout):
                    for name in ("qmp.sock", "agent.sock", "console.sock"):
                        await _wait_path(vm_dir / name, proc, name)
                    qmp = await QMPConnection.connect(vm_dir / "qmp.sock", log=log)
                    await nursery.start(qmp.run)
                    await qmp.handshake(timeout=30)
                    console = await trio.open_unix_socket(str(vm_dir / "console.sock"))
                    nursery.start_soon(_drain, console)
                    if snapshot is not None:
                        await load_memory(qmp, listen=vm_dir / "migrate.sock", memory=snapshot / "memory.zst")
                        await qmp.execute("cont")
                    guest = GuestConnection(await trio.open_unix_socket(str(vm_dir / "agent.sock")), log=log)
                    await nursery.start(guest.run)
                    while True:
                        try:
                            await guest.request("hello", timeout=1.0, time=time.time())
                            break
                        except GuestError:
                            if guest.closed or proc.poll() is not None:
                                err = tail((vm_dir / "qemu.err").read_bytes(), 1500)
                                raise BenchError(f"raw VM died: {err}") from None
            except trio.TooSlowError:
                raise BenchError(f"raw VM not ready within {args.boot_timeout} s") from None
            try:
                yield RawVM(proc, vm_dir, qmp, guest)
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


async def _drain(stream: trio.SocketStream) -> None:
    """An unread console would stall the guest's serial output."""
    async with stream:
        with contextlib.suppress(trio.BrokenResourceError, trio.ClosedResourceError):
            while await stream.receive_some(65536):
                pass


@dataclass(slots=True)
class ParkResult:
    stop: list[float] = field(default_factory=list)
    cont: list[float] = field(default_factory=list)
    cont_to_ping: list[float] = field(default_factory=list)
    ping_ready: list[float] = field(default_factory=list)
    raw_rss: dict[str, list[int]] = field(default_factory=dict)


async def measure_raw_park(args: argparse.Namespace, assets: TerminalAssets, rootfs: Path, root: Path,
                           snapshot: Path, res: ParkResult, *, rss_only: bool) -> None:
    if not rss_only:
        print("(2) park/wake on a raw QEMU (microvm_argv, QMP): stop, cont, cont → agent ping answered",
              flush=True)
    async with raw_vm(args, assets, rootfs, root) as vm:
        if not rss_only:
            for _ in range(3):
                t = time.perf_counter()
                await vm.guest.request("ping", timeout=30)
                res.ping_ready.append(time.perf_counter() - t)
            for i in range(args.park_rounds):
                await trio.sleep(0.05)
                t = time.perf_counter()
                await vm.qmp.execute("stop")
                res.stop.append(time.perf_counter() - t)
                await trio.sleep(0.05)
                t = time.perf_counter()
                await vm.qmp.execute("cont")
                res.cont.append(time.perf_counter() - t)
                await vm.guest.request("ping", timeout=30)
                res.cont_to_ping.append(time.perf_counter() - t)
                if i < 3 or i == args.park_rounds - 1:
                    print(f"    round {i + 1:<3} stop {fmt_ms(res.stop[-1])}   cont {fmt_ms(res.cont[-1])}   "
                          f"cont → ping {fmt_ms(res.cont_to_ping[-1])}", flush=True)
            print(f"    median    stop {fmt_ms(med(res.stop))}   cont {fmt_ms(med(res.cont))}   "
                  f"cont → ping {fmt_ms(med(res.cont_to_ping))} (ping on a running VM "
                  f"{fmt_ms(med(res.ping_ready))})", flush=True)
        if rss_only:
            await trio.sleep(args.settle)
            await vm.qmp.execute("stop")
            res.raw_rss.setdefault("cold", []).append(resident_mb(vm.proc.pid))
    if rss_only:
        async with raw_vm(args, assets, rootfs, root, snapshot=snapshot) as vm:
            await trio.sleep(args.settle)
            await vm.qmp.execute("stop")
            res.raw_rss.setdefault("warm", []).append(resident_mb(vm.proc.pid))


@dataclass(slots=True)
class ServerParkResult:
    available: bool
    why: str = ""
    park: list[float] = field(default_factory=list)
    exec_parked: list[float] = field(default_factory=list)
    exec_ready: list[float] = field(default_factory=list)
    rss: dict[str, list[int]] = field(default_factory=dict)


def park(srv: Server, rig_id: str) -> dict[str, Any]:
    rig = srv.client.call("rig.park", {"rigId": rig_id})
    if rig.get("phase") != "parked":
        raise BenchError(f"rig.park answered phase {rig.get('phase')}")
    return dict(rig)


def measure_server_park(args: argparse.Namespace, warm: Server) -> ServerParkResult:
    rig = rig_open(warm, args)
    try:
        try:
            park(warm, rig["id"])
        except ClientError as exc:
            if "method" in str(exc).lower() or "not found" in str(exc).lower():
                return ServerParkResult(False, f"the server has no rig.park ({exc})")
            raise
        rig_exec(warm, rig["id"])  # wakes it
        print("(2) park/wake through the server: rig.park RPC, exec on a parked rig (wakes it) vs on a "
              "ready one", flush=True)
        out = ServerParkResult(True)
        for i in range(args.park_rounds):
            t = time.perf_counter()
            rig_exec(warm, rig["id"])
            out.exec_ready.append(time.perf_counter() - t)
            t = time.perf_counter()
            park(warm, rig["id"])
            out.park.append(time.perf_counter() - t)
            t = time.perf_counter()
            rig_exec(warm, rig["id"])
            out.exec_parked.append(time.perf_counter() - t)
            if i < 3 or i == args.park_rounds - 1:
                print(f"    round {i + 1:<3} rig.park {fmt_ms(out.park[-1])}   exec parked "
                      f"{fmt_ms(out.exec_parked[-1])}   exec ready {fmt_ms(out.exec_ready[-1])}", flush=True)
        print(f"    median    rig.park {fmt_ms(med(out.park))}   exec parked "
              f"{fmt_ms(med(out.exec_parked))}   exec ready {fmt_ms(med(out.exec_ready))}", flush=True)
        return out
    finally:
        rig_close(warm, rig["id"])


def measure_server_rss(args: argparse.Namespace, warm: Server, cold: Server, out: ServerParkResult) -> None:
    print(f"(3) resident MB of parked rigs: {args.rss_rigs} warm-started and {args.rss_rigs} cold-booted, "
          f"parked after {args.settle:.0f} s idle (VmRSS of QEMU)", flush=True)
    opened: list[tuple[Server, str, str]] = []
    try:
        for _ in range(args.rss_rigs):
            for srv in (warm, cold):
                rig = rig_open(srv, args)
                rig_exec(srv, rig["id"])
                opened.append((srv, rig["id"], boot_of(srv, rig)))
        time.sleep(args.settle)
        for srv, rig_id, kind in opened:
            park(srv, rig_id)
            time.sleep(0.2)
            pid = srv.rig_pids[rig_id]
            out.rss.setdefault(kind, []).append(resident_mb(pid))
        for kind, values in sorted(out.rss.items()):
            print(f"    {kind:<5} parked rigs: {', '.join(f'{v} MB' for v in values)}", flush=True)
    finally:
        for srv, rig_id, _kind in opened:
            with contextlib.suppress(ClientError):
                rig_close(srv, rig_id)


# --- the run -------------------------------------------------------------------------


def private_pack(shared_rootfs: Path, data_dir: Path) -> None:
    """Give ``data_dir`` the same pack (hard link: same inode, same snapshot key)."""
    pack = data_dir / "rigs" / "smolvm-packs" / shared_rootfs.parent.name
    pack.mkdir(parents=True, exist_ok=True)
    for d in (data_dir / "rigs", pack.parent, pack):
        os.chmod(d, 0o711)
    if not (pack / "rootfs.img").exists():
        os.link(shared_rootfs, pack / "rootfs.img")
    shutil.copy2(shared_rootfs.parent / "pack.json", pack / "pack.json")


def run(args: argparse.Namespace, root: Path) -> int:
    cache_assets = find_assets()
    warm_dir, cold_dir, raw_root = root / "warm", root / "cold", root / "raw"
    for d in (warm_dir, cold_dir, raw_root):
        d.mkdir(parents=True, exist_ok=True)
        os.chmod(d, 0o711)  # per-rig QEMU uids traverse it
    t = time.perf_counter()
    rootfs = ensure_pack(cache_assets, warm_dir, lambda step: print(f"pack: {step}", flush=True))
    private_pack(rootfs, cold_dir)
    print(f"pack {rootfs.parent.name[:16]}… ({time.perf_counter() - t:.1f} s)", flush=True)
    assets = publish_assets(cache_assets, warm_dir)  # the very files the warm server's rigs boot
    servers: list[Server] = []
    try:
        warm = start_server(args, "warm", warm_dir, warm=True)
        servers.append(warm)
        cold = start_server(args, "cold", cold_dir, warm=False)
        servers.append(cold)
        print(f"servers: warm pid {warm.proc.pid}, cold ({ENV_SWITCH}=0) pid {cold.proc.pid}; data {root}",
              flush=True)
        w = measure_warm(args, warm, cold)
        sp = measure_server_park(args, warm)
        raw = ParkResult()
        trio.run(functools.partial(measure_raw_park, args, assets, rootfs, raw_root, w.snapshot, raw,
                                   rss_only=False))
        if sp.available:
            measure_server_rss(args, warm, cold, sp)
        else:
            print(f"(3) resident MB of parked raw VMs (cold-booted, restored from the snapshot), parked "
                  f"with QMP stop after {args.settle:.0f} s idle — {sp.why}", flush=True)
            trio.run(functools.partial(measure_raw_park, args, assets, rootfs, raw_root, w.snapshot, raw,
                                       rss_only=True))
    finally:
        for srv in servers:
            stop_server(srv)

    ratio = med(w.cold) / med(w.warm)
    print()
    print(f"lifecycle bench (accel {args.accel}, {args.memory_mb} MB, {args.vcpus} vCPU, image "
          f"{cache_assets.image_digest[:19]}…, kernel {cache_assets.kernel_release})")
    verdict = "met" if ratio >= TARGET_WARM else "not met"
    print(f"(1) open → first exec   warm {fmt_s(med(w.warm))}   cold {fmt_s(med(w.cold))}   "
          f"cold/warm {ratio:.1f}x  (target ≥ {TARGET_WARM:.0f}x: {verdict})"
          + (f"; {w.not_warm} warm-side samples were NOT warm" if w.not_warm else ""))
    print(f"(2) park/wake, raw QEMU + QMP: stop {fmt_ms(med(raw.stop))}, cont {fmt_ms(med(raw.cont))}, "
          f"cont → agent answers {fmt_ms(med(raw.cont_to_ping))}")
    if sp.available:
        wake = med(sp.exec_parked) - med(sp.exec_ready)
        print(f"    through the server: rig.park {fmt_ms(med(sp.park))}; exec on a parked rig "
              f"{fmt_ms(med(sp.exec_parked))} vs ready {fmt_ms(med(sp.exec_ready))} "
              f"(wake ≈ {fmt_ms(max(wake, 0))})")
    else:
        print(f"    through the server: not measured — {sp.why}")
    rss = sp.rss if sp.available else raw.raw_rss
    where = "server rigs parked with rig.park" if sp.available else "raw VMs parked with QMP stop"
    parts = [f"{kind} {med([float(v) for v in vs]):.0f} MB" for kind, vs in sorted(rss.items(), reverse=True)]
    print(f"(3) resident per parked terminal rig ({where}, median VmRSS): {', '.join(parts)}")
    print("context:")
    print(f"    rounds: {args.rounds} opens per side (alternating), {args.park_rounds} park/wake cycles; "
          "medians")
    print(f"    snapshot {w.snapshot.name}: built in {w.snapshot_meta.get('buildS')} s (boot "
          f"{w.snapshot_meta.get('bootS')} s), {w.snapshot_meta.get('ramBytesSent', 0) / 1e6:.0f} MB of "
          f"machine state → {(w.snapshot / 'memory.zst').stat().st_size / 1e6:.0f} MB zstd")
    load = os.getloadavg()
    print(f"    host: {os.cpu_count()} CPUs, load {load[0]:.2f}/{load[1]:.2f}/{load[2]:.2f}")
    if args.strict and (ratio < TARGET_WARM or w.not_warm):
        return 1
    return 0


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0] if __doc__ else None)
    p.add_argument("--rounds", type=int, default=5, help="opens per side (default 5)")
    p.add_argument("--park-rounds", type=int, default=20, help="park/wake cycles (default 20)")
    p.add_argument("--rss-rigs", type=int, default=2, help="parked rigs of each kind for (3) (default 2)")
    p.add_argument("--settle", type=float, default=3.0, help="idle seconds before parking for (3)")
    p.add_argument("--accel", default="tcg", choices=["tcg", "kvm"], help="default tcg")
    p.add_argument("--memory-mb", type=int, default=512)
    p.add_argument("--vcpus", type=int, default=2)
    p.add_argument("--qemu", default="qemu-system-x86_64")
    p.add_argument("--qemu-img", default="qemu-img")
    p.add_argument("--boot-timeout", type=float, default=180.0, help="seconds per boot (TCG is slow)")
    p.add_argument("--keep", action="store_true", help="keep the temporary data directories")
    p.add_argument("--strict", action="store_true", help="exit 1 when the target is not met")
    args = p.parse_args(argv)
    if args.rounds < 1 or args.park_rounds < 1 or args.rss_rigs < 1:
        p.error("--rounds, --park-rounds and --rss-rigs must be at least 1")
    return args


def _sigterm(_signum: int, _frame: object) -> None:
    raise KeyboardInterrupt


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    logging.basicConfig(level=logging.WARNING, format="%(levelname)s %(name)s %(message)s")
    signal.signal(signal.SIGTERM, _sigterm)
    root = Path(tempfile.mkdtemp(prefix="rigd-bench-lifecycle-", dir="/var/tmp")).resolve()
    os.chmod(root, 0o711)
    rc = 1
    try:
        rc = run(args, root)
    except BaseException as exc:
        found = leaves(exc)
        if any(isinstance(e, KeyboardInterrupt) for e in found):
            print("bench: interrupted", file=sys.stderr)
            rc = 130
        elif all(isinstance(e, BenchError | ClientError) for e in found):
            for e in found:
                print(f"bench: {e}", file=sys.stderr)
            rc = 1
        else:
            raise
    finally:
        signal.signal(signal.SIGTERM, signal.SIG_IGN)
        signal.signal(signal.SIGINT, signal.SIG_IGN)
        REAPER.kill_all()
        left = REAPER.alive()
        if left:
            print(f"bench: processes still alive after clean-up: {left}", file=sys.stderr)
            rc = rc or 1
        if rc != 0:
            for name in ("warm", "cold"):
                logf = root / name / "bench-server.log"
                if logf.exists():
                    print(f"bench: {name} server log tail:\n{tail(logf.read_bytes(), 2000)}",
                          file=sys.stderr)
        if args.keep:
            print(f"bench: kept {root}", file=sys.stderr)
        else:
            shutil.rmtree(root, ignore_errors=True)
    return rc


if __name__ == "__main__":
    sys.exit(main())
