"""The egress gateway against a direct veth path, measured in one run (``python bench/netgate.py``).

Two "guests" (network namespaces) talk to the same fake internet
(``netgate.testing.FakeInternet``, its servers in their own namespace and
process): one straight over a veth, one behind a real gateway (namespace,
nftables redirect, SNI/Host proxy dialling the name). The client is a
separate Python process inside each guest namespace, so the gateway's
process runs only the gateway. Measured, per path:

* connection setup: a new TCP connection + ``GET /`` + the whole (small)
  reply, sequentially, for HTTP and HTTPS (TLS handshake included; the gate
  passes TLS through);
* throughput: one ``GET /bytes/N`` over HTTP, MB/s.

Rounds alternate the paths; medians and the ratios gate/direct are printed.
Needs root (namespaces). Everything made is removed on exit, also on errors.
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
from pathlib import Path

import trio

REPO = Path(__file__).resolve().parent.parent
if str(REPO) not in sys.path:
    sys.path.insert(0, str(REPO))

from netgate.gateway import open_gateway  # noqa: E402
from netgate.policy import Policy  # noqa: E402
from netgate.testing import FakeInternet, GuestNs, direct_veth, leftovers  # noqa: E402

PREFIX = "rgb"

CLIENT = r"""
import json, socket, ssl, sys, time
addr, host, n_conn, nbytes, cafile = sys.argv[1], sys.argv[2], int(sys.argv[3]), int(sys.argv[4]), sys.argv[5]
ctx = ssl.create_default_context(cafile=cafile)

def get(port, path, tls):
    t0 = time.perf_counter()
    s = socket.create_connection((addr, port), timeout=10)
    s.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
    if tls:
        s = ctx.wrap_socket(s, server_hostname=host)
    s.sendall(f"GET {path} HTTP/1.1\r\nHost: {host}\r\nConnection: close\r\n\r\n".encode())
    total = 0
    while True:
        b = s.recv(262144)
        if not b:
            break
        total += len(b)
    s.close()
    return time.perf_counter() - t0, total

out = {"http_setup": [], "https_setup": []}
for _ in range(n_conn):
    out["http_setup"].append(get(80, "/", False)[0])
for _ in range(n_conn):
    out["https_setup"].append(get(443, "/", True)[0])
dt, total = get(80, f"/bytes/{nbytes}", False)
out["throughput_mbs"] = total / dt / 1e6
out["bytes"] = total
print(json.dumps(out))
"""


def run_client(ns: str, addr: str, host: str, n_conn: int, nbytes: int, cafile: str) -> dict[str, object]:
    proc = subprocess.run(["ip", "netns", "exec", ns, sys.executable, "-c", CLIENT, addr, host, str(n_conn),
                           str(nbytes), cafile], capture_output=True, text=True, timeout=300, check=False)
    if proc.returncode != 0:
        raise RuntimeError(f"client in {ns} failed: {proc.stderr[-2000:]}")
    return dict(json.loads(proc.stdout))


def ms(xs: list[float]) -> float:
    return statistics.median(xs) * 1000


async def main(args: argparse.Namespace) -> int:
    world = FakeInternet(PREFIX).start()
    gated = GuestNs(PREFIX).create()
    direct = GuestNs(PREFIX).create()
    try:
        await trio.to_thread.run_sync(direct_veth, direct, world)
        async with open_gateway("rig_bench", Policy(("allowed.test",)), audit=lambda e: None,
                                resolver_address=world.resolver, upstream_netns=world.netns,
                                prefix=PREFIX) as gw:
            await gw.attach_veth(gated.netns)
            site = world.site("allowed")
            paths = {"direct": (direct.netns, site.address),
                     "gate": (gated.netns, str(gw.addressing.gateway))}
            samples: dict[str, dict[str, list[float]]] = {
                p: {"http_setup": [], "https_setup": [], "throughput_mbs": []} for p in paths}
            # Warm-up (resolver cache, page cache, TLS session set-up in the servers).
            for ns, addr in paths.values():
                await trio.to_thread.run_sync(run_client, ns, addr, site.name, 5, 1 << 20,
                                              str(world.ca_pem_path))
            for rnd in range(args.rounds):
                order = list(paths) if rnd % 2 == 0 else list(reversed(paths))
                for p in order:
                    ns, addr = paths[p]
                    res = await trio.to_thread.run_sync(run_client, ns, addr, site.name, args.connections,
                                                        args.bytes, str(world.ca_pem_path))
                    samples[p]["http_setup"] += res["http_setup"]  # type: ignore[arg-type]
                    samples[p]["https_setup"] += res["https_setup"]  # type: ignore[arg-type]
                    samples[p]["throughput_mbs"].append(float(res["throughput_mbs"]))  # type: ignore[arg-type]
                    print(f"round {rnd + 1} {p:6s}: http setup {ms(res['http_setup']):6.2f} ms  "  # type: ignore[arg-type]
                          f"https setup {ms(res['https_setup']):6.2f} ms  "  # type: ignore[arg-type]
                          f"throughput {res['throughput_mbs']:8.1f} MB/s", flush=True)
    finally:
        direct.close()
        gated.close()
        world.close()
    left = leftovers(PREFIX)
    d, g = samples["direct"], samples["gate"]
    print()
    print(f"{'metric (median)':34s} {'direct veth':>12s} {'through gate':>13s} {'ratio gate/direct':>18s}")
    for key, label, unit, conv in (("http_setup", "HTTP connect+GET+reply", "ms", ms),
                                   ("https_setup", "HTTPS connect+TLS+GET+reply", "ms", ms),
                                   ("throughput_mbs", f"HTTP throughput ({args.bytes >> 20} MiB)", "MB/s",
                                    statistics.median)):
        dv, gv = conv(d[key]), conv(g[key])
        print(f"{label:34s} {dv:9.2f} {unit:>2s} {gv:10.2f} {unit:>2s} {gv / dv:18.2f}")
    print(f"\n{args.rounds} rounds x {args.connections} connections per path and protocol; "
          f"leftovers after teardown: {left}")
    return 0 if not (left.namespaces or left.links or left.netns_etc) else 1


if __name__ == "__main__":
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--rounds", type=int, default=4)
    ap.add_argument("--connections", type=int, default=50)
    ap.add_argument("--bytes", type=int, default=256 << 20)
    sys.exit(trio.run(main, ap.parse_args()))
