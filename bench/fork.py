"""Forking rigs against opening them, measured in one run (``make bench``; issue 29).

Two ``rigd serve`` on scratch data directories sharing nothing but the image cache: one with
warm starts (its terminal shape's memory snapshot built first), one with ``RIGD_WARM_STARTS=0``.
For each N of ``--counts`` (default 1,4,8), on terminal rigs of one shape:

(1) **Fork → N copies ready**: ``rig.fork {count: N}`` of a ready parent (a process counting
    in its memory), until the answer (every copy ready), then each copy's first ``exec``.
(2) **N warm opens**: N ``rig.open`` at once on the warm server (each restores the pack's
    snapshot), until all are ready and have answered an ``exec``: the peer of (1).
(3) **N cold boots**: the same on the cold server (every kernel boots).
(4) **Pause seen by the parent**: how long its vCPUs stood still (the ``fork`` audit row's
    ``pausedMs``, timed on the host from QMP ``stop`` to ``cont``), and what QEMU sent.
(5) **Resident MB per copy** (``residentMb`` of each copy, QEMU's VmRSS) against a warm
    opened rig's, read ``--settle`` seconds after they are up.

(6) With ``--browser ENGINE``: a browser fork (a fresh engine seeded with the parent's
    cookies, storage and tabs; never a copy of the running engine) against a warm (standby)
    open of the same engine, each until its first screenshot.

(7) **Volume throughput**: a rig with a volume at ``/workspace`` writes ``--volume-mib`` MiB
    (``dd``, fsync'd) and reads them back (page cache dropped) on the volume and on its own
    disk (``/root``), each timed by the exec's own ``durationMs``: the volume's MiB/s against
    the rig's disk's, the peer.

Every process started here is killed by pid on the way out (the servers close their rigs;
anything left is killed by the reaper).
"""

from __future__ import annotations

import argparse
import concurrent.futures
import os
import sys
import time
from pathlib import Path
from typing import Any

from _common import Server, add_server_args, clean_up, fmt_s, med, scratch_root, start_server

COUNTER = ("setsid sh -c 'n=0; while :; do n=$((n+1)); echo $n > /tmp/count; sleep 0.1; done' "
           "</dev/null >/dev/null 2>&1 &")


def exec_ok(srv: Server, rig_id: str, command: str = "true") -> str:
    out = srv.client.call("rig.act", {"rigId": rig_id, "tool": "terminal_use",
                                      "action": {"action": "exec", "command": command}})
    if out.get("exitCode") != 0:
        raise RuntimeError(f"{rig_id}: {command!r} answered {out}")
    return str(out["stdout"]["text"])


def open_ready(srv: Server, params: dict[str, Any]) -> dict[str, Any]:
    rig = srv.client.call("rig.open", {"workspace": "default", "surface": "terminal", **params})
    if rig.get("phase") != "ready":
        raise RuntimeError(f"rig.open answered {rig.get('phase')}: {rig.get('failure')}")
    exec_ok(srv, rig["id"])
    return dict(rig)


def open_many(srv: Server, n: int, params: dict[str, Any]) -> tuple[float, list[dict[str, Any]]]:
    t0 = time.perf_counter()
    with concurrent.futures.ThreadPoolExecutor(max_workers=n) as pool:
        rigs = list(pool.map(lambda _i: open_ready(srv, params), range(n)))
    return time.perf_counter() - t0, rigs


def close_all(srv: Server, rigs: list[dict[str, Any]]) -> None:
    for rig in rigs:
        srv.client.call("rig.close", {"rigId": rig["id"]})


def wait_snapshot(srv: Server, params: dict[str, Any], deadline_s: float) -> None:
    """Open rigs on the warm server until one comes up warm (the first cold boot seeds it)."""
    deadline = time.monotonic() + deadline_s
    while True:
        rig = open_ready(srv, params)
        close_all(srv, [rig])
        if rig.get("boot") == "warm":
            return
        if time.monotonic() > deadline:
            raise RuntimeError(f"no warm start within {deadline_s:.0f} s")
        time.sleep(5)


def resident(srv: Server, rigs: list[dict[str, Any]], settle_s: float) -> float:
    time.sleep(settle_s)
    return med([float(srv.client.call("rig.get", {"rigId": r["id"]}).get("residentMb") or 0) for r in rigs])


