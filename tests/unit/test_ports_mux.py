"""The port multiplexer's two halves without a VM (docs/ports.md): the host's
MuxClient against a scripted (and hostile) guest over an in-memory stream,
the guest's frame handling and /proc/net parsing, the dev router's pieces."""

from __future__ import annotations

import json
import socket
import struct
from pathlib import Path
from types import ModuleType

import pytest
import trio
import trio.testing
from rigd_agent import mux as mux_module

from rigd.errors import FieldError
from rigd.ports.devhttp import DevDomains, host_name, response
from rigd.ports.forwards import MUX_START_ARGV
from rigd.ports.mux import (
    HEADER,
    MAGIC,
    WINDOW,
    MuxClient,
    MuxError,
    StreamRefused,
    parse_ports,
)

HELLO, OPEN, OPENED, DATA, CREDIT, EOF, CLOSE, PORTS = range(1, 9)


def guest_module() -> ModuleType:
    return mux_module


def frame(kind: int, sid: int = 0, payload: bytes = b"") -> bytes:
    return HEADER.pack(kind, sid, len(payload)) + payload


class ScriptedGuest:
    """The guest's end of the stream: reads the host's frames, answers as told."""

    def __init__(self, stream: trio.abc.Stream) -> None:
        self.stream = stream
        self.buf = bytearray()
        self.synced = False

    async def next_frame(self) -> tuple[int, int, bytes]:
        while True:
            if not self.synced and MAGIC in self.buf:
                del self.buf[: self.buf.index(MAGIC) + len(MAGIC)]
                self.synced = True
            if self.synced and len(self.buf) >= HEADER.size:
                kind, sid, n = HEADER.unpack_from(self.buf)
                if len(self.buf) >= HEADER.size + n:
                    payload = bytes(self.buf[HEADER.size:HEADER.size + n])
                    del self.buf[:HEADER.size + n]
                    return kind, sid, payload
            data = await self.stream.receive_some(65536)
            assert data, "the host hung up"
            self.buf += data

    async def send(self, data: bytes) -> None:
        await self.stream.send_all(data)

    async def hello(self) -> None:
        kind, _sid, _ = await self.next_frame()
        assert kind == HELLO
        await self.send(b"junk from a dead mux" + MAGIC + frame(HELLO, 0, b'{"v": 1}'))


async def reader(mux: MuxClient) -> None:
    """The client's reader; its MuxError (the connection's end, said in ``mux.broken``) stays here."""
    with pytest.raises(MuxError):
        await mux.run()


def test_parse_ports_checks_what_the_guest_lists() -> None:
    got = parse_ports(json.dumps({"ports": [{"port": 8000, "bound": ["127.0.0.1"]},
                                            {"port": 443, "bound": ["::", 7]}], "total": 9}).encode())
    assert got.ports == {8000: ("127.0.0.1",), 443: ("::",)} and got.total == 9
    # A total below what is listed is not believed.
    assert parse_ports(b'{"ports": [{"port": 1}], "total": 0}').total == 1
    for bad, why in (
        (b"not json", "not JSON"),
        (b'{"ports": 5}', "no ports array"),
        (json.dumps({"ports": [{"port": p} for p in range(1, 600)]}).encode(), "at most 512"),
        (b'{"ports": [{"port": 0}]}', "bad port"),
        (b'{"ports": [{"port": 70000}]}', "bad port"),
        (b'{"ports": [{"port": true}]}', "bad port"),
        (b'{"ports": [{"port": 80, "bound": "x"}]}', "address list"),
    ):
        with pytest.raises(MuxError, match=why):
            parse_ports(bad)


