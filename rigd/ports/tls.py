"""The dev-domain CA: HTTPS for rigs' apps at ``https://<name>.test:<port>/`` and ``<name>.localhost``.

Files, in the directory the server passes (``<dataDir>/rigs/tls/``, mode 0700): ``ca.pem`` (0644) and
``ca.key`` (0600, PKCS8), a self-signed EC P-256 CA whose NameConstraints permit only ``test`` and
``localhost``, so trusting it trusts nothing else; ``leaf.key`` and ``leaf.pem`` (both 0600), the one leaf key
and the wildcard certificate (``*.test``, ``*.localhost``) served when a client sends no usable SNI. Writes
are atomic (temporary file, fsync, rename) under ``.lock``; a key open to group or others is refused.

OpenSSL does not match a wildcard directly below a top-level name (``*.test`` does not cover ``app.test``),
so :meth:`DevCA.server_context` mints, from the SNI name, a certificate for that name (plus both wildcards,
the same leaf key), kept in memory for the last 256 names. The ssl module loads certificates from files
only: each is written with the leaf key to a private temporary directory (0700, files 0600) that is removed
as soon as the context has loaded them.

``cryptography`` is imported lazily: without it :func:`load_dev_ca` says why, and there is no HTTPS lane.
"""

from __future__ import annotations

import collections
import contextlib
import datetime
import fcntl
import logging
import os
import socket
import ssl
import tempfile
import threading
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Final, NamedTuple

from rigd.errors import RigdError
from rigd.ports.names import DEV_SUFFIXES, dev_name_problem

if TYPE_CHECKING:
    from cryptography import x509
    from cryptography.hazmat.primitives.asymmetric import ec
    from cryptography.hazmat.primitives.asymmetric.types import CertificatePublicKeyTypes

log = logging.getLogger("rigd.ports.tls")

CA_CERT: Final = "ca.pem"
CA_KEY: Final = "ca.key"
LEAF_CERT: Final = "leaf.pem"
LEAF_KEY: Final = "leaf.key"
#: The CA's lifetime, and a leaf's (at most 397 days, what browsers accept).
CA_DAYS: Final = 3650
LEAF_DAYS: Final = 397
#: A leaf that expires within this many days is minted again (at load, and per name when served).
RENEW_DAYS: Final = 30
#: Per-name server contexts kept in memory (least recently used dropped first).
NAME_CACHE: Final = 256
#: The SANs every leaf carries.
WILDCARDS: Final[tuple[str, ...]] = tuple(f"*.{suffix}" for suffix in DEV_SUFFIXES)


def tls_dir(data_dir: Path) -> Path:
    """Where the server keeps the dev CA: ``<dataDir>/rigs/tls``."""
    return data_dir / "rigs" / "tls"


def tls_unavailable() -> str | None:
    """Why certificates cannot be minted here (``cryptography`` is missing), or None when they can."""
    try:
        import cryptography.x509  # noqa: F401
        from cryptography.hazmat.primitives.asymmetric import ec  # noqa: F401
    except ImportError as exc:
        return f"the Python package cryptography cannot be imported ({exc}); there is no HTTPS lane"
    return None


class DevCALoad(NamedTuple):
    """What :func:`load_dev_ca` found: a CA, or None and why not."""

    ca: DevCA | None
    reason: str | None


def load_dev_ca(directory: Path) -> DevCALoad:
    """The dev CA in ``directory`` (made when absent); ``(None, reason)`` when ``cryptography`` is missing.

    Files that are unreadable, corrupt or open to others raise :class:`RigdError` naming the file.
    """
    reason = tls_unavailable()
    if reason is not None:
        return DevCALoad(None, reason)
    return DevCALoad(DevCA.load_or_create(directory), None)


def _now() -> datetime.datetime:
    return datetime.datetime.now(datetime.UTC)


