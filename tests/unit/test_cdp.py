"""The CDP core and the Trio client over a fake transport: parsing, routing, limits, failure."""

from __future__ import annotations

import json
from collections.abc import AsyncIterator
from typing import Any

import pytest
import trio
from hypothesis import given
from hypothesis import strategies as st

from rigd.browser.cdp import CDPConnection, CDPSession
from rigd.browser.fake import FakeTransport
from rigd.protocols.cdp import (
    CDPClosed,
    CDPCommandFailed,
    CDPProtocol,
    CDPProtocolError,
    CDPTimeout,
    ErrorReply,
    Event,
    Fields,
    ProtocolViolation,
    Reply,
    parse_active_port,
    read,
)

SID = "A1B2C3D4E5F60718293A4B5C6D7E8F90"


# -- the sans-I/O core ---------------------------------------------------------------------------

def test_command_and_reply_shapes() -> None:
    p = CDPProtocol()
    cid, text = p.command("Page.navigate", {"url": "https://example.test/"}, SID)
    assert json.loads(text) == {"id": cid, "method": "Page.navigate",
                                "params": {"url": "https://example.test/"}, "sessionId": SID}
    assert p.parse(json.dumps({"id": cid, "result": {"frameId": "F"}, "sessionId": SID})) == \
        Reply(cid, SID, {"frameId": "F"})
    assert p.parse('{"id": 7, "error": {"code": -32000, "message": "No node"}}') == \
        ErrorReply(7, None, -32000, "No node")
    assert p.parse('{"method": "Page.loadEventFired", "params": {"timestamp": 1.5}}') == \
        Event("Page.loadEventFired", None, {"timestamp": 1.5})


def test_ids_increase_and_wrap() -> None:
    p = CDPProtocol()
    first, _ = p.command("Browser.getVersion")
    second, _ = p.command("Browser.getVersion")
    assert second == first + 1
    p._next_id = 2**31 - 1
    assert p.command("Browser.getVersion")[0] == 2**31 - 1
    assert p.command("Browser.getVersion")[0] == 1


def test_method_name_checked_on_the_way_out() -> None:
    with pytest.raises(ValueError, match="not a CDP method"):
        CDPProtocol().command("Page.navigate; drop")


@pytest.mark.parametrize(("text", "reason"), [
    ("[1, 2]", "not a JSON object"),
    ("{nope", "not JSON"),
    ('{"id": 0, "result": {}}', "id is not"),
    ('{"id": true, "result": {}}', "id is not"),
    ('{"id": 4294967296, "result": {}}', "id is not"),
    ('{"id": 3, "result": []}', "result of id=3"),
    ('{"id": 3}', "result of id=3"),
    ('{"id": 3, "error": "bad"}', "error of id=3"),
    ('{"method": "Page.x", "params": [1]}', "params of Page.x"),
    ('{"method": "not a method", "params": {}}', "neither"),
    ('{"id": 3, "result": {}, "sessionId": "' + "a" * 200 + '"}', "sessionId"),
    ('{"id": 3, "result": {}, "sessionId": 5}', "sessionId"),
])
def test_malformed_messages_are_violations(text: str, reason: str) -> None:
    msg = CDPProtocol().parse(text)
    assert isinstance(msg, ProtocolViolation)
    assert reason in msg.reason


def test_message_size_is_capped_before_parsing() -> None:
    msg = CDPProtocol(max_message_chars=100).parse('{"id": 1, "result": {"x": "' + "y" * 200 + '"}}')
    assert isinstance(msg, ProtocolViolation)
    assert "over the 100 cap" in msg.reason


def test_error_fields_are_bounded() -> None:
    msg = CDPProtocol().parse(json.dumps({"id": 2, "error": {"code": "x", "message": "m" * 5000}}))
    assert isinstance(msg, ErrorReply)
    assert msg.code == 0 and len(msg.message) == 1000


@given(st.one_of(st.text(max_size=300), st.binary(max_size=300)))
def test_parse_never_raises(data: str | bytes) -> None:
    CDPProtocol(max_message_chars=200).parse(data)


@given(st.recursive(st.none() | st.booleans() | st.integers() | st.floats() | st.text(max_size=8),
                    lambda kids: st.lists(kids, max_size=4) | st.dictionaries(st.text(max_size=8), kids,
                                                                               max_size=4),
                    max_leaves=20))
