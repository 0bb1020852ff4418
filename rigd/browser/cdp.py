"""A Trio CDP client around the sans-I/O :class:`rigd.protocols.cdp.CDPProtocol`.

How this works: one :class:`CDPConnection` owns one browser-level DevTools
socket (behind the small :class:`Transport` seam: ``websockets.trio`` for
real, :class:`rigd.browser.fake.FakeTransport` in unit tests). One reader
task parses every message at the edge and routes it: a reply wakes the
command waiting on its ``id`` (and must come back on the session it was sent
on); an event goes to every :class:`Subscription` for its method and
session. One lock serialises sends; a semaphore bounds the commands in
flight; every command has a deadline. Targets are reached in flatten mode:
:meth:`CDPConnection.attach` returns a :class:`CDPSession` bound to one
``sessionId``.

Failure is loud and total: when the socket closes, every pending command
fails with :class:`CDPClosed` naming why, every subscription ends, and later
commands fail at once. A detached session or a crashed renderer fails that
session's commands the same way, and leaves the others alone.
"""

from __future__ import annotations

import contextlib
import logging
from collections import deque
from collections.abc import AsyncIterator, Callable, Iterable, Iterator
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Protocol, TypeVar

import trio

if TYPE_CHECKING:
    from websockets.trio.client import ClientConnection

from rigd.nurseries import beside
from rigd.protocols.cdp import (
    MAX_MESSAGE_CHARS,
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
    WireProtocol,
    read,
)

T = TypeVar("T")

#: A command's deadline unless the caller gives one.
DEFAULT_TIMEOUT_S = 10.0
#: Commands awaiting replies at once; more wait (within their deadline).
MAX_IN_FLIGHT = 32
#: Events a subscription keeps before it drops the oldest.
DEFAULT_BUFFER = 256
#: Protocol violations tolerated before the connection is declared broken.
MAX_VIOLATIONS = 16


class TransportClosed(Exception):
    """The transport is gone; ``str(exc)`` says why (close code and reason)."""


class Transport(Protocol):
    """One WebSocket, text messages both ways."""

    async def send(self, text: str) -> None: ...

    async def receive(self) -> str | bytes:
        """The next message; raises :class:`TransportClosed` when the socket is gone."""
        ...

    async def aclose(self) -> None: ...


@dataclass(slots=True)
class _Pending:
    method: str
    session_id: str | None
    done: trio.Event = field(default_factory=trio.Event)
    result: dict[str, Any] | None = None
    error: Exception | None = None
    sent: bool = False


class Subscription:
    """Events of some methods on one session, buffered up to ``limit``.

    The reader task never blocks on a subscriber: past ``limit`` the oldest
    event is dropped and counted in :attr:`dropped`.
    """

    def __init__(self, methods: frozenset[str], session_id: str | None, limit: int) -> None:
        self.methods = methods
        self.session_id = session_id
        self.limit = limit
        self.dropped = 0
        self._events: deque[Event] = deque()
        self._lot = trio.lowlevel.ParkingLot()
        self._closed: str | None = None

    def _push(self, event: Event) -> None:
        if len(self._events) >= self.limit:
            self._events.popleft()
            self.dropped += 1
        self._events.append(event)
        self._lot.unpark_all()

    def _close(self, reason: str) -> None:
        if self._closed is None:
            self._closed = reason
        self._lot.unpark_all()

    def drain(self) -> list[Event]:
        """Every buffered event, oldest first, without waiting."""
        out = list(self._events)
        self._events.clear()
        return out

    async def receive(self) -> Event:
        """The next event; raises :class:`CDPClosed` once the connection or session ends."""
        while not self._events:
            if self._closed is not None:
                raise CDPClosed(self._closed)
            await self._lot.park()
        return self._events.popleft()

    async def wait_for(self, match: Callable[[Event], bool], timeout: float) -> Event | None:
        """The first event ``match`` accepts within ``timeout`` seconds, else ``None``."""
        with trio.move_on_after(timeout):
            while True:
                event = await self.receive()
                if match(event):
                    return event
        return None


