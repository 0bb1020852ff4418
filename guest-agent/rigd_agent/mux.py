"""rigd in-guest port multiplexer (docs/ports.md).

How this works
--------------
One process per terminal rig, started by the host through the agent, speaks
on the virtio-serial port ``rigd.ports``: one connection from the host,
many streams over it, so forwarding needs no network route between host and
guest and works in every network mode. The host asks ``PORTS`` (which TCP
ports listen, read from /proc/net/tcp{,6}) and ``OPEN`` (connect to one on
the guest's loopback); bytes then flow as ``DATA`` frames under a per-stream
credit window in each direction, with ``EOF`` (half-close) and ``CLOSE``.

Frames are ``type:u8 stream:u32 length:u32`` then ``length`` bytes. A sync
marker (``MAGIC``) precedes every ``HELLO`` in both directions: after a
restart or a garbled frame the reader drops bytes until it sees one, and a
``HELLO`` from the host resets every stream. Guest port 7911 is the mux's
(bound, never listened on, never reported).

Like the agent, it uses only the Python 3.11 standard library (it runs from
the read-only tools disk with its own interpreter), is single-threaded
(one ``selectors`` loop, non-blocking everything) and caps what it holds:
streams, bytes buffered per stream, bytes queued for the host.
"""

from __future__ import annotations

import contextlib
import errno
import json
import os
import selectors
import socket
import struct
import sys
import time
from typing import Any

from rigd_agent.channel import find_port

PORT_NAME = "rigd.ports"
RESERVED_PORT = 7911
MAGIC = b"\x00RIGD-MUX-SYNC\x00\xff"
HEADER = struct.Struct(">BII")
MAX_PAYLOAD = 64 * 1024
CHUNK = 32 * 1024  # a virtio port takes at most 32 KiB per write
WINDOW = 256 * 1024  # bytes a sender may have unacknowledged per stream
MAX_STREAMS = 256
MAX_LISTED = 512  # listening ports reported per answer
OUT_CAP = 1 << 20  # bytes queued for the host before sockets stop being read
DRAIN = 256 * 1024  # bytes read from the port before they are acted on
VERSION = 1

HELLO, OPEN, OPENED, DATA, CREDIT, EOF, CLOSE, PORTS = range(1, 9)
TCP_LISTEN = "0A"


def log(msg: str) -> None:
    with contextlib.suppress(Exception):
        sys.stderr.write(f"rigd-mux[{os.getpid()}]: {msg}\n")
        sys.stderr.flush()


def frame(kind: int, sid: int = 0, payload: bytes = b"") -> bytes:
    return HEADER.pack(kind, sid, len(payload)) + payload


# --------------------------------------------------------------------------
# discovery


def _addr4(hexaddr: str) -> str:
    return socket.inet_ntop(socket.AF_INET, bytes.fromhex(hexaddr)[::-1])


def _addr6(hexaddr: str) -> str:
    raw = bytes.fromhex(hexaddr)
    return socket.inet_ntop(socket.AF_INET6, b"".join(raw[i:i + 4][::-1] for i in range(0, 16, 4)))


def parse_proc_net(text: str, family: int) -> list[tuple[str, int]]:
    """``(address, port)`` of every listening socket in /proc/net/tcp or tcp6 text."""
    out: list[tuple[str, int]] = []
    for line in text.splitlines()[1:]:
        fields = line.split()
        if len(fields) < 4 or fields[3] != TCP_LISTEN:
            continue
        addr, _, port = fields[1].partition(":")
        try:
            host = _addr4(addr) if family == socket.AF_INET else _addr6(addr)
            out.append((host, int(port, 16)))
        except (ValueError, OSError):
            continue
    return out


def listening(root: str = "/proc/net") -> dict[int, list[str]]:
    """Listening TCP ports (the mux's own excluded) and the addresses each is bound to."""
    found: dict[int, list[str]] = {}
    for name, family in (("tcp", socket.AF_INET), ("tcp6", socket.AF_INET6)):
        try:
            with open(f"{root}/{name}") as f:
                text = f.read()
        except OSError:
            continue
        for host, port in parse_proc_net(text, family):
            if port == RESERVED_PORT or port == 0:
                continue
            hosts = found.setdefault(port, [])
            if host not in hosts:
                hosts.append(host)
    return found


