"""``/mcp`` without sockets: rigd.tools.mcp.HttpEndpoint (the SDK's streamable-HTTP session manager
behind rigd's checks) driven in process through httpx2's ASGI transport, by the SDK's own
streamable-HTTP client and by raw HTTP requests, against a fake dispatcher."""

from __future__ import annotations

import json
from collections.abc import AsyncIterator, Callable
from contextlib import asynccontextmanager
from dataclasses import dataclass
from typing import Any

import httpx2
import mcp_types as types
import pytest
import trio
from mcp import Client
from mcp.client.streamable_http import streamable_http_client
from mcp_types.version import LATEST_HANDSHAKE_VERSION, MODERN_PROTOCOL_VERSIONS

from rigd.errors import Forbidden, Unauthorized
from rigd.tools.catalogue import text_result
from rigd.tools.mcp import (
    CONVERSATION_HEADER,
    MAX_BODY,
    META_RIG_ID,
    SEAT_HEADER,
    WORKSPACE_HEADER,
    HttpEndpoint,
    RpcError,
    dispatched,
)
from tests.unit.test_mcp import SCREENSHOT, listing

pytestmark = pytest.mark.timeout(30)

BASE = "http://rigd.test"
URL = BASE + "/mcp"
TOKENS = {"tok-agent": "usr_agent", "tok-admin": "usr_admin"}


@dataclass(frozen=True)
class FakeCaller:
    actor_id: str


class FakeDispatcher:
    """``Dispatcher.handle`` for one caller at a time, answering from a table; it records who
    called what, as the server's dispatcher would see it."""

    def __init__(self, replies: dict[str, Any] | None = None) -> None:
        self.calls: list[tuple[str, str, dict[str, Any]]] = []
        self.replies: dict[str, Any] = {"tools.list": listing(), **(replies or {})}

    def handle_for(self, caller: FakeCaller) -> Callable[[dict[str, Any]], Any]:
        async def handle(msg: dict[str, Any]) -> dict[str, Any]:
            method, params = msg["method"], msg["params"]
            self.calls.append((caller.actor_id, method, params))
            reply = self.replies[method]
            if callable(reply):
                reply = reply(params)
            if isinstance(reply, Exception):
                err = reply.to_json() if hasattr(reply, "to_json") else {"code": -32603, "message": str(reply)}
                return {"jsonrpc": "2.0", "id": msg["id"], "error": err}
            return {"jsonrpc": "2.0", "id": msg["id"], "result": reply}

        return handle

    def tool_calls(self) -> list[tuple[str, dict[str, Any]]]:
        return [(who, p) for who, m, p in self.calls if m == "tools.call"]


async def authenticate(token: str | None) -> FakeCaller:
    if token is None:
        raise Unauthorized("missing bearer token (Authorization: Bearer <token>)")
    if token not in TOKENS:
        raise Unauthorized("unknown or revoked token")
    return FakeCaller(TOKENS[token])


@asynccontextmanager
async def endpoint(fake: FakeDispatcher) -> AsyncIterator[HttpEndpoint]:
    ep = HttpEndpoint(authenticate, lambda caller: dispatched(fake.handle_for(caller)))  # type: ignore[arg-type]
    async with trio.open_nursery() as nursery:
        await nursery.start(ep.run)
        yield ep
        nursery.cancel_scope.cancel()


def http(ep: HttpEndpoint, token: str | None = "tok-agent", **headers: str) -> httpx2.AsyncClient:
    if token is not None:
        headers["Authorization"] = f"Bearer {token}"
    return httpx2.AsyncClient(transport=httpx2.ASGITransport(app=ep), base_url=BASE, headers=headers)


@asynccontextmanager
async def mcp_client(ep: HttpEndpoint, mode: str = "legacy", url: str = URL, token: str | None = "tok-agent",
                     **headers: str) -> AsyncIterator[Client]:
    """The SDK's client over ``ep`` (the HTTP client is ours to close: the transport leaves it open)."""
    async with (http(ep, token, **headers) as client,
                Client(streamable_http_client(url, http_client=client), mode=mode) as session):  # type: ignore[arg-type]
        yield session