async def test_a_stream_carries_bytes_both_ways_under_credit() -> None:
    host_end, guest_end = trio.testing.memory_stream_pair()
    mux = MuxClient(host_end, window=64 * 1024)
    guest = ScriptedGuest(guest_end)
    async with trio.open_nursery() as nursery:
        nursery.start_soon(reader, mux)
        nursery.start_soon(guest.hello)
        assert (await mux.hello(timeout_s=5))["v"] == 1

        async def accept() -> None:
            kind, sid, payload = await guest.next_frame()
            assert (kind, payload) == (OPEN, struct.pack(">H", 8000))
            await guest.send(frame(OPENED, sid) + frame(DATA, sid, b"hello ") + frame(DATA, sid, b"host")
                             + frame(DATA, sid, b"." * 20000) + frame(EOF, sid))

        nursery.start_soon(accept)
        stream = await mux.open(8000, timeout_s=5)
        got = b""
        while chunk := await stream.receive_some():
            got += chunk
        assert got == b"hello host" + b"." * 20000
        # The host credits what it read, a quarter window (16 KiB here) at a time.
        kind, sid, payload = await guest.next_frame()
        assert kind == CREDIT and sid == stream.sid and struct.unpack(">I", payload)[0] > 0
        # The host may not send past its window until the guest credits it back.
        sent = trio.Event()

        async def send_big() -> None:
            await stream.send_all(b"x" * (64 * 1024 + 10))
            sent.set()

        nursery.start_soon(send_big)
        seen = 0
        while seen < 64 * 1024:
            kind, _sid, payload = await guest.next_frame()
            assert kind == DATA
            seen += len(payload)
        assert seen == 64 * 1024
        await trio.testing.wait_all_tasks_blocked()
        assert not sent.is_set()
        await guest.send(frame(CREDIT, stream.sid, struct.pack(">I", 64 * 1024)))
        kind, _sid, payload = await guest.next_frame()
        assert kind == DATA and payload == b"x" * 10
        await sent.wait()
        await stream.aclose()
        assert (await guest.next_frame())[0] == CLOSE
        nursery.cancel_scope.cancel()


async def test_a_hostile_guest_is_contained() -> None:
    host_end, guest_end = trio.testing.memory_stream_pair()
    mux = MuxClient(host_end, window=1024)
    guest = ScriptedGuest(guest_end)
    async with trio.open_nursery() as nursery:
        nursery.start_soon(reader, mux)
        nursery.start_soon(guest.hello)
        await mux.hello(timeout_s=5)

        async def refuse_then_flood() -> None:
            _k, sid, _p = await guest.next_frame()
            await guest.send(frame(CLOSE, sid, b"connecting to port 1: connection refused"))
            _k, sid, _p = await guest.next_frame()
            # Frames for streams the host never opened are ignored; a stream past its window is closed.
            await guest.send(frame(OPENED, sid) + frame(DATA, 999, b"stray") + frame(OPENED, 12345)
                             + frame(DATA, sid, b"y" * 1025))

        nursery.start_soon(refuse_then_flood)
        with pytest.raises(StreamRefused, match="connection refused"):
            await mux.open(1, timeout_s=5)
        stream = await mux.open(2, timeout_s=5)
        with pytest.raises(trio.BrokenResourceError, match="past port 2's window"):
            while await stream.receive_some():
                pass
        assert mux.ignored >= 3
        kind, sid, _ = await guest.next_frame()
        assert (kind, sid) == (CLOSE, stream.sid)
        # A frame that breaks the format ends the connection, saying why.
        await guest.send(frame(77, 0, b""))
        with trio.fail_after(5):
            while mux.broken is None:
                await trio.sleep(0.01)
        assert "bad frame" in mux.broken
        with pytest.raises(MuxError):
            await mux.open(3)
        nursery.cancel_scope.cancel()


async def test_the_host_caps_streams_and_a_silent_guest_times_out() -> None:
    host_end, guest_end = trio.testing.memory_stream_pair()
    mux = MuxClient(host_end, max_streams=2)
    guest = ScriptedGuest(guest_end)
    async with trio.open_nursery() as nursery:
        nursery.start_soon(reader, mux)

        async def drain() -> None:
            while True:
                await guest.next_frame()

        nursery.start_soon(drain)
        with pytest.raises(MuxError, match="did not answer"):
            await mux.hello(timeout_s=0.3, every_s=0.1)
        with pytest.raises(StreamRefused, match="did not accept"):
            await mux.open(80, timeout_s=0.2)
        with pytest.raises(MuxError, match="did not list"):
            await mux.listening(timeout_s=0.2)
        nursery.cancel_scope.cancel()


