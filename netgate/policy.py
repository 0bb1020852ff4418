"""The egress policy: which names a rig may reach, and which addresses are never dialled.

Pure data and functions, no I/O (the default lists are package data read
once). How it works:

* A **pattern** is a lowercase DNS name (``example.com``) or a wildcard
  (``*.example.com``). ``*.example.com`` matches every name *below*
  ``example.com`` at any depth (``a.example.com``, ``a.b.example.com``) but
  **not** ``example.com`` itself — list both when both are meant. This is the
  narrower reading: an allowlist entry never grants more than it says.
* An **address** is refused (even for an allowed name) when it falls in a
  range the host must never be tricked into dialling: loopback, private,
  link-local (cloud metadata lives there), CGNAT, multicast, reserved,
  unspecified, benchmarking, the IPv6 equivalents, and the IPv4 address
  embedded in IPv4-mapped / 6to4 / NAT64 / Teredo IPv6 addresses. This is
  the DNS-rebinding guard: an allowed name that resolves to ``10.0.0.5``
  or ``169.254.169.254`` is refused. An operator's :class:`HostService`
  rule is the only way to allow one (for names it matches, to networks it
  names). Callers of ``rig.open`` cannot create such rules.
* The documentation ranges (192.0.2.0/24, 198.51.100.0/24, 203.0.113.0/24,
  2001:db8::/32) are *not* refused: they never route on the internet, so a
  host that reaches them has configured them on purpose — the test suite's
  fake internet lives there (HOST-NOTES).
"""

from __future__ import annotations

import ipaddress
import re
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from enum import StrEnum
from importlib import resources

from netgate.errors import InvalidField

IPAddress = ipaddress.IPv4Address | ipaddress.IPv6Address
IPNetwork = ipaddress.IPv4Network | ipaddress.IPv6Network

MAX_NAME = 253
_LABEL = re.compile(r"^[a-z0-9_](?:[a-z0-9_-]{0,61}[a-z0-9_])?$")


def _nets(*cidrs: str) -> tuple[IPNetwork, ...]:
    return tuple(ipaddress.ip_network(c) for c in cidrs)


#: (network, why) — the reason is what the audit log says.
REFUSED_RANGES: tuple[tuple[IPNetwork, str], ...] = tuple(
    (net, why)
    for why, nets in (
        ("unspecified", _nets("0.0.0.0/8", "::/128")),
        ("loopback", _nets("127.0.0.0/8", "::1/128")),
        ("private", _nets("10.0.0.0/8", "172.16.0.0/12", "192.168.0.0/16", "fc00::/7")),
        ("link-local / cloud metadata", _nets("169.254.0.0/16", "fe80::/10")),
        ("CGNAT", _nets("100.64.0.0/10")),
        ("cloud metadata", _nets("168.63.129.16/32", "fd00:ec2::254/128")),
        ("IETF protocol assignments", _nets("192.0.0.0/24", "2001::/23")),
        ("benchmarking", _nets("198.18.0.0/15", "2001:2::/48")),
        ("multicast", _nets("224.0.0.0/4", "ff00::/8")),
        ("reserved", _nets("240.0.0.0/4", "255.255.255.255/32", "fec0::/10", "100::/64", "::/96")),
        ("NAT64 local use", _nets("64:ff9b:1::/48")),
    )
    for net in nets
)


@dataclass(frozen=True, slots=True)
class HostService:
    """An operator's exception: names matching ``pattern`` may resolve into ``network``."""

    pattern: str
    network: IPNetwork


def _embedded_v4(addr: ipaddress.IPv6Address) -> ipaddress.IPv4Address | None:
    if addr.ipv4_mapped is not None:
        return addr.ipv4_mapped
    if addr.sixtofour is not None:
        return addr.sixtofour
    if addr.teredo is not None:
        return addr.teredo[1]
    if addr in _NAT64:
        return ipaddress.IPv4Address(int(addr) & 0xFFFFFFFF)
    return None


_NAT64 = ipaddress.ip_network("64:ff9b::/96")


def refusal_reason(addr: IPAddress) -> str | None:
    """Why ``addr`` must never be dialled, or None when it may be."""
    if isinstance(addr, ipaddress.IPv6Address):
        inner = _embedded_v4(addr)
        if inner is not None:
            why = refusal_reason(inner)
            return None if why is None else f"{why} (embedded in {addr})"
    for net, why in REFUSED_RANGES:
        if addr.version == net.version and addr in net:
            return why
    return None


def is_ip_literal(name: str) -> bool:
    try:
        ipaddress.ip_address(name.strip("[]"))
    except ValueError:
        return False
    return True


def normalize_name(name: str) -> str | None:
    """A host name in canonical form (lowercase, no trailing dot, IDNA), or None if invalid.

    IP literals are not names and return None.
    """
    if not name or len(name) > MAX_NAME + 1:
        return None
    name = name.lower()
    if name.endswith("."):
        name = name[:-1]
    if not name.isascii():
        try:
            name = name.encode("idna").decode("ascii")
        except UnicodeError:
            return None
    if len(name) > MAX_NAME or is_ip_literal(name):
        return None
    labels = name.split(".")
    if not all(_LABEL.match(label) for label in labels):
        return None
    # An all-numeric last label is how IPv4 shorthands like "127.1" look.
    if labels[-1].isdigit():
        return None
    return name


