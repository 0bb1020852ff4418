"""Outbound sockets and the proxy's upstream resolver (Trio).

The proxy's outbound connections and DNS queries leave from the *server's*
namespace (or, in tests and benchmarks, from a namespace they name): a
:class:`Dialer` makes those sockets. :class:`Resolver` is a small stub
resolver over UDP (TCP when the answer is truncated) to one configured
server — by default the first ``nameserver`` of the host's
``/etc/resolv.conf`` — with a TTL-bounded cache. It never uses the guest's
DNS answers: the guest only ever sees the gateway's synthetic ones.
"""

from __future__ import annotations

import ipaddress
import secrets
import socket
from collections import OrderedDict
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import trio

from netgate import dns
from netgate.netns import NetnsExecutor
from netgate.policy import IPAddress


class ResolveError(Exception):
    """The name could not be resolved (the message says why, never guest data)."""


class Dialer:
    """Makes outbound sockets in the server's own namespace."""

    async def socket(self, family: int, kind: int) -> trio.socket.SocketType:
        return trio.socket.socket(family, kind)

    async def connect_tcp(self, addr: IPAddress, port: int) -> trio.SocketStream:
        family = socket.AF_INET if addr.version == 4 else socket.AF_INET6
        sock = await self.socket(family, socket.SOCK_STREAM)
        try:
            await sock.connect((str(addr), port))
        except BaseException:
            sock.close()
            raise
        sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        return trio.SocketStream(sock)

    def close(self) -> None:
        """Release what the dialer holds (nothing here)."""


class NetnsDialer(Dialer):
    """Makes outbound sockets inside a named namespace (tests' fake internet, benchmarks)."""

    def __init__(self, netns: str) -> None:
        self._executor = NetnsExecutor(netns)

    async def socket(self, family: int, kind: int) -> trio.socket.SocketType:
        token = trio.lowlevel.current_trio_token()
        done = trio.Event()
        fut = self._executor.submit(socket.socket, family, kind)
        fut.add_done_callback(lambda _f: token.run_sync_soon(done.set))
        await done.wait()
        return trio.socket.from_stdlib_socket(fut.result())

    def close(self) -> None:
        self._executor.close()


def system_nameserver(path: Path = Path("/etc/resolv.conf")) -> tuple[str, int]:
    """The host's first configured nameserver (127.0.0.1 if none is configured)."""
    try:
        for line in path.read_text().splitlines():
            parts = line.split()
            if len(parts) >= 2 and parts[0] == "nameserver":
                addr = parts[1].split("%", 1)[0]
                ipaddress.ip_address(addr)
                return addr, 53
    except (OSError, ValueError):
        pass
    return "127.0.0.1", 53


@dataclass(slots=True)
class _Cached:
    addresses: tuple[IPAddress, ...]
    expires: float


class Resolver:
    """A stub resolver for A and AAAA records, with a small TTL cache."""

    def __init__(self, server: tuple[str, int] | None = None, dialer: Dialer | None = None, *,
                 timeout: float = 2.0, attempts: int = 2, cache_size: int = 512, max_ttl: int = 300,
                 clock: Callable[[], float] = trio.current_time) -> None:
        self.server = server or system_nameserver()
        self.dialer = dialer or Dialer()
        self.timeout = timeout
        self.attempts = attempts
        self.max_ttl = max_ttl
        self._cache: OrderedDict[str, _Cached] = OrderedDict()
        self._cache_size = cache_size
        self._clock = clock

    async def resolve(self, name: str) -> tuple[IPAddress, ...]:
        """All A and AAAA addresses of ``name`` (A first). Raises :class:`ResolveError`."""
        key = name.lower()
        hit = self._cache.get(key)
        now = self._clock()
        if hit is not None and hit.expires > now:
            self._cache.move_to_end(key)
            return hit.addresses
        results: dict[int, dns.Answer | BaseException] = {}

        async def one(qtype: int) -> None:
            try:
                results[qtype] = await self._query(name, qtype)
            except (ResolveError, OSError, dns.DnsError, trio.TooSlowError) as exc:
                results[qtype] = exc

        async with trio.open_nursery() as nursery:
            nursery.start_soon(one, dns.TYPE_A)
            nursery.start_soon(one, dns.TYPE_AAAA)
        a, aaaa = results[dns.TYPE_A], results[dns.TYPE_AAAA]
        if isinstance(a, BaseException):
            raise ResolveError(f"{name}: {a}") from a
        addrs = a.addresses + (aaaa.addresses if isinstance(aaaa, dns.Answer) else ())
        if not addrs:
            nx = " (NXDOMAIN)" if a.rcode == dns.RCODE_NXDOMAIN else ""
            raise ResolveError(f"{name}: no address{nx}")
        ttls = [x.ttl for x in (a, aaaa) if isinstance(x, dns.Answer) and x.addresses]
        ttl = max(0, min([self.max_ttl, *ttls]))
        if ttl:
            self._cache[key] = _Cached(addrs, now + ttl)
            self._cache.move_to_end(key)
            while len(self._cache) > self._cache_size:
                self._cache.popitem(last=False)
        return addrs

    async def _query(self, name: str, qtype: int) -> dns.Answer:
        addr = ipaddress.ip_address(self.server[0])
        family = socket.AF_INET if addr.version == 4 else socket.AF_INET6
        last: Exception = ResolveError("no attempt made")
        for _ in range(self.attempts):
            qid = secrets.randbelow(65536)
            query = dns.build_query(qid, name, qtype)
            sock = await self.dialer.socket(family, socket.SOCK_DGRAM)
            with sock:
                await sock.connect(self.server)
                await sock.send(query)
                with trio.move_on_after(self.timeout):
                    while True:
                        try:
                            data = await sock.recv(4096)
                        except ConnectionRefusedError as exc:
                            raise ResolveError(f"upstream DNS {self.server[0]} refused") from exc
                        try:
                            answer = dns.parse_answer(data, qid, name, qtype)
                        except dns.DnsError as exc:  # a stray datagram: keep waiting for ours
                            last = exc
                            continue
                        if answer.truncated:
                            return await self._query_tcp(name, qtype, family)
                        return answer
                last = ResolveError(f"upstream DNS {self.server[0]} timed out")
        raise last

    async def _query_tcp(self, name: str, qtype: int, family: int) -> dns.Answer:
        qid = secrets.randbelow(65536)
        sock = await self.dialer.socket(family, socket.SOCK_STREAM)
        with sock, trio.fail_after(self.timeout):
            await sock.connect(self.server)
            await sock.send(dns.TcpFramer.frame(dns.build_query(qid, name, qtype)))
            framer = dns.TcpFramer()
            while True:
                data = await sock.recv(65536)
                if not data:
                    raise ResolveError("upstream DNS closed the TCP connection")
                for msg in framer.feed(data):
                    return dns.parse_answer(msg, qid, name, qtype)
