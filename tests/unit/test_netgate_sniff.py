"""SNI and Host sniffing, sans-I/O: real ClientHellos, split input, crafted and garbage input."""

from __future__ import annotations

import ssl
import struct

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from netgate import sniff


def client_hello(server_hostname: str | None) -> bytes:
    """The ClientHello Python's own TLS client sends (no sockets: memory BIOs)."""
    ctx = ssl.create_default_context()
    ctx.check_hostname = False
    ctx.verify_mode = ssl.CERT_NONE
    obj = ctx.wrap_bio(ssl.MemoryBIO(), (out := ssl.MemoryBIO()), server_hostname=server_hostname)
    with pytest.raises(ssl.SSLWantReadError):
        obj.do_handshake()
    return out.read()


def crafted_hello(names: list[tuple[int, bytes]] | None, *, extra_ext: bytes = b"") -> bytes:
    exts = extra_ext
    if names is not None:
        entries = b"".join(struct.pack("!BH", kind, len(n)) + n for kind, n in names)
        sni = struct.pack("!H", len(entries)) + entries
        exts += struct.pack("!HH", 0, len(sni)) + sni
    body = b"\x03\x03" + b"\x00" * 32 + b"\x00" + b"\x00\x02\x13\x01" + b"\x01\x00"
    body += struct.pack("!H", len(exts)) + exts
    hs = b"\x01" + len(body).to_bytes(3, "big") + body
    return b"\x16\x03\x01" + struct.pack("!H", len(hs)) + hs


def feed_all(sniffer: sniff.ClientHelloSniffer | sniff.HttpHostSniffer, data: bytes, step: int) -> sniff.Verdict:
    verdict: sniff.Verdict = sniff.NeedMore()
    for i in range(0, len(data), step):
        verdict = sniffer.feed(data[i : i + step])
        if not isinstance(verdict, sniff.NeedMore):
            break
    return verdict


@pytest.mark.parametrize("step", [1, 7, 100, 100_000])
def test_real_client_hello_sni_in_any_split(step: int) -> None:
    data = client_hello("API.Example.com")
    s = sniff.ClientHelloSniffer()
    assert feed_all(s, data, step) == sniff.ServerName("api.example.com")
    assert bytes(s.buffered) == data  # kept for replay upstream


def test_client_hello_split_across_tls_records() -> None:
    whole = client_hello("split.example")
    hs = whole[5:]
    records = b"".join(b"\x16\x03\x01" + struct.pack("!H", len(part)) + part
                       for part in (hs[:50], hs[50:51], hs[51:]))
    assert feed_all(sniff.ClientHelloSniffer(), records, 3) == sniff.ServerName("split.example")


def test_no_sni_and_ip_literal() -> None:
    v = sniff.ClientHelloSniffer().feed(client_hello(None))
    assert isinstance(v, sniff.NoServerName)
    # Python sends no SNI for an IP address; a hostile client may: it is flagged as a literal.
    v = sniff.ClientHelloSniffer().feed(crafted_hello([(0, b"192.0.2.10")]))
    assert v == sniff.ServerName("192.0.2.10", ip_literal=True)


@pytest.mark.parametrize(("names", "reason"), [
    ([(0, b"a.example"), (0, b"b.example")], "2 host names"),
    ([], "0 host names"),
    ([(0, b"bad name!")], "invalid server name"),
    ([(0, "ü.example".encode())], "non-ASCII"),
])
def test_crafted_bad_sni_is_not_recognised(names: list[tuple[int, bytes]], reason: str) -> None:
    v = sniff.ClientHelloSniffer().feed(crafted_hello(names))
    assert isinstance(v, sniff.NotRecognised) and reason in v.reason


def test_duplicate_extension_is_refused() -> None:
    entries = struct.pack("!BH", 0, 9) + b"a.example"
    sni = struct.pack("!H", len(entries)) + entries
    ext = struct.pack("!HH", 0, len(sni)) + sni
    v = sniff.ClientHelloSniffer().feed(crafted_hello([(0, b"b.example")], extra_ext=ext))
    assert isinstance(v, sniff.NotRecognised) and "duplicate" in v.reason


