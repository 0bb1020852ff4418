"""Small helpers shared by the stores: ids, timestamps, token hashing, sealing keys."""

from __future__ import annotations

import hashlib
import os
import secrets
from datetime import UTC, datetime
from pathlib import Path


def new_id(prefix: str) -> str:
    """A random, URL-safe identifier such as ``rig_3kq9…`` (96 bits)."""
    return f"{prefix}_{secrets.token_hex(12)}"


def new_token() -> str:
    """A bearer token (256 bits). Only its sha256 is ever stored."""
    return "rigd_" + secrets.token_urlsafe(32)


def token_hash(token: str) -> str:
    return hashlib.sha256(token.encode("utf-8", "surrogatepass")).hexdigest()


def utcnow() -> datetime:
    return datetime.now(UTC)


def iso(moment: datetime) -> str:
    """ISO-8601 in UTC with milliseconds and a ``Z``, sortable as text."""
    return moment.astimezone(UTC).strftime("%Y-%m-%dT%H:%M:%S.") + f"{moment.microsecond // 1000:03d}Z"


def parse_iso(text: str) -> datetime:
    return datetime.strptime(text, "%Y-%m-%dT%H:%M:%S.%fZ").replace(tzinfo=UTC)


def sealing_key(path: Path) -> bytes:
    """The 32-byte key at ``path`` (mode 0600, its directory 0700), made once: two writers
    racing keep the first key written (a hard link never replaces one). Blocking."""
    path.parent.mkdir(mode=0o700, parents=True, exist_ok=True)
    try:
        key = path.read_bytes()
    except FileNotFoundError:
        key = secrets.token_bytes(32)
        tmp = path.with_name(f"{path.name}.tmp")
        fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
        with os.fdopen(fd, "wb") as fh:
            fh.write(key)
            fh.flush()
            os.fsync(fh.fileno())
        try:
            os.link(tmp, path)
        except FileExistsError:
            key = path.read_bytes()
        finally:
            tmp.unlink(missing_ok=True)
    if len(key) != 32:
        raise ValueError(f"{path} is not a 32-byte key")
    return key