class CDPConnection:
    """One browser DevTools connection. Start :meth:`run` in a nursery (or use
    :func:`open_cdp`); then :meth:`send`, :meth:`call`, :meth:`subscribe`, :meth:`attach`."""

    def __init__(self, transport: Transport, *, log: logging.Logger | None = None,
                 max_in_flight: int = MAX_IN_FLIGHT, default_timeout: float = DEFAULT_TIMEOUT_S,
                 max_message_chars: int = MAX_MESSAGE_CHARS,
                 protocol: WireProtocol | None = None) -> None:
        self._transport = transport
        self._proto = protocol or CDPProtocol(max_message_chars=max_message_chars)
        self._send_lock = trio.Lock()
        self._slots = trio.Semaphore(max_in_flight)
        self._max_in_flight = max_in_flight
        self._pending: dict[int, _Pending] = {}
        self._subs: list[Subscription] = []
        self._dead_sessions: dict[str, str] = {}
        self._closed: str | None = None
        #: Set (and replaced) whenever the connection or a session ends: :meth:`wait_ended`.
        self._end_tick = trio.Event()
        self._log = log or logging.getLogger("rigd.browser.cdp")
        self.default_timeout = default_timeout
        self.violations = 0
        self.unmatched_replies = 0

    @property
    def closed(self) -> str | None:
        """Why the connection ended, or ``None`` while it is up."""
        return self._closed

    # -- the reader --------------------------------------------------------------------------

    async def run(self, *, task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED) -> None:
        """Read and route until the socket closes, then fail everything pending."""
        task_status.started()
        reason = "the DevTools connection was closed"
        try:
            while True:
                try:
                    data = await self._transport.receive()
                except TransportClosed as exc:
                    reason = f"the browser closed the DevTools connection ({exc})"
                    return
                self._dispatch(self._proto.parse(data))
                if self.violations > MAX_VIOLATIONS:
                    reason = (f"the browser broke the DevTools protocol {self.violations} times; "
                              "the connection was dropped")
                    with trio.CancelScope(shield=True):
                        await self._transport.aclose()
                    return
        finally:
            self._shut(reason)

    def _tick(self) -> None:
        self._end_tick.set()
        self._end_tick = trio.Event()

    async def wait_ended(self, session_id: str | None = None) -> str:
        """Wait until the connection closes (or, with ``session_id``, that session
        ends: detached, renderer crashed); return why."""
        while True:
            if self._closed is not None:
                return self._closed
            if session_id is not None and session_id in self._dead_sessions:
                return self._dead_sessions[session_id]
            await self._end_tick.wait()

    def _shut(self, reason: str) -> None:
        if self._closed is None:
            self._closed = reason
            self._tick()
        for pending in self._pending.values():
            if not pending.done.is_set():
                pending.error = CDPClosed(f"{pending.method}: {self._closed}")
                pending.done.set()
        for sub in self._subs:
            sub._close(self._closed)

    def _dispatch(self, msg: Reply | ErrorReply | Event | ProtocolViolation) -> None:
        if isinstance(msg, ProtocolViolation):
            self.violations += 1
            self._log.warning("cdp protocol violation", extra={"reason": msg.reason[:200]})
            return
        if isinstance(msg, Event):
            self._event(msg)
            return
        pending = self._pending.get(msg.id)
        if pending is None or pending.done.is_set():
            self.unmatched_replies += 1  # a reply after its command timed out, or made up
            return
        if msg.session_id != pending.session_id:
            self.violations += 1
            pending.error = CDPProtocolError(
                f"{pending.method}: the reply to id={msg.id} came back on another session"
            )
        elif isinstance(msg, ErrorReply):
            pending.error = CDPCommandFailed(pending.method, msg.code, msg.message)
        else:
            pending.result = msg.result
        pending.done.set()

    def _event(self, event: Event) -> None:
        if event.method == "Target.detachedFromTarget" and event.session_id is None:
            sid = event.params.get("sessionId")
            if isinstance(sid, str):
                self._end_session(sid, "the page's DevTools session ended (target detached)")
        elif event.method == "Inspector.targetCrashed" and event.session_id is not None:
            self._end_session(event.session_id, "the page's renderer crashed")
        for sub in self._subs:
            if event.session_id == sub.session_id and event.method in sub.methods:
                sub._push(event)

    def _end_session(self, session_id: str, reason: str) -> None:
        if session_id in self._dead_sessions or len(self._dead_sessions) > 4096:
            return
        self._dead_sessions[session_id] = reason
        self._tick()
        for pending in self._pending.values():
            if pending.session_id == session_id and not pending.done.is_set():
                pending.error = CDPClosed(f"{pending.method}: {reason}")
                pending.done.set()
        for sub in self._subs:
            if sub.session_id == session_id:
                sub._close(reason)

    # -- commands ----------------------------------------------------------------------------

    async def send(self, method: str, params: dict[str, Any] | None = None, *,
                   session_id: str | None = None, timeout: float | None = None) -> dict[str, Any]:
        """Send one command and return its ``result`` object (checked to be an object,
        nothing more: read it with :meth:`call` or :func:`rigd.protocols.cdp.read`)."""
        deadline = self.default_timeout if timeout is None else timeout
        self._check_open(method, session_id)
        pending = _Pending(method, session_id)
        with trio.move_on_after(deadline) as scope:
            async with self._slots:
                self._check_open(method, session_id)
                cid, text = self._proto.command(method, params, session_id)
                self._pending[cid] = pending
                try:
                    async with self._send_lock:
                        try:
                            await self._transport.send(text)
                            pending.sent = True
                        except TransportClosed as exc:
                            raise CDPClosed(f"{method}: the browser closed the DevTools "
                                            f"connection ({exc})") from exc
                    await pending.done.wait()
                finally:
                    del self._pending[cid]
        if scope.cancelled_caught and not pending.done.is_set():
            if not pending.sent:
                raise CDPTimeout(f"{method}: not sent within {deadline:g} s (every one of the "
                                 f"{self._max_in_flight} in-flight slots stayed busy)")
            raise CDPTimeout(f"{method}: no answer from the browser within {deadline:g} s")
        if pending.error is not None:
            raise pending.error
        assert pending.result is not None
        return pending.result

    async def call(self, method: str, params: dict[str, Any] | None, parse: Callable[[Fields], T], *,
                   session_id: str | None = None, timeout: float | None = None) -> T:
        """:meth:`send`, then read the reply into a typed value with ``parse``."""
        result = await self.send(method, params, session_id=session_id, timeout=timeout)
        return read(result, method, parse)

    def _check_open(self, method: str, session_id: str | None) -> None:
        if self._closed is not None:
            raise CDPClosed(f"{method}: {self._closed}")
        if session_id is not None and session_id in self._dead_sessions:
            raise CDPClosed(f"{method}: {self._dead_sessions[session_id]}")

    @contextlib.contextmanager
    def subscribe(self, methods: Iterable[str], *, session_id: str | None = None,
                  limit: int = DEFAULT_BUFFER) -> Iterator[Subscription]:
        """Buffer events of ``methods`` on ``session_id`` while the block runs."""
        sub = Subscription(frozenset(methods), session_id, limit)
        if self._closed is not None:
            sub._close(self._closed)
        elif session_id is not None and session_id in self._dead_sessions:
            sub._close(self._dead_sessions[session_id])
        self._subs.append(sub)
        try:
            yield sub
        finally:
            self._subs.remove(sub)

    def open_subscription(self, methods: Iterable[str], *, session_id: str | None = None,
                          limit: int = DEFAULT_BUFFER) -> Subscription:
        """A subscription that lives until :meth:`unsubscribe` (e.g. a console buffer)."""
        sub = Subscription(frozenset(methods), session_id, limit)
        if self._closed is not None:
            sub._close(self._closed)
        self._subs.append(sub)
        return sub

    def unsubscribe(self, sub: Subscription) -> None:
        """End a subscription from :meth:`open_subscription` (idempotent)."""
        if sub in self._subs:
            self._subs.remove(sub)
        sub._close("the subscription was ended")

    async def attach(self, target_id: str, *, timeout: float | None = None) -> CDPSession:
        """Attach to a target in flatten mode and return its session."""
        sid = await self.call("Target.attachToTarget", {"targetId": target_id, "flatten": True},
                              lambda f: f.string("sessionId", 128), timeout=timeout)
        return CDPSession(self, sid)

    async def aclose(self) -> None:
        self._shut("the DevTools connection was closed by rigd")
        with trio.CancelScope(shield=True):
            await self._transport.aclose()


