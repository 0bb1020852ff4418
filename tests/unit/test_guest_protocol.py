"""The host's sans-I/O view of the guest-agent channel: no sockets, no VMs."""

from __future__ import annotations

import base64
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


def line(obj: Any) -> bytes:
    return json.dumps(obj).encode() + b"\n"


def b64(data: bytes) -> str:
    return base64.b64encode(data).decode()


def feed_chunked(proto: GuestProtocol, data: bytes, cuts: list[int]) -> list[Event]:
    events: list[Event] = []
    prev = 0
    for cut in sorted({c % (len(data) + 1) for c in cuts}):
        events += proto.receive_data(data[prev:cut])
        prev = cut
    events += proto.receive_data(data[prev:])
    return events


def exec_reply(rid: int, **over: Any) -> dict[str, Any]:
    body: dict[str, Any] = {
        "id": rid,
        "ok": True,
        "exitCode": 0,
        "signal": None,
        "timedOut": False,
        "truncated": {"stdout": False, "stderr": False},
        "durationMs": 3,
    }
    body.update(over)
    return body


# --------------------------------------------------------------------------
# sending


def test_send_request_allocates_ids_and_encodes_one_line() -> None:
    proto = GuestProtocol()
    rid1, data1 = proto.send_request("ping")
    rid2, data2 = proto.send_request("exec", argv=["echo", "hi"], stdin=b"\x00\xff")
    assert (rid1, rid2) == (1, 2)
    assert data1.endswith(b"\n") and data1.count(b"\n") == 1
    assert json.loads(data1) == {"id": 1, "op": "ping"}
    assert json.loads(data2) == {"id": 2, "op": "exec", "argv": ["echo", "hi"], "stdin": "AP8="}
    assert proto.pending == {1: "ping", 2: "exec"}


def test_send_request_refuses_a_line_over_the_agents_cap() -> None:
    proto = GuestProtocol()
    with pytest.raises(FieldError) as info:
        proto.send_request("exec", argv=["cat"], stdin=b"x" * MAX_LINE)
    assert info.value.field == "stdin"
    assert proto.pending == {}  # nothing was sent, nothing waits


def test_send_request_rejects_reserved_fields() -> None:
    with pytest.raises(ValueError):
        GuestProtocol().send_request("ping", id=7)


# --------------------------------------------------------------------------
# receiving: every message shape


def test_ready_and_agent_error() -> None:
    proto = GuestProtocol()
    events = proto.receive_data(
        line({"ev": "ready", "proto": 1, "agent": "rigd-agent/1", "pid": 42})
        + line({"ev": "error", "error": "bad request: not JSON"})
    )
    assert events == [Ready(1, "rigd-agent/1", 42), AgentError("bad request: not JSON")]
    assert proto.agent_pid == 42


def test_exec_streams_then_reply() -> None:
    proto = GuestProtocol()
    rid, _ = proto.send_request("exec", argv=["echo", "hi"])
    events = proto.receive_data(
        line({"id": rid, "ev": "out", "fd": 1, "data": b64(b"hi\n")})
        + line({"id": rid, "ev": "out", "fd": 2, "data": b64(b"\x00oops")})
        + line(exec_reply(rid, exitCode=1))
    )
    assert events[0] == Stream(rid, "out", {"fd": 1}, b"hi\n")
    assert events[1] == Stream(rid, "out", {"fd": 2}, b"\x00oops")
    reply = events[2]
    assert isinstance(reply, Reply) and reply.ok and reply.error is None
    assert reply.body["exitCode"] == 1
    assert proto.pending == {}


def test_failed_reply_carries_the_error() -> None:
    proto = GuestProtocol()
    rid, _ = proto.send_request("exec", argv=["nope"])
    events = proto.receive_data(line({"id": rid, "ok": False, "error": "no such file or directory: nope"}))
    assert events == [Reply(rid, False, {}, "no such file or directory: nope")]


def test_pty_lifecycle() -> None:
    proto = GuestProtocol()
    rid, _ = proto.send_request("pty_open", cols=80, rows=24)
    # Output for a pty nobody opened is garbage.
    assert isinstance(proto.receive_data(line({"ev": "pty_out", "pty": 1, "data": b64(b"x")}))[0], Garbage)
    events = proto.receive_data(
        line({"id": rid, "ok": True, "pty": 1})
        + line({"ev": "pty_out", "pty": 1, "data": b64(b"$ ")})
        + line({"ev": "pty_exit", "pty": 1, "exitCode": 0, "signal": None})
        + line({"ev": "pty_out", "pty": 1, "data": b64(b"late")})
    )
    assert events[0] == Reply(rid, True, {"pty": 1}, None)
    assert events[1] == PtyOutput(1, b"$ ")
    assert events[2] == PtyExit(1, 0, None)
    assert isinstance(events[3], Garbage)
    assert proto.ptys == set()


