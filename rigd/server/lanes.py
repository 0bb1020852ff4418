"""The clipboard and file lanes over HTTP (RIGS.md §10, API.md "Lanes").

- ``POST /rig/files/<rigId>[?x=&y=]``: ``multipart/form-data``, one part per
  file. Streamed from the socket to the guest as it arrives (never whole in
  memory): each part is a temporary file in the guest, checked by sha256 at
  the agent; only when every part arrived are they given their names
  (``2-name`` on a collision; nothing is overwritten). Any refusal or a
  client that goes away leaves nothing behind.
- ``GET /rig/files/<rigId>?p=<base64url guest path>``: one file out, with
  ``Content-Length``, ``Repr-Digest`` and ``Content-Disposition``.
- ``GET|POST /rig/clipboard/<rigId>[?selection=…]``: text, one PNG/JPEG
  image, or a uri-list.

These routes are a raw ASGI app in front of Quart: Quart's request body
buffers whatever the socket delivers, while here ``receive()`` is only
called when the guest took the previous chunk, so hypercorn's bounded queue
pushes back on the client (docs/decisions.md).

Auth: a bearer token, or a signed ``rig-files:<workspaceId>/<rigId>`` target
(``rig.filesUrl``); a ``rig-view``/``rig-term`` signature does not verify
here. The lanes are for people: an agent token is refused (an agent has a
shell in its rig). Writes (drops, clipboard POST) respect a person's control
lease; reads are observations. Clipboard crossings follow the person's own
policy (``clipboard.policy.*``). The audit log gets shapes, never content.
"""

from __future__ import annotations

import base64
import binascii
import json
import logging
import re
import time
import urllib.parse
from collections.abc import Awaitable, Callable, MutableMapping
from typing import Any, cast

import trio
from hypercorn.typing import ASGIFramework, ASGIReceiveCallable, ASGISendCallable
from hypercorn.typing import Scope as ASGIScope
from werkzeug.datastructures import Headers
from werkzeug.exceptions import RequestEntityTooLarge
from werkzeug.http import parse_options_header
from werkzeug.sansio.multipart import Data, Epilogue, Field, File, MultipartDecoder, NeedData

from rigd.auth import bearer
from rigd.backends.base import Machine
from rigd.backends.lanes import (
    MAX_CLIP_IMAGE,
    MAX_CLIP_TEXT,
    MAX_DROP_BYTES,
    MAX_DROP_FILES,
    MAX_FILE_BYTES,
    MIB,
    Clip,
    Lanes,
    Sink,
    check_name,
)
from rigd.errors import (
    BackendError,
    Conflict,
    FieldError,
    Forbidden,
    NotFound,
    RigdError,
    Unauthorized,
)
from rigd.rigs.manager import Caller
from rigd.server.app import ServerContext
from rigd.server.session import caller_for, session_cookie

log = logging.getLogger("rigd.lanes")

Scope = MutableMapping[str, Any]
Receive = Callable[[], Awaitable[MutableMapping[str, Any]]]
Send = Callable[[MutableMapping[str, Any]], Awaitable[None]]
#: An ASGI app that reads plain mappings, as the lanes do (MCP's endpoint).
PlainApp = Callable[[Scope, Receive, Send], Awaitable[None]]

#: MCP's streamable HTTP endpoint (rigd.tools.mcp.HttpEndpoint).
MCP_PATHS = frozenset({"/mcp", "/mcp/"})
LANE_PATH = re.compile(r"/rig/(files|clipboard)/([A-Za-z0-9_-]{1,64})")
#: Multipart framing per part (boundaries, headers) on top of the files' bytes.
PART_OVERHEAD = 16 * 1024
#: A part's headers (or the preamble) larger than this is refused.
MAX_HEADER_BYTES = 64 * 1024
#: Chunks handed to the guest at a time while a drop streams in.
FEED_BYTES = 512 * 1024
#: What a clipboard read answers, per media type.
CLIP_CONTENT_TYPES = {
    "text/plain": "text/plain; charset=utf-8", "text/uri-list": "text/uri-list",
    "image/png": "image/png", "image/jpeg": "image/jpeg",
}
POSTABLE = {"text/plain", "image/png", "image/jpeg"}


class TooLarge(FieldError):
    """A body, file or drop over its limit (HTTP 413)."""


class Gone(Exception):
    """The client went away mid-request; there is nobody to answer."""