def test_parse_of_any_json_never_raises(value: Any) -> None:
    for wrapped in (value, {"id": 1, "result": value}, {"id": 1, "error": value},
                    {"method": "A.b", "params": value, "sessionId": value}):
        CDPProtocol().parse(json.dumps(wrapped))


def test_fields_name_the_method_and_field() -> None:
    result = {"model": {"content": [0, 0, 10, 0, 10, "x", 0, 10]}, "n": 3.5, "big": 2**60}
    with pytest.raises(CDPProtocolError, match=r"DOM\.getBoxModel\.model: content is not 8 finite"):
        read(result, "DOM.getBoxModel", lambda f: f.obj("model").numbers("content", 8))
    with pytest.raises(CDPProtocolError, match="n is not an integer"):
        read(result, "X.y", lambda f: f.integer("n"))
    with pytest.raises(CDPProtocolError, match=r"big is not an integer in 0..100"):
        read(result, "X.y", lambda f: f.integer("big", 0, 100))
    with pytest.raises(CDPProtocolError, match="missing is not a string"):
        read(result, "X.y", lambda f: f.string("missing"))
    assert read(result, "X.y", lambda f: f.number("n")) == 3.5
    with pytest.raises(CDPProtocolError, match="not a finite"):
        Fields({"n": float("inf")}, "X.y").number("n")


def test_active_port_file() -> None:
    ap = parse_active_port("41231\n/devtools/browser/0f5e2a1c-1111-2222-3333-444455556666\n")
    assert ap.ws_url() == "ws://127.0.0.1:41231/devtools/browser/0f5e2a1c-1111-2222-3333-444455556666"
    for bad in ("", "x\n/devtools/browser/a", "70000\n/devtools/browser/a", "9222\n/etc/passwd"):
        with pytest.raises(CDPProtocolError):
            parse_active_port(bad)


# -- the connection ------------------------------------------------------------------------------

@pytest.fixture
async def pair() -> AsyncIterator[tuple[CDPConnection, FakeTransport]]:
    fake = FakeTransport()
    conn = CDPConnection(fake, max_in_flight=2, default_timeout=5)
    async with trio.open_nursery() as nursery:
        await nursery.start(conn.run)
        yield conn, fake
        nursery.cancel_scope.cancel()


async def _browser(fake: FakeTransport, answer: dict[str, Any]) -> None:
    cmd = await fake.next_command()
    await fake.reply(cmd, answer)


@pytest.mark.timeout(10)
async def test_send_returns_the_result(pair: tuple[CDPConnection, FakeTransport]) -> None:
    conn, fake = pair
    async with trio.open_nursery() as nursery:
        nursery.start_soon(_browser, fake, {"product": "Chrome/156"})
        version = await conn.call("Browser.getVersion", None, lambda f: f.string("product", 64))
    assert version == "Chrome/156"


@pytest.mark.timeout(10)
async def test_replies_out_of_order_reach_their_commands(
    pair: tuple[CDPConnection, FakeTransport],
) -> None:
    conn, fake = pair
    got: dict[str, Any] = {}

    async def ask(name: str) -> None:
        got[name] = await conn.send("Runtime.evaluate", {"expression": name})

    async with trio.open_nursery() as nursery:
        nursery.start_soon(ask, "a")
        nursery.start_soon(ask, "b")
        first, second = await fake.next_command(), await fake.next_command()
        await fake.reply(second, {"v": second["params"]["expression"]})
        await fake.reply(first, {"v": first["params"]["expression"]})
    assert got == {"a": {"v": "a"}, "b": {"v": "b"}}


@pytest.mark.timeout(10)
async def test_error_reply_is_a_command_failure(pair: tuple[CDPConnection, FakeTransport]) -> None:
    conn, fake = pair

    async def browser() -> None:
        await fake.error(await fake.next_command(), -32000, "Could not find node with given id")

    async with trio.open_nursery() as nursery:
        nursery.start_soon(browser)
        with pytest.raises(CDPCommandFailed, match=r"DOM.getBoxModel: the browser answered error -32000"):
            await conn.send("DOM.getBoxModel", {"nodeId": 9})


