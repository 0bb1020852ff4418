"""The host end of the guest-agent channel, on Trio.

The guest is hostile. Everything it sends goes through the sans-I/O
:class:`rigd.protocols.guest.GuestProtocol`, which caps each line and turns
garbage into ``Garbage`` events instead of exceptions. On top of that this
connection:

- puts a deadline on every reply (a silent guest costs a timeout, not a hang);
- caps what it keeps of streamed output per request, whatever the guest
  claims (bytes past the cap are read and dropped);
- routes replies only to requests it actually has in flight — a reply or
  stream event for an unknown id is dropped;
- never acts on a path, command or address the guest names.
"""

from __future__ import annotations

import base64
import contextlib
import logging
import math
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass, field
from typing import Any

import trio

from rigd.errors import GuestError, GuestRefused
from rigd.protocols.guest import (
    AgentError,
    Garbage,
    GuestProtocol,
    PtyExit,
    PtyOutput,
    Ready,
    Reply,
    Stream,
)
from rigd.verbs._args import is_int

EARLY_PTY_LIMIT = 256 * 1024


@dataclass(slots=True)
class _Call:
    done: trio.Event
    on_stream: Callable[[Stream], None] | None
    reply: Reply | None = None
    #: Nobody waits for the reply: drop the call when it comes.
    forgotten: bool = False
    #: Called when the reply comes (or the channel closes), after the last stream event.
    on_reply: Callable[[], None] | None = None


class PendingCall:
    """A request already sent (in the caller's order); :meth:`result` waits for its reply.

    Pipelined writes use it: each is sent before the next, so the agent sees
    them in order, while their replies are awaited later.
    """

    def __init__(self, conn: GuestConnection, cid: int, op: str, call: _Call) -> None:
        self._conn = conn
        self.id = cid
        self._op = op
        self._call = call

    async def result(self, timeout: float) -> dict[str, Any]:
        """The reply's body (GuestRefused on ``ok: false``, GuestError on a timeout)."""
        try:
            with trio.move_on_after(timeout):
                await self._call.done.wait()
        except BaseException:
            self._conn._drop(self.id, self._call)
            raise
        return self._conn._finish(self.id, self._op, self._call, timeout)

    @property
    def answered(self) -> bool:
        return self._call.reply is not None

    def forget(self) -> None:
        """Nobody will wait for this reply."""
        if self._call.done.is_set():
            self._conn._calls.pop(self.id, None)
        else:
            self._call.forgotten = True


@dataclass(slots=True)
class _PtyRoute:
    send: trio.MemorySendChannel[bytes]
    exit: dict[str, int | None] | None = None
    dropped: int = 0


@dataclass(slots=True)
class ChannelStats:
    garbage_events: int = 0
    garbage_bytes: int = 0
    orphan_replies: int = 0
    agent_errors: int = 0
    ready_lines: int = 0
    last_garbage: str = ""
    extra: dict[str, int] = field(default_factory=dict)