def test_hello_reply_shape_is_checked() -> None:
    proto = GuestProtocol()
    rid, _ = proto.send_request("hello", time=1.0)
    good = {"id": rid, "ok": True, "proto": 1, "kernel": "Linux", "hostname": "h", "bootS": 1.5}
    assert proto.receive_data(line(good)) == [
        Reply(rid, True, {k: v for k, v in good.items() if k not in ("id", "ok")}, None)
    ]


@pytest.mark.parametrize(
    "override",
    [
        {"exitCode": "0"},
        {"exitCode": True},
        {"timedOut": 0},
        {"truncated": {"stdout": False}},
        {"truncated": []},
        {"durationMs": 1.5},
    ],
)
def test_malformed_exec_reply_fails_the_request_and_counts_as_garbage(
    override: dict[str, Any],
) -> None:
    proto = GuestProtocol()
    rid, _ = proto.send_request("exec", argv=["true"])
    events = proto.receive_data(line(exec_reply(rid, **override)))
    assert isinstance(events[0], Garbage)
    assert isinstance(events[1], Reply) and not events[1].ok
    assert events[1].error is not None and "malformed exec reply" in events[1].error
    assert proto.pending == {} and proto.garbage_lines == 1


@pytest.mark.parametrize(
    "raw",
    [
        b"not json",
        b"\xff\xfe\xfd",
        b"[1, 2, 3]",
        b'"a string"',
        b"{}",
        b'{"id": "1", "ok": true}',
        b'{"id": true, "ok": true}',
        b'{"id": 1}',
        b'{"id": 1, "ok": "yes"}',
        b'{"id": 1, "ok": true}',  # no request 1 is in flight
        b'{"id": 1, "ev": "out", "fd": 1, "data": "aGk="}',  # nor here
        b'{"ev": 5}',
        b'{"ev": "launch_missiles"}',
        b'{"ev": "ready", "proto": "1", "agent": "x", "pid": 1}',
        b'{"ev": "pty_out", "pty": 1, "data": "!!!"}',
        b'{"ev": "error"}',
        b'{"ev": "error", "error": NaN}',
        b"[" * 100_000 + b"]" * 100_000,  # deep nesting: RecursionError inside json
        b'{"id": 1' + b"0" * 5000 + b', "ok": true}',  # an int too long to parse
        b"",
        b"   ",
    ],
)
def test_hostile_lines_are_garbage(raw: bytes) -> None:
    proto = GuestProtocol()
    events = proto.receive_data(raw + b"\n")
    assert len(events) == 1 and isinstance(events[0], Garbage)
    assert events[0].nbytes == len(raw) + 1
    assert proto.garbage_lines == 1 and proto.garbage_bytes == len(raw) + 1


def test_stream_with_bad_base64_or_fd_is_garbage() -> None:
    proto = GuestProtocol()
    rid, _ = proto.send_request("exec", argv=["true"])
    events = proto.receive_data(
        line({"id": rid, "ev": "out", "fd": 1, "data": "***"})
        + line({"id": rid, "ev": "out", "fd": 3, "data": ""})
        + line({"id": rid, "ev": "out", "fd": 1})
        + line({"id": rid, "ev": "progress"})
    )
    assert [type(e) for e in events] == [Garbage] * 4
    assert proto.pending == {rid: "exec"}  # still waiting for the real reply


def test_overlong_line_is_dropped_and_reported_once() -> None:
    proto = GuestProtocol(max_line=64)
    rid, _ = proto.send_request("ping")
    events = []
    for _ in range(10):  # 1000 bytes without a newline, in pieces
        events += proto.receive_data(b"x" * 100)
    events += proto.receive_data(b"tail\n" + line({"id": rid, "ok": True}))
    assert events == [Garbage(65, "line longer than 64 bytes"), Reply(rid, True, {}, None)]
    assert proto.garbage_lines == 1 and proto.garbage_bytes == 1005


def test_a_line_exactly_at_the_cap_is_fine() -> None:
    proto = GuestProtocol(max_line=64)
    msg = json.dumps({"ev": "error", "error": ""})
    msg = msg[:-1] + " " * (64 - len(msg)) + msg[-1:]
    assert len(msg) == 64
    assert proto.receive_data(msg.encode() + b"\n") == [AgentError("")]
    assert proto.receive_data(msg.encode()[:-1] + b" }\n")[0] == Garbage(65, "line longer than 64 bytes")


def test_lone_surrogates_are_made_safe() -> None:
    proto = GuestProtocol()
    (event,) = proto.receive_data(b'{"ev": "error", "error": "x\\ud800y"}\n')
    assert isinstance(event, AgentError)
    event.text.encode("utf-8")  # must not raise


