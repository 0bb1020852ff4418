"""The gateway's Trio services: the SNI/Host proxy and the DNS responder.

How a guest connection is handled (``Proxy.handle``):

1. Read its first bytes into a sniffer (``sniff.py``) — at most
   ``Limits.sniff_bytes``, within ``Limits.sniff_timeout`` — until it names a
   server: the TLS SNI on port 443, the HTTP ``Host`` on port 80.
2. Refuse (TLS: a fatal ``access_denied`` alert; HTTP: a ``403`` saying why;
   then close) when there is no name, the name is an IP literal, or the
   rig's policy does not allow it.
3. Resolve the **name** through the upstream resolver; refuse when *any*
   answer address is in a refused range (DNS rebinding), unless an operator
   host-service rule covers it.
4. Dial the name's address — never the address the guest aimed at, which is
   only recorded — replay the sniffed bytes and splice both ways, counting.
5. For a host with a brokered secret (TLS only): terminate the guest's TLS
   with the rig's CA, check every request's ``Host`` against the SNI, set
   the secret's header, and re-originate verified TLS to the real host.

Every decision and every closed connection becomes an :class:`AuditEvent`
(shape only: host, verdict, reason, byte counts — never payload or secrets).
"""

from __future__ import annotations

import contextlib
import ipaddress
import logging
import socket
import ssl
import struct
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Literal

import trio

from netgate import dns, sniff
from netgate.broker import BrokerRefused, Injection, RigCA, SecretStore
from netgate.policy import IPAddress, Policy
from netgate.resolver import Dialer, ResolveError, Resolver

log = logging.getLogger("netgate.proxy")

SO_ORIGINAL_DST = 80
#: TLS alert record: fatal (2), access_denied (49).
TLS_ACCESS_DENIED = b"\x15\x03\x03\x00\x02\x02\x31"
MISDIRECTED = b"HTTP/1.1 421 Misdirected Request\r\nConnection: close\r\nContent-Length: 0\r\n\r\n"


@dataclass(frozen=True, slots=True)
class AuditEvent:
    """One egress decision or one finished connection, for the rig's audit log."""

    kind: Literal["http", "tls", "dns"]
    phase: Literal["decision", "closed"]
    host: str | None
    allowed: bool
    reason: str
    aimed_at: str | None = None  #: the address:port the guest dialled (never used to connect)
    upstream: str | None = None  #: the address:port the gateway dialled
    bytes_up: int = 0
    bytes_down: int = 0
    duration_s: float = 0.0
    brokered: str | None = None  #: name of the secret injected (never its value)
    qtype: str | None = None  #: DNS only


AuditSink = Callable[[AuditEvent], None]


@dataclass(frozen=True, slots=True)
class Limits:
    sniff_bytes: int = 32 * 1024
    sniff_timeout: float = 10.0
    resolve_timeout: float = 5.0
    connect_timeout: float = 10.0
    handshake_timeout: float = 15.0
    max_connections: int = 256
    dns_tcp_timeout: float = 10.0


@dataclass(slots=True)
class BrokerBinding:
    """The broker as one rig sees it: its workspace's secrets and its CA."""

    store: SecretStore
    workspace: str
    ca: RigCA
    upstream_ssl: ssl.SSLContext = field(default_factory=ssl.create_default_context)


class _Refused(Exception):
    def __init__(self, reason: str, host: str | None = None, *, answer: bool = True) -> None:
        super().__init__(reason)
        self.reason = reason
        self.host = host
        #: Whether the guest gets a refusal (a 403, a TLS alert) or only the close: a connection
        #: that never sent a byte asked nothing, and an answer parked on it would be read as the
        #: reply to whatever the guest sends next (a browser's preconnected socket).
        self.answer = answer


class PrefixedStream(trio.abc.Stream):
    """A stream that returns ``prefix`` before reading from ``inner`` (replays sniffed bytes)."""

    def __init__(self, inner: trio.abc.Stream, prefix: bytes) -> None:
        self.inner = inner
        self._prefix = prefix

    async def receive_some(self, max_bytes: int | None = None) -> bytes | bytearray:
        if self._prefix:
            n = len(self._prefix) if max_bytes is None else max_bytes
            out, self._prefix = self._prefix[:n], self._prefix[n:]
            await trio.lowlevel.checkpoint()
            return out
        return await self.inner.receive_some(max_bytes)

    async def send_all(self, data: bytes | bytearray | memoryview) -> None:
        await self.inner.send_all(data)

    async def wait_send_all_might_not_block(self) -> None:
        await self.inner.wait_send_all_might_not_block()

    async def send_eof(self) -> None:
        if isinstance(self.inner, trio.abc.HalfCloseableStream):
            await self.inner.send_eof()

    async def aclose(self) -> None:
        await self.inner.aclose()


