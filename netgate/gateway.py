"""One rig's egress gateway: topology + nftables + DNS responder + proxy, as one resource.

::

    async with open_gateway("rig_1", policy, audit=sink) as gw:
        fd = await gw.open_tap_fd()            # QEMU: -netdev tap,id=net0,fd=<fd>
        ...                                    # or gw.create_tap(uid) / gw.attach_tap()
        gw.set_allowlist(new_policy)           # rig.egress: in force for the next query/connection

Set-up order: namespace → nftables ruleset (``nft -j -f -`` inside the
namespace, atomic) → listening sockets created on a thread inside the
namespace and handed to Trio → services started in the gateway's own
nursery. Teardown (shielded, always completes): cancel the services, close
every socket, remove links and namespace. A failure halfway through set-up
tears down what exists.
"""

from __future__ import annotations

import contextlib
import logging
import os
import socket
import ssl
import subprocess
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from dataclasses import dataclass

import trio

from netgate import dns, nft, topology
from netgate.broker import RigCA, SecretStore
from netgate.netns import run_in_netns
from netgate.policy import Policy
from netgate.proxy import AuditSink, BrokerBinding, DnsServer, Limits, Proxy
from netgate.resolver import Dialer, NetnsDialer, Resolver
from netgate.topology import ADDRESSING, GuestAddressing, Naming

log = logging.getLogger("netgate.gateway")
DEFAULT_LIMITS = Limits()


class GatewayError(Exception):
    """The gateway could not be set up (the message says which step)."""


def apply_ruleset(netns_name: str, ruleset: bytes) -> None:
    """Apply nftables JSON inside a namespace, atomically (blocking)."""
    proc = subprocess.run(["ip", "netns", "exec", netns_name, "nft", "-j", "-f", "-"], input=ruleset,
                          capture_output=True, timeout=30, check=False)
    if proc.returncode != 0:
        err = proc.stderr.decode(errors="replace").strip()[:500]
        raise GatewayError(f"nft in {netns_name} failed: {err}")


@dataclass(slots=True)
class _Sockets:
    http: socket.socket
    tls: socket.socket
    dns_udp: socket.socket
    dns_tcp: socket.socket

    def all(self) -> list[socket.socket]:
        return [self.http, self.tls, self.dns_udp, self.dns_tcp]


def _bind_sockets(ports: nft.Ports) -> _Sockets:
    # Runs on a thread inside the gateway namespace: these sockets belong to it for good.
    made: list[socket.socket] = []
    try:
        def tcp(port: int) -> socket.socket:
            s = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
            made.append(s)
            s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
            s.bind(("0.0.0.0", port))  # noqa: S104 - the namespace holds only lo and the guest link
            s.listen(128)
            s.setblocking(False)
            return s

        udp = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
        made.append(udp)
        udp.bind(("0.0.0.0", ports.dns))  # noqa: S104
        udp.setblocking(False)
        return _Sockets(tcp(ports.http), tcp(ports.tls), udp, tcp(ports.dns))
    except BaseException:
        for s in made:
            s.close()
        raise


class Gateway:
    """A live gateway. Created by :func:`open_gateway`; the attributes are what QEMU and the guest need."""

    def __init__(self, rig_id: str, naming: Naming, policy: Policy, addressing: GuestAddressing,
                 ca: RigCA | None) -> None:
        self.rig_id = rig_id
        self.naming = naming
        self._policy = policy
        self.addressing = addressing
        self._ca = ca
        self._tap_created = False

    # -- what the server and QEMU need -------------------------------------------------------

    @property
    def netns(self) -> str:
        return self.naming.netns

    @property
    def guest_mac(self) -> str:
        return self.naming.guest_mac

    @property
    def tap_name(self) -> str:
        """The host-namespace tap name for :meth:`create_tap` (QEMU's ``ifname=``)."""
        return self.naming.tap

    @property
    def ca_pem(self) -> str | None:
        """The per-rig CA certificate the guest must trust for brokered hosts (None: no broker)."""
        return self._ca.cert_pem if self._ca else None

    @property
    def policy(self) -> Policy:
        return self._policy

    def set_allowlist(self, policy: Policy) -> None:
        """Replace the rig's policy; the next DNS query and the next connection use it.

        Connections already spliced keep going (they were allowed when made).
        """
        self._policy = policy

    # -- the guest link ----------------------------------------------------------------------

    async def open_tap_fd(self) -> int:
        """Create the tap inside the gateway namespace; return its fd for QEMU (``fd=``). Caller closes it."""
        return await trio.to_thread.run_sync(topology.open_tap_fd, self.naming, self.addressing)

    async def create_tap(self, owner_uid: int, owner_gid: int | None = None) -> str:
        """A persistent tap in the host namespace for QEMU to attach by name (``ifname=``)."""
        name = await trio.to_thread.run_sync(topology.create_tap, self.naming, owner_uid, owner_gid)
        self._tap_created = True
        return name

    async def attach_tap(self) -> None:
        """After QEMU attached to :meth:`create_tap`'s tap: move it into the gateway namespace."""
        await trio.to_thread.run_sync(topology.move_tap_into, self.naming, self.addressing)

    async def attach_veth(self, peer_ns: str, peer_if: str = "eth0") -> None:
        """A veth into ``peer_ns`` configured as the guest (tests, benchmarks)."""
        await trio.to_thread.run_sync(topology.attach_veth, self.naming, peer_ns, peer_if, self.addressing)