def screenshot(srv: Server, rig_id: str) -> None:
    shot = srv.client.call("rig.act", {"rigId": rig_id, "tool": "browser_use",
                                       "action": {"action": "screenshot"}})
    if not shot.get("image"):
        raise RuntimeError(f"{rig_id}: no screenshot: {shot}")


def browser_row(srv: Server, engine: str, rows: list[dict[str, float]]) -> None:
    params = {"workspace": "default", "surface": "browser", "engine": engine}
    parent = srv.client.call("rig.open", params)  # (seeds the engine's standby snapshot)
    t0 = time.perf_counter()
    warm = srv.client.call("rig.open", params)
    screenshot(srv, warm["id"])
    opened = time.perf_counter() - t0
    close_all(srv, [warm])
    t0 = time.perf_counter()
    [copy] = srv.client.call("rig.fork", {"rigId": parent["id"], "count": 1})["rigs"]
    screenshot(srv, copy["id"])
    forked = time.perf_counter() - t0
    close_all(srv, [copy, parent])
    rows.append({"browser": 1.0, "fork": forked, "warm": opened})
    print(f"  {engine}: fork {fmt_s(forked)}, standby open {fmt_s(opened)}", flush=True)


def timed_ms(srv: Server, rig_id: str, command: str) -> float:
    out = srv.client.call("rig.act", {"rigId": rig_id, "tool": "terminal_use",
                                      "action": {"action": "exec", "command": command, "timeoutS": 300}})
    if out["exitCode"] != 0:
        raise RuntimeError(f"{command!r} exited {out['exitCode']}: {out['stderr'].get('text', '')[-300:]}")
    return float(out["durationMs"])


def volume_row(srv: Server, mib: int, rows: list[dict[str, float]]) -> None:
    """(7): dd through the volume and through the rig's own disk, in one rig."""
    srv.client.call("volume.create", {"workspace": "default", "name": "bench-vol",
                                      "sizeMb": max(64, 2 * mib)})
    rig = open_ready(srv, {"volumes": [{"name": "bench-vol", "path": "/workspace"}]})
    row: dict[str, float] = {"volume": 1}
    try:
        for where, path in (("vol", "/workspace/bench"), ("disk", "/root/bench")):
            write = timed_ms(srv, rig["id"],
                             f"dd if=/dev/zero of={path} bs=1M count={mib} conv=fsync 2>/dev/null")
            read = timed_ms(srv, rig["id"], f"sync; echo 3 > /proc/sys/vm/drop_caches; "
                                            f"dd if={path} of=/dev/null bs=1M 2>/dev/null; rm -f {path}")
            row[f"{where}_write"] = mib / (write / 1000)
            row[f"{where}_read"] = mib / (read / 1000)
    finally:
        close_all(srv, [rig])
        srv.client.call("volume.rm", {"workspace": "default", "name": "bench-vol"})
    rows.append(row)


