"""A forwarded guest port against a direct connection to the guest, measured in one run (``make bench``).

Issue 15's bench. One terminal rig (``RIGD_WARM_STARTS=0``, so no snapshot
build runs beside a measurement) runs a small server of its own python3 and
standard library, bound to **0.0.0.0** on one port (``--port``, default
8123), so it is reachable both ways:

* **forward**: ``127.0.0.1:<hostPort>`` on the host, the port ``rig.ports``
  names (a loopback listener of the server; each connection one stream over
  the guest's port multiplexer on a virtio-serial port, which connects to
  the guest's loopback);
* **direct** (the peer): the guest's own address (every rig's guest is
  ``10.213.0.2``, ``netgate.topology.ADDRESSING``) from the rig's gateway
  namespace ``<prefix>-gw-<key>`` (``Naming(rigId, gateway_prefix(dataDir))``),
  over the virtio-net link. The gateway's nftables never open a connection
  towards the guest (``output``: loopback and established only; ``input``:
  only redirected guest traffic), so the bench inserts two rules into that
  rig's ``inet rigd_gw`` table first — ``output``: new TCP to the guest's
  address and the bench port; ``input``: established replies from that
  port — and nothing else. The namespace, rules included, goes with the rig.

The client is one Python process per measurement, the same code both ways:
run on the host for the forward, and through ``ip netns exec <ns>`` for the
direct path, so neither side pays for the other's process. Measured:

1. **throughput**: ``--rounds`` downloads (guest → host) of ``--mib`` MiB
   each way, and as many uploads, after a small warm-up; the order of the
   paths alternates per round; the median MB/s, and the ratio forward/direct
   (higher is better; target ≥ 0.5, the issue's).
2. **request latency**: ``--requests`` sequential requests, each on a fresh
   connection (connect, a 5-byte request, a 5-byte answer, the server's
   close), and as many round trips of one line on one held connection;
   median and p95, and the ratio forward/direct (below 1: the forward is
   faster; no target).
3. **held connections**: ``--hold`` (100) connections opened through the
   forward at once; once all are connected, each sends a line and gets its
   own answer back while all stay open; ``rig.ports`` is asked how many
   connections the forward holds at that moment. Pass/fail and the time
   (the same through the direct path, for the record).

Every process started here (the server, its QEMU, the clients) is killed by
pid on the way out, also on errors, Ctrl-C and SIGTERM. A missed target is
printed "NOT met", never tuned away; exit 0 unless something failed or
``--strict`` and a target is missed.
"""

from __future__ import annotations

import argparse
import json
import logging
import os
import re
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

# _common (beside this script) puts this checkout first on sys.path, so it comes before rigd.
from _common import (
    REAPER,
    REPO,
    BenchError,
    Server,
    clean_up,
    fmt_ms,
    leaves,
    med,
    start_server,
)

# The sibling script bench/netgate.py must not shadow the netgate package (say PYTHONPATH names the repo).
sys.path.remove(str(REPO))
sys.path.insert(0, str(REPO))

from netgate.topology import ADDRESSING, Naming
from rigd.client.cli import ClientError
from rigd.errors import RigdError
from rigd.server.main import gateway_prefix

MIB = 1024 * 1024
TARGET_THROUGHPUT = 0.5  # forward MB/s / direct MB/s
BENCH_COMMENT = "rigd-bench-ports"