def status_of(exc: RigdError) -> int:
    if isinstance(exc, TooLarge):
        return 413
    if isinstance(exc, FieldError):
        return 400
    if isinstance(exc, Unauthorized):
        return 401
    if isinstance(exc, Forbidden):
        return 403
    if isinstance(exc, NotFound):
        return 404
    if isinstance(exc, Conflict):
        return 409
    return 502 if isinstance(exc, BackendError) else 500


class LaneRouter:
    """The ASGI app the server runs: the lanes and ``/mcp`` (an ASGI app of its own,
    rigd.tools.mcp.HttpEndpoint) here, everything else to Quart."""

    def __init__(self, app: ASGIFramework, ctx: ServerContext, mcp: PlainApp | None = None) -> None:
        self.app = app
        self.ctx = ctx
        self.mcp = mcp

    async def __call__(self, asgi_scope: ASGIScope, asgi_receive: ASGIReceiveCallable,
                       asgi_send: ASGISendCallable) -> None:
        # The lanes read plain keys: hypercorn's TypedDicts, as the mappings they are.
        scope, receive, send = cast(Scope, asgi_scope), cast(Receive, asgi_receive), cast(Send, asgi_send)
        if scope["type"] == "http":
            if self.mcp is not None and scope.get("path") in MCP_PATHS:
                await self.mcp(scope, receive, send)
                return
            if scope.get("path") == CA_PATH:
                await serve_ca(self.ctx, scope, send)
                return
            match = LANE_PATH.fullmatch(scope.get("path", ""))
            if match is not None:
                await serve_lane(self.ctx, match[1], match[2], scope, receive, send)
                return
        await self.app(asgi_scope, asgi_receive, asgi_send)


#: The dev CA's certificate, public (what ``rigd ca`` fetches from the server it talks to).
CA_PATH = "/ca.pem"


async def serve_ca(ctx: ServerContext, scope: Scope, send: Send) -> None:
    """``GET /ca.pem``: the dev-domain CA certificate (never its key), or 404 saying why not."""
    ports = ctx.rigs.ports
    if scope.get("method") not in ("GET", "HEAD"):
        await _json(send, {"error": {"code": -32600, "message": "GET /ca.pem",
                                     "data": {"field": "method", "reason": "use GET"}}}, 405)
    elif ports is None or ports.ca_pem is None:
        why = (ports.tls_problem if ports is not None else None) or "this server has no dev domains"
        await _refuse(send, NotFound(f"no dev CA: {why}", field="ca", reason=why))
    else:
        assert ports.ca_fingerprint is not None
        await _respond(send, 200, ports.ca_pem.encode(), "application/x-pem-file",
                       [(b"x-rigd-ca-fingerprint", ports.ca_fingerprint.encode())])


def server_app(ctx: ServerContext, mcp: PlainApp | None = None) -> LaneRouter:
    """rigd's whole HTTP app: the lanes and ``/mcp``, then the Quart app (RPC, WebSockets, pages)."""
    from rigd.server.app import create_app

    return LaneRouter(create_app(ctx), ctx, mcp)


# -- HTTP plumbing -------------------------------------------------------------------


def scheme_of(scope: Scope) -> str:
    return "https" if scope.get("scheme") == "https" else "http"


def _headers(scope: Scope) -> Headers:
    return Headers([(k.decode("latin-1"), v.decode("latin-1")) for k, v in scope.get("headers", [])])


def _query(scope: Scope) -> dict[str, str]:
    raw = scope.get("query_string", b"").decode("latin-1")
    try:
        pairs = urllib.parse.parse_qsl(raw, keep_blank_values=True, strict_parsing=False,
                                       max_num_fields=32)
    except ValueError as exc:
        raise FieldError("query", "too many query fields") from exc
    return dict(pairs)


async def _respond(send: Send, status: int, body: bytes, content_type: str,
                   extra: list[tuple[bytes, bytes]] | None = None) -> None:
    headers = [(b"content-type", content_type.encode()), (b"content-length", str(len(body)).encode()),
               (b"cache-control", b"no-store"), *(extra or [])]
    await send({"type": "http.response.start", "status": status, "headers": headers})
    await send({"type": "http.response.body", "body": body})


async def _json(send: Send, payload: Any, status: int = 200) -> None:
    await _respond(send, status, json.dumps(payload).encode(), "application/json")


