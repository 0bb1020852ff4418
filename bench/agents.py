"""A tool call through MCP against the same call through ``tools.call``, measured in one run.

Issue 13's bench: the agents' tool ``terminal_use exec`` of ``true`` in **one**
terminal rig (booted once, before any clock starts), called

- **tools.call**: a JSON-RPC ``tools.call`` POSTed to ``/rpc`` over one
  keep-alive HTTP/1.1 connection (httpx2, the same client library the MCP
  HTTP transport uses) — the peer;
- **MCP over HTTP**: ``tools/call`` through the SDK's streamable-HTTP client
  of the server's ``/mcp`` (one session, one connection);
- **MCP over stdio**: ``tools/call`` through the SDK's stdio client of
  ``rigd mcp`` (a subprocess that relays each call to ``tools.call``).

Each is timed from the request to the tool's result as its client returns it
(the content parsed). Every side gets warm-up calls, then ``--rounds``
interleaved rounds (the order rotates); every median is printed and each MCP
side as a ratio to tools.call. Target: ≤ 1.2 each. A missed target is
printed "not met", never tuned away; exit 0 unless ``--strict``.

One server (``RIGD_WARM_STARTS=0``, so no snapshot build runs beside a
measurement). Every process started here (the server, its QEMU, the stdio
bridge) is killed by pid on the way out, also on errors and Ctrl-C.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import shlex
import signal
import sys
import tempfile
import time
from collections.abc import AsyncIterator, Awaitable, Callable
from pathlib import Path

import httpx2
import trio
from _common import REAPER, REPO, BenchError, med, start_server, stop_server
from mcp import Client, StdioServerParameters
from mcp.client.stdio import stdio_client
from mcp.client.streamable_http import streamable_http_client

from rigd.backends.procs import proc_alive
from rigd.tools.mcp import CONVERSATION_HEADER, WORKSPACE_HEADER

TARGET = 1.2
CALL = {"action": "exec", "argv": ["true"]}
CONVERSATION = "bench-agents"


def fmt(x: float) -> str:
    return f"{x * 1000:.1f} ms"


class RpcSide:
    """``tools.call`` over one keep-alive connection to ``/rpc``."""

    def __init__(self, http: httpx2.AsyncClient, url: str, rig_id: str) -> None:
        self.http, self.url, self.rig_id, self.n = http, url, rig_id, 0

    async def call(self) -> None:
        self.n += 1
        r = await self.http.post(self.url + "/rpc", json={
            "jsonrpc": "2.0", "id": self.n, "method": "tools.call",
            "params": {"workspace": "default", "conversation": CONVERSATION, "name": "terminal_use",
                       "arguments": {**CALL, "rigId": self.rig_id}}})
        reply = r.json()
        if "error" in reply or reply["result"]["isError"]:
            raise BenchError(f"tools.call failed: {json.dumps(reply)[:400]}")


def mcp_side(client: Client, rig_id: str, name: str) -> Callable[[], Awaitable[None]]:
    async def call() -> None:
        result = await client.call_tool("terminal_use", {**CALL, "rigId": rig_id})
        if result.is_error:
            raise BenchError(f"{name}: the call failed: {result.content!r:.400}")
    return call


@contextlib.asynccontextmanager
async def stdio_bridge(url: str, token_file: Path, workdir: Path) -> AsyncIterator[Client]:
    pid_file = workdir / "mcp.pid"
    argv = [sys.executable, "-m", "rigd", "mcp", "--url", url, "--token-file", str(token_file),
            "--workspace", "default", "--conversation", CONVERSATION]
    params = StdioServerParameters(
        command="/bin/sh", args=["-c", f"echo $$ > {shlex.quote(str(pid_file))}; exec {shlex.join(argv)}"],
        env={"PYTHONPATH": str(REPO)}, cwd=REPO)
    # A local file, opened once before any clock starts.
    with open(workdir / "mcp.stderr", "w") as errlog:  # noqa: ASYNC230
        try:
            async with Client(stdio_client(params, errlog=errlog), mode="legacy",
                              read_timeout_seconds=120) as client:
                REAPER.add(int(pid_file.read_text()), "rigd mcp (stdio)")
                yield client
        finally:
            with contextlib.suppress(OSError, ValueError):
                pid = int(pid_file.read_text())
                if REAPER.ticks(pid) is not None and proc_alive(pid, REAPER.ticks(pid)):
                    os.kill(pid, signal.SIGKILL)
                REAPER.discard(pid)


async def measure(args: argparse.Namespace, url: str, token: str, rig_id: str, workdir: Path) -> int:
    token_file = workdir / "token"
    token_file.write_text(token + "\n")
    token_file.chmod(0o600)
    auth = {"Authorization": f"Bearer {token}"}
    async with (httpx2.AsyncClient(headers=auth, timeout=120) as rpc_http,
                httpx2.AsyncClient(headers={**auth, WORKSPACE_HEADER: "default",
                                            CONVERSATION_HEADER: CONVERSATION}, timeout=120) as mcp_http,
                Client(streamable_http_client(url + "/mcp", http_client=mcp_http),  # type: ignore[arg-type]
                       mode="legacy") as http_client,
                stdio_bridge(url, token_file, workdir) as stdio_client_):
        sides: dict[str, Callable[[], Awaitable[None]]] = {
            "tools.call": RpcSide(rpc_http, url, rig_id).call,
            "MCP over HTTP": mcp_side(http_client, rig_id, "MCP over HTTP"),
            "MCP over stdio": mcp_side(stdio_client_, rig_id, "MCP over stdio"),
        }
        # As every MCP client does first (the SDK also caches the tools' output schemas from it).
        for client in (http_client, stdio_client_):
            await client.list_tools()
        names = list(sides)
        for name in names:
            for _ in range(args.warmup):
                await sides[name]()
        samples: dict[str, list[float]] = {name: [] for name in names}
        for i in range(args.rounds):
            order = names[i % 3:] + names[:i % 3]
            for name in order:
                t0 = time.perf_counter()
                await sides[name]()
                samples[name].append(time.perf_counter() - t0)
    peer = med(samples["tools.call"])
    print(f"terminal_use exec true, {args.rounds} interleaved rounds after {args.warmup} warm-up calls each")
    for name in names:
        xs = samples[name]
        print(f"  {name:<15} median {fmt(med(xs))}  min {fmt(min(xs))}  max {fmt(max(xs))}")
    missed = 0
    for name in names[1:]:
        ratio = med(samples[name]) / peer
        met = ratio <= TARGET
        missed += not met
        print(f"{name} / tools.call = {ratio:.2f} (target ≤ {TARGET}: {'met' if met else 'not met'})")
    return 1 if missed and args.strict else 0


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0] if __doc__ else None)
    p.add_argument("--rounds", type=int, default=30, help="measured rounds (default 30)")
    p.add_argument("--warmup", type=int, default=3, help="warm-up calls per side (default 3)")
    p.add_argument("--accel", default="tcg", choices=["tcg", "kvm"], help="default tcg")
    p.add_argument("--qemu", default="qemu-system-x86_64")
    p.add_argument("--strict", action="store_true", help="exit 1 when a target is not met")
    return p.parse_args(argv)


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    with tempfile.TemporaryDirectory(prefix="rigd-bench-agents-", dir="/var/tmp") as tmp:
        workdir = Path(tmp).resolve()
        os.chmod(workdir, 0o711)  # per-rig QEMU uids traverse it
        data_dir = workdir / "data"
        data_dir.mkdir(mode=0o711)
        srv = start_server(args, "agents", data_dir, warm=False)
        try:
            t0 = time.monotonic()
            rig = srv.client.call("rig.open", {"workspace": "default", "surface": "terminal",
                                               "conversation": CONVERSATION})
            print(f"terminal rig {rig['id']} ready in {time.monotonic() - t0:.1f} s (not timed below)")
            return trio.run(measure, args, srv.url, srv.client.token, rig["id"], workdir)
        except BenchError as exc:
            print(f"bench: {exc}", file=sys.stderr)
            return 2
        finally:
            stop_server(srv)
            REAPER.kill_all()


if __name__ == "__main__":
    raise SystemExit(main())