class DevCA:
    """The CA and leaf key of :mod:`rigd.ports.tls`; build one with :meth:`load_or_create`."""

    def __init__(self, directory: Path, ca_cert: x509.Certificate, ca_key: ec.EllipticCurvePrivateKey,
                 leaf_cert: x509.Certificate, leaf_key: ec.EllipticCurvePrivateKey) -> None:
        self.directory = directory
        self._ca_cert = ca_cert
        self._ca_key = ca_key
        self._leaf_cert = leaf_cert
        self._leaf_key = leaf_key
        self._lock = threading.Lock()
        self._names: collections.OrderedDict[str, tuple[ssl.SSLContext, datetime.datetime]] = (
            collections.OrderedDict())

    # -- loading --------------------------------------------------------------------------------------

    @classmethod
    def load_or_create(cls, directory: Path) -> DevCA:
        """Load the CA and leaf from ``directory``, making what is missing; re-mint a leaf near its expiry.

        A missing ``ca.pem`` is issued again from ``ca.key`` (same key and, while the host name holds, same
        name, so a trusted copy still verifies); a missing ``ca.key`` beside a ``ca.pem`` is an error.
        ``.lock`` (flock) keeps a server and ``rigd ca`` from making two CAs at once.
        """
        _make_dir(directory)
        with _locked(directory):
            ca_cert_path, ca_key_path = directory / CA_CERT, directory / CA_KEY
            leaf_cert_path, leaf_key_path = directory / LEAF_CERT, directory / LEAF_KEY
            if not ca_key_path.exists():
                if ca_cert_path.exists():
                    raise RigdError(
                        f"{ca_key_path} is missing, so the CA in {ca_cert_path} cannot sign: restore it, "
                        f"or remove {ca_cert_path} too to make a new CA (and trust the new one)",
                        file=str(ca_key_path), reason="missing")
                ca_key = _new_key()
                _write(ca_key_path, _key_pem(ca_key), 0o600)
                ca_cert = _issue_ca(ca_key)
                _write(ca_cert_path, _cert_pem(ca_cert), 0o644)
                log.info("made the dev CA in %s", directory)
            else:
                ca_key = _read_key(ca_key_path, "restore it, or remove it and "
                                   f"{ca_cert_path} to make a new CA (and trust the new one)")
                if ca_cert_path.exists():
                    ca_cert = _read_cert(ca_cert_path, "remove it to issue it again from ca.key")
                    _check_ca(ca_cert_path, ca_cert, ca_key)
                else:
                    ca_cert = _issue_ca(ca_key)
                    _write(ca_cert_path, _cert_pem(ca_cert), 0o644)
                    log.info("issued %s again from %s", ca_cert_path, ca_key_path)
            if leaf_key_path.exists():
                leaf_key = _read_key(leaf_key_path, "remove it to make a new one")
            else:
                leaf_key = _new_key()
                _write(leaf_key_path, _key_pem(leaf_key), 0o600)
            leaf_cert: x509.Certificate | None = None
            if leaf_cert_path.exists():
                leaf_cert = _read_cert(leaf_cert_path, "remove it to mint a new one")
                if not _leaf_is_current(leaf_cert, ca_cert, leaf_key):
                    leaf_cert = None
            if leaf_cert is None:
                leaf_cert = _issue_leaf(ca_cert, ca_key, leaf_key, WILDCARDS)
                _write(leaf_cert_path, _cert_pem(leaf_cert), 0o600)
                log.info("minted the wildcard leaf %s (until %s)", leaf_cert_path,
                         leaf_cert.not_valid_after_utc.date())
        return cls(directory, ca_cert, ca_key, leaf_cert, leaf_key)

    # -- what it shows --------------------------------------------------------------------------------

    @property
    def ca_pem(self) -> str:
        """The CA certificate, PEM (what a person trusts; never the key)."""
        return _cert_pem(self._ca_cert).decode()

    @property
    def ca_path(self) -> Path:
        return self.directory / CA_CERT

    @property
    def fingerprint(self) -> str:
        """SHA-256 of the CA certificate, as ``openssl x509 -fingerprint -sha256`` prints it."""
        from cryptography.hazmat.primitives import hashes

        return ":".join(f"{b:02X}" for b in self._ca_cert.fingerprint(hashes.SHA256()))

    @property
    def leaf_not_after(self) -> datetime.datetime:
        """When the wildcard leaf expires (UTC)."""
        return self._leaf_cert.not_valid_after_utc

    # -- serving --------------------------------------------------------------------------------------

    def server_context(self) -> ssl.SSLContext:
        """A server context (TLS 1.2+, ALPN ``http/1.1``) presenting the wildcard leaf by default.

        Its ``sni_callback`` switches a connection to :meth:`context_for` its SNI name when that is a dev
        name; a missing or other SNI keeps the wildcard leaf (which a client checking the name refuses).
        """
        ctx = self._context(_cert_pem(self._leaf_cert))
        ctx.sni_callback = self._on_sni
        return ctx

    def context_for(self, name: str) -> ssl.SSLContext:
        """A server context presenting a certificate for the dev name ``name`` (minted once, then cached)."""
        problem = dev_name_problem(name)
        if problem is not None:
            raise RigdError(f"{name!r} is not a dev name: it {problem}", name=name, reason=problem)
        renew = _now() + datetime.timedelta(days=RENEW_DAYS)
        with self._lock:
            hit = self._names.get(name)
            if hit is not None and hit[1] > renew:
                self._names.move_to_end(name)
                return hit[0]
            cert = _issue_leaf(self._ca_cert, self._ca_key, self._leaf_key, (name, *WILDCARDS))
            ctx = self._context(_cert_pem(cert))
            self._names[name] = (ctx, cert.not_valid_after_utc)
            self._names.move_to_end(name)
            while len(self._names) > NAME_CACHE:
                self._names.popitem(last=False)
            return ctx

    def _on_sni(self, conn: ssl.SSLObject | ssl.SSLSocket, server_name: str | None,
                _ctx: ssl.SSLContext) -> int | None:
        if server_name is None:
            return None
        name = server_name.lower()
        if dev_name_problem(name) is not None:
            return None
        try:
            conn.context = self.context_for(name)
        except Exception:  # a failed mint keeps the wildcard leaf rather than killing the handshake
            log.exception("cannot mint a certificate for %s", name)
        return None

    def _context(self, chain_pem: bytes) -> ssl.SSLContext:
        ctx = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
        ctx.minimum_version = ssl.TLSVersion.TLSv1_2
        ctx.set_alpn_protocols(["http/1.1"])
        with tempfile.TemporaryDirectory(prefix="rigd-devtls-") as tmp:  # mkdtemp: mode 0700
            cert_path, key_path = Path(tmp) / "cert.pem", Path(tmp) / "key.pem"
            for path, data in ((cert_path, chain_pem), (key_path, _key_pem(self._leaf_key))):
                fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
                with os.fdopen(fd, "wb") as fh:
                    fh.write(data)
            ctx.load_cert_chain(cert_path, key_path)
        return ctx


