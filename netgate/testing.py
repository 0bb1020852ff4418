"""Test and benchmark fixtures: a fake internet and fake guests, in namespaces the caller owns.

Nothing here is used by the server. Everything it creates carries the
caller's prefix (tests use ``rgt``) and is removed by ``close()``, also after
a failure halfway through set-up; :func:`leftovers` finds anything that
escaped.

* :class:`FakeInternet`: a namespace ``<prefix>-net-<id>`` whose ``lo`` carries
  the sites' addresses (documentation ranges for the reachable internet, a
  10.x host and 169.254.169.254 for the rebinding checks), served by
  ``python -m netgate.fakenet`` (HTTP, HTTPS with a trustme CA, DNS, sinks)
  running inside it. Its request log shows what actually arrived.
* :class:`GuestNs`: a namespace ``<prefix>-guest-<id>`` standing in for a VM
  (a veth from the gateway, or a direct veth into the fake internet for the
  benchmark's baseline), with ``/etc/netns/<name>/resolv.conf`` so that
  ``ip netns exec`` gives its programs the right DNS server.
"""

from __future__ import annotations

import contextlib
import json
import logging
import os
import secrets
import subprocess
import sys
import tempfile
import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from pyroute2 import IPRoute, NetNS

from netgate import topology
from netgate.cleanup import remove_tree
from netgate.netns import NETNS_DIR

log = logging.getLogger("netgate.testing")


@dataclass(frozen=True, slots=True)
class Site:
    name: str
    address: str
    identity: str
    #: Documents this site serves as text/html (path → page); any other path answers as before.
    pages: tuple[tuple[str, str], ...] = ()


#: The escape table's world. Names end in .test (reserved; never real).
DEFAULT_SITES = (
    Site("allowed.test", "192.0.2.10", "allowed"),
    Site("a.wild.test", "192.0.2.11", "wild"),
    Site("denied.test", "198.51.100.20", "denied"),
    Site("api.brokered.test", "203.0.113.30", "brokered"),
    Site("later.test", "192.0.2.40", "later"),
    Site("internal.test", "10.77.0.5", "internal"),
    Site("metadata.test", "169.254.169.254", "metadata"),
)
UPSTREAM_DNS = "203.0.113.53"
FOREIGN_DNS = "198.51.100.53"


def _run(*argv: str, input: bytes | None = None, check: bool = True) -> subprocess.CompletedProcess[bytes]:
    return subprocess.run(argv, input=input, capture_output=True, check=check, timeout=60)


class FakeInternet:
    def __init__(self, prefix: str = "rgt", sites: Sequence[Site] = DEFAULT_SITES,
                 extra_records: dict[str, list[str]] | None = None) -> None:
        import trustme  # a test dependency: imported only where tests need it

        self.prefix = prefix
        self.netns = f"{prefix}-net-{secrets.token_hex(3)}"
        self.sites = tuple(sites)
        self.dir = Path(tempfile.mkdtemp(prefix=f"{prefix}-fakenet-"))
        self.ca = trustme.CA()
        self.ca_pem_path = self.dir / "ca.pem"
        self.ca.cert_pem.write_to_path(str(self.ca_pem_path))
        self.log_path = self.dir / "requests.jsonl"
        self.records: dict[str, list[str]] = {s.name: [s.address] for s in self.sites}
        self.records.update(extra_records or {})
        self._proc: subprocess.Popen[bytes] | None = None

    @property
    def resolver(self) -> tuple[str, int]:
        return (UPSTREAM_DNS, 53)

    def site(self, identity: str) -> Site:
        return next(s for s in self.sites if s.identity == identity)

    def start(self) -> FakeInternet:
        try:
            self._start()
        except BaseException:
            self.close()
            raise
        return self

    def _start(self) -> None:
        topology.create_namespace(self.netns)
        addrs = sorted({s.address for s in self.sites} | {UPSTREAM_DNS, FOREIGN_DNS})
        with NetNS(self.netns) as ns:
            lo = ns.link_lookup(ifname="lo")[0]
            for a in addrs:
                ns.addr("add", index=lo, address=a, prefixlen=32)
            ns.addr("add", index=lo, address="2001:db8::10", prefixlen=128)
        server = self.dir / "server.pem"
        key = self.dir / "server.key"
        leaf = self.ca.issue_cert(*[s.name for s in self.sites])
        leaf.cert_chain_pems[0].write_to_path(str(server))
        leaf.private_key_pem.write_to_path(str(key))
        ready = self.dir / "ready"
        config = {
            "log": str(self.log_path), "ready": str(ready), "cert_file": str(server), "key_file": str(key),
            "sites": [{"address": s.address, "identity": s.identity, "pages": dict(s.pages)}
                      for s in self.sites],
            "dns": [{"address": UPSTREAM_DNS, "name": "upstream"},
                    {"address": FOREIGN_DNS, "name": "foreign"}],
            "records": self.records,
            "tcp_sinks": [[self.site("allowed").address, 8080], [self.site("allowed").address, 22]],
            "udp_sinks": [[self.site("allowed").address, 9999], [FOREIGN_DNS, 5353]],
        }
        cfg = self.dir / "config.json"
        cfg.write_text(json.dumps(config))
        with open(self.dir / "fakenet.err", "wb") as err:
            self._proc = subprocess.Popen(
                ["ip", "netns", "exec", self.netns, sys.executable, "-m", "netgate.fakenet", str(cfg)],
                stdout=subprocess.DEVNULL, stderr=err, cwd=Path(__file__).resolve().parent.parent)
        deadline = time.monotonic() + 20
        while not ready.exists():
            if self._proc.poll() is not None or time.monotonic() > deadline:
                raise RuntimeError("fake internet did not start: "
                                   + (self.dir / "fakenet.err").read_text(errors="replace")[-2000:])
            time.sleep(0.02)

    def log(self) -> list[dict[str, Any]]:
        try:
            lines = self.log_path.read_text().splitlines()
        except FileNotFoundError:
            return []
        return [json.loads(line) for line in lines if line.strip()]

    def requests_to(self, identity: str) -> list[dict[str, Any]]:
        return [e for e in self.log() if e["event"] == "request" and e["site"] == identity]

    def close(self) -> None:
        if self._proc is not None and self._proc.poll() is None:
            self._proc.terminate()
            try:
                self._proc.wait(10)
            except subprocess.TimeoutExpired:
                self._proc.kill()
                self._proc.wait(10)
        topology.remove_namespace(self.netns)
        remove_tree(self.dir, log=log)