def text_of(result: types.CallToolResult) -> str:
    return "\n".join(c.text for c in result.content if isinstance(c, types.TextContent))


INIT = {"jsonrpc": "2.0", "id": 1, "method": "initialize", "params": {
    "protocolVersion": LATEST_HANDSHAKE_VERSION, "capabilities": {}, "clientInfo": {"name": "t", "version": "0"}}}
ACCEPT = {"Accept": "application/json, text/event-stream", "Content-Type": "application/json"}


# -- sessions, as an SDK client runs them -----------------------------------------------------------


async def test_initialize_list_and_call_as_the_tokens_caller() -> None:
    fake = FakeDispatcher({"tools.call": lambda p: {**SCREENSHOT, "rigId": "rig_c"}
                           if p["name"] == "computer_use" else text_result("rig_c: computer, ready")})
    async with endpoint(fake) as ep, mcp_client(ep, **{WORKSPACE_HEADER: "ws-1",
                                                      CONVERSATION_HEADER: "conv-1"}) as client:
        assert client.server_info is not None and client.server_info.name == "rigd"
        names = [t.name for t in (await client.list_tools()).tools]
        assert names == ["rig_list", "rig_close", "terminal_use", "computer_use", "browser_use"]
        shot = await client.call_tool("computer_use", {"action": "screenshot"})
        assert shot.is_error is False and isinstance(shot.content[0], types.ImageContent)
        assert shot.meta is not None and shot.meta[META_RIG_ID] == "rig_c"
        rigs = await client.call_tool("rig_list", {})
        assert text_of(rigs) == "rig_c: computer, ready"
    assert fake.tool_calls() == [
        ("usr_agent", {"workspace": "ws-1", "conversation": "conv-1", "name": "computer_use",
                       "arguments": {"action": "screenshot"}}),
        ("usr_agent", {"workspace": "ws-1", "conversation": "conv-1", "name": "rig_list", "arguments": {}}),
    ]


async def test_discovery_revision_without_initialize() -> None:
    """The newer revision's client discovers (no session); its calls share one conversation of
    the token's owner in that workspace, so they reuse their rigs."""
    fake = FakeDispatcher({"tools.call": text_result("No open rigs in this workspace.")})
    async with endpoint(fake) as ep:
        for _ in range(2):
            async with mcp_client(ep, "auto", url=URL + "?workspace=ws-q") as client:
                assert client.protocol_version in MODERN_PROTOCOL_VERSIONS
                out = await client.call_tool("rig_list", {})
                assert out.is_error is False and text_of(out) == "No open rigs in this workspace."
    (who1, first), (who2, second) = fake.tool_calls()
    assert who1 == who2 == "usr_agent"
    assert first["workspace"] == second["workspace"] == "ws-q"
    assert first["conversation"] == second["conversation"] and first["conversation"].startswith("mcp-")


async def test_each_initialize_session_has_its_own_conversation() -> None:
    fake = FakeDispatcher({"tools.call": text_result("ok")})
    async with endpoint(fake) as ep:
        for _ in range(2):
            async with mcp_client(ep, **{WORKSPACE_HEADER: "default"}) as client:
                await client.call_tool("rig_list", {})
                await client.call_tool("rig_list", {})
    conversations = [p["conversation"] for _, p in fake.tool_calls()]
    assert conversations[0] == conversations[1] != conversations[2] == conversations[3]
    assert all(c.startswith("mcp-") for c in conversations)


