"""Rootless egress: QEMU user networking (slirp) with ``restrict=on``, relayed to netgate's proxy.

When the server may not manage network namespaces (no ``CAP_NET_ADMIN``),
a rig's NIC is QEMU's own user-mode network stack instead of a tap::

    guest 10.0.2.15/24 ──► slirp (inside QEMU, restrict=on, ipv6=off)
                              │ tcp 10.0.2.100:80  ─┐  guestfwd … -cmd: <helper> <rig dir>/net.sock h|t|d
                              │ tcp 10.0.2.100:443 ─┤  (one short-lived helper per guest connection:
                              │ tcp 10.0.2.100:53  ─┘   it hands slirp's end of the connection to the
                              │                          server's Unix socket by SCM_RIGHTS, and exits)
                              └ everything else: dropped (restrict=on)
    server: UserGate.accept → Proxy.handle_http / handle_tls / DnsServer.handle_tcp
            (the same proxy, policy, resolver, broker and audit as the rootful gateway)

``restrict=on`` makes slirp drop every packet from the guest that is not
for one of its own services (ARP, DHCP) or for a ``guestfwd`` address and
port: no TCP or UDP to anywhere else (including the host's loopback, which
slirp would otherwise reach as 10.0.2.2), no ICMP beyond slirp's own echo
reply, and with ``ipv6=off`` no IPv6 at all. Slirp's own DNS (10.0.2.3)
does not answer restricted, so the guest resolves over TCP to the gate
(``options use-vc`` in its resolv.conf; the tools disk's init writes it).

Why a ``cmd:`` helper (measured with QEMU 7.2 / libslirp 4.7, docs/netgate.md):
a ``guestfwd`` to a chardev (``tcp:``, ``unix:``, with or without
``reconnect=``) is *one* host connection shared by every guest connection
to that port — the first works, concurrent ones hang, sequential ones work
only after a reconnect delay. A ``cmd:`` target runs one process per guest
connection with the connection on its stdin. The price: QEMU's seccomp
sandbox must allow ``spawn`` (fork/exec) and ``elevateprivileges`` (libslirp's
child calls ``setsid()``, which that set kills). :data:`SANDBOX` is the
sandbox of this mode; the rig's status says so.

The helper is a few lines of Python run with ``-I -S`` (no site, no
environment): connect to the rig's ``net.sock``, send one tag byte with fd 0
attached, exit. The server checks the sender's uid (``SO_PEERCRED``: QEMU's
uid), the tag, and that the fd is a stream socket, then serves it exactly
as the rootful gateway serves a redirected connection.
"""

from __future__ import annotations

import array
import contextlib
import ipaddress
import logging
import os
import socket
import ssl
import stat
import struct
import sys
from collections.abc import AsyncIterator, Awaitable, Callable
from contextlib import asynccontextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Literal

import trio

from netgate import dns
from netgate.broker import RigCA, SecretStore
from netgate.policy import Policy
from netgate.proxy import AuditEvent, AuditSink, BrokerBinding, DnsServer, Limits, Proxy
from netgate.resolver import Dialer, NetnsDialer, Resolver

log = logging.getLogger("netgate.usermode")
DEFAULT_LIMITS = Limits()

#: QEMU's seccomp sandbox in this mode: ``spawn`` and ``elevateprivileges`` are allowed
#: (the rootful mode's is ``on,obsolete=deny,elevateprivileges=deny,spawn=deny,resourcecontrol=deny``).
SANDBOX = "on,obsolete=deny,resourcecontrol=deny"
#: What the rig's status says about that.
SANDBOX_NOTE = ("QEMU's seccomp sandbox allows spawn and elevateprivileges in this mode: slirp starts one "
                "relay helper per guest connection (fork, setsid, exec). QEMU runs without capabilities "
                "and with no_new_privs, so set*id calls cannot gain anything.")

