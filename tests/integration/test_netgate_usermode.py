"""The escape table in rootless mode: a real microVM behind QEMU user networking (restrict=on).

Two servers, one table each:

* ``test_user_mode_forced_as_root``: the server runs as root but with
  ``--network user`` (QEMU then runs as a per-rig uid); the gate resolves
  with the fake internet's DNS and dials out of its namespace
  (``--upstream-netns``), as in ``test_netgate_rig.py``.
* ``test_user_mode_unprivileged_server``: the server runs as ``nobody``
  (no capabilities at all) with ``--network auto`` and must pick user mode
  by itself. It runs *inside* the fake internet's namespace (an
  unprivileged process cannot enter one), so QEMU — and slirp — sit right
  next to the fake internet's hosts: every row that says "unreachable" is
  slirp's ``restrict=on`` refusing a destination that is one hop away.

In both, a listener on the server's own 127.0.0.1 shows that the guest
cannot reach the host's loopback (which slirp maps to 10.0.2.2 when not
restricted), and the fake internet's log shows that nothing but the gate's
own upstream lookups and dials ever reached it.
"""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import socket
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from netgate.netns import run_in_netns
from netgate.testing import FOREIGN_DNS, FakeInternet
from rigd.backends import evidence as rig_evidence
from rigd.client.cli import Client
from rigd.images import find_assets
from rigd.images.pack import ensure_pack
from tests.integration.conftest import (
    REPO,
    Server,
    make_data_dir,
    reap,
    remove_tree,
    server_home,
    start_server,
    track_server,
)

pytestmark = [
    pytest.mark.vm, pytest.mark.netgate, pytest.mark.timeout(900),
    pytest.mark.skipif(os.geteuid() != 0, reason="needs root to build the fake internet's namespace"),
]

SECRET = "rgt-USER-SECRET-3c9a7e1f05b24d68"
ALLOW = ["allowed.test", "*.wild.test", "api.brokered.test", "internal.test", "metadata.test"]
NOBODY = 65534
#: The unprivileged server's own copies (hard links) of the images and of the pack.
UNPRIV_CACHE = Path("/var/tmp/rigd-test-cache-unpriv")
UNPRIV_PACKS = Path("/var/tmp/rigd-test-packs-unpriv")

Call = Callable[[str, dict[str, Any]], Any]


@pytest.fixture
def world() -> Iterator[FakeInternet]:
    fi = FakeInternet("rgt").start()
    try:
        yield fi
    finally:
        fi.close()


# -- the guest -------------------------------------------------------------------------------------

class Guest:
    def __init__(self, call: Call, rig_id: str) -> None:
        self.call = call
        self.rig_id = rig_id

    def sh(self, command: str, stdin: str | None = None, timeout: float = 60) -> tuple[int, str]:
        action: dict[str, Any] = {"action": "exec", "command": command, "timeoutS": timeout}
        if stdin is not None:
            action["stdin"] = stdin
        out = self.call("rig.act", {"rigId": self.rig_id, "tool": "terminal_use", "action": action})
        return int(out["exitCode"]), out["stdout"].get("text", "") + out["stderr"].get("text", "")

    def curl(self, url: str, *extra: str) -> tuple[int, str]:
        return self.sh(f"curl -sS -m 6 --cacert /root/fake-ca.pem -o - -w '\\n%{{http_code}}' "
                       f"{' '.join(extra)} {url}")

    def py(self, code: str) -> str:
        return self.sh("python3 - 2>&1", stdin=code)[1]

    def py_at_once(self, *codes: str) -> list[str]:
        """Run probe scripts side by side (each waits out its own timeouts; the waits overlap)."""
        script = "".join(f"python3 - >/tmp/probe{i} 2>&1 <<'PROBE{i}' &\n{code}\nPROBE{i}\n"
                         for i, code in enumerate(codes))
        script += "wait\n" + "".join(f"cat /tmp/probe{i}; echo '@@probe@@'\n" for i in range(len(codes)))
        out = self.sh(script)[1].split("@@probe@@\n")
        assert len(out) == len(codes) + 1, out
        return out[:-1]


