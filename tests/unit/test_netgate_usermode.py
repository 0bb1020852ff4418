"""Rootless egress (QEMU user networking): the -netdev line, the relay hand-over, mode selection.

The relay tests stand in for slirp with a socketpair: one end goes to the
real helper command (parsed out of the -netdev line, run as QEMU would run
it), the other end plays the guest. Everything after the hand-over is the
same proxy and DNS responder the rootful gateway uses.
"""

from __future__ import annotations

import ipaddress
import os
import re
import shlex
import socket
import struct
import subprocess
import sys
from collections.abc import AsyncIterator
from pathlib import Path

import pytest
import trio

from netgate import dns
from netgate.policy import build_policy
from netgate.proxy import AuditEvent
from netgate.usermode import (
    HELPER_CODE,
    SANDBOX,
    USER_ADDRESSING,
    UserGate,
    guest_net_arg,
    netdev,
    open_user_gate,
)
from rigd.backends.gates import NetworkConfig
from rigd.backends.microvm_argv import SANDBOX as ROOTFUL_SANDBOX
from rigd.backends.qemu import QemuConfig
from rigd.backends.smolvm import rig_argv
from rigd.errors import RigdError
from rigd.images import TerminalAssets
from rigd.model import Accel
from rigd.server.main import CAP_NET_ADMIN, CAP_SYS_ADMIN, choose_network, effective_caps

PY = sys.executable


def qemu_opts(value: str) -> list[tuple[str, str]]:
    """Split a QemuOpts value the way QEMU does (``,,`` is a literal comma)."""
    parts = re.split(r"(?<!,),(?!,)", value)
    out = []
    for p in parts:
        p = p.replace(",,", ",")
        key, _, val = p.partition("=")
        out.append((key, val))
    return out


def helper_argv(netdev_value: str, port: int) -> list[str]:
    for key, val in qemu_opts(netdev_value):
        if key == "guestfwd" and val.startswith(f"tcp:{USER_ADDRESSING.gate}:{port}-cmd:"):
            return shlex.split(val.split("-cmd:", 1)[1])
    raise AssertionError(f"no guestfwd for port {port}")


# -- the command line -----------------------------------------------------------------------------


def test_netdev_is_restricted_ipv4_only_with_one_cmd_guestfwd_per_service(tmp_path: Path) -> None:
    value = netdev(tmp_path / "net.sock", python="/usr/bin/python3")
    opts = qemu_opts(value)
    assert opts[0] == ("user", "")
    d = dict(opts[1:5])
    assert d == {"id": "net0", "restrict": "on", "ipv6": "off", "net": "10.0.2.0/24"}
    assert ("host", "10.0.2.2") in opts
    fwds = [v for k, v in opts if k == "guestfwd"]
    assert [f.split("-cmd:")[0] for f in fwds] == [
        "tcp:10.0.2.100:80", "tcp:10.0.2.100:443", "tcp:10.0.2.100:53"]
    assert not any(k in ("hostfwd", "smb", "tftp", "bootfile") for k, _ in opts)
    for port, tag in ((80, "h"), (443, "t"), (53, "d")):
        argv = helper_argv(value, port)
        assert argv == ["/usr/bin/python3", "-I", "-S", "-c", HELPER_CODE, str(tmp_path / "net.sock"), tag]


def test_netdev_refuses_paths_the_helper_command_cannot_carry(tmp_path: Path) -> None:
    with pytest.raises(ValueError, match="spaces or quotes"):
        netdev(tmp_path / "a b" / "net.sock", python="/usr/bin/python3")
    with pytest.raises(ValueError):
        netdev(tmp_path / "net.sock", python="/opt/it's/python3")
    # A comma is fine: QEMU's escaping doubles it.
    value = netdev(tmp_path / "a,b" / "net.sock", python="/usr/bin/python3")
    assert helper_argv(value, 80)[5] == str(tmp_path / "a,b" / "net.sock")


