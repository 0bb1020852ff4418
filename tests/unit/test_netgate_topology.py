"""Naming of a rig's plumbing (pure): stable, prefixed, within the kernel's 15-character limit."""

from __future__ import annotations

import pytest

from netgate.topology import ADDRESSING, Naming


def test_names_are_stable_prefixed_and_short() -> None:
    n = Naming("rig_0123456789abcdef")
    assert n == Naming("rig_0123456789abcdef")
    assert n.netns.startswith("rigd-gw-") and len(n.key) == 10
    for link in (n.tap, n.veth_host):
        assert link.startswith("rigd") and len(link) <= 15
    assert Naming("rig_other").key != n.key
    assert Naming("rig_x", "rgt").netns.startswith("rgt-gw-")


def test_guest_mac_is_unicast_and_overridable() -> None:
    mac = Naming("rig_a").guest_mac
    assert int(mac[:2], 16) & 1 == 0 and int(mac[:2], 16) & 2  # unicast, locally administered
    assert Naming("rig_a", mac="02:11:22:33:44:55").guest_mac == "02:11:22:33:44:55"
    with pytest.raises(ValueError, match="MAC"):
        Naming("rig_a", mac="03:11:22:33:44:55")  # multicast
    with pytest.raises(ValueError, match="prefix"):
        Naming("rig_a", "Bad-Prefix")


def test_guest_addressing_is_a_point_to_point_30() -> None:
    assert (str(ADDRESSING.gateway), str(ADDRESSING.guest), ADDRESSING.prefixlen) == ("10.213.0.1", "10.213.0.2", 30)
    assert ADDRESSING.dns == ADDRESSING.gateway
