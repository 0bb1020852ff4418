"""The gateway's DNS, sans-I/O: the responder's answers, the upstream client's parsing, garbage."""

from __future__ import annotations

import contextlib
import ipaddress
import struct

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from netgate import dns

GW = ipaddress.IPv4Address("10.213.0.1")


def responder() -> dns.Responder:
    allowed = {"allowed.example", "a.b.example"}
    return dns.Responder(lambda name: name in allowed, GW)


def query(name: str, qtype: int = dns.TYPE_A, qid: int = 0x1234, qclass: int = dns.CLASS_IN,
          flags: int = 0x0100) -> bytes:
    return struct.pack("!6H", qid, flags, 1, 0, 0, 0) + dns._encode_name(name) + struct.pack("!2H", qtype, qclass)


def test_allowed_a_query_gets_the_gateway_address() -> None:
    reply = responder().handle(query("Allowed.Example"))
    assert reply.data is not None and reply.decision is not None
    msg = dns.parse_message(reply.data)
    assert msg.id == 0x1234 and msg.is_response and msg.rcode == dns.RCODE_NOERROR
    assert msg.questions[0].name == "Allowed.Example"  # case preserved (0x20 randomisation)
    assert [ipaddress.IPv4Address(r.rdata) for r in msg.answers] == [GW]
    assert reply.decision.allowed and reply.decision.name == "allowed.example"
    # The client side reads it back.
    ans = dns.parse_answer(reply.data, 0x1234, "allowed.example", dns.TYPE_A)
    assert ans.addresses == (GW,)


@pytest.mark.parametrize("qtype", [dns.TYPE_AAAA, dns.TYPE_HTTPS, 16, 255])
def test_other_types_of_allowed_names_get_no_data(qtype: int) -> None:
    reply = responder().handle(query("allowed.example", qtype))
    assert reply.data is not None
    msg = dns.parse_message(reply.data)
    assert msg.rcode == dns.RCODE_NOERROR and msg.answers == ()


def test_denied_name_is_nxdomain() -> None:
    reply = responder().handle(query("denied.example"))
    assert reply.data is not None and reply.decision is not None
    assert dns.parse_message(reply.data).rcode == dns.RCODE_NXDOMAIN
    assert not reply.decision.allowed and reply.decision.reason == "not on the allowlist"


def test_other_class_opcode_and_counts() -> None:
    r = responder()
    chaos = r.handle(query("allowed.example", qclass=3))
    assert chaos.data is not None and dns.parse_message(chaos.data).rcode == dns.RCODE_REFUSED
    notify = r.handle(query("allowed.example", flags=4 << 11))
    assert notify.data is not None and dns.parse_message(notify.data).rcode == dns.RCODE_NOTIMP
    two = struct.pack("!6H", 7, 0x0100, 2, 0, 0, 0) + (dns._encode_name("a.b.example") + b"\x00\x01\x00\x01") * 2
    bad = r.handle(two)
    assert bad.data is not None and dns.parse_message(bad.data).rcode == dns.RCODE_FORMERR


def test_responses_and_runts_get_no_answer() -> None:
    r = responder()
    assert r.handle(b"").data is None
    assert r.handle(b"\x00" * 11).data is None
    assert r.handle(query("allowed.example", flags=0x8100)).data is None  # a response: no reflection


def test_garbage_with_a_header_is_formerr() -> None:
    reply = responder().handle(struct.pack("!6H", 9, 0x0100, 1, 0, 0, 0) + b"\x05ab")
    assert reply.data is not None and dns.parse_message(reply.data).rcode == dns.RCODE_FORMERR


def test_compression_loop_is_an_error_not_a_hang() -> None:
    data = struct.pack("!6H", 1, 0x0100, 1, 0, 0, 0) + b"\xc0\x0c" + b"\x00\x01\x00\x01"
    with pytest.raises(dns.DnsFormatError):
        dns.parse_message(data)
    assert responder().handle(data).data is not None  # FORMERR, no hang


@pytest.mark.parametrize(("qname", "why"), [
    (b"\x03abc\xc0\x20", "points forward"),  # a pointer past the name itself
    (b"\x02\xc3\xbc\x07example\x00", "non-ASCII"),
    (b"\x03a.b\x07example\x00", "dot"),
    (b"\x3f" + b"a" * 63 + b"\x3f" + b"b" * 63 + b"\x3f" + b"c" * 63 + b"\x3f" + b"d" * 63 + b"\x00", "255"),
])
def test_unreadable_question_names_are_formerr(qname: bytes, why: str) -> None:
    data = struct.pack("!6H", 3, 0x0100, 1, 0, 0, 0) + qname + b"\x00\x01\x00\x01" + b"\x00" * 40
    with pytest.raises(dns.DnsFormatError, match=why):
        dns.parse_message(data)
    reply = responder().handle(data)
    assert reply.data is not None and dns.parse_message(reply.data).rcode == dns.RCODE_FORMERR