def test_the_guest_is_told_slirps_addresses_and_to_resolve_over_tcp() -> None:
    assert guest_net_arg() == "rigd.net=10.0.2.15/24,10.0.2.2,10.0.2.100,use-vc"
    assert "spawn" not in SANDBOX and "elevateprivileges" not in SANDBOX
    assert "obsolete=deny" in SANDBOX and "resourcecontrol=deny" in SANDBOX


def _config(tmp_path: Path, mode: str | None) -> tuple[QemuConfig, TerminalAssets]:
    f = tmp_path / "x"
    f.write_bytes(b"x")
    assets = TerminalAssets(kernel=f, initrd=f, tools=f, oci_layout=tmp_path, image_digest="sha256:0",
                            kernel_release="6.1")
    net = None if mode is None else NetworkConfig(mode=mode, helper_python="/usr/bin/python3")
    return QemuConfig(data_dir=tmp_path, accel=Accel.TCG, network=net, warm_starts=False), assets


def test_rig_argv_in_user_mode(tmp_path: Path) -> None:
    kw = {"memory_mb": 512, "vcpus": 1, "rig_dir": Path("/@rig"), "overlay": Path("/@disk"),
          "mac": "02:00:00:00:00:00"}
    user = rig_argv(*_config(tmp_path, "user"), **kw)  # type: ignore[arg-type]
    gw = rig_argv(*_config(tmp_path, "gateway"), tap_fd="@fd", **kw)  # type: ignore[arg-type]
    nd = user[user.index("-netdev") + 1]
    assert nd.startswith("user,id=net0,restrict=on,ipv6=off,") and "/@rig/net.sock" in nd
    assert "fd=" not in nd
    assert user[user.index("-sandbox") + 1] == SANDBOX
    assert gw[gw.index("-sandbox") + 1] == ROOTFUL_SANDBOX and "spawn=deny" in ROOTFUL_SANDBOX
    assert "virtio-net-device,netdev=net0,mac=02:00:00:00:00:00" in user
    assert "rigd.net=10.0.2.15/24,10.0.2.2,10.0.2.100,use-vc" in user[user.index("-append") + 1]
    # The snapshot key hashes the argv shape: the modes never share a snapshot.
    assert user != gw
    with pytest.raises(ValueError):
        NetworkConfig(mode="bridge")


# -- mode selection ---------------------------------------------------------------------------------

CAPS = 1 << CAP_NET_ADMIN | 1 << CAP_SYS_ADMIN


@pytest.mark.parametrize(("requested", "euid", "caps", "missing", "slirp", "mode"), [
    ("auto", 0, CAPS, [], True, "gateway"),
    ("auto", 1000, 0, [], True, "user"),
    ("auto", 0, 1 << CAP_SYS_ADMIN, [], True, "user"),  # a root container without CAP_NET_ADMIN
    ("auto", 0, CAPS, ["nft"], True, "user"),
    ("auto", 1000, 0, [], False, None),
    ("user", 0, CAPS, [], True, "user"),
    ("user", 1000, 0, [], True, "user"),
    ("gateway", 0, CAPS, [], False, "gateway"),
    ("none", 0, CAPS, [], True, None),
])
def test_choose_network(requested: str, euid: int, caps: int, missing: list[str], slirp: bool,
                        mode: str | None) -> None:
    got, why = choose_network(requested, euid=euid, caps=caps, missing_tools=missing, qemu_user_net=slirp)
    assert got == mode and why


@pytest.mark.parametrize(("requested", "euid", "caps", "slirp", "match"), [
    ("gateway", 1000, 0, True, "not running as root"),
    ("gateway", 0, 1 << CAP_SYS_ADMIN, True, "no CAP_NET_ADMIN"),
    ("user", 1000, 0, False, "no user networking"),
    ("bridge", 0, CAPS, True, "not one of"),
])
def test_a_forced_mode_that_cannot_work_is_an_error(requested: str, euid: int, caps: int, slirp: bool,
                                                     match: str) -> None:
    with pytest.raises(RigdError, match=match):
        choose_network(requested, euid=euid, caps=caps, missing_tools=[], qemu_user_net=slirp)


