"""A sans-I/O core of WebDriver BiDi, client side: the wire shape, in CDP's typed values.

How this works: BiDi is JSON over one WebSocket, like CDP, and differs only
in the envelope. A command is ``{"id", "method", "params"}``; its answer is
``{"type": "success", "id", "result"}`` or ``{"type": "error", "id",
"error", "message"}`` (``error`` is a code word such as ``no such frame``);
events are ``{"type": "event", "method", "params"}``. There are no sessions
on the wire (a browsing context is a parameter), so every message's
``session_id`` is ``None``.

:class:`BiDiProtocol` has the same two methods as
:class:`rigd.protocols.cdp.CDPProtocol` and returns the same
:class:`~rigd.protocols.cdp.Reply` / :class:`~rigd.protocols.cdp.ErrorReply`
/ :class:`~rigd.protocols.cdp.Event` / :class:`~rigd.protocols.cdp.ProtocolViolation`,
so one Trio connection (:class:`rigd.browser.cdp.CDPConnection`) runs
either protocol: its one send lock, in-flight bound, deadlines and failure
handling are written once. An error reply's ``message`` is
``"<error>: <message>"`` (the code word first, so a driver can tell
``no such history entry`` from ``invalid argument``); its ``code`` is 0.

The browser is inside a hostile guest: the message is capped and every
routed field checked; nothing here raises on what the browser sends.
This module does no I/O and never imports trio.
"""

from __future__ import annotations

import json
import re
from typing import Any

from rigd.protocols.cdp import (
    MAX_ERROR_CHARS,
    MAX_ID,
    MAX_MESSAGE_CHARS,
    CDPMessage,
    ErrorReply,
    Event,
    ProtocolViolation,
    Reply,
    is_int,
)

_METHOD = re.compile(r"[A-Za-z]{1,40}\.[A-Za-z]{1,80}")
#: BiDi's error code words (``no such frame``, ``invalid argument``…): lower case and spaces.
_ERROR_CODE = re.compile(r"[a-z ]{1,60}")


class BiDiProtocol:
    """Encodes commands and parses what the browser sends. Holds only the id counter."""

    def __init__(self, *, max_message_chars: int = MAX_MESSAGE_CHARS) -> None:
        self.max_message_chars = max_message_chars
        self._next_id = 1

    def command(self, method: str, params: dict[str, Any] | None = None,
                session_id: str | None = None) -> tuple[int, str]:
        """The id and the text of one command (BiDi has no sessions on the wire)."""
        if session_id is not None:
            raise ValueError("WebDriver BiDi commands carry no sessionId")
        if not _METHOD.fullmatch(method):
            raise ValueError(f"not a BiDi method name: {method[:80]!r}")
        cid = self._next_id
        self._next_id = 1 if cid >= MAX_ID else cid + 1
        msg = {"id": cid, "method": method, "params": params or {}}
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
        kind = msg.get("type")
        if kind == "event":
            method = msg.get("method")
            if not (isinstance(method, str) and _METHOD.fullmatch(method)):
                return ProtocolViolation("an event without a method name")
            params = msg.get("params", {})
            if not isinstance(params, dict):
                return ProtocolViolation(f"params of {method} is not an object")
            return Event(method, None, params)
        cid = msg.get("id")
        if kind == "error" and cid is None:
            # The browser could not read a command at all: no id to answer.
            text = msg.get("message")
            return ProtocolViolation("the browser could not read a command: "
                                     + (text[:200] if isinstance(text, str) else "(no message)"))
        if not (is_int(cid) and 0 < cid <= MAX_ID):
            return ProtocolViolation("id is not a positive 31-bit integer")
        if kind == "success":
            result = msg.get("result")
            if not isinstance(result, dict):
                return ProtocolViolation(f"result of id={cid} is not an object")
            return Reply(cid, None, result)
        if kind == "error":
            code, text = msg.get("error"), msg.get("message")
            word = code if isinstance(code, str) and _ERROR_CODE.fullmatch(code) else "unknown error"
            said = text if isinstance(text, str) else "(no message)"
            return ErrorReply(cid, None, 0, f"{word}: {said}"[:MAX_ERROR_CHARS])
        return ProtocolViolation("type is neither success, error nor event")


def error_code(message: str) -> str:
    """The code word of a :class:`BiDiProtocol` error message (``no such history entry``)."""
    word, sep, _rest = message.partition(":")
    return word if sep else ""


__all__ = ["BiDiProtocol", "error_code"]