async def _refuse(send: Send, exc: RigdError) -> None:
    await _json(send, {"error": exc.to_json()}, status_of(exc))


class Body:
    """The request body as the client sends it, one ``receive`` at a time."""

    def __init__(self, receive: Receive) -> None:
        self._receive = receive
        self.done = False
        self.bytes = 0

    async def next(self) -> bytes:
        if self.done:
            return b""
        message = await self._receive()
        if message["type"] == "http.disconnect":
            raise Gone
        chunk = bytes(message.get("body", b""))
        self.bytes += len(chunk)
        if not message.get("more_body", False):
            self.done = True
        return chunk

    async def drain(self, limit: int = 4 * 1024 * 1024) -> None:
        """Read (and drop) a little of what is left, so a refusal can be answered."""
        with trio.move_on_after(2):
            start = self.bytes
            while not self.done and self.bytes - start < limit:
                await self.next()


# -- the lanes -------------------------------------------------------------------------


async def serve_lane(ctx: ServerContext, lane: str, rig_id: str, scope: Scope, receive: Receive,
                     send: Send) -> None:
    try:
        await _serve_lane(ctx, lane, rig_id, scope, receive, _one_writer(send))
    except Gone:
        log.info("a lane client went away", extra={"rig": rig_id, "lane": lane})


def _one_writer(send: Send) -> Send:
    """The response's writer. When a client closes while its answer is being written,
    hypercorn ends the connection from its own task (``send_eof`` outside its send lock), so
    a send of ours can fail with ``BusyResourceError`` (two writers on one stream) or a
    broken/closed stream: all of them mean the client has gone (:class:`Gone`), never an
    error of the server's."""
    async def guarded(message: MutableMapping[str, Any]) -> None:
        try:
            await send(message)
        except (trio.BusyResourceError, trio.BrokenResourceError, trio.ClosedResourceError) as exc:
            raise Gone from exc

    return guarded


async def _serve_lane(ctx: ServerContext, lane: str, rig_id: str, scope: Scope, receive: Receive,
                      send: Send) -> None:
    method = scope.get("method", "GET")
    body = Body(receive)
    try:
        query = _query(scope)
        headers = _headers(scope)
        caller = await lane_caller(ctx, rig_id, headers, query, write=method == "POST",
                                   scheme=scheme_of(scope))
        if lane == "files" and method == "POST":
            await drop_files(ctx, caller, rig_id, headers, query, body, send)
        elif lane == "files" and method == "GET":
            await read_file(ctx, caller, rig_id, query, receive, send)
        elif lane == "clipboard" and method == "GET":
            await read_clipboard(ctx, caller, rig_id, query, send)
        elif lane == "clipboard" and method == "POST":
            await write_clipboard(ctx, caller, rig_id, headers, query, body, send)
        else:
            await _json(send, {"error": {"code": -32600, "message": f"{method} is not a {lane} lane method",
                                         "data": {"field": "method", "reason": "use GET or POST"}}}, 405)
    except RigdError as exc:
        if not body.done and method == "POST" and not isinstance(exc, TooLarge):
            # A client still sending may miss an early answer; give it a moment to finish.
            await body.drain()
        await _refuse(send, exc)


async def lane_caller(ctx: ServerContext, rig_id: str, headers: Headers, query: dict[str, str],
                      *, write: bool, scheme: str) -> Caller:
    token = bearer(headers.get("Authorization"))
    if token is not None:
        caller = await ctx.caller_from_token(token)
    elif "sig" not in query and session_cookie(headers) is not None:
        caller = await caller_for(ctx.stores, headers, scheme, changes_state=write)
    else:
        ws_id = await ctx.stores.run(ctx.stores.server.workspace_of_rig, rig_id) or "-"
        signed = ctx.signer.verify("rig-files", ws_id, rig_id, query)
        caller = Caller(await ctx.stores.run(ctx.stores.server.get_user, signed.user_id))
    if caller.user.kind != "person":
        raise Forbidden("the lanes are for people: an agent moves files through its own shell "
                        "and reads the clipboard with its verbs (RIGS.md §10)",
                        field="Authorization", reason="agent tokens cannot use the lanes")
    return caller


def _lanes_of(machine: Machine, lane: str) -> Lanes:
    lanes: Lanes = machine.lanes()
    reason = lanes.missing(lane)
    if reason is not None:
        raise NotFound(reason, field="rigId", reason=reason, lane=lane)
    return lanes


