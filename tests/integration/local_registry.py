"""A real OCI registry on loopback for the tests: Debian's ``docker-registry`` (the CNCF
distribution registry), plain, with basic auth (htpasswd) or behind a small token server
(the ``WWW-Authenticate: Bearer`` dance, JWTs signed ES256 with an x5c chain the registry
trusts); images written as OCI layouts here and pushed with ``skopeo``. Every process
started is killed by its pid on the way out."""

from __future__ import annotations

import base64
import contextlib
import datetime
import gzip
import hashlib
import io
import json
import os
import secrets
import shutil
import signal
import socket
import ssl
import subprocess
import tarfile
import threading
import time
import urllib.error
import urllib.parse
import urllib.request
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.hazmat.primitives.asymmetric.utils import decode_dss_signature
from cryptography.x509.oid import NameOID

REGISTRY = shutil.which("docker-registry") or "/usr/bin/docker-registry"
SKOPEO = shutil.which("skopeo") or "/usr/bin/skopeo"
USER, PASSWORD = "rigd-test", "s3cret-" + "9" * 8
SERVICE, ISSUER = "rigd-test-registry", "rigd-test-issuer"

MT_MANIFEST = "application/vnd.oci.image.manifest.v1+json"
MT_INDEX = "application/vnd.oci.image.index.v1+json"
MT_CONFIG = "application/vnd.oci.image.config.v1+json"
MT_LAYER = "application/vnd.oci.image.layer.v1.tar+gzip"


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


# --- layers and layouts ------------------------------------------------------------------


@dataclass(frozen=True)
class Entry:
    """One tar member: a file (``data``), a directory, a symlink (``link``) or a whiteout."""

    name: str
    data: bytes = b""
    kind: str = "file"  # file, dir, symlink
    link: str = ""
    mode: int = 0o644


def layer_tar(entries: Sequence[Entry]) -> bytes:
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w", format=tarfile.PAX_FORMAT) as tar:
        for e in entries:
            info = tarfile.TarInfo(e.name)
            info.mtime = 1_700_000_000
            if e.kind == "dir":
                info.type, info.mode = tarfile.DIRTYPE, 0o755
                tar.addfile(info)
            elif e.kind == "symlink":
                info.type, info.linkname, info.mode = tarfile.SYMTYPE, e.link, 0o777
                tar.addfile(info)
            else:
                info.size, info.mode = len(e.data), e.mode
                tar.addfile(info, io.BytesIO(e.data))
    return buf.getvalue()


@dataclass
class Layout:
    """An OCI layout being written: blobs by digest, and ``index.json`` entries by tag."""

    root: Path
    refs: list[dict[str, Any]] = field(default_factory=list)

    def __post_init__(self) -> None:
        (self.root / "blobs" / "sha256").mkdir(parents=True, exist_ok=True)
        (self.root / "oci-layout").write_text('{"imageLayoutVersion":"1.0.0"}')

    def blob(self, data: bytes, media_type: str) -> dict[str, Any]:
        digest = "sha256:" + hashlib.sha256(data).hexdigest()
        (self.root / "blobs" / "sha256" / digest[7:]).write_bytes(data)
        return {"mediaType": media_type, "digest": digest, "size": len(data)}

    def image(self, layers: Sequence[bytes], *, arch: str = "amd64", label: str = "") -> dict[str, Any]:
        """A manifest of gzip ``layers`` (uncompressed tars); its descriptor."""
        descs, diff_ids = [], []
        for raw in layers:
            diff_ids.append("sha256:" + hashlib.sha256(raw).hexdigest())
            descs.append(self.blob(gzip.compress(raw, mtime=0), MT_LAYER))
        config = {"architecture": arch, "os": "linux", "rootfs": {"type": "layers", "diff_ids": diff_ids},
                  "config": {"Labels": {"test": label}} if label else {}}
        cdesc = self.blob(json.dumps(config, sort_keys=True).encode(), MT_CONFIG)
        manifest = {"schemaVersion": 2, "mediaType": MT_MANIFEST, "config": cdesc, "layers": descs}
        desc = self.blob(json.dumps(manifest, sort_keys=True).encode(), MT_MANIFEST)
        return {**desc, "platform": {"architecture": arch, "os": "linux"}}

    def extend(self, base: Path, digest: str, layers: Sequence[bytes]) -> dict[str, Any]:
        """A manifest of another layout's image (``base``, manifest ``digest``) with gzip
        ``layers`` on top: the base's blobs are linked in, not copied; its descriptor."""
        def blob_of(d: str) -> Path:
            return base / "blobs" / "sha256" / d.removeprefix("sha256:")

        manifest = json.loads(blob_of(digest).read_bytes())
        config = json.loads(blob_of(manifest["config"]["digest"]).read_bytes())
        for desc in manifest["layers"]:
            target = self.root / "blobs" / "sha256" / desc["digest"].removeprefix("sha256:")
            if not target.exists():
                target.symlink_to(blob_of(desc["digest"]))
        for raw in layers:
            config["rootfs"]["diff_ids"].append("sha256:" + hashlib.sha256(raw).hexdigest())
            manifest["layers"].append(self.blob(gzip.compress(raw, mtime=0), MT_LAYER))
        manifest["config"] = self.blob(json.dumps(config, sort_keys=True).encode(), MT_CONFIG)
        desc = self.blob(json.dumps(manifest, sort_keys=True).encode(), MT_MANIFEST)
        return {**desc, "platform": {"architecture": "amd64", "os": "linux"}}

    def index(self, manifests: Sequence[dict[str, Any]]) -> dict[str, Any]:
        doc = {"schemaVersion": 2, "mediaType": MT_INDEX, "manifests": list(manifests)}
        return self.blob(json.dumps(doc, sort_keys=True).encode(), MT_INDEX)

    def tag(self, desc: dict[str, Any], tag: str) -> None:
        entry = {k: v for k, v in desc.items() if k in ("mediaType", "digest", "size")}
        self.refs.append({**entry, "annotations": {"org.opencontainers.image.ref.name": tag}})
        doc = {"schemaVersion": 2, "mediaType": MT_INDEX, "manifests": self.refs}
        (self.root / "index.json").write_text(json.dumps(doc))