UDP_DNS = ("import socket,struct\n"
           "q=struct.pack('!6H',7,256,1,0,0,0)+b'\\x07allowed\\x04test\\x00'+struct.pack('!2H',1,1)\n"
           "for dst in {dsts!r}:\n"
           "  s=socket.socket(socket.AF_INET,socket.SOCK_DGRAM);s.settimeout(2);s.sendto(q,(dst,{port}))\n"
           "  try: s.recvfrom(512);print(dst,'ANSWERED')\n"
           "  except OSError as e: print(dst,'no answer')\n")
ICMP = ("import socket,struct\n"
        "def ck(b):\n"
        "  s=sum(struct.unpack('!%dH'%(len(b)//2),b));s=(s>>16)+(s&0xffff);return ~(s+(s>>16))&0xffff\n"
        "p=struct.pack('!BBHHH',8,0,0,7,1)+b'rigd-ping';p=p[:2]+struct.pack('!H',ck(p+b'\\0'))+p[4:]\n"
        "for dst in {dsts!r}:\n"
        "  s=socket.socket(socket.AF_INET,socket.SOCK_RAW,socket.IPPROTO_ICMP);s.settimeout(2);s.sendto(p,(dst,0))\n"
        "  try:\n"
        "    while True:\n"
        "      d,a=s.recvfrom(512)\n"
        "      if a[0]==dst and d[20]==0: print(dst,'REPLY');break\n"
        "  except OSError: print(dst,'no reply')\n")
TCP = ("import socket\n"
       "for dst,port in {targets!r}:\n"
       "  s=socket.socket(socket.AF_INET6 if ':' in dst else socket.AF_INET);s.settimeout(4)\n"
       "  try: s.connect((dst,port));print(dst,port,'CONNECTED')\n"
       "  except OSError as e: print(dst,port,type(e).__name__,e.strerror or e)\n")