async def _policy_allows(ctx: ServerContext, caller: Caller, rig_id: str, direction: str) -> None:
    """Refuse a clipboard crossing the person's choice does not allow (403, ``ask`` says
    whether a ``clipboard.grant`` would)."""
    policy = await ctx.stores.run(ctx.stores.server.clipboard_policy, caller.user.id, time.time())
    choice = policy.rig_to_host if direction == "rigToHost" else policy.host_to_rig
    if choice == "allow" or (choice == "ask" and policy.granted(rig_id)):
        return
    if choice == "deny":
        raise Forbidden(f"your clipboard choice for {direction} is deny",
                        field="clipboard", ask=False, direction=direction,
                        reason="change it with clipboard.policy.set")
    what = "copying from the rig to your machine" if direction == "rigToHost" else "pasting into the rig"
    raise Forbidden(f"{what} asks first: allow it with clipboard.grant (ten minutes) or "
                    "clipboard.policy.set", field="clipboard", ask=True, direction=direction,
                    reason="needs your permission")


# -- files in --------------------------------------------------------------------------


def _drop_point(query: dict[str, str], display: tuple[int, int] | None) -> tuple[int, int] | None:
    if "x" not in query and "y" not in query:
        return None
    if display is None:
        raise FieldError("x", "a rig without a screen has no drop point")
    point = []
    for name, limit in (("x", display[0]), ("y", display[1])):
        text = query.get(name, "")
        if not re.fullmatch(r"[0-9]{1,5}", text) or int(text) >= limit:
            raise FieldError(name, f"must be an integer from 0 to {limit - 1} (guest pixels)")
        point.append(int(text))
    return point[0], point[1]


def _boundary(headers: Headers) -> bytes:
    ctype, options = parse_options_header(headers.get("Content-Type", ""))
    boundary = options.get("boundary", "")
    if ctype != "multipart/form-data" or not boundary:
        raise FieldError("Content-Type", "must be multipart/form-data with a boundary, one part per file")
    if len(boundary) > 200:
        raise FieldError("Content-Type", "the boundary is too long")
    return boundary.encode("latin-1")


def _declared_sha256(headers: Headers, field: str) -> str | None:
    """A part's ``Repr-Digest``/``Content-Digest: sha-256=:<base64>:`` (RFC 9530), as hex."""
    raw = headers.get("Repr-Digest") or headers.get("Content-Digest")
    if raw is None:
        return None
    match = re.search(r"sha-256=:([A-Za-z0-9+/=]+):", raw)
    if match is None:
        raise FieldError(field, "a digest must be sha-256=:<base64>: (RFC 9530)")
    try:
        digest = base64.b64decode(match[1], validate=True)
    except binascii.Error as exc:
        raise FieldError(field, "the sha-256 digest is not base64") from exc
    if len(digest) != 32:
        raise FieldError(field, "a sha-256 digest has 32 bytes")
    return digest.hex()


def _content_length(headers: Headers) -> int | None:
    raw = headers.get("Content-Length")
    if raw is None:
        return None
    if not raw.isdigit():
        raise FieldError("Content-Length", "must be a number")
    return int(raw)


async def drop_files(ctx: ServerContext, caller: Caller, rig_id: str, headers: Headers,
                     query: dict[str, str], body: Body, send: Send) -> None:
    boundary = _boundary(headers)
    length = _content_length(headers)
    if length is not None and length > MAX_DROP_BYTES + MAX_DROP_FILES * PART_OVERHEAD:
        raise TooLarge("files", f"a drop is at most {MAX_DROP_BYTES // MIB} MB "
                                f"(this request is {length} bytes)")
    rig = await ctx.rigs.lane_rig(caller, rig_id, "drop files", write=True)
    async with ctx.rigs.activity(rig, caller, "drop files") as machine:
        lanes = _lanes_of(machine, "files")
        point = _drop_point(query, machine.display)
        files: list[dict[str, Any]] = []
        outcome, error, told = "error", None, "none"
        try:
            async with lanes.drop() as drop:
                await _stream_parts(MultipartDecoder(boundary, max_parts=MAX_DROP_FILES + 1),
                                    body, drop.add, files)
                saved = await drop.commit()
            for f, s in zip(files, saved, strict=True):
                f["path"] = s.path
            if lanes.target.told == "clipboard" and lanes.missing("clipboard") is None:
                uris = "".join(f"file://{urllib.parse.quote(s.path)}\r\n" for s in saved)
                await lanes.clipboard_set("clipboard", Clip("text/uri-list", uris.encode()))
                told = "clipboard"
            elif lanes.target.told == "drop-event" and lanes.drop_event is not None:
                await lanes.drop_event([s.path for s in saved], point)
                told = "drop-event"
            outcome = "ok"
        except RigdError as exc:
            error = exc.message[:300]
            raise
        finally:
            shape: dict[str, Any] = {
                "count": len(files), "bytes": sum(f["bytes"] for f in files),
                "files": [{"path": f.get("path"), "bytes": f["bytes"], "type": f["type"]} for f in files],
            }
            if point is not None:
                shape.update(x=point[0], y=point[1])
            if outcome == "ok":
                shape["told"] = told
            await ctx.rigs.audit_event(rig, caller, "drop_files", shape, tool="lanes", outcome=outcome,
                                       error=error)
    await _json(send, {"dir": saved[0].path.rsplit("/", 1)[0],
                       "saved": [s.to_json() for s in saved], "told": told})


