"""netgate's own errors: the library imports nothing from the server that uses it.

A caller maps them at its boundary (rigd: :func:`rigd.errors.from_netgate`):
:class:`InvalidField` names the input field it refuses (``egress.allow[2]``,
``hosts``), :class:`Refused` is a request the policy forbids.
"""

from __future__ import annotations


class NetgateError(Exception):
    """Base of every error netgate raises for its caller to report."""

    def __init__(self, message: str) -> None:
        super().__init__(message)
        self.message = message


class InvalidField(NetgateError, ValueError):
    """An input breaks a rule; ``field`` names it (as the caller's request spelled it)."""

    def __init__(self, field: str, reason: str) -> None:
        super().__init__(f"{field}: {reason}")
        self.field = field
        self.reason = reason


class Refused(NetgateError):
    """The request is well formed but the policy forbids it."""


__all__ = ["InvalidField", "NetgateError", "Refused"]