#: The helper, run by QEMU as ``<python> -I -S -c HELPER_CODE <socket> <tag>`` with the guest's
#: connection on fd 0 (and 1, 2). No quotes inside: the command line is split by glib's shell rules.
HELPER_CODE = ("import socket as S,sys;s=S.socket(S.AF_UNIX);s.settimeout(5);s.connect(sys.argv[1]);"
               "s.sendmsg([sys.argv[2].encode()],[(S.SOL_SOCKET,S.SCM_RIGHTS,bytes(4))])")

Kind = Literal["http", "tls", "dns"]
#: guest port → (tag byte, service)
SERVICES: dict[int, tuple[bytes, Kind]] = {80: (b"h", "http"), 443: (b"t", "tls"), 53: (b"d", "dns")}
_BY_TAG: dict[bytes, Kind] = {tag: kind for tag, kind in SERVICES.values()}

#: File name of the relay socket in the rig's private directory.
SOCKET_NAME = "net.sock"


_NETWORK = ipaddress.IPv4Network("10.0.2.0/24")
_GUEST = ipaddress.IPv4Address("10.0.2.15")
_ROUTER = ipaddress.IPv4Address("10.0.2.2")
_GATE = ipaddress.IPv4Address("10.0.2.100")


@dataclass(frozen=True, slots=True)
class UserAddressing:
    """The guest's view of slirp (its defaults, written out so that nothing depends on them)."""

    network: ipaddress.IPv4Network = _NETWORK
    guest: ipaddress.IPv4Address = _GUEST
    #: slirp's own address (the guest's default route; restrict=on answers only ARP/DHCP/echo there).
    router: ipaddress.IPv4Address = _ROUTER
    #: The guestfwd address: proxy (80, 443) and DNS (53, TCP). slirp refuses guestfwd on .2 and .3.
    gate: ipaddress.IPv4Address = _GATE

    @property
    def prefixlen(self) -> int:
        return self.network.prefixlen

    @property
    def gateway(self) -> ipaddress.IPv4Address:
        """What allowed names resolve to (the DNS responder's synthetic answer)."""
        return self.gate

    @property
    def dns(self) -> ipaddress.IPv4Address:
        return self.gate


USER_ADDRESSING = UserAddressing()


def _esc(value: str) -> str:
    return value.replace(",", ",,")


def netdev(socket_path: Path | str, *, python: str, addressing: UserAddressing = USER_ADDRESSING,
           netdev_id: str = "net0") -> str:
    """The ``-netdev`` value: slirp, restricted, IPv4 only, one ``cmd:`` guestfwd per service port."""
    for part in (str(socket_path), python):
        if any(c.isspace() or c in "'\"\\" for c in part):
            raise ValueError(f"{part!r}: a path in a guestfwd command must not contain spaces or quotes")
    opts = [
        "user", f"id={netdev_id}", "restrict=on", "ipv6=off",
        f"net={addressing.network}", f"host={addressing.router}",
    ]
    for port, (tag, _kind) in SERVICES.items():
        cmd = f"{python} -I -S -c '{HELPER_CODE}' {socket_path} {tag.decode()}"
        opts.append(f"guestfwd=tcp:{addressing.gate}:{port}-cmd:{cmd}")
    return ",".join(_esc(o) for o in opts)


def guest_net_arg(addressing: UserAddressing = USER_ADDRESSING) -> str:
    """The kernel argument for the tools disk's init (``use-vc``: DNS over TCP)."""
    a = addressing
    return f"rigd.net={a.guest}/{a.prefixlen},{a.router},{a.dns},use-vc"


def _world_runnable(path: Path) -> bool:
    try:
        if not path.stat().st_mode & stat.S_IXOTH:
            return False
        return all(p.stat().st_mode & stat.S_IXOTH for p in path.parents)
    except OSError:
        return False


def helper_python() -> str:
    """The interpreter QEMU runs the helper with: this server's, unless QEMU's uid
    (a per-rig uid when the server is root) could not run it; then a system one."""
    own = Path(os.path.realpath(sys.executable))
    if os.geteuid() != 0 or _world_runnable(own):
        return str(own)
    for candidate in ("/usr/bin/python3", "/usr/local/bin/python3", "/bin/python3"):
        path = Path(os.path.realpath(candidate))
        if _world_runnable(path):
            return str(path)
    raise RuntimeError(f"no Python interpreter that rig uids may run ({own} is not reachable by them)")


