"""rigd's agent tools as an MCP server: ``rigd mcp`` on stdio, and ``/mcp`` in the server.

How this works: one MCP server (:func:`_server`, the official SDK's low-level ``Server``)
answers both transports, and each request is answered by a :class:`Bridge`. ``tools/list``
asks rigd's ``tools.list`` RPC for its OpenAI-format definitions and hands ``rig_list``,
``rig_close`` and every ``*_use`` tool on as MCP tools (the function's ``parameters`` become
the ``inputSchema``). ``tools/call`` checks the arguments against that schema, then forwards
them to ``tools.call`` for the bridge's workspace and conversation, and turns the result into
MCP content: text as text, screenshots as images. Every failure -- an unknown tool, arguments
that break the schema, an RPC error, a reply this bridge cannot read -- comes back as a result
with ``isError: true`` whose text names what was wrong, so a model can correct itself; the MCP
session keeps serving.

- stdio (``rigd mcp``, :func:`run`): a separate process; the RPC is the blocking
  :class:`rigd.client.cli.Client` on a worker thread (``trio.to_thread.run_sync``); the workspace and
  conversation come from the command line. Stdout carries the protocol: logs go to stderr only.
- streamable HTTP (``/mcp``, :class:`HttpEndpoint`): inside the rigd server, on its Trio loop;
  the SDK's session manager behind rigd's checks (bearer token, ``Origin``, workspace). The RPC
  is the server's own dispatcher, called in process as the token's caller (:func:`dispatched`);
  the workspace and conversation come from the request (:data:`WORKSPACE_HEADER`,
  :data:`CONVERSATION_HEADER`, or the query).

See ``docs/decisions.md``.
"""

from __future__ import annotations

import base64
import binascii
import contextvars
import hashlib
import json
import logging
import secrets
import urllib.parse
from collections.abc import Awaitable, Callable, Mapping, MutableMapping
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import anyio
import mcp_types as types
import trio
from mcp.server import Server, ServerRequestContext
from mcp.server.auth.middleware.bearer_auth import AuthenticatedUser
from mcp.server.auth.provider import AccessToken
from mcp.server.stdio import stdio_server
from mcp.server.streamable_http import MCP_SESSION_ID_HEADER
from mcp.server.streamable_http_manager import StreamableHTTPSessionManager
from mcp.server.transport_security import TransportSecuritySettings
from mcp.shared.exceptions import MCPError

from rigd import __version__
from rigd.auth import bearer
from rigd.errors import FieldError, Forbidden, Unauthorized
from rigd.rigs.params import ID_RE, SEAT_NAME_RE, SEAT_NAME_RULE
from rigd.tools import listing
from rigd.tools.listing import ReplyError, ToolDef, check_arguments
from rigd.tools.listing import as_dict as _dict
from rigd.tools.listing import as_str as _str

if TYPE_CHECKING:
    from rigd.rigs.live import Caller

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


def default_conversation() -> str:
    """A conversation of this process alone: its rigs are not another MCP session's."""
    return "mcp-" + secrets.token_hex(6)


# -- the server's replies, parsed at the edge ------------------------------------------------------


def served(name: str) -> bool:
    return name in MANAGEMENT_TOOLS or name.endswith("_use")


def parse_tool_list(reply: object) -> list[ToolDef]:
    """The tools this bridge serves (management and ``*_use`` tools) from a ``tools.list``
    result; a definition whose schema is not a valid JSON Schema object is dropped with a
    warning rather than served unchecked (rigd/tools/listing.py reads the rest)."""
    return listing.parse_tool_list(reply, keep=served, broken_schema="drop", warn=log)


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

    def __init__(self, rpc: AsyncRpc, workspace: str, conversation: str, seat: str | None = None) -> None:
        self.rpc = rpc
        self.workspace = workspace
        self.conversation = conversation
        #: A named agent's seat (issue 29): the tools drive its lasting rig, held by the conversation.
        self.seat = seat
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
                  **({"seat": self.seat} if self.seat is not None else {}), "name": name, "arguments": args}
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