@pytest.mark.timeout(10)
async def test_timeout_then_late_reply_is_ignored(
    pair: tuple[CDPConnection, FakeTransport], autojump_clock: trio.testing.MockClock,
) -> None:
    conn, fake = pair
    with pytest.raises(CDPTimeout, match=r"Page.reload: no answer from the browser within 2 s"):
        await conn.send("Page.reload", timeout=2)
    late = await fake.next_command()
    await fake.reply(late, {})
    async with trio.open_nursery() as nursery:
        nursery.start_soon(_browser, fake, {"ok": True})
        assert await conn.send("Page.enable") == {"ok": True}
    assert conn.unmatched_replies == 1


@pytest.mark.timeout(10)
async def test_in_flight_commands_are_bounded(
    pair: tuple[CDPConnection, FakeTransport], autojump_clock: trio.testing.MockClock,
) -> None:
    conn, fake = pair
    async with trio.open_nursery() as nursery:
        nursery.start_soon(conn.send, "Page.enable")
        nursery.start_soon(conn.send, "Runtime.enable")
        first, second = await fake.next_command(), await fake.next_command()
        with pytest.raises(CDPTimeout, match=r"not sent within 1 s .* 2 in-flight slots"):
            await conn.send("DOM.enable", timeout=1)
        await fake.reply(first)
        await fake.reply(second)
    async with trio.open_nursery() as nursery:
        nursery.start_soon(_browser, fake, {"n": 1})
        assert await conn.send("DOM.enable") == {"n": 1}


@pytest.mark.timeout(10)
async def test_socket_close_fails_every_pending_command(
    pair: tuple[CDPConnection, FakeTransport],
) -> None:
    conn, fake = pair
    errors: list[str] = []

    async def ask(method: str) -> None:
        with pytest.raises(CDPClosed) as info:
            await conn.send(method)
        errors.append(str(info.value))

    async with trio.open_nursery() as nursery:
        nursery.start_soon(ask, "Page.navigate")
        nursery.start_soon(ask, "Page.reload")
        await fake.next_command()
        await fake.next_command()
        await fake.drop("close 1006")
    assert sorted(errors) == [
        "Page.navigate: the browser closed the DevTools connection (close 1006)",
        "Page.reload: the browser closed the DevTools connection (close 1006)",
    ]
    assert conn.closed is not None
    with pytest.raises(CDPClosed, match=r"Page.enable: the browser closed"):
        await conn.send("Page.enable")


@pytest.mark.timeout(10)
async def test_events_are_routed_by_session_and_method(
    pair: tuple[CDPConnection, FakeTransport],
) -> None:
    conn, fake = pair
    page = CDPSession(conn, SID)
    with page.subscribe({"Page.loadEventFired"}) as on_page, \
            conn.subscribe({"Page.loadEventFired", "Target.targetCreated"}) as on_browser:
        await fake.emit("Page.loadEventFired", {"timestamp": 1}, SID)
        await fake.emit("Page.loadEventFired", {"timestamp": 2}, "OTHER")
        await fake.emit("Runtime.consoleAPICalled", {}, SID)
        await fake.emit("Target.targetCreated", {"targetInfo": {}})
        event = await on_page.receive()
        assert event == Event("Page.loadEventFired", SID, {"timestamp": 1})
        assert (await on_browser.receive()).method == "Target.targetCreated"
        assert on_page.drain() == [] and on_browser.drain() == []


@pytest.mark.timeout(10)
async def test_a_full_subscription_drops_the_oldest(pair: tuple[CDPConnection, FakeTransport]) -> None:
    conn, fake = pair
    with conn.subscribe({"Runtime.consoleAPICalled"}, session_id=SID, limit=3) as sub:
        for n in range(5):
            await fake.emit("Runtime.consoleAPICalled", {"n": n}, SID)
        await fake.emit("Page.marker", {}, SID)
        with conn.subscribe({"Page.marker"}, session_id=SID) as marker:
            await fake.emit("Page.marker", {}, SID)
            await marker.receive()
        assert [e.params["n"] for e in sub.drain()] == [2, 3, 4]
        assert sub.dropped == 2


