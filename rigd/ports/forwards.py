"""A terminal rig's forwarded ports (RIGS.md §8, docs/ports.md).

:class:`RigPorts` runs for as long as the rig's machine does, inside the
rig's own task (cancelled the moment the rig closes, so its listeners are
gone at once). It starts the guest's multiplexer through the agent, asks it
every ~4 s which TCP ports listen, and keeps a loopback listener per port
(at most 16; the guest's own number when the host has it free, else one
the OS picks). Each accepted connection becomes one stream over the
multiplexer. ``share`` adds a second listener on every interface (an
OS-assigned port) when the operator allows LAN shares.

It is its own failure boundary: a broken multiplexer (a hostile or dying
guest) is logged, said in ``problem``, and retried with a growing pause;
nothing it raises reaches the rig or the server.
"""

from __future__ import annotations

import errno
import logging
import socket
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import trio

from rigd.errors import Conflict, FieldError
from rigd.ports.mux import Listening, MuxClient, MuxError, MuxStream, StreamRefused, splice

log = logging.getLogger("rigd.ports")

POLL_S = 4.0
MAX_FORWARDS = 16
#: Connections held at once through one rig's forwards (the guest caps streams at 256 too).
MAX_CONNECTIONS = 256
#: How long a running mux has to answer hello, and one the host has just started.
HELLO_TIMEOUT_S = 1.5
START_TIMEOUT_S = 12.0
LIST_TIMEOUT_S = 5.0
#: Ports listed as "not forwarded" beyond the 16 (the rest are only counted).
MAX_NOT_FORWARDED_LISTED = 64

#: Guest-side launch of the mux: the tools disk's interpreter through its own loader,
#: detached from the agent's exec (setsid, stdio to the console).
_R = "/.rigd"
_LIBS = f"{_R}/lib/x86_64-linux-gnu:{_R}/usr/lib/x86_64-linux-gnu"
MUX_START = (
    f"{_R}/bin/busybox setsid {_R}/bin/busybox env -i PATH=/usr/sbin:/usr/bin:/sbin:/bin "
    f"{_R}/lib/x86_64-linux-gnu/ld-linux-x86-64.so.2 --library-path {_LIBS} "
    f"{_R}/usr/bin/python3.11 -I {_R}/agent/rigd_mux.py </dev/null >/dev/console 2>&1 &"
)
MUX_START_ARGV = (f"{_R}/bin/busybox", "sh", "-c", MUX_START)


@dataclass(slots=True)
class Forward:
    guest_port: int
    host_port: int
    scope: trio.CancelScope
    lan_port: int | None = None
    lan_scope: trio.CancelScope | None = None
    connections: int = 0


@dataclass(slots=True)
class PortsState:
    """What a rig's ports look like now (for the Rig and ``rig.ports``)."""

    forwards: dict[int, Forward] = field(default_factory=dict)
    listening: Listening = field(default_factory=lambda: Listening({}, 0))
    not_forwarded: list[int] = field(default_factory=list)
    problem: str | None = None
    ready: bool = False


