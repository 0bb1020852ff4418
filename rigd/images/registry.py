"""Pulls from OCI registries (the distribution spec), on Trio: references, auth, blobs.

How this works. :func:`parse_reference` turns what a person typed
(``ubuntu:24.04``, ``ghcr.io/org/app@sha256:…``, ``127.0.0.1:5000/t/img:v1``)
into a :class:`Reference`, or refuses it naming the field: only the registry
reference grammar is accepted, so a local path, an archive, a transport
prefix (``docker-archive:``, ``oci:``) or a flag-like string never reaches a
registry or a shell. :class:`RegistryClient` speaks HTTP/1.1 over Trio's own
streams (``h11`` frames the messages; TLS is :class:`trio.SSLStream`), one
connection per request: a pull makes a handful of requests and moves its
bytes in a few large bodies, so a connection pool would buy nothing.

Auth. A request is first made as is; a ``401`` names the scheme in
``WWW-Authenticate``. ``Bearer realm=…,service=…,scope=…`` (Docker Hub, GHCR,
Quay, GitLab, GCR) is answered by asking the realm for a token — with the
registry's credentials as basic auth when there are some, anonymously
otherwise — and retrying with it; tokens are kept per (realm, service,
scope) until shortly before ``expires_in``. ``Basic`` is answered with the
credentials. Credentials are only ever sent over HTTPS, or to a registry the
operator named insecure (``--insecure-registry HOST:PORT``), and never to a
redirect's other host.

Pulls (:meth:`RegistryClient.pull`). A tag is resolved once to the digest of
the manifest bytes the registry served (checked against
``Docker-Content-Digest`` when the registry sends one), so what is booted is
pinned; a digest reference is checked against the bytes. An image index (or
Docker manifest list) picks the host's platform (``linux/amd64``) and the
chosen manifest is checked against its descriptor. Config and layers are
blobs, fetched into the :class:`rigd.images.blobs.BlobStore` (an OCI image layout under the data
directory) only when absent — images that share layers share blobs — each
into ``blobs/sha256/.partial/<hex>`` and renamed into place only after its
size and sha256 match the descriptor; a blob that does not match is deleted
and the pull fails, so nothing unverified is ever kept. A pull interrupted
midway leaves its partial files; the next pull of the blob hashes what is
there and asks for the rest (``Range``), starting over if the registry
answers the whole blob. Blob GETs follow redirects (a registry's CDN) for
pulls only: at most 5, never from HTTPS to plain HTTP, without the
``Authorization`` header once the host changes. Manifests are never
followed anywhere.

Every body is capped: manifests and tokens at 4 MiB, a blob at its
descriptor's size (a registry that sends more is cut off and refused).
Why one module of this size: the distribution spec's client is one protocol (reference
grammar, the auth challenge and its token cache, redirects that drop credentials, pinned
digests) whose parts check each other; the blobs and the OCI layout are their own modules.
"""

from __future__ import annotations

import base64
import contextlib
import hashlib
import json
import logging
import re
import ssl
import time
import urllib.parse
from collections.abc import AsyncIterator, Callable, Iterable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

import h11
import trio

from rigd import __version__
from rigd.errors import FieldError, RigdError, leaves
from rigd.images import oci

if TYPE_CHECKING:
    from rigd.images.blobs import BlobStore

log = logging.getLogger("rigd.images.registry")

#: The platform a pull picks from an image index.
HOST_PLATFORM = ("linux", "amd64")
#: Docker Hub: its reference name and the host that serves its API.
DOCKER_HUB = "docker.io"
DOCKER_HUB_API = "registry-1.docker.io"
#: Manifests and token answers are small; refuse to read a large one.
MAX_DOCUMENT_BYTES = 4 << 20
MAX_HEADER_BYTES = 64 * 1024
MAX_REDIRECTS = 5
READ_CHUNK = 1 << 20
#: Seconds to connect, and the most a read may wait for the next bytes.
CONNECT_TIMEOUT_S = 30.0
IDLE_TIMEOUT_S = 60.0
#: Progress is told at least every this many bytes (and every 0.25 s).
NOTIFY_BYTES = 4 << 20
#: Blobs fetched at once in one pull.
PARALLEL_BLOBS = 3
USER_AGENT = f"rigd/{__version__}"

