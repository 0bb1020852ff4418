"""``/mcp`` on a real ``rigd serve`` (hypercorn, the stores, the dispatcher), driven by the SDK's
streamable-HTTP client and by raw HTTP over a real socket. No rig is booted: the server runs
without warm starts or networks, and the only tool called is ``rig_list``."""

from __future__ import annotations

from collections.abc import Iterator

import httpx2
import mcp_types as types
import pytest
from mcp_types.version import LATEST_HANDSHAKE_VERSION, MODERN_PROTOCOL_VERSIONS

from rigd.tools.mcp import CONVERSATION_HEADER, WORKSPACE_HEADER
from tests.integration.conftest import Server, make_data_dir, serving
from tests.integration.mcp_clients import http_mcp, text_of

pytestmark = pytest.mark.timeout(60)

INIT = {"jsonrpc": "2.0", "id": 1, "method": "initialize", "params": {
    "protocolVersion": LATEST_HANDSHAKE_VERSION, "capabilities": {}, "clientInfo": {"name": "t", "version": "0"}}}
ACCEPT = {"Accept": "application/json, text/event-stream", "Content-Type": "application/json"}


@pytest.fixture(scope="module")
def plain_server() -> Iterator[Server]:
    """A real server that boots nothing on its own (no snapshot builds, no gateways)."""
    with serving(make_data_dir(), "--no-warm-starts", "--network", "none") as srv:
        yield srv


def agent(server: Server) -> str:
    """A token of an agent that is a member of ``default`` only."""
    server.call("user.create", {"name": "bot", "kind": "agent"})
    server.call("member.add", {"workspace": "default", "user": "bot"})
    server.call("workspace.create", {"name": "other"})
    return str(server.call("token.create", {"user": "bot", "label": "mcp"})["token"])


async def test_mcp_over_http_lists_and_calls_with_an_agent_token(plain_server: Server) -> None:
    token = agent(plain_server)
    async with http_mcp(plain_server, token, **{WORKSPACE_HEADER: "default", CONVERSATION_HEADER: "c-http"}) as c:
        assert c.server_info is not None and c.server_info.name == "rigd"
        names = [t.name for t in (await c.list_tools()).tools]
        assert names == ["rig_list", "rig_close", "terminal_use", "computer_use", "browser_use"]
        listed = await c.call_tool("rig_list", {})
        assert listed.is_error is False and text_of(listed) == "No open rigs in this workspace.", text_of(listed)
        nope = await c.call_tool("rig_close", {"rigId": "rig_nope"})
        assert nope.is_error is True and "rig_nope" in text_of(nope)

    # A stock client given only the URL and the token: the agent's one workspace, said at initialize.
    async with http_mcp(plain_server, token) as c:
        assert "workspace 'default' (this user's default" in (c.instructions or ""), c.instructions
        listed = await c.call_tool("rig_list", {})
        assert listed.is_error is False and text_of(listed) == "No open rigs in this workspace."

    # The discovery revision: no initialize, no session; the workspace in the query.
    async with http_mcp(plain_server, token, "auto", path="/mcp?workspace=default") as c:
        assert c.protocol_version in MODERN_PROTOCOL_VERSIONS
        listed = await c.call_tool("rig_list", {})
        assert listed.is_error is False and text_of(listed) == "No open rigs in this workspace."

    # A workspace the agent is not a member of: the server's own refusal, as a tool result.
    async with http_mcp(plain_server, token, **{WORKSPACE_HEADER: "other"}) as c:
        denied = await c.call_tool("rig_list", {})
        assert denied.is_error is True, text_of(denied)
    assert token not in plain_server.log()


async def test_refusals_and_malformed_messages_keep_the_endpoint_serving(plain_server: Server) -> None:
    mcp_url = plain_server.url + "/mcp"
    async with httpx2.AsyncClient(timeout=30) as http:
        ws = {WORKSPACE_HEADER: "default"}
        r = await http.post(mcp_url, json=INIT, headers={**ACCEPT, **ws})
        assert r.status_code == 401 and r.headers["www-authenticate"].startswith("Bearer")
        assert r.json()["error"]["code"] == -32001
        r = await http.post(mcp_url, json=INIT, headers={**ACCEPT, **ws, "Authorization": "Bearer not-a-token"})
        assert r.status_code == 401 and "unknown or revoked token" in r.json()["error"]["message"]

        auth = {"Authorization": f"Bearer {plain_server.token}"}
        # No workspace named, and no single default: refused at initialize, naming the header.
        plain_server.call("user.create", {"name": "two-ws", "kind": "agent"})
        for ws_name in ("two-a", "two-b"):
            plain_server.call("workspace.create", {"name": ws_name})
            plain_server.call("member.add", {"workspace": ws_name, "user": "two-ws"})
        two = str(plain_server.call("token.create", {"user": "two-ws"})["token"])
        r = await http.post(mcp_url, json=INIT, headers={**ACCEPT, "Authorization": f"Bearer {two}"})
        assert r.status_code == 400 and r.json()["error"]["data"]["field"] == WORKSPACE_HEADER
        assert "'two-a', 'two-b'" in r.json()["error"]["message"]
        r = await http.get(mcp_url, headers={**auth, **ws, "Accept": "text/event-stream"})
        assert r.status_code == 405
        r = await http.post(mcp_url, content=b'{"jsonrpc": "2.0", "id": 1, "method": ', headers={**ACCEPT, **auth, **ws})
        assert r.status_code == 400 and r.json()["error"]["code"] == types.PARSE_ERROR

        r = await http.post(mcp_url, json=INIT, headers={**ACCEPT, **auth, **ws})
        assert r.status_code == 200 and r.json()["result"]["serverInfo"]["name"] == "rigd"
        session = {"Mcp-Session-Id": r.headers["mcp-session-id"], "MCP-Protocol-Version": LATEST_HANDSHAKE_VERSION}
        r = await http.post(mcp_url, content=b"[[[", headers={**ACCEPT, **auth, **ws, **session})
        assert r.status_code == 400 and r.json()["error"]["code"] == types.PARSE_ERROR
        r = await http.post(mcp_url, json={"jsonrpc": "2.0", "id": 2, "method": "tools/call",
                                           "params": {"name": "rig_list", "arguments": {}}},
                            headers={**ACCEPT, **auth, **ws, **session})
        assert r.status_code == 200
        assert r.json()["result"]["content"] == [{"type": "text", "text": "No open rigs in this workspace."}]
        # The rest of the server is where it was.
        r = await http.get(plain_server.url + "/healthz")
        assert r.status_code == 200