# --- the token server ----------------------------------------------------------------------


def _b64url(data: bytes) -> str:
    return base64.urlsafe_b64encode(data).rstrip(b"=").decode()


@dataclass
class TokenServer:
    """``GET /token?service&scope`` → a JWT granting the scope to ``USER`` (basic auth) or, for
    pulls, to anyone when ``anonymous_pull``. Every request is kept."""

    workdir: Path
    anonymous_pull: bool = False
    requests: list[dict[str, Any]] = field(default_factory=list)

    def __post_init__(self) -> None:
        self.key = ec.generate_private_key(ec.SECP256R1())
        name = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, "rigd test token signer")])
        now = datetime.datetime.now(datetime.UTC)
        self.cert = (x509.CertificateBuilder().subject_name(name).issuer_name(name)
                     .public_key(self.key.public_key()).serial_number(x509.random_serial_number())
                     .not_valid_before(now - datetime.timedelta(days=1))
                     .not_valid_after(now + datetime.timedelta(days=30))
                     .add_extension(x509.BasicConstraints(ca=True, path_length=None), critical=True)
                     .sign(self.key, hashes.SHA256()))
        self.cert_path = self.workdir / "token-signer.pem"
        self.cert_path.write_bytes(self.cert.public_bytes(serialization.Encoding.PEM))
        self.httpd = ThreadingHTTPServer(("127.0.0.1", 0), self._handler())
        threading.Thread(target=self.httpd.serve_forever, daemon=True).start()
        self.realm = f"http://127.0.0.1:{self.httpd.server_address[1]}/token"

    def jwt(self, subject: str, access: list[dict[str, Any]]) -> str:
        now = int(time.time())
        header = {"typ": "JWT", "alg": "ES256",
                  "x5c": [base64.b64encode(self.cert.public_bytes(serialization.Encoding.DER)).decode()]}
        claims = {"iss": ISSUER, "sub": subject, "aud": SERVICE, "exp": now + 300, "nbf": now - 10,
                  "iat": now, "jti": secrets.token_hex(8), "access": access}
        signing = f"{_b64url(json.dumps(header).encode())}.{_b64url(json.dumps(claims).encode())}"
        r, s = decode_dss_signature(self.key.sign(signing.encode(), ec.ECDSA(hashes.SHA256())))
        return f"{signing}.{_b64url(r.to_bytes(32, 'big') + s.to_bytes(32, 'big'))}"

    def _handler(self) -> type[BaseHTTPRequestHandler]:
        server = self

        class Handler(BaseHTTPRequestHandler):
            def do_GET(self) -> None:
                q = urllib.parse.parse_qs(urllib.parse.urlsplit(self.path).query)
                auth = self.headers.get("Authorization") or ""
                user = None
                if auth.startswith("Basic "):
                    u, _, p = base64.b64decode(auth[6:]).decode().partition(":")
                    user = u if (u, p) == (USER, PASSWORD) else "wrong"
                server.requests.append({"scope": q.get("scope", [""])[0], "user": user})
                if user == "wrong" or (user is None and not server.anonymous_pull):
                    self.send_response(401)
                    self.end_headers()
                    return
                access = []
                for scope in q.get("scope", []):
                    kind, _, rest = scope.partition(":")
                    repo, _, actions = rest.rpartition(":")
                    allowed = [a for a in actions.split(",") if user is not None or a == "pull"]
                    access.append({"type": kind, "name": repo, "actions": allowed})
                body = json.dumps({"token": server.jwt(user or "anonymous", access), "expires_in": 300}).encode()
                self.send_response(200)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                self.wfile.write(body)

            def log_message(self, format: str, *args: Any) -> None:
                pass

        return Handler

    def close(self) -> None:
        self.httpd.shutdown()
        self.httpd.server_close()


# --- the registry --------------------------------------------------------------------------