async def test_tool_failures_are_readable_results() -> None:
    fake = FakeDispatcher({"tools.call": Forbidden("not a member of workspace 'other'", field="workspace",
                                                   reason="ask an admin")})
    async with endpoint(fake) as ep, mcp_client(ep, **{WORKSPACE_HEADER: "other"}) as client:
        denied = await client.call_tool("rig_list", {})
        assert denied.is_error is True
        assert text_of(denied) == "error: not a member of workspace 'other' [workspace: ask an admin]"
        bad = await client.call_tool("terminal_use", {"action": "exec", "timeoutS": "soon"})
        assert bad.is_error is True and "arguments.timeoutS" in text_of(bad)
        unknown = await client.call_tool("shell_use", {})
        assert unknown.is_error is True and "'shell_use'" in text_of(unknown)
    assert len(fake.tool_calls()) == 1  # the malformed calls cost no RPC


# -- refusals before MCP -----------------------------------------------------------------------------


@pytest.mark.parametrize(("token", "message"), [
    (None, "missing bearer token"), ("tok-nope", "unknown or revoked token")])
async def test_a_missing_or_unknown_token_is_401(token: str | None, message: str) -> None:
    async with endpoint(FakeDispatcher()) as ep, http(ep, token, **{WORKSPACE_HEADER: "default"}) as c:
        r = await c.post("/mcp", json=INIT, headers=ACCEPT)
    assert r.status_code == 401
    assert r.headers["www-authenticate"].startswith("Bearer")
    body = r.json()
    assert body["id"] is None and body["error"]["code"] == Unauthorized.code
    assert message in body["error"]["message"]


@pytest.mark.parametrize(("workspaces", "meant"), [
    ([{"name": "team"}, {"name": "default"}], "default"),
    ([{"name": "solo"}], "solo"),
])
async def test_a_request_naming_no_workspace_acts_in_the_callers_default(
        workspaces: list[dict[str, str]], meant: str) -> None:
    """A stock MCP client configured with only a URL and a token initialises and calls tools."""
    fake = FakeDispatcher({"workspace.list": workspaces, "tools.call": text_result("none")})
    async with endpoint(fake) as ep, mcp_client(ep) as client:
        said = client.instructions or ""
        assert f"workspace {meant!r}" in said and "default" in said, said
        await client.call_tool("rig_list", {})
    assert fake.tool_calls()[0][1]["workspace"] == meant


@pytest.mark.parametrize(("workspaces", "words"), [
    ([{"name": "a"}, {"name": "b"}], "several workspaces ('a', 'b')"),
    ([], "no workspace"),
])
async def test_an_ambiguous_default_workspace_is_refused_naming_the_header(
        workspaces: list[dict[str, str]], words: str) -> None:
    async with endpoint(FakeDispatcher({"workspace.list": workspaces})) as ep, http(ep) as c:
        r = await c.post("/mcp", json=INIT, headers=ACCEPT)
        assert r.status_code == 400
        assert r.json()["error"]["data"]["field"] == WORKSPACE_HEADER and words in r.json()["error"]["message"]


async def test_a_seat_header_reaches_every_tool_call() -> None:
    fake = FakeDispatcher({"tools.call": lambda p: text_result("exit code: 0", rigId="rig_s")})
    async with endpoint(fake) as ep, mcp_client(ep, **{WORKSPACE_HEADER: "ws-1", CONVERSATION_HEADER: "conv-1",
                                                      SEAT_HEADER: "ada"}) as client:
        await client.call_tool("terminal_use", {"action": "exec", "command": "ls"})
    assert [p.get("seat") for _, p in fake.tool_calls()] == ["ada"]


async def test_bad_workspace_and_conversation_names_are_refused_naming_them() -> None:
    async with endpoint(FakeDispatcher()) as ep, http(ep) as c:
        r = await c.post("/mcp?workspace=a&workspace=b", json=INIT, headers=ACCEPT)
        assert r.status_code == 400 and r.json()["error"]["data"]["field"] == "workspace"
        r = await c.post("/mcp", json=INIT, headers={**ACCEPT, CONVERSATION_HEADER: "no spaces please",
                                                     WORKSPACE_HEADER: "default"})
        assert r.status_code == 400 and r.json()["error"]["data"]["field"] == CONVERSATION_HEADER
        r = await c.post("/mcp?workspace=default&seat=a.b", json=INIT, headers=ACCEPT)
        assert r.status_code == 400 and r.json()["error"]["data"]["field"] == "seat"
        r = await c.post("/mcp?workspace=default", json=INIT, headers=ACCEPT)
        assert r.status_code == 200 and r.json()["result"]["serverInfo"]["name"] == "rigd"
        assert "workspace 'default'" in r.json()["result"]["instructions"]
        assert r.headers["mcp-session-id"]


