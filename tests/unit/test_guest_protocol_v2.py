"""Guest protocol 2 on the host side: the desktop ops' replies and ``data`` streams.

Sans-I/O, like test_guest_protocol.py: bytes in, events out. A protocol-2
guest is as hostile as any other: a reply of the wrong shape fails its
request at once, and a ``data`` stream must arrive in order and add up to
what the reply says.
"""

from __future__ import annotations

import base64
import json
from typing import Any

import pytest

from rigd.protocols.guest import PROTO_DESKTOP, Garbage, GuestProtocol, Ready, Reply, Stream


def line(obj: Any) -> bytes:
    return json.dumps(obj).encode() + b"\n"


def b64(data: bytes) -> str:
    return base64.b64encode(data).decode()


def screen_reply(rid: int, **over: Any) -> dict[str, Any]:
    body: dict[str, Any] = {
        "id": rid,
        "ok": True,
        "displayWidth": 1920,
        "displayHeight": 1080,
        "imageWidth": 1280,
        "imageHeight": 720,
        "scale": 1.5,
        "cursor": [10, 20],
        "cursorMarked": True,
        "format": "jpeg",
        "bytes": 3,
        "data": b64(b"abc"),
        "timings": {"grabMs": 1},
    }
    body.update(over)
    return {k: v for k, v in body.items() if v is not ...}


def display_body(**over: Any) -> dict[str, Any]:
    body: dict[str, Any] = {
        "width": 1280,
        "height": 800,
        "output": "Virtual-1",
        "modes": [{"width": 1280, "height": 800, "name": "1280x800", "current": True, "preferred": True}],
        "maxWidth": 2560,
        "maxHeight": 1600,
    }
    body.update(over)
    return body


def failed(events: list[Any], rid: int) -> Reply:
    """A malformed reply: one Garbage and a failed Reply for the request."""
    assert len(events) == 2, events
    assert isinstance(events[0], Garbage)
    reply = events[1]
    assert isinstance(reply, Reply) and reply.id == rid and not reply.ok
    assert reply.error is not None and reply.error.startswith("guest sent a malformed")
    return reply


# --------------------------------------------------------------------------
# ready and hello


def test_ready_of_protocol_2_carries_features() -> None:
    proto = GuestProtocol()
    events = proto.receive_data(
        line({"ev": "ready", "proto": 2, "agent": "rigd-agent/2", "pid": 9, "features": ["screen", "cursor"]})
    )
    assert events == [Ready(PROTO_DESKTOP, "rigd-agent/2", 9, ("screen", "cursor"))]
    # protocol 1 has none, and compares equal to the v1 event
    events = proto.receive_data(line({"ev": "ready", "proto": 1, "agent": "rigd-agent/1", "pid": 9}))
    assert events == [Ready(1, "rigd-agent/1", 9)]


@pytest.mark.parametrize(
    "features",
    ["screen", [1, 2], ["x" * 65], [""], ["f"] * 65, None, {"a": 1}],
)
def test_ready_with_malformed_features_is_garbage(features: Any) -> None:
    proto = GuestProtocol()
    events = proto.receive_data(line({"ev": "ready", "proto": 2, "agent": "a", "pid": 9, "features": features}))
    assert len(events) == 1 and isinstance(events[0], Garbage)
    assert proto.agent_pid is None


def test_hello_reply_features_are_checked() -> None:
    proto = GuestProtocol()
    hello = {"proto": 2, "kernel": "Linux", "hostname": "rig", "bootS": 1.0, "pid": 5}
    rid, _ = proto.send_request("hello")
    events = proto.receive_data(line({"id": rid, "ok": True, **hello, "features": ["screen"], "displayReady": True}))
    assert events == [Reply(rid, True, {**hello, "features": ["screen"], "displayReady": True})]
    rid, _ = proto.send_request("hello")
    failed(proto.receive_data(line({"id": rid, "ok": True, **hello, "features": "screen"})), rid)


# --------------------------------------------------------------------------
# screen


@pytest.mark.parametrize("op", ["screen", "screenshot"])
def test_screen_reply_inline(op: str) -> None:
    proto = GuestProtocol()
    rid, data = proto.send_request(op, maxWidth=1280, maxHeight=800, format="jpeg", markCursor=True)
    assert json.loads(data) == {"id": rid, "op": op, "maxWidth": 1280, "maxHeight": 800,
                                "format": "jpeg", "markCursor": True}  # fmt: skip
    events = proto.receive_data(line(screen_reply(rid)))
    assert len(events) == 1
    reply = events[0]
    assert isinstance(reply, Reply) and reply.ok
    assert reply.body["data"] == b64(b"abc") and reply.body["scale"] == 1.5
    assert proto.pending == {}


