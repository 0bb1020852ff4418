"""The credential broker: secrets that the gateway adds to a rig's requests, never given to the guest.

How this works:

* :class:`SecretStore` keeps secrets per workspace in a small SQLite file
  (``<dataDir>/netgate/broker.db``), each value sealed with AES-256-GCM under
  a server key (``<dataDir>/netgate/broker.key``, 32 random bytes, 0600; the
  store refuses a key file that others can read). The associated data binds
  each ciphertext to its workspace, name, header and host patterns, so a
  row edited or moved in the database no longer decrypts.
* A secret is bound to host patterns (the allowlist syntax). :meth:`SecretStore.issue`
  is the only way to a plaintext: it takes the rig's :class:`Policy` and
  refuses — with an error naming the host — a host the rig may not reach.
  No secret is ever issued for a host outside the rig's allowlist.
* :class:`RigCA` is a per-rig certificate authority (EC P-256) made in
  memory when the gateway opens. Its certificate (``cert_pem``) is what the
  guest trusts; its key never leaves the server process. It signs one leaf
  per brokered host, on demand. Only connections to brokered hosts are
  terminated with it; all other TLS passes through untouched.

Secret values are never logged, never put in an audit event, and never in
an exception message.
"""

from __future__ import annotations

import datetime
import json
import os
import re
import sqlite3
import ssl
import stat
import tempfile
import threading
import time
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.hazmat.primitives.ciphers.aead import AESGCM
from cryptography.x509.oid import ExtendedKeyUsageOID, NameOID

from netgate.errors import InvalidField, Refused
from netgate.policy import Policy, normalize_name, pattern_matches, validate_pattern

_HEADER = re.compile(r"^[A-Za-z0-9!#$%&'*+.^_`|~-]{1,64}$")
_NAME = re.compile(r"^[A-Za-z0-9_.-]{1,64}$")
KEY_BYTES = 32


class BrokerRefused(Refused):
    """A secret was asked for a host the rig may not reach."""

    def __init__(self, host: str) -> None:
        super().__init__(f"no secret is issued for {host}: it is not on the rig's egress allowlist")
        self.host = host


@dataclass(frozen=True, slots=True)
class SecretInfo:
    """What may be shown about a secret: everything but its value."""

    workspace: str
    name: str
    hosts: tuple[str, ...]
    header: str
    template: str
    created_at: float


@dataclass(frozen=True, slots=True)
class Injection:
    """Headers to set on a request to a brokered host. ``repr`` hides the values."""

    secret: str  #: the secret's name (safe to log)
    headers: dict[str, str]

    def __repr__(self) -> str:
        return f"Injection(secret={self.secret!r}, headers={sorted(self.headers)!r})"


def _specificity(pattern: str) -> tuple[int, int]:
    return (0 if pattern.startswith("*.") else 1, len(pattern))


