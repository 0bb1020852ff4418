"""The host's sans-I/O view of the guest-agent channel (wire protocols 1 and 2).

How this works
--------------
The channel carries one JSON object per ``\\n``-terminated line (see
``docs/guest-protocol.md``).  :class:`GuestProtocol` turns bytes the host
wants to send into lines (:meth:`GuestProtocol.send_request`) and bytes
received from the guest into typed events (:meth:`GuestProtocol.receive_data`).
It does no I/O, holds no clock and never imports trio: the connection that
owns the virtio-serial socket feeds it and acts on the events.

The guest is hostile.  ``receive_data`` never raises, whatever the bytes and
however they are chunked.  Each line is either one well-formed event or one
:class:`Garbage`; parsing resynchronises at the next newline.  A line longer
than ``max_line`` is dropped up to its newline and reported once, when it
first crosses the cap.  Beyond the shape of each message the protocol checks
*state*: a reply or stream event must name a request that is in flight, a
``pty_out`` must name a pty that a ``pty_open`` reply handed out and that has
not exited.  Anything else is garbage, so a guest cannot forge answers to
requests nobody made.

Protocol 2 (a computer rig's agent, with an X session) adds ops whose
replies are plain :class:`Reply` bodies with checked shapes — ``screen``,
``cursor``, ``display``, ``set_display``, ``clipboard_read``,
``clipboard_write`` — and one stream event, ``data``: the bytes of an image
or a clipboard text too big to sit in the reply line, in order, by offset.
A ``ready`` of protocol 2 lists the agent's ``features``.

Change notices (feature ``damage``): a ``damage_watch`` request stays in
flight and streams ``damage`` events — where the screen changed, as at most
:data:`MAX_DAMAGE_RECTS` rectangles inside the screen it names, and the
pointer — until a ``damage_stop`` ends it. Each event is parsed into a
:class:`DamageNotice` (``Stream.body["notice"]``); a bad rectangle makes the
line garbage, never a notice.

The lanes (files, rich clipboard, keymap) add, in both protocols, the file
ops: a drop (``file_put_open``/``_data``/``_close``, ``file_commit``,
``file_abort``) and a read (``file_read``, which streams one ``meta`` event
and then ``data`` events under the host's credit, ``file_ack``,
``file_read_cancel``). A ``file_read`` stream that breaks its rules (data
before meta, a second meta, a gap, more bytes than meta announced) fails the
request at once, like a malformed reply.

Why one module of this size: it is one protocol's sans-I/O parser, and every event and
reply shape the guest may send is checked here, in one place, before any other code sees
it (the guest is hostile); splitting the validators from the shapes they check would
scatter that edge.
"""

from __future__ import annotations

import binascii
import json
from collections import OrderedDict
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any, Final

from rigd.errors import FieldError

__all__ = [
    "MAX_LINE",
    "PROTO",
    "PROTO_DESKTOP",
    "AgentError",
    "DamageNotice",
    "Event",
    "Garbage",
    "GuestProtocol",
    "PtyExit",
    "PtyOutput",
    "Ready",
    "Reply",
    "Stream",
]

PROTO: Final = 1
PROTO_DESKTOP: Final = 2  # a computer rig's agent: frames, pointer, modes, selections
MAX_FEATURES: Final = 64  # a ready/hello lists at most this many features...
MAX_FEATURE_LEN: Final = 64  # ...each at most this long
MAX_LINE: Final = 1 << 20  # bytes per line, newline excluded, both directions
MAX_FILE_READ_CHUNK: Final = 256 * 1024  # raw bytes per file_read data event
MAX_TARGETS: Final = 64  # clipboard_read lists at most this many TARGETS...
MAX_TARGET_LEN: Final = 128  # ...each at most this long
MAX_FILE_NAME: Final = 1024  # characters of a file_read meta name (the guest's NAME_MAX is 255 bytes)
MEDIA_TYPES: Final = ("text/plain", "text/uri-list", "image/png", "image/jpeg")
MAX_DAMAGE_RECTS: Final = 64  # rectangles per damage notice (the agent sends at most 16)
MAX_SCREEN: Final = 16384  # pixels per side of any screen a guest may describe
_HEX: Final = frozenset("0123456789abcdef")
_ABANDONED_MEMORY: Final = 4096  # how many abandoned request ids are remembered


# --------------------------------------------------------------------------
# events


