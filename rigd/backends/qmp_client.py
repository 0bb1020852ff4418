"""A Trio QMP connection around the sans-I/O :class:`rigd.protocols.qmp.QMPProtocol`.

qemu.qmp is asyncio-only; QMP sits on the hot path of every input event in
later surfaces, so rigd speaks it natively on Trio (docs/decisions.md). One
reader task owns the socket's receive side; one lock serialises sends; each
command waits for its own reply with a deadline. Every message either way is
noted in a bounded :class:`~rigd.protocols.qmp_transcript.Transcript` (typed
text withheld) that :meth:`QMPConnection.transcript` renders for a failed
rig's evidence.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import trio

from rigd.errors import BackendError
from rigd.protocols.qmp import Error, Greeting, ProtocolViolation, QMPEvent, QMPMessage, QMPProtocol, Return
from rigd.protocols.qmp_transcript import Transcript


@dataclass(slots=True)
class _Pending:
    done: trio.Event
    result: Return | Error | None = None


class QMPConnection:
    def __init__(self, stream: trio.SocketStream, *, log: logging.Logger) -> None:
        self._stream = stream
        self._proto = QMPProtocol()
        self._send_lock = trio.Lock()
        self._pending: dict[int, _Pending] = {}
        self._greeted = trio.Event()
        self._closed = False
        self._log = log
        self._transcript = Transcript()
        self.on_event: Callable[[QMPEvent], None] | None = None

    @classmethod
    async def connect(cls, path: Path, *, log: logging.Logger) -> QMPConnection:
        try:
            stream = await trio.open_unix_socket(str(path))
        except OSError as exc:
            raise BackendError(f"cannot connect to QMP socket: {exc.strerror}") from exc
        return cls(stream, log=log)

    async def run(self, *, task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED) -> None:
        """Read until the socket closes; negotiate capabilities first."""
        task_status.started()
        try:
            while True:
                try:
                    data = await self._stream.receive_some(65536)
                except (trio.BrokenResourceError, trio.ClosedResourceError):
                    data = b""
                if not data:
                    break
                for msg in self._proto.receive_data(data):
                    self._dispatch(msg)
        finally:
            self._closed = True
            self._transcript.note("connection closed")
            for pending in self._pending.values():
                pending.done.set()
            self._greeted.set()

    def transcript(self) -> str:
        """The newest messages sent and received (bounded; typed text withheld), one per line."""
        return self._transcript.render()

    def _dispatch(self, msg: QMPMessage) -> None:
        self._transcript.received(msg)
        if isinstance(msg, Greeting):
            self._greeted.set()
        elif isinstance(msg, Return | Error):
            pending = self._pending.get(msg.id) if msg.id is not None else None
            if pending is not None:
                pending.result = msg
                pending.done.set()
        elif isinstance(msg, QMPEvent):
            if self.on_event is not None:
                self.on_event(msg)
        elif isinstance(msg, ProtocolViolation):
            self._log.warning("qmp protocol violation", extra={"reason": msg.reason})

    async def handshake(self, timeout: float) -> None:
        with trio.move_on_after(timeout) as scope:
            await self._greeted.wait()
        if scope.cancelled_caught or self._closed:
            raise BackendError("QMP greeting did not arrive")
        await self.execute("qmp_capabilities", timeout=timeout)

    async def execute(
        self, name: str, arguments: dict[str, Any] | None = None, *, timeout: float = 10.0
    ) -> Any:
        if self._closed:
            raise BackendError(f"QMP {name}: connection closed")
        cid, data = self._proto.command(name, arguments)
        pending = _Pending(trio.Event())
        self._pending[cid] = pending
        try:
            async with self._send_lock:
                self._transcript.sent(cid, name, arguments)
                try:
                    await self._stream.send_all(data)
                except (trio.BrokenResourceError, trio.ClosedResourceError) as exc:
                    self._transcript.note(f"send of id={cid} failed: connection closed")
                    raise BackendError(f"QMP {name}: connection closed") from exc
            with trio.move_on_after(timeout):
                await pending.done.wait()
        finally:
            del self._pending[cid]
        result = pending.result
        if result is None and not self._closed:
            self._transcript.note(f"no reply to id={cid} within {timeout:g} s")
        if result is None:
            raise BackendError(f"QMP {name}: no reply" + (" (closed)" if self._closed else ""))
        if isinstance(result, Error):
            raise BackendError(f"QMP {name}: {result.cls}: {result.desc}")
        return result.value

    async def send_only(self, name: str) -> None:
        """Send a command without waiting for its reply.

        Used for ``quit`` during teardown, when the reader task may already
        be cancelled: the process exiting is the answer that matters.
        """
        cid, data = self._proto.command(name)
        async with self._send_lock:
            self._transcript.sent(cid, name)
            try:
                await self._stream.send_all(data)
            except (trio.BrokenResourceError, trio.ClosedResourceError) as exc:
                self._transcript.note(f"send of id={cid} failed: connection closed")
                raise BackendError(f"QMP {name}: connection closed") from exc

    async def aclose(self) -> None:
        self._closed = True
        with trio.CancelScope(shield=True):
            await self._stream.aclose()
