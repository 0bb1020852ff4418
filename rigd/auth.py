"""Bearer tokens and signed targets.

A signed target scopes a URL to one purpose on one rig —
``rig-term:<workspaceId>/<rigId>``, ``rig-view:…``, ``rig-files:…`` — for one
user, until an expiry. The signature is an HMAC-SHA256 under a server key kept
0600 in the data directory. A signature for one target never verifies for
another, so a URL issued to watch a rig cannot open its terminal or write
its files. Membership is still checked when the URL is used.
"""

from __future__ import annotations

import hashlib
import hmac
import os
import secrets
import time
from dataclasses import dataclass
from pathlib import Path

from rigd.errors import Unauthorized

TARGET_KINDS = ("rig-term", "rig-view", "rig-files")


def load_or_create_key(path: Path) -> bytes:
    try:
        key = path.read_bytes()
        if len(key) >= 32:
            return key
    except FileNotFoundError:
        pass
    key = secrets.token_bytes(32)
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    with os.fdopen(fd, "wb") as fh:
        fh.write(key)
    return key


def bearer(header: str | None) -> str | None:
    if not header:
        return None
    scheme, _, token = header.partition(" ")
    if scheme.lower() != "bearer" or not token.strip():
        return None
    return token.strip()


@dataclass(frozen=True, slots=True)
class SignedTarget:
    kind: str
    workspace_id: str
    rig_id: str
    user_id: str
    expires: int

    @property
    def target(self) -> str:
        return f"{self.kind}:{self.workspace_id}/{self.rig_id}"


class Signer:
    def __init__(self, key: bytes) -> None:
        self._key = key

    def _mac(self, target: str, user_id: str, expires: int) -> str:
        msg = f"{target}\n{user_id}\n{expires}".encode()
        return hmac.new(self._key, msg, hashlib.sha256).hexdigest()

    def sign(
        self, kind: str, workspace_id: str, rig_id: str, user_id: str, ttl_s: int = 300
    ) -> dict[str, str]:
        if kind not in TARGET_KINDS:
            raise ValueError(kind)
        expires = int(time.time()) + ttl_s
        target = f"{kind}:{workspace_id}/{rig_id}"
        return {"u": user_id, "exp": str(expires), "sig": self._mac(target, user_id, expires)}

    def verify(self, kind: str, workspace_id: str, rig_id: str, query: dict[str, str]) -> SignedTarget:
        user_id, exp, sig = query.get("u", ""), query.get("exp", ""), query.get("sig", "")
        if not (user_id and exp.isdigit() and sig):
            raise Unauthorized("missing or malformed signature")
        expires = int(exp)
        target = f"{kind}:{workspace_id}/{rig_id}"
        if not hmac.compare_digest(self._mac(target, user_id, expires), sig):
            raise Unauthorized("signature does not match this target")
        if expires < time.time():
            raise Unauthorized("signature expired")
        return SignedTarget(kind, workspace_id, rig_id, user_id, expires)
