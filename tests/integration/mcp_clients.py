"""MCP clients of a real server for the integration tests: the SDK's stdio client in front of
``rigd mcp`` (a subprocess the caller kills by its pid) and its streamable-HTTP client of
``/mcp``."""

from __future__ import annotations

import contextlib
import os
import shlex
import signal
import sys
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path

import httpx2
import mcp_types as types
from mcp import Client, StdioServerParameters
from mcp.client.stdio import stdio_client
from mcp.client.streamable_http import streamable_http_client

from tests.integration.conftest import REPO, Server


def text_of(result: types.CallToolResult) -> str:
    return "\n".join(c.text for c in result.content if isinstance(c, types.TextContent))


def images_of(result: types.CallToolResult) -> list[types.ImageContent]:
    return [c for c in result.content if isinstance(c, types.ImageContent)]


@asynccontextmanager
async def stdio_mcp(server: Server, workdir: Path, conversation: str, *,
                    read_timeout_s: float = 240) -> AsyncIterator[tuple[Client, Path]]:
    """``rigd mcp`` on stdio for ``default``/``conversation`` with the admin token (from a
    0600 file); yields the client and the path of the bridge's stderr. The bridge is killed
    by its pid on the way out, whatever happened."""
    token_file = workdir / "token"
    token_file.write_text(server.token + "\n")
    token_file.chmod(0o600)
    pid_file = workdir / "mcp.pid"
    errlog_path = workdir / "mcp.stderr"
    argv = [sys.executable, "-m", "rigd", "mcp", "--url", server.url, "--token-file", str(token_file),
            "--workspace", "default", "--conversation", conversation, "--log-level", "info"]
    # `exec` keeps the pid the shell wrote, so the finally below can kill the bridge by it.
    params = StdioServerParameters(
        command="/bin/sh", args=["-c", f"echo $$ > {shlex.quote(str(pid_file))}; exec {shlex.join(argv)}"],
        env={"PYTHONPATH": str(REPO)}, cwd=REPO,
    )
    try:
        with open(errlog_path, "w") as errlog:
            async with Client(stdio_client(params, errlog=errlog), mode="legacy",
                              read_timeout_seconds=read_timeout_s) as client:
                yield client, errlog_path
    finally:
        with contextlib.suppress(OSError, ValueError):
            os.kill(int(pid_file.read_text()), signal.SIGKILL)
        if errlog_path.exists():
            sys.stderr.write(errlog_path.read_text()[-4000:])


@asynccontextmanager
async def http_mcp(server: Server, token: str, mode: str = "legacy", path: str = "/mcp", *,
                   timeout_s: float = 30, **headers: str) -> AsyncIterator[Client]:
    """An SDK client of ``/mcp`` (the HTTP client is ours to close: the transport leaves it open)."""
    async with (httpx2.AsyncClient(headers={"Authorization": f"Bearer {token}", **headers},
                                   timeout=timeout_s) as http,
                Client(streamable_http_client(server.url + path, http_client=http), mode=mode) as c):  # type: ignore[arg-type]
        yield c