# -- certificates ---------------------------------------------------------------------------------------


def _new_key() -> ec.EllipticCurvePrivateKey:
    from cryptography.hazmat.primitives.asymmetric import ec

    return ec.generate_private_key(ec.SECP256R1())


def _key_pem(key: ec.EllipticCurvePrivateKey) -> bytes:
    from cryptography.hazmat.primitives import serialization

    return key.private_bytes(serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8,
                             serialization.NoEncryption())


def _cert_pem(cert: x509.Certificate) -> bytes:
    from cryptography.hazmat.primitives import serialization

    return cert.public_bytes(serialization.Encoding.PEM)


def _spki(public: CertificatePublicKeyTypes) -> bytes:
    from cryptography.hazmat.primitives import serialization

    return public.public_bytes(serialization.Encoding.DER, serialization.PublicFormat.SubjectPublicKeyInfo)


def _ca_name() -> x509.Name:
    from cryptography import x509
    from cryptography.x509.oid import NameOID

    host = socket.gethostname() or "localhost"
    cn = f"rigd dev CA ({host[:64 - len('rigd dev CA ()')]})"
    return x509.Name([x509.NameAttribute(NameOID.ORGANIZATION_NAME, "rigd"),
                      x509.NameAttribute(NameOID.COMMON_NAME, cn)])


