"""Browser profiles: what a person's browser keeps between rigs, encrypted at rest.

``rig.open {surface: "browser", profile: NAME}`` keeps the engine's cookies, the local
storage of the origins it visited and its open tabs in a profile of the rig's owner, so a
login made once is there in the next rig. A profile is read from the engine over CDP
(``Storage.getCookies``, ``DOMStorage.getDOMStorageItems``, ``Target.getTargets``), never
copied out of the guest as files, and put back the same way; on the host it is one file,
``<dataDir>/profiles/<ownerId>/<engine>/<name>.rprof`` (0600 in 0700 directories), sealed
with AES-256-GCM under ``<dataDir>/profiles/key`` (0600, made on first use) with the owner,
engine and name as associated data, so a file moved to another owner or name does not
open. Written atomically (temp file, fsync, rename): a crash leaves the last whole save.

Everything in a profile came from a guest, so it is parsed at the edge like any guest
answer (:func:`parse_state`): bounded counts and sizes, typed fields, http(s) tabs only.
"""

from __future__ import annotations

import json
import os
import re
import secrets
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from cryptography.exceptions import InvalidTag
from cryptography.hazmat.primitives.ciphers.aead import AESGCM

from rigd.errors import FieldError, RigdError
from rigd.store.util import sealing_key

PROFILE_NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9._-]{0,63}")
MAGIC = b"RIGDPROF1\n"
#: What one profile may hold (it comes from a hostile guest).
MAX_COOKIES = 3000
MAX_COOKIE_CHARS = 8192
MAX_TABS = 32
MAX_ORIGINS = 200
MAX_ITEMS_PER_ORIGIN = 2000
MAX_STATE_BYTES = 16 * 1024 * 1024
#: The cookie fields ``Storage.setCookies`` takes back (CDP ``Network.CookieParam``).
_COOKIE_STR = ("name", "value", "domain", "path", "sameSite", "priority", "sourceScheme")
_COOKIE_BOOL = ("secure", "httpOnly")
_SAME_SITE = ("Strict", "Lax", "None")
_PRIORITY = ("Low", "Medium", "High")
_SCHEME = ("Unset", "NonSecure", "Secure")


def parse_profile_name(value: object, field_name: str = "profile") -> str:
    if not isinstance(value, str) or not PROFILE_NAME.fullmatch(value):
        raise FieldError(field_name, "must be 1-64 letters, digits, '.', '_' or '-', starting with a "
                                     "letter or digit")
    return value


@dataclass(frozen=True, slots=True)
class ProfileRef:
    """Whose profile, and which."""

    owner: str
    name: str


@dataclass(slots=True)
class ProfileState:
    #: ``Storage.setCookies`` params, checked.
    cookies: list[dict[str, Any]] = field(default_factory=list)
    #: The open tabs' URLs (http/https only), the driven page's first.
    tabs: list[str] = field(default_factory=list)
    #: origin → local storage items.
    storage: dict[str, dict[str, str]] = field(default_factory=dict)

    def to_json(self) -> dict[str, Any]:
        return {"cookies": self.cookies, "tabs": self.tabs, "storage": self.storage}


def _origin(value: object) -> str | None:
    if not isinstance(value, str) or len(value) > 300:
        return None
    m = re.fullmatch(r"(https?)://([A-Za-z0-9.-]{1,253}|\[[0-9a-fA-F:.]{2,45}\])(:[0-9]{1,5})?", value)
    return value.lower() if m else None


def cookie_param(raw: object) -> dict[str, Any] | None:
    """A CDP ``Network.Cookie`` (or a saved one) as ``CookieParam``; None when it does not check."""
    if not isinstance(raw, dict):
        return None
    out: dict[str, Any] = {}
    for key in _COOKIE_STR:
        value = raw.get(key)
        if value is None:
            continue
        if not isinstance(value, str) or len(value) > MAX_COOKIE_CHARS:
            return None
        out[key] = value
    if "domain" not in out or "value" not in out or "name" not in out:
        return None
    for key, allowed in (("sameSite", _SAME_SITE), ("priority", _PRIORITY), ("sourceScheme", _SCHEME)):
        if key in out and out[key] not in allowed:
            del out[key]
    for key in _COOKIE_BOOL:
        if isinstance(raw.get(key), bool):
            out[key] = raw[key]
    expires = raw.get("expires")
    if not raw.get("session") and isinstance(expires, (int, float)) and not isinstance(expires, bool) \
            and 0 < expires < 2**40:
        out["expires"] = float(expires)
    port = raw.get("sourcePort")
    if isinstance(port, int) and not isinstance(port, bool) and -1 <= port <= 65535:
        out["sourcePort"] = port
    return out