def escape_table(call: Call, world: FakeInternet, loopback: socket.socket, title: str) -> list[str]:
    """Open a rig, try every way out, print the table; return the failed rows."""
    call("secret.set", {"workspace": "default", "name": "api", "value": SECRET, "hosts": ["api.brokered.test"]})
    rig = call("rig.open", {"workspace": "default", "surface": "terminal",
                            "egress": {"allow": ALLOW, "defaults": False}})
    rows: list[tuple[str, bool, str]] = []
    last = [time.monotonic()]

    def row(what: str, ok: bool, seen: str) -> None:
        now = time.monotonic()
        rows.append((what, ok, f"{now - last[0]:5.1f}s " + " ".join(seen.split())[:100]))
        last[0] = now

    net = rig["network"]
    row("the rig says network.mode == 'user' (and the sandbox note)",
        net["mode"] == "user" and net["gate"] == "10.0.2.100" and "spawn" in net["sandboxNote"]
        and sorted(net["allow"]) == sorted(ALLOW) and net["brokered"] is True,
        f"mode={net['mode']} gate={net.get('gate')} sandbox={net.get('sandbox')}")
    seccomp = rig["confinement"]["seccomp"]
    row("QEMU's seccomp: spawn/elevateprivileges allowed, the rest denied",
        "spawn=deny" not in seccomp and "obsolete=deny" in seccomp and "resourcecontrol=deny" in seccomp, seccomp)
    status = Path(f"/proc/{rig['pid']}/status").read_text()
    nnp = [ln for ln in status.splitlines() if ln.startswith(("NoNewPrivs", "Seccomp:", "CapEff", "Uid"))]
    row("QEMU: no_new_privs, seccomp filter, no capabilities",
        "NoNewPrivs:\t1" in status and "Seccomp:\t2" in status and "CapEff:\t0000000000000000" in status,
        " ".join(nnp))
    g = Guest(call, rig["id"])
    g.sh("cat > /root/fake-ca.pem", stdin=world.ca_pem_path.read_text())

    code, out = g.sh("cat /etc/resolv.conf; getent ahostsv4 allowed.test | head -1")
    row("resolv.conf: the gate, over TCP (use-vc); allowed name -> the gate",
        "options use-vc" in out and "10.0.2.100" in out.split("use-vc", 1)[-1], out)
    code, out = g.curl("http://allowed.test/")
    row("allowed name over HTTP -> served", code == 0 and "site=allowed" in out, out)
    code, out = g.curl("https://allowed.test/")
    row("allowed name over HTTPS -> served", code == 0 and "site=allowed" in out, out)
    code, out = g.curl("https://a.wild.test/")
    row("wildcard name over HTTPS -> served", code == 0 and "site=wild" in out, out)
    code, out = g.sh("for i in 1 2 3 4 5 6; do curl -sS -m 20 --cacert /root/fake-ca.pem "
                     "https://allowed.test/$i & done; wait")
    row("6 concurrent HTTPS connections -> all served", out.count("site=allowed") == 6, f"{out.count('site=')} served")
    code, out = g.curl("http://denied.test/")
    row("denied name -> no answer", code == 6, out)
    code, out = g.curl("http://denied.test/", "--resolve", "denied.test:80:192.0.2.10")
    row("denied name forced to the allowed site's IP -> unreachable", code in (7, 28) and "site=" not in out, out)
    code, out = g.curl("http://denied.test/", "--resolve", "denied.test:80:10.0.2.100")
    row("denied name forced to the gate -> refused (403)", "403" in out and "site=" not in out, out)
    code, out = g.curl("https://denied.test/", "--resolve", "denied.test:443:10.0.2.100")
    row("denied SNI forced to the gate -> refused (TLS alert)", code != 0 and "site=" not in out, out)
    code, out = g.curl("http://192.0.2.10/")
    row("direct IP -> unreachable", code in (7, 28) and "site=" not in out, out)
    code, out = g.curl("http://10.0.2.100/")
    row("the gate by IP (Host: 10.0.2.100) -> refused (names only)", "403" in out and "direct IP" in out, out)
    code, out = g.curl("http://allowed.test:8080/")
    row("other port on the gate -> unreachable", code in (7, 28), out)
    out = g.py(TCP.format(targets=[("10.0.2.100", 443)]))
    row("control: TCP to the gate's 443 -> connects (the probe works)", "CONNECTED" in out, out)
    out = g.py(TCP.format(targets=[("192.0.2.10", 8080), ("192.0.2.10", 22), (FOREIGN_DNS, 53)]))
    row("other hosts' ports (TCP sinks, foreign DNS over TCP) -> unreachable", "CONNECTED" not in out, out)
    port = loopback.getsockname()[1]
    out = g.py(TCP.format(targets=[("10.0.2.2", port), ("10.0.2.3", port), ("10.0.2.2", 22)]))
    with contextlib.suppress(BlockingIOError):
        loopback.accept()[0].close()
        out += " | LISTENER GOT A CONNECTION"
    row(f"the host's loopback (127.0.0.1:{port} via 10.0.2.2) -> unreachable",
        "CONNECTED" not in out and "LISTENER" not in out, out)
    # The probes that can only end in a timeout run side by side (one probe per destination).
    g.sh("B=/.rigd/bin/busybox; $B ip -6 addr add fec0::15/64 dev eth0; $B ip -6 route add default via fec0::2")
    probes = [UDP_DNS.format(dsts=[dst], port=53) for dst in ("10.0.2.3", "10.0.2.100", FOREIGN_DNS)]
    probes += [UDP_DNS.format(dsts=["192.0.2.10"], port=9999), ICMP.format(dsts=["10.0.2.2"])]
    probes += [ICMP.format(dsts=[dst]) for dst in ("192.0.2.10", FOREIGN_DNS)]
    probes += [TCP.format(targets=[target]) for target in (("2001:db8::10", 80), ("fec0::2", 80))]
    got = g.py_at_once(*probes)
    out = " ".join(got[0:3])
    row("DNS over UDP (slirp's 10.0.2.3, the gate, a foreign server) -> no answer",
        "ANSWERED" not in out and out.count("no answer") == 3, out)
    row("other UDP (a UDP sink) -> dropped", "ANSWERED" not in got[3] and "no answer" in got[3], got[3])
    row("control: ICMP echo to slirp itself -> answered by slirp (the probe works)", "REPLY" in got[4], got[4])
    out = " ".join(got[5:7])
    row("ICMP echo to the internet -> dropped", "REPLY" not in out and out.count("no reply") == 2, out)
    out = " ".join(got[7:9])
    row("IPv6 (with an address and a route in the guest) -> dropped",
        "CONNECTED" not in out and out.count(" 80 ") == 2, out)
    code, out = g.curl("http://internal.test/")
    row("allowed name resolving to 10.x -> refused", "403" in out and "private" in out, out)
    code, out = g.curl("http://metadata.test/")
    row("allowed name resolving to 169.254.169.254 -> refused", "403" in out, out)
    before, _ = g.curl("http://later.test/")
    call("rig.egress", {"rigId": rig["id"], "allow": [*ALLOW, "later.test"], "defaults": False})
    code, out = g.curl("http://later.test/")
    row("live allowlist change -> in force at once", before == 6 and code == 0 and "site=later" in out,
        f"before exit {before}; after: {out}")
    code, out = g.curl("https://api.brokered.test/")
    arrived = [r for r in world.requests_to("brokered") if SECRET in json.dumps(r)]
    row("brokered request -> arrives with the secret", code == 0 and "auth=yes" in out and bool(arrived), out)
    stray = [e for e in world.log() if e["event"] in ("tcp", "udp") or
             (e["event"] == "dns" and e.get("server") != "upstream")]
    row("the fake internet saw nothing but the gate's lookups and dials", not stray, json.dumps(stray)[:100])
    helpers = relay_helpers(f"{rig['id']}/net.sock")
    row("no relay helper outlives its hand-over", not helpers, str(helpers))
    log = json.dumps(call("rig.log", {"rigId": rig["id"]}))
    row("audit log: the gate's decisions, no secret", SECRET not in log and "denied.test" in log, "")
    call("rig.close", {"rigId": rig["id"]})

    width = max(len(r[0]) for r in rows)
    print(f"\n{title}\n" + "\n".join(f"{w:<{width}}  {'PASS' if ok else 'FAIL'}  {seen}" for w, ok, seen in rows))
    return [w for w, ok, _ in rows if not ok]


