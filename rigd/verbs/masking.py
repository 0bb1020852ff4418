"""Value transforms for the audit log (RIGS.md §10, §11).

Every function here is total over any Python value and returns plain JSON
(no NaN, no integer too long to print, no unpaired surrogate), bounded in
size. :func:`mask` is the default for anything not known to be harmless:
strings become ``{"len": <chars>, "sha256": <hex>}``, other values only their
JSON type, so a secret given in the wrong shape (a PIN as a number, text as a
list of strings) is not written either.
"""

from __future__ import annotations

import hashlib
import math
from collections.abc import Callable, Mapping
from urllib.parse import urlsplit

AuditFn = Callable[[object], object]

#: Kept strings longer than this are stored as a head plus length and hash.
KEEP_STR_MAX = 4096
#: At most this many items of a kept list, and of an env mapping.
KEEP_ITEMS_MAX = 1024
#: Dictionary keys (field and variable names) are cut to this length.
LABEL_MAX = 256


def json_type(value: object) -> str:
    """The JSON type name of a value, or the Python type for anything else."""
    if value is None:
        return "null"
    if isinstance(value, bool):
        return "boolean"
    if isinstance(value, int | float):
        return "number"
    if isinstance(value, str):
        return "string"
    if isinstance(value, list | tuple):
        return "array"
    if isinstance(value, Mapping):
        return "object"
    return type(value).__name__


def _utf8(text: str) -> bytes:
    # surrogatepass: a JSON string may hold an unpaired surrogate; hash it anyway.
    return text.encode("utf-8", "surrogatepass")


def _clean(text: str) -> str:
    """The text with unpaired surrogates spelled out, so it encodes as UTF-8."""
    try:
        text.encode("utf-8")
    except UnicodeEncodeError:
        return text.encode("utf-8", "backslashreplace").decode("utf-8")
    return text


def mask(value: object) -> dict[str, object]:
    """Length and SHA-256 of a string; the JSON type of anything else."""
    if isinstance(value, str):
        return {"len": len(value), "sha256": hashlib.sha256(_utf8(value)).hexdigest()}
    return {"masked": json_type(value)}


def label(key: object) -> str:
    """A dictionary key as it may appear in the audit record."""
    if isinstance(key, str):
        return _clean(key if len(key) <= LABEL_MAX else key[:LABEL_MAX] + "…")
    return f"<{json_type(key)}>"


def keep(value: object, _depth: int = 0) -> object:
    """The value itself when it is a harmless JSON scalar or a short list of
    them; a bounded summary otherwise. For fields that hold no secret."""
    if value is None or isinstance(value, bool):
        return value
    if isinstance(value, int):
        if -(2**63) <= value < 2**63:
            return value
        return {"integer": "out of range", "bits": value.bit_length()}
    if isinstance(value, float):
        return value if math.isfinite(value) else {"number": repr(value)}
    if isinstance(value, str):
        if len(value) <= KEEP_STR_MAX:
            return _clean(value)
        return {
            "head": _clean(value[:KEEP_STR_MAX]),
            **mask(value),
        }
    if isinstance(value, list | tuple) and _depth < 2:
        items: list[object] = [keep(item, _depth + 1) for item in value[:KEEP_ITEMS_MAX]]
        if len(value) > KEEP_ITEMS_MAX:
            items.append({"more": len(value) - KEEP_ITEMS_MAX})
        return items
    if isinstance(value, list | tuple | Mapping):
        return {"omitted": json_type(value), "len": len(value)}
    return {"omitted": json_type(value)}


def mask_values(value: object) -> object:
    """An object's keys kept and its values masked (exec ``env``)."""
    if not isinstance(value, Mapping):
        return mask(value)
    out: dict[str, object] = {}
    for index, (key, item) in enumerate(value.items()):
        if index == KEEP_ITEMS_MAX:
            out["…"] = {"more": len(value) - KEEP_ITEMS_MAX}
            break
        out[label(key)] = mask(item)
    return out


def keep_if(check: Callable[[str], object]) -> AuditFn:
    """Keep a string that ``check`` accepts (it returns; raising ``ValueError``
    refuses); mask anything else. For key names: a well-formed key spec is
    harmless, while a malformed one may be text typed in the wrong verb."""

    def audit(value: object) -> object:
        if isinstance(value, str):
            try:
                check(value)
            except ValueError:
                return mask(value)
            return keep(value)
        return mask(value)

    return audit


def keep_url(value: object) -> object:
    """A URL with any ``user:password@`` part masked; unparsable ones masked."""
    if not isinstance(value, str):
        return mask(value)
    try:
        parts = urlsplit(value)
    except ValueError:
        return mask(value)
    if "@" not in parts.netloc:
        return keep(value)
    userinfo, _, host = parts.netloc.rpartition("@")
    return {
        "url": keep(parts._replace(netloc=f"***@{host}").geturl()),
        "userinfo": mask(userinfo),
    }
