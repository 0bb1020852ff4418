"""The lanes on the host side: file drops and reads, the rich clipboard, keymap_bind.

Sans-I/O, like test_guest_protocol.py. The guest is hostile: a file_read
stream that breaks its rules (data before meta, meta twice, a gap, more than
meta announced) fails the read at once — one Garbage and a failed Reply —
and whatever it sends afterwards is dropped as late.
"""

from __future__ import annotations

import base64
import hashlib
import json
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from rigd.errors import FieldError
from rigd.protocols.guest import (
    MAX_LINE,
    AgentError,
    Event,
    Garbage,
    GuestProtocol,
    PtyExit,
    PtyOutput,
    Ready,
    Reply,
    Stream,
)

EVENT_TYPES = (Ready, Reply, Stream, PtyOutput, PtyExit, AgentError, Garbage)
SHA = hashlib.sha256(b"abcdef").hexdigest()
CHUNK = 256 * 1024


def line(obj: Any) -> bytes:
    return json.dumps(obj).encode() + b"\n"


def b64(data: bytes) -> str:
    return base64.b64encode(data).decode()


def failed(events: list[Event], rid: int, start: str = "guest sent a malformed") -> Reply:
    """One Garbage and a failed Reply for ``rid``."""
    assert len(events) == 2, events
    assert isinstance(events[0], Garbage)
    reply = events[1]
    assert isinstance(reply, Reply) and reply.id == rid and not reply.ok
    assert reply.error is not None and reply.error.startswith(start), reply.error
    return reply


def meta(rid: int, **over: Any) -> dict[str, Any]:
    body = {"id": rid, "ev": "meta", "bytes": 6, "sha256": SHA, "name": "f.txt", "mode": 0o644}
    body.update(over)
    return {k: v for k, v in body.items() if v is not ...}


def data_ev(rid: int, offset: int, data: bytes) -> dict[str, Any]:
    return {"id": rid, "ev": "data", "offset": offset, "data": b64(data)}


# --------------------------------------------------------------------------
# features on protocol 1


def test_protocol_1_ready_and_hello_carry_features() -> None:
    proto = GuestProtocol()
    events = proto.receive_data(line({"ev": "ready", "proto": 1, "agent": "rigd-agent/1", "pid": 4,
                                      "features": ["files"]}))  # fmt: skip
    assert events == [Ready(1, "rigd-agent/1", 4, ("files",))]
    rid, _ = proto.send_request("hello")
    hello = {"proto": 1, "kernel": "Linux", "hostname": "rig", "bootS": 1.0, "pid": 4, "features": ["files"]}
    assert proto.receive_data(line({"id": rid, "ok": True, **hello})) == [Reply(rid, True, hello)]
    # an agent from before the lanes says nothing: that is "rebuild the image", not an error
    rid, _ = proto.send_request("hello")
    del hello["features"]
    assert proto.receive_data(line({"id": rid, "ok": True, **hello})) == [Reply(rid, True, hello)]


# --------------------------------------------------------------------------
# sending: bytes are spliced in as base64


def test_send_request_splices_bytes_as_base64() -> None:
    proto = GuestProtocol()
    payload = bytes(range(256)) * 2048  # 512 KiB
    rid, data = proto.send_request("file_put_data", data=payload, handle=3, offset=0)
    assert data.endswith(b"\n") and data.count(b"\n") == 1
    assert data.startswith(b'{"id":%d,"op":"file_put_data","handle":3,"offset":0,"data":"' % rid)
    decoded = json.loads(data)
    assert decoded == {"id": rid, "op": "file_put_data", "handle": 3, "offset": 0, "data": b64(payload)}
    # the spelling the agent parses without json.loads, whatever the keyword order
    rid, data = proto.send_request("file_put_data", offset=5, data=b"ab", handle=4)
    assert data == b'{"id":%d,"op":"file_put_data","handle":4,"offset":5,"data":"YWI="}\n' % rid
    # bytearray and memoryview too; several binary fields
    _, data = proto.send_request("x", a=bytearray(b"\x00"), b=memoryview(b"\xff"), c="s")
    assert json.loads(data) == {"id": rid + 1, "op": "x", "c": "s", "a": "AA==", "b": "/w=="}
    _, data = proto.send_request("clipboard_write", data=b"")
    assert json.loads(data)["data"] == ""