def relay_helpers(marker: str) -> list[int]:
    """Processes other than QEMU whose command line names the rig's relay socket."""
    found = []
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            with contextlib.suppress(OSError):
                argv = (entry / "cmdline").read_bytes().split(b"\0")
                if marker.encode() in b" ".join(argv) and b"qemu-system" not in argv[0]:
                    found.append(int(entry.name))
    return found


def loopback_listener() -> socket.socket:
    s = socket.socket()
    s.bind(("127.0.0.1", 0))
    s.listen(4)
    s.setblocking(False)
    return s


# -- 1: root, --network user -----------------------------------------------------------------------

def test_user_mode_forced_as_root(world: FakeInternet) -> None:
    data_dir = make_data_dir()
    srv = start_server(data_dir, "--network", "user", "--resolver", f"{world.resolver[0]}:{world.resolver[1]}",
                       "--upstream-netns", world.netns, "--upstream-ca", str(world.ca_pem_path))
    listener = loopback_listener()
    try:
        failed = escape_table(lambda m, p: srv.call(m, p), world, listener,
                              "user mode, forced (--network user), server as root, QEMU as a rig uid")
        assert "--network user" in srv.log()
        assert not failed, failed
    finally:
        listener.close()
        srv.stop()
        leaked = reap(data_dir)
        remove_tree(data_dir)
        assert not leaked


# -- 2: nobody, --network auto -------------------------------------------------------------------

def _link_tree(src: Path, dst: Path) -> None:
    if not dst.exists():
        dst.parent.mkdir(parents=True, exist_ok=True)
        os.chmod(dst.parent, 0o755)
        subprocess.run(["cp", "-al", str(src), str(dst)], check=True)


