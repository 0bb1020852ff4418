"""The server's tool listing as its clients read it: MCP's bridge (``rigd.tools.mcp``) and
the agent loop (``rigd.client.agent``) parse one ``tools.list`` reply the same way, here,
without importing the MCP SDK (seconds of start-up a command that needs none of it would pay).

A definition is an OpenAI function definition whose parameters are a JSON Schema object;
``tools.call`` arguments are checked against it before a call is forwarded, so a malformed
call costs no rig. Every shape error names the field it is in.
"""

from __future__ import annotations

import json
import logging
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from dataclasses import field as dc_field
from typing import Any, Literal

from jsonschema import Draft202012Validator
from jsonschema.exceptions import SchemaError, ValidationError

log = logging.getLogger("rigd.tools")


class ReplyError(Exception):
    """A reply of the rigd server does not have the shape its client reads; names the field."""

    def __init__(self, field: str, reason: str) -> None:
        super().__init__(f"{field}: {reason}")
        self.field = field
        self.reason = reason


@dataclass(frozen=True)
class ToolDef:
    """One agent tool as ``tools.list`` defines it."""

    name: str
    description: str
    parameters: dict[str, Any]
    action_classes: tuple[str, ...]
    #: The checked schema's validator (shared by every definition of the same schema).
    validator: Draft202012Validator = dc_field(compare=False, repr=False)

    def as_param(self) -> dict[str, Any]:
        """The chat-completions ``tools`` entry."""
        return {"type": "function", "function": {"name": self.name, "description": self.description,
                                                 "parameters": self.parameters}}


#: Validators of the schemas seen, by their canonical JSON. ``check_schema`` costs ~15 ms for
#: rigd's catalogue and ``/mcp`` lists the tools on each request's bridge, so each distinct
#: schema is checked once per process (bounded: the catalogue is a handful of schemas).
_VALIDATORS: dict[str, Draft202012Validator] = {}
_VALIDATORS_MAX = 64


def validator_of(schema: dict[str, Any]) -> Draft202012Validator:
    """A validator of ``schema``, checked as a JSON Schema (:class:`SchemaError` if not)."""
    key = json.dumps(schema, sort_keys=True, separators=(",", ":"))
    known = _VALIDATORS.get(key)
    if known is not None:
        return known
    Draft202012Validator.check_schema(schema)
    if len(_VALIDATORS) >= _VALIDATORS_MAX:
        _VALIDATORS.clear()
    made = _VALIDATORS[key] = Draft202012Validator(schema)
    return made


def as_dict(value: object, field: str) -> dict[str, Any]:
    if not isinstance(value, dict):
        raise ReplyError(field, f"must be an object, not {type(value).__name__}")
    return value


def as_str(value: object, field: str) -> str:
    if not isinstance(value, str):
        raise ReplyError(field, f"must be a string, not {type(value).__name__}")
    return value


def parse_tool_list(reply: object, *, keep: Callable[[str], bool] = lambda _name: True,
                    broken_schema: Literal["drop", "refuse"] = "refuse",
                    warn: logging.Logger = log) -> list[ToolDef]:
    """The tools of a ``tools.list`` result (OpenAI function definitions plus ``metadata``)
    whose names ``keep`` accepts. A definition whose parameters are not a JSON Schema object
    is refused (:class:`ReplyError` naming it) or, with ``broken_schema="drop"``, left out
    with a warning on ``warn`` (the caller's logger) — never offered unchecked."""
    body = as_dict(reply, "result")
    raw_tools = body.get("tools")
    if not isinstance(raw_tools, list):
        raise ReplyError("result.tools", "must be a list")
    metadata = as_dict(body.get("metadata", {}), "result.metadata")
    out: list[ToolDef] = []
    for i, raw in enumerate(raw_tools):
        where = f"result.tools[{i}]"
        entry = as_dict(raw, where)
        if entry.get("type") != "function":
            raise ReplyError(f"{where}.type", "must be 'function'")
        fn = as_dict(entry.get("function"), f"{where}.function")
        name = as_str(fn.get("name"), f"{where}.function.name")
        if not name:
            raise ReplyError(f"{where}.function.name", "must not be empty")
        if not keep(name):
            continue
        description = as_str(fn.get("description", ""), f"{where}.function.description")
        parameters = as_dict(fn.get("parameters", {"type": "object"}), f"{where}.function.parameters")
        if parameters.get("type") != "object":
            raise ReplyError(f"{where}.function.parameters.type", "must be 'object'")
        try:
            validator = validator_of(parameters)
        except SchemaError as exc:
            if broken_schema == "refuse":
                raise ReplyError(f"{where}.function.parameters",
                                 f"is not a JSON Schema: {exc.message}") from exc
            warn.warning("tool dropped: its parameters are not a JSON Schema",
                        extra={"tool": name, "reason": exc.message})
            continue
        classes = as_dict(metadata.get(name, {}), f"result.metadata.{name}").get("actionClasses", [])
        if not isinstance(classes, list) or not all(isinstance(c, str) for c in classes):
            raise ReplyError(f"result.metadata.{name}.actionClasses", "must be a list of strings")
        out.append(ToolDef(name, description, parameters, tuple(classes), validator))
    return out


def check_arguments(tool: ToolDef, arguments: Mapping[str, Any]) -> str | None:
    """The first way ``arguments`` breaks the tool's schema, naming the field; None if none.

    Checked before the call is forwarded, so a malformed call costs no rig: the server opens
    a desktop or a browser before it parses that rig's action."""
    error = next(iter(sorted(tool.validator.iter_errors(dict(arguments)),
                             key=lambda e: (len(e.absolute_path), str(e.absolute_path)))), None)
    if error is None:
        return None
    return describe(tool, error)


def describe(tool: ToolDef, error: ValidationError) -> str:
    path = "".join(f"[{p}]" if isinstance(p, int) else f".{p}" for p in error.absolute_path)
    field = "arguments" + path
    schema = error.schema if isinstance(error.schema, dict) else {}
    if error.validator == "additionalProperties" and isinstance(error.instance, dict):
        known = set(schema.get("properties", {}))
        extra = sorted(k for k in error.instance if k not in known)
        if extra:
            return (f"{field}.{extra[0]}: is not a parameter of {tool.name} "
                    f"(it takes {', '.join(sorted(known)) or 'no parameters'})")
    if error.validator == "required" and isinstance(error.instance, dict):
        missing = [k for k in schema.get("required", []) if k not in error.instance]
        if missing:
            return f"{field}.{missing[0]}: is required"
    return f"{field}: {error.message}"


__all__ = ["ReplyError", "ToolDef", "as_dict", "as_str", "check_arguments", "describe", "parse_tool_list",
           "validator_of"]