ACCEPT_MANIFESTS = ", ".join((
    oci.MT_INDEX, oci.MT_MANIFEST,
    "application/vnd.docker.distribution.manifest.list.v2+json",
    "application/vnd.docker.distribution.manifest.v2+json",
))
_INDEX_TYPES = (oci.MT_INDEX, "application/vnd.docker.distribution.manifest.list.v2+json")
_MANIFEST_TYPES = (oci.MT_MANIFEST, "application/vnd.docker.distribution.manifest.v2+json")

#: The annotation naming what a manifest in the store's ``index.json`` was pulled as.
REF_ANNOTATION = "org.opencontainers.image.ref.name"
INDEX_ANNOTATION = "io.rigd.image.index"
PULLED_ANNOTATION = "io.rigd.image.pulled"


class RegistryError(RigdError):
    """A pull failed: the registry refused, answered nonsense, or sent bytes that do not match."""


# --- references ----------------------------------------------------------------------------

_DOMAIN = r"(?:[A-Za-z0-9](?:[A-Za-z0-9-]*[A-Za-z0-9])?)(?:\.(?:[A-Za-z0-9](?:[A-Za-z0-9-]*[A-Za-z0-9])?))*"
_DOMAIN_RE = re.compile(rf"^(?:{_DOMAIN}|\[[0-9A-Fa-f:.]+\])(?::[0-9]{{1,5}})?$")
_COMPONENT_RE = re.compile(r"^[a-z0-9]+(?:(?:[._]|__|-+)[a-z0-9]+)*$")
_TAG_RE = re.compile(r"^[A-Za-z0-9_][A-Za-z0-9_.-]{0,127}$")
_DIGEST_RE = re.compile(r"^sha256:[0-9a-f]{64}$")
#: What marks something other than a registry reference (a transport, an archive).
_TRANSPORTS = ("docker://", "docker-archive:", "oci:", "oci-archive:", "dir:", "docker-daemon:",
               "containers-storage:", "file:", "http://", "https://")
_ARCHIVE_SUFFIXES = (".tar", ".tar.gz", ".tgz", ".tar.zst", ".tar.xz", ".zip", ".qcow2", ".img")
MAX_REFERENCE_CHARS = 512


@dataclass(frozen=True, slots=True)
class Reference:
    """``registry/repository`` with a tag, a digest, or both (the digest wins)."""

    registry: str
    repository: str
    tag: str | None = None
    digest: str | None = None

    @property
    def api_host(self) -> str:
        """The host[:port] whose ``/v2/`` API serves this reference."""
        return DOCKER_HUB_API if self.registry == DOCKER_HUB else self.registry

    @property
    def name(self) -> str:
        return f"{self.registry}/{self.repository}"

    def pinned(self, digest: str) -> Reference:
        return Reference(self.registry, self.repository, self.tag, digest)

    def __str__(self) -> str:
        out = self.name
        if self.tag is not None:
            out += f":{self.tag}"
        if self.digest is not None:
            out += f"@{self.digest}"
        return out


