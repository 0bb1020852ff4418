"""A sans-I/O core of the Chrome DevTools Protocol (CDP), client side.

How this works: CDP is JSON over WebSocket text messages. A command is
``{"id", "method", "params", "sessionId"?}``; its answer echoes the ``id``
with either ``result`` (an object) or ``error`` (``code``, ``message``).
Events are ``{"method", "params", "sessionId"?}`` and arrive at any time.
In *flatten* mode (``Target.attachToTarget {flatten: true}``) every target's
traffic rides the browser's one socket, told apart by ``sessionId``.

The browser runs inside a hostile guest, so nothing it sends is trusted:
:meth:`CDPProtocol.parse` caps the message, checks every field it routes on
and returns a :class:`ProtocolViolation` instead of raising; replies are then
read field by field with :class:`Fields`, whose errors name the method and
the field. This module does no I/O and never imports trio.
"""

from __future__ import annotations

import json
import math
import re
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, Protocol, TypeGuard, TypeVar

from rigd.errors import BackendError

T = TypeVar("T")

#: Default cap on one message from the browser, in characters (≈ bytes: CDP
#: escapes non-ASCII). A full-page JPEG screenshot is the largest thing rigd
#: asks for; 32 MiB of base64 is a 24 MiB image.
MAX_MESSAGE_CHARS = 32 * 1024 * 1024
#: Command ids stay positive 31-bit integers, as Chromium's own client's do.
MAX_ID = 2**31 - 1
#: Session ids are 32 hex digits in Chromium; allow some room, not megabytes.
MAX_SESSION_ID_CHARS = 128
#: An error message from the browser is quoted at most this long.
MAX_ERROR_CHARS = 1000
_METHOD = re.compile(r"[A-Za-z]{1,40}\.[A-Za-z]{1,80}")
_SESSION_ID = re.compile(r"[A-Za-z0-9_.:-]{1,128}")


# -- errors --------------------------------------------------------------------------------------

class CDPError(BackendError):
    """Base of every CDP client error; the message says what the browser did."""


class CDPClosed(CDPError):
    """The DevTools connection (or the page's session) is gone; every pending command fails."""


class CDPTimeout(CDPError):
    """A command had no answer within its deadline."""


class CDPCommandFailed(CDPError):
    """The browser answered a command with an error."""

    def __init__(self, method: str, code: int, message: str) -> None:
        super().__init__(f"{method}: the browser answered error {code}: {message}",
                         method=method, cdpCode=code)
        self.method = method
        self.cdp_code = code
        self.cdp_message = message


class CDPProtocolError(CDPError):
    """The browser sent something that breaks the protocol or a reply's shape."""


# -- messages ------------------------------------------------------------------------------------

@dataclass(frozen=True, slots=True)
class Reply:
    id: int
    session_id: str | None
    result: dict[str, Any]


@dataclass(frozen=True, slots=True)
class ErrorReply:
    id: int
    session_id: str | None
    code: int
    message: str


@dataclass(frozen=True, slots=True)
class Event:
    method: str
    session_id: str | None
    params: dict[str, Any]


@dataclass(frozen=True, slots=True)
class ProtocolViolation:
    reason: str


CDPMessage = Reply | ErrorReply | Event | ProtocolViolation


def is_int(value: object) -> TypeGuard[int]:
    """A JSON integer (``true`` is a boolean, not 1); bidi.py reads ids with it too."""
    return isinstance(value, int) and not isinstance(value, bool)


def _session(msg: dict[str, Any]) -> str | ProtocolViolation | None:
    sid = msg.get("sessionId")
    if sid is None:
        return None
    if not isinstance(sid, str) or not _SESSION_ID.fullmatch(sid):
        return ProtocolViolation("sessionId is not a short token")
    return sid


class WireProtocol(Protocol):
    """What a connection needs of a protocol's envelope: :class:`CDPProtocol`, or
    :class:`rigd.protocols.bidi.BiDiProtocol` (WebDriver BiDi)."""

    def command(self, method: str, params: dict[str, Any] | None = None,
                session_id: str | None = None) -> tuple[int, str]: ...

    def parse(self, data: str | bytes) -> CDPMessage: ...


class CDPProtocol:
    """Encodes commands and parses what the browser sends. Holds only the id counter."""

    def __init__(self, *, max_message_chars: int = MAX_MESSAGE_CHARS) -> None:
        self.max_message_chars = max_message_chars
        self._next_id = 1

    def command(self, method: str, params: dict[str, Any] | None = None,
                session_id: str | None = None) -> tuple[int, str]:
        """The id and the text of one command."""
        if not _METHOD.fullmatch(method):
            raise ValueError(f"not a CDP method name: {method[:80]!r}")
        cid = self._next_id
        self._next_id = 1 if cid >= MAX_ID else cid + 1
        msg: dict[str, Any] = {"id": cid, "method": method, "params": params or {}}
        if session_id is not None:
            msg["sessionId"] = session_id
        return cid, json.dumps(msg, ensure_ascii=False, allow_nan=False)

    def parse(self, data: str | bytes) -> CDPMessage:
        """One message from the browser as a typed value; never raises."""
        if len(data) > self.max_message_chars:
            return ProtocolViolation(f"a message of {len(data)} characters is over the "
                                     f"{self.max_message_chars} cap")
        try:
            msg = json.loads(data)
        except (ValueError, RecursionError):
            return ProtocolViolation("not JSON")
        if not isinstance(msg, dict):
            return ProtocolViolation("not a JSON object")
        sid = _session(msg)
        if isinstance(sid, ProtocolViolation):
            return sid
        if "id" in msg:
            cid = msg["id"]
            if not (is_int(cid) and 0 < cid <= MAX_ID):
                return ProtocolViolation("id is not a positive 31-bit integer")
            if "error" in msg:
                err = msg["error"]
                if not isinstance(err, dict):
                    return ProtocolViolation(f"error of id={cid} is not an object")
                code, text = err.get("code"), err.get("message")
                return ErrorReply(cid, sid, code if is_int(code) and abs(code) < 2**31 else 0,
                                  text[:MAX_ERROR_CHARS] if isinstance(text, str) else "(no message)")
            result = msg.get("result")
            if not isinstance(result, dict):
                return ProtocolViolation(f"result of id={cid} is not an object")
            return Reply(cid, sid, result)
        method = msg.get("method")
        if isinstance(method, str) and _METHOD.fullmatch(method):
            params = msg.get("params", {})
            if not isinstance(params, dict):
                return ProtocolViolation(f"params of {method} is not an object")
            return Event(method, sid, params)
        return ProtocolViolation("neither a reply (id) nor an event (method)")


