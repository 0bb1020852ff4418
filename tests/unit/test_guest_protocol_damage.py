"""Change notices on the host side: ``damage_watch``'s ``damage`` events.

A guest is hostile: a notice must name a watch in flight, carry 1 to
``MAX_DAMAGE_RECTS`` non-empty rectangles inside the screen it names, and a
cursor that is a point (or null). Anything else is one Garbage and no
notice; a flood costs one bounded parse per line.
"""

from __future__ import annotations

import json
from typing import Any

import pytest

from rigd.protocols.guest import MAX_DAMAGE_RECTS, DamageNotice, Garbage, GuestProtocol, Reply, Stream


def line(obj: Any) -> bytes:
    return json.dumps(obj).encode() + b"\n"


def watching() -> tuple[GuestProtocol, int]:
    proto = GuestProtocol()
    rid, _ = proto.send_request("damage_watch", maxRate=30)
    return proto, rid


def notice(rid: int, **over: Any) -> dict[str, Any]:
    return {"id": rid, "ev": "damage", "rects": [[0, 0, 10, 10], [100, 200, 30, 40]],
            "cursor": [5, 6], "width": 1280, "height": 800, **over}


def test_a_notice_is_parsed_into_typed_rectangles() -> None:
    proto, rid = watching()
    [event] = proto.receive_data(line(notice(rid)))
    assert isinstance(event, Stream) and event.name == "damage" and event.data == b""
    assert event.body["notice"] == DamageNotice(((0, 0, 10, 10), (100, 200, 30, 40)), 1280, 800, (5, 6))


def test_a_cursor_off_screen_or_null_is_no_cursor() -> None:
    proto, rid = watching()
    events = proto.receive_data(line(notice(rid, cursor=None)) + line(notice(rid, cursor=[5000, 1])))
    assert [e.body["notice"].cursor for e in events if isinstance(e, Stream)] == [None, None]


@pytest.mark.parametrize("over", [
    {"rects": []},
    {"rects": [[0, 0, 1, 1]] * (MAX_DAMAGE_RECTS + 1)},
    {"rects": "everything"},
    {"rects": [[0, 0, 10]]},
    {"rects": [[0, 0, 10, 10, 1]]},
    {"rects": [[-1, 0, 10, 10]]},
    {"rects": [[0, 0, 0, 10]]},
    {"rects": [[0, 0, 10, -5]]},
    {"rects": [[1275, 0, 10, 10]]},  # past the right edge
    {"rects": [[0, 795, 10, 10]]},
    {"rects": [[0, 0, 1.5, 10]]},
    {"rects": [[True, 0, 10, 10]]},
    {"rects": [[0, 0, 10 ** 30, 10]]},
    {"width": 0},
    {"width": 100000, "rects": [[0, 0, 90000, 10]]},
    {"height": "800"},
    {"cursor": [1, 2, 3]},
    {"cursor": "here"},
])
def test_a_bad_notice_is_garbage_and_the_watch_goes_on(over: dict[str, Any]) -> None:
    proto, rid = watching()
    bad = notice(rid, **over)
    events = proto.receive_data(line(bad) + line(notice(rid)))
    assert isinstance(events[0], Garbage), events
    assert isinstance(events[1], Stream) and events[1].name == "damage"
    assert rid in proto.pending


def test_notices_for_nobody_are_garbage() -> None:
    proto = GuestProtocol()
    other, _ = proto.send_request("screen")
    [unknown] = proto.receive_data(line(notice(999)))
    [wrong_op] = proto.receive_data(line(notice(other)))
    [no_id] = proto.receive_data(line({k: v for k, v in notice(1).items() if k != "id"}))
    assert all(isinstance(e, Garbage) for e in (unknown, wrong_op, no_id))


def test_a_flood_is_one_bounded_event_per_line() -> None:
    proto, rid = watching()
    flood = line(notice(rid, rects=[[i, i, 1, 1] for i in range(MAX_DAMAGE_RECTS)])) * 5000
    events = proto.receive_data(flood)
    assert len(events) == 5000 and all(isinstance(e, Stream) for e in events)
    assert all(len(e.body["notice"].rects) == MAX_DAMAGE_RECTS for e in events if isinstance(e, Stream))


def test_the_watch_ends_with_a_count_and_stop_answers_a_boolean() -> None:
    proto, rid = watching()
    sid, _ = proto.send_request("damage_stop", watch=rid)
    events = proto.receive_data(line({"id": sid, "ok": True, "stopped": True})
                                + line({"id": rid, "ok": True, "notices": 12}))
    assert events == [Reply(sid, True, {"stopped": True}), Reply(rid, True, {"notices": 12})]
    # after the reply, a late notice is not a notice
    assert not [e for e in proto.receive_data(line(notice(rid))) if isinstance(e, Stream)]


def test_a_malformed_watch_reply_fails_the_watch() -> None:
    proto, rid = watching()
    events = proto.receive_data(line({"id": rid, "ok": True, "notices": -1}))
    assert isinstance(events[0], Garbage) and events[1] == Reply(rid, False, {}, events[1].error)
