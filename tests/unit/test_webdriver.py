"""The WebDriver classic client over an in-memory stream (a fake driver speaking h11), and the
WebKit driver's pure parts. No sockets: trio's memory streams stand for the rig's port."""

from __future__ import annotations

import json
from collections.abc import Awaitable, Callable
from typing import Any

import h11
import pytest
import trio
import trio.testing

from rigd.backends.browser_scripts import webkit_launch_script
from rigd.browser.webdriver import WebDriverCommandFailed, WebDriverConnection
from rigd.browser.webkit import (
    _call,
    _ScriptError,
    cookie_to_saved,
    cookie_to_webdriver,
    one_code_point_keys,
    parse_answer,
)
from rigd.protocols.bidi import error_code
from rigd.protocols.cdp import CDPClosed, CDPProtocolError, CDPTimeout

#: (status, body, extra headers) for one request, after an optional wait.
Answer = tuple[int, bytes, list[tuple[str, str]]]
Handler = Callable[[str, str, bytes, list[tuple[bytes, bytes]]], Awaitable[Answer | None]]


def ok(value: Any) -> Answer:
    return 200, json.dumps({"value": value}).encode(), []


async def serve(stream: trio.abc.Stream, handle: Handler) -> None:
    """A fake WebDriver server: one keep-alive connection, requests answered in order
    (``handle`` returning None closes the stream without an answer)."""
    conn = h11.Connection(h11.SERVER)
    while True:
        request: h11.Request | None = None
        body = b""
        while True:
            event = conn.next_event()
            if event is h11.NEED_DATA:
                data = await stream.receive_some(65536)
                conn.receive_data(data)
                if not data:
                    return
                continue
            if isinstance(event, h11.Request):
                request = event
            elif isinstance(event, h11.Data):
                body += event.data
            elif isinstance(event, h11.EndOfMessage):
                break
            elif isinstance(event, h11.ConnectionClosed):
                return
        assert request is not None
        answer = await handle(request.method.decode(), request.target.decode(), body, list(request.headers))
        if answer is None:
            await stream.aclose()
            return
        status, payload, extra = answer
        headers = [("Content-Type", "application/json"), ("Content-Length", str(len(payload))), *extra]
        out = conn.send(h11.Response(status_code=status, headers=headers))
        out = (out or b"") + (conn.send(h11.Data(data=payload)) or b"") + (conn.send(h11.EndOfMessage()) or b"")
        await stream.send_all(out)
        if conn.our_state is h11.MUST_CLOSE:
            await stream.aclose()
            return
        conn.start_next_cycle()


async def with_server(handle: Handler, body: Callable[[WebDriverConnection], Awaitable[None]],
                      **kw: Any) -> None:
    client, server = trio.testing.memory_stream_pair()
    conn = WebDriverConnection(client, host="127.0.0.1:9222", **kw)
    with trio.fail_after(10):
        async with trio.open_nursery() as nursery:
            nursery.start_soon(serve, server, handle)
            await body(conn)
            nursery.cancel_scope.cancel()


async def test_a_command_sends_json_with_the_guest_side_host_and_reads_the_value() -> None:
    seen: list[tuple[str, str, Any, dict[bytes, bytes]]] = []

    async def handle(method: str, target: str, body: bytes, headers: list[tuple[bytes, bytes]]) -> Answer:
        seen.append((method, target, json.loads(body) if body else None, dict(headers)))
        return ok({"echo": target})

    async def body(conn: WebDriverConnection) -> None:
        assert await conn.command("POST", "/session/s1/url", {"url": "https://a.test/"}) == {
            "echo": "/session/s1/url"}
        assert await conn.command("GET", "/session/s1/url") == {"echo": "/session/s1/url"}
        assert conn.commands == 2 and conn.closed is None

    await with_server(handle, body)
    (m1, t1, b1, h1), (m2, _t2, b2, h2) = seen
    assert (m1, t1, b1) == ("POST", "/session/s1/url", {"url": "https://a.test/"})
    assert h1[b"host"] == b"127.0.0.1:9222" and h1[b"content-type"].startswith(b"application/json")
    assert (m2, b2) == ("GET", None) and b"content-length" not in h2