def _issue_ca(ca_key: ec.EllipticCurvePrivateKey) -> x509.Certificate:
    from cryptography import x509
    from cryptography.hazmat.primitives import hashes

    name = _ca_name()
    start = _now() - datetime.timedelta(hours=1)
    return (
        x509.CertificateBuilder()
        .subject_name(name).issuer_name(name)
        .public_key(ca_key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(start)
        .not_valid_after(start + datetime.timedelta(days=CA_DAYS))
        .add_extension(x509.BasicConstraints(ca=True, path_length=0), critical=True)
        .add_extension(x509.KeyUsage(digital_signature=False, content_commitment=False,
                                     key_encipherment=False, data_encipherment=False, key_agreement=False,
                                     key_cert_sign=True, crl_sign=True, encipher_only=False,
                                     decipher_only=False), critical=True)
        .add_extension(x509.NameConstraints(
            permitted_subtrees=[x509.DNSName(suffix) for suffix in DEV_SUFFIXES], excluded_subtrees=None),
            critical=True)
        .add_extension(x509.SubjectKeyIdentifier.from_public_key(ca_key.public_key()), critical=False)
        .sign(ca_key, hashes.SHA256())
    )


def _issue_leaf(ca_cert: x509.Certificate, ca_key: ec.EllipticCurvePrivateKey,
                leaf_key: ec.EllipticCurvePrivateKey, names: Sequence[str]) -> x509.Certificate:
    from cryptography import x509
    from cryptography.hazmat.primitives import hashes
    from cryptography.x509.oid import ExtendedKeyUsageOID, NameOID

    # The common name is the first SAN when it fits (64 characters); a cut name would break the constraints.
    subject = [x509.NameAttribute(NameOID.ORGANIZATION_NAME, "rigd dev")]
    if len(names[0]) <= 64:
        subject.append(x509.NameAttribute(NameOID.COMMON_NAME, names[0]))
    start = _now() - datetime.timedelta(hours=1)
    return (
        x509.CertificateBuilder()
        .subject_name(x509.Name(subject))
        .issuer_name(ca_cert.subject)
        .public_key(leaf_key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(start)
        .not_valid_after(start + datetime.timedelta(days=LEAF_DAYS))
        .add_extension(x509.SubjectAlternativeName([x509.DNSName(n) for n in dict.fromkeys(names)]),
                       critical=False)
        .add_extension(x509.BasicConstraints(ca=False, path_length=None), critical=True)
        .add_extension(x509.KeyUsage(digital_signature=True, content_commitment=False,
                                     key_encipherment=False, data_encipherment=False, key_agreement=False,
                                     key_cert_sign=False, crl_sign=False, encipher_only=False,
                                     decipher_only=False), critical=True)
        .add_extension(x509.ExtendedKeyUsage([ExtendedKeyUsageOID.SERVER_AUTH]), critical=False)
        .add_extension(x509.SubjectKeyIdentifier.from_public_key(leaf_key.public_key()), critical=False)
        .add_extension(x509.AuthorityKeyIdentifier.from_issuer_public_key(ca_key.public_key()),
                       critical=False)
        .sign(ca_key, hashes.SHA256())
    )


def _check_ca(path: Path, cert: x509.Certificate, key: ec.EllipticCurvePrivateKey) -> None:
    from cryptography import x509

    if _spki(cert.public_key()) != _spki(key.public_key()):
        raise RigdError(f"{path} does not belong to the key in {path.with_name(CA_KEY)}: restore the pair, "
                        f"or remove {path} to issue it again from the key",
                        file=str(path), reason="does not match ca.key")
    try:
        basic = cert.extensions.get_extension_for_class(x509.BasicConstraints).value
    except x509.ExtensionNotFound:
        basic = None
    if basic is None or not basic.ca:
        raise RigdError(f"{path} is not a CA certificate; remove it to issue it again from the key",
                        file=str(path), reason="not a CA")
    if cert.not_valid_after_utc <= _now() + datetime.timedelta(days=RENEW_DAYS):
        raise RigdError(
            f"the dev CA in {path} expires on {cert.not_valid_after_utc.date()}: remove it to issue it "
            "again from the key (then trust the new copy)", file=str(path), reason="expires")


def _leaf_is_current(leaf: x509.Certificate, ca_cert: x509.Certificate,
                     leaf_key: ec.EllipticCurvePrivateKey) -> bool:
    """Signed by this CA, for this key, the wildcard names, and not about to expire."""
    from cryptography import x509
    from cryptography.exceptions import InvalidSignature

    try:
        leaf.verify_directly_issued_by(ca_cert)
        sans = leaf.extensions.get_extension_for_class(x509.SubjectAlternativeName).value
    except (ValueError, TypeError, InvalidSignature, x509.ExtensionNotFound):
        return False
    return (_spki(leaf.public_key()) == _spki(leaf_key.public_key())
            and set(sans.get_values_for_type(x509.DNSName)) == set(WILDCARDS)
            and leaf.not_valid_after_utc > _now() + datetime.timedelta(days=RENEW_DAYS))


# -- files ----------------------------------------------------------------------------------------------


def _os_error(verb: str, path: Path, exc: OSError) -> RigdError:
    return RigdError(f"cannot {verb} {path}: {exc.strerror}", file=str(path), reason=str(exc.strerror))


def _make_dir(directory: Path) -> None:
    try:
        directory.parent.mkdir(parents=True, exist_ok=True)
        with contextlib.suppress(FileExistsError):
            directory.mkdir(mode=0o700)
        if not directory.is_dir():
            raise RigdError(f"{directory} is not a directory", file=str(directory), reason="not a directory")
        if directory.stat().st_mode & 0o077:
            os.chmod(directory, 0o700)
    except OSError as exc:
        raise RigdError(f"cannot make the dev CA directory {directory}: {exc.strerror}",
                        file=str(directory), reason=str(exc.strerror)) from None


@contextlib.contextmanager
def _locked(directory: Path) -> Iterator[None]:
    """One process at a time makes or re-mints (``rigd ca`` beside a running server)."""
    path = directory / ".lock"
    try:
        fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o600)
    except OSError as exc:
        raise _os_error("open", path, exc) from None
    try:
        fcntl.flock(fd, fcntl.LOCK_EX)
        yield
    finally:
        os.close(fd)


def _write(path: Path, data: bytes, mode: int) -> None:
    """Write ``path`` atomically with exactly ``mode`` (created 0600: a key is never open to others)."""
    try:
        fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".tmp", dir=path.parent)
    except OSError as exc:
        raise _os_error("write", path, exc) from None
    try:
        with os.fdopen(fd, "wb") as fh:
            os.fchmod(fh.fileno(), mode)
            fh.write(data)
            fh.flush()
            os.fsync(fh.fileno())
        os.replace(tmp, path)
        dfd = os.open(path.parent, os.O_RDONLY)
        try:
            os.fsync(dfd)
        finally:
            os.close(dfd)
    except OSError as exc:
        with contextlib.suppress(OSError):
            os.unlink(tmp)
        raise _os_error("write", path, exc) from None


