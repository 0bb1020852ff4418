"""Sans-I/O sniffers: the server name a guest connection asks for, read from its first bytes.

How this works: the proxy feeds each guest connection's first bytes to a
sniffer until it returns a verdict. :class:`ClientHelloSniffer` reassembles
the TLS handshake message from as many records and segments as it takes,
then walks the ClientHello to the ``server_name`` extension (no library
reads a ClientHello without also being a TLS stack, see docs/decisions.md).
:class:`HttpHostSniffer` waits for the end of the request head and reads the
``Host`` header (or an absolute-form target). Both buffer at most a fixed
number of bytes; past the cap the verdict is :class:`TooLarge`. Neither
raises on any input: a verdict for garbage is :class:`NotRecognised`. The
bytes fed are kept (``buffered``) so the proxy can replay them upstream.

A request head (request line and header fields) is parsed by ``h11``
(:func:`parse_request_head`); the gateway adds its own refusals on top and
turns h11's errors into fixed reasons (h11's messages quote the offending
line, and an audit reason never carries payload).

:class:`RequestFramer` is used only for brokered hosts, on the decrypted
side of the proxy's own TLS: it splits an HTTP/1.1 request stream into heads
(which the broker rewrites) and body bytes (Content-Length or chunked). The
body bytes are passed on exactly as sent, which is why this part is not h11:
h11 decodes chunked bodies and will not read a second pipelined request
before a response has been sent through it.
"""

from __future__ import annotations

import re
import struct
from dataclasses import dataclass, field

import h11

from netgate.policy import is_ip_literal, normalize_name

MAX_CLIENT_HELLO = 32 * 1024
MAX_HTTP_HEAD = 64 * 1024


@dataclass(frozen=True, slots=True)
class NeedMore:
    pass


@dataclass(frozen=True, slots=True)
class ServerName:
    """The name the client asked for (normalized), or an IP literal it asked for."""

    name: str
    ip_literal: bool = False


@dataclass(frozen=True, slots=True)
class NoServerName:
    """A well-formed request that names no server (no SNI, HTTP/1.0 without Host)."""

    reason: str


@dataclass(frozen=True, slots=True)
class NotRecognised:
    reason: str


@dataclass(frozen=True, slots=True)
class TooLarge:
    limit: int


Verdict = NeedMore | ServerName | NoServerName | NotRecognised | TooLarge


def _server_name(raw: str) -> ServerName | NotRecognised:
    host = raw.strip()
    if is_ip_literal(host):
        return ServerName(host.strip("[]"), ip_literal=True)
    norm = normalize_name(host)
    if norm is None:
        return NotRecognised(f"invalid server name {raw[:80]!r}")
    return ServerName(norm)


class _Truncated(Exception):
    pass


@dataclass(slots=True)
class ClientHelloSniffer:
    """Feed the client's first bytes; returns the SNI verdict once it can."""

    limit: int = MAX_CLIENT_HELLO
    buffered: bytearray = field(default_factory=bytearray)
    _verdict: Verdict = field(default_factory=NeedMore)

    def feed(self, data: bytes) -> Verdict:
        if not isinstance(self._verdict, NeedMore):
            return self._verdict
        self.buffered += data
        try:
            self._verdict = self._parse()
        except Exception as exc:  # never raise on guest bytes
            self._verdict = NotRecognised(f"unreadable ClientHello ({type(exc).__name__})")
        if isinstance(self._verdict, NeedMore) and len(self.buffered) > self.limit:
            self._verdict = TooLarge(self.limit)
        return self._verdict

    def _parse(self) -> Verdict:
        buf = bytes(self.buffered)
        # Reassemble the handshake message from TLS records (type 22).
        if buf[:1] not in (b"", b"\x16") or buf[1:2] not in (b"", b"\x03"):
            return NotRecognised("not a TLS handshake")
        hs = bytearray()
        off = 0
        while True:
            if len(buf) - off < 5:
                break
            ctype, major, _minor, length = struct.unpack_from("!BBBH", buf, off)
            if ctype != 22 or major != 3:
                return NotRecognised("not a TLS handshake")
            if length == 0 or length > 16384 + 2048:
                return NotRecognised("bad TLS record length")
            if len(buf) - off - 5 < length:
                hs += buf[off + 5 :]
                break
            hs += buf[off + 5 : off + 5 + length]
            off += 5 + length
            if len(hs) >= 4 and len(hs) >= 4 + int.from_bytes(hs[1:4], "big"):
                break
        if len(hs) < 4:
            return NeedMore()
        if hs[0] != 1:
            return NotRecognised("first handshake message is not a ClientHello")
        hlen = int.from_bytes(hs[1:4], "big")
        if hlen > self.limit:
            return TooLarge(self.limit)
        if len(hs) < 4 + hlen:
            return NeedMore()
        try:
            return _parse_client_hello(bytes(hs[4 : 4 + hlen]))
        except _Truncated:
            return NotRecognised("truncated ClientHello")


