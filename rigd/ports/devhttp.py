"""Dev domains (RIGS.md §8): ``name.test`` / ``name.localhost`` → one port of one rig.

The server answers HTTP on its dev port and HTTPS on its dev TLS port (both
loopback only). It reads a request's head (≤ 16 KiB), routes by ``Host``
to the rig that owns the name, and from then on copies bytes both ways over
that rig's port multiplexer, so keep-alive, chunked bodies and WebSocket
upgrades pass through unchanged. A connection stays with the rig its first
request named. TLS ends here, with certificates from the server's own CA
(:mod:`rigd.ports.tls`); the guest sees plain HTTP and never a key.
"""

from __future__ import annotations

import contextlib
import logging
import ssl
from collections.abc import Callable
from dataclasses import dataclass

import trio

from rigd.errors import Conflict, FieldError
from rigd.ports.forwards import RigPorts
from rigd.ports.mux import MuxError, StreamRefused, splice
from rigd.ports.names import dev_name_problem

log = logging.getLogger("rigd.ports")

MAX_HEAD = 16 * 1024
HEAD_TIMEOUT_S = 15.0
TLS_HANDSHAKE_TIMEOUT_S = 10.0
MAX_CONNECTIONS = 512
#: Names one rig may map.
MAX_NAMES_PER_RIG = 32


@dataclass(frozen=True, slots=True)
class Route:
    rig_id: str
    guest_port: int


class DevDomains:
    """Which rig and port each dev name routes to (in memory: a rig's names end with it)."""

    def __init__(self) -> None:
        self._names: dict[str, Route] = {}

    def set(self, rig_id: str, name: str, guest_port: int) -> None:
        problem = dev_name_problem(name)
        if problem is not None:
            raise FieldError("name", problem)
        held = self._names.get(name)
        if held is not None and held.rig_id != rig_id:
            raise FieldError("name", f"{name} is mapped already (to another rig)")
        if held is not None and held.guest_port != guest_port:
            raise FieldError("name", f"{name} is mapped already (to port {held.guest_port} of this "
                                     "rig); unset it first")
        if held is None and len(self.of_rig(rig_id)) >= MAX_NAMES_PER_RIG:
            raise FieldError("name", f"a rig may map at most {MAX_NAMES_PER_RIG} names")
        self._names[name] = Route(rig_id, guest_port)

    def unset(self, rig_id: str, name: str) -> bool:
        held = self._names.get(name)
        if held is None or held.rig_id != rig_id:
            return False
        del self._names[name]
        return True

    def drop_rig(self, rig_id: str) -> None:
        for name in [n for n, r in self._names.items() if r.rig_id == rig_id]:
            del self._names[name]

    def of_rig(self, rig_id: str) -> dict[str, int]:
        return {n: r.guest_port for n, r in sorted(self._names.items()) if r.rig_id == rig_id}

    def ports_of(self, rig_id: str) -> dict[int, list[str]]:
        out: dict[int, list[str]] = {}
        for name, port in self.of_rig(rig_id).items():
            out.setdefault(port, []).append(name)
        return out

    def resolve(self, name: str) -> Route | None:
        return self._names.get(name)


def host_name(head: bytes) -> str | None:
    """The request's ``Host`` (name only, lower case, no port); None if absent, repeated or bad."""
    lines = head.split(b"\r\n")
    hosts = [ln.split(b":", 1)[1].strip() for ln in lines[1:] if ln[:5].lower() == b"host:"]
    if len(hosts) != 1:
        return None
    try:
        host = hosts[0].decode("ascii").lower()
    except UnicodeDecodeError:
        return None
    if host.startswith("["):
        return None
    name = host.rsplit(":", 1)[0] if ":" in host else host
    return name.rstrip(".") or None


def response(status: str, text: str) -> bytes:
    body = (text + "\n").encode()
    return (f"HTTP/1.1 {status}\r\nContent-Type: text/plain; charset=utf-8\r\n"
            f"Content-Length: {len(body)}\r\nConnection: close\r\n\r\n").encode() + body


#: After a refusal, what is read (and dropped) before the connection closes, so the client reads
#: the answer instead of a reset (closing with unread bytes makes the kernel send RST).
DRAIN_BYTES = 1024 * 1024
DRAIN_S = 2.0