def parse_reference(value: object, field: str = "ref") -> Reference:
    """A registry reference, or a :class:`FieldError` naming ``field`` that says what it is not."""
    if not isinstance(value, str):
        raise FieldError(field, f"must be an image reference (a string), not {type(value).__name__}")
    if not value:
        raise FieldError(field, "must be an image reference such as debian:bookworm")
    if len(value) > MAX_REFERENCE_CHARS:
        raise FieldError(field, f"is longer than {MAX_REFERENCE_CHARS} characters")
    if value != value.strip() or any(c.isspace() or ord(c) < 32 for c in value):
        raise FieldError(field, "must not contain spaces or control characters")
    if value.startswith("-"):
        raise FieldError(field, "must not start with '-' (it would read as an option)")
    if value.startswith(("/", ".", "~")):
        raise FieldError(field, "is a local path; rigd pulls images from registries only "
                                "(push it to a registry, e.g. with skopeo, and name it there)")
    lowered = value.lower()
    for prefix in _TRANSPORTS:
        if lowered.startswith(prefix):
            raise FieldError(field, f"names a transport ({prefix!r}); give a registry reference "
                                    "such as registry.example:5000/team/image:tag")
    rest, digest = value, None
    if "@" in rest:
        rest, digest = rest.split("@", 1)
        if not _DIGEST_RE.match(digest):
            raise FieldError(field, f"{digest!r} is not a sha256 digest (sha256: and 64 lowercase hex)")
    registry = DOCKER_HUB
    first, slash, remainder = rest.partition("/")
    if slash and ("." in first or ":" in first or first == "localhost" or first.startswith("[")):
        if not _DOMAIN_RE.match(first):
            raise FieldError(field, f"{first!r} is not a registry host[:port]")
        registry, rest = first, remainder
    tag = None
    last_slash = rest.rfind("/")
    colon = rest.rfind(":")
    if colon > last_slash:
        rest, tag = rest[:colon], rest[colon + 1:]
        if not _TAG_RE.match(tag):
            raise FieldError(field, f"{tag!r} is not a tag (letters, digits, _ . -; at most 128)")
        if tag.lower().endswith(_ARCHIVE_SUFFIXES):
            raise FieldError(field, f"{value!r} looks like an archive file; rigd pulls from registries only")
    components = rest.split("/")
    if not rest or not all(_COMPONENT_RE.match(c) for c in components):
        raise FieldError(field, f"{rest!r} is not a repository name (lowercase letters, digits and "
                                "separators . _ - between them, parts joined by /)")
    if lowered.endswith(_ARCHIVE_SUFFIXES):
        raise FieldError(field, f"{value!r} looks like an archive file; rigd pulls from registries only")
    if registry == DOCKER_HUB and len(components) == 1:
        rest = f"library/{rest}"
    if tag is None and digest is None:
        tag = "latest"
    return Reference(registry, rest, tag, digest)


# --- credentials -----------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class Credentials:
    username: str
    password: str = field(repr=False)

    def basic(self) -> str:
        raw = f"{self.username}:{self.password}".encode()
        return "Basic " + base64.b64encode(raw).decode()


#: Where ``rigd serve`` looks for registry credentials when not told (``--registry-auth``).
AUTH_FILE = "registry-auth.json"
_HUB_KEYS = ("index.docker.io", "registry-1.docker.io", "registry.hub.docker.com")


def _auth_host(key: str) -> str:
    """A credentials file's registry key as a registry host: docker's config.json writes
    ``https://index.docker.io/v1/`` for Docker Hub and may put a scheme before any host."""
    host = key.strip()
    for scheme in ("https://", "http://"):
        host = host.removeprefix(scheme)
    host = host.split("/", 1)[0].lower()
    return DOCKER_HUB if host in _HUB_KEYS else host


def parse_registry_auth(text: str, where: str = AUTH_FILE) -> dict[str, Credentials]:
    """The credentials of a docker-style ``config.json`` (``{"auths": {host: {"auth":
    base64("user:password")}}}``, or ``username``/``password`` fields instead of ``auth``).
    Errors name the entry, never a secret."""
    try:
        doc = json.loads(text)
    except json.JSONDecodeError as exc:
        raise FieldError(where, f"is not JSON ({exc.msg} at line {exc.lineno})") from None
    auths = doc.get("auths") if isinstance(doc, dict) else None
    if not isinstance(auths, dict):
        raise FieldError(where, 'must be an object with "auths": {"registry.example": {"auth": "…"}}')
    out: dict[str, Credentials] = {}
    for key, entry in auths.items():
        host = _auth_host(str(key))
        name = f"{where}: auths[{str(key)[:80]!r}]"
        if not _DOMAIN_RE.match(host):
            raise FieldError(name, "is not a registry host[:port]")
        if not isinstance(entry, dict):
            raise FieldError(name, 'must be an object with "auth" or "username" and "password"')
        user, password = entry.get("username"), entry.get("password")
        if "auth" in entry:
            try:
                raw = base64.b64decode(str(entry["auth"]), validate=True).decode("utf-8")
            except (ValueError, UnicodeDecodeError):
                raise FieldError(name, '"auth" is not base64 of "user:password"') from None
            user, sep, password = raw.partition(":")
            if not sep:
                raise FieldError(name, '"auth" is not base64 of "user:password"')
        if not isinstance(user, str) or not user or not isinstance(password, str):
            raise FieldError(name, 'needs "auth", or "username" and "password"')
        out[host] = Credentials(user, password)
    return out