def _check_private(path: Path) -> None:
    try:
        mode = path.stat().st_mode & 0o777
    except OSError as exc:
        raise _os_error("read", path, exc) from None
    if mode & 0o077:
        raise RigdError(f"{path} is open to group or others (mode {mode:04o}): run `chmod 600 {path}`",
                        file=str(path), reason=f"mode {mode:04o}; chmod 600 it")


def _read(path: Path) -> bytes:
    try:
        return path.read_bytes()
    except OSError as exc:
        raise _os_error("read", path, exc) from None


def _read_key(path: Path, fix: str) -> ec.EllipticCurvePrivateKey:
    from cryptography.exceptions import UnsupportedAlgorithm
    from cryptography.hazmat.primitives import serialization
    from cryptography.hazmat.primitives.asymmetric import ec

    _check_private(path)
    try:
        key = serialization.load_pem_private_key(_read(path), password=None)
    except (ValueError, TypeError, UnsupportedAlgorithm):
        raise RigdError(f"{path} is not an unencrypted PEM private key: {fix}",
                        file=str(path), reason="not a PEM private key") from None
    if not isinstance(key, ec.EllipticCurvePrivateKey):
        raise RigdError(f"{path} is not an EC private key: {fix}", file=str(path), reason="not an EC key")
    return key


def _read_cert(path: Path, fix: str) -> x509.Certificate:
    from cryptography import x509

    try:
        return x509.load_pem_x509_certificate(_read(path))
    except ValueError:
        raise RigdError(f"{path} is not a PEM certificate: {fix}",
                        file=str(path), reason="not a PEM certificate") from None