def test_agent_restart_fails_in_flight_requests_and_ptys() -> None:
    proto = GuestProtocol()
    proto.receive_data(line({"ev": "ready", "proto": 1, "agent": "a", "pid": 10}))
    rid_pty, _ = proto.send_request("pty_open")
    proto.receive_data(line({"id": rid_pty, "ok": True, "pty": 3}))
    rid, _ = proto.send_request("exec", argv=["sleep", "9"])
    # The same pid again is a duplicate, not a restart.
    assert proto.receive_data(line({"ev": "ready", "proto": 1, "agent": "a", "pid": 10})) == [
        Ready(1, "a", 10)
    ]
    events = proto.receive_data(line({"ev": "ready", "proto": 1, "agent": "a", "pid": 11}))
    assert events == [
        Ready(1, "a", 11),
        Reply(rid, False, {}, "guest agent restarted"),
        PtyExit(3, None, None),
    ]
    assert proto.pending == {} and proto.ptys == set()
    # The new agent may still answer a request that sat in the port: dropped quietly.
    assert proto.receive_data(line(exec_reply(rid))) == []
    assert proto.late_messages == 1 and proto.garbage_lines == 0


def test_abandoned_requests_drop_late_answers_quietly() -> None:
    proto = GuestProtocol()
    rid, _ = proto.send_request("exec", argv=["sleep", "9"])
    proto.abandon(rid)
    events = proto.receive_data(line({"id": rid, "ev": "out", "fd": 1, "data": ""}) + line(exec_reply(rid)))
    assert events == []
    assert proto.late_messages == 2 and proto.garbage_lines == 0
    # After the final reply the id is forgotten: a second reply is garbage.
    assert isinstance(proto.receive_data(line(exec_reply(rid)))[0], Garbage)


# --------------------------------------------------------------------------
# properties: never raises, resynchronises, chunking does not matter

json_scalars = st.none() | st.booleans() | st.integers() | st.floats() | st.text(max_size=20)
json_values = st.recursive(
    json_scalars,
    lambda kids: st.lists(kids, max_size=4) | st.dictionaries(st.text(max_size=8), kids, max_size=4),
    max_leaves=12,
)
keys = st.sampled_from(
    ["id", "ok", "ev", "error", "pty", "data", "fd", "exitCode", "signal", "proto", "pid", "agent"]
)
hostile_objects = st.dictionaries(
    keys,
    json_values
    | st.sampled_from(["out", "ready", "pty_out", "pty_exit", "error", "aGk=", "!!"])
    | st.integers(min_value=0, max_value=4),
    max_size=8,
)
hostile_lines = (
    st.binary(max_size=200)
    | hostile_objects.map(lambda o: json.dumps(o).encode())
    | json_values.map(lambda v: json.dumps(v).encode())
)


def _primed() -> GuestProtocol:
    """A protocol with requests and a pty in flight, so state checks get exercised."""
    proto = GuestProtocol(max_line=256)
    proto.send_request("exec", argv=["x"])  # id 1
    proto.send_request("pty_open")  # id 2
    proto.send_request("hello", time=0)  # id 3
    return proto


@settings(suppress_health_check=[HealthCheck.too_slow], max_examples=300)
@given(data=st.binary(max_size=2000), cuts=st.lists(st.integers(min_value=0), max_size=20))
def test_receive_data_never_raises_on_arbitrary_bytes(data: bytes, cuts: list[int]) -> None:
    proto = _primed()
    events = feed_chunked(proto, data, cuts)
    assert all(isinstance(e, EVENT_TYPES) for e in events)


@settings(suppress_health_check=[HealthCheck.too_slow], max_examples=300)
@given(lines=st.lists(hostile_lines, max_size=12), cuts=st.lists(st.integers(min_value=0)))
def test_chunking_never_changes_the_outcome(lines: list[bytes], cuts: list[int]) -> None:
    data = b"\n".join(lines) + b"\n"
    whole, pieces = _primed(), _primed()
    expected = whole.receive_data(data)
    got = feed_chunked(pieces, data, cuts)
    assert got == expected
    assert all(isinstance(e, EVENT_TYPES) for e in got)
    assert (pieces.garbage_lines, pieces.garbage_bytes, pieces.lines) == (
        whole.garbage_lines,
        whole.garbage_bytes,
        whole.lines,
    )
    assert pieces.pending == whole.pending and pieces.ptys == whole.ptys


@settings(suppress_health_check=[HealthCheck.too_slow], max_examples=300)
@given(
    garbage=st.binary(max_size=3000) | st.lists(hostile_lines, max_size=6).map(b"\n".join),
    cuts=st.lists(st.integers(min_value=0), max_size=10),
)
def test_a_valid_reply_after_garbage_is_still_parsed(garbage: bytes, cuts: list[int]) -> None:
    proto = GuestProtocol(max_line=256)
    feed_chunked(proto, garbage, cuts)
    rid, _ = proto.send_request("ping")
    tail = b"\n" + line({"id": rid, "ok": True})
    events = feed_chunked(proto, tail, cuts)
    assert events[-1] == Reply(rid, True, {}, None)
    assert proto.pending == {}