#: The guest's server: python3 and its standard library only, a thread per connection.
#: ``GET n``: n bytes, then close. ``PUT n``: reads n bytes, answers ``OK n``. ``PING``:
#: ``PONG``, then close. ``ECHO``: every later line back. ``HOLD i``: ``i`` back, then
#: waits for the client's end.
GUEST_SERVER = r'''
import os, socket, sys, threading
PORT = int(sys.argv[1])
BLOCK = os.urandom(1 << 20)
VIEW = memoryview(BLOCK)

def serve(c):
    try:
        c.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        f = c.makefile("rb", buffering=1 << 16)
        line = f.readline().split()
        if not line:
            return
        cmd = line[0]
        if cmd == b"GET":
            left = int(line[1])
            while left:
                n = min(left, len(BLOCK))
                c.sendall(VIEW[:n])
                left -= n
        elif cmd == b"PUT":
            want = int(line[1])
            buf = bytearray(1 << 20)
            got = 0
            while got < want:
                n = f.readinto(memoryview(buf)[:min(len(buf), want - got)])
                if not n:
                    break
                got += n
            c.sendall(b"OK %d\n" % got)
        elif cmd == b"PING":
            c.sendall(b"PONG\n")
        elif cmd == b"ECHO":
            while True:
                x = f.readline()
                if not x:
                    break
                c.sendall(x)
        elif cmd == b"HOLD":
            c.sendall(line[1] + b"\n")
            while f.read(4096):
                pass
    except OSError:
        pass
    finally:
        c.close()

s = socket.socket()
s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
s.bind(("0.0.0.0", PORT))
s.listen(512)
open("/tmp/bench-ports.ready", "w").close()
while True:
    c, _ = s.accept()
    threading.Thread(target=serve, args=(c,), daemon=True).start()
'''

#: The measuring client (argv: host port mode n [size]); prints one JSON line.
CLIENT = r'''
import json, socket, sys, time
host, port, mode, n = sys.argv[1], int(sys.argv[2]), sys.argv[3], int(sys.argv[4])

def conn():
    s = socket.create_connection((host, port), timeout=120)
    s.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
    return s

def readline(s, buf):
    while b"\n" not in buf:
        d = s.recv(65536)
        if not d:
            raise SystemExit(f"the server closed before answering ({bytes(buf)[:80]!r})")
        buf += d
    i = buf.index(b"\n")
    line = bytes(buf[:i])
    del buf[:i + 1]
    return line

out = {}
if mode == "get":
    buf = bytearray(1 << 20)
    view = memoryview(buf)
    t0 = time.perf_counter()
    s = conn()
    s.sendall(b"GET %d\n" % n)
    got = 0
    while True:
        k = s.recv_into(view)
        if not k:
            break
        got += k
    dt = time.perf_counter() - t0
    s.close()
    if got != n:
        raise SystemExit(f"got {got} of {n} bytes")
    out = {"seconds": dt, "bytes": got}
elif mode == "put":
    block = memoryview(bytes(range(256)) * 4096)
    t0 = time.perf_counter()
    s = conn()
    s.sendall(b"PUT %d\n" % n)
    left = n
    while left:
        k = min(left, len(block))
        s.sendall(block[:k])
        left -= k
    line = readline(s, bytearray())
    dt = time.perf_counter() - t0
    s.close()
    if line != b"OK %d" % n:
        raise SystemExit(f"the server answered {line!r} to {n} bytes")
    out = {"seconds": dt, "bytes": n}
elif mode == "fresh":
    xs = []
    for _ in range(n):
        t0 = time.perf_counter()
        s = conn()
        s.sendall(b"PING\n")
        got = b""
        while True:
            d = s.recv(64)
            if not d:
                break
            got += d
        xs.append(time.perf_counter() - t0)
        s.close()
        if got != b"PONG\n":
            raise SystemExit(f"PING answered {got!r}")
    out = {"samples": xs}
elif mode == "echo":
    s = conn()
    s.sendall(b"ECHO\n")
    buf = bytearray()
    s.sendall(b"warm\n")
    readline(s, buf)
    xs = []
    for i in range(n):
        msg = b"%d\n" % i
        t0 = time.perf_counter()
        s.sendall(msg)
        line = readline(s, buf)
        xs.append(time.perf_counter() - t0)
        if line + b"\n" != msg:
            raise SystemExit(f"echo answered {line!r} to {msg!r}")
    s.close()
    out = {"samples": xs}
elif mode == "hold":
    t0 = time.perf_counter()
    socks = [conn() for _ in range(n)]
    connected = time.perf_counter() - t0
    for i, s in enumerate(socks):
        s.sendall(b"HOLD %d\n" % i)
    bad = []
    for i, s in enumerate(socks):
        line = readline(s, bytearray())
        if line != b"%d" % i:
            bad.append((i, line.decode(errors="replace")))
    answered = time.perf_counter() - t0
    # Every connection is still open: say so, and wait for the bench to look (a line on stdin).
    print(json.dumps({"held": n, "connected_s": connected, "answered_s": answered, "bad": bad}), flush=True)
    sys.stdin.readline()
    # Still alive at the end? (a closed one reads b"" at once; an open one times out)
    dead = 0
    for s in socks:
        s.settimeout(0.01)
        try:
            if s.recv(1) == b"":
                dead += 1
        except (socket.timeout, BlockingIOError):
            pass
        except OSError:
            dead += 1
    for s in socks:
        s.close()
    out = {"dead_at_end": dead}
print(json.dumps(out), flush=True)
'''


