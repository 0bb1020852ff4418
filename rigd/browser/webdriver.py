"""A Trio client of WebDriver classic (HTTP/1.1 + JSON) over one byte stream.

How this works: WebKit's driver (``WebKitWebDriver``) speaks the W3C
WebDriver protocol: one HTTP request per command, ``{"value": …}`` back. A
browser rig has exactly one host-side path into its guest (the virtio-serial
port, one byte stream), so :class:`WebDriverConnection` keeps one HTTP/1.1
keep-alive connection on it and sends one command at a time (the lock is the
in-flight bound: HTTP/1.1 without pipelining answers in order). ``h11``
frames the messages; this module owns only the reading and writing.

The engine runs in a hostile guest: every answer is capped
(:data:`MAX_BODY_BYTES`), its JSON parsed at the edge, and the ``value`` of an
error answer read into :class:`rigd.protocols.cdp.CDPCommandFailed` with the
W3C error code first (``no such element: …``, as BiDi's errors are kept, so
:func:`rigd.protocols.bidi.error_code` reads both). Every command has a
deadline; a command that misses it leaves its answer to be read and dropped
before the next request (the stream stays in step). A closed stream, a broken
answer or a ``Connection: close`` ends the connection for good:
:meth:`WebDriverConnection.wait_ended` says why, and every later command fails
at once with :class:`rigd.protocols.cdp.CDPClosed`.
"""

from __future__ import annotations

import json
import logging
from typing import Any

import h11
import trio

from rigd.protocols.cdp import (
    MAX_ERROR_CHARS,
    MAX_MESSAGE_CHARS,
    CDPClosed,
    CDPCommandFailed,
    CDPProtocolError,
    CDPTimeout,
)

#: The largest answer read (a screenshot's base64 is the largest thing asked for).
MAX_BODY_BYTES = MAX_MESSAGE_CHARS
#: A command's deadline unless the caller gives one.
DEFAULT_TIMEOUT_S = 10.0
#: How long the answer a late command left behind may take to be read and dropped.
DRAIN_TIMEOUT_S = 60.0
#: Bytes asked of the stream at once.
READ_CHUNK = 64 * 1024
#: Header bytes an answer may have before its body.
MAX_HEADER_BYTES = 16 * 1024


class WebDriverCommandFailed(CDPCommandFailed):
    """The driver answered an error: ``error`` is the W3C code (``no such window``), ``data``
    what it added (an open dialog's ``text``)."""

    def __init__(self, what: str, status: int, message: str, *, error: str,
                 data: dict[str, Any]) -> None:
        super().__init__(what, status, message)
        self.error = error
        self.data = data


