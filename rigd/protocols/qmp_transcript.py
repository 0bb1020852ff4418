"""A bounded record of one QMP conversation, kept as evidence when a rig fails.

How this works: the connection notes each command as it is sent and each
message as it is parsed; every note is one line, a monotonic offset from the
first note, a direction (``->`` sent, ``<-`` received) and the message. The
ring keeps the newest :data:`MAX_ENTRIES` lines and at most
:data:`MAX_CHARS` characters of them (one line is cut at
:data:`MAX_ENTRY_CHARS`), so a chatty machine costs a fixed amount of memory.

What a user typed never enters the record. ``input-send-event`` carries key
events, so it is kept as its shape only (``key:12 btn:2 abs:4``); any other
command not known to carry only machine settings keeps the names of its
arguments, not their values; and the reply to a command whose arguments were
withheld keeps only whether it succeeded, since QEMU's error text can quote
the argument it rejected. Like the rest of ``rigd.protocols`` this does no
I/O: the clock is passed in.
"""

from __future__ import annotations

import json
import time
from collections import deque
from collections.abc import Callable, Mapping
from typing import Any

from rigd.protocols.qmp import Error, Greeting, ProtocolViolation, QMPEvent, QMPMessage, Return

MAX_ENTRIES = 500
MAX_CHARS = 256 * 1024
MAX_ENTRY_CHARS = 4096

#: Commands whose arguments are machine settings (paths, URIs, numbers, formats)
#: and are recorded as sent. Anything else keeps only its argument names.
VERBATIM = frozenset({
    "qmp_capabilities", "cont", "stop", "quit", "system_reset", "system_powerdown",
    "screendump", "migrate", "migrate-incoming", "migrate-set-parameters", "migrate_cancel",
    "query-migrate", "query-status", "query-version",
})

#: QEMU's InputEvent kinds; any other ``type`` is counted as ``other`` so the
#: shape itself cannot carry text.
EVENT_KINDS = ("key", "btn", "rel", "abs", "mtt")

#: Replies still awaited for commands whose arguments were withheld; bounded
#: so commands that never get a reply cannot grow it.
_MAX_WITHHELD = 1024


def event_shape(events: object) -> str:
    """``key:12 btn:2 abs:4``: how many input events of each kind, in order of first use."""
    if not isinstance(events, list):
        return "events: not a list"
    counts: dict[str, int] = {}
    for event in events:
        kind = event.get("type") if isinstance(event, dict) else None
        name = kind if isinstance(kind, str) and kind in EVENT_KINDS else "other"
        counts[name] = counts.get(name, 0) + 1
    return " ".join(f"{name}:{n}" for name, n in counts.items()) or "no events"


def describe_command(name: str, arguments: Mapping[str, Any] | None) -> tuple[str, bool]:
    """The transcript text of a command, and whether its arguments were withheld."""
    if not arguments:
        return name, False
    if name == "input-send-event":
        return f"{name} [{event_shape(arguments.get('events'))}]", True
    if name in VERBATIM:
        return f"{name} {_json(arguments)}", False
    return f"{name} (arguments withheld: {', '.join(sorted(map(str, arguments)))})", True


def _json(value: object) -> str:
    return json.dumps(value, sort_keys=True, default=repr, ensure_ascii=False)


class Transcript:
    def __init__(
        self,
        *,
        clock: Callable[[], float] = time.monotonic,
        max_entries: int = MAX_ENTRIES,
        max_chars: int = MAX_CHARS,
    ) -> None:
        self._clock = clock
        self._max_entries = max_entries
        self._max_chars = max_chars
        self._lines: deque[str] = deque()
        self._chars = 0
        self._start: float | None = None
        self._withheld: dict[int, str] = {}
        self.dropped = 0

    def sent(self, cid: int | None, name: str, arguments: Mapping[str, Any] | None = None) -> None:
        text, withheld = describe_command(name, arguments)
        if withheld and cid is not None:
            self._withheld[cid] = name
            while len(self._withheld) > _MAX_WITHHELD:
                del self._withheld[next(iter(self._withheld))]
        self._note("->", text if cid is None else f"{text} id={cid}")

    def received(self, msg: QMPMessage) -> None:
        self._note("<-", self._describe_reply(msg))

    def note(self, text: str) -> None:
        """A line about the connection itself (closed, send failed)."""
        self._note("--", text)

    def _describe_reply(self, msg: QMPMessage) -> str:
        if isinstance(msg, Greeting):
            return f"greeting {_json(msg.version)}"
        if isinstance(msg, Return | Error):
            masked = self._withheld.pop(msg.id, None) if msg.id is not None else None
            if isinstance(msg, Return):
                if masked is not None:
                    return f"return id={msg.id} (reply to {masked}: value withheld)"
                return f"return id={msg.id} {_json(msg.value)}"
            if masked is not None:
                return f"error id={msg.id} {msg.cls} (reply to {masked}: description withheld)"
            return f"error id={msg.id} {msg.cls}: {msg.desc}"
        if isinstance(msg, QMPEvent):
            return f"event {msg.name} {_json(msg.data)}"
        assert isinstance(msg, ProtocolViolation)
        return f"protocol violation: {msg.reason}"

    def _note(self, direction: str, text: str) -> None:
        now = self._clock()
        if self._start is None:
            self._start = now
        if len(text) > MAX_ENTRY_CHARS:
            text = text[:MAX_ENTRY_CHARS] + f"… ({len(text) - MAX_ENTRY_CHARS} more characters)"
        line = f"{now - self._start:+12.6f} {direction} {text}"
        self._lines.append(line)
        self._chars += len(line) + 1
        while len(self._lines) > 1 and (
            len(self._lines) > self._max_entries or self._chars > self._max_chars
        ):
            self._chars -= len(self._lines.popleft()) + 1
            self.dropped += 1

    def render(self) -> str:
        """The kept lines, newest last, under a header naming the clock and what was dropped."""
        head = f"# QMP transcript: seconds since the first message (monotonic {self._start or 0.0:.6f})"
        if self.dropped:
            head += f"; {self.dropped} older messages dropped"
        return "\n".join([head, *self._lines]) + "\n"
