"""``rigd mcp`` without sockets: the translation of rigd's tool definitions to MCP tools, the
rendering of ``tools.call`` results, and whole MCP sessions (SDK client ↔ our server over the
SDK's in-memory transport, on Trio) against a fake RPC."""

from __future__ import annotations

import base64
import io
import threading
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from typing import Any

import mcp_types as types
import pytest
import trio
from mcp import Client
from mcp.shared.exceptions import MCPError
from mcp.shared.memory import create_client_server_memory_streams
from mcp.shared.message import SessionMessage
from mcp_types import JSONRPCError, JSONRPCNotification, JSONRPCRequest, JSONRPCResponse
from mcp_types.version import LATEST_HANDSHAKE_VERSION, MODERN_PROTOCOL_VERSIONS
from PIL import Image

from rigd.client.cli import ClientError
from rigd.tools.catalogue import definitions, metadata, render_computer, text_result
from rigd.tools.listing import validator_of
from rigd.tools.mcp import (
    META_ACTION_CLASSES,
    META_RIG_ID,
    Bridge,
    ReplyError,
    build_server,
    parse_call_result,
    parse_tool_list,
    threaded,
    to_mcp_tool,
)

pytestmark = pytest.mark.timeout(30)


def png(width: int = 4, height: int = 3) -> str:
    buf = io.BytesIO()
    Image.new("RGB", (width, height), (200, 10, 10)).save(buf, "PNG")
    return base64.b64encode(buf.getvalue()).decode()


def listing() -> dict[str, Any]:
    """What the real server's ``tools.list`` returns (the definitions are pure data)."""
    return {"tools": definitions(), "metadata": metadata()}


SCREENSHOT = render_computer("screenshot", {
    "image": {"data": png(), "mediaType": "image/png"}, "display": {"width": 1280, "height": 800},
    "imageSize": {"width": 4, "height": 3}, "scale": 320.0,
})


class FakeRpc:
    """A blocking RPC like :class:`rigd.client.cli.Client.call`, answering from a table."""

    def __init__(self, replies: dict[str, Any] | None = None) -> None:
        self.calls: list[tuple[str, dict[str, Any]]] = []
        self.replies: dict[str, Any] = {"tools.list": listing(), **(replies or {})}

    def __call__(self, method: str, params: dict[str, Any]) -> Any:
        self.calls.append((method, params))
        reply = self.replies[method]
        if isinstance(reply, Exception):
            raise reply
        return reply(params) if callable(reply) else reply

    def tool_calls(self) -> list[dict[str, Any]]:
        return [p for m, p in self.calls if m == "tools.call"]


def bridge(rpc: FakeRpc) -> Bridge:
    return Bridge(threaded(rpc), "ws-1", "conv-1")


# -- translation ----------------------------------------------------------------------------------


def test_definitions_become_mcp_tools_with_their_schemas() -> None:
    tools = parse_tool_list(listing())
    assert [t.name for t in tools] == ["rig_list", "rig_close", "terminal_use", "computer_use", "browser_use"]
    by_name = {t.name: to_mcp_tool(t) for t in tools}
    openai = {d["function"]["name"]: d["function"] for d in definitions()}
    for name, tool in by_name.items():
        assert tool.input_schema == openai[name]["parameters"]
        assert tool.description == openai[name]["description"]
    assert by_name["rig_list"].annotations is not None and by_name["rig_list"].annotations.read_only_hint
    assert by_name["terminal_use"].annotations is not None
    assert by_name["terminal_use"].annotations.read_only_hint is False
    assert by_name["terminal_use"].meta == {
        META_ACTION_CLASSES: ["enclosureControl", "networkEgress", "processSpawn"]}
    # What goes on the wire is MCP's camelCase.
    wire = by_name["rig_close"].model_dump(by_alias=True, exclude_none=True)
    assert wire["inputSchema"]["required"] == ["rigId"] and "input_schema" not in wire


def test_only_management_and_use_tools_are_served() -> None:
    reply = listing()
    reply["tools"].append({"type": "function", "function": {
        "name": "server_admin", "description": "not for agents", "parameters": {"type": "object"}}})
    assert "server_admin" not in [t.name for t in parse_tool_list(reply)]


