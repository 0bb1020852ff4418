"""DNS, sans-I/O: the gateway's responder and the proxy's upstream client.

How this works: a DNS message is a 12-byte header and four sections of
records; names are length-prefixed labels, possibly compressed with
pointers back into the message. :func:`parse_message` reads what both sides
need (questions and answer records) and raises only :class:`DnsFormatError`.
The names (compression pointers, label types, the 255-byte limit) and the
CNAME/NS targets are read by ``dnspython`` (``dns.name.from_wire``,
``dns.rdata.from_wire``: pointers must point backwards, so a loop cannot
form); the walk over the header and the two sections stays here, because a
whole-message parse would also apply what the gateway never asked for (EDNS
and TSIG rules, UPDATE semantics for opcode 5, merging records into sets)
and change the answer to odd queries. Labels must be ASCII without dots,
and a record count above :data:`MAX_RECORDS` is refused before any parse.

:class:`Responder` is the guest-facing side. It answers

* ``A`` for an allowed name with **one synthetic address** — the gateway's
  own guest-facing address. The proxy never uses the address a guest dials
  (it dials the allowed *name* itself), so a real address would only cost an
  upstream lookup per query and give the guest a DNS channel to the outside
  (queries for ``<data>.allowed-wildcard.example`` would reach that domain's
  servers). With a synthetic answer no guest query ever leaves the gateway.
* ``NOERROR`` with no records for any other type of an allowed name
  (``AAAA``: the guest has no IPv6; ``HTTPS``/``SVCB``: no ECH configs).
* ``NXDOMAIN`` for a name that is not allowed (fails fast and definitively in
  every stub resolver; a ``REFUSED`` makes glibc try the next server and
  report a temporary failure).
* ``REFUSED`` for other classes and multi-question messages, ``NOTIMP`` for
  other opcodes, ``FORMERR`` for garbage with a readable header, and nothing
  at all for bytes that are not even a query header.

:func:`build_query` / :func:`parse_answer` are the client side used by the
proxy's resolver (``resolver.py``): A and AAAA answers, following the CNAME
chain from the question's name.
"""

from __future__ import annotations

import ipaddress
import struct
from collections.abc import Callable
from dataclasses import dataclass, field

import dns.exception
import dns.name
import dns.rdata
import dns.rdataclass
import dns.rdatatype

from netgate.policy import IPAddress, normalize_name

TYPE_A = 1
TYPE_NS = 2
TYPE_CNAME = 5
TYPE_SOA = 6
TYPE_AAAA = 28
TYPE_OPT = 41
TYPE_HTTPS = 65
CLASS_IN = 1

RCODE_NOERROR = 0
RCODE_FORMERR = 1
RCODE_SERVFAIL = 2
RCODE_NXDOMAIN = 3
RCODE_NOTIMP = 4
RCODE_REFUSED = 5

MAX_MESSAGE = 65535
MAX_UDP_REPLY = 512
MAX_RECORDS = 200

TYPE_NAMES = {TYPE_A: "A", TYPE_NS: "NS", TYPE_CNAME: "CNAME", TYPE_SOA: "SOA", 12: "PTR", 15: "MX",
              16: "TXT", TYPE_AAAA: "AAAA", 33: "SRV", TYPE_HTTPS: "HTTPS", 64: "SVCB", 255: "ANY"}


def type_name(qtype: int) -> str:
    return TYPE_NAMES.get(qtype, f"TYPE{qtype}")


class DnsFormatError(ValueError):
    """The bytes are not a DNS message we can read."""


class DnsError(Exception):
    """An upstream answer is unusable (wrong id, error rcode, malformed)."""


@dataclass(frozen=True, slots=True)
class Question:
    name: str  #: as received (case preserved: 0x20 randomisation must round-trip), no trailing dot
    qtype: int
    qclass: int


@dataclass(frozen=True, slots=True)
class Record:
    name: str
    rtype: int
    rclass: int
    ttl: int
    rdata: bytes
    #: for CNAME/NS records: the target name (decompressed against the message)
    target: str | None = None


@dataclass(frozen=True, slots=True)
class Message:
    id: int
    flags: int
    questions: tuple[Question, ...]
    answers: tuple[Record, ...]

    @property
    def is_response(self) -> bool:
        return bool(self.flags & 0x8000)

    @property
    def opcode(self) -> int:
        return (self.flags >> 11) & 0xF

    @property
    def rcode(self) -> int:
        return self.flags & 0xF


def _text(name: dns.name.Name) -> str:
    """The name as dotted text, case preserved, no trailing dot (ASCII labels without dots only)."""
    labels = []
    for raw in name.labels:
        if not raw:
            continue  # the root label
        try:
            label = raw.decode("ascii")
        except UnicodeDecodeError:
            raise DnsFormatError("non-ASCII label") from None
        if "." in label:
            raise DnsFormatError("label contains a dot")
        labels.append(label)
    return ".".join(labels)


def _read_name(data: bytes, off: int) -> tuple[str, int]:
    """Read a (possibly compressed) name at ``off``; return it and the offset after it."""
    try:
        name, used = dns.name.from_wire(data, off)
    except dns.exception.DNSException as exc:
        raise DnsFormatError(f"bad name at offset {off}: {exc}") from None
    return _text(name), off + used


