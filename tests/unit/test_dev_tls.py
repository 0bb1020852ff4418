"""The dev-domain CA (rigd/ports/tls.py): real TLS handshakes in memory, files, restarts, names, `rigd ca`."""

from __future__ import annotations

import datetime
import os
import ssl
import stat
import subprocess
import sys
from pathlib import Path

import pytest

from rigd.client.cli import main as cli_main
from rigd.errors import RigdError
from rigd.ports import tls
from rigd.ports.names import dev_name_problem, is_dev_name
from rigd.ports.tls import DevCA, load_dev_ca


@pytest.fixture
def tdir(tmp_path: Path) -> Path:
    return tmp_path / "data" / "rigs" / "tls"


@pytest.fixture
def ca(tdir: Path) -> DevCA:
    return DevCA.load_or_create(tdir)


def client_context(cafile: Path | None = None, cadata: str | None = None) -> ssl.SSLContext:
    ctx = ssl.SSLContext(ssl.PROTOCOL_TLS_CLIENT)  # check_hostname=True, CERT_REQUIRED
    ctx.load_verify_locations(cafile=cafile, cadata=cadata)
    ctx.set_alpn_protocols(["h2", "http/1.1"])
    assert ctx.check_hostname
    return ctx


def handshake(server_ctx: ssl.SSLContext, client_ctx: ssl.SSLContext, sni: str | None) -> ssl.SSLObject:
    """Run a TLS handshake between the two contexts over memory BIOs; the client's SSLObject."""
    c_in, c_out, s_in, s_out = ssl.MemoryBIO(), ssl.MemoryBIO(), ssl.MemoryBIO(), ssl.MemoryBIO()
    client = client_ctx.wrap_bio(c_in, c_out, server_hostname=sni)
    server = server_ctx.wrap_bio(s_in, s_out, server_side=True)
    done = {"client": False, "server": False}
    for _ in range(20):
        for side, obj in (("client", client), ("server", server)):
            if done[side]:
                continue
            try:
                obj.do_handshake()
                done[side] = True
            except ssl.SSLWantReadError:
                pass
            except ssl.SSLError:
                if side == "client":
                    raise
                # The server side fails after the client's alert; the client's error is the finding.
                done[side] = True
        s_in.write(c_out.read())
        c_in.write(s_out.read())
        if all(done.values()):
            return client
    raise AssertionError("the handshake did not finish")


def sans(client: ssl.SSLObject) -> set[str]:
    cert = client.getpeercert()
    assert cert
    pairs = cert["subjectAltName"]
    assert isinstance(pairs, tuple)
    return {str(pair[1]) for pair in pairs if pair[0] == "DNS"}


def mode(path: Path) -> int:
    return stat.S_IMODE(path.stat().st_mode)


# -- handshakes -------------------------------------------------------------------------------------------


@pytest.mark.parametrize("name", ["app.test", "my-app.localhost", "a.b.test", "x" * 63 + ".test"])
def test_a_client_trusting_only_the_ca_verifies_dev_names(ca: DevCA, name: str) -> None:
    client = handshake(ca.server_context(), client_context(ca.ca_path), name)
    assert client.selected_alpn_protocol() == "http/1.1"
    assert sans(client) == {name, "*.test", "*.localhost"}


def test_a_long_name_without_a_common_name_still_verifies(ca: DevCA) -> None:
    name = ".".join(["a" * 60] * 4) + ".test"  # 249 characters: no CN fits, the SAN carries it
    assert dev_name_problem(name) is None
    client = handshake(ca.server_context(), client_context(ca.ca_path), name)
    assert name in sans(client)


def test_sni_for_another_name_gets_the_wildcard_and_the_client_refuses_it(ca: DevCA) -> None:
    with pytest.raises(ssl.SSLCertVerificationError, match=r"example\.com"):
        handshake(ca.server_context(), client_context(ca.ca_path), "example.com")


def test_no_sni_keeps_the_wildcard_leaf(ca: DevCA) -> None:
    ctx = client_context(ca.ca_path)
    ctx.check_hostname = False
    client = handshake(ca.server_context(), ctx, None)
    assert sans(client) == {"*.test", "*.localhost"}
    assert client.selected_alpn_protocol() == "http/1.1"


def test_the_ca_cannot_vouch_for_names_outside_test_and_localhost(ca: DevCA) -> None:
    # Even a certificate the CA signs for example.com is refused: its NameConstraints permit test and localhost.
    cert = tls._issue_leaf(ca._ca_cert, ca._ca_key, ca._leaf_key, ["example.com"])
    with pytest.raises(ssl.SSLCertVerificationError, match="subtree"):
        handshake(ca._context(tls._cert_pem(cert)), client_context(ca.ca_path), "example.com")


def test_the_server_context_is_tls12_or_later(ca: DevCA) -> None:
    ctx = ca.server_context()
    assert ctx.minimum_version == ssl.TLSVersion.TLSv1_2
    assert ctx.sni_callback is not None


