"""The escape table: a "guest" namespace behind a real gateway tries every way out of a fake internet.

Everything runs for real: network namespaces, veth/tap, the nftables ruleset,
the DNS responder and the proxy, and a fake internet (documentation ranges, a
10.x host, 169.254.169.254, an upstream and a foreign DNS server) served by
``netgate.fakenet`` in its own namespace. Only the VM is simulated: the
guest is a namespace whose programs (curl, dig, ping) play the hostile
guest. The table is printed; every row must hold.
"""

from __future__ import annotations

import fcntl
import os
import secrets
import select
import shutil
import signal
import struct
import subprocess
import sys
import threading
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest
import trio

from netgate import topology
from netgate.broker import SecretStore
from netgate.gateway import open_gateway
from netgate.netns import run_in_netns
from netgate.policy import Policy
from netgate.proxy import AuditEvent, Limits
from netgate.testing import FOREIGN_DNS, FakeInternet, GuestNs, leftovers, nft_tables

#: Unique per run, so another run's namespaces on the same host never look like ours.
PREFIX = "t" + secrets.token_hex(2)[:3]
SECRET = "rgt-SECRET-0f9c2b7e51d84a36"
ALLOW = ("allowed.test", "*.wild.test", "api.brokered.test", "internal.test", "metadata.test", "mixed.test")

needs_root = pytest.mark.skipif(
    os.geteuid() != 0 or not all(shutil.which(t) for t in ("ip", "nft", "curl", "dig", "ping")),
    reason="needs root, iproute2, nftables, curl, dig and ping",
)
pytestmark = [pytest.mark.netgate, needs_root]


@pytest.fixture(autouse=True)
def nothing_left_behind() -> Iterator[None]:
    before = leftovers(PREFIX)
    yield
    after = leftovers(PREFIX)
    assert after == before, f"test left network objects behind: {after}"


@pytest.fixture
def world() -> Iterator[FakeInternet]:
    fi = FakeInternet(PREFIX, extra_records={"mixed.test": ["192.0.2.10", "10.77.0.5"]}).start()
    try:
        yield fi
    finally:
        fi.close()


@pytest.fixture
def guest() -> Iterator[GuestNs]:
    g = GuestNs(PREFIX).create()
    try:
        yield g
    finally:
        g.close()


@dataclass
class Row:
    attempt: str
    expected: str
    observed: str
    ok: bool


class Table:
    def __init__(self) -> None:
        self.rows: list[Row] = []

    def add(self, attempt: str, expected: str, observed: str, ok: bool) -> None:
        self.rows.append(Row(attempt, expected, observed, ok))

    def render(self) -> str:
        w1 = max(len(r.attempt) for r in self.rows)
        w2 = max(len(r.expected) for r in self.rows)
        lines = [f"{'attempt from the guest':<{w1}}  {'expected':<{w2}}  result  observed",
                 f"{'-' * w1}  {'-' * w2}  ------  {'-' * 8}"]
        lines += [f"{r.attempt:<{w1}}  {r.expected:<{w2}}  {'PASS' if r.ok else 'FAIL':<6}  {r.observed}"
                  for r in self.rows]
        return "\n".join(lines)


class Guest:
    """Runs a command in the guest namespace without blocking the gateway's event loop."""

    def __init__(self, ns: GuestNs, world: FakeInternet, bundle: Path) -> None:
        self.ns = ns
        self.world = world
        self.bundle = bundle

    async def run(self, *argv: str, timeout: float = 20) -> subprocess.CompletedProcess[str]:
        return await trio.to_thread.run_sync(lambda: self.ns.run(*argv, timeout=timeout))

    async def curl(self, url: str, *extra: str, max_time: float = 4) -> tuple[int, str, str]:
        """(curl exit code, http status, body)."""
        r = await self.run("curl", "-sS", "-m", str(max_time), "--cacert", str(self.bundle), "-o", "-",
                           "-w", "\n%{http_code}", *extra, url)
        body, _, code = r.stdout.rpartition("\n")
        return r.returncode, code.strip(), body + r.stderr

    async def dig(self, *args: str) -> str:
        r = await self.run("dig", "+time=2", "+tries=1", *args)
        return r.stdout

    def hits(self, identity: str) -> int:
        return len(self.world.requests_to(identity))