def load_registry_auth(path: Path) -> dict[str, Credentials]:
    """:func:`parse_registry_auth` of a file only its owner can read (like ssh's keys)."""
    try:
        mode = path.stat().st_mode
        if mode & 0o077:
            raise FieldError(str(path), f"is readable by others (mode {mode & 0o777:o}); chmod 600 it")
        return parse_registry_auth(path.read_text(encoding="utf-8"), str(path))
    except OSError as exc:
        raise FieldError(str(path), f"cannot be read: {exc.strerror}") from None


@dataclass(slots=True)
class Progress:
    """What a pull has done so far (for the CLI and the page)."""

    reference: str
    total_bytes: int = 0
    done_bytes: int = 0
    #: Bytes already on disk when the pull started (shared or resumed): not fetched.
    reused_bytes: int = 0
    fetched_bytes: int = 0
    started: float = field(default_factory=time.monotonic)
    phase: str = "resolving"

    def to_json(self) -> dict[str, Any]:
        elapsed = max(1e-6, time.monotonic() - self.started)
        rate = self.fetched_bytes / elapsed
        left = max(0, self.total_bytes - self.done_bytes)
        return {"reference": self.reference, "phase": self.phase, "totalBytes": self.total_bytes,
                "doneBytes": self.done_bytes, "reusedBytes": self.reused_bytes,
                "bytesPerSecond": round(rate), "etaSeconds": round(left / rate, 1) if rate > 0 else None}


OnProgress = Callable[[Progress], None]


# --- HTTP/1.1 on Trio ------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class Url:
    scheme: str
    host: str
    port: int
    target: str  # path + query

    @classmethod
    def parse(cls, raw: str) -> Url:
        u = urllib.parse.urlsplit(raw)
        if u.scheme not in ("http", "https") or not u.hostname:
            raise RegistryError(f"{raw!r} is not an http(s) URL")
        try:
            port = u.port or (443 if u.scheme == "https" else 80)
        except ValueError as exc:
            raise RegistryError(f"{raw!r} has a bad port") from exc
        target = (u.path or "/") + (f"?{u.query}" if u.query else "")
        return cls(u.scheme, u.hostname, port, target)

    @property
    def authority(self) -> str:
        host = f"[{self.host}]" if ":" in self.host else self.host
        default = 443 if self.scheme == "https" else 80
        return host if self.port == default else f"{host}:{self.port}"

    def join(self, location: str) -> Url:
        return Url.parse(urllib.parse.urljoin(str(self), location))

    def __str__(self) -> str:
        return f"{self.scheme}://{self.authority}{self.target}"


class Response:
    """A response whose body has not been read yet; read it once, capped."""

    def __init__(self, url: Url, status: int, headers: list[tuple[str, str]], conn: _Connection) -> None:
        self.url = url
        self.status = status
        self.headers = headers
        self._conn = conn

    def header(self, name: str) -> str | None:
        name = name.lower()
        return next((v for k, v in self.headers if k == name), None)

    def all(self, name: str) -> list[str]:
        name = name.lower()
        return [v for k, v in self.headers if k == name]

    async def next_chunk(self) -> bytes | None:
        """The next bytes of the body, or None at its end."""
        return await self._conn.next_data()

    async def read(self, limit: int = MAX_DOCUMENT_BYTES) -> bytes:
        out = bytearray()
        while (data := await self.next_chunk()) is not None:
            out += data
            if len(out) > limit:
                raise RegistryError(f"{self.url.authority} sent more than {limit} bytes for "
                                    f"{self.url.target}")
        return bytes(out)


