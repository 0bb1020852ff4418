"""The credential broker: sealed at rest, bound to hosts, refused outside the rig's allowlist."""

from __future__ import annotations

import contextlib
import os
import sqlite3
import ssl
import stat
from pathlib import Path

import pytest
from cryptography import x509
from cryptography.exceptions import InvalidTag

from netgate.broker import BrokerRefused, RigCA, SecretStore
from netgate.errors import InvalidField
from netgate.policy import Policy

SECRET = "ghp_s3cr3t-value-that-must-never-leak"


def test_secret_is_sealed_at_rest_and_key_is_private(tmp_path: Path) -> None:
    store = SecretStore(tmp_path)
    store.put("ws1", "gh", SECRET, ["api.github.com"])
    store.close()
    key = tmp_path / "netgate" / "broker.key"
    assert stat.S_IMODE(key.stat().st_mode) == 0o600 and len(key.read_bytes()) == 32
    for f in (tmp_path / "netgate").iterdir():
        assert SECRET.encode() not in f.read_bytes(), f
    # A second store over the same directory reads it back.
    again = SecretStore(tmp_path)
    inj = again.issue("ws1", "api.github.com", Policy(("api.github.com",)))
    assert inj is not None and inj.headers == {"Authorization": f"Bearer {SECRET}"}
    assert SECRET not in repr(inj)


def test_key_readable_by_others_is_refused(tmp_path: Path) -> None:
    SecretStore(tmp_path).close()
    key = tmp_path / "netgate" / "broker.key"
    os.chmod(key, 0o644)
    with pytest.raises(PermissionError, match="0600"):
        SecretStore(tmp_path)


def test_binding_rules(tmp_path: Path) -> None:
    store = SecretStore(tmp_path)
    store.put("ws1", "wide", "w", ["*.example.com"], header="X-Api-Key", template="{value}")
    store.put("ws1", "narrow", "n", ["api.example.com"])
    store.put("ws2", "other", "o", ["api.example.com"])
    pol = Policy(("api.example.com", "www.example.com", "example.com"))
    narrow = store.issue("ws1", "api.example.com", pol)
    assert narrow is not None and narrow.secret == "narrow"  # the exact pattern beats the wildcard
    wide = store.issue("ws1", "www.example.com", pol)
    assert wide is not None and wide.headers == {"X-Api-Key": "w"}
    assert store.issue("ws1", "example.com", pol) is None  # *.example.com does not bind the apex
    other = store.issue("ws2", "api.example.com", pol)
    assert other is not None and other.secret == "other"  # workspaces never share
    assert store.issue("ws3", "api.example.com", pol) is None
    assert [s.name for s in store.list("ws1")] == ["narrow", "wide"]
    assert store.delete("ws1", "narrow") and not store.delete("ws1", "narrow")


def test_secret_for_a_host_outside_the_allowlist_is_an_error_naming_it(tmp_path: Path) -> None:
    store = SecretStore(tmp_path)
    store.put("ws1", "gh", SECRET, ["api.github.com"])
    with pytest.raises(BrokerRefused) as info:
        store.issue("ws1", "api.github.com", Policy(("pypi.org",)))
    assert info.value.host == "api.github.com" and "api.github.com" in str(info.value)
    assert SECRET not in str(info.value)


def test_tampered_row_does_not_decrypt(tmp_path: Path) -> None:
    store = SecretStore(tmp_path)
    store.put("ws1", "gh", SECRET, ["api.github.com"])
    db = sqlite3.connect(tmp_path / "netgate" / "broker.db")
    # Re-binding the sealed value to another host breaks the associated data.
    db.execute("UPDATE secrets SET hosts='[\"evil.example\"]'")
    db.commit()
    with pytest.raises(InvalidTag):
        store.issue("ws1", "evil.example", Policy(("evil.example",)))


@pytest.mark.parametrize(("kwargs", "field"), [
    ({"name": "bad name"}, "name"),
    ({"hosts": []}, "hosts"),
    ({"hosts": ["10.0.0.1"]}, "hosts[0]"),
    ({"header": "Bad Header"}, "header"),
    ({"header": "Host"}, "header"),
    ({"template": "no placeholder"}, "template"),
    ({"value": "a\r\nInjected: 1"}, "value"),
])
def test_put_validation_names_the_field_not_the_value(tmp_path: Path, kwargs: dict[str, object],
                                                       field: str) -> None:
    args: dict[str, object] = {"name": "n", "value": SECRET, "hosts": ["a.example"]} | kwargs
    with pytest.raises(InvalidField) as info:
        SecretStore(tmp_path).put("ws", **args)  # type: ignore[arg-type]
    assert info.value.field == field
    assert SECRET not in str(info.value)


def test_rig_ca_issues_leaves_a_client_can_verify(tmp_path: Path) -> None:
    ca = RigCA("rig_test")
    cert = x509.load_pem_x509_certificate(ca.cert_pem.encode())
    assert cert.extensions.get_extension_for_class(x509.BasicConstraints).value.ca
    chain, _key = ca.leaf_pem("api.example.com")
    leaf = x509.load_pem_x509_certificates(chain)[0]
    assert leaf.extensions.get_extension_for_class(x509.SubjectAlternativeName).value.get_values_for_type(
        x509.DNSName) == ["api.example.com"]
    # A real TLS handshake in memory: server context from the CA, client trusting only the CA PEM.
    server_ctx = ca.server_context("api.example.com")
    assert ca.server_context("api.example.com") is server_ctx  # cached
    client_ctx = ssl.create_default_context(cadata=ca.cert_pem)
    c_in, c_out, s_in, s_out = ssl.MemoryBIO(), ssl.MemoryBIO(), ssl.MemoryBIO(), ssl.MemoryBIO()
    client = client_ctx.wrap_bio(c_in, c_out, server_hostname="api.example.com")
    server = server_ctx.wrap_bio(s_in, s_out, server_side=True)
    for _ in range(10):
        for side in (client, server):
            with contextlib.suppress(ssl.SSLWantReadError):
                side.do_handshake()
        s_in.write(c_out.read())
        c_in.write(s_out.read())
    client.do_handshake()
    assert client.version() is not None
    assert client.selected_alpn_protocol() is None or client.selected_alpn_protocol() == "http/1.1"