def unprivileged_assets() -> None:
    """Hard-linked copies of the built images and the pack that ``nobody`` can read (root's cache is 0700)."""
    assets = find_assets()
    for path in (assets.kernel, assets.initrd, assets.tools, assets.oci_layout):
        src = path.parent  # <cache>/<kind>/<key>
        _link_tree(src, UNPRIV_CACHE / src.parent.name / src.name)
    os.chmod(UNPRIV_CACHE, 0o755)
    shared = make_data_dir()  # rigs/smolvm-packs -> the shared test packs
    try:
        rootfs = ensure_pack(assets, shared).resolve()
    finally:
        remove_tree(shared)
    UNPRIV_PACKS.mkdir(exist_ok=True)
    os.chown(UNPRIV_PACKS, NOBODY, NOBODY)
    os.chmod(UNPRIV_PACKS, 0o711)
    pack = UNPRIV_PACKS / rootfs.parent.name
    if not (pack / "pack.json").exists():
        pack.mkdir(exist_ok=True)
        with contextlib.suppress(FileExistsError):
            os.link(rootfs, pack / "rootfs.img")
        shutil.copyfile(rootfs.parent / "pack.json", pack / "pack.json")
        for p in (pack, pack / "pack.json"):
            os.chown(p, NOBODY, NOBODY)


def readable_code(dest: Path) -> Path:
    """The server's code and its dependencies where ``nobody`` can read them: the
    checkout (and its .venv) may sit in a directory only root can enter (a
    private home, a ``mktemp -d``). The recipes come too: image keys hash them."""
    site = REPO / ".venv" / "lib" / f"python{sys.version_info[0]}.{sys.version_info[1]}" / "site-packages"
    dest.mkdir(mode=0o755)
    for src, name in ((REPO / "rigd", "rigd"), (REPO / "netgate", "netgate"),
                      (REPO / "guest-agent", "guest-agent"), (REPO / "images", "images"),
                      (site, "site-packages")):
        # Hard links where the checkout shares the data directory's file system (400 MB of
        # site-packages, not copied each run); a copy where it does not.
        if subprocess.run(["cp", "-al", str(src), str(dest / name)], capture_output=True).returncode != 0:
            shutil.rmtree(dest / name, ignore_errors=True)
            subprocess.run(["cp", "-a", str(src), str(dest / name)], check=True)
    subprocess.run(["chmod", "-R", "a+rX", str(dest)], check=True)
    return dest


def start_unprivileged(world: FakeInternet) -> tuple[Server, Path]:
    unprivileged_assets()
    data_dir = Path(tempfile.mkdtemp(prefix="rigd-test-nobody-", dir="/var/tmp"))
    try:
        return _start_unprivileged(world, data_dir)
    except BaseException:
        remove_tree(data_dir)  # the test's own cleanup never runs
        raise


def _start_unprivileged(world: FakeInternet, data_dir: Path) -> tuple[Server, Path]:
    (data_dir / "rigs").mkdir()
    (data_dir / "rigs" / "smolvm-packs").symlink_to(UNPRIV_PACKS)
    ca = data_dir / "fake-ca.pem"
    shutil.copyfile(world.ca_pem_path, ca)
    for p in (data_dir, data_dir / "rigs"):
        os.chown(p, NOBODY, NOBODY)
        os.chmod(p, 0o711)
    os.chmod(ca, 0o644)
    home = server_home(data_dir)  # its log and its rigs' evidence, kept if the test fails
    os.chown(home / "rigs", NOBODY, NOBODY)
    log_path = home / "server.log"
    code = readable_code(data_dir / "code")
    site = code / "site-packages"
    python = "/usr/bin/python3"  # this test's interpreter may live where nobody cannot enter
    argv = ["ip", "netns", "exec", world.netns,
            "setpriv", f"--reuid={NOBODY}", f"--regid={NOBODY}", "--clear-groups", "--inh-caps=-all",
            "env", "-i", "PATH=/usr/bin:/bin", "HOME=/nonexistent", f"PYTHONPATH={site}:{code}",
            f"{rig_evidence.ENV}={home / 'rigs'}",
            python, "-m", "rigd", "serve", "--data-dir", str(data_dir), "--port", "0", "--accel", "tcg",
            "--log-level", "info", "--cache-dir", str(UNPRIV_CACHE), "--network", "auto", "--pool", "none",
            "--resolver", f"{world.resolver[0]}:{world.resolver[1]}", "--upstream-ca", str(ca)]
    with open(log_path, "ab") as log:
        proc = subprocess.Popen(argv, stdout=log, stderr=subprocess.STDOUT, cwd=code)
    track_server(proc, home)
    deadline = time.monotonic() + 180
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise RuntimeError(f"the unprivileged server exited ({proc.returncode}):\n{log_path.read_text()}")
        try:
            url = json.loads((data_dir / "server.json").read_text())["url"]
            token = (data_dir / "admin.token").read_text().strip()
            return Server(data_dir, proc, url, token, log_path, home), data_dir
        except (OSError, ValueError, KeyError):
            time.sleep(0.1)
    proc.kill()
    raise RuntimeError("the unprivileged server did not write server.json in time")