@dataclass(frozen=True, slots=True)
class Ready:
    """The agent (re)started: ``{"ev":"ready"}``.

    ``features`` is what a protocol-2 agent can do now (``"screen"``,
    ``"clipboard_read"``, …); empty for protocol 1.
    """

    proto: int
    agent: str
    pid: int
    features: tuple[str, ...] = ()


@dataclass(frozen=True, slots=True)
class Reply:
    """The final answer to request ``id``.

    ``body`` holds the reply's fields other than ``id``/``ok``/``error``; for
    the ops this module knows (see ``_REPLY_SHAPES``) their types are checked.
    ``error`` is set exactly when ``ok`` is false.
    """

    id: int
    ok: bool
    body: Mapping[str, Any] = field(default_factory=dict)
    error: str | None = None


@dataclass(frozen=True, slots=True)
class Stream:
    """An event streamed for request ``id`` before its reply (e.g. exec ``out``).

    ``data`` is the decoded ``data`` field (``b""`` if the event has none);
    ``body`` holds the other fields, e.g. ``{"fd": 1}``.
    """

    id: int
    name: str
    body: Mapping[str, Any] = field(default_factory=dict)
    data: bytes = b""


@dataclass(frozen=True, slots=True)
class DamageNotice:
    """Where the screen changed (``Stream.body["notice"]`` of a ``damage`` event).

    ``rects`` are ``(x, y, w, h)``, each non-empty and inside the
    ``width``x``height`` screen; ``cursor`` is the pointer then, if inside it.
    """

    rects: tuple[tuple[int, int, int, int], ...]
    width: int
    height: int
    cursor: tuple[int, int] | None = None


@dataclass(frozen=True, slots=True)
class PtyOutput:
    pty: int
    data: bytes


@dataclass(frozen=True, slots=True)
class PtyExit:
    """The pty's process ended; no more output follows for ``pty``.

    Both fields are ``None`` when the guest agent restarted and the pty was lost.
    """

    pty: int
    exit_code: int | None
    signal: int | None


@dataclass(frozen=True, slots=True)
class AgentError:
    """The agent could not parse a line the host sent (``{"ev":"error"}``)."""

    text: str


@dataclass(frozen=True, slots=True)
class Garbage:
    """A line that was not a valid message; ``nbytes`` counts its newline.

    For an over-long line ``nbytes`` is ``max_line + 1`` — what was known to be
    too much when it was dropped; ``GuestProtocol.garbage_bytes`` has the total.
    """

    nbytes: int
    reason: str


Event = Ready | Reply | Stream | PtyOutput | PtyExit | AgentError | Garbage


# --------------------------------------------------------------------------
# shapes


class _Malformed(Exception):
    """Internal: a message has a wrong shape. Never escapes this module."""


def _clean_text(value: str) -> str:
    # JSON may carry lone surrogates; keep them printable and encodable.
    return value.encode("utf-8", "backslashreplace").decode("utf-8")


def _is_int(value: object) -> bool:
    return type(value) is int


def _is_opt_int(value: object) -> bool:
    return value is None or type(value) is int


def _is_bool(value: object) -> bool:
    return type(value) is bool


def _is_str(value: object) -> bool:
    return type(value) is str


def _is_number(value: object) -> bool:
    return type(value) in (int, float)


def _is_str_list(value: object) -> bool:
    return isinstance(value, list) and all(type(v) is str for v in value)


def _is_truncated(value: object) -> bool:
    return isinstance(value, dict) and type(value.get("stdout")) is bool and type(value.get("stderr")) is bool


def _is_size(value: object) -> bool:
    """A screen dimension in pixels (generous: X allows 32767)."""
    return type(value) is int and 0 < value <= 32767


def _is_scale(value: object) -> bool:
    return type(value) in (int, float) and 1.0 <= value <= 1e4  # type: ignore[operator]


def _is_point(value: object) -> bool:
    return (
        isinstance(value, list)
        and len(value) == 2
        and all(type(v) is int and -32768 <= v <= 32767 for v in value)
    )


def _is_opt_point(value: object) -> bool:
    return value is None or _is_point(value)


def _is_count(value: object) -> bool:
    return type(value) is int and value >= 0


def _is_opt_str(value: object) -> bool:
    return value is None or type(value) is str


def _is_modes(value: object) -> bool:
    return isinstance(value, list) and all(
        isinstance(m, dict)
        and _is_size(m.get("width"))
        and _is_size(m.get("height"))
        and _is_str(m.get("name"))
        for m in value
    )


