"""Per-rig network plumbing with pyroute2 (synchronous; the server calls it via ``trio.to_thread``).

How this works: every rig gets a **gateway namespace** ``<prefix>-gw-<key>``
(``key`` = 10 hex digits of sha256(rig id)) that contains only ``lo`` and
the guest-facing link ``guest0`` (10.213.0.1/30; the guest is 10.213.0.2).
The namespace has no other interface and no route, and IPv4 forwarding is
off, so the guest can reach nothing but the gateway's own DNS responder and
proxy (the nftables rules in ``nft.py`` say so again, explicitly). The proxy
listens inside the namespace but *dials out from the server's namespace*;
no packet ever crosses the namespace boundary. Every rig can use the same
subnet because every guest link lives in a namespace of its own.

The guest link is one of:

* :func:`open_tap_fd` (recommended for QEMU): the server opens
  ``/dev/net/tun`` on a thread inside the gateway namespace, so the tap is
  born there; QEMU receives the file descriptor (``-netdev tap,fd=N``). No
  tap ever exists in the host namespace and QEMU needs no access to
  ``/dev/net/tun`` (root-only on some hosts, this one included).
* :func:`create_tap` + :func:`move_tap_into`: a persistent tap
  ``<prefix>t<key>`` owned by the rig's uid in the host namespace; QEMU
  attaches by name (``ifname=``), then the server moves it into the gateway
  namespace. Needs ``/dev/net/tun`` to be openable by that uid.
* :func:`attach_veth`: a veth pair whose far end goes into another namespace
  (tests and benchmarks simulate the guest that way).

Names carry the prefix so that :func:`find_leftovers` / :func:`cleanup_leftovers`
can find what a crashed server left behind (a namespace outlives its
creator; a tap in the host namespace too).
"""

from __future__ import annotations

import contextlib
import errno
import fcntl
import hashlib
import ipaddress
import logging
import os
import re
import struct
import subprocess
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from typing import TypeVar

from pyroute2 import IPRoute, netns
from pyroute2.netlink.exceptions import NetlinkError

from netgate.netns import NETNS_DIR, run_in_netns

T = TypeVar("T")
log = logging.getLogger("netgate.topology")

GUEST_IF = "guest0"
DEFAULT_PREFIX = "rigd"
_PREFIX = re.compile(r"^[a-z][a-z0-9]{1,3}$")
_MAC = re.compile(r"^[0-9a-f]{2}(:[0-9a-f]{2}){5}$")

TUNSETIFF = 0x400454CA
IFF_TAP = 0x0002
IFF_NO_PI = 0x1000


_GATEWAY = ipaddress.IPv4Address("10.213.0.1")
_GUEST = ipaddress.IPv4Address("10.213.0.2")


@dataclass(frozen=True, slots=True)
class GuestAddressing:
    """What the guest must be configured with (the same for every rig: each has its own namespace)."""

    gateway: ipaddress.IPv4Address = _GATEWAY
    guest: ipaddress.IPv4Address = _GUEST
    prefixlen: int = 30

    @property
    def dns(self) -> ipaddress.IPv4Address:
        return self.gateway


ADDRESSING = GuestAddressing()


@dataclass(frozen=True, slots=True)
class Naming:
    """Names of one rig's plumbing. ``prefix``: 2-4 lowercase characters (tests use ``rgt``)."""

    rig_id: str
    prefix: str = DEFAULT_PREFIX
    #: The MAC QEMU gives the guest's NIC (the server's ``rig_mac(rig_id)``); derived here if None.
    mac: str | None = None

    def __post_init__(self) -> None:
        if not _PREFIX.match(self.prefix):
            raise ValueError(f"bad prefix {self.prefix!r}: 2-4 lowercase letters/digits")
        if self.mac is not None and (not _MAC.match(self.mac) or int(self.mac[:2], 16) & 1):
            raise ValueError(f"bad guest MAC {self.mac!r}: six lower-case hex pairs, unicast")

    @property
    def key(self) -> str:
        return hashlib.sha256(self.rig_id.encode()).hexdigest()[:10]

    @property
    def netns(self) -> str:
        return f"{self.prefix}-gw-{self.key}"

    @property
    def tap(self) -> str:
        return f"{self.prefix}t{self.key}"

    @property
    def veth_host(self) -> str:
        return f"{self.prefix}v{self.key}"

    @property
    def guest_mac(self) -> str:
        """The guest NIC's MAC: the one given, else a stable locally administered unicast one."""
        if self.mac is not None:
            return self.mac
        h = hashlib.sha256(b"mac:" + self.rig_id.encode()).digest()
        return "02:" + ":".join(f"{b:02x}" for b in h[:5])


def _lookup(ipr: IPRoute, ifname: str) -> int | None:
    found = ipr.link_lookup(ifname=ifname)
    return int(found[0]) if found else None


def _write_sysctl(path: str, value: str) -> None:
    with open(path, "w") as fh:
        fh.write(value)


