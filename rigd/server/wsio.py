"""Writing WebSockets from more than one task, and a bound on the requests one socket has open.

How this works: quart's ``websocket.send`` writes one message, and two tasks
that write the same socket interleave at message granularity. Every socket
the server writes from more than one task (the RPC WebSocket's replies and
notifications, the live view's frames and pongs, the PTY's output and
errors) writes through one :class:`LockedSender`; a message that travels as
two WebSocket messages (the live view's JSON header and then its image) is
written under one acquisition of the lock, so nothing lands between them.

Nothing queues writes but the writers themselves: hypercorn writes to the
socket inline (``send_all``, shielded), so a client that stops reading stalls
the task that writes to it, and every task waiting for the lock behind it.
:func:`serve_requests` keeps the tasks of an RPC socket to ``limit``: a
request holds its slot until its reply is written, so a client that never
reads holds at most ``limit`` replies in the server. Past the bound a request
is answered at once with an error and no work starts for it; when even that
answer cannot be written, the reader waits, stops reading, and the client's
own writes stall (TCP back-pressure; see ``docs/decisions.md``).
"""

from __future__ import annotations

import json
from collections.abc import Awaitable, Callable
from typing import Any

import trio

Message = str | bytes


class LockedSender:
    """The one way to write a WebSocket that more than one task writes.

    ``send`` is the transport's own write of one message (``websocket.send``).
    """

    def __init__(self, send: Callable[[Message], Awaitable[None]]) -> None:
        self._send = send
        self._lock = trio.Lock()

    async def send(self, *messages: Message) -> None:
        """Write ``messages`` in order, with nothing from another task between them."""
        async with self._lock:
            for message in messages:
                await self._send(message)

    async def send_json(self, payload: Any, data: bytes | None = None) -> None:
        """Write ``payload`` as a JSON text message, then (if given) ``data`` as the
        binary message it describes, under one acquisition of the lock."""
        text = json.dumps(payload)
        await (self.send(text) if data is None else self.send(text, data))


async def serve_requests(
    nursery: trio.Nursery,
    receive: Callable[[], Awaitable[Message]],
    answer: Callable[[Message], Awaitable[Any]],
    refuse: Callable[[Message], Any],
    send: Callable[[Any], Awaitable[None]],
    *,
    limit: int,
) -> None:
    """Read messages until the socket ends; answer each in a task of ``nursery``,
    at most ``limit`` at once.

    ``answer`` turns a message into its reply (``None``: no reply); ``send``
    writes a reply. A message that arrives while ``limit`` are in flight (a
    request is in flight until its reply is written) gets ``refuse(message)``
    instead, written from the reading task, and ``answer`` never sees it.
    """
    in_flight = 0

    async def one(message: Message) -> None:
        nonlocal in_flight
        try:
            reply = await answer(message)
            if reply is not None:
                await send(reply)
        finally:
            in_flight -= 1

    while True:
        message = await receive()
        if in_flight >= limit:
            refusal = refuse(message)
            if refusal is not None:
                await send(refusal)
            continue
        in_flight += 1
        nursery.start_soon(one, message)


__all__ = ["LockedSender", "Message", "serve_requests"]
