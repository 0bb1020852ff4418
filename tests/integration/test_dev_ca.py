"""`rigd ca` prints the dev CA of the server it talks to, fetched from that server's public
`GET /ca.pem` and checked against `server.info`'s `devCaFingerprint` — two real servers, no rig.

Before, it read (or made) a CA in the default data directory whatever `--url` said, so a
person trusting it got the wrong CA."""

from __future__ import annotations

import hashlib
import os
import ssl
import subprocess
import urllib.request
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.integration.conftest import REPO, Server, make_data_dir, serving

pytestmark = pytest.mark.timeout(120)
RIGD = str(REPO / ".venv" / "bin" / "rigd")


@pytest.fixture(scope="module")
def two() -> Iterator[tuple[Server, Server]]:
    with serving(make_data_dir()) as first, serving(make_data_dir()) as second:
        yield first, second


def rigd_ca(*args: str, home: Path) -> subprocess.CompletedProcess[str]:
    """`rigd ca` as a person on another account runs it: an empty data directory of its own."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("RIGD_")}
    env["RIGD_DATA_DIR"] = str(home)
    return subprocess.run([RIGD, "ca", *args], capture_output=True, text=True, timeout=60, env=env)


def sha256_of(pem: str) -> str:
    return ":".join(f"{b:02X}" for b in hashlib.sha256(ssl.PEM_cert_to_DER_cert(pem)).digest())


def test_rigd_ca_url_prints_that_servers_ca(two: tuple[Server, Server], tmp_path: Path) -> None:
    first, second = two
    pems = {}
    for srv in two:
        with urllib.request.urlopen(srv.url + "/ca.pem", timeout=30) as resp:  # public: no token
            pems[srv.url] = resp.read().decode()
            assert resp.headers["content-type"] == "application/x-pem-file"
        assert "PRIVATE" not in pems[srv.url]
        assert sha256_of(pems[srv.url]) == srv.call("server.info")["devCaFingerprint"]
        assert pems[srv.url] == (srv.data_dir / "rigs" / "tls" / "ca.pem").read_text()
    assert pems[first.url] != pems[second.url]

    out = rigd_ca("--url", second.url, "--token", second.token, home=tmp_path)
    assert out.returncode == 0, out.stderr
    assert out.stdout == pems[second.url]
    assert "matches server.info" in out.stderr and second.url in out.stderr
    assert list(tmp_path.iterdir()) == []  # nothing made on the client side

    out = rigd_ca("--url", first.url, home=tmp_path)  # no token: printed, said to be unchecked
    assert out.returncode == 0 and out.stdout == pems[first.url]
    assert "not checked against server.info" in out.stderr

    out = rigd_ca("--data-dir", str(first.data_dir), home=tmp_path)  # its server.json and token
    assert out.returncode == 0 and out.stdout == pems[first.url]
    assert list(tmp_path.iterdir()) == []


def test_a_server_without_dev_https_says_why_and_rigd_ca_prints_nothing(tmp_path: Path) -> None:
    with serving(make_data_dir(), "--dev-https-port", "none") as srv:
        assert srv.call("server.info")["devCaFingerprint"] is None
        out = rigd_ca("--url", srv.url, "--token", srv.token, home=tmp_path)
        assert out.returncode == 2 and out.stdout == ""
        assert "no dev CA" in out.stderr and "turned off" in out.stderr and "Traceback" not in out.stderr
    assert list(tmp_path.iterdir()) == []
