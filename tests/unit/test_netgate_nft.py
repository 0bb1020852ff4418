"""The gateway's nftables ruleset, as JSON: shape and intent (applied for real in integration)."""

from __future__ import annotations

import json
from typing import Any

from netgate import nft


def rules(ruleset: dict[str, Any], chain: str) -> list[list[dict[str, Any]]]:
    return [c["add"]["rule"]["expr"] for c in ruleset["nftables"]
            if "add" in c and "rule" in c["add"] and c["add"]["rule"]["chain"] == chain]


def chains(ruleset: dict[str, Any]) -> dict[str, dict[str, Any]]:
    return {c["add"]["chain"]["name"]: c["add"]["chain"] for c in ruleset["nftables"]
            if "add" in c and "chain" in c["add"]}


def test_batch_recreates_the_table_atomically() -> None:
    cmds = nft.gateway_ruleset("guest0")["nftables"]
    assert "metainfo" in cmds[0]
    table = {"family": "inet", "name": "rigd_gw"}
    assert cmds[1:4] == [{"add": {"table": table}}, {"delete": {"table": table}}, {"add": {"table": table}}]
    json.loads(nft.encode(nft.gateway_ruleset("guest0")))


def test_default_drop_everywhere_but_prerouting() -> None:
    ch = chains(nft.gateway_ruleset("guest0"))
    assert ch["input"]["policy"] == ch["forward"]["policy"] == ch["output"]["policy"] == "drop"
    assert ch["prerouting"]["type"] == "nat" and ch["prerouting"]["prio"] == -100
    assert rules(nft.gateway_ruleset("guest0"), "forward") == [[{"drop": None}]]


def test_redirects_any_destination_of_the_right_ports_only() -> None:
    ports = nft.Ports(http=1080, tls=1443, dns=1053)
    pre = rules(nft.gateway_ruleset("tap0", ports), "prerouting")
    seen = set()
    for expr in pre:
        assert expr[0] == {"match": {"op": "==", "left": {"meta": {"key": "iifname"}}, "right": "tap0"}}
        assert expr[1]["match"]["right"] == "ipv4"  # IPv6 is never redirected, hence dropped
        l4 = expr[2]["match"]
        assert "daddr" not in json.dumps(expr)  # any destination: foreign DNS servers included
        seen.add((l4["left"]["payload"]["protocol"], l4["right"], expr[3]["redirect"]["port"]))
    assert seen == {("tcp", 80, 1080), ("tcp", 443, 1443), ("udp", 53, 1053), ("tcp", 53, 1053)}


def test_input_accepts_only_redirected_service_traffic() -> None:
    ports = nft.Ports(http=1080, tls=1443, dns=1053)
    inp = rules(nft.gateway_ruleset("guest0", ports), "input")
    assert inp[-1] == [{"drop": None}]
    text = json.dumps(inp)
    assert '"dnat"' in text and "1080" in text and "1443" in text and "1053" in text
    for expr in inp[1:-1]:
        assert {"match": {"op": "in", "left": {"ct": {"key": "status"}}, "right": "dnat"}} in expr
    # Nothing mentions icmp or accepts by address.
    assert "icmp" not in json.dumps(nft.gateway_ruleset("guest0"))


def test_output_only_replies() -> None:
    out = rules(nft.gateway_ruleset("guest0"), "output")
    assert out[1][0]["match"]["left"] == {"ct": {"key": "state"}}
    assert out[-1] == [{"drop": None}]