@dataclass(frozen=True, slots=True)
class CDPSession:
    """The commands and events of one attached target."""

    conn: CDPConnection
    session_id: str

    async def send(self, method: str, params: dict[str, Any] | None = None, *,
                   timeout: float | None = None) -> dict[str, Any]:
        return await self.conn.send(method, params, session_id=self.session_id, timeout=timeout)

    async def call(self, method: str, params: dict[str, Any] | None, parse: Callable[[Fields], T], *,
                   timeout: float | None = None) -> T:
        return await self.conn.call(method, params, parse, session_id=self.session_id, timeout=timeout)

    def subscribe(self, methods: Iterable[str], *,
                  limit: int = DEFAULT_BUFFER) -> contextlib.AbstractContextManager[Subscription]:
        return self.conn.subscribe(methods, session_id=self.session_id, limit=limit)

    def open_subscription(self, methods: Iterable[str], *, limit: int = DEFAULT_BUFFER) -> Subscription:
        return self.conn.open_subscription(methods, session_id=self.session_id, limit=limit)


# -- the real transport --------------------------------------------------------------------------

class WebSocketTransport:
    """A ``websockets.trio`` client connection as a :class:`Transport`."""

    def __init__(self, ws: ClientConnection) -> None:
        self._ws = ws

    async def send(self, text: str) -> None:
        from websockets.exceptions import ConnectionClosed

        try:
            await self._ws.send(text)
        except ConnectionClosed as exc:
            raise TransportClosed(_closed_why(exc)) from exc

    async def receive(self) -> str | bytes:
        from websockets.exceptions import ConnectionClosed

        try:
            data: str | bytes = await self._ws.recv()
        except ConnectionClosed as exc:
            raise TransportClosed(_closed_why(exc)) from exc
        return data

    async def aclose(self) -> None:
        with trio.CancelScope(shield=True), trio.move_on_after(2):
            await self._ws.aclose()