# --- the rig -----------------------------------------------------------------------


def rig_sh(srv: Server, rig_id: str, command: str, *, stdin: str | None = None, timeout: float = 120) -> str:
    action: dict[str, Any] = {"action": "exec", "command": command, "timeoutS": timeout}
    if stdin is not None:
        action["stdin"] = stdin
    out = srv.client.call("rig.act", {"rigId": rig_id, "tool": "terminal_use", "action": action},
                          timeout=timeout + 60)
    if out.get("exitCode") != 0:
        raise BenchError(f"rig {rig_id}: {command!r} exited {out.get('exitCode')}: "
                         f"{str(out.get('stderr'))[-400:]}")
    return str(out["stdout"]["text"])


def open_rig(srv: Server, args: argparse.Namespace) -> str:
    rig = srv.client.call("rig.open", {"workspace": "default", "surface": "terminal",
                                       "memoryMb": args.memory_mb, "vcpus": args.vcpus},
                          timeout=args.boot_timeout + 300)
    pid = rig.get("pid")
    if isinstance(pid, int):
        REAPER.add(pid, f"rigd qemu ({rig['id']})")
    if rig.get("phase") != "ready":
        raise BenchError(f"rig.open answered phase {rig.get('phase')}: {rig.get('failure')}")
    return str(rig["id"])


def close_rig(srv: Server, rig_id: str) -> None:
    srv.client.call("rig.close", {"rigId": rig_id}, timeout=120)
    for pid, t in list(REAPER.pids.items()):
        if t.what.endswith(f"({rig_id})"):
            deadline = time.monotonic() + 30
            while Path(f"/proc/{pid}").exists() and time.monotonic() < deadline:
                time.sleep(0.05)
            REAPER.discard(pid)


def wait_forward(srv: Server, rig_id: str, port: int,
                 deadline_s: float = 60.0) -> tuple[dict[str, Any], float]:
    t0 = time.monotonic()
    while True:
        answer = srv.client.call("rig.ports", {"rigId": rig_id})
        for p in answer.get("ports", []):
            if p.get("guestPort") == port:
                return dict(p), time.monotonic() - t0
        if time.monotonic() - t0 > deadline_s:
            raise BenchError(f"guest port {port} not forwarded within {deadline_s:.0f} s: {answer}")
        time.sleep(0.25)


def forward_connections(srv: Server, rig_id: str, port: int) -> int | None:
    for p in srv.client.call("rig.ports", {"rigId": rig_id}).get("ports", []):
        if p.get("guestPort") == port:
            return int(p.get("connections", -1))
    return None


# --- the direct path ----------------------------------------------------------------------


def nft(ns: str, *rule: str) -> None:
    proc = subprocess.run(["ip", "netns", "exec", ns, "nft", *rule], capture_output=True, text=True,
                          timeout=30, check=False)
    if proc.returncode != 0:
        raise BenchError(f"nft {' '.join(rule)} in {ns}: {proc.stderr.strip()}")


def open_direct_path(ns: str, port: int) -> None:
    """Let the gateway namespace open TCP to the guest's ``port`` (and take the replies)."""
    guest = str(ADDRESSING.guest)
    nft(ns, "insert", "rule", "inet", "rigd_gw", "output", "ip", "daddr", guest, "tcp", "dport", str(port),
        "accept", "comment", f'"{BENCH_COMMENT}"')
    nft(ns, "insert", "rule", "inet", "rigd_gw", "input", "ip", "saddr", guest, "tcp", "sport", str(port),
        "ct", "state", "established", "accept", "comment", f'"{BENCH_COMMENT}"')


# --- the clients ---------------------------------------------------------------------------