# -- reading replies -----------------------------------------------------------------------------

class Fields:
    """Typed reads of one reply object; every failure names ``method`` and the field.

    A reply is read once, at the edge, into the values a driver uses; code past
    this point never indexes a browser's dict.
    """

    __slots__ = ("_d", "_where")

    def __init__(self, d: dict[str, Any], where: str) -> None:
        self._d = d
        self._where = where

    def _bad(self, name: str, rule: str) -> CDPProtocolError:
        return CDPProtocolError(f"{self._where}: {name} {rule}")

    def has(self, name: str) -> bool:
        return self._d.get(name) is not None

    def integer(self, name: str, lo: int = -(2**53), hi: int = 2**53) -> int:
        value = self._d.get(name)
        if not is_int(value) or not lo <= value <= hi:
            raise self._bad(name, f"is not an integer in {lo}..{hi}")
        return int(value)

    def number(self, name: str, lo: float = -1e9, hi: float = 1e9) -> float:
        value = self._d.get(name)
        if isinstance(value, bool) or not isinstance(value, int | float):
            raise self._bad(name, "is not a number")
        if not (math.isfinite(value) and lo <= value <= hi):
            raise self._bad(name, f"is not a finite number in {lo:g}..{hi:g}")
        return float(value)

    def string(self, name: str, max_chars: int = 65536, *, default: str | None = None) -> str:
        value = self._d.get(name, default)
        if not isinstance(value, str):
            raise self._bad(name, "is not a string")
        if len(value) > max_chars:
            raise self._bad(name, f"is longer than {max_chars} characters")
        return value

    def boolean(self, name: str, default: bool | None = None) -> bool:
        value = self._d.get(name, default)
        if not isinstance(value, bool):
            raise self._bad(name, "is not a boolean")
        return value

    def obj(self, name: str) -> Fields:
        value = self._d.get(name)
        if not isinstance(value, dict):
            raise self._bad(name, "is not an object")
        return Fields(value, f"{self._where}.{name}")

    def opt_obj(self, name: str) -> Fields | None:
        return self.obj(name) if self.has(name) else None

    def items(self, name: str, max_items: int) -> list[Any]:
        value = self._d.get(name)
        if not isinstance(value, list):
            raise self._bad(name, "is not a list")
        if len(value) > max_items:
            raise self._bad(name, f"has more than {max_items} items")
        return value

    def objs(self, name: str, max_items: int) -> list[Fields]:
        out = []
        for i, item in enumerate(self.items(name, max_items)):
            if not isinstance(item, dict):
                raise self._bad(f"{name}[{i}]", "is not an object")
            out.append(Fields(item, f"{self._where}.{name}[{i}]"))
        return out

    def numbers(self, name: str, count: int) -> tuple[float, ...]:
        values = self.items(name, count)
        if len(values) != count or not all(
            isinstance(v, int | float) and not isinstance(v, bool) and math.isfinite(v) for v in values
        ):
            raise self._bad(name, f"is not {count} finite numbers")
        return tuple(float(v) for v in values)

    def raw(self, name: str) -> Any:
        return self._d.get(name)


def read(result: dict[str, Any], method: str, parse: Callable[[Fields], T]) -> T:
    """Run a reply parser over ``result``; its errors name ``method``."""
    return parse(Fields(result, method))


# -- DevToolsActivePort --------------------------------------------------------------------------

#: A browser target's WebSocket path (DevToolsActivePort, /json/version).
BROWSER_PATH = re.compile(r"/devtools/browser/[0-9A-Za-z-]{1,64}")


@dataclass(frozen=True, slots=True)
class ActivePort:
    """What Chromium writes to ``<user-data-dir>/DevToolsActivePort``."""

    port: int
    browser_path: str

    def ws_url(self, host: str = "127.0.0.1") -> str:
        return f"ws://{host}:{self.port}{self.browser_path}"


def parse_active_port(text: str) -> ActivePort:
    """Two lines: the port, then the browser target's WebSocket path."""
    lines = text[:512].splitlines()
    if len(lines) < 2 or not lines[0].isdigit() or not 0 < int(lines[0][:6]) < 65536:
        raise CDPProtocolError("DevToolsActivePort does not start with a port number")
    if not BROWSER_PATH.fullmatch(lines[1]):
        raise CDPProtocolError("DevToolsActivePort's second line is not /devtools/browser/<id>")
    return ActivePort(int(lines[0]), lines[1])


__all__ = [
    "MAX_MESSAGE_CHARS", "ActivePort", "CDPClosed", "CDPCommandFailed", "CDPError", "CDPMessage",
    "CDPProtocol", "CDPProtocolError", "CDPTimeout", "ErrorReply", "Event", "Fields",
    "ProtocolViolation", "Reply", "WireProtocol", "is_int", "parse_active_port", "read",
]