#: Picks the bridge that answers one MCP request (stdio: always the same; HTTP: the request's).
BridgeFor = Callable[[ServerRequestContext[Any]], Bridge]


def _server(bridge_for: BridgeFor, instructions: str) -> Server[Any]:
    """The one MCP server of both transports: the same catalogue, the same call path."""

    async def on_list_tools(ctx: ServerRequestContext[Any],
                            params: types.PaginatedRequestParams | None) -> types.ListToolsResult:
        return await bridge_for(ctx).list_tools()

    async def on_call_tool(ctx: ServerRequestContext[Any],
                           params: types.CallToolRequestParams) -> types.CallToolResult:
        return await bridge_for(ctx).call_tool(params.name, params.arguments)

    return _RigdServer("rigd", version=__version__, instructions=instructions,
                       on_list_tools=on_list_tools, on_call_tool=on_call_tool)


class _RigdServer(Server[Any]):
    """A Server whose ``initialize`` instructions name the workspace of the request that opened
    the session (:data:`_WHERE`, set by :class:`HttpEndpoint`; the session's task is started from
    that request's task and inherits its context), else the instructions it was made with."""

    @property
    def instructions(self) -> str | None:
        where = _WHERE.get()
        return _instructions(where) if where is not None else self._default_instructions

    @instructions.setter
    def instructions(self, value: str | None) -> None:
        self._default_instructions = value


def _instructions(where: str) -> str:
    return (f"Real machines for this agent: terminal, desktop and browser rigs of {where}. Each "
            "*_use tool opens its rig on first use and reuses it; rig_list shows them, rig_close "
            "destroys one.")


def build_server(bridge: Bridge) -> Server[Any]:
    """The MCP server of ``rigd mcp`` (stdio): every request goes to ``bridge``."""
    return _server(lambda ctx: bridge, _instructions(f"workspace {bridge.workspace!r}"))


async def serve_stdio(bridge: Bridge) -> None:
    server = build_server(bridge)
    async with stdio_server() as (read_stream, write_stream):
        await server.run(read_stream, write_stream, server.create_initialization_options())


def run(rpc: Rpc, workspace: str, conversation: str, seat: str | None = None) -> None:
    """Serve MCP on this process's stdio until the client closes it."""
    bridge = Bridge(threaded(rpc), workspace, conversation, seat)
    log.info("serving MCP on stdio", extra={"workspace": workspace, "conversation": conversation,
                                            "seat": seat})
    anyio.run(serve_stdio, bridge, backend="trio")


# -- the same tools over streamable HTTP, inside the rigd server (``/mcp``) ------------------------

#: Where an HTTP client names the workspace and the conversation (a query parameter of the
#: same name without the prefix, ``?workspace=…&conversation=…``, does as well).
WORKSPACE_HEADER = "X-Rigd-Workspace"
CONVERSATION_HEADER = "X-Rigd-Conversation"
#: A named agent's seat (``?seat=`` as well): the tools drive the seat's lasting rig.
SEAT_HEADER = "X-Rigd-Seat"
#: The ASGI scope key under which the endpoint hands the request's target to the MCP server.
SCOPE_KEY = "rigd.mcp"
#: Largest ``/mcp`` body, as for ``/rpc``.
MAX_BODY = 256 * 1024
#: Legacy (``initialize``) sessions open at once; each is a task and two memory streams.
MAX_SESSIONS = 1024
#: A legacy session with no request in flight for this long is closed (its id then answers 404).
SESSION_IDLE_S = 30 * 60

ASGIScope = MutableMapping[str, Any]
ASGIReceive = Callable[[], Awaitable[MutableMapping[str, Any]]]
ASGISend = Callable[[MutableMapping[str, Any]], Awaitable[None]]

#: One JSON-RPC request answered in process: the rigd server's ``Dispatcher.handle`` for a caller.
Handle = Callable[[dict[str, Any]], Awaitable[dict[str, Any] | None]]
#: Who sends a bearer token (raises :class:`~rigd.errors.Unauthorized`); rigd's ``Caller``.
Authenticate = Callable[[str | None], Awaitable["Caller"]]