def status_of(dig_output: str) -> str:
    for line in dig_output.splitlines():
        if "status:" in line:
            return line.split("status:")[1].split(",")[0].strip()
    return "no reply" if "timed out" in dig_output or "no servers" in dig_output else "?"


def answers_of(dig_output: str) -> list[str]:
    out, in_answer = [], False
    for line in dig_output.splitlines():
        if line.startswith(";; ANSWER SECTION"):
            in_answer = True
        elif in_answer and line.strip() and not line.startswith(";"):
            out.append(line.split()[-1])
        elif in_answer and not line.strip():
            in_answer = False
    return out


@pytest.mark.timeout(240)
async def test_escape_table(world: FakeInternet, guest: GuestNs, tmp_path: Path,
                            capsys: pytest.CaptureFixture[str], caplog: pytest.LogCaptureFixture) -> None:
    events: list[AuditEvent] = []
    store = SecretStore(tmp_path / "data")
    store.put("ws1", "fake-api", SECRET, ["api.brokered.test"])
    import ssl

    upstream_ssl = ssl.create_default_context(cafile=str(world.ca_pem_path))
    t = Table()
    policy = Policy(ALLOW)
    gw_netns = ""
    async with open_gateway("rig_escape", policy, audit=events.append, resolver_address=world.resolver,
                            upstream_netns=world.netns, broker=store, workspace="ws1", upstream_ssl=upstream_ssl,
                            prefix=PREFIX) as gw:
        gw_netns = gw.netns
        await gw.attach_veth(guest.netns)
        assert gw.ca_pem is not None
        bundle = tmp_path / "guest-ca-bundle.pem"
        bundle.write_text(world.ca_pem_path.read_text() + gw.ca_pem)
        g = Guest(guest, world, bundle)

        # --- allowed traffic is served ---------------------------------------------------------
        rc, code, body = await g.curl("http://allowed.test/")
        t.add("allowed name over HTTP", "served", f"{code} {body.strip()[:60]}",
              code == "200" and "site=allowed" in body)
        rc, code, body = await g.curl("https://allowed.test/")
        # The guest verified allowed.test's own certificate (trustme CA): passthrough, no MITM.
        t.add("allowed name over HTTPS", "served, site's own cert", f"{code} {body.strip()[:60]}",
              code == "200" and "site=allowed" in body)
        rc, code, body = await g.curl("https://a.wild.test/")
        t.add("wildcard *.wild.test over HTTPS", "served", f"{code} {body.strip()[:60]}",
              code == "200" and "site=wild" in body)
        out = await g.dig("allowed.test")
        t.add("dig allowed.test", "gateway's synthetic A", f"{status_of(out)} {answers_of(out)}",
              answers_of(out) == ["10.213.0.1"])

        # --- denied names --------------------------------------------------------------------
        out = await g.dig("denied.test")
        rc, code, body = await g.curl("http://denied.test/")
        t.add("denied name: DNS + HTTP", "no answer", f"dig {status_of(out)}; curl exit {rc}",
              status_of(out) == "NXDOMAIN" and rc == 6 and g.hits("denied") == 0)
        denied_before, allowed_before = g.hits("denied"), g.hits("allowed")
        rc, code, body = await g.curl("https://denied.test/", "--resolve", "denied.test:443:192.0.2.10")
        t.add("denied name forced to allowed IP (HTTPS)", "refused", f"curl exit {rc} ({_err(body)})",
              rc == 35 and g.hits("denied") == denied_before and g.hits("allowed") == allowed_before)
        rc, code, body = await g.curl("http://denied.test/", "--resolve", "denied.test:80:192.0.2.10")
        t.add("denied name forced to allowed IP (HTTP)", "refused", f"{code} {_first(body)}",
              code == "403" and g.hits("denied") == denied_before and g.hits("allowed") == allowed_before)
        rc, code, body = await g.curl("http://allowed.test/", "-H", "Host: denied.test")
        t.add("allowed name, denied Host (HTTP)", "refused", f"{code} {_first(body)}",
              code == "403" and g.hits("denied") == denied_before)
        rc, code, body = await g.curl("https://allowed.test/", "-H", "Host: denied.test")
        t.add("allowed SNI, denied Host (HTTPS passthrough)", "denied server not reached",
              f"{code}, answered by {body.split()[0] if body else '-'} (TLS is opaque)",
              g.hits("denied") == denied_before and "site=allowed" in body)
        rc, code, body = await g.curl("https://api.brokered.test/", "-H", "Host: denied.test")
        t.add("brokered SNI, denied Host (HTTPS)", "refused", f"{code}",
              code == "421" and g.hits("denied") == denied_before)

        # --- direct addresses ----------------------------------------------------------------
        rc, code, body = await g.curl("http://192.0.2.10/")
        t.add("direct IP over HTTP", "refused", f"{code} {_first(body)}", code == "403")
        rc, code, body = await g.curl("https://192.0.2.10/", "-k")
        t.add("direct IP over HTTPS (no SNI)", "refused", f"curl exit {rc} ({_err(body)})", rc == 35)
        rc, code, body = await g.curl("https://allowed.test/", "--resolve", "allowed.test:443:198.51.100.20")
        t.add("allowed SNI aimed at denied server's IP", "allowed server, not the aimed-at one",
              f"{code} {body.strip()[:30]}", "site=allowed" in body and g.hits("denied") == denied_before)

        # --- everything else is dropped --------------------------------------------------------
        rc, code, body = await g.curl("http://allowed.test:8080/", max_time=2)
        rc2, _, _ = await g.curl("http://192.0.2.10:22/", max_time=2)
        tcp_hits = [e for e in world.log() if e["event"] == "tcp"]
        t.add("other TCP ports (8080, 22)", "dropped", f"curl exit {rc}/{rc2}, server saw {len(tcp_hits)}",
              rc == 28 and rc2 == 28 and not tcp_hits)
        rc, _, _ = await g.curl("http://10.213.0.1:15080/", "-H", "Host: allowed.test", max_time=2)
        t.add("the proxy's own port, dialled directly", "dropped", f"curl exit {rc}", rc == 28)
        out = await g.dig(f"@{FOREIGN_DNS}", "denied.test")
        out2 = await g.dig(f"@{FOREIGN_DNS}", "allowed.test")
        foreign = [e for e in world.log() if e["event"] == "dns" and e["server"] == "foreign"]
        t.add(f"foreign DNS server (dig @{FOREIGN_DNS})", "intercepted, never reached",
              f"{status_of(out)} / {answers_of(out2)}, foreign server saw {len(foreign)}",
              status_of(out) == "NXDOMAIN" and answers_of(out2) == ["10.213.0.1"] and not foreign)
        out = await g.dig(f"@{FOREIGN_DNS}", "-p", "5353", "allowed.test")
        out_tcp = await g.dig("+tcp", "allowed.test")
        udp_hits = [e for e in world.log() if e["event"] == "udp"]
        t.add("DNS on another port; DNS over TCP", "dropped; intercepted",
              f"{status_of(out)}; tcp {answers_of(out_tcp)}",
              status_of(out) == "no reply" and answers_of(out_tcp) == ["10.213.0.1"] and not udp_hits)
        r = await g.run("bash", "-c", "echo hi >/dev/udp/192.0.2.10/9999; sleep 0.5")
        udp_hits = [e for e in world.log() if e["event"] == "udp"]
        t.add("other UDP (192.0.2.10:9999)", "dropped", f"server saw {len(udp_hits)}", not udp_hits)
        r = await g.run("ping", "-c", "1", "-W", "1", "192.0.2.10")
        r2 = await g.run("ping", "-c", "1", "-W", "1", "10.213.0.1")
        t.add("ICMP to the internet / to the gateway", "dropped", f"ping exit {r.returncode}/{r2.returncode}",
              r.returncode == 1 and r2.returncode == 1)
        await trio.to_thread.run_sync(guest.enable_ipv6)
        r = await g.run("ping", "-6", "-c", "1", "-W", "1", "2001:db8::10")
        rc, code, body = await g.curl("http://[2001:db8::10]/", "-6", max_time=2)
        t.add("IPv6 (ping, HTTP to 2001:db8::10)", "dropped", f"ping exit {r.returncode}, curl exit {rc}",
              r.returncode != 0 and rc != 0 and code in ("000", ""))

        # --- DNS rebinding -------------------------------------------------------------------
        rc, code, body = await g.curl("http://internal.test/")
        t.add("allowed name resolving to 10.77.0.5", "refused", f"{code} {_first(body)}",
              code == "403" and "private" in body and g.hits("internal") == 0)
        rc, code, body = await g.curl("https://metadata.test/")
        rc2, code2, body2 = await g.curl("http://metadata.test/latest/meta-data/")
        t.add("allowed name resolving to 169.254.169.254", "refused", f"https exit {rc}; http {code2}",
              rc == 35 and code2 == "403" and g.hits("metadata") == 0)
        rc, code, body = await g.curl("http://mixed.test/")
        t.add("allowed name with one 10.x answer of two", "refused", f"{code} {_first(body)}",
              code == "403" and g.hits("internal") == 0)

        # --- the credential broker -----------------------------------------------------------
        r = await g.run("curl", "-sS", "-v", "-m", "4", "--cacert", str(bundle), "https://api.brokered.test/x")
        arrived = world.requests_to("brokered")
        got = arrived[-1]["headers"].get("authorization") if arrived else None
        guest_saw = r.stdout + r.stderr
        t.add("brokered request (rig CA, secret injected)", "secret arrives, guest never sees it",
              f"server got Authorization={'Bearer <secret>' if got == f'Bearer {SECRET}' else got!r}; "
              f"guest output has secret: {SECRET in guest_saw}",
              got == f"Bearer {SECRET}" and "auth=yes" in r.stdout and SECRET not in guest_saw)
        r = await g.run("curl", "-sS", "-m", "4", "--cacert", str(world.ca_pem_path), "https://api.brokered.test/")
        t.add("brokered host without trusting the rig CA", "TLS fails (guest must opt in)",
              f"curl exit {r.returncode}", r.returncode == 60)

        # --- a live allowlist change -----------------------------------------------------------
        rc1, _, _ = await g.curl("http://later.test/")
        gw.set_allowlist(Policy((*ALLOW, "later.test")))
        rc2, code2, body2 = await g.curl("http://later.test/")
        gw.set_allowlist(Policy(ALLOW))
        _rc3, code3, _ = await g.curl("http://later.test/", "--resolve", "later.test:80:10.213.0.1")
        t.add("live allowlist change (add, then remove)", "takes effect at once",
              f"before exit {rc1}; added {code2}; removed {code3}",
              rc1 == 6 and code2 == "200" and "site=later" in body2 and code3 == "403")

        assert nft_tables(gw.netns).strip() == "table inet rigd_gw"

    store.close()
    # --- teardown ------------------------------------------------------------------------------
    remains = topology.find_leftovers(PREFIX)
    t.add("after teardown", "no namespace, link or nft table",
          f"namespaces {list(remains.namespaces)}, links {list(remains.links)}, "
          f"nft {nft_tables(gw_netns) or 'none'}",
          not remains and nft_tables(gw_netns) == "")

    # --- the audit log -----------------------------------------------------------------------------
    audit_text = "\n".join(repr(e) for e in events)
    log_text = caplog.text
    decisions = [e for e in events if e.phase == "decision" and e.kind != "dns"]
    t.add("audit: every connection decided, shape only", "decisions + bytes, no secret",
          f"{len(decisions)} decisions, {len([e for e in events if e.phase == 'closed'])} closed; "
          f"secret in audit/log: {SECRET in audit_text or SECRET in log_text}",
          SECRET not in audit_text and SECRET not in log_text
          and any(e.host == "denied.test" and not e.allowed for e in decisions)
          and any(e.brokered == "fake-api" and e.phase == "closed" and e.bytes_up > 0 for e in events))

    with capsys.disabled():
        print("\n\nESCAPE TABLE (guest namespace behind the netgate, fake internet in namespaces)\n")
        print(t.render())
        print()
    failed = [r for r in t.rows if not r.ok]
    assert not failed, "\n".join(f"{r.attempt}: {r.observed}" for r in failed)