class _Reader:
    """A cursor over a TLS structure: fixed fields and length-prefixed vectors; raises :class:`_Truncated`."""

    __slots__ = ("data", "pos")

    def __init__(self, data: bytes) -> None:
        self.data = data
        self.pos = 0

    @property
    def remaining(self) -> int:
        return len(self.data) - self.pos

    def take(self, n: int) -> bytes:
        if n > self.remaining:
            raise _Truncated
        out = self.data[self.pos : self.pos + n]
        self.pos += n
        return out

    def uint(self, size: int) -> int:
        return int.from_bytes(self.take(size), "big")

    def vector(self, len_size: int) -> bytes:
        """A vector with a ``len_size``-byte length prefix (RFC 8446 §3.4)."""
        return self.take(self.uint(len_size))


def _parse_client_hello(body: bytes) -> Verdict:
    r = _Reader(body)
    r.take(2 + 32)  # legacy_version, random
    r.vector(1)  # session id
    r.vector(2)  # cipher suites
    r.vector(1)  # compression methods
    if not r.remaining:
        return NoServerName("ClientHello has no extensions")
    exts = _Reader(r.vector(2))
    seen: set[int] = set()
    found: Verdict | None = None
    while exts.remaining:
        etype = exts.uint(2)
        data = exts.vector(2)
        if etype in seen:  # RFC 8446 §4.2: duplicate extensions are an error
            return NotRecognised(f"duplicate extension {etype}")
        seen.add(etype)
        if etype == 0:
            found = _parse_sni(data)
    return found if found is not None else NoServerName("ClientHello has no server_name")


def _parse_sni(data: bytes) -> Verdict:
    r = _Reader(data)
    names: list[bytes] = []
    try:
        if r.uint(2) != r.remaining:
            return NotRecognised("malformed server_name extension")
        while r.remaining:
            kind = r.uint(1)
            name = r.vector(2)
            if kind == 0:
                names.append(name)
    except _Truncated:
        return NotRecognised("malformed server_name extension")
    if len(names) != 1:
        return NotRecognised(f"{len(names)} host names in server_name")
    try:
        text = names[0].decode("ascii")
    except UnicodeDecodeError:
        return NotRecognised("non-ASCII server name")
    return _server_name(text)


@dataclass(frozen=True, slots=True)
class RequestHead:
    method: str
    target: str
    version: str
    headers: tuple[tuple[str, str], ...]  #: (lowercase name, value), in order
    raw: bytes
    #: (name as sent, value), in order: what :func:`rewrite_head` passes on
    raw_headers: tuple[tuple[str, str], ...] = ()

    def get_all(self, name: str) -> list[str]:
        return [v for k, v in self.headers if k == name]


class HeadError(ValueError):
    pass


class HostError(HeadError):
    """The head is readable but names no one server: no Host in HTTP/1.1, or more than one Host."""

    def __init__(self, reason: str, *, missing: bool) -> None:
        super().__init__(reason)
        self.missing = missing


NO_HOST = "request has no Host"
MANY_HOSTS = "more than one Host header"

#: h11's errors, by how their messages begin, as the gateway's fixed reasons (h11's own
#: messages quote the offending bytes, which must not reach an audit log).
_H11_REASONS = (
    ("illegal request line", "malformed request line"),
    ("no request line", "malformed request line"),
    ("Illegal method", "malformed method"),
    ("Illegal target", "malformed request target"),
    ("illegal header line", "malformed header line"),
    ("continuation line", "obsolete line folding"),
    ("conflicting Content-Length", "bad Content-Length"),
    ("bad Content-Length", "bad Content-Length"),
    ("Only Transfer-Encoding: chunked", "unsupported Transfer-Encoding"),
    ("multiple Transfer-Encoding", "unsupported Transfer-Encoding"),
)