async def _stream_parts(decoder: MultipartDecoder, body: Body,
                        add: Callable[[str], Awaitable[Sink]], files: list[dict[str, Any]]) -> None:
    """Feed the multipart body into the drop, part by part, as it arrives."""
    sink: Sink | None = None
    current: dict[str, Any] = {}
    total = 0
    pending = bytearray()
    while True:
        try:
            event = decoder.next_event()
        except RequestEntityTooLarge as exc:
            raise FieldError("files", f"a drop holds at most {MAX_DROP_FILES} files") from exc
        except ValueError as exc:
            raise FieldError("body", f"malformed multipart/form-data: {str(exc)[:100]}") from exc
        if isinstance(event, NeedData):
            if len(decoder.buffer) > MAX_HEADER_BYTES + FEED_BYTES:
                raise FieldError("body", "a part's headers are too long")
            chunk = await body.next()
            if chunk:
                decoder.receive_data(chunk)
            if body.done:
                decoder.receive_data(None)
            continue
        if isinstance(event, Epilogue):
            break
        if isinstance(event, Field):
            raise FieldError(f"files[{len(files)}]", "every part must be a file (with a filename)")
        if isinstance(event, File):
            index = len(files)
            if index >= MAX_DROP_FILES:
                raise FieldError("files", f"a drop holds at most {MAX_DROP_FILES} files")
            name = check_name(event.filename, f"files[{index}].name")
            current = {"name": name, "bytes": 0, "type": (event.headers.get("Content-Type") or
                                                           "application/octet-stream")[:100],
                       "expect": _declared_sha256(event.headers, f"files[{index}].digest")}
            files.append(current)
            sink = await add(name)
            continue
        if isinstance(event, Data):
            assert sink is not None
            current["bytes"] += len(event.data)
            total += len(event.data)
            if current["bytes"] > MAX_FILE_BYTES:
                raise TooLarge(f"files[{len(files) - 1}]",
                               f"{current['name']!r} is over {MAX_FILE_BYTES // MIB} MB")
            if total > MAX_DROP_BYTES:
                raise TooLarge("files", f"a drop is at most {MAX_DROP_BYTES // MIB} MB")
            pending += event.data
            if len(pending) >= FEED_BYTES or not event.more_data:
                await sink.write(bytes(pending))
                pending.clear()
            if not event.more_data:
                _size, digest = await sink.close()
                current["sha256"] = digest
                expect = current.pop("expect")
                if expect is not None and expect != digest:
                    raise FieldError(f"files[{len(files) - 1}].digest",
                                     f"the file's sha-256 is {digest}, not the {expect} its part declared")
                sink = None
    if not files:
        raise FieldError("files", "the drop holds no file")


# -- files out -------------------------------------------------------------------------


def guest_path(query: dict[str, str]) -> str:
    raw = query.get("p")
    if not raw:
        raise FieldError("p", "give the guest path as base64url (p=…)")
    if not re.fullmatch(r"[A-Za-z0-9_-]+={0,2}", raw) or len(raw) > 8192:
        raise FieldError("p", "must be base64url (RFC 4648 §5)")
    try:
        path = base64.urlsafe_b64decode(raw + "=" * (-len(raw) % 4)).decode("utf-8")
    except (binascii.Error, UnicodeDecodeError) as exc:
        raise FieldError("p", "must be base64url of a UTF-8 path") from exc
    if not path.startswith("/"):
        raise FieldError("p", "must be an absolute guest path")
    if "\x00" in path:
        raise FieldError("p", "a path cannot contain NUL")
    return path