def _is_sha256(value: object) -> bool:
    return type(value) is str and len(value) == 64 and _HEX.issuperset(value)


def _is_abs_path(value: object) -> bool:
    return type(value) is str and value.startswith("/") and "\0" not in value


def _is_abs_paths(value: object) -> bool:
    return isinstance(value, list) and all(_is_abs_path(v) for v in value)


def _is_positive(value: object) -> bool:
    return type(value) is int and value > 0


def _is_media_type(value: object) -> bool:
    return value in MEDIA_TYPES


def _is_targets(value: object) -> bool:
    return (
        isinstance(value, list)
        and len(value) <= MAX_TARGETS
        and all(type(v) is str and 0 < len(v) <= MAX_TARGET_LEN for v in value)
    )


def _is_file_name(value: object) -> bool:
    return (
        type(value) is str
        and 0 < len(value) <= MAX_FILE_NAME
        and "/" not in value
        and "\0" not in value
        and value not in (".", "..")
    )


def _is_file_mode(value: object) -> bool:
    return type(value) is int and 0 <= value <= 0o7777


def _is_features(value: object) -> bool:
    return (
        isinstance(value, list)
        and len(value) <= MAX_FEATURES
        and all(type(v) is str and 0 < len(v) <= MAX_FEATURE_LEN for v in value)
    )


_Check = Callable[[object], bool]

_SCREEN_SHAPE: Final[Mapping[str, tuple[_Check, str]]] = {
    "displayWidth": (_is_size, "a positive integer"),
    "displayHeight": (_is_size, "a positive integer"),
    "imageWidth": (_is_size, "a positive integer"),
    "imageHeight": (_is_size, "a positive integer"),
    "scale": (_is_scale, "a number >= 1"),
    "cursor": (_is_opt_point, "an [x, y] pair of integers or null"),
    "format": (lambda v: v in ("jpeg", "png"), "jpeg or png"),
    "bytes": (_is_count, "a non-negative integer"),
}
_DISPLAY_SHAPE: Final[Mapping[str, tuple[_Check, str]]] = {
    "width": (_is_size, "a positive integer"),
    "height": (_is_size, "a positive integer"),
    "output": (_is_opt_str, "a string or null"),
    "modes": (_is_modes, "a list of {width, height, name}"),
}

# Fields an ``ok: true`` reply must carry, per op. Extra fields are allowed
# (forward compatibility) and passed through in ``Reply.body``.
_REPLY_SHAPES: Final[Mapping[str, Mapping[str, tuple[_Check, str]]]] = {
    "ping": {},
    "hello": {
        "proto": (_is_int, "an integer"),
        "kernel": (_is_str, "a string"),
        "hostname": (_is_str, "a string"),
        "bootS": (_is_number, "a number"),
    },
    "exec": {
        "exitCode": (_is_opt_int, "an integer or null"),
        "signal": (_is_opt_int, "an integer or null"),
        "timedOut": (_is_bool, "a boolean"),
        "truncated": (_is_truncated, "an object of two booleans stdout/stderr"),
        "durationMs": (_is_int, "an integer"),
    },
    "reseed": {
        "entropyCredited": (_is_bool, "a boolean"),
        "crngReseeded": (_is_bool, "a boolean"),
        "machineIdFiles": (_is_str_list, "a list of strings"),
        "macSet": (_is_str_list, "a list of strings"),
    },
    "pty_open": {"pty": (_is_int, "an integer")},
    "pty_in": {},
    "pty_resize": {},
    "pty_close": {},
    "shutdown": {},
    # protocol 2
    "screen": _SCREEN_SHAPE,
    "screenshot": _SCREEN_SHAPE,
    "cursor": {
        "cursor": (_is_point, "an [x, y] pair of integers"),
        "displayWidth": (_is_size, "a positive integer"),
        "displayHeight": (_is_size, "a positive integer"),
    },
    "display": _DISPLAY_SHAPE,
    "set_display": {**_DISPLAY_SHAPE, "changed": (_is_bool, "a boolean")},
    "clipboard_read": {
        "selection": (lambda v: v in ("clipboard", "primary", "xdnd"), "clipboard, primary or xdnd"),
        "owner": (_is_bool, "a boolean"),
        "bytes": (_is_count, "a non-negative integer"),
        "truncated": (_is_bool, "a boolean"),
    },
    "clipboard_write": {
        "selection": (lambda v: v in ("clipboard", "primary"), "clipboard or primary"),
        "bytes": (_is_count, "a non-negative integer"),
        "pending": (_is_bool, "a boolean"),
    },
    "keymap_bind": {
        "bound": (_is_count, "a non-negative integer"),
        "keysymsPerKeycode": (_is_positive, "a positive integer"),
    },
    "damage_watch": {"notices": (_is_count, "a non-negative integer")},
    "damage_stop": {"stopped": (_is_bool, "a boolean")},
    # the file lanes (both protocols)
    "file_put_open": {
        "handle": (_is_int, "an integer"),
        "dir": (_is_abs_path, "an absolute path"),
    },
    "file_put_data": {"bytes": (_is_count, "a non-negative integer")},
    "file_put_close": {
        "bytes": (_is_count, "a non-negative integer"),
        "sha256": (_is_sha256, "64 lower-case hex digits"),
    },
    "file_commit": {"paths": (_is_abs_paths, "a list of absolute paths")},
    "file_abort": {"removed": (_is_count, "a non-negative integer")},
    "file_read": {
        "bytes": (_is_count, "a non-negative integer"),
        "sha256": (_is_sha256, "64 lower-case hex digits"),
    },
    "file_ack": {"known": (_is_bool, "a boolean")},
    "file_read_cancel": {},
}

