"""MCP clients from the SDK drive a real server that boots real terminal rigs: ``rigd mcp``
as a subprocess on stdio, and the server's own ``/mcp`` over streamable HTTP. Each runs
``uname -a`` in a rig of its conversation, lists it and closes it."""

from __future__ import annotations

from pathlib import Path

import pytest
import trio
from mcp import Client

from rigd.tools.mcp import CONVERSATION_HEADER, WORKSPACE_HEADER
from tests.integration.conftest import Server
from tests.integration.mcp_clients import http_mcp, stdio_mcp, text_of

pytestmark = [pytest.mark.vm, pytest.mark.timeout(360)]


@pytest.fixture
def shared(shared_server: Server) -> Server:
    """The worker's shared server."""
    return shared_server


async def uname_list_close(server: Server, client: Client) -> None:
    names = [t.name for t in (await client.list_tools()).tools]
    assert "rig_list" in names and "rig_close" in names and "terminal_use" in names

    ran = await client.call_tool("terminal_use", {"action": "exec", "command": "uname -a"})
    assert ran.is_error is False, text_of(ran)
    assert "Linux" in text_of(ran) and "exit code: 0" in text_of(ran), text_of(ran)
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
    rigs = server.call("rig.list", {"workspace": "default"})
    assert [r["phase"] for r in rigs if r["id"] == rig_id] in ([], ["closed"])


async def test_mcp_over_stdio_runs_uname_lists_and_closes_the_rig(shared: Server, tmp_path: Path) -> None:
    with trio.fail_after(300):
        async with stdio_mcp(shared, tmp_path, "c-mcp") as (client, errlog_path):
            assert client.server_info is not None and client.server_info.name == "rigd"
            await uname_list_close(shared, client)
    # The protocol stream stayed clean (the client would have failed on a stray line);
    # the bridge's logs went to stderr.
    assert "serving MCP on stdio" in errlog_path.read_text()
    assert shared.token not in errlog_path.read_text()


async def test_mcp_over_http_runs_uname_in_a_real_rig(shared: Server) -> None:
    shared.call("user.create", {"name": "mcp-bot", "kind": "agent"})
    shared.call("member.add", {"workspace": "default", "user": "mcp-bot"})
    token = str(shared.call("token.create", {"user": "mcp-bot", "label": "mcp"})["token"])
    with trio.fail_after(300):
        async with http_mcp(shared, token, timeout_s=280,
                            **{WORKSPACE_HEADER: "default", CONVERSATION_HEADER: "c-mcp-http"}) as client:
            assert client.server_info is not None and client.server_info.name == "rigd"
            await uname_list_close(shared, client)
    assert token not in shared.log()