class Route:
    """One way to the guest's server: a name, what the client runs under, where it connects."""

    def __init__(self, name: str, prefix: list[str], host: str, port: int) -> None:
        self.name, self.prefix, self.host, self.port = name, prefix, host, port

    def argv(self, mode: str, n: int) -> list[str]:
        return [*self.prefix, sys.executable, "-I", "-c", CLIENT, self.host, str(self.port), mode, str(n)]

    def run(self, mode: str, n: int, timeout: float = 900) -> dict[str, Any]:
        proc = subprocess.Popen(self.argv(mode, n), stdin=subprocess.DEVNULL, stdout=subprocess.PIPE,
                                stderr=subprocess.PIPE, text=True)
        REAPER.add(proc.pid, f"client {self.name} {mode}")
        try:
            out, err = proc.communicate(timeout=timeout)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.communicate()
            raise BenchError(f"{self.name} {mode} {n}: no answer within {timeout:.0f} s") from None
        finally:
            REAPER.discard(proc.pid)
        if proc.returncode != 0:
            raise BenchError(f"{self.name} {mode} {n} exited {proc.returncode}: {err.strip()[-1500:]}")
        return dict(json.loads(out.strip().splitlines()[-1]))


def mbs(res: dict[str, Any]) -> float:
    return float(res["bytes"]) / float(res["seconds"]) / 1e6


def p95(xs: list[float]) -> float:
    ys = sorted(xs)
    return ys[min(len(ys) - 1, round(0.95 * (len(ys) - 1)))] if ys else float("nan")


def hold(path: Route, n: int, srv: Server, rig_id: str, guest_port: int) -> dict[str, Any]:
    """``n`` connections at once; (their numbers, and rig.ports' count while all are open)."""
    proc = subprocess.Popen(path.argv("hold", n), stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True)
    REAPER.add(proc.pid, f"client {path.name} hold")
    try:
        assert proc.stdout is not None and proc.stdin is not None
        first = proc.stdout.readline()
        if not first:
            _, err = proc.communicate(timeout=60)
            raise BenchError(f"{path.name} hold {n} exited {proc.returncode}: {err.strip()[-1500:]}")
        res = dict(json.loads(first))
        res["forward_count"] = (forward_connections(srv, rig_id, guest_port)
                                if path.name == "forward" else None)
        proc.stdin.write("done\n")
        proc.stdin.flush()
        out, err = proc.communicate(timeout=120)
        if proc.returncode != 0:
            raise BenchError(f"{path.name} hold {n} exited {proc.returncode}: {err.strip()[-1500:]}")
        res.update(json.loads(out.strip().splitlines()[-1]))
        return res
    except subprocess.TimeoutExpired:
        raise BenchError(f"{path.name} hold {n}: the client did not finish") from None
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
        REAPER.discard(proc.pid)


# --- the run --------------------------------------------------------------------------------


def measure(srv: Server, args: argparse.Namespace, data_dir: Path) -> int:
    t0 = time.monotonic()
    rig_id = open_rig(srv, args)
    print(f"terminal rig {rig_id} ready in {time.monotonic() - t0:.1f} s (not timed below)", flush=True)
    try:
        rc = measure_rig(srv, args, data_dir, rig_id)
    finally:
        close_rig(srv, rig_id)
    ns = Path("/run/netns") / Naming(rig_id, prefix=gateway_prefix(data_dir)).netns
    deadline = time.monotonic() + 30
    while ns.exists() and time.monotonic() < deadline:
        time.sleep(0.1)
    if ns.exists():
        raise BenchError(f"the rig's gateway namespace {ns.name} (with the bench's nft rules) "
                         "outlived rig.close")
    print(f"    rig closed; its gateway namespace {ns.name}, the bench's nft rules with it, is gone")
    return rc


