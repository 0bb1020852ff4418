"""Writing WebSockets from many tasks, and the bound on in-flight requests
(rigd.server.wsio, rigd.server.rpc.refusal) over fake transports: no sockets."""

from __future__ import annotations

import itertools
import json
import math
from typing import Any

import pytest
import trio
import trio.testing

from rigd.errors import TooManyRequests
from rigd.server.rpc import refusal
from rigd.server.wsio import LockedSender, Message, serve_requests

pytestmark = pytest.mark.timeout(20)


async def test_a_header_and_its_bytes_are_never_split() -> None:
    wire: list[Message] = []

    async def transport(message: Message) -> None:
        # A real socket write yields to the scheduler (trio's send_all does).
        await trio.lowlevel.checkpoint()
        wire.append(message)
        await trio.lowlevel.checkpoint()

    out = LockedSender(transport)

    async def frames() -> None:
        for n in range(200):
            await out.send_json({"type": "frame", "seq": n, "bytes": n + 1}, bytes(n + 1))

    async def pongs() -> None:
        for _ in range(1000):
            await out.send_json({"type": "pong"})

    async with trio.open_nursery() as nursery:
        nursery.start_soon(frames)
        nursery.start_soon(pongs)
    headers = 0
    for i, message in enumerate(wire):
        if isinstance(message, bytes):
            header = json.loads(wire[i - 1])
            assert header["type"] == "frame" and header["bytes"] == len(message), (i, header)
        elif json.loads(message)["type"] == "frame":
            headers += 1
    assert headers == 200 and sum(isinstance(m, bytes) for m in wire) == 200
    # The two writers did interleave (between pairs): the lock is what kept them apart.
    kinds = [json.loads(m)["type"] for m in wire if isinstance(m, str)]
    assert any(a != b for a, b in itertools.pairwise(kinds)) and kinds.count("pong") == 1000


def request(rid: int) -> str:
    return json.dumps({"jsonrpc": "2.0", "id": rid, "method": "slow"})


class Client:
    """A client that sends ``count`` requests at once; ``reading`` says whether
    the server's writes to it complete."""

    def __init__(self, count: int, *, reading: bool) -> None:
        self.outbox, self.inbox = trio.open_memory_channel[Message](math.inf)
        for i in range(count):
            self.outbox.send_nowait(request(i))
        self.received = 0
        self.replies: list[dict[str, Any]] = []
        self.reading = trio.Event()
        if reading:
            self.reading.set()

    @property
    def unsent(self) -> int:
        return self.inbox.statistics().current_buffer_used

    async def receive(self) -> Message:
        message = await self.inbox.receive()
        self.received += 1
        return message

    async def send(self, reply: Any) -> None:
        await self.reading.wait()
        self.replies.append(reply)


async def test_past_the_bound_a_request_is_refused_and_never_started() -> None:
    client = Client(10_000, reading=True)
    started: list[Message] = []
    finish = trio.Event()

    async def answer(message: Message) -> Any:
        started.append(message)
        await finish.wait()
        return {"jsonrpc": "2.0", "id": json.loads(message)["id"], "result": "done"}

    too_many = TooManyRequests(64)
    async with trio.open_nursery() as nursery:
        nursery.start_soon(lambda: serve_requests(nursery, client.receive, answer,
                                                  lambda m: refusal(m, too_many), client.send, limit=64))
        await trio.testing.wait_all_tasks_blocked()
        assert len(started) == 64 and not client.unsent
        refused = [r for r in client.replies if "error" in r]
        assert len(refused) == 10_000 - 64
        assert {r["id"] for r in refused} == set(range(64, 10_000))
        err = refused[0]["error"]
        assert err["code"] == -32029 and "64" in err["message"] and err["data"]["limit"] == 64
        # Once answers are written, slots free up and new requests run.
        finish.set()
        await trio.testing.wait_all_tasks_blocked()
        assert sorted(r["id"] for r in client.replies if "result" in r) == list(range(64))
        client.outbox.send_nowait(request(10_000))
        await trio.testing.wait_all_tasks_blocked()
        assert client.replies[-1] == {"jsonrpc": "2.0", "id": 10_000, "result": "done"}
        nursery.cancel_scope.cancel()


async def test_a_client_that_does_not_read_stops_being_read() -> None:
    client = Client(10_000, reading=False)
    started = 0

    async def answer(message: Message) -> Any:
        nonlocal started
        started += 1
        return {"jsonrpc": "2.0", "id": json.loads(message)["id"], "result": None}

    too_many = TooManyRequests(64)
    async with trio.open_nursery() as nursery:
        nursery.start_soon(lambda: serve_requests(nursery, client.receive, answer,
                                                  lambda m: refusal(m, too_many), client.send, limit=64))
        await trio.testing.wait_all_tasks_blocked()
        # 64 answers wait to be written, the 65th message's refusal too; the
        # rest stay with the client (its writes would stall on TCP).
        assert started == 64 and client.received == 65 and not client.replies
        client.reading.set()
        await trio.testing.wait_all_tasks_blocked()
        assert not client.unsent and len(client.replies) == 10_000
        nursery.cancel_scope.cancel()


@pytest.mark.parametrize(
    ("body", "expected"),
    [
        ('{"jsonrpc": "2.0", "id": "a", "method": "x"}', {"id": "a"}),
        ('{"jsonrpc": "2.0", "method": "x"}', None),
        ('[{"jsonrpc": "2.0", "id": 1, "method": "x"}, {"jsonrpc": "2.0", "method": "x"}, 5]',
         [{"id": 1}, {"id": None}]),
        ('[{"jsonrpc": "2.0", "method": "x"}]', None),
        ("not json", {"id": None}),
        ('{"jsonrpc": "2.0", "id": true, "method": "x"}', {"id": None}),
    ],
)
def test_a_refusal_answers_each_request_under_its_id(body: str, expected: Any) -> None:
    got = refusal(body, TooManyRequests(64))
    if expected is None:
        assert got is None
        return
    for reply in got if isinstance(got, list) else [got]:
        assert reply["jsonrpc"] == "2.0" and reply["error"]["data"]["limit"] == 64
    strip = [{"id": r["id"]} for r in got] if isinstance(got, list) else {"id": got["id"]}
    assert strip == expected