@pytest.mark.timeout(10)
async def test_reply_on_the_wrong_session_is_refused(
    pair: tuple[CDPConnection, FakeTransport],
) -> None:
    conn, fake = pair

    async def browser() -> None:
        cmd = await fake.next_command()
        await fake.push_raw(json.dumps({"id": cmd["id"], "result": {}, "sessionId": "OTHER"}))

    async with trio.open_nursery() as nursery:
        nursery.start_soon(browser)
        with pytest.raises(CDPProtocolError, match="came back on another session"):
            await CDPSession(conn, SID).send("Page.enable")


@pytest.mark.timeout(10)
async def test_crash_and_detach_fail_only_that_session(
    pair: tuple[CDPConnection, FakeTransport],
) -> None:
    conn, fake = pair
    page, other = CDPSession(conn, SID), CDPSession(conn, "SECOND")

    async with trio.open_nursery() as nursery:
        async def crashed() -> None:
            with pytest.raises(CDPClosed, match=r"Page.navigate: the page's renderer crashed"):
                await page.send("Page.navigate", {"url": "https://x.test/"})

        nursery.start_soon(crashed)
        await fake.next_command()
        await fake.emit("Inspector.targetCrashed", {}, SID)
    with pytest.raises(CDPClosed, match="renderer crashed"):
        await page.send("Page.enable")
    async with trio.open_nursery() as nursery:
        nursery.start_soon(_browser, fake, {})
        assert await other.send("Page.enable") == {}
    await fake.emit("Target.detachedFromTarget", {"sessionId": "SECOND"})
    with other.subscribe({"Page.loadEventFired"}) as sub, pytest.raises(CDPClosed, match="detached"):
        await sub.receive()


@pytest.mark.timeout(10)
async def test_garbage_is_counted_then_the_connection_is_dropped(
    pair: tuple[CDPConnection, FakeTransport],
) -> None:
    conn, fake = pair
    for _ in range(17):
        await fake.push_raw("not json")
    with conn.subscribe({"Page.x"}) as sub, pytest.raises(CDPClosed, match="broke the DevTools protocol"):
        await sub.receive()
    assert conn.violations == 17


@pytest.mark.timeout(10)
async def test_attach_uses_flatten_mode(pair: tuple[CDPConnection, FakeTransport]) -> None:
    conn, fake = pair

    async def browser() -> None:
        cmd = await fake.next_command()
        assert cmd["params"] == {"targetId": "T1", "flatten": True}
        await fake.reply(cmd, {"sessionId": SID})
        cmd = await fake.next_command()
        assert cmd["sessionId"] == SID
        await fake.reply(cmd, {})

    async with trio.open_nursery() as nursery:
        nursery.start_soon(browser)
        session = await conn.attach("T1")
        assert session.session_id == SID
        await session.send("Page.enable")


@pytest.mark.timeout(10)
async def test_a_standing_subscription_lasts_until_unsubscribed(
    pair: tuple[CDPConnection, FakeTransport],
) -> None:
    conn, fake = pair
    sub = conn.open_subscription({"Runtime.consoleAPICalled"}, session_id=SID)
    await fake.emit("Runtime.consoleAPICalled", {"n": 1}, SID)
    assert (await sub.receive()).params == {"n": 1}
    conn.unsubscribe(sub)
    conn.unsubscribe(sub)
    with pytest.raises(CDPClosed, match="subscription was ended"):
        await sub.receive()


@pytest.mark.timeout(10)
async def test_wait_ended_says_why_a_session_or_the_connection_ended(
    pair: tuple[CDPConnection, FakeTransport],
) -> None:
    conn, fake = pair
    got: dict[str, str] = {}

    async def wait(key: str, session: str | None) -> None:
        got[key] = await conn.wait_ended(session)

    async with trio.open_nursery() as nursery:
        nursery.start_soon(wait, "page", SID)
        nursery.start_soon(wait, "conn", None)
        await trio.testing.wait_all_tasks_blocked()
        await fake.emit("Inspector.targetCrashed", {}, SID)
        await trio.testing.wait_all_tasks_blocked()
        assert got == {"page": "the page's renderer crashed"}  # the connection is still up
        await fake.drop("close 1006")
    assert got["conn"] == "the browser closed the DevTools connection (close 1006)"
    # Once ended, it answers at once.
    assert await conn.wait_ended("ANY") == got["conn"]