@asynccontextmanager
async def open_gateway(
    rig_id: str,
    policy: Policy,
    *,
    audit: AuditSink,
    resolver_address: tuple[str, int] | None = None,
    upstream_netns: str | None = None,
    broker: SecretStore | None = None,
    workspace: str | None = None,
    upstream_ssl: ssl.SSLContext | None = None,
    prefix: str = topology.DEFAULT_PREFIX,
    limits: Limits = DEFAULT_LIMITS,
    ports: nft.Ports = nft.DEFAULT_PORTS,
    addressing: GuestAddressing = ADDRESSING,
    guest_mac: str | None = None,
) -> AsyncIterator[Gateway]:
    """Build a rig's gateway; tear it down completely on exit.

    ``audit`` receives every decision (synchronously: it must not block).
    ``resolver_address`` is the upstream DNS server for the proxy's lookups
    (default: the host's ``/etc/resolv.conf``). ``upstream_netns`` makes the
    proxy dial out of that namespace instead of the server's (tests).
    ``broker`` + ``workspace`` enable secret injection for hosts bound in that
    workspace (then :attr:`Gateway.ca_pem` is set); ``upstream_ssl`` verifies
    re-originated TLS (default: the system's CAs). ``guest_mac`` must be the
    MAC QEMU gives the NIC (the gateway pins it as a permanent neighbour).
    """
    naming = Naming(rig_id, prefix, guest_mac)
    if broker is not None and workspace is None:
        raise ValueError("a broker needs the rig's workspace")
    ca = RigCA(rig_id) if broker is not None else None
    gw = Gateway(rig_id, naming, policy, addressing, ca)
    dialer: Dialer = NetnsDialer(upstream_netns) if upstream_netns else Dialer()
    sockets: _Sockets | None = None
    try:
        await trio.to_thread.run_sync(topology.create_gateway_namespace, naming)
        await trio.to_thread.run_sync(apply_ruleset, naming.netns,
                                      nft.encode(nft.gateway_ruleset(topology.GUEST_IF, ports)))
        sockets = await trio.to_thread.run_sync(run_in_netns, naming.netns, _bind_sockets, ports)
        resolver = Resolver(resolver_address, dialer)
        binding = None
        if broker is not None and ca is not None and workspace is not None:
            binding = BrokerBinding(broker, workspace, ca, upstream_ssl or ssl.create_default_context())
        proxy = Proxy(policy=lambda: gw.policy, resolver=resolver, dialer=dialer, audit=audit,
                      limits=limits, broker=binding)
        responder = dns.Responder(lambda name: gw.policy.allows(name), addressing.gateway)
        dns_server = DnsServer(responder, audit, limits)
        async with trio.open_nursery() as nursery:
            for sock, handler in ((sockets.http, proxy.handle_http), (sockets.tls, proxy.handle_tls),
                                  (sockets.dns_tcp, dns_server.handle_tcp)):
                listener = trio.SocketListener(trio.socket.from_stdlib_socket(sock))
                nursery.start_soon(trio.serve_listeners, handler, [listener])
            nursery.start_soon(dns_server.serve_udp, trio.socket.from_stdlib_socket(sockets.dns_udp))
            log.info("gateway up", extra={"rig": rig_id, "netns": naming.netns})
            try:
                yield gw
            finally:
                nursery.cancel_scope.cancel()
    finally:
        with trio.CancelScope(shield=True):
            if sockets is not None:
                for s in sockets.all():
                    s.close()
            dialer.close()
            await trio.to_thread.run_sync(topology.remove_gateway, naming)
            log.info("gateway down", extra={"rig": rig_id, "netns": naming.netns})


def close_fd(fd: int) -> None:
    """Close a tap fd once QEMU holds its own copy."""
    with contextlib.suppress(OSError):
        os.close(fd)