def test_send_request_names_the_binary_field_over_the_cap() -> None:
    proto = GuestProtocol()
    with pytest.raises(FieldError) as info:
        proto.send_request("file_put_data", handle=1, offset=0, data=b"x" * (MAX_LINE * 3 // 4))
    assert info.value.field == "data"
    assert proto.pending == {}


# --------------------------------------------------------------------------
# drops


@pytest.mark.parametrize(
    ("op", "fields", "body"),
    [
        ("file_put_open", {"dir": "~/drops", "name": "a", "owner": "root"}, {"handle": 1, "dir": "/root/drops"}),
        ("file_put_data", {"handle": 1, "offset": 0, "data": b"abc"}, {"bytes": 3}),
        ("file_put_close", {"handle": 1, "bytes": 6, "sha256": SHA}, {"bytes": 6, "sha256": SHA}),
        ("file_commit", {"handles": [1, 2]}, {"paths": ["/root/drops/a", "/root/drops/2-a"]}),
        ("file_commit", {"handles": []}, {"paths": []}),
        ("file_abort", {"handles": [1, 9]}, {"removed": 1}),
        ("file_ack", {"read": 4, "offset": 10}, {"known": True}),
        ("file_read_cancel", {"read": 4}, {}),
        ("keymap_bind", {"bind": [[200, 0x20AC]]}, {"bound": 1, "keysymsPerKeycode": 7}),
    ],
)
def test_replies_of_the_lanes(op: str, fields: dict[str, Any], body: dict[str, Any]) -> None:
    proto = GuestProtocol()
    rid, _ = proto.send_request(op, **fields)
    assert proto.receive_data(line({"id": rid, "ok": True, **body})) == [Reply(rid, True, body)]
    assert proto.pending == {}


@pytest.mark.parametrize(
    ("op", "fields", "body"),
    [
        ("file_put_open", {}, {"handle": "1", "dir": "/d"}),
        ("file_put_open", {}, {"handle": 1, "dir": "relative"}),
        ("file_put_open", {}, {"handle": 1, "dir": "/a\0b"}),
        ("file_put_open", {}, {"handle": 1}),
        ("file_put_data", {}, {"bytes": -1}),
        ("file_put_data", {}, {"bytes": 1.0}),
        ("file_put_data", {}, {}),
        ("file_put_close", {}, {"bytes": 6, "sha256": SHA.upper()}),
        ("file_put_close", {}, {"bytes": 6, "sha256": SHA[:63]}),
        ("file_put_close", {}, {"bytes": 6, "sha256": 5}),
        ("file_put_close", {}, {"bytes": True, "sha256": SHA}),
        ("file_commit", {"handles": [1, 2]}, {"paths": ["/a"]}),  # one per handle
        ("file_commit", {"handles": [1]}, {"paths": ["/a", "/b"]}),
        ("file_commit", {"handles": [1]}, {"paths": "/a"}),
        ("file_commit", {"handles": [1]}, {"paths": [1]}),
        ("file_commit", {"handles": [1]}, {"paths": ["a"]}),
        ("file_abort", {"handles": [1]}, {"removed": "1"}),
        ("file_ack", {}, {"known": 1}),
        ("file_ack", {}, {}),
        ("file_read", {"path": "/x", "maxBytes": 1, "window": 1}, {"bytes": 0, "sha256": SHA}),  # no meta
        ("keymap_bind", {}, {"bound": 1, "keysymsPerKeycode": 0}),
        ("keymap_bind", {}, {"bound": -1, "keysymsPerKeycode": 2}),
    ],
)
def test_malformed_replies_of_the_lanes_fail_the_request(
    op: str, fields: dict[str, Any], body: dict[str, Any]
) -> None:
    proto = GuestProtocol()
    rid, _ = proto.send_request(op, **fields)
    failed(proto.receive_data(line({"id": rid, "ok": True, **body})), rid)
    assert proto.pending == {}


def test_refusals_pass_through() -> None:
    proto = GuestProtocol()
    for op, error in [("file_put_open", "too many open drops"), ("file_put_close", "digest mismatch: …"),
                      ("file_commit", "drop 3 is not closed and verified; nothing was committed")]:  # fmt: skip
        rid, _ = proto.send_request(op)
        assert proto.receive_data(line({"id": rid, "ok": False, "error": error})) == [Reply(rid, False, {}, error)]


# --------------------------------------------------------------------------
# file_read


def test_a_file_read_stream() -> None:
    proto = GuestProtocol()
    rid, req = proto.send_request("file_read", path="/etc/hosts", maxBytes=1 << 20, window=1 << 20)
    assert json.loads(req) == {"id": rid, "op": "file_read", "path": "/etc/hosts", "maxBytes": 1 << 20,
                               "window": 1 << 20}  # fmt: skip
    payload = bytes(range(256)) * 2500  # 640000 bytes: three events, the first two full
    parts = [payload[i : i + CHUNK] for i in range(0, len(payload), CHUNK)]
    digest = hashlib.sha256(payload).hexdigest()
    wire = line(meta(rid, bytes=len(payload), sha256=digest, name="hosts", mode=0o600))
    offset = 0
    for part in parts:
        wire += line(data_ev(rid, offset, part))
        offset += len(part)
    wire += line({"id": rid, "ok": True, "bytes": len(payload), "sha256": digest})
    events: list[Event] = []
    for i in range(0, len(wire), 65536):  # however it is cut
        events += proto.receive_data(wire[i : i + 65536])
    assert events[0] == Stream(rid, "meta", {"bytes": len(payload), "sha256": digest, "name": "hosts",
                                             "mode": 0o600})  # fmt: skip
    streams = [e for e in events[1:-1] if isinstance(e, Stream)]
    assert [s.body for s in streams] == [{"offset": 0}, {"offset": CHUNK}, {"offset": 2 * CHUNK}]
    assert b"".join(s.data for s in streams) == payload
    assert events[-1] == Reply(rid, True, {"bytes": len(payload), "sha256": digest})
    assert len(events) == 5 and proto.garbage_lines == 0 and proto.pending == {}


def test_a_file_read_of_a_file_that_changed_is_passed_on() -> None:
    # The reply counts what was sent; that it differs from meta is for the caller to judge.
    proto = GuestProtocol()
    rid, _ = proto.send_request("file_read", path="/log", maxBytes=10, window=10)
    proto.receive_data(line(meta(rid, bytes=6)) + line(data_ev(rid, 0, b"abc")))
    other = hashlib.sha256(b"abc").hexdigest()
    assert proto.receive_data(line({"id": rid, "ok": True, "bytes": 3, "sha256": other})) == [
        Reply(rid, True, {"bytes": 3, "sha256": other})
    ]


def test_an_empty_file_read_and_a_cancelled_one() -> None:
    proto = GuestProtocol()
    empty = hashlib.sha256(b"").hexdigest()
    rid, _ = proto.send_request("file_read", path="/e", maxBytes=0, window=1)
    events = proto.receive_data(line(meta(rid, bytes=0, sha256=empty)) + line({"id": rid, "ok": True,
                                                                               "bytes": 0, "sha256": empty}))  # fmt: skip
    assert [type(e) for e in events] == [Stream, Reply] and isinstance(events[1], Reply) and events[1].ok
    rid, _ = proto.send_request("file_read", path="/e", maxBytes=10, window=1)
    events = proto.receive_data(line(meta(rid)) + line(data_ev(rid, 0, b"a")) + line(
        {"id": rid, "ok": False, "error": "cancelled"}))  # fmt: skip
    assert events[-1] == Reply(rid, False, {}, "cancelled")
    # refused before any meta
    rid, _ = proto.send_request("file_read", path="/d", maxBytes=10, window=1)
    error = "not a regular file: directory"
    assert proto.receive_data(line({"id": rid, "ok": False, "error": error})) == [Reply(rid, False, {}, error)]


@pytest.mark.parametrize(
    ("before", "bad", "why"),
    [
        ([], data_ev(1, 0, b"abc"), "data before meta"),
        ([meta(1)], meta(1), "a second meta"),
        ([meta(1), data_ev(1, 0, b"ab")], data_ev(1, 3, b"c"), "data at offset 3, expected 2"),
        ([meta(1), data_ev(1, 0, b"ab")], data_ev(1, 0, b"c"), "data at offset 0, expected 2"),
        ([meta(1)], data_ev(1, 1, b"abc"), "data at offset 1, expected 0"),
        ([meta(1), data_ev(1, 0, b"abcd")], data_ev(1, 4, b"efg"), "data past the 6 bytes meta announced"),
        ([meta(1, bytes=CHUNK + 1)], data_ev(1, 0, b"x" * (CHUNK + 1)), "a data event over 262144 bytes"),
        ([meta(1)], data_ev(1, 0, b""), "an empty data event"),
        ([meta(1)], {"id": 1, "ev": "data", "offset": 0, "data": "!!"}, "data is not valid base64"),
        ([meta(1)], {"id": 1, "ev": "data", "offset": 0, "data": 5}, "data is not a base64 string"),
        ([meta(1)], {"id": 1, "ev": "data", "offset": "0", "data": "YQ=="}, "offset is not"),
        ([meta(1)], {"id": 1, "ev": "data", "offset": 0}, "missing data"),
        ([meta(1)], {"id": 1, "ev": "data", "data": "YQ=="}, "missing offset"),
        ([], {"id": 1, "ev": "out", "fd": 1, "data": "YQ=="}, "file_read does not stream 'out'"),
        ([], meta(1, bytes=-1), "bytes is not"),
        ([], meta(1, bytes="6"), "bytes is not"),
        ([], meta(1, sha256=SHA.upper()), "sha256 is not"),
        ([], meta(1, sha256=...), "missing sha256"),
        ([], meta(1, name="a/b"), "name is not"),
        ([], meta(1, name=""), "name is not"),
        ([], meta(1, name=".."), "name is not"),
        ([], meta(1, name="x" * 1025), "name is not"),
        ([], meta(1, name=None), "name is not"),
        ([], meta(1, mode=0o10000), "mode is not"),
        ([], meta(1, mode=-1), "mode is not"),
        ([], meta(1, mode=...), "missing mode"),
    ],
)
def test_a_file_read_stream_that_breaks_the_rules_fails_the_read(
    before: list[dict[str, Any]], bad: dict[str, Any], why: str
) -> None:
    proto = GuestProtocol()
    rid, _ = proto.send_request("file_read", path="/f", maxBytes=1 << 20, window=1 << 20)
    assert rid == 1
    events = proto.receive_data(b"".join(line(o) for o in before))
    assert all(isinstance(e, Stream) for e in events) and len(events) == len(before)
    reply = failed(proto.receive_data(line(bad)), rid, "guest sent a malformed file_read stream: ")
    assert reply.error is not None and why in reply.error, reply.error
    assert proto.pending == {}
    # what the guest sends for it afterwards is late, not garbage and not a second answer
    late = proto.receive_data(line(data_ev(rid, 0, b"abc")) + line({"id": rid, "ok": True, "bytes": 3,
                                                                    "sha256": SHA}))  # fmt: skip
    assert late == [] and proto.late_messages == 2


@pytest.mark.parametrize(
    ("stream", "reply", "why"),
    [
        ([meta(1), data_ev(1, 0, b"abc")], {"bytes": 6, "sha256": SHA}, "bytes says 6, 3 bytes of data came"),
        ([meta(1), data_ev(1, 0, b"abc")], {"bytes": 2, "sha256": SHA}, "bytes says 2, 3 bytes of data came"),
        ([meta(1)], {"bytes": 0, "sha256": "x" * 64}, "sha256 is not"),
        ([meta(1)], {"bytes": 0}, "missing sha256"),
        ([], {"bytes": 0, "sha256": SHA}, "a reply without meta"),
    ],
)
def test_a_file_read_reply_must_match_its_stream(
    stream: list[dict[str, Any]], reply: dict[str, Any], why: str
) -> None:
    proto = GuestProtocol()
    rid, _ = proto.send_request("file_read", path="/f", maxBytes=10, window=10)
    proto.receive_data(b"".join(line(o) for o in stream))
    answer = failed(proto.receive_data(line({"id": rid, "ok": True, **reply})), rid)
    assert answer.error is not None and why in answer.error


def test_file_read_events_are_never_forged() -> None:
    proto = GuestProtocol()
    # no request in flight
    events = proto.receive_data(line(meta(7)))
    assert len(events) == 1 and isinstance(events[0], Garbage)
    # a meta for another op
    rid, _ = proto.send_request("screen")
    events = proto.receive_data(line(meta(rid)))
    assert len(events) == 1 and isinstance(events[0], Garbage)
    assert rid in proto.pending  # the screen request is not failed by a stray event
    # two reads keep separate books
    a, _ = proto.send_request("file_read", path="/a", maxBytes=10, window=10)
    b, _ = proto.send_request("file_read", path="/b", maxBytes=10, window=10)
    events = proto.receive_data(line(meta(a)) + line(meta(b)) + line(data_ev(b, 0, b"bb")) + line(data_ev(a, 0, b"a")))
    assert [(e.id, e.name) for e in events if isinstance(e, Stream)] == [(a, "meta"), (b, "meta"), (b, "data"),
                                                                         (a, "data")]  # fmt: skip


def test_an_abandoned_file_read_forgets_its_stream() -> None:
    proto = GuestProtocol()
    rid, _ = proto.send_request("file_read", path="/f", maxBytes=10, window=10)
    proto.receive_data(line(meta(rid)) + line(data_ev(rid, 0, b"ab")))
    proto.abandon(rid)
    assert proto.receive_data(line(data_ev(rid, 2, b"cd")) + line(meta(rid))) == []
    assert proto.late_messages == 2 and proto._file_reads == {}


# --------------------------------------------------------------------------
# the rich clipboard


def clip_body(**over: Any) -> dict[str, Any]:
    body: dict[str, Any] = {"selection": "clipboard", "owner": True, "target": "image/png", "bytes": 3,
                            "truncated": False, "mediaType": "image/png", "targets": ["TARGETS", "image/png"],
                            "data": b64(b"png")}  # fmt: skip
    body.update(over)
    return {k: v for k, v in body.items() if v is not ...}


def test_clipboard_read_of_an_image_inline_and_streamed() -> None:
    proto = GuestProtocol()
    rid, req = proto.send_request("clipboard_read", accept=["image", "text"])
    assert json.loads(req)["accept"] == ["image", "text"]
    assert proto.receive_data(line({"id": rid, "ok": True, **clip_body()})) == [Reply(rid, True, clip_body())]
    rid, _ = proto.send_request("clipboard_read", accept=["image"])
    image = b"\x89PNG" * 40000
    wire = line(data_ev(rid, 0, image[:49152])) + line(data_ev(rid, 49152, image[49152:]))
    body = clip_body(data=..., chunks=2, bytes=len(image), mediaType="image/jpeg", target="image/jpeg")
    events = proto.receive_data(wire + line({"id": rid, "ok": True, **body}))
    assert b"".join(e.data for e in events if isinstance(e, Stream)) == image
    assert events[-1] == Reply(rid, True, body)


def test_clipboard_read_of_text_and_uris_with_the_new_fields() -> None:
    proto = GuestProtocol()
    for media, text in [("text/plain", "héllo"), ("text/uri-list", "file:///root/a.txt\r\n")]:
        rid, _ = proto.send_request("clipboard_read", accept=["uris", "text"])
        body = clip_body(data=..., text=text, mediaType=media, target=media, targets=[])
        assert proto.receive_data(line({"id": rid, "ok": True, **body})) == [Reply(rid, True, body)]


@pytest.mark.parametrize(
    "over",
    [
        {"text": "x"},  # text and data
        {"data": ..., "text": "x"},  # text for an image
        {"mediaType": "text/plain"},  # data for text
        {"mediaType": ...},  # data without a mediaType: text, so data is wrong
        {"mediaType": "image/gif"},
        {"mediaType": 5},
        {"targets": "TARGETS"},
        {"targets": [1]},
        {"targets": ["x" * 129]},
        {"targets": [""]},
        {"targets": ["t"] * 65},
        {"data": 5},
        {"data": ..., "chunks": 1},  # no data events came
        {"chunks": 0},  # data and chunks
        {"data": ...},  # nothing at all
    ],
)
def test_malformed_clipboard_reads_fail_the_request(over: dict[str, Any]) -> None:
    proto = GuestProtocol()
    rid, _ = proto.send_request("clipboard_read", accept=["image"])
    failed(proto.receive_data(line({"id": rid, "ok": True, **clip_body(**over)})), rid)


def test_clipboard_write_reply_with_a_media_type() -> None:
    proto = GuestProtocol()
    rid, req = proto.send_request("clipboard_write", data=b"\x89PNG", mediaType="image/png")
    assert json.loads(req)["data"] == b64(b"\x89PNG")
    body = {"selection": "clipboard", "bytes": 4, "pending": False, "mediaType": "image/png"}
    assert proto.receive_data(line({"id": rid, "ok": True, **body})) == [Reply(rid, True, body)]
    rid, _ = proto.send_request("clipboard_write", text="x")
    failed(proto.receive_data(line({"id": rid, "ok": True, **body, "mediaType": "image/bmp"})), rid)


# --------------------------------------------------------------------------
# properties: a hostile guest answering file ops never makes the parser raise

lane_keys = st.sampled_from(
    ["id", "ok", "ev", "error", "data", "offset", "bytes", "sha256", "name", "mode", "handle", "dir", "paths",
     "removed", "known", "mediaType", "targets", "text", "chunks", "bound", "keysymsPerKeycode"]
)  # fmt: skip
lane_values = (
    st.none()
    | st.booleans()
    | st.integers(min_value=-2, max_value=CHUNK + 2)
    | st.text(max_size=12)
    | st.sampled_from(["meta", "data", "out", SHA, "YWJj", "!!", "/a", "image/png", "text/plain", ""])
    | st.lists(st.sampled_from(["/a", "b", 1]), max_size=3)
)
lane_objects = st.dictionaries(lane_keys, lane_values, max_size=9).map(
    lambda o: {**o, "id": o["id"] if type(o.get("id")) is int and 0 <= o["id"] <= 10 else 1}
)


@settings(suppress_health_check=[HealthCheck.too_slow], max_examples=400)
@given(objects=st.lists(lane_objects, max_size=16))
def test_hostile_answers_to_file_ops_never_raise(objects: list[dict[str, Any]]) -> None:
    proto = GuestProtocol()
    proto.send_request("file_read", path="/f", maxBytes=10, window=10)  # id 1
    for op in ("file_read", "file_put_open", "file_put_data", "file_put_close", "file_commit", "file_abort",
               "file_ack", "clipboard_read", "keymap_bind"):  # fmt: skip
        proto.send_request(op, handles=[1])
    events = proto.receive_data(b"".join(line(o) for o in objects))
    assert all(isinstance(e, EVENT_TYPES) for e in events)
    # every request is answered at most once
    answered = [e.id for e in events if isinstance(e, Reply)]
    assert len(answered) == len(set(answered))
    assert not set(answered) & set(proto.pending)
