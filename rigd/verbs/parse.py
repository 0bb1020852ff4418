"""The one entry point: ``parse_action(tool, payload, ctx)``.

How this works: the tool name picks a verb table (one per ``*_use`` tool);
the payload's ``action`` picks a :class:`VerbSpec`; fields the verb does not
accept are refused by name before any value is read (a typo such as
``coordinates`` is reported as itself, not as a missing ``coordinate``);
then the verb's parser reads its fields with the rules of
:mod:`rigd.verbs._args`. Every rule failure is a :class:`FieldError` naming a
dotted path under ``action`` (or ``tool``), returned rather than raised.

Totality: nothing here recurses into caller values, formats an unbounded
value, converts a huge integer to float, or encodes a string that may hold an
unpaired surrogate without catching that — so any JSON value (and any
Python value of the same shapes) gets an answer.
"""

from __future__ import annotations

import difflib
from collections.abc import Mapping
from types import MappingProxyType

from rigd.errors import FieldError
from rigd.model import TOOL_SURFACES, Tool
from rigd.verbs import browser, computer, ios, mobile, terminal
from rigd.verbs._args import Args, VerbSpec, field_path, show
from rigd.verbs.base import Action, ParseContext

#: Tool → verb name → spec, in the order of RIGS.md §4.
TOOL_VERBS: Mapping[Tool, Mapping[str, VerbSpec]] = MappingProxyType(
    {
        Tool.TERMINAL_USE: MappingProxyType(terminal.VERBS),
        Tool.COMPUTER_USE: MappingProxyType(computer.VERBS),
        Tool.BROWSER_USE: MappingProxyType(browser.VERBS),
        Tool.MOBILE_USE: MappingProxyType(mobile.VERBS),
        Tool.IOS_USE: MappingProxyType(ios.VERBS),
    }
)

#: Verbs a tool refuses on purpose (not typos), with the reason.
_REFUSED_VERBS: dict[Tool, dict[str, str]] = {
    Tool.MOBILE_USE: mobile.REFUSED_VERBS,
    Tool.IOS_USE: ios.REFUSED_VERBS,
}

#: Every field name any verb of a tool accepts: a ``null`` in one of them is
#: ignored on any verb, as OpenAI strict mode sends one flat schema's nulls.
_TOOL_FIELDS: dict[Tool, frozenset[str]] = {
    tool: frozenset(name for spec in verbs.values() for name in spec.fields)
    for tool, verbs in TOOL_VERBS.items()
}

#: Tool → names of its observation verbs (RIGS.md §4 ○), for control checks.
OBSERVATION_VERBS: Mapping[Tool, frozenset[str]] = MappingProxyType(
    {
        tool: frozenset(name for name, spec in verbs.items() if spec.observation)
        for tool, verbs in TOOL_VERBS.items()
    }
)

_TOOL_NAMES = ", ".join(tool.value for tool in Tool)
_NO_CONTEXT = ParseContext()


def tool_of(name: object) -> Tool | None:
    """The tool called ``name``, or ``None``."""
    if not isinstance(name, str):
        return None
    for tool in Tool:
        if tool.value == name:
            return tool
    return None


def verbs_of(tool: Tool) -> tuple[str, ...]:
    return tuple(TOOL_VERBS[tool])


def _close_match(word: str, options: tuple[str, ...] | list[str]) -> str:
    if len(word) > 64:
        return ""
    match = difflib.get_close_matches(word, options, n=1, cutoff=0.5)
    return f" (did you mean {match[0]!r}?)" if match else ""


def _verb_error(tool: Tool, verb: object) -> FieldError:
    verbs = verbs_of(tool)
    listing = ", ".join(verbs)
    if verb is None:
        return FieldError("action.action", f"is required: the {tool} verb, one of: {listing}")
    if not isinstance(verb, str):
        return FieldError(
            "action.action", f"must be a string naming a {tool} verb, one of: {listing}"
        )
    refused = _REFUSED_VERBS.get(tool, {}).get(verb)
    if refused is not None:
        return FieldError("action.action", refused)
    hint = _close_match(verb, list(verbs))
    if not hint:
        owners = [other.value for other, table in TOOL_VERBS.items() if verb in table]
        if owners:
            hint = f" (that is a {' and '.join(owners)} verb)"
    return FieldError("action.action", f"unknown {tool} verb {show(verb)}{hint}; one of: {listing}")


def _unknown_fields(
    tool: Tool, spec: VerbSpec, payload: Mapping[object, object]
) -> FieldError | None:
    accepted = spec.fields
    tool_fields = _TOOL_FIELDS[tool]
    unknown = [
        key for key, value in payload.items()
        if key != "action" and key not in accepted and not (value is None and key in tool_fields)
    ]
    if not unknown:
        return None
    first = unknown[0]
    path = field_path("action", first)
    where = f"{tool} {spec.verb}"
    if isinstance(first, str) and first in spec.refused:
        return FieldError(path, f"not accepted by {where}: {spec.refused[first]}")
    takes = f"it takes {', '.join(accepted)}" if accepted else "it takes no fields"
    if len(unknown) == 1:
        hint = _close_match(first, accepted) if isinstance(first, str) else ""
        return FieldError(path, f"unknown field for {where}{hint}; {takes}")
    names = ", ".join(show(k, 32) if isinstance(k, str) else f"<{type(k).__name__}>"
                      for k in unknown[:5])
    more = f" and {len(unknown) - 5} more" if len(unknown) > 5 else ""
    return FieldError(path, f"unknown fields {names}{more} for {where}; {takes}")


def parse_action(
    tool: str, payload: object, ctx: ParseContext = _NO_CONTEXT
) -> Action | FieldError:
    """Parse one ``*_use`` call into a typed action, or say which field is
    wrong and why. Total: never raises, whatever ``tool`` and ``payload`` are.
    """
    known = tool_of(tool)
    if known is None:
        got = f" (got {show(tool, 32)})" if isinstance(tool, str) else ""
        return FieldError("tool", f"must be one of {_TOOL_NAMES}{got}")
    if ctx.surface is not None and ctx.surface not in TOOL_SURFACES[known]:
        fits = ", ".join(sorted(t.value for t, s in TOOL_SURFACES.items() if ctx.surface in s))
        return FieldError("tool", f"{known} cannot drive a {ctx.surface} rig; use {fits}")
    if not isinstance(payload, Mapping):
        return FieldError(
            "action", f'must be an object naming its {known} verb, e.g. {{"action": "screenshot"}}'
        )
    verb = payload.get("action")
    spec = TOOL_VERBS[known].get(verb) if isinstance(verb, str) else None
    if spec is None:
        return _verb_error(known, verb)
    refused = _unknown_fields(known, spec, payload)
    if refused is not None:
        return refused
    try:
        return spec.parse(Args(known, spec.verb, payload, ctx))
    except FieldError as exc:
        return exc