def original_destination(stream: trio.SocketStream) -> str | None:
    """Where the guest aimed (before the redirect), for the audit log only."""
    try:
        raw = stream.socket.getsockopt(socket.SOL_IP, SO_ORIGINAL_DST, 16)
    except OSError:
        return None
    port, packed = struct.unpack_from("!2xH4s", raw)
    return f"{ipaddress.IPv4Address(packed)}:{port}"


PUMP_BYTES = 256 * 1024
_CLOSE_ERRORS = (trio.BrokenResourceError, trio.ClosedResourceError, OSError, ssl.SSLError)


class _Counter:
    __slots__ = ("n",)

    def __init__(self) -> None:
        self.n = 0


async def _pump(src: trio.abc.ReceiveStream, dst: trio.abc.SendStream, counter: _Counter) -> None:
    try:
        while True:
            data = await src.receive_some(PUMP_BYTES)
            if not data:
                break
            await dst.send_all(data)
            counter.n += len(data)
    except _CLOSE_ERRORS:
        pass
    if isinstance(dst, trio.abc.HalfCloseableStream):
        with contextlib.suppress(*_CLOSE_ERRORS):
            await dst.send_eof()
    else:
        await trio.aclose_forcefully(dst)


class Proxy:
    """The guest-facing proxy of one gateway."""

    def __init__(self, *, policy: Callable[[], Policy], resolver: Resolver, dialer: Dialer,
                 audit: AuditSink, limits: Limits = Limits(), broker: BrokerBinding | None = None) -> None:
        self._policy = policy
        self.resolver = resolver
        self.dialer = dialer
        self.audit = audit
        self.limits = limits
        self.broker = broker
        self._active = 0

    def _emit(self, event: AuditEvent) -> None:
        try:
            self.audit(event)
        except Exception:  # an audit sink's bug must not take the data plane down
            log.exception("audit sink failed")

    # -- entry points ----------------------------------------------------------------------

    async def handle_http(self, stream: trio.SocketStream) -> None:
        await self._handle(stream, "http")

    async def handle_tls(self, stream: trio.SocketStream) -> None:
        await self._handle(stream, "tls")

    async def _handle(self, stream: trio.SocketStream, kind: Literal["http", "tls"]) -> None:
        started = time.monotonic()
        aimed = original_destination(stream)
        async with stream:
            if self._active >= self.limits.max_connections:
                self._emit(AuditEvent(kind, "decision", None, False, "too many connections", aimed))
                return
            self._active += 1
            try:
                await self._serve(stream, kind, aimed, started)
            finally:
                self._active -= 1

    async def _serve(self, stream: trio.SocketStream, kind: Literal["http", "tls"], aimed: str | None,
                     started: float) -> None:
        host: str | None = None
        try:
            buffered, host = await self._sniff(stream, kind)
            policy = self._policy()
            why = policy.check_name(host)
            if why is not None:
                raise _Refused(why, host)
            injection = None
            if kind == "tls" and self.broker is not None:
                injection = await self._injection(host, policy)
            addrs = await self._resolve(host, policy)
        except _Refused as exc:
            self._emit(AuditEvent(kind, "decision", exc.host or host, False, exc.reason, aimed,
                                  duration_s=time.monotonic() - started))
            await self._refuse(stream, kind, exc)
            return
        port = 80 if kind == "http" else 443
        try:
            upstream, addr = await self._dial(addrs, port)
        except _Refused as exc:
            self._emit(AuditEvent(kind, "decision", host, True, exc.reason, aimed,
                                  duration_s=time.monotonic() - started))
            await self._refuse(stream, kind, exc)
            return
        up, down = _Counter(), _Counter()
        upstream_desc = f"{addr}:{port}"
        self._emit(AuditEvent(kind, "decision", host, True, "allowed", aimed, upstream_desc,
                              brokered=injection.secret if injection else None))
        reason = "closed"
        try:
            async with upstream:
                if injection is not None:
                    reason = await self._broker_splice(stream, buffered, upstream, host, injection, up, down)
                else:
                    await upstream.send_all(buffered)
                    up.n += len(buffered)
                    async with trio.open_nursery() as nursery:
                        nursery.start_soon(_pump, stream, upstream, up)
                        nursery.start_soon(_pump, upstream, stream, down)
        except _CLOSE_ERRORS as exc:
            reason = f"closed: {type(exc).__name__}"
        self._emit(AuditEvent(kind, "closed", host, True, reason, aimed, upstream_desc, up.n, down.n,
                              time.monotonic() - started, injection.secret if injection else None))

    # -- steps ----------------------------------------------------------------------------

    async def _sniff(self, stream: trio.SocketStream, kind: str) -> tuple[bytes, str]:
        sniffer: sniff.ClientHelloSniffer | sniff.HttpHostSniffer = (
            sniff.ClientHelloSniffer(self.limits.sniff_bytes) if kind == "tls"
            else sniff.HttpHostSniffer(self.limits.sniff_bytes))
        verdict: sniff.Verdict = sniff.NeedMore()
        received = 0
        with trio.move_on_after(self.limits.sniff_timeout):
            while isinstance(verdict, sniff.NeedMore):
                try:
                    data = await stream.receive_some(16384)
                except _CLOSE_ERRORS:
                    data = b""
                if not data:
                    raise _Refused("closed before naming a server", answer=False)
                received += len(data)
                verdict = sniffer.feed(data)
        match verdict:
            case sniff.ServerName(name=name, ip_literal=True):
                raise _Refused("direct IP address (names only)", name)
            case sniff.ServerName(name=name):
                return bytes(sniffer.buffered), str(name)
            case sniff.NeedMore() if received == 0:
                raise _Refused("idle: nothing sent within the sniff timeout (closed without an answer)",
                               answer=False)
            case sniff.NeedMore():
                raise _Refused("no server name within the sniff timeout")
            case sniff.NoServerName(reason=reason) | sniff.NotRecognised(reason=reason):
                raise _Refused(reason)
            case sniff.TooLarge(limit=limit):
                raise _Refused(f"no server name within the first {limit} bytes")
        raise AssertionError(verdict)  # pragma: no cover

    async def _injection(self, host: str, policy: Policy) -> Injection | None:
        assert self.broker is not None
        b = self.broker
        try:
            return await trio.to_thread.run_sync(b.store.issue, b.workspace, host, policy)
        except BrokerRefused as exc:  # pragma: no cover - the policy was checked just before
            raise _Refused(exc.message, host) from exc

    async def _resolve(self, host: str, policy: Policy) -> tuple[IPAddress, ...]:
        try:
            with trio.fail_after(self.limits.resolve_timeout):
                addrs = await self.resolver.resolve(host)
        except (ResolveError, trio.TooSlowError, OSError) as exc:
            raise _Refused(f"upstream DNS: {exc}" if str(exc) else "upstream DNS timed out", host) from exc
        for addr in addrs:
            why = policy.check_address(host, addr)
            if why is not None:
                raise _Refused(why, host)
        return addrs

    async def _dial(self, addrs: tuple[IPAddress, ...], port: int) -> tuple[trio.SocketStream, IPAddress]:
        errors = []
        for addr in sorted(addrs, key=lambda a: a.version):
            try:
                with trio.fail_after(self.limits.connect_timeout):
                    return await self.dialer.connect_tcp(addr, port), addr
            except (OSError, trio.TooSlowError) as exc:
                errors.append(f"{addr}: {exc.strerror if isinstance(exc, OSError) else 'timed out'}")
        raise _Refused("upstream unreachable (" + "; ".join(errors) + ")")

    async def _refuse(self, stream: trio.SocketStream, kind: str, exc: _Refused) -> None:
        if not exc.answer:
            return  # the caller closes the stream
        if kind == "tls":
            payload = TLS_ACCESS_DENIED
        else:
            body = f"rigd egress gateway: {exc.host or 'request'} refused: {exc.reason}\n".encode(
                "ascii", "replace")
            payload = (b"HTTP/1.1 403 Forbidden\r\nContent-Type: text/plain\r\nConnection: close\r\n"
                       b"Content-Length: " + str(len(body)).encode() + b"\r\n\r\n" + body)
        with trio.move_on_after(2):
            with contextlib.suppress(*_CLOSE_ERRORS):
                await stream.send_all(payload)

    # -- brokered hosts ----------------------------------------------------------------------

    async def _broker_splice(self, stream: trio.SocketStream, buffered: bytes,
                             upstream_tcp: trio.SocketStream, host: str, injection: Injection,
                             up: _Counter, down: _Counter) -> str:
        assert self.broker is not None
        ctx = await trio.to_thread.run_sync(self.broker.ca.server_context, host)
        guest = trio.SSLStream(PrefixedStream(stream, buffered), ctx, server_side=True)
        upstream = trio.SSLStream(upstream_tcp, self.broker.upstream_ssl, server_hostname=host)
        try:
            with trio.fail_after(self.limits.handshake_timeout):
                await guest.do_handshake()
                await upstream.do_handshake()
        except trio.TooSlowError:
            return "TLS handshake timed out"
        except (ssl.SSLError, ssl.CertificateError) as exc:
            return f"TLS handshake failed: {getattr(exc, 'reason', None) or type(exc).__name__}"
        outcome = ["closed"]

        async def misdirected(cancel: trio.CancelScope) -> None:
            outcome[0] = "request Host differs from the TLS server name"
            await guest.send_all(MISDIRECTED)
            cancel.cancel()

        async def requests(cancel: trio.CancelScope) -> None:
            framer = sniff.RequestFramer()
            try:
                while True:
                    data = await guest.receive_some(65536)
                    if not data:
                        break
                    for ev in framer.feed(bytes(data)):
                        if isinstance(ev, sniff.Misdirected):  # no Host, or several
                            await misdirected(cancel)
                            return
                        if isinstance(ev, sniff.Head):
                            target = sniff.host_of(ev.head)
                            if not (isinstance(target, sniff.ServerName) and target.name == host):
                                await misdirected(cancel)
                                return
                            out = sniff.rewrite_head(ev.head, injection.headers)
                        elif isinstance(ev, sniff.Body | sniff.Opaque):
                            out = ev.data
                        elif isinstance(ev, sniff.FramingError):
                            outcome[0] = f"request stream refused: {ev.reason}"
                            cancel.cancel()
                            return
                        else:
                            continue
                        await upstream.send_all(out)
                        up.n += len(out)
            except _CLOSE_ERRORS:
                pass
            cancel.cancel()

        async def responses(cancel: trio.CancelScope) -> None:
            try:
                while True:
                    data = await upstream.receive_some(65536)
                    if not data:
                        break
                    await guest.send_all(data)
                    down.n += len(data)
            except _CLOSE_ERRORS:
                pass
            cancel.cancel()

        async with trio.open_nursery() as nursery:
            nursery.start_soon(requests, nursery.cancel_scope)
            nursery.start_soon(responses, nursery.cancel_scope)
        await trio.aclose_forcefully(guest)
        await trio.aclose_forcefully(upstream)
        return outcome[0]