def test_per_name_contexts_are_cached_least_recently_used_first_out(ca: DevCA,
                                                                    monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(tls, "NAME_CACHE", 2)
    a = ca.context_for("a.test")
    assert ca.context_for("a.test") is a
    b = ca.context_for("b.test")
    ca.context_for("a.test")  # a is now the most recent
    ca.context_for("c.test")  # b goes
    assert ca.context_for("a.test") is a
    assert ca.context_for("b.test") is not b


def test_context_for_refuses_a_non_dev_name(ca: DevCA) -> None:
    with pytest.raises(RigdError, match=r"must end in \.test or \.localhost"):
        ca.context_for("example.com")


# -- files ------------------------------------------------------------------------------------------------


def test_files_and_modes(ca: DevCA, tdir: Path) -> None:
    assert mode(tdir) == 0o700
    assert mode(tdir / "ca.key") == 0o600
    assert mode(tdir / "leaf.key") == 0o600
    assert mode(tdir / "leaf.pem") == 0o600
    assert mode(tdir / "ca.pem") == 0o644
    assert (tdir / "ca.pem").read_text() == ca.ca_pem
    assert (tdir / "ca.key").read_bytes().startswith(b"-----BEGIN PRIVATE KEY-----")  # PKCS8
    assert not [p.name for p in tdir.iterdir() if p.name.endswith(".tmp")]


def test_the_ca_is_constrained_and_long_lived(ca: DevCA) -> None:
    from cryptography import x509

    cert = x509.load_pem_x509_certificate(ca.ca_pem.encode())
    basic = cert.extensions.get_extension_for_class(x509.BasicConstraints)
    assert basic.critical and basic.value.ca and basic.value.path_length == 0
    usage = cert.extensions.get_extension_for_class(x509.KeyUsage)
    assert usage.critical and usage.value.key_cert_sign and usage.value.crl_sign
    nc = cert.extensions.get_extension_for_class(x509.NameConstraints)
    assert nc.critical
    assert [n.value for n in nc.value.permitted_subtrees or []] == ["test", "localhost"]
    assert cert.not_valid_after_utc - cert.not_valid_before_utc >= datetime.timedelta(days=3649)
    assert "rigd dev CA" in cert.subject.rfc4514_string()


def test_the_wildcard_leaf(ca: DevCA, tdir: Path) -> None:
    from cryptography import x509
    from cryptography.x509.oid import ExtendedKeyUsageOID

    leaf = x509.load_pem_x509_certificate((tdir / "leaf.pem").read_bytes())
    names = leaf.extensions.get_extension_for_class(x509.SubjectAlternativeName).value
    assert names.get_values_for_type(x509.DNSName) == ["*.test", "*.localhost"]
    eku = leaf.extensions.get_extension_for_class(x509.ExtendedKeyUsage).value
    assert list(eku) == [ExtendedKeyUsageOID.SERVER_AUTH]
    assert leaf.not_valid_after_utc - leaf.not_valid_before_utc <= datetime.timedelta(days=397)
    assert ca.leaf_not_after == leaf.not_valid_after_utc


def test_a_restart_loads_the_same_ca_and_rewrites_nothing(ca: DevCA, tdir: Path) -> None:
    before = {p.name: (p.read_bytes(), p.stat().st_mtime_ns) for p in tdir.iterdir()}
    again = DevCA.load_or_create(tdir)
    assert again.fingerprint == ca.fingerprint
    assert again.ca_pem == ca.ca_pem
    assert {p.name: (p.read_bytes(), p.stat().st_mtime_ns) for p in tdir.iterdir()} == before
    # A certificate minted after the restart verifies against the copy trusted before it.
    handshake(again.server_context(), client_context(cadata=ca.ca_pem), "app.test")


def test_a_leaf_near_expiry_is_minted_again_with_the_same_key(ca: DevCA, tdir: Path,
                                                              monkeypatch: pytest.MonkeyPatch) -> None:
    leaf_key, leaf_pem = (tdir / "leaf.key").read_bytes(), (tdir / "leaf.pem").read_bytes()
    later = datetime.datetime.now(datetime.UTC) + datetime.timedelta(days=380)
    monkeypatch.setattr(tls, "_now", lambda: later)
    again = DevCA.load_or_create(tdir)
    assert (tdir / "leaf.pem").read_bytes() != leaf_pem
    assert (tdir / "leaf.key").read_bytes() == leaf_key
    assert again.fingerprint == ca.fingerprint
    assert again.leaf_not_after > later + datetime.timedelta(days=300)


@pytest.mark.parametrize("key", ["ca.key", "leaf.key"])
def test_a_key_open_to_others_is_refused_naming_it(ca: DevCA, tdir: Path, key: str) -> None:
    os.chmod(tdir / key, 0o644)
    with pytest.raises(RigdError) as err:
        DevCA.load_or_create(tdir)
    assert str(tdir / key) in err.value.message
    assert "chmod 600" in err.value.message
    assert err.value.data["file"] == str(tdir / key)


@pytest.mark.parametrize(("name", "words"), [
    ("ca.pem", "is not a PEM certificate"),
    ("ca.key", "is not an unencrypted PEM private key"),
    ("leaf.key", "is not an unencrypted PEM private key"),
    ("leaf.pem", "is not a PEM certificate"),
])
def test_a_corrupt_file_is_a_clear_error_naming_it(ca: DevCA, tdir: Path, name: str, words: str) -> None:
    (tdir / name).write_bytes(b"-----BEGIN CERTIFICATE-----\nnot base64 at all\n")
    with pytest.raises(RigdError) as err:
        DevCA.load_or_create(tdir)
    assert err.value.message.startswith(f"{tdir / name} {words}")


def test_a_ca_pem_for_another_key_is_refused(ca: DevCA, tdir: Path, tmp_path: Path) -> None:
    other = DevCA.load_or_create(tmp_path / "other")
    (tdir / "ca.pem").write_text(other.ca_pem)
    with pytest.raises(RigdError, match="does not belong to the key"):
        DevCA.load_or_create(tdir)


def test_a_lost_ca_key_is_an_error_not_a_new_ca(ca: DevCA, tdir: Path) -> None:
    (tdir / "ca.key").unlink()
    with pytest.raises(RigdError, match=r"ca\.key is missing"):
        DevCA.load_or_create(tdir)
    assert (tdir / "ca.pem").read_text() == ca.ca_pem


def test_a_lost_ca_pem_is_issued_again_from_the_key_and_old_copies_still_verify(ca: DevCA,
                                                                               tdir: Path) -> None:
    (tdir / "ca.pem").unlink()
    again = DevCA.load_or_create(tdir)
    assert (tdir / "ca.pem").exists()
    handshake(again.server_context(), client_context(cadata=ca.ca_pem), "app.test")


def test_without_cryptography_there_is_no_ca_and_a_reason(tdir: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setitem(sys.modules, "cryptography", None)
    got, reason = load_dev_ca(tdir)
    assert got is None
    assert reason is not None and "cryptography" in reason
    assert not tdir.exists()


def test_the_module_imports_without_cryptography() -> None:
    code = ("import sys; sys.modules['cryptography'] = None; import rigd.ports.tls as t; "
            "assert t.load_dev_ca(t.Path('/nonexistent/x')).ca is None")
    subprocess.run([sys.executable, "-c", code], check=True, cwd=Path(__file__).parents[2])


def test_load_dev_ca_makes_and_returns_the_ca(tdir: Path) -> None:
    got, reason = load_dev_ca(tdir)
    assert reason is None and got is not None
    assert got.fingerprint == DevCA.load_or_create(tdir).fingerprint
    assert len(got.fingerprint.split(":")) == 32


# -- names ------------------------------------------------------------------------------------------------


@pytest.mark.parametrize("name", ["app.test", "my-app.localhost", "a.b.test", "a1.test", "xn--bcher-kva.test",
                                  "x" * 63 + ".test", "0.localhost"])
def test_dev_names(name: str) -> None:
    assert dev_name_problem(name) is None
    assert is_dev_name(name)


@pytest.mark.parametrize(("name", "words"), [
    ("App.test", "upper case"),
    ("a.test\r\nX: y", "control characters ('\\n', '\\r')"),
    ("a\x7f.test", "control characters"),
    ("a..test", "empty label"),
    (".test", "empty label"),
    ("app.test.", "empty label"),
    ("x" * 64 + ".test", "longer than 63 characters"),
    ("test", "needs a name before .test"),
    ("localhost", "needs a name before .localhost"),
    ("app.example", "must end in .test or .localhost"),
    ("app.test.com", "must end in .test or .localhost"),
    ("-a.test", "starts or ends with '-'"),
    ("a-.test", "starts or ends with '-'"),
    ("bücher.test", "outside ASCII"),
    ("a_b.test", "'_'"),
    ("a b.test", "' '"),
    ("", "empty"),
    (".".join(["a" * 63] * 4) + ".test", "longer than 253 characters"),
    (5, "must be a string"),
])
def test_dev_name_problems(name: object, words: str) -> None:
    problem = dev_name_problem(name)
    assert problem is not None and words in problem
    assert not is_dev_name(name)


# -- rigd ca -------------------------------------------------------------------------------------------


def test_rigd_ca_never_makes_a_ca_on_the_client_side(tmp_path: Path, capsys: pytest.CaptureFixture[str],
                                                     monkeypatch: pytest.MonkeyPatch) -> None:
    """`rigd ca` prints the CA of the server it talks to (tests/integration/test_dev_ca.py); with
    no server to talk to it says so, and writes nothing (it once made a CA of its own here)."""
    monkeypatch.delenv("RIGD_URL", raising=False)
    monkeypatch.delenv("RIGD_TOKEN", raising=False)
    assert cli_main(["ca", "--data-dir", str(tmp_path)]) == 2
    out, err = capsys.readouterr()
    assert out == "" and "no server URL" in err and "Traceback" not in err
    assert list(tmp_path.iterdir()) == []