class RigPorts:
    def __init__(
        self,
        rig_id: str,
        socket_path: Path,
        run_in_guest: Callable[[tuple[str, ...]], Awaitable[None]],
        *,
        awake: Callable[[], bool],
        on_connect: Callable[[], Awaitable[None]],
        lan_allowed: bool,
        domains_of: Callable[[str], dict[int, list[str]]] = lambda _rid: {},
        lan_host: str = "",
        poll_s: float = POLL_S,
        max_forwards: int = MAX_FORWARDS,
    ) -> None:
        self.rig_id = rig_id
        self.socket_path = socket_path
        self._run_in_guest = run_in_guest
        self._awake = awake
        self._on_connect = on_connect
        self.lan_allowed = lan_allowed
        self._domains_of = domains_of
        self.lan_host = lan_host
        self.poll_s = poll_s
        self.max_forwards = max_forwards
        self.state = PortsState()
        self.mux: MuxClient | None = None
        self._nursery: trio.Nursery | None = None
        self._poke = trio.Event()
        self._polled = trio.Event()
        self._connections = 0
        self._logged_over: set[int] = set()
        self._greeted = False
        self.refused_connections = 0

    # -- the service ----------------------------------------------------------

    async def run(self) -> None:
        """Serve until cancelled (the rig closes); never raises anything else."""
        pause = 1.0
        try:
            async with trio.open_nursery() as nursery:
                self._nursery = nursery
                while True:
                    # A parked rig answers nothing: wait for it to run (its phase has no event).
                    while not self._awake():  # noqa: ASYNC110
                        await trio.sleep(1.0)
                    self._greeted = False
                    try:
                        await self._session()
                    except (MuxError, OSError, StreamRefused) as exc:
                        self.state.problem = f"port forwarding is down: {exc}"
                        log.warning("rig %s: %s (retrying in %.0f s)", self.rig_id,
                                    self.state.problem, pause)
                    except Exception:  # the rig's ports are their own failure boundary
                        self.state.problem = "port forwarding failed (see the server log)"
                        log.exception("rig %s: port forwarding failed", self.rig_id)
                    self.mux = None
                    self.state.ready = False
                    self._drop_all()
                    self._wake_waiters()
                    if self._greeted:
                        pause = 1.0  # that session worked: a new failure starts the backoff over
                    await trio.sleep(pause)
                    pause = min(pause * 2, 60.0)
        finally:
            self._drop_all()
            self._nursery = None

    async def _session(self) -> None:
        sock = await trio.open_unix_socket(str(self.socket_path))
        async with sock:
            mux = MuxClient(sock, name=self.rig_id)
            async with trio.open_nursery() as nursery:
                # Its MuxError (the connection's end) ends the session.
                nursery.start_soon(mux.run)
                try:
                    await mux.hello(timeout_s=HELLO_TIMEOUT_S)
                except MuxError:
                    if mux.broken is not None:
                        raise
                    await self._run_in_guest(MUX_START_ARGV)
                    await mux.hello(timeout_s=START_TIMEOUT_S)
                self.mux = mux
                self._greeted = True
                self.state.problem = None
                while True:
                    if self._awake():
                        try:
                            listening = await mux.listening(timeout_s=LIST_TIMEOUT_S)
                        except MuxError:
                            if mux.broken is not None or self._awake():
                                raise
                            continue  # parked while it asked: ask again once it runs
                        self._apply(listening)
                        self.state.ready = True
                        self._wake_waiters()
                    self._poke = trio.Event()
                    with trio.move_on_after(self.poll_s):
                        await self._poke.wait()

    def _wake_waiters(self) -> None:
        self._polled.set()
        self._polled = trio.Event()

    async def refresh(self, *, timeout_s: float = 8.0) -> None:
        """Poll now and wait for the answer (for ``rig.domain.set``'s check)."""
        waiter = self._polled
        self._poke.set()
        with trio.move_on_after(timeout_s):
            await waiter.wait()

    # -- forwards -------------------------------------------------------------

    def _apply(self, listening: Listening) -> None:
        st = self.state
        st.listening = listening
        for port in [p for p in st.forwards if p not in listening.ports]:
            self._unforward(port)
        over: list[int] = []
        for port in sorted(listening.ports):
            if port in st.forwards:
                continue
            if len(st.forwards) >= self.max_forwards:
                over.append(port)
                continue
            self._forward(port)
        st.not_forwarded = over
        fresh = [p for p in over if p not in self._logged_over]
        if fresh:
            log.warning("rig %s: %d listening ports beyond the %d forwarded are not forwarded "
                        "(%s…)", self.rig_id, len(over), self.max_forwards,
                        ", ".join(map(str, fresh[:8])))
            self._logged_over.update(fresh[:1024])

    def _forward(self, port: int) -> None:
        assert self._nursery is not None
        listener = bind_loopback(port)
        if listener is None:
            return
        scope = trio.CancelScope()
        fwd = Forward(port, listener.getsockname()[1], scope)
        self.state.forwards[port] = fwd
        self._nursery.start_soon(self._serve, fwd, listener, scope)

    def _unforward(self, port: int) -> None:
        fwd = self.state.forwards.pop(port, None)
        if fwd is not None:
            fwd.scope.cancel()
            if fwd.lan_scope is not None:
                fwd.lan_scope.cancel()

    def _drop_all(self) -> None:
        for port in list(self.state.forwards):
            self._unforward(port)

    async def _serve(self, fwd: Forward, sock: socket.socket, scope: trio.CancelScope) -> None:
        listener = trio.SocketListener(trio.socket.from_stdlib_socket(sock))
        with scope:  # cancelled: the listener closes, and every connection through it ends
            async with listener, trio.open_nursery() as nursery:
                while True:
                    conn = await listener.accept()
                    nursery.start_soon(self._connection, fwd, conn)

    async def _connection(self, fwd: Forward, conn: trio.SocketStream) -> None:
        async with conn:
            if self._connections >= MAX_CONNECTIONS:
                self.refused_connections += 1
                return
            self._connections += 1
            fwd.connections += 1
            try:
                try:
                    stream = await self.open_stream(fwd.guest_port)
                except (StreamRefused, MuxError, Conflict) as exc:
                    log.info("rig %s: a connection to guest port %d failed: %s", self.rig_id,
                             fwd.guest_port, exc)
                    return
                await splice(conn, stream)
            finally:
                self._connections -= 1
                fwd.connections -= 1

    async def open_stream(self, guest_port: int) -> MuxStream:
        """A connection to ``guest_port`` in this rig (waking it if parked)."""
        await self._on_connect()
        mux = self.mux
        if mux is None:
            raise Conflict(f"rig {self.rig_id}: port forwarding is not running"
                           + (f" ({self.state.problem})" if self.state.problem else ""))
        return await mux.open(guest_port)

    # -- sharing --------------------------------------------------------------

    def share(self, guest_port: int, lan: bool) -> None:
        fwd = self.state.forwards.get(guest_port)
        if fwd is None:
            raise FieldError("guestPort", f"port {guest_port} is not forwarded in rig {self.rig_id}"
                             f" (rig.ports lists the forwarded ones)")
        if not lan:
            if fwd.lan_scope is not None:
                fwd.lan_scope.cancel()
            fwd.lan_scope, fwd.lan_port = None, None
            return
        if not self.lan_allowed:
            raise Conflict("sharing on the local network is off: the server binds loopback only "
                           "(start it with --allow-lan-ports to allow it)")
        if fwd.lan_scope is not None:
            return
        assert self._nursery is not None
        sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        sock.bind(("0.0.0.0", 0))  # noqa: S104 - a LAN share, asked for
        sock.listen(128)
        scope = trio.CancelScope()
        fwd.lan_scope, fwd.lan_port = scope, sock.getsockname()[1]
        self._nursery.start_soon(self._serve, fwd, sock, scope)

    def describe(self) -> dict[str, Any]:
        st = self.state
        domains = self._domains_of(self.rig_id)
        ports = []
        for port in sorted(st.forwards):
            fwd = st.forwards[port]
            names = domains.get(port, [])
            ports.append({
                "guestPort": port, "hostPort": fwd.host_port,
                "url": f"http://127.0.0.1:{fwd.host_port}/",
                "shared": fwd.lan_port is not None,
                "lanPort": fwd.lan_port,
                "lanUrl": (f"http://{self.lan_host or '0.0.0.0'}:{fwd.lan_port}/"  # noqa: S104
                           if fwd.lan_port is not None else None),
                "domain": names[0] if names else None,
                "connections": fwd.connections,
            })
        return {
            "ports": ports,
            "notForwarded": [{"guestPort": p, "reason": f"more than {self.max_forwards} ports listen"}
                             for p in st.not_forwarded[:MAX_NOT_FORWARDED_LISTED]],
            "listening": st.listening.total,
            "ready": st.ready,
            "problem": st.problem,
        }


def bind_loopback(port: int) -> socket.socket | None:
    """A listening socket on 127.0.0.1: ``port`` when free here, else one the OS picks."""
    for want in (port, 0):
        sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        # Connections of an earlier forward of this port may linger in TIME_WAIT.
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            sock.bind(("127.0.0.1", want))
            sock.listen(128)
        except OSError as exc:
            sock.close()
            if want == 0 or exc.errno not in (errno.EADDRINUSE, errno.EACCES):
                log.warning("cannot bind a forward for guest port %d: %s", port, exc)
                return None
            continue
        return sock
    return None


__all__ = ["MAX_FORWARDS", "MUX_START_ARGV", "POLL_S", "Forward", "PortsState", "RigPorts",
           "bind_loopback"]
