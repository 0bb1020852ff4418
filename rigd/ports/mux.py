"""The host side of a rig's port multiplexer (docs/ports.md): one connection to
the guest's ``rigd.ports`` virtio-serial port, many streams over it.

The guest is hostile: every frame it sends is parsed at the edge (type,
stream, length ≤ 64 KiB), a stream it names that the host did not open is
ignored, a stream that sends past its window is closed, and answers larger
than the caps end the connection. The host opens every stream (ids are
never reused), holds at most ``max_streams`` at once, and writes every
frame under one send lock.
"""

from __future__ import annotations

import contextlib
import json
import logging
import struct
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

import trio

from rigd.errors import RigdError

MAGIC = b"\x00RIGD-MUX-SYNC\x00\xff"
HEADER = struct.Struct(">BII")
MAX_PAYLOAD = 64 * 1024
CHUNK = 32 * 1024
WINDOW = 256 * 1024
MAX_STREAMS = 256
#: Bytes dropped while looking for the sync marker before the connection is given up.
MAX_SYNC_SKIP = 4 << 20
MAX_LISTED = 512

HELLO, OPEN, OPENED, DATA, CREDIT, EOF, CLOSE, PORTS = range(1, 9)

log = logging.getLogger("rigd.ports")


class MuxError(RigdError):
    """The multiplexer connection broke or the guest spoke out of turn."""


class StreamRefused(RigdError):
    """The guest could not connect to the port (or refused the stream)."""


@dataclass(frozen=True, slots=True)
class Listening:
    """What the guest says listens: port → bound addresses, and how many it has in all."""

    ports: Mapping[int, tuple[str, ...]]
    total: int


def parse_ports(payload: bytes) -> Listening:
    """A ``PORTS`` answer, checked: ports 1-65535, at most 512 listed, bound addresses as short strings."""
    try:
        doc = json.loads(payload)
    except (ValueError, UnicodeDecodeError) as exc:
        raise MuxError(f"the guest's port list is not JSON: {exc}") from None
    if not isinstance(doc, dict) or not isinstance(doc.get("ports"), list):
        raise MuxError("the guest's port list has no ports array")
    items = doc["ports"]
    if len(items) > MAX_LISTED:
        raise MuxError(f"the guest listed {len(items)} ports (at most {MAX_LISTED})")
    ports: dict[int, tuple[str, ...]] = {}
    for item in items:
        port = item.get("port") if isinstance(item, dict) else None
        if not isinstance(port, int) or isinstance(port, bool) or not 1 <= port <= 65535:
            raise MuxError(f"the guest's port list has a bad port: {str(item)[:60]}")
        bound = item.get("bound", [])
        if not isinstance(bound, list):
            raise MuxError("the guest's port list has a bad address list")
        ports[port] = tuple(str(b)[:45] for b in bound[:4] if isinstance(b, str))
    total = doc.get("total", len(ports))
    if not isinstance(total, int) or isinstance(total, bool) or total < len(ports):
        total = len(ports)
    return Listening(ports, total)


class MuxStream(trio.abc.HalfCloseableStream):
    """One TCP connection to a guest port, as a Trio stream."""

    def __init__(self, mux: MuxClient, sid: int, port: int) -> None:
        self._mux = mux
        self.sid = sid
        self.port = port
        self._buf = bytearray()
        self._changed = trio.Event()
        self._opened = False
        self._eof = False
        self._closed_reason: str | None = None  # set once the stream is over
        self._unacked = 0
        self._consumed = 0
        self._sent_eof = False
        self._recv_lock = trio.Lock()

    # -- fed by the reader ----------------------------------------------------

    def _wake(self) -> None:
        self._changed.set()
        self._changed = trio.Event()

    def _on_data(self, payload: bytes) -> bool:
        if len(self._buf) + len(payload) > self._mux.window:
            return False
        self._buf += payload
        self._wake()
        return True

    def _on_credit(self, n: int) -> None:
        self._unacked = max(0, self._unacked - n)
        self._wake()

    def _on_end(self, reason: str) -> None:
        if self._closed_reason is None:
            self._closed_reason = reason
        self._wake()

    # -- the Trio stream ------------------------------------------------------

    async def _opened_or_refused(self) -> None:
        while not self._opened:
            if self._closed_reason is not None:
                raise StreamRefused(self._closed_reason or f"the guest closed port {self.port}")
            await self._changed.wait()

    async def send_all(self, data: bytes | bytearray | memoryview) -> None:
        view = memoryview(data)
        while view:
            while self._unacked >= self._mux.window and self._closed_reason is None:
                await self._changed.wait()
            if self._closed_reason is not None or self._sent_eof:
                raise trio.BrokenResourceError(self._closed_reason or "the stream is closed")
            room = min(CHUNK, self._mux.window - self._unacked)
            piece, view = bytes(view[:room]), view[room:]
            self._unacked += len(piece)
            await self._mux._send(DATA, self.sid, piece)

    async def wait_send_all_might_not_block(self) -> None:
        while self._unacked >= self._mux.window and self._closed_reason is None:
            await self._changed.wait()

    async def send_eof(self) -> None:
        if self._sent_eof or self._closed_reason is not None:
            return
        self._sent_eof = True
        await self._mux._send(EOF, self.sid)

    async def receive_some(self, max_bytes: int | None = None) -> bytes:
        async with self._recv_lock:
            while not self._buf and not self._eof and self._closed_reason is None:
                await self._changed.wait()
            if not self._buf:
                if self._closed_reason:
                    raise trio.BrokenResourceError(self._closed_reason)
                return b""
            n = len(self._buf) if max_bytes is None else min(max_bytes, len(self._buf))
            out = bytes(self._buf[:n])
            del self._buf[:n]
            self._consumed += n
            # Credit in quarters of the window: a frame per read would wake the guest's
            # emulated CPU for 13 bytes each time (bench/ports.py).
            if self._consumed >= self._mux.window // 4:
                credit, self._consumed = self._consumed, 0
                if self._closed_reason is None:
                    await self._mux._send(CREDIT, self.sid, struct.pack(">I", credit))
            return out

    async def aclose(self) -> None:
        if self._closed_reason is None:
            self._closed_reason = "closed by the host"
            self._wake()
            self._mux._forget(self.sid)
            with (trio.CancelScope(shield=True), trio.move_on_after(1),
                  contextlib.suppress(MuxError, trio.BrokenResourceError, trio.ClosedResourceError)):
                await self._mux._send(CLOSE, self.sid)
        await trio.lowlevel.checkpoint()