def measure_rig(srv: Server, args: argparse.Namespace, data_dir: Path, rig_id: str) -> int:
    port = args.port
    ns = Naming(rig_id, prefix=gateway_prefix(data_dir)).netns
    if not Path(f"/run/netns/{ns}").exists():
        raise BenchError(f"the rig's gateway namespace {ns} is not there (is the server's network "
                         f"mode gateway? this bench needs root)")
    guest = str(ADDRESSING.guest)
    rig_sh(srv, rig_id, "cat > /tmp/bench-ports.py", stdin=GUEST_SERVER)
    rig_sh(srv, rig_id, f"rm -f /tmp/bench-ports.ready; (setsid python3 /tmp/bench-ports.py {port} "
                        ">/tmp/bench-ports.log 2>&1 &); for i in $(seq 150); do "
                        "[ -e /tmp/bench-ports.ready ] && exit 0; sleep 0.2; done; cat /tmp/bench-ports.log; "
                        "exit 1")
    fwd, took = wait_forward(srv, rig_id, port)
    shown = rig_sh(srv, rig_id, "/.rigd/bin/busybox ip -4 -o addr show scope global || true")
    addr = ", ".join(f"{m.group(1)} {m.group(2)}"
                     for m in re.finditer(r"^\d+: (\S+)\s+inet (\S+)", shown, re.M))
    open_direct_path(ns, port)
    forward = Route("forward", [], "127.0.0.1", int(fwd["hostPort"]))
    direct = Route("direct", ["ip", "netns", "exec", ns], guest, port)
    paths = (forward, direct)
    print(f"guest server on 0.0.0.0:{port} (guest {addr or '?'}); in rig.ports {took:.1f} s after it "
          f"listened, forwarded at 127.0.0.1:{forward.port}; direct: {guest}:{port} from namespace {ns}",
          flush=True)

    for p in paths:  # warm-up: page cache, TCP, the guest's python, both directions
        p.run("get", 8 * MIB)
        p.run("put", 8 * MIB)
        p.run("fresh", 5)

    size = args.mib * MIB
    tput: dict[str, dict[str, list[float]]] = {p.name: {"get": [], "put": []} for p in paths}
    for rnd in range(args.rounds):
        order = paths if rnd % 2 == 0 else paths[::-1]
        for p in order:
            for mode in ("get", "put"):
                tput[p.name][mode].append(mbs(p.run(mode, size)))
        print(f"round {rnd + 1}: " + "   ".join(
            f"{p.name} down {tput[p.name]['get'][-1]:7.2f} MB/s up {tput[p.name]['put'][-1]:7.2f} MB/s"
            for p in paths), flush=True)

    lat: dict[str, dict[str, list[float]]] = {}
    for p in paths:
        lat[p.name] = {"fresh": p.run("fresh", args.requests)["samples"],
                       "echo": p.run("echo", args.requests)["samples"]}
        print(f"latency {p.name}: fresh connection median {fmt_ms(med(lat[p.name]['fresh']))}, "
              f"one connection median {fmt_ms(med(lat[p.name]['echo']))}", flush=True)

    held = {p.name: hold(p, args.hold, srv, rig_id, port) for p in paths}

    # --- the report
    print()
    print(f"ports bench (accel {args.accel}, {args.memory_mb} MB terminal guest, {args.vcpus} vCPU; "
          f"{args.rounds} rounds of {args.mib} MiB each way, {args.requests} requests; medians)")
    missed = False
    for mode, label in (("get", "download (guest → host)"), ("put", "upload (host → guest)")):
        f, d = med(tput["forward"][mode]), med(tput["direct"][mode])
        ratio = f / d
        met = ratio >= TARGET_THROUGHPUT
        missed |= not met
        print(f"ports: throughput {label}: through the forward {f:.1f} MB/s, direct {d:.1f} MB/s -> "
              f"{ratio:.2f}x (goal >= {TARGET_THROUGHPUT}x: {'met' if met else 'NOT met'})")
    for mode, label in (("fresh", "request on a fresh connection (connect + PING + PONG + close)"),
                        ("echo", "round trip of one line on one held connection")):
        fx, dx = lat["forward"][mode], lat["direct"][mode]
        print(f"ports: latency, {label}: through the forward median {fmt_ms(med(fx))} "
              f"(p95 {fmt_ms(p95(fx))}), direct median {fmt_ms(med(dx))} (p95 {fmt_ms(p95(dx))}) "
              f"-> forward/direct {med(fx) / med(dx):.2f}x (below 1: the forward is faster; no goal)")
    ok = True
    for name, h in held.items():
        good = not h["bad"] and h["dead_at_end"] == 0
        count = h.get("forward_count")
        if name == "forward":
            good = good and count is not None and count >= args.hold
            ok = good
        how = "through the forward" if name == "forward" else "direct"
        print(f"ports: {args.hold} concurrent connections held {how}: {'PASS' if good else 'FAIL'} "
              f"(all connected in {fmt_ms(h['connected_s'])}, every one answered while all open in "
              f"{fmt_ms(h['answered_s'])}"
              + (f"; rig.ports said {count} connections at that moment" if name == "forward" else "")
              + (f"; wrong answers {h['bad'][:5]}" if h["bad"] else "")
              + (f"; {h['dead_at_end']} closed before the end" if h["dead_at_end"] else "") + ")")
    load = os.getloadavg()
    print("context:")
    print(f"    direct = the guest's address {guest}:{port} from the rig's gateway namespace {ns} "
          f"(two nft rules added to its rigd_gw table for the bench port); "
          f"forward = 127.0.0.1:{forward.port}")
    print("    each measurement is its own client process (forward: on the host; direct: ip netns exec); "
          "throughput timed from connect to the last byte (down) or the guest's OK (up)")
    print(f"    host: {os.cpu_count()} CPUs, load {load[0]:.2f}/{load[1]:.2f}/{load[2]:.2f}")
    if not ok:
        raise BenchError(f"{args.hold} connections were not all held and answered through the forward")
    return 1 if args.strict and missed else 0


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0] if __doc__ else None)
    p.add_argument("--rounds", type=int, default=3, help="transfers per path and direction (default 3)")
    p.add_argument("--mib", type=int, default=64, help="MiB per transfer (default 64)")
    p.add_argument("--requests", type=int, default=200, help="latency samples per path and kind")
    p.add_argument("--hold", type=int, default=100, help="connections held at once (default 100)")
    p.add_argument("--port", type=int, default=8123, help="the guest server's port (default 8123)")
    p.add_argument("--accel", default="tcg", choices=["tcg", "kvm"], help="default tcg")
    p.add_argument("--memory-mb", type=int, default=512)
    p.add_argument("--vcpus", type=int, default=2)
    p.add_argument("--qemu", default="qemu-system-x86_64")
    p.add_argument("--boot-timeout", type=float, default=180.0, help="seconds per boot (TCG is slow)")
    p.add_argument("--keep", action="store_true", help="keep the temporary data directory (and server log)")
    p.add_argument("--strict", action="store_true", help="exit 1 when a target is not met")
    args = p.parse_args(argv)
    if args.rounds < 1 or args.mib < 1 or args.requests < 1 or args.hold < 1:
        p.error("--rounds, --mib, --requests and --hold must be at least 1")
    if not 1 <= args.port <= 65535 or args.port == 7911:
        p.error("--port must be 1-65535 and not 7911 (the multiplexer's)")
    return args


