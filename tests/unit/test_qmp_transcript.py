"""The QMP transcript kept as a failed rig's evidence: what it records, what it
withholds (typed text), and its bounds; and the Trio connection feeding it."""

from __future__ import annotations

import json
import logging
from typing import Any

import pytest
import trio
import trio.testing

from rigd.backends.qmp_client import QMPConnection
from rigd.protocols import input as qin
from rigd.protocols.qmp import Error, Greeting, ProtocolViolation, QMPEvent, Return
from rigd.protocols.qmp_transcript import MAX_ENTRY_CHARS, Transcript, event_shape


class Clock:
    def __init__(self) -> None:
        self.now = 100.0

    def __call__(self) -> float:
        self.now += 0.25
        return self.now


def lines(t: Transcript) -> list[str]:
    return t.render().splitlines()[1:]


def test_commands_replies_and_events_in_order_with_offsets() -> None:
    t = Transcript(clock=Clock())
    t.received(Greeting({"qemu": {"major": 7}}))
    t.sent(1, "qmp_capabilities")
    t.received(Return(1, {}))
    t.sent(2, "screendump", {"filename": "/run/x.png", "format": "png"})
    t.received(Error(2, "GenericError", "no display"))
    t.received(QMPEvent("STOP", {}, 1.5))
    t.received(ProtocolViolation("not JSON"))
    t.note("connection closed")
    assert lines(t) == [
        '   +0.000000 <- greeting {"qemu": {"major": 7}}',
        "   +0.250000 -> qmp_capabilities id=1",
        "   +0.500000 <- return id=1 {}",
        '   +0.750000 -> screendump {"filename": "/run/x.png", "format": "png"} id=2',
        "   +1.000000 <- error id=2 GenericError: no display",
        "   +1.250000 <- event STOP {}",
        "   +1.500000 <- protocol violation: not JSON",
        "   +1.750000 -- connection closed",
    ]
    assert t.render().startswith("# QMP transcript: seconds since the first message (monotonic 100.250000)")


def test_typed_text_is_never_recorded() -> None:
    secret = "hunter2 Secret!"
    events = [e for step in qin.plan_typing(secret) if isinstance(step, list) for e in step]
    clicks = [qin.button("left", True), qin.button("left", False)]
    t = Transcript()
    t.sent(5, "input-send-event", {"events": [*events, *clicks]})
    t.received(Error(5, "GenericError", "Invalid parameter 'key' value 'h'"))
    t.sent(6, "send-key", {"keys": [{"type": "qcode", "data": "h"}]})
    t.received(Return(6, {"echo": "h"}))
    text = t.render()
    n_keys = sum(1 for e in events if e["type"] == "key")
    assert f"-> input-send-event [key:{n_keys} btn:2] id=5" in text
    assert "<- error id=5 GenericError (reply to input-send-event: description withheld)" in text
    assert "-> send-key (arguments withheld: keys) id=6" in text
    assert "<- return id=6 (reply to send-key: value withheld)" in text
    for needle in ("hunter", "qcode", '"h"', "'h'", "shift", "Secret"):
        assert needle not in text, needle


def test_event_shape_counts_kinds_and_hides_odd_types() -> None:
    events: list[Any] = [
        {"type": "abs", "data": {}}, {"type": "abs", "data": {}}, {"type": "btn", "data": {}},
        {"type": "typed: hello", "data": {}}, "junk",
    ]
    assert event_shape(events) == "abs:2 btn:1 other:2"
    assert event_shape([]) == "no events"
    assert event_shape({"a": 1}) == "events: not a list"


def test_bounded_by_entries_and_characters() -> None:
    t = Transcript(max_entries=10)
    for i in range(25):
        t.sent(i, "query-status")
    kept = lines(t)
    assert len(kept) == 10 and kept[0].endswith("id=15") and kept[-1].endswith("id=24")
    assert "15 older messages dropped" in t.render()

    t = Transcript(max_chars=8 * 1024)
    for i in range(100):
        t.received(Return(i, {"blob": "x" * 10_000}))
    rendered = t.render()
    assert len(rendered) <= 8 * 1024 + 200
    assert len(lines(t)[-1]) < MAX_ENTRY_CHARS + 100 and "more characters)" in rendered
    assert lines(t)[-1].split()[2:4] == ["return", "id=99"]


async def fake_qemu(stream: trio.abc.Stream, replies: dict[str, Any]) -> None:
    """Greet, answer each command line with its canned reply; ``quit`` closes the stream."""
    await stream.send_all(b'{"QMP": {"version": {"qemu": {"major": 7}}, "capabilities": []}}\r\n')
    buf = b""
    while data := await stream.receive_some(65536):
        buf += data
        while b"\n" in buf:
            line, buf = buf.split(b"\n", 1)
            cmd = json.loads(line)
            if cmd["execute"] == "quit":
                await stream.aclose()
                return
            if cmd["execute"] == "stop":
                await stream.send_all(b'{"event": "STOP", "data": {}, "timestamp": {"seconds": 1, "microseconds": 0}}\n')
            reply = {"id": cmd["id"], **replies.get(cmd["execute"], {"return": {}})}
            await stream.send_all(json.dumps(reply).encode() + b"\r\n")


@pytest.mark.timeout(10)
async def test_connection_transcript_over_a_fake_qemu() -> None:
    ours, theirs = trio.testing.memory_stream_pair()
    conn = QMPConnection(ours, log=logging.getLogger("test"))  # type: ignore[arg-type]
    async with trio.open_nursery() as nursery:
        nursery.start_soon(fake_qemu, theirs, {"query-status": {"return": {"status": "paused"}}})
        await nursery.start(conn.run)
        await conn.handshake(5)
        await conn.execute("stop")
        assert await conn.execute("query-status") == {"status": "paused"}
        await conn.execute("input-send-event", {"events": qin.plan_typing("a")[0]})
        await conn.send_only("quit")  # the fake closes; the reader task ends by itself
    got = [line.split(maxsplit=1)[1] for line in conn.transcript().splitlines()[1:]]
    assert got == [
        '<- greeting {"qemu": {"major": 7}}',
        "-> qmp_capabilities id=1",
        "<- return id=1 {}",
        "-> stop id=2",
        "<- event STOP {}",
        "<- return id=2 {}",
        "-> query-status id=3",
        '<- return id=3 {"status": "paused"}',
        "-> input-send-event [key:2] id=4",
        "<- return id=4 (reply to input-send-event: value withheld)",
        "-> quit id=5",
        "-- connection closed",
    ]
