"""Opening rigs, against their named peers, measured in one run (``make bench``; issue 28).

One ``rigd serve`` (warm starts on, pools off until this bench sets them) on a scratch data
directory; per shape (``--shapes``, default ``terminal,browser:chromium``):

(1) **Cold open → first still**: ``rig.open`` to the first ``screenshot`` (a terminal: the
    first ``exec``), the shape's first open on the fresh data directory (the kernel boots;
    a browser also starts its engine). The peer every other line is measured against.
(2) **Standby / warm open → first still**: later opens once the shape's snapshot exists
    (a terminal restores a booted machine; a browser its standby point, then starts its own
    engine; a desktop its running session). Each sample is labelled by the Rig's ``boot``.
(3) **Pool hit → first still**: ``server.configure {pools: {shape: 1}}``, wait for the pooled
    rig, then ``rig.open`` (``start: "pool"``) to the first still. Goal: ≤ 1.5 s under TCG and
    ≥ 20x faster than (1). Printed with the **refill** time (a take until the pool is ready
    again) and the **resident MB** a pooled rig costs (``memoryInUseMb`` before and after).
(4) **The CLI**: ``rigd list`` wall time against ``curl`` doing the same RPC, median of
    ``--cli-rounds``. Goal: ≤ 150 ms more than curl.
(5) **At rest**: the % of a host core a warm rig's QEMU uses in the 20 s after its first
    still, against a terminal rig's (no engine) in the same run: an engine's start-up work
    that outlives "ready" (Chromium's preloaded omnibox WebUI: ~100% for ~25 s) shows here.

The screenshot verb against QMP ``screendump`` + PNG (issue 28, item 3) is ``bench/computer.py``
(1) and (3): it needs the machine's QMP socket, which a server owns alone.

Every process is killed by pid on the way out (the server closes its rigs; anything left is
killed by the reaper).
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from _common import REPO, Server, add_server_args, clean_up, fmt_s, med, scratch_root, start_server

GOAL_POOL_S = 1.5
GOAL_RATIO = 20.0
GOAL_CLI_MS = 150.0
#: How long a rig is watched at rest after its first still (an engine's start-up work that
#: outlives "ready" shows here: Chromium's preloaded omnibox WebUI kept a core busy ~25 s).
IDLE_S = 20.0


def qemu_cpu_s(pid: int) -> float:
    with open(f"/proc/{pid}/stat") as fh:
        fields = fh.read().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


@dataclass
class Shape:
    key: str
    cold: list[float] = field(default_factory=list)
    warm: list[float] = field(default_factory=list)
    pool: list[float] = field(default_factory=list)
    refill: list[float] = field(default_factory=list)
    resident_mb: list[float] = field(default_factory=list)
    #: % of a host core the rig's QEMU used in the IDLE_S after its first still (nothing asked).
    rest_cpu: list[float] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)

    @property
    def surface(self) -> str:
        return self.key.split(":", 1)[0]

    def open_params(self) -> dict[str, Any]:
        surface, _, engine = self.key.partition(":")
        return {"workspace": "default", "surface": surface, **({"engine": engine} if engine else {})}


def first_still(srv: Server, rig: dict[str, Any]) -> None:
    if rig["surface"] == "terminal":
        out = srv.client.call("rig.act", {"rigId": rig["id"], "tool": "terminal_use",
                                          "action": {"action": "exec", "argv": ["true"]}})
        assert out["exitCode"] == 0, out
        return
    tool = "browser_use" if rig["surface"] == "browser" else "computer_use"
    shot = srv.client.call("rig.act", {"rigId": rig["id"], "tool": tool, "action": {"action": "screenshot"}})
    assert shot.get("image"), shot


def open_and_look(srv: Server, shape: Shape, conversation: str) -> tuple[float, dict[str, Any]]:
    t0 = time.perf_counter()
    rig = srv.client.call("rig.open", {**shape.open_params(), "conversation": conversation})
    if rig["phase"] != "ready":
        raise RuntimeError(f"{shape.key}: rig.open answered {rig['phase']}: {rig.get('failure')}")
    first_still(srv, rig)
    return time.perf_counter() - t0, rig


def pool_of(srv: Server, key: str) -> dict[str, Any]:
    return next((p for p in srv.client.call("server.info")["pools"] if p["key"] == key), {})


def wait_pool_ready(srv: Server, key: str, within_s: float) -> float:
    t0 = time.perf_counter()
    while True:
        p = pool_of(srv, key)
        if p.get("ready", 0) >= 1:
            return time.perf_counter() - t0
        if p.get("error"):
            raise RuntimeError(f"the {key} pool failed: {p['error']}")
        if time.perf_counter() - t0 > within_s:
            raise RuntimeError(f"the {key} pool was not ready within {within_s:.0f} s: {p}")
        time.sleep(0.1)


def measure(srv: Server, shape: Shape, args: argparse.Namespace) -> None:
    # (1) and (2): the first open is cold; later ones are warm once the snapshot is built.
    for i in range(args.rounds + 1):
        took, rig = open_and_look(srv, shape, f"bench-{shape.key}-{i}")
        (shape.warm if rig.get("boot") == "warm" else shape.cold).append(took)
        print(f"  {shape.key}: open #{i + 1} ({rig.get('boot')}) → first still {took:.2f} s", flush=True)
        pid = srv.client.call("rig.get", {"rigId": rig["id"]}).get("pid")
        if i == 1 and pid:  # (5): at rest, once, on a warm rig
            before_cpu = qemu_cpu_s(pid)
            time.sleep(IDLE_S)
            shape.rest_cpu.append(100 * (qemu_cpu_s(pid) - before_cpu) / IDLE_S)
        srv.client.call("rig.close", {"rigId": rig["id"]})
        if i == 0:  # let the snapshot build alone (it is built after the first cold boot)
            wait_snapshot_quiet(srv, args.boot_timeout)
    # (3): the pool.
    before = srv.client.call("server.info")["memoryInUseMb"]
    srv.client.call("server.configure", {"pools": {shape.key: 1}})
    fill = wait_pool_ready(srv, shape.key, args.boot_timeout)
    time.sleep(args.settle)  # the pooled rig's memory settles
    shape.resident_mb.append(srv.client.call("server.info")["memoryInUseMb"] - before)
    print(f"  {shape.key}: pool filled in {fill:.1f} s", flush=True)
    for i in range(args.rounds):
        took, rig = open_and_look(srv, shape, f"bench-pool-{shape.key}-{i}")
        if rig.get("start") != "pool":
            shape.notes.append(f"pool round {i + 1} was not a pool hit: {rig.get('notes')}")
        else:
            shape.pool.append(took)
        taken = time.perf_counter()
        print(f"  {shape.key}: pool hit #{i + 1} → first still {took:.2f} s", flush=True)
        wait_pool_ready(srv, shape.key, args.boot_timeout)
        shape.refill.append(time.perf_counter() - taken)
        srv.client.call("rig.close", {"rigId": rig["id"]})
    srv.client.call("server.configure", {"pools": {shape.key: 0}})
    deadline = time.monotonic() + 60
    while pool_of(srv, shape.key) and time.monotonic() < deadline:
        time.sleep(0.2)


def wait_snapshot_quiet(srv: Server, within_s: float) -> None:
    """Wait until no snapshot build runs (its QEMU is the server's child named for a snapshot)."""
    deadline = time.monotonic() + within_s
    while time.monotonic() < deadline:
        if not list((srv.data_dir / "rigs" / "smolvm").glob("snap_*.pid")):
            return
        time.sleep(0.5)


def cli_vs_curl(srv: Server, rounds: int) -> tuple[float, float]:
    env = {**os.environ, "RIGD_DATA_DIR": str(srv.data_dir)}
    rigd = [sys.executable, "-m", "rigd", "list"]
    body = json.dumps({"jsonrpc": "2.0", "id": 1, "method": "rig.list", "params": {"workspace": "default"}})
    token = (srv.data_dir / "admin.token").read_text().strip()
    curl = ["curl", "-s", "-o", "/dev/null", "-w", "%{http_code}", f"{srv.url}/rpc",
            "-H", f"Authorization: Bearer {token}", "-H", "Content-Type: application/json", "-d", body]
    ours, peer = [], []
    for _ in range(rounds):
        t0 = time.perf_counter()
        subprocess.run(rigd, env=env, cwd=REPO, check=True, capture_output=True, timeout=60)
        ours.append(time.perf_counter() - t0)
        t0 = time.perf_counter()
        code = subprocess.run(curl, check=True, capture_output=True, text=True, timeout=60).stdout
        peer.append(time.perf_counter() - t0)
        if code != "200":
            raise RuntimeError(f"curl rig.list answered {code}")
    return med(ours), med(peer)


def run(args: argparse.Namespace, root: Path) -> int:
    shapes = [Shape(k) for k in args.shapes.split(",")]
    srv: Server | None = None
    rc = 1
    try:
        srv = start_server(args, "open", root, warm=True)
        print(f"rigd serve pid {srv.proc.pid} at {srv.url}, data {root}", flush=True)
        for shape in shapes:
            measure(srv, shape, args)
        cli, curl = cli_vs_curl(srv, args.cli_rounds) if shutil.which("curl") else (float("nan"),) * 2
        rc = 0
    finally:
        rc = clean_up(srv, rc, server_log=root / "bench-server.log", data_dir=root, keep=args.keep)
    print()
    print(f"open bench (accel {args.accel}, {args.rounds} rounds per side, medians)")
    for s in shapes:
        cold, warm, pool = med(s.cold), med(s.warm), med(s.pool)
        ratio = cold / pool if pool else float("nan")
        met = "met" if pool <= GOAL_POOL_S and ratio >= GOAL_RATIO else "not met"
        print(f"  {s.key:18} (1) cold {fmt_s(cold)}   (2) {'warm' if s.surface != 'browser' else 'standby'} "
              f"{fmt_s(warm)} ({cold / warm if warm else float('nan'):.1f}x faster than cold)   "
              f"(3) pool hit {fmt_s(pool)}: {ratio:.0f}x faster than cold (goal ≤ {GOAL_POOL_S} s and "
              f"≥ {GOAL_RATIO:.0f}x: {met}); refill {fmt_s(med(s.refill))}; "
              f"{med(s.resident_mb):.0f} MB resident per pooled rig")
        base = next((med(t.rest_cpu) for t in shapes if t.key == "terminal" and t.rest_cpu), float("nan"))
        print(f"      (5) at rest {IDLE_S:.0f} s after its first still: {med(s.rest_cpu):.0f}% of a core "
              f"(a terminal rig, no engine: {base:.0f}%)")
        for note in s.notes:
            print(f"      note: {note}")
    extra = (cli - curl) * 1000
    print(f"  (4) rigd list {cli * 1000:.0f} ms vs curl {curl * 1000:.0f} ms of the same RPC: "
          f"+{extra:.0f} ms (goal ≤ +{GOAL_CLI_MS:.0f} ms: {'met' if extra <= GOAL_CLI_MS else 'not met'})")
    load = os.getloadavg()
    print(f"  host: {os.cpu_count()} CPUs, load {load[0]:.2f}/{load[1]:.2f}/{load[2]:.2f}")
    return rc


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0] if __doc__ else None)
    p.add_argument("--shapes", default="terminal,browser:chromium",
                   help="comma-separated pool keys (terminal, computer, browser:chromium|firefox|webkit)")
    p.add_argument("--rounds", type=int, default=3, help="opens per side after the first (default 3)")
    p.add_argument("--cli-rounds", type=int, default=5)
    p.add_argument("--settle", type=float, default=3.0, help="seconds before reading a pooled rig's memory")
    add_server_args(p)
    args = p.parse_args(argv)
    return run(args, scratch_root("open"))


if __name__ == "__main__":
    sys.exit(main())