def _closed_why(exc: Exception) -> str:
    rcvd = getattr(exc, "rcvd", None)
    sent = getattr(exc, "sent", None)
    frame = rcvd or sent
    if frame is None:
        return "no close frame: the socket dropped"
    code = getattr(frame, "code", None)
    if code == 1009:
        return "close 1009: a message was over the size cap"
    why = str(getattr(frame, "reason", ""))[:120]
    return f"close {code}" + (f": {why}" if why else "")


@contextlib.asynccontextmanager
async def open_cdp(ws_url: str, *, log: logging.Logger | None = None,
                   max_message_chars: int = MAX_MESSAGE_CHARS, open_timeout: float = 10.0,
                   default_timeout: float = DEFAULT_TIMEOUT_S,
                   max_in_flight: int = MAX_IN_FLIGHT,
                   stream: trio.abc.Stream | None = None,
                   protocol: WireProtocol | None = None) -> AsyncIterator[CDPConnection]:
    """Connect to a browser's DevTools WebSocket (``ws://host:port/devtools/browser/<id>``).

    With ``stream`` the WebSocket runs over that already-connected byte stream
    (a browser rig's DevTools port into its guest); the URL then only names the
    ``Host`` header and the path. With ``protocol`` (a
    :class:`rigd.protocols.bidi.BiDiProtocol`) the same connection speaks
    WebDriver BiDi (Firefox's remote agent at ``/session``).

    No proxy from the environment is ever used (the socket is rigd's relay into
    the guest), no compression (a hostile peer's inflated sizes are what the cap
    counts), and no keepalive pings (every command has its own deadline).
    """
    from websockets.exceptions import InvalidHandshake, InvalidURI
    from websockets.trio.client import connect

    try:
        ws_cm = connect(ws_url, proxy=None, compression=None, ping_interval=None,
                        open_timeout=open_timeout, max_size=max_message_chars,
                        max_queue=64, user_agent_header=None, stream=stream)
        ws = await ws_cm.__aenter__()
    except (OSError, TimeoutError, InvalidHandshake, InvalidURI) as exc:
        raise CDPClosed(f"cannot open the DevTools WebSocket: {exc}"[:300]) from exc
    async with contextlib.AsyncExitStack() as stack:
        # The websockets context manager owns a nursery of its own: it must be
        # exited in the same cancel-scope context it was entered in.
        stack.push_async_exit(ws_cm)
        conn = CDPConnection(WebSocketTransport(ws), log=log, max_message_chars=max_message_chars,
                             default_timeout=default_timeout, max_in_flight=max_in_flight,
                             protocol=protocol)
        async with beside(conn.run):
            try:
                yield conn
            finally:
                await conn.aclose()

__all__ = [
    "CDPConnection", "CDPSession", "Subscription", "Transport", "TransportClosed",
    "WebSocketTransport", "open_cdp",
]