def _first(body: str) -> str:
    return body.strip().splitlines()[0][:110] if body.strip() else "-"


def _err(body: str) -> str:
    for line in body.splitlines():
        if line.startswith("curl:"):
            return line.split(")", 1)[-1].strip()[:60]
    return "-"


# --- the tap path: what QEMU will use --------------------------------------------------------------

TUNSETIFF = 0x400454CA
IFF_TAP, IFF_NO_PI = 0x0002, 0x1000


def _open_tap(name: str) -> int:
    fd = os.open("/dev/net/tun", os.O_RDWR)
    fcntl.ioctl(fd, TUNSETIFF, struct.pack("16sH", name.encode(), IFF_TAP | IFF_NO_PI))
    return fd


def _relay(a: int, b: int, stop: threading.Event) -> None:
    """Copy Ethernet frames between two tap fds (what QEMU's virtio-net does for a guest)."""
    while not stop.is_set():
        ready, _, _ = select.select([a, b], [], [], 0.1)
        for fd in ready:
            try:
                frame = os.read(fd, 65536)
                os.write(b if fd == a else a, frame)
            except OSError:
                pass


def _guest_tap(ns: GuestNs, mac: str) -> int:
    fd = run_in_netns(ns.netns, _open_tap, "eth0")
    for argv in (["link", "set", "eth0", "address", mac], ["addr", "add", "10.213.0.2/30", "dev", "eth0"],
                 ["link", "set", "eth0", "up"], ["route", "add", "default", "via", "10.213.0.1"]):
        subprocess.run(["ip", "-n", ns.netns, *argv], check=True, capture_output=True)
    return fd