def test_an_extension_past_the_extensions_block_is_truncated() -> None:
    # The extensions block says 6 bytes: one empty extension and the first half of server_name's header.
    whole = crafted_hello([(0, b"a.example")], extra_ext=b"\x00\x17\x00\x00")
    body = bytearray(whole[9:])
    ext_len_at = 2 + 32 + 1 + 4 + 2
    body[ext_len_at : ext_len_at + 2] = struct.pack("!H", 6)
    v = sniff.ClientHelloSniffer().feed(whole[:9] + bytes(body))
    assert isinstance(v, sniff.NotRecognised) and "truncated" in v.reason


def test_not_tls_and_oversized() -> None:
    assert isinstance(sniff.ClientHelloSniffer().feed(b"GET / HTTP/1.1\r\n"), sniff.NotRecognised)
    assert isinstance(sniff.ClientHelloSniffer().feed(b"\x16\x02"), sniff.NotRecognised)
    huge = b"\x16\x03\x01\x40\x00\x01\xff\xff\xff"  # claims a 16 MiB ClientHello
    assert isinstance(sniff.ClientHelloSniffer().feed(huge), sniff.TooLarge)
    s = sniff.ClientHelloSniffer(limit=1000)
    v: sniff.Verdict = sniff.NeedMore()
    for _ in range(100):  # many small records that never finish the message
        v = s.feed(b"\x16\x03\x01\x00\x10" + b"\x01\x00\x40\x00" + b"\x00" * 12)
        if not isinstance(v, sniff.NeedMore):
            break
    assert isinstance(v, sniff.TooLarge | sniff.NotRecognised)


def test_verdict_is_sticky() -> None:
    s = sniff.ClientHelloSniffer()
    first = s.feed(client_hello("a.example"))
    assert s.feed(b"garbage") == first


@pytest.mark.parametrize(("raw", "expected"), [
    (b"GET / HTTP/1.1\r\nHost: Example.com\r\n\r\n", sniff.ServerName("example.com")),
    (b"GET / HTTP/1.1\r\nHost: example.com:80\r\n\r\n", sniff.ServerName("example.com")),
    (b"\r\nGET / HTTP/1.1\r\nhost:example.com\r\n\r\n", sniff.ServerName("example.com")),
    (b"GET http://example.com/x HTTP/1.1\r\nHost: example.com\r\n\r\n", sniff.ServerName("example.com")),
    (b"GET http://example.com/x HTTP/1.0\r\n\r\n", sniff.ServerName("example.com")),
    (b"GET / HTTP/1.1\r\nHost: 192.0.2.10\r\n\r\n", sniff.ServerName("192.0.2.10", ip_literal=True)),
    (b"GET / HTTP/1.1\r\nHost: [2001:db8::1]:80\r\n\r\n", sniff.ServerName("2001:db8::1", ip_literal=True)),
])
def test_http_host(raw: bytes, expected: sniff.Verdict) -> None:
    for step in (1, 5, len(raw)):
        assert feed_all(sniff.HttpHostSniffer(), raw, step) == expected


