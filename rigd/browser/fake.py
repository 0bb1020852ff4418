"""A fake :class:`rigd.browser.cdp.Transport` for unit tests: memory channels, no sockets.

The test plays the browser: :meth:`FakeTransport.next_command` reads what the
client sent (as a dict), :meth:`FakeTransport.reply`/:meth:`FakeTransport.emit`
/:meth:`FakeTransport.push_raw` write what the browser says, and
:meth:`FakeTransport.drop` closes the socket from the browser's side.
"""

from __future__ import annotations

import json
from typing import Any

import trio

from rigd.browser.cdp import TransportClosed


class FakeTransport:
    def __init__(self) -> None:
        self._to_client_send, self._to_client = trio.open_memory_channel[str | bytes | None](64)
        self._to_browser_send, self._to_browser = trio.open_memory_channel[str](64)
        self._closed: str | None = None

    # -- the client's side (Transport) -------------------------------------------------------

    async def send(self, text: str) -> None:
        if self._closed is not None:
            raise TransportClosed(self._closed)
        await self._to_browser_send.send(text)

    async def receive(self) -> str | bytes:
        try:
            data = await self._to_client.receive()
        except trio.EndOfChannel as exc:
            raise TransportClosed(self._closed or "closed") from exc
        if data is None:
            raise TransportClosed(self._closed or "closed")
        return data

    async def aclose(self) -> None:
        if self._closed is None:
            self._closed = "closed by the client"
        await self._to_client_send.aclose()

    # -- the browser's side ------------------------------------------------------------------

    async def next_command(self) -> dict[str, Any]:
        msg: dict[str, Any] = json.loads(await self._to_browser.receive())
        return msg

    async def push_raw(self, data: str | bytes) -> None:
        await self._to_client_send.send(data)

    async def reply(self, command: dict[str, Any], result: dict[str, Any] | None = None) -> None:
        msg: dict[str, Any] = {"id": command["id"], "result": result or {}}
        if "sessionId" in command:
            msg["sessionId"] = command["sessionId"]
        await self.push_raw(json.dumps(msg))

    async def error(self, command: dict[str, Any], code: int, message: str) -> None:
        msg: dict[str, Any] = {"id": command["id"], "error": {"code": code, "message": message}}
        if "sessionId" in command:
            msg["sessionId"] = command["sessionId"]
        await self.push_raw(json.dumps(msg))

    async def emit(self, method: str, params: dict[str, Any] | None = None,
                   session_id: str | None = None) -> None:
        msg: dict[str, Any] = {"method": method, "params": params or {}}
        if session_id is not None:
            msg["sessionId"] = session_id
        await self.push_raw(json.dumps(msg))

    async def drop(self, reason: str = "close 1006") -> None:
        """The browser goes away: the client's next receive fails with ``reason``."""
        self._closed = reason
        await self._to_client_send.send(None)