class RpcError(Exception):
    """A JSON-RPC error of the rigd server, as text the model reads (``rigd.client.cli.Client``'s)."""


def dispatched(handle: Handle) -> AsyncRpc:
    """The rigd server's own methods as an :data:`AsyncRpc`, called in process for one caller:
    the same dispatch (and checks) as ``POST /rpc``, without the HTTP."""

    async def call(method: str, params: dict[str, Any]) -> Any:
        reply = await handle({"jsonrpc": "2.0", "id": 1, "method": method, "params": params})
        if reply is None:
            raise RpcError(f"{method}: no reply")
        if "error" in reply:
            err = _dict(reply["error"], "error")
            raw = err.get("data")
            data: dict[str, Any] = raw if isinstance(raw, dict) else {}
            field = f" [{data['field']}: {data.get('reason', '')}]" if "field" in data else ""
            raise RpcError(f"{err.get('message')}{field}")
        return reply.get("result")

    return call


@dataclass(frozen=True)
class Target:
    """Who an HTTP request is from and where its tools act, decided by :class:`HttpEndpoint`."""

    rpc: AsyncRpc
    workspace: str
    conversation: str
    seat: str | None = None


def target_of(ctx: ServerRequestContext[Any]) -> Target:
    """The target :class:`HttpEndpoint` put in this request's ASGI scope."""
    scope = getattr(ctx.request, "scope", None)
    target = scope.get(SCOPE_KEY) if isinstance(scope, Mapping) else None
    if not isinstance(target, Target):  # a request that did not come through HttpEndpoint
        raise MCPError(types.INTERNAL_ERROR, "this request has no rigd caller")
    return target


def build_http_server() -> Server[Any]:
    """The MCP server of ``/mcp``: each request's bridge is its caller's, workspace's and
    conversation's (:func:`target_of`)."""

    def bridge_for(ctx: ServerRequestContext[Any]) -> Bridge:
        target = target_of(ctx)
        return Bridge(target.rpc, target.workspace, target.conversation, target.seat)

    return _server(bridge_for, _instructions(f"the workspace named by {WORKSPACE_HEADER} (else the "
                                             "token user's default)"))


class Refused(Exception):
    """An ``/mcp`` request refused before MCP sees it: an HTTP status and a JSON-RPC error."""

    def __init__(self, status: int, error: dict[str, Any],
                 headers: list[tuple[bytes, bytes]] | None = None) -> None:
        super().__init__(error.get("message"))
        self.status = status
        self.error = error
        self.headers = headers or []


def _header(scope: ASGIScope, name: str) -> str | None:
    key = name.lower().encode("latin-1")
    values = [v.decode("latin-1") for k, v in scope.get("headers", []) if k.lower() == key]
    return values[0] if values else None


def _query(scope: ASGIScope) -> dict[str, list[str]]:
    raw = bytes(scope.get("query_string", b"")).decode("latin-1")
    try:
        return urllib.parse.parse_qs(raw, keep_blank_values=True, max_num_fields=16)
    except ValueError as exc:
        raise Refused(400, FieldError("query", "too many query fields").to_json()) from exc


def _named(scope: ASGIScope, query: dict[str, list[str]], header: str, param: str) -> tuple[str, str] | None:
    """The value a request gives by header or query parameter, and the name it was given under."""
    value = _header(scope, header)
    if value is not None:
        return header, value
    given = query.get(param)
    if given:
        if len(given) > 1:
            raise Refused(400, FieldError(param, "is given more than once").to_json())
        return param, given[0]
    return None


def workspace_of(scope: ASGIScope, query: dict[str, list[str]]) -> str | None:
    """The workspace the request names (header, else ``?workspace=``); None when it names none."""
    named = _named(scope, query, WORKSPACE_HEADER, "workspace")
    if named is None:
        return None
    field, value = named
    if not value or len(value) > 128 or not value.isprintable():
        raise Refused(400, FieldError(field, "must be 1-128 printable characters").to_json())
    return value