class _Connection:
    def __init__(self, stream: trio.abc.Stream) -> None:
        self.stream = stream
        self.h11 = h11.Connection(h11.CLIENT, max_incomplete_event_size=MAX_HEADER_BYTES)

    async def send(self, event: Any) -> None:
        data = self.h11.send(event)
        if data:
            await self.stream.send_all(data)

    async def next_event(self) -> Any:
        while True:
            event = self.h11.next_event()
            if event is not h11.NEED_DATA:
                return event
            with trio.fail_after(IDLE_TIMEOUT_S):
                data = await self.stream.receive_some(READ_CHUNK)
            self.h11.receive_data(bytes(data))

    async def next_data(self) -> bytes | None:
        """The next body bytes of the response being read, or None at its end."""
        while True:
            try:
                event = await self.next_event()
            except h11.RemoteProtocolError as exc:
                raise RegistryError(f"the registry broke HTTP/1.1: {exc}") from exc
            except trio.TooSlowError as exc:
                raise RegistryError(f"the registry sent nothing for {IDLE_TIMEOUT_S:g} s") from exc
            except (trio.BrokenResourceError, trio.ClosedResourceError, OSError) as exc:
                raise RegistryError(f"the registry dropped the connection: {exc}") from exc
            if isinstance(event, h11.Data):
                return bytes(event.data)
            if isinstance(event, h11.EndOfMessage):
                return None
            if isinstance(event, h11.ConnectionClosed):
                raise RegistryError("the registry closed the connection before the body ended")