def _from_h11(exc: h11.ProtocolError) -> HeadError:
    text = str(exc)
    if text.startswith("Missing mandatory Host"):
        return HostError(NO_HOST, missing=True)
    if text.startswith("Found multiple Host"):
        return HostError(MANY_HOSTS, missing=False)
    for prefix, reason in _H11_REASONS:
        if text.startswith(prefix):
            return HeadError(reason)
    return HeadError("malformed request head")


def parse_request_head(raw: bytes) -> RequestHead:
    """Parse a request head (up to and including the blank line); raise :class:`HeadError`.

    h11 reads the request line and the fields (token names, field values,
    Content-Length and Transfer-Encoding values, one Host, and a Host at all
    in HTTP/1.1, RFC 9112 §3.2). Refused on top, as before: line ends other
    than CRLF and obsolete line folding (h11 accepts both, and a server
    behind the gateway might read them differently), versions other than
    1.0 and 1.1, methods that are not upper-case letters.
    """
    if not raw.endswith(b"\r\n\r\n") or raw.find(b"\r\n\r\n") != len(raw) - 4:
        raise HeadError("head does not end with a blank line")
    crlf = raw.count(b"\r\n")
    if raw.count(b"\n") != crlf or raw.count(b"\r") != crlf:
        raise HeadError("control character in the head (a CR or LF outside a CRLF)")
    if b"\r\n " in raw or b"\r\n\t" in raw:
        raise HeadError("obsolete line folding")
    conn = h11.Connection(h11.SERVER, max_incomplete_event_size=len(raw))
    conn.receive_data(raw)
    try:
        event = conn.next_event()
    except h11.RemoteProtocolError as exc:
        raise _from_h11(exc) from None
    if not isinstance(event, h11.Request):  # pragma: no cover - a whole head makes a Request or an error
        raise HeadError("malformed request head")
    method = event.method.decode("ascii")  # h11: a token
    if not (method.isalpha() and method.isupper()):
        raise HeadError("malformed method")
    version = "HTTP/" + event.http_version.decode("ascii")
    if version not in ("HTTP/1.0", "HTTP/1.1"):
        raise HeadError(f"unsupported version {version[:20]!r}")
    fields = tuple((k.decode("latin-1"), v.decode("latin-1")) for k, v in event.headers.raw_items())
    # Names are tokens (ASCII), so lower-casing the text is what h11 does to the bytes.
    return RequestHead(method, event.target.decode("ascii"), version,
                       tuple((k.lower(), v) for k, v in fields), raw, fields)


def host_of(head: RequestHead) -> Verdict:
    """The server a request head names: its Host header, or an absolute-form target."""
    hosts = head.get_all("host")
    if len(hosts) > 1:
        return NotRecognised(MANY_HOSTS)
    if head.method == "CONNECT":
        return NotRecognised("CONNECT is not proxied")
    target_host = None
    if "://" in head.target:
        scheme, _, rest = head.target.partition("://")
        if scheme.lower() not in ("http", "https"):
            return NotRecognised("unsupported scheme in request target")
        target_host = rest.split("/", 1)[0].split("?", 1)[0]
    host = hosts[0] if hosts else target_host
    if host is None:
        return NoServerName(NO_HOST)
    host = _strip_port(host)
    if host is None:
        return NotRecognised("malformed Host")
    if target_host is not None:
        th = _strip_port(target_host)
        if th is None or th.lower() != host.lower():
            return NotRecognised("Host and request target name different servers")
    if "@" in host:
        return NotRecognised("userinfo in Host")
    return _server_name(host)


def _strip_port(host: str) -> str | None:
    host = host.strip()
    if host.startswith("["):
        end = host.find("]")
        if end < 0:
            return None
        rest = host[end + 1 :]
        if rest and not (rest.startswith(":") and rest[1:].isdigit()):
            return None
        return host[1:end]
    name, sep, port = host.rpartition(":")
    if sep and port.isdigit() and name:
        return name
    if sep and ":" in name:  # a bare IPv6 literal
        return host
    if sep:
        return None
    return host