@dataclass
class GuestNs:
    """A namespace standing in for a guest VM."""

    prefix: str = "rgt"
    nameserver: str = str(topology.ADDRESSING.dns)
    netns: str = field(init=False)
    _etc: Path = field(init=False)

    def __post_init__(self) -> None:
        self.netns = f"{self.prefix}-guest-{secrets.token_hex(3)}"
        self._etc = Path("/etc/netns") / self.netns

    def create(self) -> GuestNs:
        topology.create_namespace(self.netns)
        self._etc.mkdir(parents=True, exist_ok=True)
        (self._etc / "resolv.conf").write_text(
            f"nameserver {self.nameserver}\noptions timeout:1 attempts:1\n")
        return self

    def enable_ipv6(self, address: str = "2001:db8:99::2", gateway: str = "2001:db8:99::1") -> None:
        """Give the guest an IPv6 address and default route (to show IPv6 goes nowhere)."""
        _run("ip", "netns", "exec", self.netns, "sysctl", "-q", "-w", "net.ipv6.conf.eth0.disable_ipv6=0")
        _run("ip", "-n", self.netns, "-6", "addr", "add", f"{address}/64", "dev", "eth0", "nodad")
        _run("ip", "-n", self.netns, "-6", "route", "add", "default", "via", gateway, "dev", "eth0")

    def run(self, *argv: str, timeout: float = 30) -> subprocess.CompletedProcess[str]:
        return subprocess.run(["ip", "netns", "exec", self.netns, *argv], capture_output=True, text=True,
                              timeout=timeout, check=False)

    def close(self) -> None:
        topology.remove_namespace(self.netns)
        remove_tree(self._etc, log=log)


def direct_veth(guest: GuestNs, world: FakeInternet, guest_addr: str = "10.214.0.2",
                world_addr: str = "10.214.0.1") -> None:
    """Connect a guest namespace straight to the fake internet (no gateway): the benchmark's baseline."""
    tag = secrets.token_hex(3)
    a, b = f"{guest.prefix}d{tag}a", f"{guest.prefix}d{tag}b"
    with IPRoute() as ipr:
        ipr.link("add", ifname=a, kind="veth", peer={"ifname": b})
        ipr.link("set", index=ipr.link_lookup(ifname=a)[0], net_ns_fd=guest.netns)
        ipr.link("set", index=ipr.link_lookup(ifname=b)[0], net_ns_fd=world.netns)
    with NetNS(guest.netns) as ns:
        idx = ns.link_lookup(ifname=a)[0]
        ns.link("set", index=idx, ifname="direct0")
        ns.addr("add", index=idx, address=guest_addr, prefixlen=30)
        ns.link("set", index=idx, state="up")
        for net in ("192.0.2.0/24", "198.51.100.0/24", "203.0.113.0/24"):
            ns.route("add", dst=net, gateway=world_addr)
    with NetNS(world.netns) as ns:
        idx = ns.link_lookup(ifname=b)[0]
        ns.addr("add", index=idx, address=world_addr, prefixlen=30)
        ns.link("set", index=idx, state="up")


@dataclass(frozen=True, slots=True)
class Remains:
    namespaces: tuple[str, ...]
    links: tuple[str, ...]
    netns_etc: tuple[str, ...]


def leftovers(prefix: str = "rgt") -> Remains:
    """Anything with the test prefix still on the machine: namespaces, host links, /etc/netns dirs."""
    try:
        names = tuple(sorted(n for n in os.listdir(NETNS_DIR) if n.startswith(f"{prefix}-")))
    except FileNotFoundError:
        names = ()
    with IPRoute() as ipr:
        links = tuple(sorted(n for n in (ln.get_attr("IFLA_IFNAME") for ln in ipr.get_links())
                             if n and n.startswith(prefix)))
    etc: tuple[str, ...] = ()
    with contextlib.suppress(FileNotFoundError):
        etc = tuple(sorted(n for n in os.listdir("/etc/netns") if n.startswith(f"{prefix}-")))
    return Remains(names, links, etc)


def nft_tables(netns_name: str) -> str:
    """``nft list tables`` inside a namespace ('' when the namespace is gone)."""
    if not (NETNS_DIR / netns_name).exists():
        return ""
    return _run("ip", "netns", "exec", netns_name, "nft", "list", "tables", check=False).stdout.decode()