# Fields an ``ok: true`` reply may carry, checked when present (older agents lack them).
_OPTIONAL_SHAPES: Final[Mapping[str, Mapping[str, tuple[_Check, str]]]] = {
    "hello": {"features": (_is_features, "a list of names")},
    "clipboard_read": {
        "mediaType": (_is_media_type, "one of " + ", ".join(MEDIA_TYPES)),
        "targets": (_is_targets, f"a list of at most {MAX_TARGETS} names"),
    },
    "clipboard_write": {"mediaType": (_is_media_type, "one of " + ", ".join(MEDIA_TYPES))},
}

#: Ops whose payload (``data`` for images, ``text`` for the clipboard) is either
#: inline in the reply or was streamed as ``data`` events; the reply says which
#: by carrying the payload field or ``chunks``.
_BULK: Final[Mapping[str, str]] = {"screen": "data", "screenshot": "data", "clipboard_read": "text"}

# Stream events each op may produce before its reply.
_STREAMS: Final[Mapping[str, frozenset[str]]] = {
    "exec": frozenset({"out"}),
    **{op: frozenset({"data"}) for op in _BULK},
    "file_read": frozenset({"meta", "data"}),
    "damage_watch": frozenset({"damage"}),
}


@dataclass(slots=True)
class _FileRead:
    """What a file_read's stream has delivered: its meta said ``size`` bytes."""

    size: int
    received: int = 0


def _require(obj: Mapping[str, Any], name: str, check: _Check, what: str) -> Any:
    if name not in obj:
        raise _Malformed(f"missing {name}")
    value = obj[name]
    if not check(value):
        raise _Malformed(f"{name} is not {what}")
    return value


def _decode_b64(value: object, name: str) -> bytes:
    if not isinstance(value, str):
        raise _Malformed(f"{name} is not a base64 string")
    try:
        # strict: the standard alphabet, correct padding, nothing after it
        return binascii.a2b_base64(value, strict_mode=True)
    except (binascii.Error, ValueError):  # ValueError: a non-ASCII string
        raise _Malformed(f"{name} is not valid base64") from None


def _reject_constant(name: str) -> Any:
    raise ValueError(f"{name} is not JSON")


def parse_damage(obj: Mapping[str, Any]) -> DamageNotice:
    """A ``damage`` event's fields → a :class:`DamageNotice` (``_Malformed`` otherwise)."""
    width = _require(obj, "width", _is_size, "a positive integer")
    height = _require(obj, "height", _is_size, "a positive integer")
    if width > MAX_SCREEN or height > MAX_SCREEN:
        raise _Malformed(f"a {width}x{height} screen is over {MAX_SCREEN} pixels a side")
    rects = obj.get("rects")
    if not isinstance(rects, list) or not 1 <= len(rects) <= MAX_DAMAGE_RECTS:
        raise _Malformed(f"rects is not a list of 1 to {MAX_DAMAGE_RECTS} rectangles")
    out: list[tuple[int, int, int, int]] = []
    for i, rect in enumerate(rects):
        if not (isinstance(rect, list) and len(rect) == 4 and all(_is_int(v) for v in rect)):
            raise _Malformed(f"rects[{i}] is not [x, y, w, h] of integers")
        x, y, w, h = rect
        if not (x >= 0 and y >= 0 and w > 0 and h > 0 and x + w <= width and y + h <= height):
            raise _Malformed(f"rects[{i}] is not a non-empty rectangle inside the {width}x{height} screen")
        out.append((x, y, w, h))
    cursor = obj.get("cursor")
    point: tuple[int, int] | None = None
    if cursor is not None:
        if not _is_point(cursor):
            raise _Malformed("cursor is not an [x, y] pair of integers or null")
        if 0 <= cursor[0] < width and 0 <= cursor[1] < height:
            point = (cursor[0], cursor[1])
    return DamageNotice(tuple(out), width, height, point)