def _harden_sysctls(ifname: str | None) -> None:
    # Runs on a thread inside the namespace: /proc/sys/net is resolved per thread.
    _write_sysctl("/proc/sys/net/ipv4/ip_forward", "0")
    _write_sysctl("/proc/sys/net/ipv6/conf/all/disable_ipv6", "1")
    _write_sysctl("/proc/sys/net/ipv6/conf/default/disable_ipv6", "1")
    if ifname:
        _write_sysctl(f"/proc/sys/net/ipv6/conf/{ifname}/disable_ipv6", "1")


def in_netns(name: str, fn: Callable[[IPRoute], T]) -> T:
    """Run ``fn(ipr)`` with an ``IPRoute`` whose socket lives in namespace ``name``.

    pyroute2's own namespace support (``NetNS``, ``IPRoute(netns=…)``,
    ``netns.create``) forks the server to open the socket. A fork of a
    multi-threaded process that has Python signal handlers (the server's
    SIGTERM handler) can hang for good: the child inherits the handler,
    ignores the SIGTERM pyroute2 sends it, and pyroute2 waits for it forever.
    Here a thread enters the namespace (``setns``) and opens a plain
    ``IPRoute`` there; nothing forks.
    """

    def body() -> T:
        with IPRoute() as ipr:
            return fn(ipr)

    return run_in_netns(name, body)


def create_namespace(name: str) -> None:
    """Create an empty namespace with ``lo`` up (fails if it exists).

    ``ip netns add`` (fork + exec of a C program: no Python runs in the
    child) makes and pins the namespace; see :func:`in_netns` for why not
    pyroute2's ``netns.create``.
    """
    NETNS_DIR.mkdir(parents=True, exist_ok=True)
    proc = subprocess.run(["ip", "netns", "add", name], capture_output=True, timeout=30, check=False)
    if proc.returncode != 0:
        raise OSError(f"ip netns add {name}: {proc.stderr.decode(errors='replace').strip()}")

    def lo_up(ipr: IPRoute) -> None:
        lo = _lookup(ipr, "lo")
        if lo is not None:
            ipr.link("set", index=lo, state="up")

    try:
        in_netns(name, lo_up)
    except BaseException:
        remove_namespace(name)
        raise


def remove_namespace(name: str) -> None:
    """Delete a namespace and what lives only in it (idempotent)."""
    if (NETNS_DIR / name).exists():
        with contextlib.suppress(FileNotFoundError):
            netns.remove(name)


def create_gateway_namespace(naming: Naming) -> str:
    """The rig's gateway namespace, IPv6 and forwarding off. Returns its name."""
    create_namespace(naming.netns)
    try:
        run_in_netns(naming.netns, _harden_sysctls, None)
    except BaseException:
        remove_namespace(naming.netns)
        raise
    return naming.netns


def _configure_guest_link(ns_name: str, ifname: str, addressing: GuestAddressing,
                          guest_mac: str | None) -> None:
    def configure(ns: IPRoute) -> None:
        idx = _lookup(ns, ifname)
        if idx is None:
            raise RuntimeError(f"{ifname} not found in {ns_name}")
        if ifname != GUEST_IF:
            ns.link("set", index=idx, state="down")
            ns.link("set", index=idx, ifname=GUEST_IF)
        ns.addr("add", index=idx, address=str(addressing.gateway), prefixlen=addressing.prefixlen)
        if guest_mac:
            # A permanent neighbour: the gateway never believes ARP about the guest's address.
            ns.neigh("add", dst=str(addressing.guest), lladdr=guest_mac, ifindex=idx, state="permanent")
        ns.link("set", index=idx, state="up")

    in_netns(ns_name, configure)
    run_in_netns(ns_name, _harden_sysctls, GUEST_IF)


def open_tap_fd(naming: Naming, addressing: GuestAddressing = ADDRESSING) -> int:
    """Create the rig's tap *inside* its gateway namespace and return the open tap fd.

    Pass the fd to QEMU (``pass_fds``; ``-netdev tap,id=net0,fd=<fd>``), then
    close it in the server. The tap disappears with the last fd (QEMU's exit)
    or with the namespace.
    """

    def make() -> int:
        fd = os.open("/dev/net/tun", os.O_RDWR | os.O_CLOEXEC)
        try:
            fcntl.ioctl(fd, TUNSETIFF, struct.pack("16sH", GUEST_IF.encode(), IFF_TAP | IFF_NO_PI))
        except BaseException:
            os.close(fd)
            raise
        return fd

    fd = run_in_netns(naming.netns, make)
    try:
        _configure_guest_link(naming.netns, GUEST_IF, addressing, naming.guest_mac)
    except BaseException:
        os.close(fd)
        raise
    return fd


def create_tap(naming: Naming, owner_uid: int, owner_gid: int | None = None) -> str:
    """A persistent tap in the host namespace that ``owner_uid`` may attach to by name."""
    with IPRoute() as ipr:
        kwargs: dict[str, object] = {"ifname": naming.tap, "kind": "tuntap", "mode": "tap", "uid": owner_uid}
        if owner_gid is not None:
            kwargs["gid"] = owner_gid
        ipr.link("add", **kwargs)
    return naming.tap