class GuestConnection:
    """One connection to one guest agent. ``run`` must be running in a nursery."""

    def __init__(self, stream: trio.abc.Stream, *, log: logging.Logger) -> None:
        self._stream = stream
        self._proto = GuestProtocol()
        self._send_lock = trio.Lock()
        self._calls: dict[int, _Call] = {}
        self._ptys: dict[int, _PtyRoute] = {}
        # Output of a pty whose open reply was in the same read as its first
        # output: held (bounded) until the route exists.
        self._early: dict[int, list[bytes]] = {}
        self._early_bytes = 0
        self._closed = trio.Event()
        self._log = log
        self.ready = trio.Event()
        self._ready_tick = trio.Event()
        self.stats = ChannelStats()

    @property
    def closed(self) -> bool:
        return self._closed.is_set()

    async def run(self, *, task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED) -> None:
        task_status.started()
        try:
            while True:
                try:
                    data = await self._stream.receive_some(65536)
                except (trio.BrokenResourceError, trio.ClosedResourceError):
                    data = b""
                if not data:
                    return
                for event in self._proto.receive_data(data):
                    self._dispatch(event)
                # A flooding guest must not starve the rest of the server.
                await trio.lowlevel.checkpoint()
        finally:
            self._closed.set()
            for call in list(self._calls.values()):
                call.done.set()
                if call.on_reply is not None:
                    call.on_reply()
            for route in self._ptys.values():
                route.send.close()

    def _dispatch(self, event: object) -> None:
        if isinstance(event, Reply):
            call = self._calls.get(event.id)
            if call is None or call.done.is_set():
                self.stats.orphan_replies += 1
                return
            call.reply = event
            call.done.set()
            if call.on_reply is not None:
                call.on_reply()
            if call.forgotten:
                del self._calls[event.id]
        elif isinstance(event, Stream):
            call = self._calls.get(event.id)
            if call is None or call.on_stream is None or call.done.is_set():
                self.stats.orphan_replies += 1
                return
            call.on_stream(event)
        elif isinstance(event, PtyOutput):
            route = self._ptys.get(event.pty)
            if route is None:
                if self._early_bytes + len(event.data) <= EARLY_PTY_LIMIT:
                    self._early.setdefault(event.pty, []).append(event.data)
                    self._early_bytes += len(event.data)
                else:
                    self.stats.orphan_replies += 1
                return
            try:
                route.send.send_nowait(event.data)
            except trio.WouldBlock:
                # The reader is slow; a terminal drops output rather than
                # letting a guest grow the server's memory.
                route.dropped += len(event.data)
            except (trio.BrokenResourceError, trio.ClosedResourceError):
                pass
        elif isinstance(event, PtyExit):
            route = self._ptys.get(event.pty)
            if route is not None:
                route.exit = {"exitCode": event.exit_code, "signal": event.signal}
                route.send.close()
        elif isinstance(event, Ready):
            self.stats.ready_lines += 1
            self.ready.set()
            self._ready_tick.set()
            self._ready_tick = trio.Event()
        elif isinstance(event, AgentError):
            self.stats.agent_errors += 1
            self._log.info("guest agent reported an error", extra={"guest_error": event.text[:200]})
        elif isinstance(event, Garbage):
            self.stats.garbage_events += 1
            self.stats.garbage_bytes += event.nbytes
            self.stats.last_garbage = event.reason[:100]

    def ready_tick(self) -> trio.Event:
        """An event set by the *next* ``ready`` line the agent sends."""
        return self._ready_tick

    async def request(
        self,
        op: str,
        *,
        timeout: float,
        on_stream: Callable[[Stream], None] | None = None,
        **fields: Any,
    ) -> dict[str, Any]:
        """Send one request and wait for its final reply, at most ``timeout`` s."""
        pending = await self.send(op, on_stream=on_stream, timeout=timeout, **fields)
        return await pending.result(timeout)

    async def send(
        self,
        op: str,
        *,
        timeout: float,
        on_stream: Callable[[Stream], None] | None = None,
        on_reply: Callable[[], None] | None = None,
        **fields: Any,
    ) -> PendingCall:
        """Send one request (in order with the caller's other sends); its reply comes later."""
        if self.closed:
            raise GuestError(f"guest agent channel is closed ({op})")
        cid, data = self._proto.send_request(op, **fields)
        call = _Call(trio.Event(), on_stream, on_reply=on_reply)
        self._calls[cid] = call
        sent = False
        try:
            with trio.move_on_after(timeout):
                async with self._send_lock:
                    try:
                        await self._stream.send_all(data)
                    except (trio.BrokenResourceError, trio.ClosedResourceError) as exc:
                        raise GuestError(f"guest agent channel is closed ({op})") from exc
                sent = True
        finally:
            if not sent:
                del self._calls[cid]
                self._proto.abandon(cid)
        if not sent:
            raise GuestError(f"guest agent did not take {op} within {math.ceil(timeout)} s")
        return PendingCall(self, cid, op, call)

    def _drop(self, cid: int, call: _Call) -> None:
        self._calls.pop(cid, None)
        if call.reply is None:
            self._proto.abandon(cid)

    def _finish(self, cid: int, op: str, call: _Call, timeout: float) -> dict[str, Any]:
        self._drop(cid, call)
        reply = call.reply
        if reply is None:
            if self.closed:
                raise GuestError(f"guest agent channel closed before answering {op}")
            raise GuestError(f"guest agent did not answer {op} within {math.ceil(timeout)} s")
        if not reply.ok:
            raise GuestRefused(op, (reply.error or "unknown error")[:500])
        return dict(reply.body)

    def open_pty_route(self, pty: int, buffer: int = 256) -> trio.MemoryReceiveChannel[bytes]:
        send, receive = trio.open_memory_channel[bytes](buffer)
        self._ptys[pty] = _PtyRoute(send)
        for chunk in self._early.pop(pty, []):
            self._early_bytes -= len(chunk)
            with contextlib.suppress(trio.WouldBlock):
                send.send_nowait(chunk)
        return receive

    def pty_exit(self, pty: int) -> dict[str, int | None] | None:
        route = self._ptys.get(pty)
        return None if route is None else route.exit

    def drop_pty_route(self, pty: int) -> None:
        route = self._ptys.pop(pty, None)
        if route is not None:
            route.send.close()

    async def aclose(self) -> None:
        with trio.CancelScope(shield=True):
            await self._stream.aclose()


