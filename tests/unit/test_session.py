"""People's sessions (rigd.server.session): sign in with a token, a cookie after that,
cross-origin state changes refused. Quart's test client and direct ASGI calls: no sockets."""

from __future__ import annotations

import json

import pytest

from rigd.server.app import ServerContext, create_app
from rigd.server.rpc import Dispatcher
from tests.unit.test_lanes import MP, World, multipart

pytestmark = pytest.mark.trio
ORIGIN = "http://rigd.test"


def app_of(world: World):  # type: ignore[no-untyped-def]
    return create_app(ServerContext(world.stores, world.rigs, Dispatcher(world.methods), world.signer))


async def sign_in(client, token: str, origin: str | None = ORIGIN):  # type: ignore[no-untyped-def]
    headers = {"Host": "rigd.test"} | ({"Origin": origin} if origin else {})
    return await client.post("/session", json={"token": token}, headers=headers)


def cookie_of(response) -> str:  # type: ignore[no-untyped-def]
    raw = response.headers["Set-Cookie"]
    assert "HttpOnly" in raw and "SameSite=Strict" in raw and "Path=/" in raw
    return str(raw.split(";", 1)[0])


async def test_a_person_signs_in_and_the_cookie_calls_the_rpc(world: World) -> None:
    client = app_of(world).test_client()
    res = await sign_in(client, world.token)
    assert res.status_code == 200
    assert (await res.get_json())["user"]["name"] == "admin"
    cookie = cookie_of(res)
    rpc = {"jsonrpc": "2.0", "id": 1, "method": "whoami", "params": {}}
    same = {"Cookie": cookie, "Origin": ORIGIN, "Host": "rigd.test"}
    res = await client.post("/rpc", json=rpc, headers=same)
    assert (await res.get_json())["result"]["name"] == "admin"
    # From another origin, or with no Origin at all, the cookie changes nothing (CSRF).
    for other in ({"Cookie": cookie, "Origin": "http://evil.test", "Host": "rigd.test"},
                  {"Cookie": cookie, "Host": "rigd.test"}):
        res = await client.post("/rpc", json=rpc, headers=other)
        assert res.status_code == 403
        assert (await res.get_json())["error"]["data"]["field"] == "Origin"
    # Sign-out ends the session for good.
    res = await client.post("/session/end", headers=same)
    assert (await res.get_json()) == {"ended": True} and "Max-Age=0" in res.headers["Set-Cookie"]
    res = await client.post("/rpc", json=rpc, headers=same)
    assert res.status_code == 401 and "sign in again" in (await res.get_json())["error"]["message"]


async def test_agents_cannot_sign_in_and_bad_sign_ins_say_why(world: World) -> None:
    client = app_of(world).test_client()
    res = await sign_in(client, world.bot_token)
    assert res.status_code == 403 and (await res.get_json())["error"]["data"]["field"] == "token"
    assert "Set-Cookie" not in res.headers
    assert (await sign_in(client, "rigd_nope")).status_code == 401
    res = await sign_in(client, world.token, origin="http://evil.test")
    assert res.status_code == 403 and "Set-Cookie" not in res.headers
    res = await client.post("/session", data=b"{", headers={"Host": "rigd.test"})
    assert res.status_code == 400
    res = await client.post("/session", json={}, headers={"Host": "rigd.test"})
    assert res.status_code == 400 and (await res.get_json())["error"]["data"]["field"] == "token"


async def test_the_lanes_take_the_cookie_and_check_the_origin_of_writes(world: World) -> None:
    client = app_of(world).test_client()
    cookie = cookie_of(await sign_in(client, world.bob_token))
    rig_id, lanes = await world.open("terminal")
    lanes.files["/root/x.txt"] = b"x"
    base = {"Cookie": cookie, "Host": "rigd.test"}
    status, _h, out = await world.http("GET", f"/rig/files/{rig_id}", query="p=L3Jvb3QveC50eHQ",
                                       token=None, headers=base)
    assert status == 200 and out == b"x"
    body = [multipart([("a.txt", b"a")])]
    status, _h, out = await world.http("POST", f"/rig/files/{rig_id}", token=None, body=body,
                                       headers={**base, **MP, "Origin": "http://evil.test"})
    assert status == 403 and json.loads(out)["error"]["data"]["field"] == "Origin"
    assert "/root/drops/a.txt" not in lanes.files
    status, _h, out = await world.http("POST", f"/rig/files/{rig_id}", token=None, body=body,
                                       headers={**base, **MP, "Origin": ORIGIN})
    assert status == 200, out
    assert lanes.files["/root/drops/a.txt"] == b"a"
