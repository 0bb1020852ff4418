"""JSON-RPC dispatch: every malformed request is an answer, never an exception."""

from __future__ import annotations

import json
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from rigd.errors import FieldError
from rigd.rigs.manager import Caller
from rigd.server.rpc import Dispatcher, Method
from rigd.store.server_db import User

ADMIN = Caller(User("usr_a", "admin", "person", True))
AGENT = Caller(User("usr_b", "bot", "agent", False))


async def echo(caller: Caller, params: Any) -> Any:
    if params and params.get("bad"):
        raise FieldError("bad", "must not be set")
    if params and params.get("boom"):
        raise RuntimeError("internal detail that must not leak")
    return {"params": params, "user": caller.user.id}


D = Dispatcher({"echo": Method(echo), "admin.only": Method(echo, admin=True)})


async def test_result_and_field_error() -> None:
    ok = await D.handle_bytes(ADMIN, json.dumps({"jsonrpc": "2.0", "id": 1, "method": "echo", "params": {"x": 1}}))
    assert ok == {"jsonrpc": "2.0", "id": 1, "result": {"params": {"x": 1}, "user": "usr_a"}}
    bad = await D.handle_bytes(ADMIN, json.dumps({"jsonrpc": "2.0", "id": 2, "method": "echo", "params": {"bad": 1}}))
    assert bad["error"]["data"] == {"field": "bad", "reason": "must not be set"}
    assert bad["error"]["code"] == -32602


async def test_internal_errors_do_not_leak() -> None:
    reply = await D.handle_bytes(ADMIN, json.dumps({"jsonrpc": "2.0", "id": 3, "method": "echo", "params": {"boom": 1}}))
    assert reply["error"] == {"code": -32603, "message": "internal error"}


async def test_admin_only() -> None:
    reply = await D.handle_bytes(AGENT, json.dumps({"jsonrpc": "2.0", "id": 4, "method": "admin.only"}))
    assert reply["error"]["code"] == -32003


@pytest.mark.parametrize(
    ("body", "code"),
    [
        (b"{not json", -32700),
        (b"[" * 100_000 + b"]" * 100_000, -32700),
        (b"\xff\xfe", -32700),
        (b"[]", -32600),
        (b"42", -32600),
        (json.dumps({"jsonrpc": "1.0", "id": 1, "method": "echo"}).encode(), -32600),
        (json.dumps({"jsonrpc": "2.0", "id": 1, "method": 7}).encode(), -32600),
        (json.dumps({"jsonrpc": "2.0", "id": 1, "method": "nope"}).encode(), -32601),
        (json.dumps({"jsonrpc": "2.0", "id": 1, "method": "echo", "params": [1]}).encode(), -32602),
        (json.dumps({"jsonrpc": "2.0", "id": [1], "method": "echo"}).encode(), -32600),
    ],
)
async def test_malformed_requests(body: bytes, code: int) -> None:
    reply = await D.handle_bytes(ADMIN, body)
    assert reply["error"]["code"] == code


async def test_notifications_and_batches() -> None:
    assert await D.handle_bytes(ADMIN, json.dumps({"jsonrpc": "2.0", "method": "echo"})) is None
    replies = await D.handle_bytes(ADMIN, json.dumps([
        {"jsonrpc": "2.0", "id": 1, "method": "echo"},
        {"jsonrpc": "2.0", "method": "echo"},
        {"jsonrpc": "2.0", "id": 2, "method": "nope"},
    ]))
    assert [r["id"] for r in replies] == [1, 2]


json_values = st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats() | st.text(),
    lambda children: st.lists(children, max_size=4) | st.dictionaries(st.text(max_size=8), children, max_size=4),
    max_leaves=20,
)


@settings(max_examples=200, deadline=None)
@given(json_values)
def test_no_json_value_raises(value: Any) -> None:
    import trio

    reply = trio.run(D.handle_bytes, ADMIN, json.dumps(value))
    assert reply is None or isinstance(reply, dict | list)
