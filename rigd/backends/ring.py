"""A bounded byte buffer that keeps the most recent output (console, stderr)."""

from __future__ import annotations


class Ring:
    def __init__(self, capacity: int = 64 * 1024) -> None:
        self.capacity = capacity
        self._buf = bytearray()
        self.total = 0

    def feed(self, data: bytes | bytearray) -> None:
        self.total += len(data)
        self._buf += data
        if len(self._buf) > self.capacity:
            del self._buf[: len(self._buf) - self.capacity]

    def tail(self, max_bytes: int = 4096) -> str:
        return bytes(self._buf[-max_bytes:]).decode("utf-8", "replace")

    def lines(self, count: int) -> list[str]:
        return self.tail(self.capacity).splitlines()[-count:]

    def __contains__(self, needle: bytes) -> bool:
        return needle in self._buf