async def test_an_error_answer_names_the_w3c_code_and_keeps_the_connection() -> None:
    async def handle(method: str, target: str, body: bytes, headers: list[tuple[bytes, bytes]]) -> Answer:
        if target.endswith("/alert"):
            return 500, json.dumps({"value": {"error": "unexpected alert open", "message": "",
                                              "data": {"text": "hey"}}}).encode(), []
        if target.endswith("/element"):
            return 404, json.dumps({"value": {"error": "no such element", "message": "none"}}).encode(), []
        return ok(None)

    async def body(conn: WebDriverConnection) -> None:
        with pytest.raises(WebDriverCommandFailed) as info:
            await conn.command("POST", "/session/s/element", {})
        assert info.value.error == "no such element" and info.value.cdp_code == 404
        assert error_code(info.value.cdp_message) == "no such element"
        with pytest.raises(WebDriverCommandFailed) as info:
            await conn.command("GET", "/session/s/alert")
        assert info.value.error == "unexpected alert open" and info.value.data == {"text": "hey"}
        assert await conn.command("GET", "/status") is None and conn.closed is None

    await with_server(handle, body)


@pytest.mark.parametrize("payload", [b"not json", b'{"nope": 1}', b'[1, 2]'])
async def test_a_malformed_answer_is_a_protocol_error_not_a_crash(payload: bytes) -> None:
    async def handle(method: str, target: str, body: bytes, headers: list[tuple[bytes, bytes]]) -> Answer:
        return (200, payload, []) if target == "/bad" else ok("fine")

    async def body(conn: WebDriverConnection) -> None:
        with pytest.raises(CDPProtocolError):
            await conn.command("GET", "/bad")
        assert await conn.command("GET", "/good") == "fine"

    await with_server(handle, body)


async def test_an_error_answer_without_an_error_code_is_a_protocol_error() -> None:
    async def handle(method: str, target: str, body: bytes, headers: list[tuple[bytes, bytes]]) -> Answer:
        return 500, json.dumps({"value": {"message": "no code"}}).encode(), []

    async def body(conn: WebDriverConnection) -> None:
        with pytest.raises(CDPProtocolError, match="names no error"):
            await conn.command("GET", "/x")

    await with_server(handle, body)


async def test_a_late_answer_is_read_and_dropped_before_the_next_command() -> None:
    release = trio.Event()

    async def handle(method: str, target: str, body: bytes, headers: list[tuple[bytes, bytes]]) -> Answer:
        if target == "/slow":
            await release.wait()
            return ok("slow answer")
        return ok("fast answer")

    async def body(conn: WebDriverConnection) -> None:
        with pytest.raises(CDPTimeout):
            await conn.command("GET", "/slow", timeout=0.2)
        release.set()
        # The stream is still in step: this command gets its own answer, not the late one.
        assert await conn.command("GET", "/fast") == "fast answer"
        assert conn.closed is None

    await with_server(handle, body)


async def test_an_answer_over_the_cap_ends_the_connection() -> None:
    async def handle(method: str, target: str, body: bytes, headers: list[tuple[bytes, bytes]]) -> Answer:
        return ok("x" * 5000)

    async def body(conn: WebDriverConnection) -> None:
        with pytest.raises(CDPClosed, match="cap"):
            await conn.command("GET", "/big")
        assert "cap" in await conn.wait_ended()
        with pytest.raises(CDPClosed):  # at once, without a request
            await conn.command("GET", "/status")

    await with_server(handle, body, max_body=1000)


async def test_connection_close_and_a_peer_that_hangs_up_end_it_saying_why() -> None:
    async def close_after(method: str, target: str, body: bytes,
                          headers: list[tuple[bytes, bytes]]) -> Answer | None:
        if target == "/hangup":
            return None
        return 200, b'{"value": 1}', [("Connection", "close")]

    async def body(conn: WebDriverConnection) -> None:
        assert await conn.command("GET", "/once") == 1  # the answer itself is read
        assert "Connection: close" in (conn.closed or "")
        with pytest.raises(CDPClosed):
            await conn.command("GET", "/again")

    await with_server(close_after, body)

    async def body2(conn: WebDriverConnection) -> None:
        with pytest.raises(CDPClosed):
            await conn.command("GET", "/hangup")
        assert "closed" in await conn.wait_ended()

    await with_server(close_after, body2)