def targets(bound: list[str] | None) -> list[tuple[int, str]]:
    """Where to connect for a port bound to ``bound`` (loopback first)."""
    if not bound:
        return [(socket.AF_INET, "127.0.0.1"), (socket.AF_INET6, "::1")]
    out: list[tuple[int, str]] = []
    for host in bound:
        if host == "0.0.0.0" or host.startswith("127."):
            pick = (socket.AF_INET, "127.0.0.1" if host == "0.0.0.0" else host)
        elif host in ("::", "::1"):
            pick = (socket.AF_INET6, "::1")
        elif host.startswith("::ffff:") and "." in host:
            pick = (socket.AF_INET, host[7:])
        else:
            pick = (socket.AF_INET6 if ":" in host else socket.AF_INET, host)
        if pick not in out:
            out.append(pick)
    out.sort(key=lambda t: 0 if t[1] in ("127.0.0.1", "::1") else 1)
    return out


# --------------------------------------------------------------------------
# streams


class Stream:
    __slots__ = (
        "connecting",
        "consumed",
        "host_eof",
        "port",
        "read_eof",
        "shut_wr",
        "sid",
        "sock",
        "to_sock",
        "tries",
        "unacked",
    )

    def __init__(self, sid: int, port: int, tries: list[tuple[int, str]]) -> None:
        self.sid = sid
        self.port = port
        self.sock: socket.socket | None = None
        self.connecting = True
        self.tries = tries
        self.to_sock = bytearray()
        self.unacked = 0  # bytes sent to the host, not yet credited
        self.consumed = 0  # bytes written to the socket, not yet credited to the host
        self.read_eof = False
        self.host_eof = False
        self.shut_wr = False