@pytest.mark.parametrize(("reply", "field"), [
    ([], "result"),
    ({"tools": {}}, "result.tools"),
    ({"tools": [{"type": "other"}]}, "result.tools[0].type"),
    ({"tools": [{"type": "function", "function": {"name": 7}}]}, "result.tools[0].function.name"),
    ({"tools": [{"type": "function", "function": {"name": "x_use", "parameters": {"type": "array"}}}]},
     "result.tools[0].function.parameters.type"),
    ({"tools": [{"type": "function", "function": {"name": "x_use"}}],
      "metadata": {"x_use": {"actionClasses": "all"}}}, "result.metadata.x_use.actionClasses"),
])
def test_a_malformed_listing_names_the_field(reply: Any, field: str) -> None:
    with pytest.raises(ReplyError) as err:
        parse_tool_list(reply)
    assert err.value.field == field


def test_a_definition_with_a_broken_schema_is_dropped() -> None:
    reply = {"tools": [{"type": "function", "function": {
        "name": "x_use", "parameters": {"type": "object", "properties": {"a": {"type": 5}}}}}]}
    assert parse_tool_list(reply) == []


# -- rendering ------------------------------------------------------------------------------------


def test_a_screenshot_becomes_image_content() -> None:
    result = parse_call_result({**SCREENSHOT, "rigId": "rig_abc"})
    image, text = result.content
    assert isinstance(image, types.ImageContent) and image.mime_type == "image/png"
    assert Image.open(io.BytesIO(base64.b64decode(image.data))).size == (4, 3)
    assert isinstance(text, types.TextContent) and "display 1280x800" in text.text
    assert result.is_error is False
    assert result.meta == {META_RIG_ID: "rig_abc"}
    wire = result.model_dump(by_alias=True, exclude_none=True)
    assert wire["content"][0]["mimeType"] == "image/png" and wire["isError"] is False


def test_text_and_errors_keep_their_flag_and_data() -> None:
    ok = parse_call_result(text_result("exit code: 0", rigId="rig_1"))
    assert [c.text for c in ok.content if isinstance(c, types.TextContent)] == ["exit code: 0"]
    failed = parse_call_result(text_result("error: action.timeoutS: must be between 0 and 3600", error=True,
                                           error_data={"field": "action.timeoutS"}))
    assert failed.is_error is True
    assert failed.meta == {"rigd/errorData": {"field": "action.timeoutS"}}


@pytest.mark.parametrize(("reply", "field"), [
    ("text", "result"),
    ({"content": "x"}, "result.content"),
    ({"content": [{"type": "audio", "data": ""}]}, "result.content[0].type"),
    ({"content": [{"type": "text"}]}, "result.content[0].text"),
    ({"content": [{"type": "image", "data": "not base64!", "mimeType": "image/png"}]}, "result.content[0].data"),
    ({"content": [{"type": "image", "data": "", "mimeType": "text/html"}]}, "result.content[0].mimeType"),
    ({"content": [], "isError": "yes"}, "result.isError"),
    ({"content": [], "rigId": 5}, "result.rigId"),
])
def test_a_malformed_result_names_the_field(reply: Any, field: str) -> None:
    with pytest.raises(ReplyError) as err:
        parse_call_result(reply)
    assert err.value.field == field


# -- the bridge, called directly -------------------------------------------------------------------


async def test_a_call_is_forwarded_for_the_command_lines_workspace_and_conversation() -> None:
    rpc = FakeRpc({"tools.call": text_result("exit code: 0\nmcp-42", rigId="rig_t")})
    result = await bridge(rpc).call_tool("terminal_use", {"action": "exec", "command": "echo mcp-$((6*7))"})
    assert rpc.tool_calls() == [{"workspace": "ws-1", "conversation": "conv-1", "name": "terminal_use",
                                 "arguments": {"action": "exec", "command": "echo mcp-$((6*7))"}}]
    assert result.is_error is False and "mcp-42" in result.content[0].text  # type: ignore[union-attr]


async def test_a_seated_bridge_names_its_seat_in_every_call() -> None:
    rpc = FakeRpc({"tools.call": text_result("exit code: 0", rigId="rig_s")})
    await Bridge(threaded(rpc), "ws-1", "conv-1", "ada").call_tool("terminal_use", {"action": "exec", "command": "ls"})
    assert [c["seat"] for c in rpc.tool_calls()] == ["ada"]


async def test_rpc_failures_and_malformed_replies_are_readable_errors() -> None:
    rpc = FakeRpc({"tools.call": ClientError("cannot reach rigd at http://127.0.0.1:1: refused")})
    down = await bridge(rpc).call_tool("rig_list", {})
    assert down.is_error and "cannot reach rigd" in down.content[0].text  # type: ignore[union-attr]
    rpc = FakeRpc({"tools.call": {"content": [{"type": "video"}]}})
    odd = await bridge(rpc).call_tool("rig_list", {})
    assert odd.is_error and "result.content[0].type" in odd.content[0].text  # type: ignore[union-attr]
    rpc = FakeRpc({"tools.list": ClientError("unauthorized")})
    nolist = await bridge(rpc).call_tool("rig_list", {})
    assert nolist.is_error and "cannot list rigd's tools: unauthorized" in nolist.content[0].text  # type: ignore[union-attr]