async def refuse(stream: trio.abc.Stream, status: str, text: str) -> None:
    """Answer ``status`` and close cleanly: the head's rest is read and dropped first (up to
    :data:`DRAIN_BYTES` or :data:`DRAIN_S`), then the caller closes the stream."""
    await stream.send_all(response(status, text))
    if isinstance(stream, trio.SocketStream):
        with contextlib.suppress(trio.BrokenResourceError, trio.ClosedResourceError, OSError):
            await stream.send_eof()
    drained = 0
    with trio.move_on_after(DRAIN_S):
        while drained < DRAIN_BYTES:
            data = await stream.receive_some(65536)
            if not data:
                break
            drained += len(data)


class DevServer:
    """The dev HTTP and HTTPS listeners, routing by ``Host`` through :class:`DevDomains`."""

    def __init__(self, domains: DevDomains, ports_of: Callable[[str], RigPorts | None],
                 tls: ssl.SSLContext | None) -> None:
        self.domains = domains
        self.ports_of = ports_of
        self.tls = tls
        self.http_port: int | None = None
        self.https_port: int | None = None
        self._connections = 0

    async def run(self, http_port: int, https_port: int | None, host: str = "127.0.0.1", *,
                  task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED) -> None:
        async with trio.open_nursery() as nursery:
            listeners = await trio.open_tcp_listeners(http_port, host=host)
            self.http_port = listeners[0].socket.getsockname()[1]
            nursery.start_soon(self._serve, listeners[0], False)
            if https_port is not None and self.tls is not None:
                tls_listeners = await trio.open_tcp_listeners(https_port, host=host)
                self.https_port = tls_listeners[0].socket.getsockname()[1]
                nursery.start_soon(self._serve, tls_listeners[0], True)
            task_status.started()

    async def _serve(self, listener: trio.SocketListener, tls: bool) -> None:
        async with listener, trio.open_nursery() as nursery:
            while True:
                conn = await listener.accept()
                nursery.start_soon(self._connection, conn, tls)

    async def _connection(self, conn: trio.SocketStream, tls: bool) -> None:
        if self._connections >= MAX_CONNECTIONS:
            await conn.aclose()
            return
        self._connections += 1
        stream: trio.abc.Stream = conn
        try:
            if tls:
                assert self.tls is not None
                stream = trio.SSLStream(conn, self.tls, server_side=True, https_compatible=True)
                with trio.move_on_after(TLS_HANDSHAKE_TIMEOUT_S) as hs:
                    await stream.do_handshake()
                if hs.cancelled_caught:
                    return
            await self._route(stream)
        except (trio.BrokenResourceError, trio.ClosedResourceError, OSError, ssl.SSLError):
            pass  # the client went away or failed its handshake: nothing to route
        finally:
            self._connections -= 1
            with (trio.CancelScope(shield=True),
                  contextlib.suppress(trio.BrokenResourceError, trio.ClosedResourceError, OSError)):
                await stream.aclose()

    async def _route(self, stream: trio.abc.Stream) -> None:
        head = bytearray()
        with trio.move_on_after(HEAD_TIMEOUT_S):
            while b"\r\n\r\n" not in head and len(head) <= MAX_HEAD:
                data = await stream.receive_some(MAX_HEAD + 1)
                if not data:
                    return
                head += data
        end = head.find(b"\r\n\r\n")
        if end < 0 or end + 4 > MAX_HEAD:
            # The head's size, whatever the reads it came in (a head and its body can arrive
            # in one read): at most MAX_HEAD bytes up to and including its blank line.
            if end >= 0 or len(head) > MAX_HEAD:
                await refuse(stream, "431 Request Header Fields Too Large",
                             f"rigd: a request head is at most {MAX_HEAD} bytes")
            else:
                await refuse(stream, "408 Request Timeout", "rigd: the request head did not arrive whole")
            return
        name = host_name(bytes(head[:end]))
        route = self.domains.resolve(name) if name is not None else None
        if route is None:
            await refuse(stream, "404 Not Found", f"rigd: no rig serves {name or 'this host'}"
                                                  " (rig.domain.set maps one)")
            return
        ports = self.ports_of(route.rig_id)
        if ports is None:
            await refuse(stream, "502 Bad Gateway", f"rigd: the rig behind {name} is not running")
            return
        try:
            upstream = await ports.open_stream(route.guest_port)
        except (StreamRefused, MuxError, Conflict) as exc:
            await refuse(stream, "502 Bad Gateway", f"rigd: {name}: {exc}")
            return
        await upstream.send_all(bytes(head))
        await splice(stream, upstream)


__all__ = ["DevDomains", "DevServer", "Route", "host_name", "response"]