needs_tun = pytest.mark.skipif(not os.path.exists("/dev/net/tun"), reason="no /dev/net/tun")


#: A guest program that opens a connection to the gateway's port 80, sends ``argv[1]``
#: (maybe nothing), and prints what came back before the close.
_IDLE_CLIENT = """
import socket, sys
s = socket.create_connection(("10.213.0.1", 80), timeout=10)
if sys.argv[1]:
    s.sendall(sys.argv[1].encode())
got = b""
while True:
    chunk = s.recv(4096)
    if not chunk:
        break
    got += chunk
print(repr(got))
"""


@pytest.mark.timeout(60)
async def test_an_idle_connection_is_closed_without_an_answer(world: FakeInternet, guest: GuestNs) -> None:
    """A browser preconnects sockets and sends its request later: a refusal parked on a socket
    that asked nothing would be read as the answer to that request. So a connection that sent
    nothing within the sniff timeout is closed silently; one that sent part of a request is
    answered with the 403."""
    events: list[AuditEvent] = []
    limits = Limits(sniff_timeout=1.0)
    async with open_gateway("rig_idle", Policy(("allowed.test",)), audit=events.append,
                            resolver_address=world.resolver, upstream_netns=world.netns, prefix=PREFIX,
                            limits=limits) as gw:
        await gw.attach_veth(guest.netns)
        for sent, expect in (("", "b''"), ("GET / HTTP/1.1\r\n", "403 Forbidden")):
            r = await trio.to_thread.run_sync(
                lambda sent=sent: guest.run(sys.executable, "-c", _IDLE_CLIENT, sent, timeout=20))
            assert r.returncode == 0 and expect in r.stdout, (sent, r)
    reasons = [e.reason for e in events if e.kind == "http" and e.phase == "decision"]
    assert any(r.startswith("idle: nothing sent") for r in reasons), reasons
    assert "no server name within the sniff timeout" in reasons


