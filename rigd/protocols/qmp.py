"""A sans-I/O client side of QEMU's QMP protocol.

How this works: QMP is newline-separated JSON. QEMU greets with
``{"QMP": {...}}``; the client must send ``qmp_capabilities`` before anything
else. Each command carries an ``id`` that its ``return``/``error`` echoes;
``event`` messages arrive at any time. This class turns outgoing commands into
bytes and incoming bytes into typed events; it never does I/O, so it is tested
without a QEMU. QEMU is trusted more than the guest, but its output still
goes through a line cap so a confused peer cannot grow memory without bound.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from typing import Any

MAX_LINE = 4 * 1024 * 1024


@dataclass(frozen=True, slots=True)
class Greeting:
    version: dict[str, Any]


@dataclass(frozen=True, slots=True)
class Return:
    id: int
    value: Any


@dataclass(frozen=True, slots=True)
class Error:
    id: int | None
    cls: str
    desc: str


@dataclass(frozen=True, slots=True)
class QMPEvent:
    name: str
    data: dict[str, Any]
    timestamp: float


@dataclass(frozen=True, slots=True)
class ProtocolViolation:
    reason: str


QMPMessage = Greeting | Return | Error | QMPEvent | ProtocolViolation


@dataclass(slots=True)
class QMPProtocol:
    max_line: int = MAX_LINE
    _buffer: bytearray = field(default_factory=bytearray)
    _next_id: int = 1
    _discarding: bool = False

    def command(self, name: str, arguments: dict[str, Any] | None = None) -> tuple[int, bytes]:
        cid = self._next_id
        self._next_id += 1
        msg: dict[str, Any] = {"execute": name, "id": cid}
        if arguments:
            msg["arguments"] = arguments
        return cid, json.dumps(msg).encode() + b"\r\n"

    def receive_data(self, data: bytes) -> list[QMPMessage]:
        out: list[QMPMessage] = []
        self._buffer += data
        while True:
            nl = self._buffer.find(b"\n")
            if nl < 0:
                if len(self._buffer) > self.max_line:
                    self._buffer.clear()
                    if not self._discarding:
                        out.append(ProtocolViolation("line too long"))
                    self._discarding = True
                return out
            line = bytes(self._buffer[:nl])
            del self._buffer[: nl + 1]
            if self._discarding:
                self._discarding = False
                continue
            if line.strip():
                out.append(self._parse(line))

    @staticmethod
    def _parse(line: bytes) -> QMPMessage:
        try:
            msg = json.loads(line)
        except ValueError:
            return ProtocolViolation("not JSON")
        if not isinstance(msg, dict):
            return ProtocolViolation("not an object")
        if "QMP" in msg:
            qmp = msg["QMP"]
            return Greeting(qmp.get("version", {}) if isinstance(qmp, dict) else {})
        raw_id = msg.get("id")
        cid = raw_id if isinstance(raw_id, int) and not isinstance(raw_id, bool) else None
        if "return" in msg and cid is not None:
            return Return(cid, msg["return"])
        if "error" in msg:
            err = msg["error"] if isinstance(msg["error"], dict) else {}
            return Error(cid, str(err.get("class", "GenericError")), str(err.get("desc", "")))
        if "event" in msg:
            data = msg.get("data")
            ts = msg.get("timestamp")
            stamp = 0.0
            if isinstance(ts, dict):
                secs, usecs = ts.get("seconds", 0), ts.get("microseconds", 0)
                if isinstance(secs, int) and isinstance(usecs, int):
                    stamp = secs + usecs / 1e6
            return QMPEvent(str(msg["event"]), data if isinstance(data, dict) else {}, stamp)
        return ProtocolViolation("unknown message shape")