class Mux:
    def __init__(self, fd: int, port: int = 0, proc_net: str = "/proc/net") -> None:
        self.fd = fd
        self.port = port  # the service port to forward to (for tests); 0: as asked
        self.proc_net = proc_net
        self.sel = selectors.DefaultSelector()
        self.streams: dict[int, Stream] = {}
        self.inbuf = bytearray()
        self.out = bytearray()
        self.synced = False
        self.last_scan: dict[int, list[str]] = {}
        self.registered: dict[int, int] = {}  # fd -> events
        self.rbuf = bytearray(CHUNK)
        self.rbuf_view = memoryview(self.rbuf)

    # -- host side --------------------------------------------------------

    def send(self, kind: int, sid: int = 0, payload: bytes = b"") -> None:
        self.out += frame(kind, sid, payload)

    def send_raw(self, data: memoryview) -> None:
        """A whole frame: written at once when nothing waits before it, else queued."""
        if not self.out:
            try:
                n = os.write(self.fd, data)
            except OSError:
                n = 0  # full (or the host is going): queued, and flush() meets it
            data = data[n:]
        if data:
            self.out += data

    def reset(self) -> None:
        for stream in list(self.streams.values()):
            self.drop(stream)
        self.out.clear()

    def feed(self, data: bytes) -> None:
        """Act on every whole frame received; payloads are views into the buffer (no copy)."""
        self.inbuf += data
        pos = 0
        view = memoryview(self.inbuf)
        try:
            while True:
                if not self.synced:
                    at = self.inbuf.find(MAGIC, pos)
                    if at < 0:
                        pos = max(pos, len(self.inbuf) - len(MAGIC) + 1)
                        return
                    pos = at + len(MAGIC)
                    self.synced = True
                if len(self.inbuf) - pos < HEADER.size:
                    return
                kind, sid, length = HEADER.unpack_from(self.inbuf, pos)
                if length > MAX_PAYLOAD or not HELLO <= kind <= PORTS:
                    log(f"bad frame from the host (type {kind}, length {length}): resyncing")
                    self.reset()
                    self.synced = False
                    continue
                end = pos + HEADER.size + length
                if len(self.inbuf) < end:
                    return
                payload = view[pos + HEADER.size:end]
                pos = end
                try:
                    self.handle(kind, sid, payload)
                finally:
                    payload.release()
        finally:
            view.release()
            del self.inbuf[:pos]

    def handle(self, kind: int, sid: int, payload: memoryview) -> None:
        if kind == HELLO:
            self.reset()
            self.out += MAGIC
            info = {"v": VERSION, "pid": os.getpid(), "window": WINDOW, "maxStreams": MAX_STREAMS,
                    "reserved": RESERVED_PORT}
            self.send(HELLO, 0, json.dumps(info).encode())
        elif kind == PORTS:
            self.last_scan = listening(self.proc_net)
            ports = sorted(self.last_scan)
            doc = {"ports": [{"port": p, "bound": self.last_scan[p][:4]} for p in ports[:MAX_LISTED]],
                   "total": len(ports)}
            self.send(PORTS, 0, json.dumps(doc).encode())
        elif kind == OPEN:
            self.open(sid, payload)
        else:
            stream = self.streams.get(sid)
            if stream is None:
                return  # closed here already; the host learns from our CLOSE
            if kind == DATA:
                if len(stream.to_sock) + len(payload) > WINDOW:
                    self.close(stream, "the host sent past its window")
                    return
                if stream.to_sock or stream.connecting or stream.sock is None:
                    stream.to_sock += payload
                    return
                try:  # nothing waits before it: straight from the port's buffer to the socket
                    n = stream.sock.send(payload)
                except BlockingIOError:
                    n = 0
                except OSError as exc:
                    self.close(stream, (exc.strerror or "error").lower())
                    return
                stream.to_sock += payload[n:]
                self.credit(stream, n)
            elif kind == CREDIT and len(payload) == 4:
                stream.unacked = max(0, stream.unacked - struct.unpack(">I", payload)[0])
            elif kind == EOF:
                stream.host_eof = True
            elif kind == CLOSE:
                self.drop(stream)

    def open(self, sid: int, payload: memoryview) -> None:
        if len(payload) != 2 or sid == 0 or sid in self.streams:
            self.send(CLOSE, sid, b"bad open")
            return
        (port,) = struct.unpack(">H", payload)
        if port == 0 or port == RESERVED_PORT:
            self.send(CLOSE, sid, f"port {port} is not forwarded".encode())
            return
        if len(self.streams) >= MAX_STREAMS:
            self.send(CLOSE, sid, f"the guest holds {MAX_STREAMS} streams already".encode())
            return
        bound = self.last_scan.get(port)
        if bound is None:
            bound = listening(self.proc_net).get(port)
        stream = Stream(sid, port, targets(bound))
        self.streams[sid] = stream
        self.connect_next(stream, None)

    def connect_next(self, stream: Stream, why: str | None) -> None:
        port = stream.port
        if stream.sock is not None:
            self.unwatch(stream.sock)
            stream.sock.close()
            stream.sock = None
        while stream.tries:
            family, host = stream.tries.pop(0)
            try:
                sock = socket.socket(family, socket.SOCK_STREAM)
            except OSError as exc:
                why = exc.strerror
                continue
            sock.setblocking(False)
            sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
            code = sock.connect_ex((host, self.port or port))
            if code in (0, errno.EINPROGRESS):
                stream.sock = sock
                stream.connecting = True
                return
            why = os.strerror(code)
            sock.close()
        self.streams.pop(stream.sid, None)
        self.send(CLOSE, stream.sid, f"connecting to port {port}: {(why or 'refused').lower()}".encode())

    def close(self, stream: Stream, reason: str) -> None:
        self.send(CLOSE, stream.sid, reason.encode()[:512])
        self.drop(stream)

    def drop(self, stream: Stream) -> None:
        self.streams.pop(stream.sid, None)
        if stream.sock is not None:
            self.unwatch(stream.sock)
            stream.sock.close()
            stream.sock = None

    # -- the loop ---------------------------------------------------------

    def unwatch(self, sock: socket.socket) -> None:
        fd = sock.fileno()
        if self.registered.pop(fd, None) is not None:
            self.sel.unregister(fd)

    def watch(self, fd: int, events: int, data: Any) -> None:
        old = self.registered.get(fd)
        if events == 0:
            if old is not None:
                self.sel.unregister(fd)
                del self.registered[fd]
            return
        if old is None:
            self.sel.register(fd, events, data)
        elif old != events:
            self.sel.modify(fd, events, data)
        self.registered[fd] = events

    def interests(self) -> None:
        self.watch(self.fd, selectors.EVENT_READ | (selectors.EVENT_WRITE if self.out else 0), None)
        room = len(self.out) < OUT_CAP
        for stream in self.streams.values():
            if stream.sock is None:
                continue
            ev = 0
            if stream.connecting or stream.to_sock:
                ev |= selectors.EVENT_WRITE
            if not stream.connecting and not stream.read_eof and room and stream.unacked < WINDOW:
                ev |= selectors.EVENT_READ
            self.watch(stream.sock.fileno(), ev, stream)

    def on_socket(self, stream: Stream, mask: int) -> None:
        sock = stream.sock
        assert sock is not None
        if stream.connecting:
            if not mask & selectors.EVENT_WRITE:
                return
            code = sock.getsockopt(socket.SOL_SOCKET, socket.SO_ERROR)
            if code:
                self.connect_next(stream, os.strerror(code))
                return
            stream.connecting = False
            self.send(OPENED, stream.sid)
            return
        if mask & selectors.EVENT_READ:
            # Received straight behind room for the frame's header: under TCG every copy costs.
            want = min(CHUNK - HEADER.size, WINDOW - stream.unacked)
            try:
                n = sock.recv_into(self.rbuf_view[HEADER.size:HEADER.size + want])
            except BlockingIOError:
                n = -1
            except OSError as exc:
                self.close(stream, (exc.strerror or "error").lower())
                return
            if n == 0:
                stream.read_eof = True
                self.send(EOF, stream.sid)
            elif n > 0:
                stream.unacked += n
                HEADER.pack_into(self.rbuf, 0, DATA, stream.sid, n)
                self.send_raw(self.rbuf_view[:HEADER.size + n])
        if mask & selectors.EVENT_WRITE and stream.to_sock and not self.write_sock(stream):
            return
        self.settle(stream)

    def write_sock(self, stream: Stream) -> bool:
        """Pass what the host sent on to the socket; credit it back a quarter window at a time.
        False when the stream had to be closed."""
        assert stream.sock is not None
        try:
            n = stream.sock.send(stream.to_sock)
        except BlockingIOError:
            n = 0
        except OSError as exc:
            self.close(stream, (exc.strerror or "error").lower())
            return False
        del stream.to_sock[:n]
        self.credit(stream, n)
        return True

    def credit(self, stream: Stream, n: int) -> None:
        """``n`` more bytes went on to the socket: credit the host a quarter window at a time."""
        stream.consumed += n
        if stream.consumed >= WINDOW // 4:
            self.send(CREDIT, stream.sid, struct.pack(">I", stream.consumed))
            stream.consumed = 0

    def settle(self, stream: Stream) -> None:
        if stream.sock is None or stream.connecting:
            return
        if stream.host_eof and not stream.to_sock and not stream.shut_wr:
            stream.shut_wr = True
            with contextlib.suppress(OSError):
                stream.sock.shutdown(socket.SHUT_WR)
        if stream.shut_wr and stream.read_eof:
            self.close(stream, "")

    def flush(self) -> None:
        while self.out:
            try:
                n = os.write(self.fd, self.out[:CHUNK])
            except (BlockingIOError, InterruptedError):
                return
            del self.out[:n]

    def drain_port(self) -> bool:
        """Read what the port holds (it hands over a page at a time) up to ``DRAIN`` bytes,
        then act on it once; False when the host is gone."""
        got = bytearray()
        while len(got) < DRAIN:
            try:
                data = os.read(self.fd, 65536)
            except (BlockingIOError, InterruptedError):
                break
            if not data:
                if got:
                    self.feed(bytes(got))
                return False
            got += data
        if got:
            self.feed(bytes(got))
        return True

    def run(self) -> None:
        """Serve until the port fails; returns when the host hangs up."""
        while True:
            for stream in list(self.streams.values()):
                self.settle(stream)
            self.interests()
            for key, mask in self.sel.select(5.0):
                if key.data is None:
                    if mask & selectors.EVENT_READ and not self.drain_port():
                        return  # virtio-serial: the host is gone
                    if mask & selectors.EVENT_WRITE:
                        self.flush()
                else:
                    stream = key.data
                    if stream.sid in self.streams and stream.sock is not None \
                            and stream.sock.fileno() == key.fd:
                        self.on_socket(stream, mask)
            self.flush()