@dataclass(slots=True)
class HttpHostSniffer:
    """Feed a plain-HTTP connection's first bytes; returns the Host verdict once the head is in."""

    limit: int = MAX_HTTP_HEAD
    buffered: bytearray = field(default_factory=bytearray)
    _verdict: Verdict = field(default_factory=NeedMore)

    def feed(self, data: bytes) -> Verdict:
        if not isinstance(self._verdict, NeedMore):
            return self._verdict
        self.buffered += data
        try:
            self._verdict = self._parse()
        except Exception as exc:  # never raise on guest bytes
            self._verdict = NotRecognised(f"unreadable request ({type(exc).__name__})")
        return self._verdict

    def _parse(self) -> Verdict:
        buf = bytes(self.buffered)
        # Tolerate leading blank lines (RFC 9112 §2.2), nothing else.
        stripped = buf.lstrip(b"\r\n")
        if stripped:
            sp = stripped.find(b" ", 0, 21)
            token = stripped[:sp] if sp >= 0 else stripped[:21]
            if sp == 0 or (sp < 0 and len(stripped) > 20) or not (token.isalpha() and token.isupper()):
                return NotRecognised("not an HTTP/1.x request")
        end = stripped.find(b"\r\n\r\n")
        if end < 0:
            if len(buf) > self.limit:
                return TooLarge(self.limit)
            return NeedMore()
        if end + 4 > self.limit:
            return TooLarge(self.limit)
        try:
            head = parse_request_head(stripped[: end + 4])
        except HostError as exc:
            return NoServerName(str(exc)) if exc.missing else NotRecognised(str(exc))
        except HeadError as exc:
            return NotRecognised(str(exc))
        return host_of(head)


# --- HTTP/1.1 request framing (brokered hosts only) ------------------------------------------


@dataclass(frozen=True, slots=True)
class Head:
    head: RequestHead


@dataclass(frozen=True, slots=True)
class Body:
    data: bytes


@dataclass(frozen=True, slots=True)
class EndOfMessage:
    pass


@dataclass(frozen=True, slots=True)
class FramingError:
    reason: str


@dataclass(frozen=True, slots=True)
class Opaque:
    """The stream is no longer HTTP (after an Upgrade request): pass bytes through."""

    data: bytes


@dataclass(frozen=True, slots=True)
class Misdirected:
    """A readable head that names no one server (no Host in HTTP/1.1, or several): answer 421, close."""

    reason: str


FramerEvent = Head | Body | EndOfMessage | FramingError | Misdirected | Opaque

MAX_CHUNK_LINE = 1024
_CONTENT_LENGTH_LIST = re.compile(rb"\r\ncontent-length:[^\r]*,", re.IGNORECASE)


