from __future__ import annotations

import json

from hypothesis import given
from hypothesis import strategies as st

from rigd.protocols.qmp import Error, Greeting, ProtocolViolation, QMPEvent, QMPProtocol, Return


def test_greeting_command_return_event() -> None:
    p = QMPProtocol()
    msgs = p.receive_data(b'{"QMP": {"version": {"qemu": {"major": 7}}, "capabilities": []}}\r\n')
    assert isinstance(msgs[0], Greeting)
    cid, data = p.command("query-status")
    assert json.loads(data) == {"execute": "query-status", "id": cid}
    msgs = p.receive_data(
        b'{"return": {"status": "running"}, "id": %d}\r\n{"event": "STOP", "data": {}, '
        b'"timestamp": {"seconds": 1, "microseconds": 500000}}\n' % cid
    )
    assert msgs == [Return(cid, {"status": "running"}), QMPEvent("STOP", {}, 1.5)]


def test_error_and_split_lines() -> None:
    p = QMPProtocol()
    assert p.receive_data(b'{"error": {"class": "GenericError", "desc": "no"},') == []
    assert p.receive_data(b' "id": 3}\n') == [Error(3, "GenericError", "no")]


def test_overlong_line_is_dropped_and_stream_resyncs() -> None:
    p = QMPProtocol(max_line=64)
    out = p.receive_data(b"x" * 100)
    assert out == [ProtocolViolation("line too long")]
    out = p.receive_data(b"yyy\n" + b'{"return": {}, "id": 1}\n')
    assert out == [Return(1, {})]


@given(st.lists(st.binary(max_size=200), max_size=10))
def test_never_raises(chunks: list[bytes]) -> None:
    p = QMPProtocol(max_line=128)
    for chunk in chunks:
        p.receive_data(chunk)