def _read_target(data: bytes, rtype: int, rclass: int, off: int, rdlen: int) -> str:
    """The target name of a CNAME or NS record's data."""
    try:
        rdata = dns.rdata.from_wire(dns.rdataclass.RdataClass.make(rclass),
                                    dns.rdatatype.RdataType.make(rtype), data, off, rdlen)
    except dns.exception.DNSException as exc:
        raise DnsFormatError(f"bad {type_name(rtype)} record data: {exc}") from None
    target = getattr(rdata, "target", None)
    if not isinstance(target, dns.name.Name):  # pragma: no cover - dnspython's CNAME/NS carry one
        raise DnsFormatError(f"{type_name(rtype)} record without a target")
    return _text(target)


def _encode_name(name: str) -> bytes:
    out = bytearray()
    for label in name.rstrip(".").split(".") if name.strip(".") else []:
        raw = label.encode("ascii")
        if not 0 < len(raw) < 64:
            raise ValueError(f"bad label in {name!r}")
        out += bytes([len(raw)]) + raw
    out += b"\x00"
    if len(out) > 255:
        raise ValueError(f"name too long: {name!r}")
    return bytes(out)


def parse_message(data: bytes) -> Message:
    """Parse the header, questions and answer section; raise :class:`DnsFormatError`."""
    if len(data) < 12:
        raise DnsFormatError("shorter than a DNS header")
    if len(data) > MAX_MESSAGE:
        raise DnsFormatError("longer than a DNS message")
    qid, flags, qd, an, _ns, _ar = struct.unpack_from("!6H", data)
    if qd > MAX_RECORDS or an > MAX_RECORDS:
        raise DnsFormatError("too many records")
    off = 12
    questions: list[Question] = []
    for _ in range(qd):
        name, off = _read_name(data, off)
        if off + 4 > len(data):
            raise DnsFormatError("truncated question")
        qtype, qclass = struct.unpack_from("!2H", data, off)
        off += 4
        questions.append(Question(name, qtype, qclass))
    answers: list[Record] = []
    for _ in range(an):
        name, off = _read_name(data, off)
        if off + 10 > len(data):
            raise DnsFormatError("truncated record")
        rtype, rclass, ttl, rdlen = struct.unpack_from("!2HIH", data, off)
        off += 10
        if off + rdlen > len(data):
            raise DnsFormatError("record data runs past the message")
        rdata = data[off : off + rdlen]
        target = None
        if rtype in (TYPE_CNAME, TYPE_NS):
            target = _read_target(data, rtype, rclass, off, rdlen)
        off += rdlen
        answers.append(Record(name, rtype, rclass, ttl, rdata, target))
    return Message(qid, flags, tuple(questions), tuple(answers))


# --- the guest-facing responder ------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class DnsDecision:
    """What the responder did with one query (for the audit log)."""

    name: str
    qtype: str
    allowed: bool
    rcode: int
    reason: str


@dataclass(frozen=True, slots=True)
class Reply:
    data: bytes | None  #: None: send nothing
    decision: DnsDecision | None


def _response(qid: int, query_flags: int, rcode: int, question: Question | None,
              answers: list[tuple[int, int, bytes]] | None = None) -> bytes:
    # QR, opcode copied, AA, RD copied, RA (stub resolvers want it), rcode.
    flags = 0x8000 | (query_flags & 0x7800) | 0x0400 | (query_flags & 0x0100) | 0x0080 | rcode
    answers = answers or []
    out = bytearray(struct.pack("!6H", qid, flags, 1 if question else 0, len(answers), 0, 0))
    if question is not None:
        out += _encode_name(question.name) + struct.pack("!2H", question.qtype, question.qclass)
        for rtype, ttl, rdata in answers:
            # 0xC00C: a pointer to the question's name at offset 12.
            out += struct.pack("!H2HIH", 0xC00C, rtype, CLASS_IN, ttl, len(rdata)) + rdata
    return bytes(out)


