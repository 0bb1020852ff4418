"""What the action log stores for a ``*_use`` call (RIGS.md §10, §11).

``audit_args(tool, payload)`` returns the verb and its arguments, with
secrets masked to ``{"len": <chars>, "sha256": <hex>}``. It never parses:
a call that failed to parse is logged too, so it must be total and must not
trust the payload's shape. The rule is default-deny:

- a field the verb declares is kept, unless the verb's spec says otherwise:
  typed text (``type``, ``fill``, ``clipboard_write``), exec ``stdin`` and
  exec ``env`` values are masked; key and modifier text is kept only when it
  is well-formed key syntax; a URL's ``user:password@`` is masked;
- every other field — unknown, misspelt, or on an unknown verb or tool — is
  masked, whatever its type;
- the verb name is kept only when it looks like one (``[A-Za-z_][A-Za-z0-9_]*``,
  ≤ 64 characters).

The result is plain JSON (no NaN, no over-long integer, no unpaired
surrogate) and bounded in size.
"""

from __future__ import annotations

import re
from collections.abc import Mapping

from rigd.verbs.masking import keep, label, mask
from rigd.verbs.parse import TOOL_VERBS, tool_of

_VERB = re.compile(r"[A-Za-z_][A-Za-z0-9_]{0,63}")
#: At most this many fields of one payload are recorded.
FIELDS_MAX = 64


def audit_args(tool: object, payload: object) -> dict[str, object]:
    """The audit record of one call's arguments. Total; never holds typed text."""
    known = tool_of(tool)
    verbs = TOOL_VERBS[known] if known is not None else {}
    if not isinstance(payload, Mapping):
        return {"action": None, "payload": mask(payload)}
    raw_verb = payload.get("action")
    verb = raw_verb if isinstance(raw_verb, str) and _VERB.fullmatch(raw_verb) else None
    out: dict[str, object] = {
        "action": verb if verb is not None or raw_verb is None else mask(raw_verb)
    }
    spec = verbs.get(verb) if verb is not None else None
    recorded = 0
    for key, value in payload.items():
        if key == "action":
            continue
        if recorded == FIELDS_MAX:
            out["…"] = {"more": len(payload) - recorded - (1 if "action" in payload else 0)}
            break
        recorded += 1
        if spec is not None and isinstance(key, str) and key in spec.fields:
            out[label(key)] = spec.audit.get(key, keep)(value)
        else:
            out[label(key)] = mask(value)
    return out