@needs_tun
@pytest.mark.timeout(120)
async def test_tap_fd_path_carries_guest_traffic(world: FakeInternet, guest: GuestNs) -> None:
    """The server opens the tap inside the gateway namespace and hands the fd over (as to QEMU)."""
    events: list[AuditEvent] = []
    async with open_gateway("rig_tap", Policy(("allowed.test",)), audit=events.append,
                            resolver_address=world.resolver, upstream_netns=world.netns, prefix=PREFIX) as gw:
        gw_fd = await gw.open_tap_fd()
        guest_fd = await trio.to_thread.run_sync(_guest_tap, guest, gw.guest_mac)
        stop = threading.Event()
        relay = threading.Thread(target=_relay, args=(gw_fd, guest_fd, stop), daemon=True)
        relay.start()
        try:
            r = await trio.to_thread.run_sync(lambda: guest.run("curl", "-sS", "-m", "5", "http://allowed.test/"))
            assert "site=allowed" in r.stdout, r
            r = await trio.to_thread.run_sync(lambda: guest.run("curl", "-sS", "-m", "5", "http://denied.test/"))
            assert r.returncode == 6, r
            r = await trio.to_thread.run_sync(lambda: guest.run("ping", "-c", "1", "-W", "1", "192.0.2.10"))
            assert r.returncode == 1
            # No tap in the host namespace: it was born inside the gateway namespace.
            assert not topology.find_leftovers(PREFIX).links
        finally:
            stop.set()
            await trio.to_thread.run_sync(relay.join)
            os.close(gw_fd)
            os.close(guest_fd)
    assert not topology.find_leftovers(PREFIX)


