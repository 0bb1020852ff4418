"""``rigd mcp``: rigd's agent tools as an MCP server on stdio.

How this works: the process is a thin bridge. ``tools/list`` asks the rigd
server's ``tools.list`` RPC for its OpenAI-format definitions and hands
``rig_list``, ``rig_close`` and every ``*_use`` tool on as MCP tools (the
function's ``parameters`` become the ``inputSchema``). ``tools/call`` checks
the arguments against that schema, then forwards them to ``tools.call`` for
the workspace and conversation given on the command line, and turns the
result into MCP content: text as text, screenshots as images. Every failure
-- an unknown tool, arguments that break the schema, an RPC error, a reply
this bridge cannot read -- comes back as a result with ``isError: true``
whose text names what was wrong, so a model can correct itself; the MCP
session keeps serving.

The RPC client is blocking (urllib in :class:`rigd.cli.Client`), so each
call runs on a worker thread (``trio.to_thread.run_sync``); see
``docs/decisions.md``. Stdout carries the protocol: logs go to stderr only.
"""

from __future__ import annotations

import base64
import binascii
import logging
import secrets
from collections.abc import Awaitable, Callable, Mapping
from dataclasses import dataclass
from typing import Any

import anyio
import mcp_types as types
import trio
from jsonschema import Draft202012Validator
from jsonschema.exceptions import SchemaError, ValidationError
from mcp.server import Server, ServerRequestContext
from mcp.server.stdio import stdio_server
from mcp.shared.exceptions import MCPError

from rigd import __version__

log = logging.getLogger("rigd.mcp")

#: A blocking RPC call: ``rpc(method, params)`` returns the JSON-RPC result or raises.
Rpc = Callable[[str, dict[str, Any]], Any]
#: The same, awaited (the bridge runs a blocking :data:`Rpc` on a thread).
AsyncRpc = Callable[[str, dict[str, Any]], Awaitable[Any]]

#: The management tools served besides every ``*_use`` tool.
MANAGEMENT_TOOLS = frozenset({"rig_list", "rig_close"})
#: ``_meta`` keys of rigd's own fields on tools and results (MCP reserves unprefixed names).
META_ACTION_CLASSES = "rigd/actionClasses"
META_RIG_ID = "rigd/rigId"
META_ERROR_DATA = "rigd/errorData"


class ReplyError(Exception):
    """A reply of the rigd server does not have the shape this bridge reads; names the field."""

    def __init__(self, field: str, reason: str) -> None:
        super().__init__(f"{field}: {reason}")
        self.field = field
        self.reason = reason


@dataclass(frozen=True)
class ToolDef:
    """One agent tool as ``tools.list`` defines it."""

    name: str
    description: str
    parameters: dict[str, Any]
    action_classes: tuple[str, ...]

    @property
    def validator(self) -> Draft202012Validator:
        return Draft202012Validator(self.parameters)


def default_conversation() -> str:
    """A conversation of this process alone: its rigs are not another MCP session's."""
    return "mcp-" + secrets.token_hex(6)


# -- the server's replies, parsed at the edge ------------------------------------------------------


def _dict(value: object, field: str) -> dict[str, Any]:
    if not isinstance(value, dict):
        raise ReplyError(field, f"must be an object, not {type(value).__name__}")
    return value


def _str(value: object, field: str) -> str:
    if not isinstance(value, str):
        raise ReplyError(field, f"must be a string, not {type(value).__name__}")
    return value


def served(name: str) -> bool:
    return name in MANAGEMENT_TOOLS or name.endswith("_use")


def parse_tool_list(reply: object) -> list[ToolDef]:
    """The tools this bridge serves, from a ``tools.list`` result (OpenAI function definitions
    plus ``metadata``). A definition whose schema is not a valid JSON Schema object is dropped
    with a warning rather than served unchecked."""
    body = _dict(reply, "result")
    raw_tools = body.get("tools")
    if not isinstance(raw_tools, list):
        raise ReplyError("result.tools", "must be a list")
    metadata = _dict(body.get("metadata", {}), "result.metadata")
    out: list[ToolDef] = []
    for i, raw in enumerate(raw_tools):
        where = f"result.tools[{i}]"
        entry = _dict(raw, where)
        if entry.get("type") != "function":
            raise ReplyError(f"{where}.type", "must be 'function'")
        fn = _dict(entry.get("function"), f"{where}.function")
        name = _str(fn.get("name"), f"{where}.function.name")
        if not served(name):
            continue
        description = _str(fn.get("description", ""), f"{where}.function.description")
        parameters = _dict(fn.get("parameters", {"type": "object"}), f"{where}.function.parameters")
        if parameters.get("type") != "object":
            raise ReplyError(f"{where}.function.parameters.type", "must be 'object'")
        try:
            Draft202012Validator.check_schema(parameters)
        except SchemaError as exc:
            log.warning("tool dropped: its parameters are not a JSON Schema",
                        extra={"tool": name, "reason": exc.message})
            continue
        meta = metadata.get(name, {})
        classes = _dict(meta, f"result.metadata.{name}").get("actionClasses", [])
        if not isinstance(classes, list) or not all(isinstance(c, str) for c in classes):
            raise ReplyError(f"result.metadata.{name}.actionClasses", "must be a list of strings")
        out.append(ToolDef(name, description, parameters, tuple(classes)))
    return out


