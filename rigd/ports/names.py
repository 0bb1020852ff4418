"""Dev domain names, ``<label>(.<label>)*.test`` or ``....localhost``: where a person opens a rig's app.

Lower-case letters, digits and ``-`` only (an internationalised label in its ``xn--`` form), no label that
starts or ends with ``-``, labels of 1-63 characters, at most 253 in all (RFC 1035), and at least one label
before the suffix. :func:`dev_name_problem` says what is wrong in words fit for a field error.
"""

from __future__ import annotations

from typing import Final

#: The top-level names a dev domain ends in (and the dev CA is constrained to).
DEV_SUFFIXES: Final[tuple[str, ...]] = ("test", "localhost")

_ALLOWED: Final[frozenset[str]] = frozenset("abcdefghijklmnopqrstuvwxyz0123456789-.")


def dev_name_problem(name: object) -> str | None:
    """What is wrong with ``name`` as a dev domain, as a reason for a field error; None if it is fine."""
    if not isinstance(name, str):
        return "must be a string"
    if not name:
        return "is empty"
    if len(name) > 253:
        return f"is longer than 253 characters ({len(name)})"
    if not name.isascii():
        return "has characters outside ASCII (write an internationalised label in its xn-- form)"
    controls = sorted({c for c in name if ord(c) < 0x20 or ord(c) == 0x7F})
    if controls:
        shown = ", ".join(repr(c) for c in controls)
        return f"has control characters ({shown}): a dev name is one DNS name, a-z, 0-9, '-' and '.'"
    if name != name.lower():
        return "has upper case (dev names are lower case)"
    bad = sorted(set(name) - _ALLOWED)
    if bad:
        shown = ", ".join(repr(c) for c in bad)
        return f"has {shown} (only a-z, 0-9, '-' and '.' are allowed)"
    labels = name.split(".")
    if "" in labels:
        return "has an empty label"
    if labels[-1] not in DEV_SUFFIXES:
        return "must end in .test or .localhost"
    if len(labels) < 2:
        return f"needs a name before .{labels[-1]} (e.g. app.{labels[-1]})"
    if any(len(label) > 63 for label in labels):
        return "a label is longer than 63 characters"
    if any(label.startswith("-") or label.endswith("-") for label in labels):
        return "a label starts or ends with '-'"
    return None


def is_dev_name(name: object) -> bool:
    """Whether ``name`` is a dev domain (:func:`dev_name_problem` finds nothing wrong)."""
    return dev_name_problem(name) is None