# --------------------------------------------------------------------------
# the protocol


class GuestProtocol:
    """One host↔agent channel, h11 style: bytes in, events out, no I/O.

    Typical use by the connection that owns the port::

        proto = GuestProtocol()
        rid, line = proto.send_request("exec", argv=["echo", "hi"])
        await port.send_all(line)
        ...
        for event in proto.receive_data(await port.receive_some()):
            ...

    State the owner may read: ``pending`` (request id → op), ``ptys`` (open
    pty handles), ``agent_pid`` (last seen), and the counters ``lines``,
    ``garbage_lines``, ``garbage_bytes``, ``late_messages``.
    """

    def __init__(self, max_line: int = MAX_LINE) -> None:
        if max_line < 1:
            raise ValueError("max_line must be positive")
        self.max_line = max_line
        self.pending: dict[int, str] = {}
        self.ptys: set[int] = set()
        self.agent_pid: int | None = None
        self.lines = 0
        self.garbage_lines = 0
        self.garbage_bytes = 0
        self.late_messages = 0
        self._next_id = 1
        self._abandoned: OrderedDict[int, str] = OrderedDict()
        self._buf = bytearray()
        self._discarding = False
        self._line_bytes = 0  # size of the line being dispatched, newline included
        self._bulk: dict[int, tuple[int, int]] = {}  # request id -> (bytes, chunks) of its data events
        self._file_reads: dict[int, _FileRead] = {}  # file_read id -> its stream so far (after meta)
        self._commits: dict[int, int] = {}  # file_commit id -> how many handles it names

    # ---- sending

    def send_request(self, op: str, **fields: Any) -> tuple[int, bytes]:
        """Allocate an id and encode ``{"id", "op", **fields}`` as one line.

        ``bytes`` values are sent base64-encoded (``stdin=b"..."``,
        ``data=b"..."``), after the other fields.  Raises
        :class:`~rigd.errors.FieldError` if the line would exceed the agent's
        1 MiB cap, naming the biggest field.
        """
        if not op or not isinstance(op, str):
            raise ValueError("op must be a non-empty string")
        if "id" in fields or "op" in fields:
            raise ValueError("id and op are chosen by the protocol")
        binary = {k: v for k, v in fields.items() if isinstance(v, bytes | bytearray | memoryview)}
        plain = {k: v for k, v in fields.items() if k not in binary}
        if op == "file_put_data":
            # The agent reads this spelling without json.loads (docs/guest-protocol.md, lanes).
            plain = {**{k: plain[k] for k in ("handle", "offset") if k in plain}, **plain}
        rid = self._next_id
        head = json.dumps({"id": rid, "op": op, **plain}, separators=(",", ":"), allow_nan=False)
        # Base64 needs no JSON escaping: splice it in rather than have json.dumps
        # scan a big string (file_put_data's half-mebibyte parts).
        parts = [head[:-1].encode("utf-8")]
        for k, v in binary.items():
            parts += [b",", json.dumps(k).encode("utf-8"), b':"', binascii.b2a_base64(v, newline=False), b'"']
        parts.append(b"}")
        line = b"".join(parts)
        if len(line) > MAX_LINE:
            sizes = {k: len(json.dumps(v)) for k, v in plain.items()}
            sizes.update((k, 4 * len(memoryview(v)) // 3) for k, v in binary.items())
            biggest = max(sizes, key=sizes.__getitem__)
            raise FieldError(
                biggest,
                f"the {op} request encodes to {len(line)} bytes, over the guest's {MAX_LINE}-byte line limit",
            )
        self._next_id += 1
        self.pending[rid] = op
        if op == "file_commit" and isinstance(fields.get("handles"), list | tuple):
            self._commits[rid] = len(fields["handles"])
        return rid, line + b"\n"

    def abandon(self, request_id: int) -> None:
        """Stop waiting for ``request_id`` (the owner timed out or was cancelled).

        Late events for it are then dropped quietly and counted in
        ``late_messages`` instead of being reported as garbage.
        """
        op = self.pending.pop(request_id, None)
        self._forget(request_id)
        if op is not None:
            self._abandoned[request_id] = op
            while len(self._abandoned) > _ABANDONED_MEMORY:
                self._abandoned.popitem(last=False)

    # ---- receiving

    def receive_data(self, data: bytes | bytearray) -> list[Event]:
        """Feed bytes from the guest; return the events completed by them.

        Never raises.  An empty ``data`` is a no-op (end of stream is the
        owner's business: a virtio-serial port has no meaningful EOF).
        """
        events: list[Event] = []
        data = bytes(data)
        pos, n = 0, len(data)
        while pos < n:
            nl = data.find(b"\n", pos)
            end = nl if nl >= 0 else n
            size = end - pos
            if self._discarding:
                self.garbage_bytes += size + (nl >= 0)
                if nl >= 0:
                    self._discarding = False
            elif len(self._buf) + size > self.max_line:
                self.garbage_bytes += len(self._buf) + size + (nl >= 0)
                self.garbage_lines += 1
                self._buf.clear()
                self._discarding = nl < 0
                events.append(Garbage(self.max_line + 1, f"line longer than {self.max_line} bytes"))
            elif nl >= 0:
                self._buf += data[pos:end]
                line = bytes(self._buf)
                self._buf.clear()
                self._line(line, events)
            else:
                self._buf += data[pos:end]
            pos = end + 1 if nl >= 0 else n
        return events

    def _line(self, line: bytes, events: list[Event]) -> None:
        self.lines += 1
        self._line_bytes = len(line) + 1
        try:
            self._dispatch(self._parse(line), events)
        except _Malformed as exc:
            self._garbage(self._line_bytes, str(exc), events)
        except Exception as exc:  # defensive: a hostile line must never escape as an error
            self._garbage(self._line_bytes, f"unparseable ({type(exc).__name__})", events)

    def _garbage(self, nbytes: int, reason: str, events: list[Event]) -> None:
        self.garbage_lines += 1
        self.garbage_bytes += nbytes
        events.append(Garbage(nbytes, reason))

    @staticmethod
    def _parse(line: bytes) -> dict[str, Any]:
        try:
            text = line.decode("utf-8")
        except UnicodeDecodeError:
            raise _Malformed("not UTF-8") from None
        try:
            obj = json.loads(text, parse_constant=_reject_constant)
        except (ValueError, RecursionError):
            raise _Malformed("not JSON") from None
        if not isinstance(obj, dict):
            raise _Malformed("not a JSON object")
        return obj

    def _dispatch(self, obj: dict[str, Any], events: list[Event]) -> None:
        if "id" in obj:
            rid = _require(obj, "id", _is_int, "an integer")
            if "ok" in obj:
                self._reply(rid, obj, events)
            elif "ev" in obj:
                self._stream(rid, obj, events)
            else:
                raise _Malformed("a message with an id has neither ok nor ev")
            return
        ev = _require(obj, "ev", _is_str, "a string")
        if ev == "ready":
            self._ready(obj, events)
        elif ev == "pty_out":
            pty = _require(obj, "pty", _is_int, "an integer")
            data = _decode_b64(obj.get("data"), "data")
            if pty not in self.ptys:
                raise _Malformed(f"pty_out for unknown pty {pty}")
            events.append(PtyOutput(pty, data))
        elif ev == "pty_exit":
            pty = _require(obj, "pty", _is_int, "an integer")
            code = _require(obj, "exitCode", _is_opt_int, "an integer or null")
            sig = _require(obj, "signal", _is_opt_int, "an integer or null")
            if pty not in self.ptys:
                raise _Malformed(f"pty_exit for unknown pty {pty}")
            self.ptys.discard(pty)
            events.append(PtyExit(pty, code, sig))
        elif ev == "error":
            text = _require(obj, "error", _is_str, "a string")
            events.append(AgentError(_clean_text(text)))
        else:
            raise _Malformed(f"unknown event {_clean_text(ev)[:64]!r}")

    def _ready(self, obj: dict[str, Any], events: list[Event]) -> None:
        proto = _require(obj, "proto", _is_int, "an integer")
        agent = _require(obj, "agent", _is_str, "a string")
        pid = _require(obj, "pid", _is_int, "an integer")
        features: tuple[str, ...] = ()
        if "features" in obj:
            names = _require(obj, "features", _is_features, "a list of names")
            features = tuple(_clean_text(f) for f in names)
        restarted = self.agent_pid is not None and pid != self.agent_pid
        self.agent_pid = pid
        events.append(Ready(proto, _clean_text(agent), pid, features))
        if restarted:
            # A new agent process knows nothing of the old one's requests or ptys.
            # The new agent may still answer requests that were queued in the
            # port when the old one died; those late answers are dropped quietly.
            for rid in list(self.pending):
                self.abandon(rid)
                events.append(Reply(rid, False, {}, "guest agent restarted"))
            for pty in sorted(self.ptys):
                events.append(PtyExit(pty, None, None))
            self.ptys.clear()

    def _known(self, rid: int, what: str) -> str | None:
        """The op of an in-flight request; None (counted) for an abandoned one."""
        op = self.pending.get(rid)
        if op is not None:
            return op
        if rid in self._abandoned:
            self.late_messages += 1
            return None
        raise _Malformed(f"{what} for unknown request {rid}")

    def _forget(self, rid: int) -> None:
        """Drop what was kept about request ``rid``'s stream and fields."""
        self._bulk.pop(rid, None)
        self._file_reads.pop(rid, None)
        self._commits.pop(rid, None)

    def _fail(self, rid: int, reason: str, events: list[Event]) -> None:
        """A malformed answer to ``rid``: a Garbage, and the request fails now."""
        self.abandon(rid)  # whatever else it sends is late, not garbage
        self._garbage(self._line_bytes, reason, events)
        events.append(Reply(rid, False, {}, f"guest sent a {reason}"))

    def _reply(self, rid: int, obj: dict[str, Any], events: list[Event]) -> None:
        ok = _require(obj, "ok", _is_bool, "a boolean")
        error = None if ok else _clean_text(_require(obj, "error", _is_str, "a string"))
        op = self._known(rid, "reply")
        if op is None:
            self._abandoned.pop(rid, None)
            return
        body = {k: v for k, v in obj.items() if k not in ("id", "ok", "error")}
        if ok:
            try:
                for name, (check, what) in _REPLY_SHAPES.get(op, {}).items():
                    _require(body, name, check, what)
                for name, (check, what) in _OPTIONAL_SHAPES.get(op, {}).items():
                    if name in body:
                        _require(body, name, check, what)
                if op == "pty_open" and body["pty"] in self.ptys:
                    raise _Malformed(f"pty {body['pty']} is already open")
                if op == "hello":
                    pid = body.get("pid")
                    if _is_int(pid) and self.agent_pid is None:
                        self.agent_pid = pid
                if op == "clipboard_read":
                    self._check_clipboard(rid, body)
                elif op in _BULK:
                    self._check_bulk(rid, _BULK[op], body)
                elif op == "file_read":
                    self._check_file_read_reply(rid, body)
                elif op == "file_commit":
                    want = self._commits.get(rid)
                    if want is not None and len(body["paths"]) != want:
                        raise _Malformed(f"{len(body['paths'])} paths for {want} handles")
            except _Malformed as exc:
                # The request is final either way: fail it now rather than let
                # its owner wait for a reply that will never come.
                del self.pending[rid]
                self._forget(rid)
                reason = f"malformed {op} reply: {exc}"
                self._garbage(self._line_bytes, reason, events)
                events.append(Reply(rid, False, {}, f"guest sent a {reason}"))
                return
            if op == "pty_open":
                self.ptys.add(body["pty"])
        del self.pending[rid]
        self._forget(rid)
        events.append(Reply(rid, ok, body, error))

    def _stream(self, rid: int, obj: dict[str, Any], events: list[Event]) -> None:
        name = _require(obj, "ev", _is_str, "a string")
        op = self._known(rid, f"{name!r} event")
        if op is None:
            return
        if op == "file_read":
            self._file_read_stream(rid, name, obj, events)
            return
        if name not in _STREAMS.get(op, frozenset()):
            raise _Malformed(f"{op} does not stream {_clean_text(name)[:64]!r}")
        if name == "damage":
            events.append(Stream(rid, name, {"notice": parse_damage(obj)}))
            return
        body = {k: v for k, v in obj.items() if k not in ("id", "ev", "data")}
        data = _decode_b64(obj.get("data"), "data") if "data" in obj else b""
        if "data" not in obj:
            raise _Malformed("missing data")
        if name == "out":
            fd = _require(body, "fd", _is_int, "an integer")
            if fd not in (1, 2):
                raise _Malformed(f"fd {fd} is neither 1 nor 2")
        elif name == "data":
            # In order, no gaps: each chunk starts where the last one ended.
            offset = _require(body, "offset", _is_count, "a non-negative integer")
            have, chunks = self._bulk.get(rid, (0, 0))
            if offset != have:
                raise _Malformed(f"data at offset {offset}, expected {have}")
            self._bulk[rid] = (have + len(data), chunks + 1)
        events.append(Stream(rid, name, body, data))

    def _file_read_stream(self, rid: int, name: str, obj: dict[str, Any], events: list[Event]) -> None:
        """``meta`` once and first, then ``data`` in order up to meta's size; else the read fails."""
        try:
            events.append(self._file_read_event(rid, name, obj))
        except _Malformed as exc:
            self._fail(rid, f"malformed file_read stream: {exc}", events)

    def _file_read_event(self, rid: int, name: str, obj: dict[str, Any]) -> Stream:
        state = self._file_reads.get(rid)
        if name == "meta":
            if state is not None:
                raise _Malformed("a second meta")
            size = _require(obj, "bytes", _is_count, "a non-negative integer")
            digest = _require(obj, "sha256", _is_sha256, "64 lower-case hex digits")
            fname = _require(obj, "name", _is_file_name, "a file name")
            mode = _require(obj, "mode", _is_file_mode, "permission bits (0 to 0o7777)")
            self._file_reads[rid] = _FileRead(size)
            meta = {"bytes": size, "sha256": digest, "name": _clean_text(fname), "mode": mode}
            return Stream(rid, "meta", meta)
        if name != "data":
            raise _Malformed(f"file_read does not stream {_clean_text(name)[:64]!r}")
        if state is None:
            raise _Malformed("data before meta")
        offset = _require(obj, "offset", _is_count, "a non-negative integer")
        if "data" not in obj:
            raise _Malformed("missing data")
        if type(obj["data"]) is str and len(obj["data"]) > 4 * MAX_FILE_READ_CHUNK // 3 + 4:
            raise _Malformed(f"a data event over {MAX_FILE_READ_CHUNK} bytes")
        data = _decode_b64(obj["data"], "data")
        if offset != state.received:
            raise _Malformed(f"data at offset {offset}, expected {state.received}")
        if not data:
            raise _Malformed("an empty data event")
        if len(data) > MAX_FILE_READ_CHUNK:
            raise _Malformed(f"a data event over {MAX_FILE_READ_CHUNK} bytes")
        if state.received + len(data) > state.size:
            raise _Malformed(f"data past the {state.size} bytes meta announced")
        state.received += len(data)
        return Stream(rid, "data", {"offset": offset}, data)

    def _check_file_read_reply(self, rid: int, body: Mapping[str, Any]) -> None:
        """The final count is what the data events delivered (the digest is the caller's to compare)."""
        state = self._file_reads.get(rid)
        if state is None:
            raise _Malformed("a reply without meta")
        if body["bytes"] != state.received:
            raise _Malformed(f"bytes says {body['bytes']}, {state.received} bytes of data came")

    def _check_clipboard(self, rid: int, body: Mapping[str, Any]) -> None:
        """Text (and URI lists) come as ``text``, images as ``data``; either may be ``chunks``."""
        media = body.get("mediaType", "text/plain")
        field_name, other = ("data", "text") if media.startswith("image/") else ("text", "data")
        if other in body:
            raise _Malformed(f"{other} in a {media} reply")
        self._check_bulk(rid, field_name, body)

    def _check_bulk(self, rid: int, field_name: str, body: Mapping[str, Any]) -> None:
        """A payload is inline (``field_name``) xor streamed (``chunks``, matching what came)."""
        have, chunks = self._bulk.get(rid, (0, 0))
        if field_name in body:
            if "chunks" in body:
                raise _Malformed(f"both {field_name} and chunks")
            _require(body, field_name, _is_str, "a string")
            if chunks:
                raise _Malformed(f"{field_name} inline after {chunks} data events")
            return
        count = _require(body, "chunks", _is_count, "a non-negative integer")
        if count != chunks:
            raise _Malformed(f"chunks says {count}, {chunks} data events came")
        if have != body["bytes"]:
            raise _Malformed(f"bytes says {body['bytes']}, {have} bytes of data came")