class SecretStore:
    """Encrypted per-workspace secrets (synchronous; call it from a worker thread)."""

    def __init__(self, data_dir: Path) -> None:
        self.dir = Path(data_dir) / "netgate"
        self.dir.mkdir(mode=0o700, parents=True, exist_ok=True)
        self._aead = AESGCM(self._load_key(self.dir / "broker.key"))
        self._lock = threading.Lock()
        self._db = sqlite3.connect(self.dir / "broker.db", check_same_thread=False, isolation_level=None)
        os.chmod(self.dir / "broker.db", 0o600)
        self._db.execute("PRAGMA journal_mode=WAL")
        self._db.execute(
            "CREATE TABLE IF NOT EXISTS secrets (workspace TEXT NOT NULL, name TEXT NOT NULL, "
            "hosts TEXT NOT NULL, header TEXT NOT NULL, template TEXT NOT NULL, nonce BLOB NOT NULL, "
            "sealed BLOB NOT NULL, created_at REAL NOT NULL, PRIMARY KEY (workspace, name))")

    @staticmethod
    def _load_key(path: Path) -> bytes:
        try:
            fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
        except FileExistsError:
            st = path.stat()
            if stat.S_IMODE(st.st_mode) & 0o077:
                raise PermissionError(f"{path} is readable by others (mode {stat.S_IMODE(st.st_mode):o}); "
                                      "it must be 0600") from None
            key = path.read_bytes()
            if len(key) != KEY_BYTES:
                raise ValueError(f"{path} is not a {KEY_BYTES}-byte key") from None
            return key
        key = os.urandom(KEY_BYTES)
        with os.fdopen(fd, "wb") as fh:
            fh.write(key)
        return key

    def close(self) -> None:
        with self._lock:
            self._db.close()

    @staticmethod
    def _aad(workspace: str, name: str, hosts: Sequence[str], header: str, template: str) -> bytes:
        return json.dumps(["rigd-broker-v1", workspace, name, list(hosts), header, template]).encode()

    def put(self, workspace: str, name: str, value: str, hosts: Sequence[str], *,
            header: str = "Authorization", template: str = "Bearer {value}") -> SecretInfo:
        """Store (or replace) a secret bound to ``hosts``. Errors name the field, never the value."""
        if not _NAME.match(name):
            raise InvalidField("name", "1-64 characters of letters, digits, '_', '.', '-'")
        if not hosts:
            raise InvalidField("hosts", "a secret must be bound to at least one host pattern")
        patterns = tuple(validate_pattern(h, f"hosts[{i}]") for i, h in enumerate(hosts))
        if not _HEADER.match(header):
            raise InvalidField("header", "must be an HTTP header name")
        if header.lower() in ("host", "content-length", "transfer-encoding", "connection"):
            raise InvalidField("header", f"{header} cannot carry a secret")
        if template.count("{value}") != 1 or any(c in template for c in "\r\n\x00"):
            raise InvalidField("template", "must contain '{value}' exactly once and no line breaks")
        if not value or any(c in value for c in "\r\n\x00"):
            raise InvalidField("value", "must be non-empty and contain no line breaks")
        nonce = os.urandom(12)
        aad = self._aad(workspace, name, patterns, header, template)
        sealed = self._aead.encrypt(nonce, value.encode(), aad)
        now = time.time()
        with self._lock:
            self._db.execute(
                "INSERT OR REPLACE INTO secrets VALUES (?,?,?,?,?,?,?,?)",
                (workspace, name, json.dumps(patterns), header, template, nonce, sealed, now))
        return SecretInfo(workspace, name, patterns, header, template, now)

    def delete(self, workspace: str, name: str) -> bool:
        with self._lock:
            cur = self._db.execute("DELETE FROM secrets WHERE workspace=? AND name=?", (workspace, name))
        return cur.rowcount > 0

    def list(self, workspace: str) -> list[SecretInfo]:
        with self._lock:
            rows = self._db.execute(
                "SELECT name, hosts, header, template, created_at FROM secrets "
                "WHERE workspace=? ORDER BY name",
                (workspace,)).fetchall()
        return [SecretInfo(workspace, n, tuple(json.loads(h)), hd, t, c) for n, h, hd, t, c in rows]

    def bound(self, workspace: str, host: str) -> SecretInfo | None:
        """The secret bound to ``host`` (the most specific pattern wins), without decrypting."""
        norm = normalize_name(host)
        if norm is None:
            return None
        best: tuple[tuple[int, int], SecretInfo] | None = None
        for info in self.list(workspace):
            for p in info.hosts:
                if pattern_matches(p, norm) and (best is None or _specificity(p) > best[0]):
                    best = (_specificity(p), info)
        return best[1] if best else None

    def issue(self, workspace: str, host: str, policy: Policy) -> Injection | None:
        """The headers to inject for a request to ``host`` from a rig under ``policy``.

        Raises :class:`BrokerRefused` (naming the host) when the rig may not
        reach ``host``; returns None when no secret is bound to it.
        """
        if policy.check_name(host) is not None:
            raise BrokerRefused(host)
        info = self.bound(workspace, host)
        if info is None:
            return None
        with self._lock:
            row = self._db.execute("SELECT nonce, sealed FROM secrets WHERE workspace=? AND name=?",
                                   (workspace, info.name)).fetchone()
        if row is None:
            return None
        value = self._aead.decrypt(row[0], row[1], self._aad(workspace, info.name, info.hosts, info.header,
                                                             info.template)).decode()
        return Injection(info.name, {info.header: info.template.replace("{value}", value)})