# -- the server side ------------------------------------------------------------------------------


def _take_fds(ancdata: list[tuple[int, int, bytes]]) -> list[int]:
    fds: list[int] = []
    for level, kind, data in ancdata:
        if level == socket.SOL_SOCKET and kind == socket.SCM_RIGHTS:
            a = array.array("i")
            a.frombytes(data[: len(data) - len(data) % a.itemsize])
            fds.extend(a)
    return fds


def _close_fds(fds: list[int]) -> None:
    for fd in fds:
        with contextlib.suppress(OSError):
            os.close(fd)


_FAMILIES = (socket.AF_INET, socket.AF_INET6, socket.AF_UNIX)


def adopt_stream_socket(fd: int) -> socket.socket | None:
    """Wrap a received fd if it is a stream socket; otherwise close it and return None."""
    try:
        sock = socket.socket(fileno=fd)
    except OSError:
        _close_fds([fd])
        return None
    if sock.type != socket.SOCK_STREAM or sock.family not in _FAMILIES:
        sock.close()
        return None
    return sock


def peer_uid(sock: trio.socket.SocketType) -> int | None:
    try:
        raw = sock.getsockopt(socket.SOL_SOCKET, socket.SO_PEERCRED, struct.calcsize("3i"))
    except OSError:
        return None
    _pid, uid, _gid = struct.unpack("3i", raw)
    return int(uid)


class UserGate:
    """One rig's user-mode gate. Created by :func:`open_user_gate`."""

    mode = "user"
    sandbox = SANDBOX

    def __init__(self, rig_id: str, policy: Policy, addressing: UserAddressing, ca: RigCA | None,
                 nursery: trio.Nursery, handlers: dict[Kind, Callable[[trio.SocketStream], Awaitable[None]]],
                 limits: Limits, audit: AuditSink) -> None:
        self.rig_id = rig_id
        self._policy = policy
        self.addressing = addressing
        self._ca = ca
        self._nursery = nursery
        self._handlers = handlers
        self._limits = limits
        self._audit = audit
        self._listener: trio.CancelScope | None = None
        self._active = 0
        #: Counters (tests, status): connections handed over, and hand-overs refused.
        self.accepted = 0
        self.rejected = 0

    @property
    def ca_pem(self) -> str | None:
        return self._ca.cert_pem if self._ca else None

    @property
    def policy(self) -> Policy:
        return self._policy

    def set_allowlist(self, policy: Policy) -> None:
        """Replace the rig's policy; the next DNS query and the next connection use it."""
        self._policy = policy

    def describe(self) -> dict[str, object]:
        return {"gate": str(self.addressing.gate), "guest": str(self.addressing.guest),
                "sandbox": SANDBOX, "sandboxNote": SANDBOX_NOTE}

    async def listen(self, path: Path, owner_uid: int) -> None:
        """Serve hand-overs on a Unix socket at ``path`` from processes of ``owner_uid`` only.

        Called before each QEMU start (a warm start that falls back to a cold
        boot starts QEMU twice): a previous listener is closed first.
        """
        if self._listener is not None:
            self._listener.cancel()
            self._listener = None
        await trio.Path(path).unlink(missing_ok=True)
        sock = trio.socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        try:
            await sock.bind(str(path))
            os.chmod(path, 0o600)
            if os.geteuid() == 0 and owner_uid != 0:
                os.chown(path, owner_uid, -1)
            sock.listen(64)
        except BaseException:
            sock.close()
            raise
        self._listener = await self._nursery.start(self._accept_loop, sock, path, owner_uid)

    async def _accept_loop(self, sock: trio.socket.SocketType, path: Path, owner_uid: int,
                           task_status: trio.TaskStatus[trio.CancelScope]) -> None:
        with trio.CancelScope() as scope:
            task_status.started(scope)
            try:
                with sock:
                    while True:
                        conn, _ = await sock.accept()
                        self._nursery.start_soon(self._hand_over, conn, owner_uid)
            finally:
                with contextlib.suppress(OSError):
                    os.unlink(path)

    def _reject(self, why: str) -> None:
        self.rejected += 1
        log.warning("relay hand-over refused", extra={"rig": self.rig_id, "reason": why})

    async def _hand_over(self, conn: trio.socket.SocketType, owner_uid: int) -> None:
        fds: list[int] = []
        msg = b""
        with conn:
            uid = peer_uid(conn)
            if uid != owner_uid:
                self._reject(f"sender uid {uid} is not QEMU's ({owner_uid})")
                return
            with trio.move_on_after(5):
                try:
                    msg, anc, _flags, _addr = await conn.recvmsg(8, socket.CMSG_SPACE(4 * 4))
                except OSError:
                    return
                fds = _take_fds(anc)
        kind = _BY_TAG.get(bytes(msg)) if fds else None
        if kind is None or len(fds) != 1:
            _close_fds(fds)
            self._reject(f"bad hand-over ({len(fds)} fds, tag {bytes(msg)[:8]!r})" if fds else "no fd")
            return
        sock = adopt_stream_socket(fds[0])
        if sock is None:
            self._reject("the fd is not a stream socket")
            return
        if self._active >= 2 * self._limits.max_connections:
            sock.close()
            self._emit(AuditEvent(kind, "decision", None, False, "too many connections"))
            return
        self.accepted += 1
        self._active += 1
        try:
            stream = trio.SocketStream(trio.socket.from_stdlib_socket(sock))
            await self._handlers[kind](stream)
        except Exception:  # one connection's bug must not take the rig's network down
            log.exception("relayed connection failed", extra={"rig": self.rig_id, "kind": kind})
            sock.close()
        finally:
            self._active -= 1

    def _emit(self, event: AuditEvent) -> None:
        try:
            self._audit(event)
        except Exception:
            log.exception("audit sink failed")