def content_disposition(name: str) -> str:
    ascii_name = "".join(c if 0x20 <= ord(c) < 0x7F and c not in '"\\' else "_" for c in name) or "file"
    return f"attachment; filename=\"{ascii_name}\"; filename*=UTF-8''{urllib.parse.quote(name, safe='')}"


async def read_file(ctx: ServerContext, caller: Caller, rig_id: str, query: dict[str, str],
                    receive: Receive, send: Send) -> None:
    """A guest file as the response body, streamed as the guest reads it.

    Two things a plain HTTP client cannot miss: a client that goes away stops the guest's
    reader (its disconnect cancels the stream) and is audited ``aborted`` with the bytes
    delivered; and a file whose bytes do not match the size and digest the guest announced
    (it changed while it was read) never ends as a complete response: the last chunk is
    held back until the digest is checked, so the body comes up short and the connection
    closes.
    """
    path = guest_path(query)
    rig = await ctx.rigs.lane_rig(caller, rig_id, "read a file", write=False)
    async with ctx.rigs.activity(rig, caller, "read a file") as machine:
        lanes = _lanes_of(machine, "files")
        sent = 0
        outcome, error = "error", None
        started = False
        try:
            failed: RigdError | Gone | None = None
            finishing = False
            async with trio.open_nursery() as nursery:
                async def watch() -> None:
                    while (await receive())["type"] != "http.disconnect":
                        pass
                    if not finishing:  # (a client that closes as the last bytes reach it got them all)
                        nonlocal outcome
                        outcome = "aborted"
                        nursery.cancel_scope.cancel()

                nursery.start_soon(watch)
                try:
                    async with lanes.read_file(path, MAX_FILE_BYTES) as src:
                        digest = base64.b64encode(bytes.fromhex(src.sha256)).decode()
                        await send({"type": "http.response.start", "status": 200, "headers": [
                            (b"content-type", b"application/octet-stream"),
                            (b"content-length", str(src.size).encode()),
                            (b"repr-digest", f"sha-256=:{digest}:".encode()),
                            (b"content-disposition", content_disposition(src.name).encode()),
                            (b"cache-control", b"no-store"),
                        ]})
                        started = True
                        held = b""
                        async for chunk in src.chunks():  # raises at the end if the file changed
                            if held:
                                await send({"type": "http.response.body", "body": held, "more_body": True})
                                sent += len(held)
                            held = chunk
                        finishing = True  # the digest is checked: the rest goes out whatever the client does
                        await send({"type": "http.response.body", "body": held})
                        sent += len(held)
                    outcome = "ok"
                except (RigdError, Gone) as exc:  # raised after the nursery (not as a group)
                    failed = exc
                finally:
                    nursery.cancel_scope.cancel()
            if isinstance(failed, Gone):
                outcome = "aborted"
            if failed is not None:
                raise failed
            if outcome == "aborted":  # the client left: its disconnect cancelled the stream
                raise Gone
        except RigdError as exc:
            error = exc.message[:300]
            if started:
                # Headers are gone: the short body (the connection closes) is the client's
                # sign; the log and the audit say why.
                log.warning("a file download broke off", extra={"rig": rig_id, "error": error})
                raise Gone from exc
            raise
        finally:
            await ctx.rigs.audit_event(rig, caller, "read_file", {"path": path, "bytes": sent},
                                       tool="lanes", outcome=outcome, error=error)


# -- the clipboard ---------------------------------------------------------------------


def _selection(query: dict[str, str], *, write: bool) -> str:
    selection = query.get("selection", "clipboard")
    allowed = ("clipboard", "primary") if write else ("clipboard", "primary", "xdnd")
    if selection not in allowed:
        raise FieldError("selection", "must be " + ", ".join(allowed)
                         + (" (a drag belongs to the guest)" if write and selection == "xdnd" else ""))
    return selection