def test_screen_reply_with_a_null_cursor_and_integer_scale() -> None:
    proto = GuestProtocol()
    rid, _ = proto.send_request("screen")
    events = proto.receive_data(line(screen_reply(rid, cursor=None, scale=1, cursorMarked=False)))
    assert isinstance(events[0], Reply) and events[0].ok


@pytest.mark.parametrize(
    "over",
    [
        {"displayWidth": 0},
        {"imageHeight": "720"},
        {"scale": 0.5},
        {"scale": True},
        {"cursor": [1]},
        {"cursor": [1.5, 2]},
        {"cursor": [1, 99999]},
        {"format": "gif"},
        {"bytes": -1},
        {"data": 5},
        {"data": ...},  # neither data nor chunks
        {"chunks": 0},  # both data and chunks
        {"imageWidth": ...},
    ],
)
def test_malformed_screen_replies_fail_the_request(over: dict[str, Any]) -> None:
    proto = GuestProtocol()
    rid, _ = proto.send_request("screen")
    failed(proto.receive_data(line(screen_reply(rid, **over))), rid)
    assert rid not in proto.pending


def test_screen_data_streamed_in_order() -> None:
    proto = GuestProtocol()
    rid, _ = proto.send_request("screen", format="png")
    image = bytes(range(256)) * 1000
    parts = [image[i : i + 49152] for i in range(0, len(image), 49152)]
    wire = b"".join(
        line({"id": rid, "ev": "data", "offset": i * 49152, "data": b64(p)}) for i, p in enumerate(parts)
    ) + line(screen_reply(rid, data=..., chunks=len(parts), bytes=len(image), format="png"))
    # however the bytes are cut, the same events come out
    events: list[Any] = []
    for i in range(0, len(wire), 7777):
        events += proto.receive_data(wire[i : i + 7777])
    streams = [e for e in events if isinstance(e, Stream)]
    assert [s.name for s in streams] == ["data"] * len(parts)
    assert b"".join(s.data for s in streams) == image
    assert [s.body["offset"] for s in streams] == [i * 49152 for i in range(len(parts))]
    reply = events[-1]
    assert isinstance(reply, Reply) and reply.ok and reply.body["chunks"] == len(parts)
    assert "data" not in reply.body


def test_screen_data_out_of_order_or_short_is_refused() -> None:
    proto = GuestProtocol()
    rid, _ = proto.send_request("screen")
    events = proto.receive_data(line({"id": rid, "ev": "data", "offset": 0, "data": b64(b"abcd")}))
    assert isinstance(events[0], Stream)
    # a gap
    events = proto.receive_data(line({"id": rid, "ev": "data", "offset": 10, "data": b64(b"x")}))
    assert len(events) == 1 and isinstance(events[0], Garbage)
    # the reply claims more than came
    failed(proto.receive_data(line(screen_reply(rid, data=..., chunks=2, bytes=5))), rid)

    rid, _ = proto.send_request("screen")
    proto.receive_data(line({"id": rid, "ev": "data", "offset": 0, "data": b64(b"abcd")}))
    failed(proto.receive_data(line(screen_reply(rid, data=..., chunks=1, bytes=5))), rid)

    # data events, then an inline payload as well
    rid, _ = proto.send_request("screen")
    proto.receive_data(line({"id": rid, "ev": "data", "offset": 0, "data": b64(b"abcd")}))
    failed(proto.receive_data(line(screen_reply(rid))), rid)


def test_data_events_only_for_bulk_ops_and_never_forged() -> None:
    proto = GuestProtocol()
    rid, _ = proto.send_request("exec", argv=["true"])
    events = proto.receive_data(line({"id": rid, "ev": "data", "offset": 0, "data": b64(b"x")}))
    assert len(events) == 1 and isinstance(events[0], Garbage)
    rid, _ = proto.send_request("cursor")
    events = proto.receive_data(line({"id": rid, "ev": "data", "offset": 0, "data": b64(b"x")}))
    assert len(events) == 1 and isinstance(events[0], Garbage)
    events = proto.receive_data(line({"id": 999, "ev": "data", "offset": 0, "data": b64(b"x")}))
    assert len(events) == 1 and isinstance(events[0], Garbage)
    rid, _ = proto.send_request("screen")
    for bad in ({"offset": 0}, {"offset": -1, "data": b64(b"x")}, {"offset": "0", "data": b64(b"x")},
                {"offset": 0, "data": "!!"}):  # fmt: skip
        events = proto.receive_data(line({"id": rid, "ev": "data", **bad}))
        assert len(events) == 1 and isinstance(events[0], Garbage), bad