async def test_a_cancelled_call_returns_at_once() -> None:
    """urllib cannot be interrupted: a cancelled call leaves its thread behind, not the caller."""
    started = trio.Event()
    done = threading.Event()
    token = trio.lowlevel.current_trio_token()

    def stuck(params: dict[str, Any]) -> dict[str, Any]:
        trio.from_thread.run_sync(started.set, trio_token=token)
        done.wait(10)
        return text_result("late")

    b = bridge(FakeRpc({"tools.call": stuck}))
    await b.fetch_tools()
    try:
        async with trio.open_nursery() as nursery:
            nursery.start_soon(b.call_tool, "rig_list", {})
            await started.wait()
            cancelled_at = trio.current_time()
            nursery.cancel_scope.cancel()
        assert trio.current_time() - cancelled_at < 2  # the cancel did not wait for the thread
        assert not done.is_set()
    finally:
        done.set()


# -- whole MCP sessions over the SDK's in-memory transport -----------------------------------------


async def test_session_initialize_list_and_call() -> None:
    rpc = FakeRpc({"tools.call": lambda p: {**SCREENSHOT, "rigId": "rig_c"} if p["name"] == "computer_use"
                   else text_result("rig_c: computer, ready")})
    async with Client(build_server(bridge(rpc)), mode="legacy") as client:
        assert client.server_info is not None and client.server_info.name == "rigd"
        assert client.server_capabilities.tools is not None
        listed = await client.list_tools()
        assert [t.name for t in listed.tools] == ["rig_list", "rig_close", "terminal_use", "computer_use",
                                                  "browser_use"]
        shot = await client.call_tool("computer_use", {"action": "screenshot"})
        assert shot.is_error is False
        assert isinstance(shot.content[0], types.ImageContent) and shot.content[0].mime_type == "image/png"
        assert base64.b64decode(shot.content[0].data).startswith(b"\x89PNG")
        assert shot.meta is not None and shot.meta[META_RIG_ID] == "rig_c"
        rigs = await client.call_tool("rig_list", {})
        assert rigs.content == [types.TextContent(type="text", text="rig_c: computer, ready")]
    assert [p["name"] for p in rpc.tool_calls()] == ["computer_use", "rig_list"]


async def test_session_by_discovery_without_initialize() -> None:
    """The newer revision's clients discover instead of the initialize handshake."""
    rpc = FakeRpc({"tools.call": text_result("No open rigs in this workspace.")})
    async with Client(build_server(bridge(rpc)), mode="auto") as client:
        assert "rig_list" in [t.name for t in (await client.list_tools()).tools]
        out = await client.call_tool("rig_list", {})
        assert out.is_error is False and out.content[0].text == "No open rigs in this workspace."  # type: ignore[union-attr]


async def test_session_unknown_tool_is_an_error_result_naming_it() -> None:
    rpc = FakeRpc()
    async with Client(build_server(bridge(rpc)), mode="legacy") as client:
        await client.list_tools()
        out = await client.call_tool("shell_use", {"command": "id"})
        assert out.is_error is True
        text = out.content[0].text  # type: ignore[union-attr]
        assert "'shell_use'" in text and "terminal_use" in text
        # The session keeps serving.
        assert len((await client.list_tools()).tools) == 5
    assert rpc.tool_calls() == []


@pytest.mark.parametrize(("arguments", "field"), [
    ({"action": "exec", "timeoutS": "soon"}, "arguments.timeoutS"),
    ({"action": "exec", "timeoutS": -1}, "arguments.timeoutS"),
    ({"action": "exec", "argv": ["ls", 3]}, "arguments.argv[1]"),
    ({"action": "launch"}, "arguments.action"),
    ({"command": "ls"}, "arguments.action: is required"),
    ({"action": "exec", "workspace": "other"}, "arguments.workspace: is not a parameter of terminal_use"),
])
async def test_session_malformed_arguments_are_an_error_result_naming_the_field(
        arguments: dict[str, Any], field: str) -> None:
    rpc = FakeRpc()
    async with Client(build_server(bridge(rpc)), mode="legacy") as client:
        out = await client.call_tool("terminal_use", arguments)
        assert out.is_error is True
        assert field in out.content[0].text  # type: ignore[union-attr]
    assert rpc.tool_calls() == []  # refused before any rig is opened