def _rr(name: bytes, rtype: int, rdata: bytes, ttl: int = 60) -> bytes:
    return name + struct.pack("!2HIH", rtype, dns.CLASS_IN, ttl, len(rdata)) + rdata


def test_upstream_answer_follows_cnames_and_ignores_strays() -> None:
    q = dns.build_query(77, "www.example.com", dns.TYPE_A)
    cname_target = dns._encode_name("cdn.example.net")
    body = (_rr(b"\xc0\x0c", dns.TYPE_CNAME, cname_target, 300)
            + _rr(dns._encode_name("cdn.example.net"), dns.TYPE_A, bytes([93, 184, 216, 34]), 30)
            + _rr(dns._encode_name("unrelated.example"), dns.TYPE_A, bytes([10, 0, 0, 1])))
    reply = struct.pack("!6H", 77, 0x8180, 1, 3, 0, 0) + q[12:] + body
    ans = dns.parse_answer(reply, 77, "www.example.com", dns.TYPE_A)
    assert ans.addresses == (ipaddress.IPv4Address("93.184.216.34"),)  # the stray 10.0.0.1 is ignored
    assert ans.ttl == 30


def test_upstream_cname_must_fill_its_record_data() -> None:
    q = dns.build_query(78, "www.example.com", dns.TYPE_A)
    target = dns._encode_name("cdn.example.net")
    reply = struct.pack("!6H", 78, 0x8180, 1, 1, 0, 0) + q[12:] + _rr(b"\xc0\x0c", dns.TYPE_CNAME, target + b"xx")
    with pytest.raises(dns.DnsError, match="CNAME"):
        dns.parse_answer(reply, 78, "www.example.com", dns.TYPE_A)


def test_upstream_answer_must_match_the_query() -> None:
    reply = dns.build_reply(dns.build_query(5, "a.example", dns.TYPE_A), [(dns.TYPE_A, 60, bytes(4))])
    with pytest.raises(dns.DnsError):
        dns.parse_answer(reply, 6, "a.example", dns.TYPE_A)
    with pytest.raises(dns.DnsError):
        dns.parse_answer(reply, 5, "b.example", dns.TYPE_A)
    servfail = dns.build_reply(dns.build_query(5, "a.example", dns.TYPE_A), [], dns.RCODE_SERVFAIL)
    with pytest.raises(dns.DnsError):
        dns.parse_answer(servfail, 5, "a.example", dns.TYPE_A)
    aaaa = dns.build_reply(dns.build_query(5, "a.example", dns.TYPE_AAAA),
                           [(dns.TYPE_AAAA, 60, ipaddress.IPv6Address("::1").packed)])
    assert dns.parse_answer(aaaa, 5, "a.example", dns.TYPE_AAAA).addresses == (ipaddress.IPv6Address("::1"),)


def test_tcp_framer_reassembles_split_messages() -> None:
    m1, m2 = query("allowed.example"), query("denied.example", qid=2)
    stream = dns.TcpFramer.frame(m1) + dns.TcpFramer.frame(m2)
    framer = dns.TcpFramer()
    out: list[bytes] = []
    for i in range(len(stream)):
        out += framer.feed(stream[i : i + 1])
    assert out == [m1, m2]


@settings(max_examples=2000, deadline=None)
@given(st.binary(max_size=600))
def test_responder_never_raises(data: bytes) -> None:
    reply = responder().handle(data)
    if reply.data is not None:
        dns.parse_message(reply.data)  # whatever we send is a well-formed message


@settings(max_examples=1000, deadline=None)
@given(st.binary(min_size=12, max_size=300), st.integers(0, 12), st.binary(max_size=40))
def test_responder_never_raises_on_mutated_queries(tail: bytes, cut: int, noise: bytes) -> None:
    base = query("allowed.example")
    data = base[: 12 + cut] + noise + tail
    responder().handle(data)


@settings(max_examples=1000, deadline=None)
@given(st.binary(max_size=600))
def test_client_parser_raises_only_dns_error(data: bytes) -> None:
    with contextlib.suppress(dns.DnsError):
        dns.parse_answer(data, 1, "a.example", dns.TYPE_A)