@needs_tun
@pytest.mark.timeout(60)
async def test_named_tap_owned_by_rig_uid_moves_into_the_gateway() -> None:
    """The by-name path: a persistent tap owned by the rig's uid, attached, then moved in."""
    uid = 1_900_000_777
    async with open_gateway("rig_named_tap", Policy(()), audit=lambda e: None, prefix=PREFIX) as gw:
        name = await gw.create_tap(uid)
        details = subprocess.run(["ip", "-d", "link", "show", name], capture_output=True, text=True).stdout
        assert f"user {uid}" in details
        # Attach as QEMU would, with the rig's uid (the device node is opened first: it is 0600
        # on this host; attaching to the persistent tap is what the ownership governs).
        child = subprocess.Popen([sys.executable, "-c", f"""
import os, fcntl, struct, sys, time
fd = os.open('/dev/net/tun', os.O_RDWR)
os.setgid({uid}); os.setuid({uid})
fcntl.ioctl(fd, {TUNSETIFF}, struct.pack('16sH', b'{name}', {IFF_TAP | IFF_NO_PI}))
print('attached', flush=True)
sys.stdin.read()
"""], stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
        try:
            assert child.stdout is not None and child.stdout.readline().strip() == "attached"
            await gw.attach_tap()
            inside = subprocess.run(["ip", "-n", gw.netns, "-d", "link", "show", "guest0"], capture_output=True,
                                    text=True).stdout
            assert "state UP" in inside or "LOWER_UP" in inside or "UP" in inside.split(">")[0]
            assert subprocess.run(["ip", "link", "show", name], capture_output=True).returncode != 0
        finally:
            assert child.stdin is not None and child.stdout is not None
            child.stdin.close()
            child.wait(10)
            child.stdout.close()
    assert not topology.find_leftovers(PREFIX)


CRASHER = """
import sys, trio
from netgate.gateway import open_gateway
from netgate.policy import Policy

async def main():
    async with open_gateway("rig_crash", Policy(("a.example",)), audit=lambda e: None,
                            prefix=sys.argv[1]) as gw:
        await gw.create_tap(1900000778)
        print(gw.netns, gw.tap_name, flush=True)
        await trio.sleep_forever()

trio.run(main)
"""


@needs_tun
@pytest.mark.timeout(60)
def test_leftovers_after_kill_9_are_found_and_removed() -> None:
    proc = subprocess.Popen([sys.executable, "-c", CRASHER, PREFIX], stdout=subprocess.PIPE, text=True,
                            cwd=Path(__file__).resolve().parents[2])
    try:
        assert proc.stdout is not None
        netns_name, tap = proc.stdout.readline().split()
    finally:
        proc.send_signal(signal.SIGKILL)
        proc.wait(10)
        if proc.stdout is not None:
            proc.stdout.close()
    found = topology.find_leftovers(PREFIX)
    assert netns_name in found.namespaces and tap in found.links
    assert "rigd_gw" in nft_tables(netns_name)
    # A live rig's plumbing is kept when asked.
    kept = topology.cleanup_leftovers(PREFIX, keep=["rig_crash"])
    assert not kept and topology.find_leftovers(PREFIX) == found
    removed = topology.cleanup_leftovers(PREFIX)
    assert set(removed.namespaces) == {netns_name} and set(removed.links) == {tap}
    assert not topology.find_leftovers(PREFIX)
    assert nft_tables(netns_name) == ""