async def test_get_is_405_and_a_foreign_origin_is_403() -> None:
    async with endpoint(FakeDispatcher()) as ep, http(ep, **{WORKSPACE_HEADER: "default"}) as c:
        r = await c.get("/mcp", headers={"Accept": "text/event-stream"})
        assert r.status_code == 405 and "POST" in r.headers["allow"]
        r = await c.post("/mcp", json=INIT, headers={**ACCEPT, "Origin": "http://evil.example"})
        assert r.status_code == 403 and r.json()["error"]["data"]["field"] == "Origin"
        r = await c.post("/mcp", json=INIT, headers={**ACCEPT, "Origin": BASE})
        assert r.status_code == 200


async def test_a_session_answers_only_the_token_that_opened_it() -> None:
    async with endpoint(FakeDispatcher()) as ep:
        async with http(ep, **{WORKSPACE_HEADER: "default"}) as c:
            r = await c.post("/mcp", json=INIT, headers=ACCEPT)
            session = r.headers["mcp-session-id"]
        listing_req = {"jsonrpc": "2.0", "id": 2, "method": "tools/list", "params": {}}
        headers = {**ACCEPT, "Mcp-Session-Id": session, "MCP-Protocol-Version": LATEST_HANDSHAKE_VERSION}
        async with http(ep, "tok-admin", **{WORKSPACE_HEADER: "default"}) as other:
            r = await other.post("/mcp", json=listing_req, headers=headers)
            assert r.status_code == 404
        async with http(ep, **{WORKSPACE_HEADER: "default"}) as c:
            r = await c.post("/mcp", json=listing_req, headers=headers)
            assert r.status_code == 200 and len(r.json()["result"]["tools"]) == 5


# -- malformed messages -------------------------------------------------------------------------------


async def streamed_post(ep: HttpEndpoint, chunks: list[bytes]) -> tuple[int, dict[str, Any]]:
    """POST /mcp straight through ASGI with a body that has no Content-Length (chunks as they come)."""
    pending = list(chunks)
    sent: list[dict[str, Any]] = []

    async def receive() -> dict[str, Any]:
        await trio.lowlevel.checkpoint()
        if not pending:
            await trio.sleep_forever()
        chunk = pending.pop(0)
        return {"type": "http.request", "body": chunk, "more_body": bool(pending)}

    async def send(message: dict[str, Any]) -> None:
        sent.append(message)

    headers = [(b"authorization", b"Bearer tok-agent"), (WORKSPACE_HEADER.lower().encode(), b"default"),
               (b"accept", ACCEPT["Accept"].encode()), (b"content-type", b"application/json")]
    with trio.fail_after(10):
        await ep({"type": "http", "method": "POST", "path": "/mcp", "query_string": b"", "headers": headers},
                 receive, send)
    return int(sent[0]["status"]), json.loads(b"".join(m.get("body", b"") for m in sent[1:]))