async def iterate(channel: trio.MemoryReceiveChannel[bytes]) -> AsyncIterator[bytes]:
    async with channel:
        async for chunk in channel:
            yield chunk


#: A still larger than this from the guest is refused (a 2560x1600 PNG is ~6 MB).
MAX_STILL_BYTES = 32 << 20


@dataclass(frozen=True, slots=True)
class AgentScreen:
    """An agent's ``screen`` answer, its sizes checked: the encoded image and what it shows."""

    data: bytes
    display_w: int
    display_h: int
    image_w: int
    image_h: int
    scale: float
    cursor: tuple[int, int] | None
    cursor_marked: bool


async def request_screen(channel: GuestConnection, *, timeout: float, max_w: int, max_h: int,
                         **fields: Any) -> AgentScreen:
    """One ``screen`` request (docs/guest-protocol.md), the image inline or streamed; the
    reply's sizes, scale and byte count are checked (a guest is hostile), else GuestError."""
    parts: list[bytes] = []
    size = [0]

    def on_stream(event: Stream) -> None:
        if event.name != "data" or event.body.get("offset") != size[0]:
            return
        if size[0] + len(event.data) <= MAX_STILL_BYTES:
            parts.append(event.data)
            size[0] += len(event.data)

    body = await channel.request("screen", timeout=timeout, on_stream=on_stream, maxWidth=max_w,
                                 maxHeight=max_h, **fields)
    if isinstance(body.get("data"), str):
        try:
            data = base64.b64decode(body["data"], validate=True)
        except ValueError as exc:
            raise GuestError("the agent's screen data is not base64") from exc
    else:
        data = b"".join(parts)
    dw, dh, iw, ih = (body.get(k) for k in ("displayWidth", "displayHeight", "imageWidth", "imageHeight"))
    scale = body.get("scale")
    if not (is_int(dw) and is_int(dh) and is_int(iw) and is_int(ih)
            and 0 < iw <= max_w and 0 < ih <= max_h and 0 < dw <= 16384 and 0 < dh <= 16384
            and isinstance(scale, int | float) and 0 < scale < 1000):
        raise GuestError("the agent's screen reply has no valid sizes")
    if body.get("bytes") != len(data) or not data:
        raise GuestError("the agent's screen data is incomplete")
    cursor = body.get("cursor")
    point = None
    if isinstance(cursor, list) and len(cursor) == 2 and all(is_int(c) for c in cursor):
        point = (int(cursor[0]), int(cursor[1]))
    return AgentScreen(data, dw, dh, iw, ih, float(scale), point, body.get("cursorMarked") is True)