class LocalRegistry:
    """``docker-registry serve`` on 127.0.0.1 with storage in ``workdir``; ``auth`` is None,
    ``"basic"`` or ``"token"``."""

    def __init__(self, workdir: Path, auth: str | None = None, *, anonymous_pull: bool = False,
                 tls: Any = None) -> None:
        self.workdir = workdir
        self.auth = auth
        self.port = free_port()
        self.host = f"127.0.0.1:{self.port}"
        self.storage = workdir / "storage"
        self.token: TokenServer | None = None
        self.proc: subprocess.Popen[bytes] | None = None
        self.anonymous_pull = anonymous_pull
        #: A ``trustme.CA`` to serve HTTPS with (a leaf for 127.0.0.1), or None for plain HTTP.
        self.tls = tls

    def start(self) -> LocalRegistry:
        self.workdir.mkdir(parents=True, exist_ok=True)
        lines = ["version: 0.1", "log:", "  level: warn", "storage:", "  filesystem:",
                 f"    rootdirectory: {self.storage}", "  delete:", "    enabled: true",
                 "http:", f"  addr: 127.0.0.1:{self.port}", "  secret: " + secrets.token_hex(16)]
        if self.tls is not None:
            leaf = self.tls.issue_cert("127.0.0.1")
            cert, key = self.workdir / "tls.crt", self.workdir / "tls.key"
            cert.write_bytes(b"".join(blob.bytes() for blob in leaf.cert_chain_pems))
            key.write_bytes(leaf.private_key_pem.bytes())
            lines += ["  tls:", f"    certificate: {cert}", f"    key: {key}"]
        if self.auth == "basic":
            htpasswd = self.workdir / "htpasswd"
            out = subprocess.run(["htpasswd", "-Bbn", USER, PASSWORD], capture_output=True, text=True,
                                 check=True, timeout=30)
            htpasswd.write_text(out.stdout)
            lines += ["auth:", "  htpasswd:", "    realm: rigd-test", f"    path: {htpasswd}"]
        elif self.auth == "token":
            self.token = TokenServer(self.workdir, anonymous_pull=self.anonymous_pull)
            lines += ["auth:", "  token:", f"    realm: {self.token.realm}", f"    service: {SERVICE}",
                      f"    issuer: {ISSUER}", f"    rootcertbundle: {self.token.cert_path}"]
        config = self.workdir / "config.yml"
        config.write_text("\n".join(lines) + "\n")
        self.log_path = self.workdir / "registry.log"
        with open(self.log_path, "wb") as log:
            self.proc = subprocess.Popen([REGISTRY, "serve", str(config)], stdout=log, stderr=log,
                                         stdin=subprocess.DEVNULL, start_new_session=True)
        deadline = time.monotonic() + 30
        while True:
            try:
                context = ssl.create_default_context()
                if self.tls is not None:
                    self.tls.configure_trust(context)
                scheme = "https" if self.tls is not None else "http"
                with urllib.request.urlopen(f"{scheme}://{self.host}/v2/", timeout=2,
                                            context=context if self.tls is not None else None):
                    break
            except urllib.error.HTTPError as exc:
                if exc.code == 401:
                    break
                raise
            except OSError as exc:
                if self.proc.poll() is not None or time.monotonic() > deadline:
                    self.stop()
                    raise RuntimeError("docker-registry did not start:\n"
                                       + self.log_path.read_text()[-3000:]) from exc
                time.sleep(0.1)
        return self

    def stop(self) -> None:
        if self.proc is not None:
            with contextlib.suppress(ProcessLookupError):
                os.kill(self.proc.pid, signal.SIGKILL)
            self.proc.wait(timeout=30)
            self.proc = None
        if self.token is not None:
            self.token.close()
            self.token = None

    def push(self, layout: Path, tag: str, repo: str, *, all_platforms: bool = False) -> None:
        """``skopeo copy oci:<layout>:<tag> docker://<this>/<repo>:<tag>``."""
        argv = [SKOPEO, "--insecure-policy", "copy", "--dest-tls-verify=false", "--preserve-digests"]
        if self.auth is not None:
            argv.append(f"--dest-creds={USER}:{PASSWORD}")
        if all_platforms:
            argv.append("--all")
        argv += [f"oci:{layout}:{tag}", f"docker://{self.host}/{repo}:{tag}"]
        out = subprocess.run(argv, capture_output=True, text=True, timeout=300)
        if out.returncode != 0:
            raise RuntimeError(f"skopeo copy failed: {out.stderr.strip()[-2000:]}")

    def blob_file(self, digest: str) -> Path:
        """Where the registry keeps a blob's bytes (its filesystem driver's layout)."""
        hexd = digest.removeprefix("sha256:")
        return self.storage / "docker" / "registry" / "v2" / "blobs" / "sha256" / hexd[:2] / hexd / "data"


@contextlib.contextmanager
def running(workdir: Path, auth: str | None = None, **kw: Any) -> Iterator[LocalRegistry]:
    reg = LocalRegistry(workdir, auth, **kw).start()
    try:
        yield reg
    finally:
        reg.stop()