async def test_malformed_bodies_get_json_rpc_errors_and_the_endpoint_keeps_serving() -> None:
    fake = FakeDispatcher({"tools.call": text_result("ok")})
    async with endpoint(fake) as ep, http(ep, **{WORKSPACE_HEADER: "default"}) as c:
        r = await c.post("/mcp", content=b"{not json", headers=ACCEPT)
        assert r.status_code == 400 and r.json()["error"]["code"] == types.PARSE_ERROR
        r = await c.post("/mcp", content=json.dumps({"hello": "world"}).encode(), headers=ACCEPT)
        assert r.status_code == 400 and r.json()["error"]["code"] == types.INVALID_PARAMS
        r = await c.post("/mcp", content=b"x" * (MAX_BODY + 1), headers=ACCEPT)
        assert r.status_code == 413 and r.headers["content-type"] == "application/json"
        assert r.json()["error"]["code"] == types.INVALID_REQUEST and str(MAX_BODY) in r.json()["error"]["message"]
        status, body = await streamed_post(ep, [b"x" * (MAX_BODY // 4)] * 5)  # no Content-Length
        assert status == 413 and body["jsonrpc"] == "2.0" and body["error"]["data"]["field"] == "body"
        r = await c.post("/mcp", json=INIT, headers={"Accept": "application/json, text/event-stream",
                                                     "Content-Type": "text/plain"})
        assert r.status_code == 400
        # A session opened now serves a tools/call whose arguments are not an object with an
        # MCP error, and then a good call.
        r = await c.post("/mcp", json=INIT, headers=ACCEPT)
        assert r.status_code == 200
        headers = {**ACCEPT, "Mcp-Session-Id": r.headers["mcp-session-id"],
                   "MCP-Protocol-Version": LATEST_HANDSHAKE_VERSION}
        r = await c.post("/mcp", json={"jsonrpc": "2.0", "method": "notifications/initialized"}, headers=headers)
        assert r.status_code == 202
        r = await c.post("/mcp", json={"jsonrpc": "2.0", "id": 3, "method": "tools/call",
                                       "params": {"name": "rig_list", "arguments": "all"}}, headers=headers)
        assert r.json()["error"]["code"] == types.INVALID_PARAMS
        r = await c.post("/mcp", json={"jsonrpc": "2.0", "id": 4, "method": "tools/frobnicate"}, headers=headers)
        assert r.json()["error"]["code"] == types.METHOD_NOT_FOUND
        r = await c.post("/mcp", json={"jsonrpc": "2.0", "id": 5, "method": "tools/call",
                                       "params": {"name": "rig_list", "arguments": {}}}, headers=headers)
        assert r.status_code == 200 and r.json()["result"]["content"] == [{"type": "text", "text": "ok"}]
    assert len(fake.tool_calls()) == 1


# -- the in-process RPC -------------------------------------------------------------------------------


async def test_dispatched_returns_results_and_raises_errors_as_text() -> None:
    fake = FakeDispatcher({"rig.list": [], "rig.close": Forbidden("no", field="rigId", reason="not yours")})
    rpc = dispatched(fake.handle_for(FakeCaller("usr_x")))
    assert await rpc("rig.list", {"workspace": "w"}) == []
    with pytest.raises(RpcError) as err:
        await rpc("rig.close", {"rigId": "rig_1"})
    assert str(err.value) == "no [rigId: not yours]"
    assert fake.calls == [("usr_x", "rig.list", {"workspace": "w"}), ("usr_x", "rig.close", {"rigId": "rig_1"})]


# -- routing in the server ----------------------------------------------------------------------------


async def test_the_server_routes_mcp_to_the_endpoint_and_the_rest_to_quart() -> None:
    from rigd.server.lanes import LaneRouter

    seen: list[tuple[str, str]] = []

    def app(name: str) -> Any:
        async def asgi(scope: Any, receive: Any, send: Any) -> None:
            seen.append((name, scope["path"]))

        return asgi

    router = LaneRouter(app("quart"), None, app("mcp"))  # type: ignore[arg-type]
    for path in ("/mcp", "/mcp/", "/rpc", "/mcpx", "/mcp/other"):
        await router({"type": "http", "path": path}, None, None)
    await router({"type": "websocket", "path": "/mcp"}, None, None)
    assert seen == [("mcp", "/mcp"), ("mcp", "/mcp/"), ("quart", "/rpc"), ("quart", "/mcpx"),
                    ("quart", "/mcp/other"), ("quart", "/mcp")]