class MuxClient:
    """Speak to one guest mux over ``stream`` (the QEMU chardev's Unix socket)."""

    def __init__(self, stream: trio.abc.Stream, *, window: int = WINDOW,
                 max_streams: int = MAX_STREAMS, name: str = "rig") -> None:
        self._stream = stream
        self.window = window
        self.max_streams = max_streams
        self.name = name
        self._send_lock = trio.Lock()
        self._streams: dict[int, MuxStream] = {}
        self._next_sid = 1
        self._ports_lock = trio.Lock()
        self._ports_answer: bytes | None = None
        self._hello_answer: dict[str, Any] | None = None
        self._changed = trio.Event()
        self._broken: str | None = None
        self._synced = False
        #: Frames the guest sent that the host ignored or refused (counted, not logged per frame).
        self.ignored = 0

    @property
    def broken(self) -> str | None:
        return self._broken

    @property
    def streams(self) -> int:
        return len(self._streams)

    def _wake(self) -> None:
        self._changed.set()
        self._changed = trio.Event()

    async def _send(self, kind: int, sid: int = 0, payload: bytes = b"", *,
                    magic: bool = False) -> None:
        if self._broken is not None:
            raise MuxError(self._broken)
        data = HEADER.pack(kind, sid, len(payload)) + payload
        async with self._send_lock:
            try:
                await self._stream.send_all(MAGIC + data if magic else data)
            except (trio.BrokenResourceError, trio.ClosedResourceError, OSError) as exc:
                self._fail(f"writing to the port multiplexer failed: {exc}")
                raise MuxError(self._broken or "broken") from None

    def _fail(self, reason: str) -> None:
        if self._broken is None:
            self._broken = reason
        for stream in list(self._streams.values()):
            stream._on_end(reason)
        self._streams.clear()
        self._wake()

    def _forget(self, sid: int) -> None:
        self._streams.pop(sid, None)

    # -- the reader -----------------------------------------------------------

    async def run(self) -> None:
        """Read frames until the connection ends; raises :class:`MuxError` saying why."""
        buf = bytearray()
        skipped = 0
        try:
            while True:
                try:
                    data = await self._stream.receive_some(65536)
                except (trio.BrokenResourceError, trio.ClosedResourceError, OSError) as exc:
                    raise MuxError(f"the port multiplexer's socket failed: {exc}") from None
                if not data:
                    raise MuxError("the port multiplexer's socket closed")
                buf += data
                while True:
                    if not self._synced:
                        at = buf.find(MAGIC)
                        if at < 0:
                            keep = len(MAGIC) - 1
                            skipped += max(0, len(buf) - keep)
                            del buf[: max(0, len(buf) - keep)]
                            if skipped > MAX_SYNC_SKIP:
                                raise MuxError("the guest sent 4 MiB without a sync marker")
                            break
                        skipped += at
                        del buf[: at + len(MAGIC)]
                        self._synced = True
                    if len(buf) < HEADER.size:
                        break
                    kind, sid, length = HEADER.unpack_from(buf)
                    if length > MAX_PAYLOAD or not HELLO <= kind <= PORTS:
                        raise MuxError(f"the guest sent a bad frame (type {kind}, length {length})")
                    if len(buf) < HEADER.size + length:
                        break
                    payload = bytes(buf[HEADER.size: HEADER.size + length])
                    del buf[: HEADER.size + length]
                    await self._handle(kind, sid, payload)
        except MuxError as exc:
            self._fail(str(exc))
            raise
        finally:
            if self._broken is None:
                self._fail("the port multiplexer stopped")

    async def _handle(self, kind: int, sid: int, payload: bytes) -> None:
        if kind == HELLO:
            try:
                doc = json.loads(payload)
            except (ValueError, UnicodeDecodeError):
                doc = None
            if not isinstance(doc, dict) or doc.get("v") != 1:
                raise MuxError("the guest's hello is not protocol 1")
            self._hello_answer = doc
            self._wake()
            return
        if kind == PORTS:
            self._ports_answer = payload
            self._wake()
            return
        stream = self._streams.get(sid)
        if stream is None or kind == OPEN:
            self.ignored += 1
            return
        if kind == OPENED:
            stream._opened = True
            stream._wake()
        elif kind == DATA:
            if not stream._opened or not stream._on_data(payload):
                self.ignored += 1
                self._forget(sid)
                stream._on_end(f"the guest sent past port {stream.port}'s window")
                await self._send(CLOSE, sid)
        elif kind == CREDIT:
            if len(payload) == 4:
                stream._on_credit(struct.unpack(">I", payload)[0])
        elif kind == EOF:
            stream._eof = True
            stream._wake()
        elif kind == CLOSE:
            self._forget(sid)
            stream._eof = True
            stream._on_end(payload.decode("utf-8", "replace")[:300])

    # -- requests -------------------------------------------------------------

    async def hello(self, *, timeout_s: float, every_s: float = 1.0) -> dict[str, Any]:
        """Greet the guest (resetting every stream there) until it answers, or raise after ``timeout_s``."""
        for stream in list(self._streams.values()):
            stream._on_end("the port multiplexer restarted")
        self._streams.clear()
        self._hello_answer = None
        self._synced = False
        with trio.move_on_after(timeout_s):
            while True:
                await self._send(HELLO, 0, b'{"v":1}', magic=True)
                with trio.move_on_after(every_s):
                    while self._hello_answer is None:
                        if self._broken is not None:
                            raise MuxError(self._broken)
                        await self._changed.wait()
                    return self._hello_answer
        raise MuxError(f"the port multiplexer did not answer in {timeout_s:g} s")

    async def listening(self, *, timeout_s: float) -> Listening:
        async with self._ports_lock:
            self._ports_answer = None
            await self._send(PORTS)
            with trio.move_on_after(timeout_s):
                while self._ports_answer is None:
                    if self._broken is not None:
                        raise MuxError(self._broken)
                    await self._changed.wait()
                return parse_ports(self._ports_answer)
            raise MuxError(f"the port multiplexer did not list ports in {timeout_s:g} s")

    async def open(self, port: int, *, timeout_s: float = 10.0) -> MuxStream:
        """A stream to guest ``port`` on the guest's loopback; :class:`StreamRefused` if it cannot."""
        if self._broken is not None:
            raise MuxError(self._broken)
        if len(self._streams) >= self.max_streams:
            raise StreamRefused(f"the rig has {self.max_streams} forwarded connections open already")
        sid = self._next_sid
        self._next_sid += 1
        stream = MuxStream(self, sid, port)
        self._streams[sid] = stream
        try:
            await self._send(OPEN, sid, struct.pack(">H", port))
            with trio.fail_after(timeout_s):
                await stream._opened_or_refused()
        except trio.TooSlowError:
            await stream.aclose()
            raise StreamRefused(f"port {port} did not accept within {timeout_s:g} s") from None
        except BaseException:
            self._forget(sid)
            raise
        return stream


