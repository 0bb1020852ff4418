"""The quart-trio application: routes, authentication, and size limits.

Routes:
- ``POST /rpc`` and ``GET /rpc`` (WebSocket): JSON-RPC 2.0 (rigd.server.rpc).
  Bodies and frames over 256 KB are refused: HTTP 413; WebSocket close 1009
  (enforced by hypercorn's ``websocket_max_message_size``). A WebSocket has
  at most ``MAX_IN_FLIGHT`` requests in flight (a batch is one); past that a
  request is answered with :class:`~rigd.errors.TooManyRequests` and not run
  (rigd.server.wsio).
- ``/rig/term/<rigId>`` (WebSocket): an interactive PTY. Authenticated by a
  bearer token or a signed ``rig-term`` target, plus membership.
- ``/rig/live/<rigId>`` (WebSocket): a computer rig's live view
  (rigd.server.live). A bearer token or a signed ``rig-view`` target.
- ``/mcp``: the agent tools over MCP's streamable HTTP transport (rigd.tools.mcp.HttpEndpoint, an
  ASGI app routed in front of Quart by rigd.server.lanes.LaneRouter, as the lanes are).
- ``GET /healthz``.
- ``/``, ``/settings/server/rigs[/<rigId>]``, ``/static/<name>``: the settings
  page (rigd.server.pages).
"""

from __future__ import annotations

import json
import logging
import time
from typing import Any

import trio
from quart import Response, request, websocket
from quart_trio import QuartTrio
from werkzeug.exceptions import HTTPException

from rigd.auth import Signer, bearer
from rigd.errors import FieldError, Forbidden, RigdError, TooManyRequests, Unauthorized
from rigd.rigs.manager import Caller, RigManager
from rigd.server.pages import register_pages
from rigd.server.rpc import Dispatcher, error, refusal
from rigd.server.session import SESSION_S, caller_for, check_origin, clear_cookie, session_cookie, set_cookie
from rigd.server.wsio import LockedSender, Message, serve_requests
from rigd.store.aio import Stores

log = logging.getLogger("rigd.server")

MAX_INBOUND = 256 * 1024
#: Requests one RPC WebSocket may have in flight (started and not yet answered).
MAX_IN_FLIGHT = 64


def json_response(payload: Any, status: int = 200) -> Response:
    return Response(json.dumps(payload), status=status, content_type="application/json")


class ServerContext:
    def __init__(self, stores: Stores, rigs: RigManager, dispatcher: Dispatcher, signer: Signer) -> None:
        self.stores = stores
        self.rigs = rigs
        self.dispatcher = dispatcher
        self.signer = signer

    async def caller_from_token(self, token: str | None) -> Caller:
        if token is None:
            raise Unauthorized("missing bearer token (Authorization: Bearer <token>)")
        user = await self.stores.run(self.stores.server.user_for_token, token)
        if user is None:
            raise Unauthorized("unknown or revoked token")
        return Caller(user)


class WsSession:
    """One RPC WebSocket: its one sender, and the event subscriptions it holds.

    Each subscription is forwarded by one task, so a subscriber sees a
    workspace's events in order, as ``rig.event`` notifications.
    """

    def __init__(self, nursery: trio.Nursery, sender: LockedSender) -> None:
        self._nursery = nursery
        self._sender = sender
        self._subscribed: set[str] = set()

    async def send(self, payload: Any) -> None:
        await self._sender.send_json(payload)

    def subscribe(self, workspace_id: str, channel: trio.MemoryReceiveChannel[dict[str, Any]]) -> None:
        if workspace_id in self._subscribed:
            channel.close()
            return
        self._subscribed.add(workspace_id)
        self._nursery.start_soon(self._forward, channel)

    async def _forward(self, channel: trio.MemoryReceiveChannel[dict[str, Any]]) -> None:
        async with channel:
            async for event in channel:
                await self.send({"jsonrpc": "2.0", "method": "rig.event", "params": event})