def move_tap_into(naming: Naming, addressing: GuestAddressing = ADDRESSING) -> None:
    """Move the host-namespace tap (QEMU attached) into the gateway namespace as ``guest0``."""
    with IPRoute() as ipr:
        idx = _lookup(ipr, naming.tap)
        if idx is None:
            raise RuntimeError(f"tap {naming.tap} not found in the host namespace")
        ipr.link("set", index=idx, net_ns_fd=naming.netns)
    _configure_guest_link(naming.netns, naming.tap, addressing, naming.guest_mac)


def attach_veth(naming: Naming, peer_ns: str, peer_if: str = "eth0",
                addressing: GuestAddressing = ADDRESSING) -> None:
    """A veth pair: ``guest0`` in the gateway namespace, ``peer_if`` in ``peer_ns`` as the guest.

    The peer gets the guest address and a default route via the gateway.
    """
    tmp_peer = f"{naming.prefix}p{naming.key}"
    with IPRoute() as ipr:
        ipr.link("add", ifname=naming.veth_host, kind="veth", peer={"ifname": tmp_peer})
        try:
            ipr.link("set", index=_lookup(ipr, naming.veth_host), net_ns_fd=naming.netns)
            ipr.link("set", index=_lookup(ipr, tmp_peer), net_ns_fd=peer_ns)
        except BaseException:
            for name in (naming.veth_host, tmp_peer):
                idx = _lookup(ipr, name)
                if idx is not None:
                    _delete_link(ipr, name, idx)
            raise
    def configure_peer(ns: IPRoute) -> None:
        idx = _lookup(ns, tmp_peer)
        assert idx is not None
        ns.link("set", index=idx, ifname=peer_if, address=naming.guest_mac)
        ns.addr("add", index=idx, address=str(addressing.guest), prefixlen=addressing.prefixlen)
        ns.link("set", index=idx, state="up")
        ns.route("add", dst="default", gateway=str(addressing.gateway))

    in_netns(peer_ns, configure_peer)
    _configure_guest_link(naming.netns, naming.veth_host, addressing, naming.guest_mac)


def remove_gateway(naming: Naming) -> None:
    """Remove everything of this rig's plumbing (idempotent, safe after a partial set-up)."""
    with IPRoute() as ipr:
        for name in (naming.tap, naming.veth_host, f"{naming.prefix}p{naming.key}"):
            idx = _lookup(ipr, name)
            if idx is not None:
                _delete_link(ipr, name, idx)
    remove_namespace(naming.netns)


def _delete_link(ipr: IPRoute, name: str, idx: int) -> None:
    """Delete a link as a cleanup: already gone is fine; any other failure is
    logged (the link leaks until the next start's sweep), never raised."""
    try:
        ipr.link("del", index=idx)
    except NetlinkError as exc:
        if exc.code != errno.ENODEV:
            log.warning("cleanup failed: cannot delete link %s: %s", name, exc)


@dataclass(frozen=True, slots=True)
class Leftovers:
    namespaces: tuple[str, ...]
    links: tuple[str, ...]  #: host-namespace links (taps, veths) with the prefix

    def __bool__(self) -> bool:
        return bool(self.namespaces or self.links)


def _link_pattern(prefix: str) -> re.Pattern[str]:
    return re.compile(rf"^{re.escape(prefix)}[tvp][0-9a-f]{{10}}$")


def find_leftovers(prefix: str = DEFAULT_PREFIX) -> Leftovers:
    """Gateway namespaces and host links named with ``prefix`` (what a crash leaves)."""
    ns_re = re.compile(rf"^{re.escape(prefix)}-gw-[0-9a-f]{{10}}$")
    try:
        names = sorted(n for n in os.listdir(NETNS_DIR) if ns_re.match(n))
    except FileNotFoundError:
        names = []
    link_re = _link_pattern(prefix)
    with IPRoute() as ipr:
        links = sorted(ln.get_attr("IFLA_IFNAME") for ln in ipr.get_links()
                       if link_re.match(ln.get_attr("IFLA_IFNAME") or ""))
    return Leftovers(tuple(names), tuple(links))


def cleanup_leftovers(prefix: str = DEFAULT_PREFIX, keep: Iterable[str] = ()) -> Leftovers:
    """Remove leftovers except those of the rig ids in ``keep``; return what was removed."""
    kept = {Naming(r, prefix) for r in keep}  # names do not depend on the MAC
    keep_ns = {n.netns for n in kept}
    keep_links = {name for n in kept for name in (n.tap, n.veth_host, f"{n.prefix}p{n.key}")}
    found = find_leftovers(prefix)
    removed_links = []
    with IPRoute() as ipr:
        for name in found.links:
            if name in keep_links:
                continue
            idx = _lookup(ipr, name)
            if idx is not None:
                try:
                    ipr.link("del", index=idx)
                except NetlinkError as exc:
                    if exc.code != errno.ENODEV:
                        raise
                removed_links.append(name)
    removed_ns = [n for n in found.namespaces if n not in keep_ns]
    for name in removed_ns:
        remove_namespace(name)
    return Leftovers(tuple(removed_ns), tuple(removed_links))