class DnsServer:
    """The guest-facing DNS responder over UDP and TCP."""

    def __init__(self, responder: dns.Responder, audit: AuditSink, limits: Limits = Limits()) -> None:
        self.responder = responder
        self.audit = audit
        self.limits = limits

    def _emit(self, decision: dns.DnsDecision | None) -> None:
        if decision is None:
            return
        try:
            self.audit(AuditEvent("dns", "decision", decision.name or None, decision.allowed, decision.reason,
                                  qtype=decision.qtype or None))
        except Exception:
            log.exception("audit sink failed")

    async def serve_udp(self, sock: trio.socket.SocketType) -> None:
        while True:
            try:
                data, addr = await sock.recvfrom(4096)
            except OSError:
                continue
            reply = self.responder.handle(data)
            self._emit(reply.decision)
            if reply.data is not None:
                with contextlib.suppress(OSError):
                    await sock.sendto(reply.data, addr)

    async def handle_tcp(self, stream: trio.SocketStream) -> None:
        framer = dns.TcpFramer()
        async with stream:
            try:
                while True:
                    with trio.move_on_after(self.limits.dns_tcp_timeout) as scope:
                        data = await stream.receive_some(4096)
                    if scope.cancelled_caught or not data:
                        return
                    for msg in framer.feed(data):
                        reply = self.responder.handle(msg)
                        self._emit(reply.decision)
                        if reply.data is None:
                            return
                        await stream.send_all(dns.TcpFramer.frame(reply.data))
            except _CLOSE_ERRORS:
                return