#: What a stream raises when its other end is gone.
_GONE = (trio.BrokenResourceError, trio.ClosedResourceError, OSError, MuxError)


async def splice(a: trio.abc.Stream, b: trio.abc.Stream, *, chunk: int = CHUNK) -> None:
    """Copy both ways until both sides have ended; closes both.

    An end of input is passed on as a half-close where the other side can take
    one (TCP, a mux stream); a side that cannot (TLS) ends the whole splice.
    """

    async def pump(src: trio.abc.ReceiveStream, dst: trio.abc.Stream) -> None:
        try:
            while True:
                data = await src.receive_some(chunk)
                if not data:
                    break
                await dst.send_all(data)
            if isinstance(dst, trio.abc.HalfCloseableStream):
                await dst.send_eof()
            else:
                nursery.cancel_scope.cancel()
        except _GONE:
            nursery.cancel_scope.cancel()

    try:
        async with trio.open_nursery() as nursery:
            nursery.start_soon(pump, a, b)
            nursery.start_soon(pump, b, a)
    finally:
        with trio.CancelScope(shield=True):
            for s in (a, b):
                with contextlib.suppress(*_GONE):
                    await s.aclose()


__all__ = ["CHUNK", "MAGIC", "MAX_STREAMS", "WINDOW", "Listening", "MuxClient", "MuxError",
           "MuxStream", "StreamRefused", "parse_ports", "splice"]
