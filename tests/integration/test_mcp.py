"""``rigd mcp`` as an MCP client runs it: a subprocess on stdio, driven by the SDK's stdio
client, in front of a real server that boots a real terminal rig."""

from __future__ import annotations

import contextlib
import os
import shlex
import signal
import sys
from pathlib import Path

import mcp_types as types
import pytest
import trio
from mcp import Client, StdioServerParameters
from mcp.client.stdio import stdio_client

from tests.integration.conftest import REPO, Server

pytestmark = [pytest.mark.vm, pytest.mark.timeout(360)]


def text_of(result: types.CallToolResult) -> str:
    return "\n".join(c.text for c in result.content if isinstance(c, types.TextContent))


async def test_mcp_over_stdio_runs_a_command_lists_and_closes_the_rig(server: Server, tmp_path: Path) -> None:
    token_file = tmp_path / "token"
    token_file.write_text(server.token + "\n")
    token_file.chmod(0o600)
    pid_file = tmp_path / "mcp.pid"
    errlog_path = tmp_path / "mcp.stderr"
    argv = [sys.executable, "-m", "rigd.cli", "mcp", "--url", server.url, "--token-file", str(token_file),
            "--workspace", "default", "--conversation", "c-mcp", "--log-level", "info"]
    # `exec` keeps the pid the shell wrote, so the finally below can kill the bridge by it.
    params = StdioServerParameters(
        command="/bin/sh", args=["-c", f"echo $$ > {shlex.quote(str(pid_file))}; exec {shlex.join(argv)}"],
        env={"PYTHONPATH": str(REPO)}, cwd=REPO,
    )
    try:
        with open(errlog_path, "w") as errlog, trio.fail_after(300):
            async with Client(stdio_client(params, errlog=errlog), mode="legacy",
                              read_timeout_seconds=240) as client:
                assert client.server_info is not None and client.server_info.name == "rigd"
                names = [t.name for t in (await client.list_tools()).tools]
                assert "rig_list" in names and "rig_close" in names and "terminal_use" in names

                ran = await client.call_tool("terminal_use", {"action": "exec", "command": "echo mcp-$((6*7))"})
                assert ran.is_error is False, text_of(ran)
                assert "mcp-42" in text_of(ran) and "exit code: 0" in text_of(ran)
                assert ran.meta is not None
                rig_id = ran.meta["rigd/rigId"]

                listed = await client.call_tool("rig_list", {})
                assert listed.is_error is False and rig_id in text_of(listed)
                assert "terminal, ready" in text_of(listed)

                bad = await client.call_tool("terminal_use", {"action": "exec", "timeoutS": "soon"})
                assert bad.is_error is True and "arguments.timeoutS" in text_of(bad)

                closed = await client.call_tool("rig_close", {"rigId": rig_id})
                assert closed.is_error is False and rig_id in text_of(closed)
                nope = await client.call_tool("rig_close", {"rigId": "rig_nope"})
                assert nope.is_error is True  # the server's own refusal, readable
                assert "no rig 'rig_nope'" in text_of(nope), text_of(nope)
        # The protocol stream stayed clean (the client would have failed on a stray line);
        # the bridge's logs went to stderr.
        assert "serving MCP on stdio" in errlog_path.read_text()
        assert server.token not in errlog_path.read_text()
        rigs = server.call("rig.list", {"workspace": "default"})
        assert [r["phase"] for r in rigs if r["id"] == rig_id] in ([], ["closed"])
    finally:
        with contextlib.suppress(OSError, ValueError):
            pid = int(pid_file.read_text())
            os.kill(pid, signal.SIGKILL)
        if errlog_path.exists():
            sys.stderr.write(errlog_path.read_text()[-4000:])