def test_user_mode_unprivileged_server(world: FakeInternet) -> None:
    srv, data_dir = start_unprivileged(world)
    client = Client(srv.url, srv.token)

    def call(method: str, params: dict[str, Any]) -> Any:
        # The server listens on 127.0.0.1 inside the fake internet's namespace.
        return run_in_netns(world.netns, client.call, method, params)

    listener = run_in_netns(world.netns, loopback_listener)
    try:
        failed = escape_table(call, world, listener,
                              "user mode, chosen by --network auto, server as nobody (no capabilities)")
        log = srv.log()
        assert "rigs get user-mode networking" in log and "not running as root" in log
        pid = int(subprocess.run(["pgrep", "-u", str(NOBODY), "-f", f"rigd serve --data-dir {data_dir}"],
                                 capture_output=True, text=True, check=True).stdout.split()[0])
        assert "CapEff:\t0000000000000000" in Path(f"/proc/{pid}/status").read_text()
        assert not failed, failed
    finally:
        listener.close()
        srv.stop()
        leaked = reap(data_dir)
        if leaked:
            sys.stderr.write(srv.log()[-6000:])
        remove_tree(data_dir)
        assert not leaked


# -- 3: warm starts keep working in user mode ---------------------------------------------------------

def test_user_mode_rigs_warm_start_from_their_own_snapshot(world: FakeInternet) -> None:
    from tests.integration.test_warm_start import boot_of, private_pack_data_dir, wait_snapshot

    data_dir, rootfs = private_pack_data_dir()
    env_before = os.environ.pop("RIGD_WARM_STARTS", None)
    srv = start_server(data_dir, "--network", "user", "--resolver", f"{world.resolver[0]}:{world.resolver[1]}",
                       "--upstream-netns", world.netns)
    try:
        rigs = []
        for expected in ("cold", "warm"):
            rig = srv.call("rig.open", {"workspace": "default", "surface": "terminal",
                                        "egress": {"allow": ["allowed.test"], "defaults": False}})
            g = Guest(lambda m, p: srv.call(m, p), rig["id"])
            _, out = g.sh("for i in 1 2 3; do curl -sS -m 20 http://allowed.test/$i & done; wait; "
                          "curl -sS -m 6 http://denied.test/ 2>&1")
            print(f"{expected} rig {rig['id']}: boot={boot_of(srv, rig)} network={rig['network']['mode']} "
                  f"served={out.count('site=allowed')}")
            assert boot_of(srv, rig) == expected and rig["network"]["mode"] == "user"
            assert out.count("site=allowed") == 3 and "Could not resolve host: denied.test" in out, out
            rigs.append(rig)
            if expected == "cold":
                print(f"snapshot {wait_snapshot(rootfs)} (user-mode shape)")
        for rig in rigs:
            srv.call("rig.close", {"rigId": rig["id"]})
    finally:
        if env_before is not None:
            os.environ["RIGD_WARM_STARTS"] = env_before
        srv.stop()
        leaked = reap(data_dir)
        remove_tree(data_dir)
        assert not leaked