async def read_clipboard(ctx: ServerContext, caller: Caller, rig_id: str, query: dict[str, str],
                         send: Send) -> None:
    selection = _selection(query, write=False)
    rig = await ctx.rigs.lane_rig(caller, rig_id, "read the clipboard", write=False)
    async with ctx.rigs.activity(rig, caller, "read the clipboard") as machine:
        lanes = _lanes_of(machine, "clipboard")
        await _policy_allows(ctx, caller, rig_id, "rigToHost")
        outcome, error = "error", None
        shape: dict[str, Any] = {"selection": selection}
        try:
            clip = await lanes.clipboard_get(selection)
            stale = (selection == "xdnd" and clip is not None
                     and ctx.rigs.xdnd_is_stale(rig, clip.data))
            outcome = "ok"
            shape.update(type=None if clip is None else clip.media_type,
                         bytes=0 if clip is None else len(clip.data), stale=stale)
        except RigdError as exc:
            error = exc.message[:300]
            raise
        finally:
            await ctx.rigs.audit_event(rig, caller, "clipboard_read", shape, tool="lanes",
                                       outcome=outcome, error=error)
    if clip is None or stale:
        why = ("the drag selection is what the guest held when the press began (a finished drag)"
               if stale else f"the {selection} selection is empty")
        await send({"type": "http.response.start", "status": 204,
                    "headers": [(b"x-rigd-reason", why.encode()), (b"cache-control", b"no-store")]})
        await send({"type": "http.response.body", "body": b""})
        return
    await _respond(send, 200, clip.data, CLIP_CONTENT_TYPES[clip.media_type])


def _clip_from(headers: Headers, data: bytes) -> Clip:
    ctype, options = parse_options_header(headers.get("Content-Type", ""))
    if ctype not in POSTABLE:
        raise FieldError("Content-Type", "must be text/plain, image/png or image/jpeg")
    if ctype == "text/plain":
        charset = options.get("charset", "utf-8").lower()
        if charset not in ("utf-8", "utf8", "us-ascii"):
            raise FieldError("Content-Type", "text must be UTF-8")
        try:
            data.decode("utf-8")
        except UnicodeDecodeError as exc:
            raise FieldError("body", "the text is not valid UTF-8") from exc
        if len(data) > MAX_CLIP_TEXT:
            raise TooLarge("body", f"clipboard text is at most {MAX_CLIP_TEXT // MIB} MB")
    elif ctype == "image/png" and not data.startswith(b"\x89PNG\r\n\x1a\n"):
        raise FieldError("body", "is not a PNG image")
    elif ctype == "image/jpeg" and not data.startswith(b"\xff\xd8\xff"):
        raise FieldError("body", "is not a JPEG image")
    if not data:
        raise FieldError("body", "is empty")
    return Clip(ctype, data)


async def write_clipboard(ctx: ServerContext, caller: Caller, rig_id: str, headers: Headers,
                          query: dict[str, str], body: Body, send: Send) -> None:
    selection = _selection(query, write=True)
    length = _content_length(headers)
    if length is not None and length > MAX_CLIP_IMAGE:
        raise TooLarge("body", f"a clipboard is at most {MAX_CLIP_IMAGE // MIB} MB")
    rig = await ctx.rigs.lane_rig(caller, rig_id, "write the clipboard", write=True)
    async with ctx.rigs.activity(rig, caller, "write the clipboard") as machine:
        lanes = _lanes_of(machine, "clipboard")
        await _policy_allows(ctx, caller, rig_id, "hostToRig")
        data = bytearray()
        while not body.done:
            data += await body.next()
            if len(data) > MAX_CLIP_IMAGE:
                raise TooLarge("body", f"a clipboard is at most {MAX_CLIP_IMAGE // MIB} MB")
        clip = _clip_from(headers, bytes(data))
        # Text is both selections (a middle click pastes it too); an image only CLIPBOARD.
        both = clip.media_type == "text/plain" and selection == "clipboard"
        selections = ["clipboard", "primary"] if both else [selection]
        outcome, error = "error", None
        try:
            for which in selections:
                await lanes.clipboard_set(which, clip)
            outcome = "ok"
        except RigdError as exc:
            error = exc.message[:300]
            raise
        finally:
            await ctx.rigs.audit_event(rig, caller, "clipboard_write",
                                       {"selections": selections, "type": clip.media_type,
                                        "bytes": len(clip.data)}, tool="lanes", outcome=outcome, error=error)
    await _json(send, {"type": clip.media_type, "bytes": len(clip.data), "selections": selections})


__all__ = ["LaneRouter", "content_disposition", "guest_path", "serve_lane", "server_app", "status_of"]