async def test_a_guest_that_never_syncs_is_given_up() -> None:
    host_end, guest_end = trio.testing.memory_stream_pair()
    mux = MuxClient(host_end)
    async with trio.open_nursery() as nursery:
        nursery.start_soon(guest_end.send_all, b"\x01" * (5 << 20))
        with pytest.raises(MuxError, match="without a sync marker"):
            await mux.run()
        nursery.cancel_scope.cancel()


# -- the guest half ---------------------------------------------------------------------------

PROC_TCP = """\
  sl  local_address rem_address   st tx_queue rx_queue tr tm->when retrnsmt   uid  timeout inode
   0: 0100007F:1F40 00000000:0000 0A 00000000:00000000 00:00000000 00000000     0        0 1 1
   1: 00000000:0016 00000000:0000 0A 00000000:00000000 00:00000000 00000000     0        0 2 1
   2: 0100007F:1F40 0100007F:C350 01 00000000:00000000 00:00000000 00000000     0        0 3 1
   3: 0100007F:1EE7 00000000:0000 0A 00000000:00000000 00:00000000 00000000     0        0 4 1
"""
PROC_TCP6 = """\
  sl  local_address                         remote_address                        st
   0: 00000000000000000000000001000000:2382 00000000000000000000000000000000:0000 0A 0 0 0
   1: 00000000000000000000000000000000:0050 00000000000000000000000000000000:0000 0A 0 0 0
"""


def test_the_guest_reads_listening_sockets_from_proc(tmp_path: Path) -> None:
    mod = guest_module()
    (tmp_path / "tcp").write_text(PROC_TCP)
    (tmp_path / "tcp6").write_text(PROC_TCP6)
    found = mod.listening(str(tmp_path))
    # 8000 on loopback (the established one is not listening), 22 everywhere, 9090 on ::1 and
    # 80 on ::; 7911 (0x1EE7) is the mux's own and never reported.
    assert found == {8000: ["127.0.0.1"], 22: ["0.0.0.0"], 9090: ["::1"], 80: ["::"]}
    assert mod.targets(["0.0.0.0"]) == [(socket.AF_INET, "127.0.0.1")]
    assert mod.targets(["::"]) == [(socket.AF_INET6, "::1")]
    assert mod.targets(["10.0.2.15"]) == [(socket.AF_INET, "10.0.2.15")]
    assert mod.targets(None) == [(socket.AF_INET, "127.0.0.1"), (socket.AF_INET6, "::1")]


def test_the_guest_answers_hello_ports_and_refuses_what_it_must(tmp_path: Path) -> None:
    mod = guest_module()
    (tmp_path / "tcp").write_text(PROC_TCP)
    mux = mod.Mux(-1, proc_net=str(tmp_path))
    # Bytes before the marker (a previous host's leftovers) are dropped; HELLO resets.
    mux.feed(b"stale" + MAGIC + frame(HELLO, 0, b'{"v":1}') + frame(PORTS))
    out = bytes(mux.out)
    assert out.startswith(MAGIC)
    body = out[len(MAGIC):]
    kind, _sid, n = HEADER.unpack_from(body)
    assert kind == HELLO and json.loads(body[HEADER.size:HEADER.size + n])["reserved"] == 7911
    body = body[HEADER.size + n:]
    kind, _sid, n = HEADER.unpack_from(body)
    assert kind == PORTS
    doc = json.loads(body[HEADER.size:HEADER.size + n])
    assert {p["port"] for p in doc["ports"]} == {8000, 22} and doc["total"] == 2
    mux.out.clear()
    mux.feed(frame(OPEN, 5, struct.pack(">H", 7911)) + frame(OPEN, 0, struct.pack(">H", 80))
             + frame(OPEN, 6, b"x"))
    closes = []
    body = bytes(mux.out)
    while body:
        kind, sid, n = HEADER.unpack_from(body)
        closes.append((kind, sid, body[HEADER.size:HEADER.size + n].decode()))
        body = body[HEADER.size + n:]
    assert closes == [(CLOSE, 5, "port 7911 is not forwarded"), (CLOSE, 0, "bad open"),
                      (CLOSE, 6, "bad open")]
    # A frame that breaks the format drops what it held and waits for the next marker.
    mux.out.clear()
    mux.feed(frame(99, 1, b"") + frame(PORTS))
    assert not mux.synced and bytes(mux.out) == b""