def seat_of(scope: ASGIScope, query: dict[str, list[str]]) -> str | None:
    """The seat the request names (header, else ``?seat=``); None when it names none."""
    named = _named(scope, query, SEAT_HEADER, "seat")
    if named is None:
        return None
    field, value = named
    if not SEAT_NAME_RE.fullmatch(value):
        raise Refused(400, FieldError(field, f"must be {SEAT_NAME_RULE}").to_json())
    return value


def default_workspace(workspaces: object, field: str = WORKSPACE_HEADER) -> str:
    """The workspace a caller who named none means (``workspace.list``'s answer in): the one
    named ``default``, else their only one; a field error naming ``field`` when that is
    ambiguous or they have none."""
    listed = workspaces if isinstance(workspaces, list) else []
    names = [str(w.get("name")) for w in listed if isinstance(w, dict)]
    if "default" in names:
        return "default"
    if len(names) == 1:
        return names[0]
    if not names:
        raise FieldError(field, "is required: this token's user is a member of no workspace")
    shown = ", ".join(repr(n) for n in sorted(names)[:10])
    raise FieldError(field, f"is required: this token's user is a member of several workspaces ({shown}) "
                            "and none is named 'default'")


#: What this request's ``initialize`` says of its workspace (instructions are per session on ``/mcp``).
_WHERE: contextvars.ContextVar[str | None] = contextvars.ContextVar("rigd_mcp_where", default=None)


def conversation_of(scope: ASGIScope, query: dict[str, list[str]], user_id: str, workspace: str) -> str:
    """The conversation given, else one of the MCP session (each ``initialize`` session its own,
    as each ``rigd mcp`` process has its own), else -- a sessionless (discovery-era) request --
    one per token owner and workspace, so its calls reuse their rigs."""
    named = _named(scope, query, CONVERSATION_HEADER, "conversation")
    if named is not None:
        field, value = named
        if not ID_RE.match(value):
            raise Refused(400, FieldError(field, "must be 1-128 characters of letters, digits, and _ . : -")
                          .to_json())
        return value
    session = _header(scope, MCP_SESSION_ID_HEADER)
    seed = f"session\n{session}" if session else f"user\n{user_id}\n{workspace}"
    return "mcp-" + hashlib.sha256(seed.encode()).hexdigest()[:12]


def _same_origin(scope: ASGIScope) -> bool:
    origin, host = _header(scope, "Origin"), _header(scope, "Host")
    scheme = "https" if scope.get("scheme") == "https" else "http"
    return origin is not None and host is not None and origin == f"{scheme}://{host}"


