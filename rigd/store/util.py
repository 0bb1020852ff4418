"""Small helpers shared by the stores: ids, timestamps, token hashing."""

from __future__ import annotations

import hashlib
import secrets
from datetime import UTC, datetime


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