@pytest.mark.parametrize(("raw", "kind", "reason"), [
    (b"GET / HTTP/1.0\r\n\r\n", sniff.NoServerName, "no Host"),
    (b"GET / HTTP/1.1\r\n\r\n", sniff.NoServerName, "no Host"),
    # HTTP/1.1 must carry Host even with an absolute-form target (RFC 9112 §3.2; h11 holds to it).
    (b"GET http://a.example/ HTTP/1.1\r\n\r\n", sniff.NoServerName, "no Host"),
    (b"GET / HTTP/1.1\r\nHost: a.example\r\nHost: b.example\r\n\r\n", sniff.NotRecognised, "more than one"),
    (b"GET http://a.example/ HTTP/1.1\r\nHost: b.example\r\n\r\n", sniff.NotRecognised, "different servers"),
    (b"CONNECT a.example:443 HTTP/1.1\r\nHost: a.example\r\n\r\n", sniff.NotRecognised, "CONNECT"),
    (b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n", sniff.NotRecognised, "unsupported version"),
    (b"GET / HTTP/1.1\r\nHost: a.example\r\n folded\r\n\r\n", sniff.NotRecognised, "folding"),
    (b"GET / HTTP/1.1\r\nHost : a.example\r\n\r\n", sniff.NotRecognised, "malformed header"),
    (b"GET / HTTP/1.1\r\nHost: user@a.example\r\n\r\n", sniff.NotRecognised, "userinfo"),
    (b"\x16\x03\x01\x00\x05hello", sniff.NotRecognised, "not an HTTP"),
    (b"get / HTTP/1.1\r\n", sniff.NotRecognised, "not an HTTP"),
    (b"GET / HTTP/1.1\r\nHost: a.example\nX-Smuggle: 1\r\n\r\n", sniff.NotRecognised, "outside a CRLF"),
    (b"GET / HTTP/1.1\r\nHost: a.example\rX: 1\r\n\r\n", sniff.NotRecognised, "outside a CRLF"),
    (b"GET /\x7f HTTP/1.1\r\nHost: a.example\r\n\r\n", sniff.NotRecognised, "malformed request line"),
    (b"GET / HTTP/1.1\r\nHost: a.example\r\nBad\x01Name: 1\r\n\r\n", sniff.NotRecognised, "malformed header"),
    (b"GET / HTTP/1.1\r\nHost: a.example\r\nContent-Length: 1\r\nContent-Length: 2\r\n\r\n",
     sniff.NotRecognised, "bad Content-Length"),
])
def test_http_refusals(raw: bytes, kind: type, reason: str) -> None:
    v = sniff.HttpHostSniffer().feed(raw)
    assert isinstance(v, kind) and reason in v.reason, v  # type: ignore[attr-defined]


def test_refusal_reasons_never_quote_the_request() -> None:
    # h11's own messages quote the offending line; an audit reason carries no payload.
    for raw in (b"GET / HTTP/1.1\r\nHost: a.example\r\nAuthorization : Bearer s3cret\r\n\r\n",
                b"GET /s3cret  HTTP/1.1\r\nHost: a.example\r\n\r\n",
                b"GET / HTTP/1.1\r\nHost: a.example\r\nContent-Length: s3cret\r\n\r\n"):
        v = sniff.HttpHostSniffer().feed(raw)
        assert isinstance(v, sniff.NotRecognised) and "s3cret" not in v.reason, v


def test_http_head_cap() -> None:
    s = sniff.HttpHostSniffer(limit=1024)
    v = s.feed(b"GET / HTTP/1.1\r\n" + b"X-A: " + b"a" * 2000)
    assert v == sniff.TooLarge(1024)


@settings(max_examples=800, deadline=None)
@given(st.lists(st.binary(max_size=200), max_size=8))
def test_sniffers_never_raise(chunks: list[bytes]) -> None:
    tls, http = sniff.ClientHelloSniffer(limit=2048), sniff.HttpHostSniffer(limit=2048)
    for c in chunks:
        tls.feed(c)
        http.feed(c)


_HELLO = client_hello("m.example")


@settings(max_examples=500, deadline=None)
@given(st.integers(0, 400), st.binary(min_size=1, max_size=30))
def test_mutated_client_hello_never_raises(at: int, noise: bytes) -> None:
    data = bytearray(_HELLO)
    at = at % len(data)
    data[at : at + len(noise)] = noise
    sniff.ClientHelloSniffer().feed(bytes(data))


# --- request framing for brokered hosts -------------------------------------------------------


def events(data: bytes, step: int) -> list[sniff.FramerEvent]:
    f = sniff.RequestFramer()
    out: list[sniff.FramerEvent] = []
    for i in range(0, len(data), step):
        out += f.feed(data[i : i + step])
    return out


def _collapse(evs: list[sniff.FramerEvent]) -> list[object]:
    out: list[object] = []
    for e in evs:
        if isinstance(e, sniff.Body) and out and isinstance(out[-1], bytes):
            out[-1] += e.data
        elif isinstance(e, sniff.Body):
            out.append(e.data)
        elif isinstance(e, sniff.Head):
            out.append(("head", e.head.target))
        else:
            out.append(e)
    return out


@pytest.mark.parametrize("step", [1, 3, 1000])
def test_framer_splits_pipelined_requests(step: int) -> None:
    stream = (b"POST /a HTTP/1.1\r\nHost: h.example\r\nContent-Length: 5\r\n\r\nhello"
              b"POST /b HTTP/1.1\r\nHost: h.example\r\nTransfer-Encoding: chunked\r\n\r\n"
              b"3\r\nabc\r\n0\r\nX-T: 1\r\n\r\n"
              b"GET /c HTTP/1.1\r\nHost: h.example\r\n\r\n")
    assert _collapse(events(stream, step)) == [
        ("head", "/a"), b"hello", sniff.EndOfMessage(),
        ("head", "/b"), b"3\r\nabc\r\n0\r\nX-T: 1\r\n\r\n", sniff.EndOfMessage(),
        ("head", "/c"), sniff.EndOfMessage(),
    ]


@pytest.mark.parametrize("bad", [
    b"POST / HTTP/1.1\r\nHost: h\r\nContent-Length: 5\r\nTransfer-Encoding: chunked\r\n\r\n",
    b"POST / HTTP/1.1\r\nHost: h\r\nContent-Length: 5\r\nContent-Length: 6\r\n\r\n",
    b"POST / HTTP/1.1\r\nHost: h\r\nTransfer-Encoding: gzip\r\n\r\n",
    b"POST / HTTP/1.1\r\nHost: h\r\nTransfer-Encoding: chunked\r\n\r\nzz\r\n",
    b"POST / HTTP/1.1\r\nHost: h\r\nContent-Length: -1\r\n\r\n",
    b"POST / HTTP/1.1\r\nHost: h\r\nContent-Length: 5, 5\r\n\r\n",
    b"POST / HTTP/1.1\r\nHost: h\r\nTransfer-Encoding: chunked\r\nTransfer-Encoding: chunked\r\n\r\n",
    b"POST / HTTP/1.1\r\nHost: h\r\nContent-Length: 5\nTransfer-Encoding: chunked\r\n\r\n",
    b"POST / HTTP/1.1\r\nHost: h\r\nTransfer-Encoding:\r\n chunked\r\n\r\n",
])
def test_framer_refuses_smuggling_shapes(bad: bytes) -> None:
    evs = events(bad, 1000)
    assert isinstance(evs[-1], sniff.FramingError)
    if not bad.endswith(b"zz\r\n"):  # the body is what is wrong there, not the head
        assert len(evs) == 1, evs  # a head whose framing is refused is not passed on
    assert sniff.RequestFramer().feed(b"") == []


@pytest.mark.parametrize("head", [
    b"GET / HTTP/1.1\r\nX-A: 1\r\n\r\n",
    b"GET / HTTP/1.1\r\nHost: h.example\r\nHost: other.example\r\n\r\n",
])
def test_framer_flags_a_head_without_one_host_as_misdirected(head: bytes) -> None:
    # The proxy answers these 421, as it does a Host that differs from the TLS server name.
    evs = events(head + b"GET / HTTP/1.1\r\nHost: h.example\r\n\r\n", 1000)
    assert len(evs) == 1 and isinstance(evs[0], sniff.Misdirected), evs


def test_framer_goes_opaque_after_upgrade() -> None:
    evs = events(b"GET /ws HTTP/1.1\r\nHost: h\r\nConnection: Upgrade\r\nUpgrade: websocket\r\n\r\n\x81\x05hello", 1000)
    assert isinstance(evs[0], sniff.Head) and evs[1] == sniff.Opaque(b"\x81\x05hello")


def test_rewrite_head_replaces_guest_copies() -> None:
    head = sniff.parse_request_head(b"GET / HTTP/1.1\r\nHost: h.example\r\nauthorization: guest-guess\r\n"
                                    b"X-Keep: 1\r\n\r\n")
    out = sniff.rewrite_head(head, {"Authorization": "Bearer s3cret"})
    assert out == (b"GET / HTTP/1.1\r\nHost: h.example\r\nX-Keep: 1\r\nAuthorization: Bearer s3cret\r\n\r\n")


@settings(max_examples=1000, deadline=None)
@given(st.lists(st.binary(max_size=100), max_size=10))
def test_framer_never_raises(chunks: list[bytes]) -> None:
    f = sniff.RequestFramer()
    for c in chunks:
        f.feed(c)
