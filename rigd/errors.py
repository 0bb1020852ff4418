"""The error tree of rigd.

Every error a caller can see is a :class:`RigdError`. Each carries a JSON-RPC
error code and a ``data`` mapping that says what was wrong, for example
``{"field": "action.duration", "reason": "must be between 0 and 60 seconds"}``.
Foreign exceptions are translated at the boundary with ``raise ... from exc``.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

from netgate.errors import InvalidField, NetgateError, Refused


class RigdError(Exception):
    """Base of every error rigd reports to a caller."""

    code: int = -32000

    def __init__(self, message: str, **data: Any) -> None:
        super().__init__(message)
        self.message = message
        self.data: dict[str, Any] = data

    def to_json(self) -> dict[str, Any]:
        out: dict[str, Any] = {"code": self.code, "message": self.message}
        if self.data:
            out["data"] = self.data
        return out


class FieldError(RigdError):
    """A request field is missing or breaks a rule; ``field`` names it."""

    code = -32602

    def __init__(self, field: str, reason: str) -> None:
        super().__init__(f"{field}: {reason}", field=field, reason=reason)
        self.field = field
        self.reason = reason


class NotFound(RigdError):
    """The thing does not exist *or the caller may not see it* (indistinguishable)."""

    code = -32004


class Unauthorized(RigdError):
    code = -32001


class Forbidden(RigdError):
    code = -32003


class Conflict(RigdError):
    """The request is valid but the current state forbids it (e.g. a closed rig)."""

    code = -32009


class TooManyRequests(RigdError):
    """A WebSocket has as many requests in flight as it may; this one was not started.

    ``limit`` is the bound; the client waits for replies before sending more.
    """

    code = -32029

    def __init__(self, limit: int) -> None:
        super().__init__(
            f"too many requests in flight on this WebSocket: the limit is {limit}; "
            "wait for replies before sending more",
            limit=limit, reason=f"at most {limit} requests in flight per WebSocket",
        )
        self.limit = limit


class BackendError(RigdError):
    """The hypervisor or guest failed to do what was asked."""

    code = -32010


class GuestError(BackendError):
    """The guest agent misbehaved: garbage, oversized messages, or no reply in time."""

    code = -32011


class GuestRefused(GuestError):
    """The guest agent answered, but said no (e.g. no such program)."""

    def __init__(self, op: str, reason: str) -> None:
        super().__init__(f"guest agent refused {op}: {reason}")
        self.op = op
        self.reason = reason


def leaves(exc: BaseException) -> Iterator[BaseException]:
    """The exceptions inside (nested) groups, depth first; a plain one is its own leaf."""
    if isinstance(exc, BaseExceptionGroup):
        for sub in exc.exceptions:
            yield from leaves(sub)
    else:
        yield exc


def from_netgate(exc: NetgateError) -> RigdError:
    """netgate's error as rigd reports it: a refused field names the field, a refusal is
    Forbidden (netgate imports nothing from rigd; this is the boundary)."""
    if isinstance(exc, InvalidField):
        return FieldError(exc.field, exc.reason)
    if isinstance(exc, Refused):
        return Forbidden(exc.message)
    return RigdError(exc.message)