def test_effective_caps_reads_proc_status(tmp_path: Path) -> None:
    status = tmp_path / "status"
    status.write_text("Name:\tx\nCapInh:\t0000000000000000\nCapEff:\t0000000000201000\n")
    caps = effective_caps(status)
    assert caps >> CAP_NET_ADMIN & 1 and caps >> CAP_SYS_ADMIN & 1
    assert effective_caps(tmp_path / "missing") == 0


# -- the relay -----------------------------------------------------------------------------------------

class Harness:
    def __init__(self, gate: UserGate, sock_path: Path, events: list[AuditEvent]) -> None:
        self.gate = gate
        self.sock_path = sock_path
        self.events = events
        self.value = netdev(sock_path, python=PY)

    async def connect(self, port: int) -> trio.SocketStream:
        """What slirp does for a guest connection to gate:port: a socket pair, the helper on one end."""
        guest_end, helper_end = socket.socketpair()
        with helper_end:
            fd = helper_end.fileno()
            proc = await trio.lowlevel.open_process(helper_argv(self.value, port), stdin=fd, stdout=fd, stderr=fd)
        assert await proc.wait() == 0
        guest_end.setblocking(False)
        return trio.SocketStream(trio.socket.from_stdlib_socket(guest_end))


@pytest.fixture
async def harness(tmp_path: Path) -> AsyncIterator[Harness]:
    events: list[AuditEvent] = []
    policy = build_policy("computer", ["allowed.test"], defaults=False)
    async with open_user_gate("rig_test", policy, audit=events.append,
                              resolver_address=("127.0.0.1", 9)) as gate:
        path = tmp_path / "net.sock"
        await gate.listen(path, owner_uid=os.getuid())
        assert path.stat().st_mode & 0o777 == 0o600
        yield Harness(gate, path, events)


async def dns_query(h: Harness, name: str) -> dns.Message:
    stream = await h.connect(53)
    async with stream:
        await stream.send_all(dns.TcpFramer.frame(dns.build_query(0x4242, name, dns.TYPE_A)))
        framer = dns.TcpFramer()
        with trio.fail_after(10):
            while True:
                data = await stream.receive_some(4096)
                assert data, "the gate closed without answering"
                msgs = framer.feed(data)
                if msgs:
                    return dns.parse_message(msgs[0])


async def http(h: Harness, head: bytes) -> bytes:
    stream = await h.connect(80)
    async with stream:
        await stream.send_all(head)
        out = b""
        with trio.fail_after(10):
            while data := await stream.receive_some(4096):
                out += data
        return out


async def test_dns_over_the_relay_answers_allowed_names_with_the_gate(harness: Harness) -> None:
    msg = await dns_query(harness, "allowed.test")
    assert msg.rcode == dns.RCODE_NOERROR
    assert [ipaddress.IPv4Address(r.rdata) for r in msg.answers] == [USER_ADDRESSING.gate]
    assert (await dns_query(harness, "denied.test")).rcode == dns.RCODE_NXDOMAIN
    assert harness.gate.accepted == 2 and harness.gate.rejected == 0
    assert [(e.kind, e.host, e.allowed) for e in harness.events] == [
        ("dns", "allowed.test", True), ("dns", "denied.test", False)]


async def test_a_live_allowlist_change_applies_to_the_next_query(harness: Harness) -> None:
    assert (await dns_query(harness, "later.test")).rcode == dns.RCODE_NXDOMAIN
    harness.gate.set_allowlist(build_policy("computer", ["later.test"], defaults=False))
    assert (await dns_query(harness, "later.test")).rcode == dns.RCODE_NOERROR


