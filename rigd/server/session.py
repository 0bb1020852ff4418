"""People's sessions: sign in once with a token, then a cookie (API.md "Pages").

- ``POST /session`` with ``{"token": "…"}`` (or ``Authorization: Bearer``):
  a person's token (the admin's or their own) gets a session cookie
  ``rigd_session`` — ``HttpOnly``, ``SameSite=Strict``, ``Path=/`` — good for
  twelve hours; an agent token cannot sign in (403). Only the secret's sha256
  is stored (``server.db`` ``sessions``).
- ``POST /session/end`` ends it (the row is deleted, the cookie cleared).
- A request authenticated by the cookie that changes state — every
  ``POST /rpc``, the RPC WebSocket, a lane POST, a PTY or live-view
  WebSocket — must come from the server's own origin: its ``Origin`` header
  (browsers send one on every POST and WebSocket) must equal
  ``http(s)://<Host>``. Anything else is refused (CSRF), naming ``Origin``.
  Bearer tokens and signed URLs are not cookies and are not origin-checked.
"""

from __future__ import annotations

import time
from http.cookies import CookieError, SimpleCookie
from typing import Any

from rigd.auth import bearer
from rigd.errors import Forbidden, Unauthorized
from rigd.rigs.live import Caller
from rigd.store.aio import Stores

COOKIE = "rigd_session"
SESSION_S = 12 * 3600


#: werkzeug's ``Headers`` (Quart requests, WebSockets and the lanes): only ``.get`` is used;
#: its overloads fit no small Protocol.
HeaderMap = Any


def session_cookie(headers: HeaderMap) -> str | None:
    raw = headers.get("Cookie")
    if not raw:
        return None
    jar: SimpleCookie = SimpleCookie()
    try:
        jar.load(raw)
    except CookieError:
        return None
    morsel = jar.get(COOKIE)
    return morsel.value if morsel is not None and morsel.value else None


def set_cookie(secret: str) -> str:
    return f"{COOKIE}={secret}; Path=/; HttpOnly; SameSite=Strict; Max-Age={SESSION_S}"


def clear_cookie() -> str:
    return f"{COOKIE}=; Path=/; HttpOnly; SameSite=Strict; Max-Age=0"


def same_origin(headers: HeaderMap, scheme: str) -> bool:
    origin, host = headers.get("Origin"), headers.get("Host")
    return bool(origin and host) and origin in (f"{scheme}://{host}",)


def check_origin(headers: HeaderMap, scheme: str) -> None:
    if not same_origin(headers, scheme):
        raise Forbidden("a request signed in by the page's cookie must come from this server's own "
                        "page (cross-origin request refused)", field="Origin",
                        reason=f"must be {scheme}://{headers.get('Host') or '<host>'}")


async def caller_for(stores: Stores, headers: HeaderMap, scheme: str, *, changes_state: bool,
                     allow_cookie: bool = True) -> Caller:
    """Who sends a request: a bearer token, else the page's session cookie."""
    token = bearer(headers.get("Authorization"))
    if token is not None:
        user = await stores.run(stores.server.user_for_token, token)
        if user is None:
            raise Unauthorized("unknown or revoked token")
        return Caller(user)
    secret = session_cookie(headers) if allow_cookie else None
    if secret is None:
        raise Unauthorized("missing bearer token (Authorization: Bearer <token>) or session")
    user = await stores.run(stores.server.user_for_session, secret, time.time())
    if user is None:
        raise Unauthorized("the session has ended or expired; sign in again")
    if changes_state:
        check_origin(headers, scheme)
    return Caller(user)


__all__ = ["COOKIE", "SESSION_S", "caller_for", "check_origin", "clear_cookie", "same_origin",
           "session_cookie", "set_cookie"]