class WebDriverConnection:
    """One HTTP/1.1 connection to a WebDriver server over ``stream``; one command at a time."""

    def __init__(self, stream: trio.abc.Stream, *, host: str, log: logging.Logger | None = None,
                 default_timeout: float = DEFAULT_TIMEOUT_S, max_body: int = MAX_BODY_BYTES) -> None:
        self._stream = stream
        self._host = host
        self._log = log or logging.getLogger("rigd.browser.webdriver")
        self._h11 = h11.Connection(h11.CLIENT, max_incomplete_event_size=MAX_HEADER_BYTES)
        self._lock = trio.Lock()
        self._default_timeout = default_timeout
        self._max_body = max_body
        #: A request whose answer has not been read yet (its command missed its deadline).
        self._owed = False
        self._closed: str | None = None
        self._closed_event = trio.Event()
        self.commands = 0

    @property
    def closed(self) -> str | None:
        """Why the connection ended, or None while it is up."""
        return self._closed

    async def wait_ended(self) -> str:
        await self._closed_event.wait()
        return self._closed or "the WebDriver connection ended"

    def _shut(self, reason: str) -> None:
        if self._closed is None:
            self._closed = reason
            self._closed_event.set()
            self._log.info("webdriver connection ended", extra={"reason": reason[:200]})

    async def command(self, method: str, path: str, body: dict[str, Any] | None = None, *,
                      timeout: float | None = None) -> Any:
        """The ``value`` of one command's answer; an error answer raises
        :class:`CDPCommandFailed` (its ``cdp_code`` the HTTP status, its message
        ``"<error>: <message>"``), a missed deadline :class:`CDPTimeout`."""
        what = f"{method} {path.split('/', 3)[-1] if path.startswith('/session/') else path}"[:200]
        if self._closed is not None:
            raise CDPClosed(f"{what}: the WebDriver connection is closed ({self._closed})")
        payload = b"" if body is None and method in ("GET", "DELETE") else json.dumps(
            body if body is not None else {}, separators=(",", ":")).encode()
        deadline = trio.current_time() + (timeout if timeout is not None else self._default_timeout)
        with trio.move_on_at(deadline) as scope:
            async with self._lock:
                if self._owed:
                    await self._drain()
                await self._send(method, path, payload)
                status, raw = await self._receive()
        if scope.cancelled_caught:
            if self._closed is not None:
                raise CDPClosed(f"{what}: the WebDriver connection is closed ({self._closed})")
            raise CDPTimeout(f"{what}: no answer within {timeout or self._default_timeout:g} s")
        if self._closed is not None and status is None:  # pragma: no cover - _receive raised
            raise CDPClosed(f"{what}: the WebDriver connection is closed ({self._closed})")
        return self._value(what, status, raw)

    async def _send(self, method: str, path: str, payload: bytes) -> None:
        headers = [("Host", self._host), ("Accept", "application/json")]
        if payload or method == "POST":
            headers += [("Content-Type", "application/json; charset=utf-8"),
                        ("Content-Length", str(len(payload)))]
        try:
            data = self._h11.send(h11.Request(method=method, target=path, headers=headers))
            data = (data or b"") + (self._h11.send(h11.Data(data=payload)) or b"" if payload else b"")
            data += self._h11.send(h11.EndOfMessage()) or b""
        except h11.LocalProtocolError as exc:
            self._shut(f"the connection cannot send another request: {exc}")
            raise CDPClosed(f"{method} {path}: {self._closed}") from exc
        # A half-written request would put the stream out of step for good: the write is
        # shielded (the request is small; a peer that stops reading ends the connection).
        with trio.CancelScope(shield=True):
            with trio.move_on_after(DRAIN_TIMEOUT_S) as scope:
                try:
                    await self._stream.send_all(data)
                except (trio.BrokenResourceError, trio.ClosedResourceError, OSError) as exc:
                    self._shut(f"the stream closed while a request was sent: {exc}"[:300])
                    raise CDPClosed(f"{method} {path}: {self._closed}") from exc
            if scope.cancelled_caught:
                self._shut("the engine stopped reading requests")
                raise CDPClosed(f"{method} {path}: {self._closed}")
        self._owed = True
        self.commands += 1

    async def _next_event(self) -> Any:
        while True:
            try:
                event = self._h11.next_event()
            except h11.RemoteProtocolError as exc:
                self._shut(f"the engine broke HTTP: {exc}"[:300])
                raise CDPClosed(self._closed or "") from exc
            if event is not h11.NEED_DATA:
                return event
            try:
                data = await self._stream.receive_some(READ_CHUNK)
            except (trio.BrokenResourceError, trio.ClosedResourceError, OSError) as exc:
                self._shut(f"the stream failed: {exc}"[:300])
                raise CDPClosed(self._closed or "") from exc
            if not data:
                self._shut("the engine closed the connection")
            try:
                self._h11.receive_data(bytes(data))
            except h11.RemoteProtocolError as exc:  # pragma: no cover - h11 raises on next_event
                self._shut(f"the engine broke HTTP: {exc}"[:300])
                raise CDPClosed(self._closed or "") from exc

    async def _receive(self) -> tuple[int, bytes]:
        """The owed answer's status and body (capped); the connection ready for the next request."""
        status: int | None = None
        body = bytearray()
        while True:
            event = await self._next_event()
            if isinstance(event, h11.Response):
                status = event.status_code
            elif isinstance(event, h11.InformationalResponse):
                continue
            elif isinstance(event, h11.Data):
                if len(body) + len(event.data) > self._max_body:
                    self._shut(f"an answer was over the {self._max_body}-byte cap")
                    raise CDPClosed(self._closed or "")
                body += event.data
            elif isinstance(event, h11.EndOfMessage):
                break
            elif isinstance(event, h11.ConnectionClosed):
                self._shut("the engine closed the connection mid-answer")
                raise CDPClosed(self._closed or "")
        self._owed = False
        if self._h11.our_state is h11.DONE and self._h11.their_state is h11.DONE:
            self._h11.start_next_cycle()
        else:
            self._shut("the engine closed the keep-alive connection (Connection: close)")
        assert status is not None
        return status, bytes(body)

    async def _drain(self) -> None:
        """Read and drop the answer a command that missed its deadline left owed."""
        with trio.move_on_after(DRAIN_TIMEOUT_S) as scope:
            await self._receive()
        if scope.cancelled_caught:
            self._shut(f"a late answer was not read within {DRAIN_TIMEOUT_S:g} s")
            raise CDPClosed(self._closed or "")

    @staticmethod
    def _value(what: str, status: int, raw: bytes) -> Any:
        try:
            doc = json.loads(raw)
        except (ValueError, RecursionError) as exc:
            raise CDPProtocolError(f"{what}: the answer (HTTP {status}) is not JSON") from exc
        if not isinstance(doc, dict) or "value" not in doc:
            raise CDPProtocolError(f"{what}: the answer (HTTP {status}) has no value")
        value = doc["value"]
        if status == 200:
            return value
        if not isinstance(value, dict) or not isinstance(value.get("error"), str):
            raise CDPProtocolError(f"{what}: an HTTP {status} answer names no error")
        error = value["error"][:80]
        message = value.get("message")
        said = f"{error}: {message}" if isinstance(message, str) and message else error
        data = value.get("data")
        raise WebDriverCommandFailed(what, status, said[:MAX_ERROR_CHARS], error=error,
                                     data=data if isinstance(data, dict) else {})

    async def aclose(self) -> None:
        self._shut("closed by rigd")
        await self._stream.aclose()


__all__ = ["MAX_BODY_BYTES", "WebDriverCommandFailed", "WebDriverConnection"]