class RegistryClient:
    """Pulls from registries: plain HTTP only for ``insecure`` hosts (``host:port``)."""

    def __init__(self, *, insecure: Iterable[str] = (), credentials: Mapping[str, Credentials] | None = None,
                 ssl_context: ssl.SSLContext | None = None) -> None:
        self.insecure = frozenset(h.lower() for h in insecure)
        self.credentials = dict(credentials or {})
        self.ssl_context = ssl_context or ssl.create_default_context()
        self._tokens: dict[tuple[str, str, str], tuple[str, float]] = {}
        self._auth: dict[tuple[str, str], str] = {}

    # -- one request ---------------------------------------------------------------------------

    def _scheme(self, host: str) -> str:
        return "http" if host.lower() in self.insecure else "https"

    @contextlib.asynccontextmanager
    async def _request(self, method: str, url: Url,
                       headers: list[tuple[str, str]]) -> AsyncIterator[Response]:
        if url.scheme == "http" and url.authority.lower() not in self.insecure:
            raise RegistryError(f"{url.authority} is reached over HTTPS only (plain HTTP is for a registry "
                                "the operator names with --insecure-registry)")
        try:
            with trio.fail_after(CONNECT_TIMEOUT_S):
                tcp = await trio.open_tcp_stream(url.host, url.port)
        except (OSError, trio.TooSlowError) as exc:
            raise RegistryError(f"cannot reach {url.authority}: {exc or 'timed out'}") from exc
        stream: trio.abc.Stream = tcp
        try:
            if url.scheme == "https":
                tls = trio.SSLStream(tcp, self.ssl_context, server_hostname=url.host, https_compatible=True)
                try:
                    with trio.fail_after(CONNECT_TIMEOUT_S):
                        await tls.do_handshake()
                except (trio.BrokenResourceError, ssl.SSLError, trio.TooSlowError) as exc:
                    raise RegistryError(f"TLS with {url.authority} failed: {exc}") from exc
                stream = tls
            conn = _Connection(stream)
            all_headers = [("Host", url.authority), ("User-Agent", USER_AGENT), ("Connection", "close"),
                           *headers]
            try:
                await conn.send(h11.Request(method=method, target=url.target, headers=all_headers))
                await conn.send(h11.EndOfMessage())
                event = await conn.next_event()
            except (trio.BrokenResourceError, trio.ClosedResourceError, OSError) as exc:
                raise RegistryError(f"{url.authority} dropped the connection: {exc}") from exc
            except h11.RemoteProtocolError as exc:
                raise RegistryError(f"{url.authority} broke HTTP/1.1: {exc}") from exc
            except trio.TooSlowError as exc:
                raise RegistryError(f"{url.authority} did not answer within {IDLE_TIMEOUT_S:g} s") from exc
            if not isinstance(event, h11.Response):
                raise RegistryError(f"{url.authority} closed the connection without an answer")
            got = [(k.decode("latin-1").lower(), v.decode("latin-1")) for k, v in event.headers]
            yield Response(url, event.status_code, got, conn)
        finally:
            with trio.CancelScope(shield=True), contextlib.suppress(Exception):
                await trio.aclose_forcefully(stream)

    # -- auth ------------------------------------------------------------------------------------

    async def _token(self, challenge: dict[str, str], creds: Credentials | None, host: str) -> str:
        realm = challenge.get("realm")
        if not realm:
            raise RegistryError(f"{host} asked for a bearer token without naming a realm")
        service, scope = challenge.get("service", ""), challenge.get("scope", "")
        key = (realm, service, scope)
        kept = self._tokens.get(key)
        if kept is not None and kept[1] > time.monotonic():
            return kept[0]
        url = Url.parse(realm)
        query = urllib.parse.urlencode([(k, v) for k, v in (("service", service), ("scope", scope)) if v])
        if query:
            joiner = "&" if "?" in url.target else "?"
            url = Url(url.scheme, url.host, url.port, url.target + joiner + query)
        headers = [("Accept", "application/json")]
        if creds is not None:
            if url.scheme != "https" and url.authority.lower() not in self.insecure:
                raise RegistryError(f"{host}'s token realm {url.authority} is plain HTTP: the credentials "
                                    "are not sent there")
            headers.append(("Authorization", creds.basic()))
        async with self._request("GET", url, headers) as resp:
            body = await resp.read()
            if resp.status != 200:
                raise RegistryError(f"{url.authority} refused a token for {scope or 'the registry'} "
                                    f"(HTTP {resp.status}{': ' + error_text(body) if body else ''})",
                                    status=resp.status)
        try:
            doc = json.loads(body)
        except (json.JSONDecodeError, UnicodeDecodeError) as exc:
            raise RegistryError(f"{url.authority}'s token answer is not JSON") from exc
        token = doc.get("token") or doc.get("access_token") if isinstance(doc, dict) else None
        if not isinstance(token, str) or not token:
            raise RegistryError(f"{url.authority}'s token answer has no token")
        expires = doc.get("expires_in", 60)
        life = float(expires) if isinstance(expires, int | float) and not isinstance(expires, bool) else 60.0
        self._tokens[key] = (token, time.monotonic() + max(0.0, min(life, 3600.0) - 10.0))
        return token

    @contextlib.asynccontextmanager
    async def get(self, ref: Reference, path: str, accept: str, *,
                  follow: bool = False,
                  extra: list[tuple[str, str]] | None = None) -> AsyncIterator[Response]:
        """``GET /v2/<repo>/<path>`` with auth; blob GETs (``follow``) follow redirects."""
        host = ref.api_host
        url = Url.parse(f"{self._scheme(host)}://{host}/v2/{ref.repository}/{path}")
        creds = self.credentials.get(ref.registry) or self.credentials.get(host)
        # What answered this repository's last challenge is sent at once (a pull's blobs
        # then cost no 401 round trip each); a 401 with it asks again.
        auth = self._auth.get((host, ref.repository))
        for attempt in range(2):
            headers = [("Accept", accept), *(extra or [])]
            if auth is not None:
                headers.append(("Authorization", auth))
            redirects = 0
            current = url
            while True:
                async with self._request("GET", current, headers) as resp:
                    if resp.status == 401 and attempt == 0 and current.authority == url.authority:
                        auth = await self._answer(resp, creds, host)
                        self._auth[(host, ref.repository)] = auth
                        break
                    if resp.status in (301, 302, 303, 307, 308) and follow:
                        location = resp.header("location")
                        redirects += 1
                        if not location or redirects > MAX_REDIRECTS:
                            raise RegistryError(f"{host}: too many or empty redirects for {path}")
                        nxt = current.join(location)
                        if current.scheme == "https" and nxt.scheme != "https":
                            raise RegistryError(f"{host} redirected {path} from HTTPS to plain HTTP")
                        if nxt.authority != current.authority:
                            headers = [(k, v) for k, v in headers if k != "Authorization"]
                        current = nxt
                        continue
                    yield resp
                    return
        raise RegistryError(f"{host} still refused {ref.repository} after authenticating (HTTP 401)",
                            status=401)

    async def _answer(self, resp: Response, creds: Credentials | None, host: str) -> str:
        await resp.read(MAX_DOCUMENT_BYTES)
        challenges = [parse_challenge(v) for v in resp.all("www-authenticate")]
        for scheme, params in challenges:
            if scheme == "bearer":
                return "Bearer " + await self._token(params, creds, host)
        for scheme, _params in challenges:
            if scheme == "basic":
                if creds is None:
                    raise RegistryError(f"{host} needs a username and password (basic auth)", status=401)
                if resp.url.scheme != "https" and resp.url.authority.lower() not in self.insecure:
                    raise RegistryError(f"{host} asks for basic auth over plain HTTP; refused")
                return creds.basic()
        raise RegistryError(f"{host} refused the request (HTTP 401) without a scheme rigd speaks", status=401)

    # -- manifests ---------------------------------------------------------------------------------

    async def manifest(self, ref: Reference, which: str) -> tuple[bytes, str, str]:
        """The manifest ``which`` (a tag or digest) as (bytes, media type, digest of the bytes)."""
        async with self.get(ref, f"manifests/{which}", ACCEPT_MANIFESTS) as resp:
            body = await resp.read(MAX_DOCUMENT_BYTES)
            if resp.status != 200:
                raise RegistryError(f"{ref.name}:{which}: HTTP {resp.status} from {ref.api_host}"
                                    f"{': ' + error_text(body) if body else ''}", status=resp.status)
            said = resp.header("docker-content-digest")
            media = (resp.header("content-type") or "").split(";")[0].strip()
        digest = "sha256:" + hashlib.sha256(body).hexdigest()
        if which.startswith("sha256:") and digest != which:
            raise RegistryError(f"{ref.name}@{which}: the registry's manifest hashes to {digest}")
        if said is not None and _DIGEST_RE.match(said) and said != digest:
            raise RegistryError(f"{ref.name}:{which}: the registry says {said} but its bytes hash to "
                                f"{digest}")
        return body, media, digest

    # -- a pull -------------------------------------------------------------------------------------

    async def pull(self, ref: Reference, store: BlobStore, on_progress: OnProgress | None = None) -> Pulled:
        """Pull ``ref`` into ``store``: the pinned manifest digest and what was fetched."""
        progress = Progress(str(ref))
        notify = on_progress or (lambda _p: None)
        notify(progress)
        body, media, digest = await self.manifest(ref, ref.digest or ref.tag or "latest")
        doc = _json_object(body, f"the manifest of {ref}")
        index_digest: str | None = None
        media = str(doc.get("mediaType") or media)
        if media in _INDEX_TYPES or "manifests" in doc:
            index_digest = digest
            await store.put_document(body, digest)
            chosen = pick_platform(doc, str(ref))
            body, media, digest = await self.manifest(ref, chosen.digest)
            if len(body) != chosen.size:
                raise RegistryError(f"{ref}: the {'/'.join(HOST_PLATFORM)} manifest is {len(body)} bytes, "
                                    f"its index says {chosen.size}")
            doc = _json_object(body, f"the {'/'.join(HOST_PLATFORM)} manifest of {ref}")
            media = str(doc.get("mediaType") or media)
        if media not in _MANIFEST_TYPES:
            raise RegistryError(f"{ref}: unsupported manifest media type {media!r}")
        await store.put_document(body, digest)
        manifest = oci.load_manifest(store.root, digest)  # checks media types and descriptors
        blobs = [manifest.config, *manifest.layers]
        progress.total_bytes = sum(b.size for b in blobs)
        progress.phase = "fetching"
        notify(progress)
        fetched: list[str] = []
        limit = trio.Semaphore(PARALLEL_BLOBS)

        async def one(desc: oci.Descriptor) -> None:
            async with limit:
                if await store.fetch(self, ref, desc, progress, notify):
                    fetched.append(desc.digest)

        try:
            async with trio.open_nursery() as nursery:
                for desc in dict.fromkeys(blobs):
                    nursery.start_soon(one, desc)
        except BaseExceptionGroup as group:
            # A blob that failed is the pull's reason; anything else (a cancel, a caller's own
            # exception raised from on_progress) goes up as it is.
            found = list(leaves(group))
            first = next((e for e in found if isinstance(e, RegistryError)), None)
            if first is not None and all(isinstance(e, Exception) for e in found):
                raise first from None
            raise
        pinned = ref.pinned(digest)
        await trio.to_thread.run_sync(store.record, pinned, digest, index_digest)
        progress.phase = "done"
        notify(progress)
        return Pulled(pinned, digest, index_digest, tuple(fetched), progress.total_bytes,
                      progress.fetched_bytes, progress.reused_bytes)