def _sigterm(_signum: int, _frame: object) -> None:
    raise KeyboardInterrupt


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    logging.basicConfig(level=logging.WARNING, format="%(levelname)s %(name)s %(message)s")
    if os.geteuid() != 0:
        print("bench: ports needs root (the rig's gateway namespace is the direct path)", file=sys.stderr)
        return 1
    signal.signal(signal.SIGTERM, _sigterm)
    data_dir = Path(tempfile.mkdtemp(prefix="rigd-bench-ports-", dir="/var/tmp")).resolve()
    os.chmod(data_dir, 0o711)  # per-rig QEMU uids traverse it
    server_log = data_dir / "bench-server.log"
    srv: Server | None = None
    rc = 1
    try:
        srv = start_server(args, "ports", data_dir, warm=False, extra=["--network", "gateway"])
        print(f"rigd serve pid {srv.proc.pid} at {srv.url}, data {data_dir}", flush=True)
        rc = measure(srv, args, data_dir)
    except BaseException as exc:
        found = leaves(exc)
        if any(isinstance(e, KeyboardInterrupt) for e in found):
            print("bench: interrupted", file=sys.stderr)
            rc = 130
        elif all(isinstance(e, BenchError | RigdError | ClientError) for e in found):
            for e in found:
                print(f"bench: {e}", file=sys.stderr)
            rc = 1
        else:
            raise  # a bug: the traceback, after the clean-up below
    finally:
        rc = clean_up(srv, rc, server_log=server_log, data_dir=data_dir, keep=args.keep)
    return rc


if __name__ == "__main__":
    sys.exit(main())