@dataclass(slots=True)
class RequestFramer:
    """Split a client's HTTP/1.1 byte stream into request heads and bodies. Never raises.

    After a :class:`FramingError` or :class:`Misdirected` every further feed
    returns nothing: the proxy closes the connection. After a request that asks to ``Upgrade`` the rest
    of the stream is :class:`Opaque`.
    """

    head_limit: int = MAX_HTTP_HEAD
    _buf: bytearray = field(default_factory=bytearray)
    _state: str = "head"  # head | length | chunk-size | chunk-data | chunk-crlf | trailer | opaque | dead
    _remaining: int = 0

    def feed(self, data: bytes) -> list[FramerEvent]:
        if self._state == "dead":
            return []
        self._buf += data
        out: list[FramerEvent] = []
        try:
            self._run(out)
        except Exception as exc:  # never raise on guest bytes
            self._state = "dead"
            out.append(FramingError(f"unreadable request stream ({type(exc).__name__})"))
        return out

    def _fail(self, out: list[FramerEvent], reason: str) -> None:
        self._state = "dead"
        self._buf.clear()
        out.append(FramingError(reason))

    def _run(self, out: list[FramerEvent]) -> None:
        while True:
            st = self._state
            if st == "dead":
                return
            if st == "opaque":
                if self._buf:
                    out.append(Opaque(bytes(self._buf)))
                    self._buf.clear()
                return
            if st == "head":
                while self._buf[:2] == b"\r\n":
                    del self._buf[:2]
                end = self._buf.find(b"\r\n\r\n")
                if end < 0:
                    if len(self._buf) > self.head_limit:
                        self._fail(out, "request head too large")
                    return
                if end + 4 > self.head_limit:
                    self._fail(out, "request head too large")
                    return
                raw = bytes(self._buf[: end + 4])
                del self._buf[: end + 4]
                try:
                    head = parse_request_head(raw)
                except HostError as exc:
                    self._state = "dead"
                    self._buf.clear()
                    out.append(Misdirected(str(exc)))
                    return
                except HeadError as exc:
                    self._fail(out, str(exc))
                    return
                # A head whose body framing is refused is never passed on.
                te = [v.lower() for v in head.get_all("transfer-encoding")]
                cl = head.get_all("content-length")
                if te and (cl or te != ["chunked"]):
                    self._fail(out, "unsupported Transfer-Encoding / Content-Length combination")
                    return
                # h11 merges a list ("5, 5") into one value; the gateway refuses it, as it always has.
                if cl and (len(set(cl)) != 1 or not cl[0].isdigit() or len(cl[0]) > 18
                           or _CONTENT_LENGTH_LIST.search(raw)):
                    self._fail(out, "bad Content-Length")
                    return
                out.append(Head(head))
                if "upgrade" in [t.strip().lower() for v in head.get_all("connection") for t in v.split(",")]:
                    self._state = "opaque"
                    continue
                if te:
                    self._state = "chunk-size"
                elif cl:
                    self._remaining = int(cl[0])
                    self._state = "length"
                else:
                    out.append(EndOfMessage())
                continue
            if st == "length":
                if self._remaining == 0:
                    out.append(EndOfMessage())
                    self._state = "head"
                    continue
                if not self._buf:
                    return
                n = min(self._remaining, len(self._buf))
                out.append(Body(bytes(self._buf[:n])))
                del self._buf[:n]
                self._remaining -= n
                continue
            if st == "chunk-size":
                end = self._buf.find(b"\r\n")
                if end < 0:
                    if len(self._buf) > MAX_CHUNK_LINE:
                        self._fail(out, "chunk size line too long")
                    return
                line = bytes(self._buf[: end + 2])
                size_text = line[:end].split(b";", 1)[0].strip()
                if not size_text or len(size_text) > 16 or size_text.strip(b"0123456789abcdefABCDEF"):
                    self._fail(out, "bad chunk size")
                    return
                del self._buf[: end + 2]
                out.append(Body(line))
                self._remaining = int(size_text, 16)
                self._state = "chunk-data" if self._remaining else "trailer"
                continue
            if st == "chunk-data":
                if self._remaining == 0:
                    self._state = "chunk-crlf"
                    continue
                if not self._buf:
                    return
                n = min(self._remaining, len(self._buf))
                out.append(Body(bytes(self._buf[:n])))
                del self._buf[:n]
                self._remaining -= n
                continue
            if st == "chunk-crlf":
                if len(self._buf) < 2:
                    return
                if self._buf[:2] != b"\r\n":
                    self._fail(out, "chunk not followed by CRLF")
                    return
                del self._buf[:2]
                out.append(Body(b"\r\n"))
                self._state = "chunk-size"
                continue
            if st == "trailer":
                end = self._buf.find(b"\r\n")
                if end < 0:
                    if len(self._buf) > self.head_limit:
                        self._fail(out, "trailer too large")
                    return
                line = bytes(self._buf[: end + 2])
                del self._buf[: end + 2]
                out.append(Body(line))
                if end == 0:
                    out.append(EndOfMessage())
                    self._state = "head"
                continue
            raise AssertionError(st)  # pragma: no cover


def rewrite_head(head: RequestHead, set_headers: dict[str, str]) -> bytes:
    """Serialize ``head`` with the named headers replaced (any guest copies dropped)."""
    drop = {k.lower() for k in set_headers}
    lines = [f"{head.method} {head.target} {head.version}"]
    lines += [f"{k}: {v}" for k, v in head.raw_headers if k.lower() not in drop]
    lines += [f"{k}: {v}" for k, v in set_headers.items()]
    return ("\r\n".join(lines) + "\r\n\r\n").encode("latin-1")