def create_app(ctx: ServerContext) -> QuartTrio:
    app = QuartTrio("rigd")
    app.config["MAX_CONTENT_LENGTH"] = MAX_INBOUND

    @app.errorhandler(HTTPException)
    async def http_error(exc: HTTPException) -> Response:
        code = exc.code or 500
        return json_response(
            error(None, -32600, f"{code} {exc.name}", {"reason": exc.description or exc.name}), code
        )

    @app.get("/healthz")
    async def healthz() -> Response:
        return json_response({"ok": True})

    @app.post("/session")
    async def sign_in() -> Response:
        """A person signs in with a token; the answer carries the session cookie."""
        try:
            if request.headers.get("Origin"):
                check_origin(request.headers, request.scheme)
            token = bearer(request.headers.get("Authorization"))
            if token is None:
                body = json.loads(await request.get_data() or b"{}")
                token = body.get("token") if isinstance(body, dict) else None
            if not isinstance(token, str) or not token:
                raise FieldError("token", "give the token to sign in with")
            user = await ctx.stores.run(ctx.stores.server.user_for_token, token)
            if user is None:
                raise Unauthorized("unknown or revoked token")
            if user.kind != "person":
                raise Forbidden("an agent token cannot sign in to the page", field="token",
                                reason="sign in with a person's token")
            secret = await ctx.stores.run(ctx.stores.server.create_session, user.id,
                                          time.time() + SESSION_S)
        except ValueError:
            return json_response({"error": FieldError("body", "must be JSON").to_json()}, 400)
        except RigdError as exc:
            return json_response({"error": exc.to_json()}, _status(exc))
        response = json_response({"user": user.to_json(), "expiresInS": SESSION_S})
        response.headers["Set-Cookie"] = set_cookie(secret)
        return response

    @app.post("/session/end")
    async def sign_out() -> Response:
        secret = session_cookie(request.headers)
        try:
            check_origin(request.headers, request.scheme)
        except RigdError as exc:
            return json_response({"error": exc.to_json()}, 403)
        ended = secret is not None and await ctx.stores.run(ctx.stores.server.end_session, secret,
                                                              time.time())
        response = json_response({"ended": bool(ended)})
        response.headers["Set-Cookie"] = clear_cookie()
        return response

    @app.post("/rpc")
    async def rpc_http() -> Response:
        try:
            caller = await caller_for(ctx.stores, request.headers, request.scheme, changes_state=True)
        except RigdError as exc:
            return json_response({"jsonrpc": "2.0", "id": None, "error": exc.to_json()}, _status(exc))
        body = await request.get_data()
        reply = await ctx.dispatcher.handle_bytes(caller, body)
        if reply is None:
            return Response("", status=204)
        return json_response(reply)

    @app.websocket("/rpc")
    async def rpc_ws() -> Any:
        try:
            caller = await caller_for(ctx.stores, websocket.headers, _ws_scheme(), changes_state=True)
        except RigdError as exc:
            return json_response({"jsonrpc": "2.0", "id": None, "error": exc.to_json()}, _status(exc))
        await websocket.accept()
        too_many = TooManyRequests(MAX_IN_FLIGHT)
        async with trio.open_nursery() as nursery:
            session = WsSession(nursery, LockedSender(websocket.send))
            session_caller = Caller(caller.user, session=session)

            async def answer(message: Message) -> Any:
                return await ctx.dispatcher.handle_bytes(session_caller, message)

            await serve_requests(nursery, websocket.receive, answer, lambda m: refusal(m, too_many),
                                 session.send, limit=MAX_IN_FLIGHT)
        return None

    @app.websocket("/rig/term/<rig_id>")
    async def terminal(rig_id: str) -> Any:
        from rigd.server.term import serve_terminal

        return await serve_terminal(ctx, rig_id)

    @app.websocket("/rig/live/<rig_id>")
    async def live(rig_id: str) -> Any:
        from rigd.server.live import serve_live

        return await serve_live(ctx, rig_id)

    register_pages(app)
    return app


async def lane_caller(ctx: ServerContext, kind: str, rig_id: str) -> Caller:
    """Who opens a lane's WebSocket: a bearer token, or a signed ``<kind>:<ws>/<rig>``
    target in the query (a signature for one kind verifies for no other)."""
    token = bearer(websocket.headers.get("Authorization"))
    if token is not None:
        return await ctx.caller_from_token(token)
    if "sig" not in websocket.args and session_cookie(websocket.headers) is not None:
        return await caller_for(ctx.stores, websocket.headers, _ws_scheme(), changes_state=True)
    ws_id = await ctx.stores.run(ctx.stores.server.workspace_of_rig, rig_id) or "-"
    signed = ctx.signer.verify(kind, ws_id, rig_id, dict(websocket.args))
    user = await ctx.stores.run(ctx.stores.server.get_user, signed.user_id)
    return Caller(user)


def _status(exc: RigdError) -> int:
    return 403 if isinstance(exc, Forbidden) else 400 if isinstance(exc, FieldError) else 401


def _ws_scheme() -> str:
    """The origin scheme a browser's page would have for this WebSocket's server."""
    return "https" if websocket.scheme in ("wss", "https") else "http"


def lane_refusal(exc: RigdError) -> Response:
    """The HTTP answer to a lane WebSocket that is refused before the upgrade."""
    status = 404 if exc.code == -32004 else 409 if exc.code == -32009 else _status(exc)
    return json_response({"error": exc.to_json()}, status)