def parse_state(doc: object) -> ProfileState:
    """A profile's JSON (a save, or what the engine answered) checked into a state.
    What does not check is left out; counts past the caps are cut."""
    if not isinstance(doc, dict):
        raise RigdError("a browser profile is not a JSON object")
    cookies: list[dict[str, Any]] = []
    raw_cookies = doc.get("cookies")
    if isinstance(raw_cookies, list):
        for raw in raw_cookies:
            cookie = cookie_param(raw)
            if cookie is not None:
                cookies.append(cookie)
                if len(cookies) == MAX_COOKIES:
                    break
    tabs: list[str] = []
    raw_tabs = doc.get("tabs")
    if isinstance(raw_tabs, list):
        for url in raw_tabs:
            if isinstance(url, str) and len(url) <= 8192 and re.match(r"https?://", url):
                tabs.append(url)
                if len(tabs) == MAX_TABS:
                    break
    storage: dict[str, dict[str, str]] = {}
    raw_storage = doc.get("storage")
    if isinstance(raw_storage, dict):
        for origin_raw, items in list(raw_storage.items())[:MAX_ORIGINS]:
            origin = _origin(origin_raw)
            if origin is None or not isinstance(items, dict):
                continue
            kept = {k: v for k, v in list(items.items())[:MAX_ITEMS_PER_ORIGIN]
                    if isinstance(k, str) and isinstance(v, str) and len(k) <= 1024 and len(v) <= 1 << 20}
            if kept:
                storage[origin] = kept
    return ProfileState(cookies, tabs, storage)


class ProfileStore:
    """Sealed profile files under ``<dataDir>/profiles/``. Blocking: call from a worker thread."""

    def __init__(self, data_dir: Path) -> None:
        self.root = data_dir / "profiles"

    def _key(self) -> bytes:
        try:
            return sealing_key(self.root / "key")
        except ValueError as exc:
            raise RigdError(str(exc)) from None

    def path(self, ref: ProfileRef, engine: str) -> Path:
        for part in (ref.owner, engine):
            if not re.fullmatch(r"[A-Za-z0-9_-]{1,64}", part):
                raise RigdError(f"not a profile path part: {part!r}")
        return self.root / ref.owner / engine / f"{parse_profile_name(ref.name)}.rprof"

    @staticmethod
    def _aad(ref: ProfileRef, engine: str) -> bytes:
        return f"rigd-profile/v1\0{ref.owner}\0{engine}\0{ref.name}".encode()

    def save(self, ref: ProfileRef, engine: str, state: ProfileState) -> int:
        """Seal and write ``state``; returns the plaintext's size."""
        plain = json.dumps(state.to_json(), ensure_ascii=False, separators=(",", ":")).encode()
        if len(plain) > MAX_STATE_BYTES:
            raise RigdError(f"the browser profile is {len(plain)} bytes (at most {MAX_STATE_BYTES})")
        nonce = secrets.token_bytes(12)
        sealed = MAGIC + nonce + AESGCM(self._key()).encrypt(nonce, plain, self._aad(ref, engine))
        path = self.path(ref, engine)
        for d in (path.parent.parent, path.parent):
            d.mkdir(mode=0o700, exist_ok=True)
        tmp = path.with_name(f".{path.name}.{secrets.token_hex(4)}.tmp")
        fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
        try:
            with os.fdopen(fd, "wb") as fh:
                fh.write(sealed)
                fh.flush()
                os.fsync(fh.fileno())
            os.replace(tmp, path)
        finally:
            tmp.unlink(missing_ok=True)
        return len(plain)

    def remove(self, owner: str, name: str) -> int:
        """Delete ``owner``'s profile ``name`` of every engine; returns how many files went."""
        gone = 0
        for engine_dir in (self.root / owner).glob("*"):
            path = self.path(ProfileRef(owner, name), engine_dir.name)
            try:
                path.unlink()
                gone += 1
            except FileNotFoundError:
                pass
        return gone

    def load(self, ref: ProfileRef, engine: str) -> ProfileState | None:
        """The saved state, or None when there is none yet. A file that does not open
        (tampered, another owner's, another key) is a RigdError saying so."""
        path = self.path(ref, engine)
        try:
            sealed = path.read_bytes()
        except FileNotFoundError:
            return None
        if not sealed.startswith(MAGIC) or len(sealed) < len(MAGIC) + 12 + 16:
            raise RigdError(f"browser profile {ref.name!r} is not a rigd profile file")
        nonce = sealed[len(MAGIC):len(MAGIC) + 12]
        try:
            plain = AESGCM(self._key()).decrypt(nonce, sealed[len(MAGIC) + 12:], self._aad(ref, engine))
        except InvalidTag as exc:
            raise RigdError(f"browser profile {ref.name!r} does not open (changed, or sealed for "
                            "another owner or key)") from exc
        try:
            return parse_state(json.loads(plain))
        except ValueError as exc:
            raise RigdError(f"browser profile {ref.name!r} is not JSON") from exc



def expires_from_w3c(raw: dict[str, Any]) -> dict[str, float]:
    """A W3C cookie's ``expiry`` (whole seconds; BiDi's and WebDriver's alike) as a saved
    cookie's ``expires``, or nothing for a session cookie (or a value that does not check)."""
    expiry = raw.get("expiry")
    if isinstance(expiry, int) and not isinstance(expiry, bool) and 0 < expiry < 2**40:
        return {"expires": float(expiry)}
    return {}


def expiry_for_w3c(saved: dict[str, Any]) -> dict[str, int]:
    """A saved cookie's ``expires`` as a W3C cookie's ``expiry``, or nothing for a session cookie."""
    expires = saved.get("expires")
    if isinstance(expires, int | float) and not isinstance(expires, bool) and expires > 0:
        return {"expiry": int(expires)}
    return {}


__all__ = ["PROFILE_NAME", "ProfileRef", "ProfileState", "ProfileStore", "cookie_param", "expires_from_w3c",
           "expiry_for_w3c", "parse_profile_name", "parse_state"]