@dataclass(frozen=True, slots=True)
class Pulled:
    reference: Reference
    digest: str
    index_digest: str | None
    fetched: tuple[str, ...]
    total_bytes: int
    fetched_bytes: int
    reused_bytes: int

    def to_json(self) -> dict[str, Any]:
        return {"reference": str(self.reference), "digest": self.digest, "indexDigest": self.index_digest,
                "fetchedBlobs": list(self.fetched), "totalBytes": self.total_bytes,
                "fetchedBytes": self.fetched_bytes, "reusedBytes": self.reused_bytes}


def pick_platform(index: dict[str, Any], what: str) -> oci.Descriptor:
    os_, arch = HOST_PLATFORM
    manifests = index.get("manifests")
    if not isinstance(manifests, list):
        raise RegistryError(f"{what}: an image index without a manifests list")
    for i, m in enumerate(manifests):
        p = m.get("platform") if isinstance(m, dict) else None
        if isinstance(p, dict) and p.get("os") == os_ and p.get("architecture") == arch:
            desc = oci.Descriptor.from_json(m, f"manifests[{i}]")
            if desc.media_type not in _MANIFEST_TYPES:
                raise RegistryError(f"{what}: its {os_}/{arch} entry is a {desc.media_type}, not a manifest")
            return desc
    offered = sorted({f"{m['platform'].get('os')}/{m['platform'].get('architecture')}" for m in manifests
                      if isinstance(m, dict) and isinstance(m.get("platform"), dict)})
    raise RegistryError(f"{what} has no {os_}/{arch} image (it offers {', '.join(offered) or 'none'})")