def run(args: argparse.Namespace, root: Path) -> int:
    counts = [int(c) for c in args.counts.split(",")]
    params = {"memoryMb": args.memory_mb, "vcpus": 1}
    warm_dir, cold_dir = root / "warm", root / "cold"
    for d in (warm_dir, cold_dir):
        d.mkdir(mode=0o711)
    warm: Server | None = None
    cold: Server | None = None
    rows: list[dict[str, float]] = []
    rc = 1
    try:
        warm = start_server(args, "fork-warm", warm_dir, warm=True)
        cold = start_server(args, "fork-cold", cold_dir, warm=False)
        print(f"servers: warm pid {warm.proc.pid}, cold pid {cold.proc.pid}; data {root}", flush=True)
        wait_snapshot(warm, params, args.boot_timeout)
        parent = open_ready(warm, params)
        exec_ok(warm, parent["id"], COUNTER)
        for n in counts:
            row: dict[str, float] = {"n": n}
            t0 = time.perf_counter()
            copies = warm.client.call("rig.fork", {"rigId": parent["id"], "count": n})["rigs"]
            for c in copies:
                if c["phase"] != "ready":
                    raise RuntimeError(f"copy {c['id']} is {c['phase']}: {c.get('failure')}")
                if int(exec_ok(warm, c["id"], "cat /tmp/count")) <= 0:
                    raise RuntimeError(f"copy {c['id']}: the parent's counter did not carry over")
            row["fork"] = time.perf_counter() - t0
            log = warm.client.call("rig.log", {"rigId": parent["id"]})
            audit = [r for r in log if r["verb"] == "fork"][-1]
            row["pause_ms"] = float(audit["args"]["pausedMs"])
            row["ram_mib"] = audit["args"]["ramBytes"] / (1 << 20)
            row["copy_mb"] = resident(warm, copies, args.settle)
            close_all(warm, copies)
            row["warm"], opened = open_many(warm, n, params)
            row["warm_mb"] = resident(warm, opened, args.settle)
            close_all(warm, opened)
            row["cold"], booted = open_many(cold, n, params)
            close_all(cold, booted)
            rows.append(row)
            print(f"  N={n}: fork {fmt_s(row['fork'])}, warm {fmt_s(row['warm'])}, cold {fmt_s(row['cold'])}",
                  flush=True)
        close_all(warm, [parent])
        if args.browser:
            browser_row(warm, args.browser, rows)
        if args.volume_mib:
            volume_row(warm, args.volume_mib, rows)
        rc = 0
    finally:
        rc = clean_up(cold, rc, server_log=cold_dir / "bench-server.log", data_dir=cold_dir, keep=True,
                      own_dir=False)
        rc = clean_up(warm, rc, server_log=warm_dir / "bench-server.log", data_dir=root, keep=args.keep)
    print()
    print(f"fork bench (accel {args.accel}, terminal rigs of {args.memory_mb} MB, 1 vCPU; "
          "wall time until every rig is ready and has answered an exec)")
    for r in rows:
        if "browser" in r:
            print(f"  (6) {args.browser}: a fork (fresh engine, seeded) {fmt_s(r['fork'])} vs a standby open "
                  f"{fmt_s(r['warm'])} ({r['fork'] / r['warm']:.2f}x)")
            continue
        if "volume" in r:
            vw, dw, vr, dr = r["vol_write"], r["disk_write"], r["vol_read"], r["disk_read"]
            print(f"  (7) volume at /workspace vs the rig's disk, {args.volume_mib} MiB: write "
                  f"{vw:.0f} vs {dw:.0f} MiB/s ({vw / dw:.2f}x), "
                  f"read {vr:.0f} vs {dr:.0f} MiB/s ({vr / dr:.2f}x)")
            continue
        n = f"{r['n']:.0f}"
        print(f"  N={n}: (1) fork {fmt_s(r['fork'])}   (2) {n} warm opens {fmt_s(r['warm'])} "
              f"({r['warm'] / r['fork']:.1f}x the fork)   (3) {n} cold boots {fmt_s(r['cold'])} "
              f"({r['cold'] / r['fork']:.1f}x the fork)")
        print(f"        (4) parent paused {r['pause_ms']:.0f} ms ({r['ram_mib']:.0f} MiB of RAM sent)   "
              f"(5) {r['copy_mb']:.0f} MB resident per copy vs {r['warm_mb']:.0f} MB per warm rig "
              f"({r['copy_mb'] / r['warm_mb'] if r['warm_mb'] else float('nan'):.2f}x)")
    load = os.getloadavg()
    print(f"  host: {os.cpu_count()} CPUs, load {load[0]:.2f}/{load[1]:.2f}/{load[2]:.2f}")
    return rc


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0] if __doc__ else None)
    p.add_argument("--counts", default="1,4,8", help="comma-separated N (copies, opens, boots)")
    p.add_argument("--memory-mb", type=int, default=512)
    p.add_argument("--browser", default="", help="also fork a browser rig of this engine (chromium, firefox, "
                   "webkit) against a standby open")
    p.add_argument("--settle", type=float, default=3.0, help="seconds before reading resident memory")
    p.add_argument("--volume-mib", type=int, default=64, help="MiB written and read for (7); 0 skips it")
    add_server_args(p)
    args = p.parse_args(argv)
    return run(args, scratch_root("fork"))


if __name__ == "__main__":
    sys.exit(main())