def to_mcp_tool(tool: ToolDef) -> types.Tool:
    """An MCP tool for one definition: the schema as is, the action classes as a hint."""
    return types.Tool(
        name=tool.name,
        description=tool.description,
        input_schema=tool.parameters,
        # A tool without action classes changes nothing (rig_list); the rest may change a rig.
        annotations=types.ToolAnnotations(read_only_hint=not tool.action_classes),
        _meta={META_ACTION_CLASSES: list(tool.action_classes)},
    )


def _content(raw: object, where: str) -> types.TextContent | types.ImageContent:
    item = _dict(raw, where)
    kind = item.get("type")
    if kind == "text":
        return types.TextContent(type="text", text=_str(item.get("text"), f"{where}.text"))
    if kind == "image":
        data = _str(item.get("data"), f"{where}.data")
        mime = _str(item.get("mimeType"), f"{where}.mimeType")
        if not mime.startswith("image/"):
            raise ReplyError(f"{where}.mimeType", f"must be an image type, not {mime!r}")
        try:
            base64.b64decode(data, validate=True)
        except (binascii.Error, ValueError) as exc:
            raise ReplyError(f"{where}.data", "must be base64") from exc
        return types.ImageContent(type="image", data=data, mime_type=mime)
    raise ReplyError(f"{where}.type", f"must be 'text' or 'image', not {kind!r}")


def parse_call_result(reply: object) -> types.CallToolResult:
    """An MCP result for a ``tools.call`` result: its content, ``isError``, and rigd's extra
    fields (``rigId``, ``error_data``) under ``_meta``."""
    body = _dict(reply, "result")
    raw_content = body.get("content")
    if not isinstance(raw_content, list):
        raise ReplyError("result.content", "must be a list")
    content = [_content(item, f"result.content[{i}]") for i, item in enumerate(raw_content)]
    is_error = body.get("isError", False)
    if not isinstance(is_error, bool):
        raise ReplyError("result.isError", "must be true or false")
    meta: dict[str, Any] = {}
    if "rigId" in body:
        meta[META_RIG_ID] = _str(body["rigId"], "result.rigId")
    if body.get("error_data") is not None:
        meta[META_ERROR_DATA] = _dict(body["error_data"], "result.error_data")
    return types.CallToolResult(content=list(content), is_error=is_error, _meta=meta or None)


def error_result(text: str) -> types.CallToolResult:
    return types.CallToolResult(content=[types.TextContent(type="text", text=f"error: {text}")],
                                is_error=True)


def check_arguments(tool: ToolDef, arguments: Mapping[str, Any]) -> str | None:
    """The first way ``arguments`` breaks the tool's schema, naming the field; None if none.

    Checked here, before the call is forwarded, so a malformed call costs no rig: the server
    opens a desktop or a browser before it parses that rig's action."""
    error = next(iter(sorted(tool.validator.iter_errors(dict(arguments)),
                             key=lambda e: (len(e.absolute_path), str(e.absolute_path)))), None)
    if error is None:
        return None
    return describe(tool, error)


def describe(tool: ToolDef, error: ValidationError) -> str:
    path = "".join(f"[{p}]" if isinstance(p, int) else f".{p}" for p in error.absolute_path)
    field = "arguments" + path
    if error.validator == "additionalProperties" and isinstance(error.instance, dict):
        known = set(_dict(error.schema, "schema").get("properties", {}))
        extra = sorted(k for k in error.instance if k not in known)
        if extra:
            return (f"{field}.{extra[0]}: is not a parameter of {tool.name} "
                    f"(it takes {', '.join(sorted(known)) or 'no parameters'})")
    if error.validator == "required" and isinstance(error.instance, dict):
        required = _dict(error.schema, "schema").get("required", [])
        missing = [k for k in required if k not in error.instance]
        if missing:
            return f"{field}.{missing[0]}: is required"
    return f"{field}: {error.message}"