async def test_bad_http_from_the_engine_ends_the_connection() -> None:
    client, server = trio.testing.memory_stream_pair()
    conn = WebDriverConnection(client, host="h")

    async def garbage() -> None:
        await server.receive_some(65536)
        await server.send_all(b"SPDY/9 what\r\n\r\n")

    with trio.fail_after(10):
        async with trio.open_nursery() as nursery:
            nursery.start_soon(garbage)
            with pytest.raises(CDPClosed, match="broke HTTP"):
                await conn.command("GET", "/status")


# -- the WebKit driver's pure parts --

def test_a_cluster_of_code_points_is_pressed_one_code_point_at_a_time() -> None:
    acts = [{"type": "keyDown", "value": "e\u0301"}, {"type": "keyUp", "value": "e\u0301"},
            {"type": "keyDown", "value": "a"}, {"type": "keyUp", "value": "a"}]
    assert one_code_point_keys(acts) == [
        {"type": "keyDown", "value": "e"}, {"type": "keyUp", "value": "e"},
        {"type": "keyDown", "value": "\u0301"}, {"type": "keyUp", "value": "\u0301"},
        {"type": "keyDown", "value": "a"}, {"type": "keyUp", "value": "a"}]
    family = "👩\u200d👧"
    pressed = "".join(a["value"] for a in one_code_point_keys(
        [{"type": "keyDown", "value": family}, {"type": "keyUp", "value": family}]) if a["type"] == "keyDown")
    assert pressed == family
    pause = [{"type": "pause", "duration": 5}]
    assert one_code_point_keys(pause) == pause


def test_a_function_answer_is_parsed_json_and_a_throw_is_an_error() -> None:
    assert parse_answer('{"found": true}') == {"found": True}
    assert parse_answer("null") is None
    with pytest.raises(_ScriptError, match="boom"):
        parse_answer('{"__rigdThrew": "boom"}')
    for raw in (None, 42, "not json", "[" * 100_000):
        with pytest.raises(CDPProtocolError):
            parse_answer(raw)
    body = _call("(a, b) => a + b")
    assert "arguments.length - 1" in body and "(a, b) => a + b" in body and "JSON.stringify" in body


def test_cookies_round_trip_the_saved_shape_and_bad_ones_are_dropped() -> None:
    raw = {"name": "sid", "value": "v", "domain": "a.test", "path": "/", "httpOnly": True, "secure": False,
           "sameSite": "None", "expiry": 2_000_000_000}
    saved = cookie_to_saved(raw)
    assert saved == {"name": "sid", "value": "v", "domain": "a.test", "path": "/", "httpOnly": True,
                     "secure": False, "expires": 2e9}  # None without secure is not kept
    assert cookie_to_webdriver(saved) == {"name": "sid", "value": "v", "domain": "a.test", "path": "/",
                                          "httpOnly": True, "secure": False, "expiry": 2_000_000_000}
    strict = cookie_to_saved({**raw, "sameSite": "Strict", "expiry": True})
    assert strict is not None and strict["sameSite"] == "Strict" and "expires" not in strict
    for bad in ("x", {"name": 1, "value": "v", "domain": "d"}, {"name": "n", "value": None, "domain": "d"}):
        assert cookie_to_saved(bad) is None


def test_the_webkit_launch_runs_unprivileged_on_its_own_display_and_guest_loopback() -> None:
    script = webkit_launch_script(port=9223)
    assert "--reuid=browser" in script and "--inh-caps=-all" in script
    assert "/usr/bin/Xvfb :99" in script and "-nolisten tcp" in script
    assert "DISPLAY=:99 /usr/bin/WebKitWebDriver --host=127.0.0.1 --port=9223" in script
    assert "echo $! >/run/rigd-browser.pid" in script
    assert '"$p/.config/gtk-3.0/gtk.css"' in script  # MiniBrowser's chrome shrunk: 320 px viewports
    assert "sleep 0.05" in script and "-lt 600" in script  # a bounded wait for the display's socket