async def test_http_over_the_relay_is_the_same_proxy(harness: Harness) -> None:
    out = await http(harness, b"GET / HTTP/1.1\r\nHost: denied.test\r\n\r\n")
    assert out.startswith(b"HTTP/1.1 403") and b"denied.test" in out
    out = await http(harness, b"GET / HTTP/1.1\r\nHost: 10.0.2.100\r\n\r\n")
    assert out.startswith(b"HTTP/1.1 403") and b"direct IP" in out
    # Allowed, but the (deliberately dead) upstream resolver cannot resolve it: refused, not dialled.
    out = await http(harness, b"GET / HTTP/1.1\r\nHost: allowed.test\r\n\r\n")
    assert out.startswith(b"HTTP/1.1 403") and b"upstream DNS" in out


async def test_tls_refusals_are_an_access_denied_alert(harness: Harness) -> None:
    stream = await harness.connect(443)
    async with stream:
        await stream.send_all(b"\x16\x03\x01\x00\x05hello")  # no SNI to be found
        with trio.fail_after(10):
            data = await stream.receive_some(64)
    assert data == b"\x15\x03\x03\x00\x02\x02\x31"


async def _hand_over(path: Path, msg: bytes, fds: list[int]) -> bytes:
    s = trio.socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    with s:
        await s.connect(str(path))
        anc = [(socket.SOL_SOCKET, socket.SCM_RIGHTS, struct.pack(f"{len(fds)}i", *fds))] if fds else []
        await s.sendmsg([msg], anc)
        with trio.fail_after(10):
            try:
                return bytes(await s.recv(16))  # the gate closes its end: b""
            except ConnectionResetError:  # ... with our message unread (a reset)
                return b""


async def test_bad_hand_overs_are_refused_and_their_fds_closed(harness: Harness) -> None:
    r, w = os.pipe()
    a, b = socket.socketpair()
    udp = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
    try:
        assert await _hand_over(harness.sock_path, b"h", [r]) == b""  # not a socket
        assert await _hand_over(harness.sock_path, b"x", [a.fileno()]) == b""  # unknown tag
        assert await _hand_over(harness.sock_path, b"h", []) == b""  # no fd
        assert await _hand_over(harness.sock_path, b"h", [a.fileno(), b.fileno()]) == b""  # two fds
        assert await _hand_over(harness.sock_path, b"d", [udp.fileno()]) == b""  # not a stream
        await trio.sleep(0.1)
        assert harness.gate.rejected == 5 and harness.gate.accepted == 0
        # Our copies are still ours; the gate closed only the ones it received.
        os.fstat(r)
        assert len(os.listdir("/proc/self/fd")) < 200
    finally:
        for fd in (r, w):
            os.close(fd)
        for s in (a, b, udp):
            s.close()


async def test_only_qemus_uid_may_hand_over(tmp_path: Path) -> None:
    policy = build_policy("computer", ["allowed.test"], defaults=False)
    async with open_user_gate("rig_uid", policy, audit=lambda _e: None) as gate:
        path = tmp_path / "net.sock"
        await gate.listen(path, owner_uid=os.getuid() + 12345)
        a, b = socket.socketpair()
        with a, b:
            assert await _hand_over(path, b"d", [a.fileno()]) == b""
        await trio.sleep(0.05)
        assert gate.rejected == 1 and gate.accepted == 0


async def test_listen_again_replaces_the_listener(harness: Harness, tmp_path: Path) -> None:
    second = tmp_path / "second" / "net.sock"
    second.parent.mkdir()
    await harness.gate.listen(second, owner_uid=os.getuid())
    await trio.sleep(0.05)
    assert not harness.sock_path.exists()
    harness.sock_path = second
    harness.value = netdev(second, python=PY)
    assert (await dns_query(harness, "allowed.test")).rcode == dns.RCODE_NOERROR


def test_the_helper_fails_fast_when_the_gate_is_gone(tmp_path: Path) -> None:
    value = netdev(tmp_path / "nothing.sock", python=PY)
    a, b = socket.socketpair()
    with a, b:
        proc = subprocess.run(helper_argv(value, 80), stdin=b.fileno(), stdout=b.fileno(), stderr=b.fileno(),
                              timeout=30, check=False)
    assert proc.returncode != 0
