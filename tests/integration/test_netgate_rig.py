"""The escape table again, with a real microVM rig behind its gateway.

The server runs as it would in production (one gateway namespace per rig,
the tap handed to QEMU by fd), except that the gateways resolve names with
the fake internet's DNS and dial out of its namespace. The guest is the
terminal image under TCG; its curl plays the hostile guest.
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
from collections.abc import Iterator
from typing import Any

import pytest

from netgate.testing import FakeInternet
from rigd.server.main import gateway_prefix
from tests.integration.conftest import Server, make_data_dir, reap, remove_tree, start_server

pytestmark = [
    pytest.mark.vm, pytest.mark.netgate, pytest.mark.timeout(400),
    pytest.mark.skipif(os.geteuid() != 0 or not shutil.which("nft"), reason="needs root and nftables"),
]

SECRET = "rgt-VM-SECRET-6b1e0c9d2f7a4e85"
ALLOW = ["allowed.test", "*.wild.test", "api.brokered.test", "internal.test", "metadata.test"]


def netns_with(prefix: str) -> list[str]:
    out = subprocess.run(["ip", "netns", "list"], capture_output=True, text=True, check=True).stdout
    return [line.split()[0] for line in out.splitlines() if line.startswith(f"{prefix}-")]


def links_with(prefix: str) -> list[str]:
    out = subprocess.run(["ip", "-o", "link"], capture_output=True, text=True, check=True).stdout
    return [line.split(":")[1].strip().split("@")[0] for line in out.splitlines()
            if line.split(":")[1].strip().startswith(prefix)]


@pytest.fixture
def world() -> Iterator[FakeInternet]:
    fi = FakeInternet("rgt").start()
    try:
        yield fi
    finally:
        fi.close()


@pytest.fixture
def gated(world: FakeInternet) -> Iterator[Server]:
    data_dir = make_data_dir()
    srv = start_server(data_dir, "--resolver", f"{world.resolver[0]}:{world.resolver[1]}",
                       "--upstream-netns", world.netns, "--upstream-ca", str(world.ca_pem_path))
    try:
        yield srv
    finally:
        srv.stop()
        leaked = reap(data_dir)
        prefix = gateway_prefix(data_dir)
        left = netns_with(prefix) + links_with(prefix)
        remove_tree(data_dir)
        assert not leaked and not left, (leaked, left)


class Guest:
    def __init__(self, server: Server, rig_id: str) -> None:
        self.server = server
        self.rig_id = rig_id

    def sh(self, command: str, stdin: str | None = None, timeout: float = 60) -> dict[str, Any]:
        action: dict[str, Any] = {"action": "exec", "command": command, "timeoutS": timeout}
        if stdin is not None:
            action["stdin"] = stdin
        return dict(self.server.call("rig.act", {"rigId": self.rig_id, "tool": "terminal_use",
                                                 "action": action}))

    def curl(self, url: str, *extra: str) -> tuple[int, str]:
        out = self.sh(f"curl -sS -m 6 --cacert /root/fake-ca.pem -o - -w '\\n%{{http_code}}' "
                      f"{' '.join(extra)} {url}")
        return int(out["exitCode"]), out["stdout"].get("text", "") + out["stderr"].get("text", "")


def test_escape_table_with_a_real_rig(gated: Server, world: FakeInternet) -> None:
    gated.call("secret.set", {"workspace": "default", "name": "api", "value": SECRET,
                              "hosts": ["api.brokered.test"]})
    assert SECRET not in json.dumps(gated.call("secret.list", {"workspace": "default"}))
    rig = gated.call("rig.open", {"workspace": "default", "surface": "terminal",
                                  "egress": {"allow": ALLOW, "defaults": False}})
    assert rig["network"]["mode"] == "gateway" and rig["network"]["brokered"] is True
    assert sorted(rig["network"]["allow"]) == sorted(ALLOW)
    g = Guest(gated, rig["id"])
    g.sh("cat > /root/fake-ca.pem", stdin=world.ca_pem_path.read_text())
    rows: list[tuple[str, bool, str]] = []

    def row(what: str, ok: bool, seen: str) -> None:
        rows.append((what, ok, seen.strip().replace("\n", " | ")[:90]))

    code, out = g.curl("http://allowed.test/")
    row("allowed name over HTTP -> served", code == 0 and "site=allowed" in out, out)
    code, out = g.curl("https://allowed.test/")
    row("allowed name over HTTPS -> served", code == 0 and "site=allowed" in out, out)
    code, out = g.curl("https://a.wild.test/")
    row("wildcard name over HTTPS -> served", code == 0 and "site=wild" in out, out)
    code, out = g.curl("http://denied.test/")
    row("denied name -> no answer", code == 6, out)
    code, out = g.curl("http://denied.test/", "--resolve", "denied.test:80:192.0.2.10")
    row("denied name forced to an allowed IP -> refused", "403" in out and "site=" not in out, out)
    code, out = g.curl("https://denied.test/", "--resolve", "denied.test:443:192.0.2.10")
    row("denied SNI forced to an allowed IP -> refused", code != 0 and "site=" not in out, out)
    code, out = g.curl("http://192.0.2.10/")
    row("direct IP -> refused", "403" in out and "site=" not in out, out)
    code, out = g.curl("http://allowed.test:8080/")
    row("other port -> dropped", code == 28, out)
    code, out = g.curl("http://internal.test/")
    row("allowed name resolving to 10.x -> refused", "403" in out and "private" in out, out)
    code, out = g.curl("http://metadata.test/")
    row("allowed name resolving to 169.254.169.254 -> refused", "403" in out, out)
    out = g.sh("python3 -c \"import socket; s=socket.socket(socket.AF_INET6); s.settimeout(3); "
               "s.connect(('2001:db8::10', 80))\" 2>&1; echo rc=$?")
    row("IPv6 -> dropped", "rc=0" not in out["stdout"]["text"], out["stdout"]["text"])
    code, out = g.curl("http://later.test/")
    before = code
    gated.call("rig.egress", {"rigId": rig["id"], "allow": [*ALLOW, "later.test"], "defaults": False})
    code, out = g.curl("http://later.test/")
    row("live allowlist change -> in force at once", before == 6 and code == 0 and "site=later" in out,
        f"before exit {before}; after: {out}")
    code, out = g.curl("https://api.brokered.test/")
    arrived = [r for r in world.requests_to("brokered") if SECRET in json.dumps(r)]
    row("brokered request -> arrives with the secret", code == 0 and "auth=yes" in out and bool(arrived), out)
    # The secret goes in on stdin (masked in the audit log), never in the command.
    traces = g.sh('read -r s; grep -rIs --exclude-dir=proc --exclude-dir=sys -l "$s" / | head -3; '
                  'env | grep -c "$s"; cat /proc/*/environ 2>/dev/null | grep -c "$s"',
                  stdin=SECRET + "\n", timeout=300)
    row("the secret is nowhere in the guest (files, env)", traces["stdout"]["text"].split() == ["0", "0"],
        traces["stdout"]["text"])
    log = json.dumps(gated.call("rig.log", {"rigId": rig["id"]}))
    row("audit log: decisions, shape only, no secret",
        SECRET not in log and "dns_decision" in log and "denied.test" in log, "")
    row("the server log has no secret", SECRET not in gated.log(), "")

    width = max(len(r[0]) for r in rows)
    print("\n" + "\n".join(f"{w:<{width}}  {'PASS' if ok else 'FAIL'}  {seen}" for w, ok, seen in rows))
    assert all(ok for _, ok, _ in rows), [r for r in rows if not r[1]]


def test_close_and_crash_leave_no_network_objects(world: FakeInternet) -> None:
    data_dir = make_data_dir()
    prefix = gateway_prefix(data_dir)
    args = ("--resolver", f"{world.resolver[0]}:{world.resolver[1]}", "--upstream-netns", world.netns)
    first = start_server(data_dir, *args)
    second = None
    try:
        a = first.call("rig.open", {"workspace": "default", "surface": "terminal"})
        b = first.call("rig.open", {"workspace": "default", "surface": "terminal"})
        assert len(netns_with(prefix)) >= 2
        first.call("rig.close", {"rigId": a["id"]})
        assert len(netns_with(prefix)) >= 1
        first.proc.send_signal(signal.SIGKILL)
        first.proc.wait(30)
        assert netns_with(prefix)  # the crashed server's gateway is still there
        second = start_server(data_dir, *args)
        assert second.call("rig.get", {"rigId": b["id"]})["phase"] == "closed"
        assert netns_with(prefix) == [] and links_with(prefix) == []
        assert reap(data_dir) == []
    finally:
        for s in (first, second):
            if s is not None:
                s.stop()
        leaked = reap(data_dir)
        remove_tree(data_dir)
        assert not leaked