# -- the bridge -----------------------------------------------------------------------------------


def threaded(rpc: Rpc) -> AsyncRpc:
    """``rpc`` on a worker thread. A cancelled MCP request abandons the thread (urllib cannot be
    interrupted); the server finishes the call on its own, as it would for a client that left."""

    async def call(method: str, params: dict[str, Any]) -> Any:
        return await trio.to_thread.run_sync(lambda: rpc(method, params), abandon_on_cancel=True)

    return call


class Bridge:
    """MCP ``tools/list`` and ``tools/call`` over rigd's ``tools.list`` and ``tools.call``,
    for one workspace and conversation."""

    def __init__(self, rpc: AsyncRpc, workspace: str, conversation: str) -> None:
        self.rpc = rpc
        self.workspace = workspace
        self.conversation = conversation
        self._tools: dict[str, ToolDef] | None = None

    async def fetch_tools(self) -> dict[str, ToolDef]:
        """Ask the server for its tools (each ``tools/list`` does, so a server upgrade shows)."""
        try:
            reply = await self.rpc("tools.list", {})
        except Exception as exc:
            raise RpcFailed(f"cannot list rigd's tools: {exc}") from exc
        try:
            tools = {t.name: t for t in parse_tool_list(reply)}
        except ReplyError as exc:
            raise RpcFailed(f"rigd's tools.list reply is malformed: {exc}") from exc
        self._tools = tools
        return tools

    async def list_tools(self) -> types.ListToolsResult:
        try:
            tools = await self.fetch_tools()
        except RpcFailed as exc:
            log.warning("tools/list failed", extra={"reason": str(exc)})
            raise MCPError(types.INTERNAL_ERROR, str(exc)) from exc
        return types.ListToolsResult(tools=[to_mcp_tool(t) for t in tools.values()])

    async def call_tool(self, name: str, arguments: Mapping[str, Any] | None) -> types.CallToolResult:
        try:
            tools = self._tools if self._tools is not None else await self.fetch_tools()
        except RpcFailed as exc:
            return error_result(str(exc))
        tool = tools.get(name)
        if tool is None:
            return error_result(f"name: unknown tool {name!r}; one of {', '.join(sorted(tools))}")
        args = dict(arguments or {})
        problem = check_arguments(tool, args)
        if problem is not None:
            return error_result(problem)
        params = {"workspace": self.workspace, "conversation": self.conversation,
                  "name": name, "arguments": args}
        try:
            reply = await self.rpc("tools.call", params)
        except Exception as exc:  # the RPC's failures are the model's to read, never a crash
            log.info("tools.call failed", extra={"tool": name, "reason": str(exc)})
            return error_result(str(exc))
        try:
            return parse_call_result(reply)
        except ReplyError as exc:
            log.warning("malformed tools.call reply", extra={"tool": name, "reason": str(exc)})
            return error_result(f"rigd's reply to {name} is malformed: {exc}")


class RpcFailed(Exception):
    """``tools.list`` could not be had or read."""


def build_server(bridge: Bridge) -> Server[Any]:
    async def on_list_tools(ctx: ServerRequestContext[Any],
                            params: types.PaginatedRequestParams | None) -> types.ListToolsResult:
        return await bridge.list_tools()

    async def on_call_tool(ctx: ServerRequestContext[Any],
                           params: types.CallToolRequestParams) -> types.CallToolResult:
        return await bridge.call_tool(params.name, params.arguments)

    return Server(
        "rigd", version=__version__,
        instructions=(f"Real machines for this agent: terminal, desktop and browser rigs of workspace "
                      f"{bridge.workspace!r}. Each *_use tool opens its rig on first use and reuses "
                      "it; rig_list shows them, rig_close destroys one."),
        on_list_tools=on_list_tools, on_call_tool=on_call_tool,
    )


async def serve_stdio(bridge: Bridge) -> None:
    server = build_server(bridge)
    async with stdio_server() as (read_stream, write_stream):
        await server.run(read_stream, write_stream, server.create_initialization_options())


def run(rpc: Rpc, workspace: str, conversation: str) -> None:
    """Serve MCP on this process's stdio until the client closes it."""
    bridge = Bridge(threaded(rpc), workspace, conversation)
    log.info("serving MCP on stdio", extra={"workspace": workspace, "conversation": conversation})
    anyio.run(serve_stdio, bridge, backend="trio")