async def test_session_list_fails_as_an_mcp_error_and_recovers() -> None:
    rpc = FakeRpc({"tools.list": ClientError("cannot reach rigd at http://127.0.0.1:1")})
    async with Client(build_server(bridge(rpc)), mode="legacy") as client:
        with pytest.raises(MCPError) as err:
            await client.list_tools()
        assert "cannot reach rigd" in err.value.message
        rpc.replies["tools.list"] = listing()
        assert len((await client.list_tools(cache_mode="refresh")).tools) == 5


@asynccontextmanager
async def over_streams(server: Any) -> AsyncIterator[Any]:
    """A client transport: the server run on the SDK's memory streams, JSON-RPC framed."""
    async with (create_client_server_memory_streams() as (client_streams, (server_read, server_write)),
                trio.open_nursery() as nursery):
        nursery.start_soon(server.run, server_read, server_write, server.create_initialization_options())
        yield client_streams
        nursery.cancel_scope.cancel()


async def test_discovery_over_json_rpc_streams() -> None:
    """The same, framed as JSON-RPC on streams (what stdio carries): the server answers
    ``server/discover`` as well as ``initialize``."""
    rpc = FakeRpc({"tools.call": text_result("No open rigs in this workspace.")})
    async with Client(over_streams(build_server(bridge(rpc))), mode="auto") as client:
        assert client.protocol_version in MODERN_PROTOCOL_VERSIONS
        out = await client.call_tool("rig_list", {})
        assert out.is_error is False and out.content[0].text == "No open rigs in this workspace."  # type: ignore[union-attr]


async def test_malformed_messages_get_mcp_errors_and_the_server_keeps_serving() -> None:
    rpc = FakeRpc()
    server = build_server(bridge(rpc))
    async with create_client_server_memory_streams() as ((client_read, client_write), (server_read, server_write)):

        async def request(rid: int, method: str, params: dict[str, Any] | None) -> Any:
            await client_write.send(SessionMessage(JSONRPCRequest(jsonrpc="2.0", id=rid, method=method,
                                                                  params=params)))
            reply = await client_read.receive()
            assert isinstance(reply, SessionMessage)
            return reply.message

        async with trio.open_nursery() as nursery:
            nursery.start_soon(server.run, server_read, server_write, server.create_initialization_options())
            init = await request(1, "initialize", {"protocolVersion": LATEST_HANDSHAKE_VERSION,
                                                   "capabilities": {}, "clientInfo": {"name": "t", "version": "0"}})
            assert isinstance(init, JSONRPCResponse)
            await client_write.send(SessionMessage(JSONRPCNotification(
                jsonrpc="2.0", method="notifications/initialized")))
            not_object = await request(2, "tools/call", {"name": "rig_list", "arguments": "all of them"})
            assert isinstance(not_object, JSONRPCError) and not_object.error.code == types.INVALID_PARAMS
            no_name = await request(3, "tools/call", {"arguments": {}})
            assert isinstance(no_name, JSONRPCError) and no_name.error.code == types.INVALID_PARAMS
            unknown = await request(4, "tools/frobnicate", {})
            assert isinstance(unknown, JSONRPCError) and unknown.error.code == types.METHOD_NOT_FOUND
            listed = await request(5, "tools/list", {})
            assert isinstance(listed, JSONRPCResponse) and len(listed.result["tools"]) == 5
            await client_write.aclose()  # EOF: the server's loop ends by itself
    assert rpc.tool_calls() == []


def test_a_schema_is_checked_once_and_its_validator_shared(monkeypatch: pytest.MonkeyPatch) -> None:
    """/mcp builds a bridge per request: the catalogue's schemas are checked once per process."""
    from jsonschema import Draft202012Validator
    from jsonschema.exceptions import SchemaError

    checked: list[object] = []
    real = Draft202012Validator.check_schema
    monkeypatch.setattr(Draft202012Validator, "check_schema",
                        classmethod(lambda cls, s: (checked.append(s), real(s))[1]))
    schema = {"type": "object", "properties": {"n": {"type": "integer", "minimum": 7}}}
    first = validator_of(schema)
    again = validator_of({"properties": {"n": {"minimum": 7, "type": "integer"}}, "type": "object"})
    assert first is again and len(checked) == 1
    assert [e.message for e in first.iter_errors({"n": 3})] == ["3 is less than the minimum of 7"]
    for _ in range(2):  # a broken schema is refused every time, never remembered as good
        with pytest.raises(SchemaError):
            validator_of({"type": "object", "properties": {"n": {"type": 5}}})