class RigCA:
    """A per-rig CA for brokered hosts only. The key stays in this process."""

    def __init__(self, rig_id: str, *, days: int = 30) -> None:
        self._key = ec.generate_private_key(ec.SECP256R1())
        now = datetime.datetime.now(datetime.UTC)
        name = x509.Name([x509.NameAttribute(NameOID.ORGANIZATION_NAME, "rigd"),
                          x509.NameAttribute(NameOID.COMMON_NAME,
                                             f"rigd egress broker CA for {rig_id}"[:64])])
        ski = x509.SubjectKeyIdentifier.from_public_key(self._key.public_key())
        self.cert = (
            x509.CertificateBuilder()
            .subject_name(name).issuer_name(name)
            .public_key(self._key.public_key())
            .serial_number(x509.random_serial_number())
            .not_valid_before(now - datetime.timedelta(minutes=5))
            .not_valid_after(now + datetime.timedelta(days=days))
            .add_extension(x509.BasicConstraints(ca=True, path_length=0), critical=True)
            .add_extension(x509.KeyUsage(digital_signature=True, key_cert_sign=True, crl_sign=True,
                                         content_commitment=False, key_encipherment=False,
                                         data_encipherment=False, key_agreement=False,
                                         encipher_only=False, decipher_only=False), critical=True)
            .add_extension(ski, critical=False)
            .sign(self._key, hashes.SHA256())
        )
        self.cert_pem = self.cert.public_bytes(serialization.Encoding.PEM).decode()
        self._leaf_key = ec.generate_private_key(ec.SECP256R1())
        self._contexts: dict[str, ssl.SSLContext] = {}
        self._lock = threading.Lock()

    def leaf_pem(self, host: str) -> tuple[bytes, bytes]:
        """(certificate chain PEM, key PEM) for ``host``."""
        now = datetime.datetime.now(datetime.UTC)
        cert = (
            x509.CertificateBuilder()
            .subject_name(x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, host[:64])]))
            .issuer_name(self.cert.subject)
            .public_key(self._leaf_key.public_key())
            .serial_number(x509.random_serial_number())
            .not_valid_before(now - datetime.timedelta(minutes=5))
            .not_valid_after(now + datetime.timedelta(days=7))
            .add_extension(x509.SubjectAlternativeName([x509.DNSName(host)]), critical=False)
            .add_extension(x509.BasicConstraints(ca=False, path_length=None), critical=True)
            .add_extension(x509.ExtendedKeyUsage([ExtendedKeyUsageOID.SERVER_AUTH]), critical=False)
            .add_extension(x509.AuthorityKeyIdentifier.from_issuer_public_key(self._key.public_key()),
                           critical=False)
            .sign(self._key, hashes.SHA256())
        )
        pem = serialization.Encoding.PEM
        chain = cert.public_bytes(pem) + self.cert.public_bytes(pem)
        key = self._leaf_key.private_bytes(serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8,
                                           serialization.NoEncryption())
        return chain, key

    def server_context(self, host: str) -> ssl.SSLContext:
        """A server-side context presenting a leaf for ``host`` (cached per host), HTTP/1.1 only."""
        with self._lock:
            ctx = self._contexts.get(host)
            if ctx is not None:
                return ctx
        chain, key = self.leaf_pem(host)
        ctx = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
        ctx.minimum_version = ssl.TLSVersion.TLSv1_2
        ctx.set_alpn_protocols(["http/1.1"])
        # The ssl module loads certificates from files only: a private directory, removed at once.
        with tempfile.TemporaryDirectory(prefix="rigd-leaf-") as tmp:
            cert_path, key_path = Path(tmp) / "c.pem", Path(tmp) / "k.pem"
            for path, data in ((cert_path, chain), (key_path, key)):
                fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
                with os.fdopen(fd, "wb") as fh:
                    fh.write(data)
            ctx.load_cert_chain(cert_path, key_path)
        with self._lock:
            if len(self._contexts) > 256:
                self._contexts.clear()
            self._contexts[host] = ctx
        return ctx