@asynccontextmanager
async def open_user_gate(
    rig_id: str,
    policy: Policy,
    *,
    audit: AuditSink,
    resolver_address: tuple[str, int] | None = None,
    upstream_netns: str | None = None,
    broker: SecretStore | None = None,
    workspace: str | None = None,
    upstream_ssl: ssl.SSLContext | None = None,
    limits: Limits = DEFAULT_LIMITS,
    addressing: UserAddressing = USER_ADDRESSING,
) -> AsyncIterator[UserGate]:
    """The user-mode counterpart of :func:`netgate.gateway.open_gateway` (same policy, proxy, broker).

    Nothing is listening until :meth:`UserGate.listen` (QEMU's start); on
    exit every service stops and every handed-over connection is closed.
    """
    if broker is not None and workspace is None:
        raise ValueError("a broker needs the rig's workspace")
    ca = RigCA(rig_id) if broker is not None else None
    dialer: Dialer = NetnsDialer(upstream_netns) if upstream_netns else Dialer()
    try:
        async with trio.open_nursery() as nursery:
            box: list[UserGate] = []
            resolver = Resolver(resolver_address, dialer)
            binding = None
            if broker is not None and ca is not None and workspace is not None:
                binding = BrokerBinding(broker, workspace, ca, upstream_ssl or ssl.create_default_context())
            proxy = Proxy(policy=lambda: box[0].policy, resolver=resolver, dialer=dialer, audit=audit,
                          limits=limits, broker=binding)
            responder = dns.Responder(lambda name: box[0].policy.allows(name), addressing.gate)
            dns_server = DnsServer(responder, audit, limits)
            handlers: dict[Kind, Callable[[trio.SocketStream], Awaitable[None]]] = {
                "http": proxy.handle_http, "tls": proxy.handle_tls, "dns": dns_server.handle_tcp}
            gate = UserGate(rig_id, policy, addressing, ca, nursery, handlers, limits, audit)
            box.append(gate)
            log.info("user-mode gate up", extra={"rig": rig_id})
            try:
                yield gate
            finally:
                nursery.cancel_scope.cancel()
    finally:
        dialer.close()
        log.info("user-mode gate down", extra={"rig": rig_id})