@dataclass(slots=True)
class Responder:
    """Answers guest queries from a policy; :meth:`handle` never raises."""

    allowed: Callable[[str], bool]
    answer: ipaddress.IPv4Address
    ttl: int = 30

    def handle(self, data: bytes) -> Reply:
        try:
            return self._handle(data)
        except Exception:  # the contract is "never raises": a bug must not kill the server
            return Reply(None, None)

    def _handle(self, data: bytes) -> Reply:
        if len(data) < 12:
            return Reply(None, None)
        qid, qflags = struct.unpack_from("!2H", data)
        if qflags & 0x8000:  # a response: never answer those (reflection loops)
            return Reply(None, None)
        try:
            msg = parse_message(data)
        except DnsFormatError as exc:
            return Reply(_response(qid, qflags, RCODE_FORMERR, None),
                         DnsDecision("", "", False, RCODE_FORMERR, f"malformed query: {exc}"))
        if msg.opcode != 0:
            return Reply(_response(qid, qflags, RCODE_NOTIMP, None),
                         DnsDecision("", "", False, RCODE_NOTIMP, f"opcode {msg.opcode}"))
        if len(msg.questions) != 1:
            return Reply(_response(qid, qflags, RCODE_FORMERR, None),
                         DnsDecision("", "", False, RCODE_FORMERR, f"{len(msg.questions)} questions"))
        q = msg.questions[0]
        tname = type_name(q.qtype)
        if q.qclass != CLASS_IN:
            return Reply(_response(qid, qflags, RCODE_REFUSED, q),
                         DnsDecision(q.name, tname, False, RCODE_REFUSED, f"class {q.qclass}"))
        norm = normalize_name(q.name)
        if norm is None or not self.allowed(norm):
            why = "not a valid host name" if norm is None else "not on the allowlist"
            return Reply(_response(qid, qflags, RCODE_NXDOMAIN, q),
                         DnsDecision(norm or q.name, tname, False, RCODE_NXDOMAIN, why))
        if q.qtype == TYPE_A:
            return Reply(_response(qid, qflags, RCODE_NOERROR, q, [(TYPE_A, self.ttl, self.answer.packed)]),
                         DnsDecision(norm, tname, True, RCODE_NOERROR, "allowed"))
        return Reply(_response(qid, qflags, RCODE_NOERROR, q),
                     DnsDecision(norm, tname, True, RCODE_NOERROR, "allowed name, no records of this type"))


@dataclass(slots=True)
class TcpFramer:
    """Splits a DNS-over-TCP byte stream into messages (2-byte length prefixes)."""

    _buf: bytearray = field(default_factory=bytearray)

    def feed(self, data: bytes) -> list[bytes]:
        self._buf += data
        out: list[bytes] = []
        while len(self._buf) >= 2:
            (length,) = struct.unpack_from("!H", self._buf)
            if len(self._buf) < 2 + length:
                break
            out.append(bytes(self._buf[2 : 2 + length]))
            del self._buf[: 2 + length]
        return out

    @staticmethod
    def frame(message: bytes) -> bytes:
        return struct.pack("!H", len(message)) + message


# --- the upstream client --------------------------------------------------------------------


def build_query(qid: int, name: str, qtype: int) -> bytes:
    """A recursive query for ``name``/``qtype`` (RD set)."""
    return struct.pack("!6H", qid & 0xFFFF, 0x0100, 1, 0, 0, 0) + _encode_name(name) + struct.pack(
        "!2H", qtype, CLASS_IN)


@dataclass(frozen=True, slots=True)
class Answer:
    rcode: int
    addresses: tuple[IPAddress, ...]
    ttl: int
    truncated: bool


def parse_answer(data: bytes, qid: int, name: str, qtype: int) -> Answer:
    """Read an upstream reply to :func:`build_query`; raise :class:`DnsError` if it is not one.

    Follows the CNAME chain from ``name`` and returns only addresses owned by a
    name on that chain (records for unrelated names are ignored, never trusted).
    """
    try:
        msg = parse_message(data)
    except DnsFormatError as exc:
        raise DnsError(f"malformed reply: {exc}") from exc
    if not msg.is_response or msg.id != qid:
        raise DnsError("reply does not match the query")
    if len(msg.questions) != 1 or msg.questions[0].name.lower() != name.lower() \
            or msg.questions[0].qtype != qtype:
        raise DnsError("reply is for another question")
    truncated = bool(msg.flags & 0x0200)
    if msg.rcode not in (RCODE_NOERROR, RCODE_NXDOMAIN):
        raise DnsError(f"upstream rcode {msg.rcode}")
    chain = {name.lower()}
    for _ in range(16):  # CNAME chains are short; a loop cannot grow this set past 16 steps
        grown = {r.target.lower() for r in msg.answers
                 if r.rtype == TYPE_CNAME and r.target and r.name.lower() in chain} - chain
        if not grown:
            break
        chain |= grown
    addrs: list[IPAddress] = []
    ttls: list[int] = []
    for r in msg.answers:
        if r.name.lower() not in chain or r.rclass != CLASS_IN or r.rtype != qtype:
            continue
        if r.rtype == TYPE_A and len(r.rdata) == 4:
            addrs.append(ipaddress.IPv4Address(r.rdata))
        elif r.rtype == TYPE_AAAA and len(r.rdata) == 16:
            addrs.append(ipaddress.IPv6Address(r.rdata))
        else:
            continue
        ttls.append(r.ttl)
    return Answer(msg.rcode, tuple(addrs), min(ttls) if ttls else 0, truncated)


def build_reply(query: bytes, records: list[tuple[int, int, bytes]], rcode: int = RCODE_NOERROR) -> bytes:
    """A reply to ``query`` with the given (type, ttl, rdata) records for its question.

    For fake upstream servers in tests and benchmarks; raises DnsFormatError on a bad query.
    """
    msg = parse_message(query)
    if len(msg.questions) != 1:
        raise DnsFormatError("one question expected")
    flags = struct.unpack_from("!H", query, 2)[0]
    return _response(msg.id, flags, rcode, msg.questions[0], records)
