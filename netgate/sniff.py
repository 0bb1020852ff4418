"""Sans-I/O sniffers: the server name a guest connection asks for, read from its first bytes.

How this works: the proxy feeds each guest connection's first bytes to a
sniffer until it returns a verdict. :class:`ClientHelloSniffer` reassembles
the TLS handshake message from as many records and segments as it takes,
then walks the ClientHello to the ``server_name`` extension.
:class:`HttpHostSniffer` waits for the end of the request head and reads the
``Host`` header (or an absolute-form target). Both buffer at most a fixed
number of bytes; past the cap the verdict is :class:`TooLarge`. Neither
raises on any input: a verdict for garbage is :class:`NotRecognised`. The
bytes fed are kept (``buffered``) so the proxy can replay them upstream.

:class:`RequestFramer` is used only for brokered hosts, on the decrypted
side of the proxy's own TLS: it splits an HTTP/1.1 request stream into heads
(which the broker rewrites) and body bytes (Content-Length or chunked).
"""

from __future__ import annotations

import struct
from dataclasses import dataclass, field

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


def _parse_client_hello(body: bytes) -> Verdict:
    pos = 0

    def take(n: int) -> bytes:
        nonlocal pos
        if pos + n > len(body):
            raise _Truncated
        out = body[pos : pos + n]
        pos += n
        return out

    take(2 + 32)  # legacy_version, random
    take(take(1)[0])  # session id
    take(int.from_bytes(take(2), "big"))  # cipher suites
    take(take(1)[0])  # compression methods
    if pos == len(body):
        return NoServerName("ClientHello has no extensions")
    ext_total = int.from_bytes(take(2), "big")
    end = pos + ext_total
    if end > len(body):
        raise _Truncated
    seen: set[int] = set()
    found: Verdict | None = None
    while pos < end:
        etype = int.from_bytes(take(2), "big")
        elen = int.from_bytes(take(2), "big")
        data = take(elen)
        if etype in seen:  # RFC 8446 §4.2: duplicate extensions are an error
            return NotRecognised(f"duplicate extension {etype}")
        seen.add(etype)
        if etype == 0:
            found = _parse_sni(data)
    return found if found is not None else NoServerName("ClientHello has no server_name")


def _parse_sni(data: bytes) -> Verdict:
    if len(data) < 2 or int.from_bytes(data[:2], "big") != len(data) - 2:
        return NotRecognised("malformed server_name extension")
    pos = 2
    names: list[bytes] = []
    while pos < len(data):
        if pos + 3 > len(data):
            return NotRecognised("malformed server_name extension")
        kind = data[pos]
        nlen = int.from_bytes(data[pos + 1 : pos + 3], "big")
        name = data[pos + 3 : pos + 3 + nlen]
        if len(name) != nlen:
            return NotRecognised("malformed server_name extension")
        if kind == 0:
            names.append(name)
        pos += 3 + nlen
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

    def get_all(self, name: str) -> list[str]:
        return [v for k, v in self.headers if k == name]


class HeadError(ValueError):
    pass


def parse_request_head(raw: bytes) -> RequestHead:
    """Parse a request head (up to and including the blank line); raise :class:`HeadError`."""
    try:
        text = raw.decode("latin-1")
    except UnicodeDecodeError:  # pragma: no cover - latin-1 decodes every byte
        raise HeadError("undecodable head") from None
    lines = text.split("\r\n")
    if len(lines) < 2 or lines[-1] != "" or lines[-2] != "":
        raise HeadError("head does not end with a blank line")
    parts = lines[0].split(" ")
    if len(parts) != 3:
        raise HeadError("malformed request line")
    method, target, version = parts
    if not method.isascii() or not method.isalpha() or not method.isupper():
        raise HeadError("malformed method")
    if version not in ("HTTP/1.0", "HTTP/1.1"):
        raise HeadError(f"unsupported version {version[:20]!r}")
    headers: list[tuple[str, str]] = []
    for line in lines[1:-2]:
        if not line or line[0] in " \t":
            raise HeadError("obsolete line folding")
        name, sep, value = line.partition(":")
        if not sep or not name or name != name.strip() or any(c in name for c in " \t\x00\r\n"):
            raise HeadError("malformed header line")
        if any(c in value for c in "\x00\r\n"):
            raise HeadError("control character in a header value")
        headers.append((name.lower(), value.strip(" \t")))
    return RequestHead(method, target, version, tuple(headers), raw)


def host_of(head: RequestHead) -> Verdict:
    """The server a request head names: its Host header, or an absolute-form target."""
    hosts = head.get_all("host")
    if len(hosts) > 1:
        return NotRecognised("more than one Host header")
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
        return NoServerName("request has no Host")
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


FramerEvent = Head | Body | EndOfMessage | FramingError | Opaque

MAX_CHUNK_LINE = 1024


@dataclass(slots=True)
class RequestFramer:
    """Split a client's HTTP/1.1 byte stream into request heads and bodies. Never raises.

    After a :class:`FramingError` every further feed returns nothing: the proxy
    closes the connection. After a request that asks to ``Upgrade`` the rest
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
                except HeadError as exc:
                    self._fail(out, str(exc))
                    return
                te = [v.lower() for v in head.get_all("transfer-encoding")]
                cl = head.get_all("content-length")
                out.append(Head(head))
                if "upgrade" in [t.strip().lower() for v in head.get_all("connection") for t in v.split(",")]:
                    self._state = "opaque"
                    continue
                if te:
                    if cl or te != ["chunked"]:
                        self._fail(out, "unsupported Transfer-Encoding / Content-Length combination")
                        return
                    self._state = "chunk-size"
                elif cl:
                    if len(set(cl)) != 1 or not cl[0].isdigit() or len(cl[0]) > 18:
                        self._fail(out, "bad Content-Length")
                        return
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
    lines += [f"{k}: {v}" for k, v in _original_case(head) if k.lower() not in drop]
    lines += [f"{k}: {v}" for k, v in set_headers.items()]
    return ("\r\n".join(lines) + "\r\n\r\n").encode("latin-1")


def _original_case(head: RequestHead) -> list[tuple[str, str]]:
    out = []
    for line in head.raw.decode("latin-1").split("\r\n")[1:]:
        if not line:
            break
        name, _, value = line.partition(":")
        out.append((name, value.strip(" \t")))
    return out