# -- dev domains --------------------------------------------------------------------------------

def test_dev_domains_map_one_name_to_one_port_of_one_rig() -> None:
    d = DevDomains()
    d.set("rig_a", "app.test", 8000)
    d.set("rig_a", "app.test", 8000)  # the same mapping again is fine
    d.set("rig_a", "api.app.localhost", 9000)
    with pytest.raises(FieldError, match=r"mapped already \(to port 8000"):
        d.set("rig_a", "app.test", 9000)
    with pytest.raises(FieldError, match="another rig"):
        d.set("rig_b", "app.test", 8000)
    with pytest.raises(FieldError) as err:
        d.set("rig_b", "App.test", 8000)
    assert err.value.field == "name"
    assert d.ports_of("rig_a") == {8000: ["app.test"], 9000: ["api.app.localhost"]}
    assert d.unset("rig_b", "app.test") is False and d.resolve("app.test") is not None
    d.drop_rig("rig_a")
    assert d.resolve("app.test") is None and d.of_rig("rig_a") == {}


def test_the_router_reads_one_host_header() -> None:
    assert host_name(b"GET / HTTP/1.1\r\nHost: App.Test:8080") == "app.test"
    assert host_name(b"GET / HTTP/1.1\r\nhost: app.localhost.") == "app.localhost"
    assert host_name(b"GET / HTTP/1.1\r\nUser-Agent: x") is None
    assert host_name(b"GET / HTTP/1.1\r\nHost: a.test\r\nHost: b.test") is None
    assert host_name(b"GET / HTTP/1.1\r\nHost: [::1]:80") is None
    assert host_name(b"GET / HTTP/1.1\r\nHost: \xff.test") is None
    reply = response("404 Not Found", "rigd: no rig serves x.test")
    head, _, body = reply.partition(b"\r\n\r\n")
    assert b"Content-Length: %d" % len(body) in head and b"Connection: close" in head


def test_the_mux_is_started_from_the_tools_disk_detached() -> None:
    script = MUX_START_ARGV[-1]
    assert MUX_START_ARGV[:3] == ("/.rigd/bin/busybox", "sh", "-c")
    assert "setsid" in script and script.rstrip().endswith("&")
    assert "/.rigd/agent/rigd_mux.py" in script and "env -i" in script
    assert WINDOW == 256 * 1024


async def _never(_argv: tuple[str, ...]) -> None:
    raise AssertionError("nothing runs in a guest here")


async def _nothing() -> None:
    return None


def test_a_lan_share_is_refused_unless_the_operator_allowed_it() -> None:
    from rigd.errors import Conflict
    from rigd.ports.forwards import Forward, RigPorts

    ports = RigPorts("rig_a", Path("/nonexistent/ports.sock"), _never, awake=lambda: True,
                     on_connect=_nothing, lan_allowed=False,
                     domains_of=lambda _rid: {8000: ["app.test"]})
    ports.state.forwards[8000] = Forward(8000, 18000, trio.CancelScope())
    with pytest.raises(Conflict, match="--allow-lan-ports"):
        ports.share(8000, True)
    with pytest.raises(FieldError) as err:
        ports.share(9000, True)
    assert err.value.field == "guestPort"
    ports.share(8000, False)  # unsharing what is not shared is fine
    described = ports.describe()
    assert described["ports"] == [{
        "guestPort": 8000, "hostPort": 18000, "url": "http://127.0.0.1:18000/", "shared": False,
        "lanPort": None, "lanUrl": None, "domain": "app.test", "connections": 0}]
    assert described["ready"] is False and described["notForwarded"] == []