def validate_pattern(raw: object, field: str) -> str:
    """Check one allowlist entry; raise an InvalidField naming ``field`` when it is unusable."""
    if not isinstance(raw, str):
        raise InvalidField(field, "must be a host name such as 'example.com' or '*.example.com'")
    text = raw.strip()
    if text in ("*", "*."):
        raise InvalidField(field, f"{raw!r} is too broad: name the hosts "
                                "('*.example.com' for a domain's subdomains)")
    wildcard = text.startswith("*.")
    body = text[2:] if wildcard else text
    if is_ip_literal(body):
        raise InvalidField(field, f"{raw!r} is an IP address; egress is allowed by host name only")
    if "*" in body:
        raise InvalidField(field, f"{raw!r}: '*' is allowed only as the whole first label ('*.example.com')")
    if "/" in body or ":" in body:
        raise InvalidField(field, f"{raw!r}: give a bare host name, without scheme, port or path")
    name = normalize_name(body)
    if name is None:
        raise InvalidField(field, f"{raw!r} is not a valid host name")
    if wildcard and "." not in name:
        raise InvalidField(field, f"{raw!r} is too broad: a wildcard needs at least two labels after '*.'")
    return f"*.{name}" if wildcard else name


def pattern_matches(pattern: str, name: str) -> bool:
    """Whether a normalized ``name`` is covered by a validated ``pattern``."""
    if pattern.startswith("*."):
        return name.endswith(pattern[1:])
    return name == pattern


class Surface(StrEnum):
    terminal = "terminal"
    browser = "browser"
    computer = "computer"


def load_default_list(list_name: str) -> tuple[str, ...]:
    """One of the maintained lists in ``netgate/defaults/`` (``#`` comments, one pattern a line)."""
    text = resources.files("netgate").joinpath("defaults", f"{list_name}.txt").read_text()
    out: list[str] = []
    for lineno, line in enumerate(text.splitlines(), 1):
        entry = line.split("#", 1)[0].strip()
        if entry:
            out.append(validate_pattern(entry, f"netgate/defaults/{list_name}.txt:{lineno}"))
    return tuple(out)


@dataclass(frozen=True, slots=True)
class Policy:
    """A rig's allowlist (validated patterns) and the operator's host-service exceptions."""

    allow: tuple[str, ...] = ()
    services: tuple[HostService, ...] = ()

    def allows(self, name: str) -> bool:
        norm = normalize_name(name)
        return norm is not None and any(pattern_matches(p, norm) for p in self.allow)

    def check_name(self, name: str) -> str | None:
        """None when ``name`` may be reached, else the reason it may not."""
        if is_ip_literal(name):
            return "direct IP address (names only)"
        norm = normalize_name(name)
        if norm is None:
            return "not a valid host name"
        if not any(pattern_matches(p, norm) for p in self.allow):
            return "not on the allowlist"
        return None

    def check_address(self, name: str, addr: IPAddress) -> str | None:
        """None when ``name`` may be dialled at ``addr``, else why not."""
        why = refusal_reason(addr)
        if why is None:
            return None
        norm = normalize_name(name) or ""
        for svc in self.services:
            if (pattern_matches(svc.pattern, norm) and addr.version == svc.network.version
                    and addr in svc.network):
                return None
        return f"{name} resolves to {addr}: {why}"


def parse_allow(raw: object, field: str = "egress.allow") -> tuple[str, ...]:
    """Validate a caller's list of patterns; errors name ``egress.allow[i]``."""
    if not isinstance(raw, list | tuple):
        raise InvalidField(field, "must be a list of host names")
    if len(raw) > 512:
        raise InvalidField(field, "at most 512 entries")
    return tuple(validate_pattern(item, f"{field}[{i}]") for i, item in enumerate(raw))


def _dedupe(items: Iterable[str]) -> tuple[str, ...]:
    return tuple(dict.fromkeys(items))


def build_policy(
    surface: str,
    allow: object = (),
    *,
    defaults: bool = True,
    image_registry: Sequence[str] = (),
    extra_defaults: Sequence[str] = (),
    first_boot: bool = False,
    services: Sequence[HostService] = (),
) -> Policy:
    """The policy for a new rig (``rig.open``'s ``egress``) or a live change (``rig.egress``).

    ``allow`` is the caller's list (validated, errors name ``egress.allow[i]``);
    with ``defaults`` it is added to the surface's maintained list plus
    ``extra_defaults`` (the server's additions, e.g. the worktree's code host
    or the product site); ``image_registry`` hosts are always added (pulls);
    ``first_boot`` adds the Debian archives to a browser rig while its engine
    installs its packages.
    """
    caller = parse_allow(list(allow) if isinstance(allow, tuple) else allow)
    base: list[str] = []
    if defaults:
        try:
            kind = Surface(surface)
        except ValueError:
            raise InvalidField("surface", f"no egress defaults for surface {surface!r}") from None
        base.extend(load_default_list(kind.value))
        if kind is Surface.browser and first_boot:
            base.extend(load_default_list("debian-archives"))
        base.extend(validate_pattern(p, "extra_defaults") for p in extra_defaults)
    base.extend(validate_pattern(p, "image_registry") for p in image_registry)
    return Policy(_dedupe([*base, *caller]), tuple(services))