class HttpEndpoint:
    """``/mcp``: MCP's streamable HTTP transport (the SDK's session manager, JSON responses)
    behind rigd's own checks. Run :meth:`run` in the server's nursery before serving requests.

    Refused here, before MCP reads a byte: a foreign ``Origin`` (403, the spec's DNS-rebinding
    rule), ``GET`` (405: rigd sends nothing unprompted, so it offers no SSE stream), a missing or
    unknown bearer token (401), a missing workspace (400 naming :data:`WORKSPACE_HEADER`). The
    identity is the token's; what it may touch is decided by the methods the tools call."""

    def __init__(self, authenticate: Authenticate, rpc_for: Callable[[Caller], AsyncRpc]) -> None:
        self.authenticate = authenticate
        self.rpc_for = rpc_for
        self.manager = StreamableHTTPSessionManager(
            build_http_server(), json_response=True,
            # Host and Origin are checked in __call__ (the bind is the operator's, not a list).
            security_settings=TransportSecuritySettings(enable_dns_rebinding_protection=False),
            max_request_body_size=MAX_BODY, max_sessions=MAX_SESSIONS, session_idle_timeout=SESSION_IDLE_S,
        )
        # The SDK logs every session id at info; rigd's log keeps to its own lines (refusals of
        # a session stay: they are warnings).
        for name in ("mcp.server.streamable_http_manager", "mcp.server.streamable_http"):
            logging.getLogger(name).setLevel(logging.WARNING)

    async def run(self, *, task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED) -> None:
        async with self.manager.run():
            task_status.started()
            await trio.sleep_forever()

    async def __call__(self, scope: ASGIScope, receive: ASGIReceive, send: ASGISend) -> None:
        try:
            scope = await self.admit(scope)
            body = await _read_body(scope, receive)
        except Refused as exc:
            await _refuse(send, exc)
            return
        if body is None:
            return  # the client went away
        await self.manager.handle_request(scope, _replay(body, receive), send)

    async def admit(self, scope: ASGIScope) -> ASGIScope:
        """The scope the SDK gets, with the request's :class:`Target`; or :class:`Refused`."""
        if _header(scope, "Origin") is not None and not _same_origin(scope):
            raise Refused(403, Forbidden("a cross-origin request to /mcp is refused", field="Origin",
                                         reason="must be this server's own origin, or absent").to_json())
        if scope.get("method") == "GET":
            raise Refused(405, {"code": types.INVALID_REQUEST, "message": "rigd offers no SSE stream on "
                                "GET /mcp; POST each JSON-RPC message"}, [(b"allow", b"POST, DELETE")])
        try:
            caller = await self.authenticate(bearer(_header(scope, "Authorization")))
        except Unauthorized as exc:
            raise Refused(401, exc.to_json(), [(b"www-authenticate", b'Bearer realm="rigd"')]) from exc
        query = _query(scope)
        workspace = workspace_of(scope, query)
        if workspace is None:
            try:
                workspace = default_workspace(await self.rpc_for(caller)("workspace.list", {}))
            except FieldError as exc:
                raise Refused(400, exc.to_json()) from exc
            _WHERE.set(f"workspace {workspace!r} (this user's default: the request named none with "
                       f"{WORKSPACE_HEADER} or ?workspace=)")
        else:
            _WHERE.set(f"workspace {workspace!r}")
        conversation = conversation_of(scope, query, caller.actor_id, workspace)
        target = Target(self.rpc_for(caller), workspace, conversation, seat_of(scope, query))
        # The SDK binds a legacy session to the identity that opened it: another token's
        # request naming its id answers 404. Only the user id is kept, never the token.
        user = AuthenticatedUser(AccessToken(token="", client_id=caller.actor_id, scopes=[]))
        return {**scope, SCOPE_KEY: target, "user": user}


def _too_large() -> Refused:
    return Refused(413, {"code": types.INVALID_REQUEST,
                         "message": f"a /mcp request body is at most {MAX_BODY} bytes",
                         "data": {"field": "body", "reason": "too large"}})


async def _read_body(scope: ASGIScope, receive: ASGIReceive) -> bytes | None:
    """The request body, at most :data:`MAX_BODY` bytes (else a 413 with a JSON-RPC error:
    the SDK's own limit answers plain text); None if the client went away."""
    declared = _header(scope, "Content-Length")
    if declared is not None and declared.isdigit() and int(declared) > MAX_BODY:
        raise _too_large()
    body = bytearray()
    while True:
        message = await receive()
        if message["type"] == "http.disconnect":
            return None
        body += message.get("body", b"")
        if len(body) > MAX_BODY:
            raise _too_large()
        if not message.get("more_body", False):
            return bytes(body)


def _replay(body: bytes, receive: ASGIReceive) -> ASGIReceive:
    """``receive`` for the SDK: the body already read, then whatever the client sends next
    (its disconnect)."""
    first = [True]

    async def replayed() -> Any:
        if first[0]:
            first[0] = False
            return {"type": "http.request", "body": body, "more_body": False}
        return await receive()

    return replayed


async def _refuse(send: ASGISend, exc: Refused) -> None:
    body = json.dumps({"jsonrpc": "2.0", "id": None, "error": exc.error}).encode()
    await send({"type": "http.response.start", "status": exc.status, "headers": [
        (b"content-type", b"application/json"), (b"content-length", str(len(body)).encode()),
        (b"cache-control", b"no-store"), *exc.headers]})
    await send({"type": "http.response.body", "body": body})
