from __future__ import annotations

from typing import Any

import pytest

from rigd.errors import FieldError
from rigd.model import ENGINE_MEMORY_MB, LIMITS, Engine, Surface
from rigd.rigs.params import parse_open


def test_defaults_come_from_the_limits_table() -> None:
    p = parse_open({"workspace": "default", "surface": "terminal"})
    limits = LIMITS[Surface.TERMINAL]
    assert (p.memory_mb, p.vcpus, p.ttl_s, p.idle_s) == (
        limits.memory_mb, limits.vcpus, limits.ttl_s, limits.idle_s)
    assert p.wait is True and p.display is None


def test_a_browser_defaults_to_chromium_and_its_memory() -> None:
    p = parse_open({"workspace": "default", "surface": "browser"})
    assert p.engine is Engine.CHROMIUM and p.memory_mb == ENGINE_MEMORY_MB[Engine.CHROMIUM]
    assert p.display == LIMITS[Surface.BROWSER].display


@pytest.mark.parametrize(
    ("params", "field", "fragment"),
    [
        ({"surface": "terminal"}, "workspace", "required"),
        ({"workspace": "w", "surface": "toaster"}, "surface", "must be one of"),
        ({"workspace": "w", "surface": "android"}, "surface", "not available in this build"),
        ({"workspace": "w", "surface": "browser", "engine": "WebKit"}, "engine", "unknown engine"),
        ({"workspace": "w", "surface": "browser", "engine": "Chromium"}, "engine", "unknown engine"),
        ({"workspace": "w", "surface": "browser", "memoryMb": 512}, "memoryMb", "between"),
        ({"workspace": "w", "surface": "terminal", "memoryMb": 999999}, "memoryMb", "between 256 and 4096"),
        ({"workspace": "w", "surface": "terminal", "vcpus": True}, "vcpus", "integer"),
        ({"workspace": "w", "surface": "terminal", "ttlS": 10**9}, "ttlS", "seconds"),
        ({"workspace": "w", "surface": "terminal", "engine": "chromium"}, "engine", "only browser"),
        ({"workspace": "w", "surface": "terminal", "display": {"width": 1, "height": 1}}, "display", "no display"),
        ({"workspace": "w", "surface": "terminal", "egress": {"allow": "x.com"}}, "egress.allow", "list of host names"),
        ({"workspace": "w", "surface": "terminal", "egress": {"deny": []}}, "egress.deny", "unknown field"),
        ({"workspace": "w", "surface": "terminal", "colour": "red"}, "colour", "unknown field"),
        ({"workspace": "w", "surface": "terminal", "conversation": "a b"}, "conversation", "letters"),
        ({"workspace": "w", "surface": "terminal", "backend": "qemu-kvm"}, "backend", "runs on smolvm"),
    ],
)
def test_bad_open_params_name_the_field(params: dict[str, Any], field: str, fragment: str) -> None:
    with pytest.raises(FieldError) as exc:
        parse_open(params)
    assert exc.value.field == field
    assert fragment in exc.value.reason


def test_not_an_object() -> None:
    with pytest.raises(FieldError) as exc:
        parse_open([1, 2])
    assert exc.value.field == "params"


@pytest.mark.parametrize("port", [8000.0, "8000", True, 0, 65536])
def test_a_port_is_an_integer_in_range(port: object) -> None:
    from rigd.rigs.params import parse_domain_set, parse_port_share

    for parse, extra in ((parse_port_share, {"lan": False}), (parse_domain_set, {"name": "app.test"})):
        with pytest.raises(FieldError) as exc:
            parse({"rigId": "rig_a", "guestPort": port, **extra})
        assert exc.value.field == "guestPort"
        assert "integer" in exc.value.reason
    assert parse_port_share({"rigId": "rig_a", "guestPort": 8000, "lan": False}).guest_port == 8000
