"""Egress policy: patterns, validation, refused address ranges, defaults per surface."""

from __future__ import annotations

import ipaddress

import pytest

from netgate.errors import InvalidField
from netgate.policy import (
    HostService,
    Policy,
    build_policy,
    load_default_list,
    parse_allow,
    pattern_matches,
    refusal_reason,
    validate_pattern,
)


@pytest.mark.parametrize(("pattern", "name", "expected"), [
    ("example.com", "example.com", True),
    ("example.com", "www.example.com", False),
    ("*.example.com", "www.example.com", True),
    ("*.example.com", "a.b.example.com", True),
    ("*.example.com", "example.com", False),  # the apex is not covered by its wildcard
    ("*.example.com", "badexample.com", False),
    ("*.example.com", "example.com.evil.net", False),
    ("example.com", "example.co", False),
])
def test_pattern_matching(pattern: str, name: str, expected: bool) -> None:
    assert pattern_matches(pattern, name) is expected


def test_policy_normalizes_names_before_matching() -> None:
    p = Policy(("example.com", "*.pkg.dev"))
    assert p.allows("EXAMPLE.com.")
    assert p.allows("a.b.pkg.dev")
    assert not p.allows("pkg.dev")
    assert p.check_name("93.184.216.34") == "direct IP address (names only)"
    assert p.check_name("other.org") == "not on the allowlist"
    assert p.check_name("bad name") == "not a valid host name"


@pytest.mark.parametrize(("raw", "expected"), [
    ("Example.COM", "example.com"),
    ("example.com.", "example.com"),
    (" *.Example.com ", "*.example.com"),
    ("bücher.example", "xn--bcher-kva.example"),
    ("_acme.example.com", "_acme.example.com"),
])
def test_valid_patterns_are_normalized(raw: str, expected: str) -> None:
    assert validate_pattern(raw, "f") == expected


@pytest.mark.parametrize(("raw", "why"), [
    ("10.0.0.1", "IP address"),
    ("[::1]", "IP address"),
    ("*", "too broad"),
    ("*.com", "too broad"),
    ("a.*.example.com", "whole first label"),
    ("ex*ample.com", "whole first label"),
    ("https://example.com", "without scheme"),
    ("example.com:443", "without scheme"),
    ("exa mple.com", "not a valid host name"),
    ("-bad.example.com", "not a valid host name"),
    ("a" * 64 + ".com", "not a valid host name"),
    ("", "not a valid host name"),
    ("127.1", "not a valid host name"),
])
def test_invalid_patterns_are_refused(raw: str, why: str) -> None:
    with pytest.raises(InvalidField) as info:
        validate_pattern(raw, "egress.allow[3]")
    assert info.value.field == "egress.allow[3]"
    assert why in info.value.reason


def test_parse_allow_names_the_index() -> None:
    with pytest.raises(InvalidField) as info:
        parse_allow(["ok.example", "also.ok", 17])
    assert info.value.field == "egress.allow[2]"
    with pytest.raises(InvalidField) as info:
        parse_allow("example.com")
    assert info.value.field == "egress.allow"


@pytest.mark.parametrize(("addr", "reason"), [
    ("127.0.0.1", "loopback"),
    ("10.1.2.3", "private"),
    ("172.16.0.1", "private"),
    ("192.168.1.1", "private"),
    ("169.254.169.254", "link-local / cloud metadata"),
    ("100.64.0.1", "CGNAT"),
    ("100.100.100.200", "CGNAT"),  # Alibaba's metadata address lives in CGNAT
    ("168.63.129.16", "cloud metadata"),
    ("0.0.0.0", "unspecified"),
    ("224.0.0.1", "multicast"),
    ("240.0.0.1", "reserved"),
    ("255.255.255.255", "reserved"),
    ("198.18.0.1", "benchmarking"),
    ("::1", "loopback"),
    ("::", "unspecified"),
    ("fe80::1", "link-local / cloud metadata"),
    ("fd00:ec2::254", "private"),
    ("fc00::1", "private"),
    ("ff02::1", "multicast"),
    ("::ffff:127.0.0.1", "loopback (embedded in ::ffff:7f00:1)"),
    ("::ffff:169.254.169.254", "link-local / cloud metadata (embedded"),
    ("64:ff9b::a00:1", "private (embedded"),
    ("2002:a00:1::", "private (embedded"),
    ("64:ff9b:1::1", "NAT64 local use"),
])
def test_refused_ranges(addr: str, reason: str) -> None:
    why = refusal_reason(ipaddress.ip_address(addr))
    assert why is not None and why.startswith(reason), why


@pytest.mark.parametrize("addr", ["93.184.216.34", "1.1.1.1", "192.0.2.10", "198.51.100.20", "203.0.113.30",
                                  "2606:4700::1111", "::ffff:1.1.1.1", "2001:db8::10"])
def test_public_and_documentation_addresses_are_dialled(addr: str) -> None:
    assert refusal_reason(ipaddress.ip_address(addr)) is None


def test_host_service_rule_is_the_only_way_to_a_private_address() -> None:
    plain = Policy(("registry.internal",))
    addr = ipaddress.ip_address("10.0.0.5")
    assert "private" in (plain.check_address("registry.internal", addr) or "")
    svc = Policy(("registry.internal",), (HostService("registry.internal", ipaddress.ip_network("10.0.0.0/24")),))
    assert svc.check_address("registry.internal", addr) is None
    # Only for the name it names, and only into the network it names.
    assert svc.check_address("other.internal", addr) is not None
    assert svc.check_address("registry.internal", ipaddress.ip_address("10.0.1.5")) is not None
    assert svc.check_address("registry.internal", ipaddress.ip_address("169.254.169.254")) is not None


def test_default_lists_load_and_are_valid() -> None:
    terminal = load_default_list("terminal")
    assert {"github.com", "pypi.org", "registry.npmjs.org", "api.anthropic.com", "deb.debian.org"} <= set(terminal)
    assert load_default_list("computer") == ()
    assert "registry-1.docker.io" in load_default_list("image-registries")


def test_build_policy_per_surface() -> None:
    term = build_policy("terminal", ["example.org"], image_registry=["ghcr.io"])
    assert term.allows("github.com") and term.allows("example.org") and term.allows("ghcr.io")
    comp = build_policy("computer")
    assert comp.allow == ()
    comp2 = build_policy("computer", ["a.example"])
    assert comp2.allow == ("a.example",)
    nodef = build_policy("terminal", ["only.example"], defaults=False, image_registry=["ghcr.io"])
    assert nodef.allow == ("ghcr.io", "only.example")  # registry hosts stay: pulls need them
    browser = build_policy("browser", extra_defaults=["product.example"])
    assert browser.allow == ("product.example",)
    first = build_policy("browser", extra_defaults=["product.example"], first_boot=True)
    assert first.allows("deb.debian.org")
    with pytest.raises(InvalidField) as info:
        build_policy("terminal", ["ok.example", "*"])
    assert info.value.field == "egress.allow[1]"