def test_an_abandoned_bulk_request_forgets_its_stream() -> None:
    proto = GuestProtocol()
    rid, _ = proto.send_request("screen")
    proto.receive_data(line({"id": rid, "ev": "data", "offset": 0, "data": b64(b"abcd")}))
    proto.abandon(rid)
    assert proto.receive_data(line({"id": rid, "ev": "data", "offset": 4, "data": b64(b"x")})) == []
    assert proto.receive_data(line(screen_reply(rid, data=..., chunks=2, bytes=5))) == []
    assert proto.late_messages == 2


# --------------------------------------------------------------------------
# cursor, display, set_display


def test_cursor_reply() -> None:
    proto = GuestProtocol()
    rid, _ = proto.send_request("cursor")
    body = {"cursor": [640, 400], "displayWidth": 1280, "displayHeight": 800}
    assert proto.receive_data(line({"id": rid, "ok": True, **body})) == [Reply(rid, True, body)]
    rid, _ = proto.send_request("cursor")
    failed(proto.receive_data(line({"id": rid, "ok": True, **body, "cursor": None})), rid)


def test_display_and_set_display_replies() -> None:
    proto = GuestProtocol()
    rid, _ = proto.send_request("display")
    assert proto.receive_data(line({"id": rid, "ok": True, **display_body()})) == [
        Reply(rid, True, display_body())
    ]
    rid, _ = proto.send_request("set_display", width=1920, height=1080)
    body = display_body(width=1920, height=1080, changed=True)
    assert proto.receive_data(line({"id": rid, "ok": True, **body})) == [Reply(rid, True, body)]
    # set_display must say whether it changed anything
    rid, _ = proto.send_request("set_display", width=1920, height=1080)
    failed(proto.receive_data(line({"id": rid, "ok": True, **display_body()})), rid)
    for bad in ({"modes": [{"width": 1, "height": 1}]}, {"modes": "1280x800"}, {"output": 3}, {"width": None}):
        rid, _ = proto.send_request("display")
        failed(proto.receive_data(line({"id": rid, "ok": True, **display_body(**bad)})), rid)


def test_refusals_pass_through_as_failed_replies() -> None:
    proto = GuestProtocol()
    rid, _ = proto.send_request("screen")
    events = proto.receive_data(line({"id": rid, "ok": False, "error": "no display: this rig has no X session"}))
    assert events == [Reply(rid, False, {}, "no display: this rig has no X session")]


# --------------------------------------------------------------------------
# clipboard


def test_clipboard_read_inline_and_streamed() -> None:
    proto = GuestProtocol()
    rid, _ = proto.send_request("clipboard_read", selection="primary")
    body = {"selection": "primary", "owner": True, "target": "UTF8_STRING", "bytes": 20,
            "truncated": False, "text": "héllo wörld 世界"}  # fmt: skip
    assert proto.receive_data(line({"id": rid, "ok": True, **body})) == [Reply(rid, True, body)]

    rid, _ = proto.send_request("clipboard_read")
    text = ("世界" * 100_000).encode()
    wire = line({"id": rid, "ev": "data", "offset": 0, "data": b64(text[:49152])})
    wire += line({"id": rid, "ev": "data", "offset": 49152, "data": b64(text[49152:])})
    wire += line({"id": rid, "ok": True, "selection": "clipboard", "owner": True, "target": "UTF8_STRING",
                  "bytes": len(text), "truncated": False, "chunks": 2})  # fmt: skip
    events = proto.receive_data(wire)
    assert b"".join(e.data for e in events if isinstance(e, Stream)).decode() == "世界" * 100_000
    assert isinstance(events[-1], Reply) and events[-1].ok

    rid, _ = proto.send_request("clipboard_read")
    failed(proto.receive_data(line({"id": rid, "ok": True, **body, "selection": "secondary"})), rid)
    rid, _ = proto.send_request("clipboard_read")
    failed(proto.receive_data(line({"id": rid, "ok": True, **body, "text": None})), rid)


def test_clipboard_write_reply() -> None:
    proto = GuestProtocol()
    rid, data = proto.send_request("clipboard_write", text="héllo wörld 世界", selection="clipboard")
    assert json.loads(data)["text"] == "héllo wörld 世界"
    body = {"selection": "clipboard", "bytes": 20, "pending": False}
    assert proto.receive_data(line({"id": rid, "ok": True, **body})) == [Reply(rid, True, body)]
    rid, _ = proto.send_request("clipboard_write", text="x")
    failed(proto.receive_data(line({"id": rid, "ok": True, "selection": "xdnd", "bytes": 1, "pending": False})), rid)
