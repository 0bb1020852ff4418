"""Vocabularies: the agent tools in each model vendor's own shape (pure; no I/O).

``tools.list {dialect}`` and ``tools.call {…, dialect}`` speak one of:

- ``openai`` — rigd's own function tools (``rigd.tools.catalogue.definitions``), the default.
- ``anthropic`` — Anthropic's ``computer`` tool (``computer_20250124``, or
  ``computer_20251124`` with ``zoom``) drives a computer rig; the other tools
  are rigd's, as Anthropic custom tools (``input_schema``).
- ``openai-computer`` — OpenAI's computer-use actions (``click``,
  ``double_click``, ``drag``, ``keypress``, ``move``, ``scroll``, ``type``,
  ``wait``, ``screenshot``; one ``action`` or several ``actions``) drive a
  computer rig; the other tools are Responses-API function tools.
- ``gemini`` — Gemini's computer-use functions (``click_at``,
  ``type_text_at``, ``navigate`` …, coordinates 0-999 of the screenshot) drive
  a browser rig; the other tools are Gemini function declarations.

How this works: :func:`translate` reads one vendor call into a :class:`Call`
— its shape checked, field by field, with errors naming the vendor's field
(``arguments.coordinate``, ``arguments.actions[2].x``) — without knowing the
rig. Once the rig is known, :meth:`Call.plan` resolves the call against the
rig's :class:`Frame` (coordinates are pixels of the screenshot the model was
sent; a point outside it is refused, never clamped) into rigd
``computer_use`` / ``browser_use`` actions, each checked by
:func:`rigd.verbs.parse_action` before any runs, so a batch runs whole or not
at all. :func:`render` turns the last result back into content: the
screenshot and a line stating its scale, in the vendor's frame.

The frame is stateless: the display the rig reports now, fitted into
:data:`rigd.model.AGENT_STILL_MAX` by the rule every still follows
(:func:`rigd.frames.fit`). Keys go through one table
(:func:`rigd.verbs.keys.combo_for`).

One module per vendor (``anthropic``, ``openai_computer``, ``gemini``: reading that vendor's
calls, and Gemini's declarations), what they share in ``base`` (the frame, a call and its
plan, the argument reader, rendering results); this package's own functions are the entry
points, which pick the vendor.
"""

from __future__ import annotations

from typing import Any

from rigd.errors import FieldError
from rigd.model import Tool
from rigd.tools.dialects.anthropic import ANTHROPIC_ACTIONS, _anthropic
from rigd.tools.dialects.base import (
    ANTHROPIC_TOOL_TYPES,
    COMPUTER,
    Call,
    Dialect,
    Frame,
    Observe,
    Planned,
    Step,
    parse_dialect,
    render,
    zoomed,
)
from rigd.tools.dialects.gemini import _GEMINI_DECLS, GEMINI_ACTIONS, _gemini, _gemini_schema
from rigd.tools.dialects.openai_computer import OPENAI_ACTIONS, _openai_computer
from rigd.verbs._args import show

# --- the entry points ----------------------------------------------------------------------

#: The rigd tools each dialect serves beside its vendor's computer tool.
_RIGD_TOOLS: dict[Dialect, tuple[str, ...]] = {
    Dialect.OPENAI: ("rig_list", "rig_close", "terminal_use", "computer_use", "browser_use"),
    Dialect.ANTHROPIC: ("rig_list", "rig_close", "terminal_use", "browser_use"),
    Dialect.OPENAI_COMPUTER: ("rig_list", "rig_close", "terminal_use", "browser_use"),
    Dialect.GEMINI: ("rig_list", "rig_close", "terminal_use", "computer_use"),
}
_VENDOR_TOOLS: dict[Dialect, tuple[str, ...]] = {
    Dialect.OPENAI: (),
    Dialect.ANTHROPIC: (COMPUTER,),
    Dialect.OPENAI_COMPUTER: (COMPUTER,),
    Dialect.GEMINI: GEMINI_ACTIONS,
}


def rigd_tools(dialect: Dialect) -> tuple[str, ...]:
    return _RIGD_TOOLS[dialect]


def tool_names(dialect: Dialect) -> tuple[str, ...]:
    return _RIGD_TOOLS[dialect] + _VENDOR_TOOLS[dialect]


def vendor_tool_of(dialect: Dialect) -> dict[str, Tool]:
    """Each vendor tool name → the rigd tool behind it (for action classes)."""
    tool = Tool.BROWSER_USE if dialect is Dialect.GEMINI else Tool.COMPUTER_USE
    return {name: tool for name in _VENDOR_TOOLS[dialect]}


def translate(dialect: Dialect, name: str, args: object) -> Call | None:
    """A vendor tool call as a :class:`Call`; ``None`` when ``name`` is one of
    rigd's own tools (served as they are). Unknown names are refused naming ``name``."""
    if name in _RIGD_TOOLS[dialect]:
        return None
    if name not in _VENDOR_TOOLS[dialect]:
        raise FieldError("name", f"{show(name)} is not a tool of the {dialect} dialect; one of "
                                 f"{', '.join(tool_names(dialect))}")
    if dialect is Dialect.ANTHROPIC:
        return _anthropic(args)
    if dialect is Dialect.OPENAI_COMPUTER:
        return _openai_computer(args)
    return _gemini(name, args)


def definitions(dialect: Dialect, functions: list[Any], frame: Frame,
                anthropic_tool: str = ANTHROPIC_TOOL_TYPES[0]) -> list[dict[str, Any]]:
    """The tools of ``dialect``, in its vendor's format, from rigd's OpenAI function
    definitions; the vendor's computer tool is sized to ``frame.image``."""
    by_name = {f["function"]["name"]: f["function"] for f in functions}
    own = [by_name[n] for n in _RIGD_TOOLS[dialect]]
    w, h = frame.image.width, frame.image.height
    if dialect is Dialect.OPENAI:
        return [dict(f) for f in functions]
    if dialect is Dialect.ANTHROPIC:
        computer: dict[str, Any] = {"type": anthropic_tool, "name": COMPUTER,
                                    "display_width_px": w, "display_height_px": h}
        if anthropic_tool == "computer_20251124":
            computer["enable_zoom"] = True
        tools = [{"name": f["name"], "description": f["description"], "input_schema": f["parameters"]}
                 for f in own]
        return [*tools[:3], computer, *tools[3:]]
    if dialect is Dialect.OPENAI_COMPUTER:
        tools = [{"type": "function", "name": f["name"], "description": f["description"],
                  "parameters": f["parameters"], "strict": False} for f in own]
        return [*tools[:3], {"type": "computer_use_preview", "display_width": w, "display_height": h,
                             "environment": "linux"}, *tools[3:]]
    decls = []
    for f in own:
        decl = {"name": f["name"], "description": f["description"]}
        params = _gemini_schema(f["parameters"])
        if params is not None:
            decl["parameters"] = params
        decls.append(decl)
    return [{"functionDeclarations": decls}, {"functionDeclarations": [dict(d) for d in _GEMINI_DECLS]}]


__all__ = [
    "ANTHROPIC_ACTIONS", "ANTHROPIC_TOOL_TYPES", "COMPUTER", "GEMINI_ACTIONS", "OPENAI_ACTIONS", "Call",
    "Dialect", "Frame", "Observe", "Planned", "Step", "definitions", "parse_dialect", "render", "rigd_tools",
    "tool_names", "translate", "vendor_tool_of", "zoomed",
]
