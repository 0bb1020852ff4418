"""JSON-RPC 2.0 dispatch, independent of the transport (HTTP POST or WebSocket).

Every failure becomes a JSON-RPC error object; nothing a caller sends can turn
into a 500. Errors from rigd carry ``data`` naming the field and the rule.
"""

from __future__ import annotations

import json
import logging
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import Any

from rigd.errors import Forbidden, RigdError
from rigd.rigs.manager import Caller

log = logging.getLogger("rigd.rpc")

PARSE_ERROR = -32700
INVALID_REQUEST = -32600
METHOD_NOT_FOUND = -32601
INTERNAL_ERROR = -32603
MAX_BATCH = 32

Handler = Callable[[Caller, Any], Awaitable[Any]]


@dataclass(frozen=True, slots=True)
class Method:
    handler: Handler
    admin: bool = False


def error(rid: Any, code: int, message: str, data: dict[str, Any] | None = None) -> dict[str, Any]:
    err: dict[str, Any] = {"code": code, "message": message}
    if data:
        err["data"] = data
    return {"jsonrpc": "2.0", "id": rid, "error": err}


def _rid(msg: Any) -> Any:
    rid = msg.get("id")
    return rid if rid is None or (isinstance(rid, str | int) and not isinstance(rid, bool)) else None


def refusal(body: bytes | str, exc: RigdError) -> Any:
    """The answer to a message that is refused as a whole (nothing in it runs):
    ``exc`` for every request in it, under that request's id; ``None`` when it
    holds only notifications, which get no reply."""
    err = exc.to_json()
    try:
        msg = json.loads(body)
    except (ValueError, UnicodeDecodeError, RecursionError):
        return {"jsonrpc": "2.0", "id": None, "error": err}
    if isinstance(msg, list) and 0 < len(msg) <= MAX_BATCH:
        replies = [{"jsonrpc": "2.0", "id": _rid(m) if isinstance(m, dict) else None, "error": err}
                   for m in msg if not isinstance(m, dict) or "id" in m]
        return replies or None
    if isinstance(msg, dict):
        return {"jsonrpc": "2.0", "id": _rid(msg), "error": err} if "id" in msg else None
    return {"jsonrpc": "2.0", "id": None, "error": err}


class Dispatcher:
    def __init__(self, methods: dict[str, Method]) -> None:
        self.methods = methods

    async def handle_bytes(self, caller: Caller, body: bytes | str) -> Any:
        """Answer one HTTP body or WebSocket message; ``None`` means no reply."""
        try:
            msg = json.loads(body)
        except (ValueError, UnicodeDecodeError):
            return error(None, PARSE_ERROR, "parse error: the body is not JSON")
        except RecursionError:
            return error(None, PARSE_ERROR, "parse error: the JSON is nested too deeply")
        if isinstance(msg, list):
            if not msg:
                return error(None, INVALID_REQUEST, "invalid request: empty batch")
            if len(msg) > MAX_BATCH:
                return error(None, INVALID_REQUEST, f"invalid request: batch over {MAX_BATCH}")
            replies = [await self.handle(caller, item) for item in msg]
            answered = [r for r in replies if r is not None]
            return answered or None
        return await self.handle(caller, msg)

    async def handle(self, caller: Caller, msg: Any) -> dict[str, Any] | None:
        if not isinstance(msg, dict):
            return error(None, INVALID_REQUEST, "invalid request: must be an object")
        rid = msg.get("id")
        if not (rid is None or (isinstance(rid, str | int) and not isinstance(rid, bool))):
            return error(None, INVALID_REQUEST, "invalid request: id must be a string, number or null")
        if msg.get("jsonrpc") != "2.0":
            return error(rid, INVALID_REQUEST, 'invalid request: "jsonrpc" must be "2.0"',
                         {"field": "jsonrpc", "reason": 'must be "2.0"'})
        name = msg.get("method")
        if not isinstance(name, str):
            return error(rid, INVALID_REQUEST, "invalid request: method must be a string",
                         {"field": "method", "reason": "must be a string"})
        notification = "id" not in msg
        method = self.methods.get(name)
        if method is None:
            known = ", ".join(sorted(self.methods))
            return None if notification else error(
                rid, METHOD_NOT_FOUND, f"method not found: {name[:80]}",
                {"field": "method", "reason": f"unknown method; one of {known}"},
            )
        params = msg.get("params")
        if params is not None and not isinstance(params, dict):
            return None if notification else error(
                rid, -32602, "params must be an object", {"field": "params", "reason": "must be an object"}
            )
        try:
            if method.admin and not caller.user.is_admin:
                raise Forbidden(f"{name} is for admins only")
            result = await method.handler(caller, params)
        except RigdError as exc:
            return None if notification else {"jsonrpc": "2.0", "id": rid, "error": exc.to_json()}
        except Exception:
            log.exception("internal error in %s", name)
            return None if notification else error(rid, INTERNAL_ERROR, "internal error")
        return None if notification else {"jsonrpc": "2.0", "id": rid, "result": result}
