"""nftables rules for a gateway namespace, as the JSON that ``nft -j -f -`` applies atomically.

How this works: the gateway namespace holds only ``lo`` and the guest link,
and has no route anywhere, so nothing can be forwarded even without rules.
The rules make the intent explicit and narrow what the guest can touch on
the gateway itself:

* ``prerouting`` (nat): guest tcp/80 → the HTTP proxy port, tcp/443 → the TLS
  proxy port, udp/53 and tcp/53 → the DNS responder port — whatever
  destination the guest aimed at (foreign DNS servers included). IPv4 only.
* ``input`` (policy drop): loopback, and from the guest only connections that
  were redirected above *and* now target one of the three service ports.
  A guest dialling the service ports directly, ICMP, other ports, other UDP
  and all IPv6 are dropped.
* ``forward`` (policy drop): nothing, ever.
* ``output`` (policy drop): loopback and replies on established connections;
  the gateway never opens a connection towards the guest.

The batch deletes and recreates the table inside one transaction, so
re-applying it is atomic and idempotent (``add table`` first makes the
``delete`` valid on a fresh namespace).
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any

TABLE = "rigd_gw"
FAMILY = "inet"


@dataclass(frozen=True, slots=True)
class Ports:
    http: int = 15080
    tls: int = 15443
    dns: int = 15053


DEFAULT_PORTS = Ports()


def _meta(key: str, value: Any) -> dict[str, Any]:
    return {"match": {"op": "==", "left": {"meta": {"key": key}}, "right": value}}


def _l4(proto: str, fld: str, value: Any) -> dict[str, Any]:
    return {"match": {"op": "==", "left": {"payload": {"protocol": proto, "field": fld}}, "right": value}}


def _ct(key: str, value: Any) -> dict[str, Any]:
    return {"match": {"op": "in", "left": {"ct": {"key": key}}, "right": value}}


def _set(values: list[int]) -> dict[str, Any]:
    return {"set": values}


def _rule(chain: str, *expr: dict[str, Any], comment: str | None = None) -> dict[str, Any]:
    rule: dict[str, Any] = {"family": FAMILY, "table": TABLE, "chain": chain, "expr": list(expr)}
    if comment:
        rule["comment"] = comment
    return {"add": {"rule": rule}}


def _chain(name: str, ctype: str, hook: str, prio: int, policy: str) -> dict[str, Any]:
    return {"add": {"chain": {"family": FAMILY, "table": TABLE, "name": name, "type": ctype,
                              "hook": hook, "prio": prio, "policy": policy}}}


def gateway_ruleset(guest_if: str, ports: Ports = DEFAULT_PORTS) -> dict[str, Any]:
    """The whole ruleset of one gateway namespace (see the module doc)."""
    table = {"family": FAMILY, "name": TABLE}
    accept: dict[str, Any] = {"accept": None}
    drop: dict[str, Any] = {"drop": None}
    from_guest = _meta("iifname", guest_if)
    v4 = _meta("nfproto", "ipv4")
    cmds: list[dict[str, Any]] = [
        {"add": {"table": table}},
        {"delete": {"table": table}},
        {"add": {"table": table}},
        _chain("prerouting", "nat", "prerouting", -100, "accept"),
        _chain("input", "filter", "input", 0, "drop"),
        _chain("forward", "filter", "forward", 0, "drop"),
        _chain("output", "filter", "output", 0, "drop"),
        _rule("prerouting", from_guest, v4, _l4("tcp", "dport", 80), {"redirect": {"port": ports.http}},
              comment="guest http -> proxy"),
        _rule("prerouting", from_guest, v4, _l4("tcp", "dport", 443), {"redirect": {"port": ports.tls}},
              comment="guest https -> proxy"),
        _rule("prerouting", from_guest, v4, _l4("udp", "dport", 53), {"redirect": {"port": ports.dns}},
              comment="guest dns (any server) -> responder"),
        _rule("prerouting", from_guest, v4, _l4("tcp", "dport", 53), {"redirect": {"port": ports.dns}},
              comment="guest dns over tcp (any server) -> responder"),
        _rule("input", _meta("iifname", "lo"), accept),
        _rule("input", from_guest, v4, _ct("status", "dnat"), _l4("tcp", "dport", _set(sorted(
            {ports.http, ports.tls, ports.dns}))), accept, comment="redirected guest tcp"),
        _rule("input", from_guest, v4, _ct("status", "dnat"), _l4("udp", "dport", ports.dns), accept,
              comment="redirected guest dns"),
        _rule("input", drop),
        _rule("forward", drop),
        _rule("output", _meta("oifname", "lo"), accept),
        _rule("output", _ct("state", ["established", "related"]), accept),
        _rule("output", drop),
    ]
    return {"nftables": [{"metainfo": {"json_schema_version": 1}}, *cmds]}


def delete_table() -> dict[str, Any]:
    table = {"family": FAMILY, "name": TABLE}
    return {"nftables": [{"add": {"table": table}}, {"delete": {"table": table}}]}


def encode(ruleset: dict[str, Any]) -> bytes:
    return json.dumps(ruleset, separators=(",", ":")).encode()