def _json_object(body: bytes, what: str) -> dict[str, Any]:
    try:
        doc = json.loads(body)
    except (json.JSONDecodeError, UnicodeDecodeError) as exc:
        raise RegistryError(f"{what} is not JSON") from exc
    if not isinstance(doc, dict):
        raise RegistryError(f"{what} is not a JSON object")
    return doc


def error_text(body: bytes) -> str:
    """A registry's error answer, short and printable (``errors[0].message`` when it has one)."""
    try:
        doc = json.loads(body)
        errors = doc.get("errors") if isinstance(doc, dict) else None
        if isinstance(errors, list) and errors and isinstance(errors[0], dict):
            return str(errors[0].get("code", "")) + ": " + str(errors[0].get("message", ""))[:200]
    except (json.JSONDecodeError, UnicodeDecodeError):
        pass
    text = body[:200].decode("utf-8", "replace")
    return "".join(c if c.isprintable() else "?" for c in text)


_CHALLENGE_PARAM = re.compile(r'\s*([A-Za-z0-9_-]+)\s*=\s*(?:"((?:[^"\\]|\\.)*)"|([^,\s]*))\s*,?')


def parse_challenge(value: str) -> tuple[str, dict[str, str]]:
    """``Bearer realm="…",service="…"`` as ("bearer", {realm, service}); the scheme lowercased."""
    scheme, _, rest = value.strip().partition(" ")
    params: dict[str, str] = {}
    pos = 0
    while pos < len(rest):
        m = _CHALLENGE_PARAM.match(rest, pos)
        if m is None or m.end() == pos:
            break
        quoted, bare = m.group(2), m.group(3)
        params[m.group(1).lower()] = re.sub(r"\\(.)", r"\1", quoted) if quoted is not None else (bare or "")
        pos = m.end()
    return scheme.lower(), params