# --------------------------------------------------------------------------
# the port


def reserve() -> socket.socket | None:
    """Hold guest port 7911 (bound, not listening) so nothing else takes it."""
    sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    try:
        sock.bind(("127.0.0.1", RESERVED_PORT))
    except OSError as exc:
        log(f"cannot hold 127.0.0.1:{RESERVED_PORT}: {exc.strerror}")
        sock.close()
        return None
    return sock


def serve(path: str) -> int:
    try:
        fd = os.open(path, os.O_RDWR | os.O_NOCTTY | os.O_CLOEXEC | os.O_NONBLOCK)
    except OSError as exc:
        if exc.errno == errno.EBUSY:
            log(f"{path} is held by another process (a mux runs already)")
            return 0
        log(f"cannot open {path}: {exc.strerror}")
        return 1
    held = reserve()
    log(f"serving on {path}")
    mux = Mux(fd)
    idle = 0.0
    try:
        while True:
            mux.run()
            # The host hung up: forget every stream; wait for the next host.
            mux.reset()
            mux.inbuf.clear()
            mux.synced = False
            while True:
                idle = min(idle + 0.02, 0.2)
                time.sleep(idle)
                try:
                    data = os.read(fd, 65536)
                except (BlockingIOError, InterruptedError):
                    break  # connected, nothing to read yet
                if data:
                    mux.feed(data)
                    break
            idle = 0.0
    finally:
        if held is not None:
            held.close()


def main(argv: list[str] | None = None) -> int:
    args = sys.argv[1:] if argv is None else argv
    path = args[0] if args else find_port(PORT_NAME)
    if path is None:
        log(f"no virtio port named {PORT_NAME}")
        return 1
    return serve(path)


if __name__ == "__main__":
    sys.exit(main())
