"""Chromium's CDP replies read into typed values at the edge: the tab's history, a
navigation, a script's value, content quads, layout metrics, the accessibility tree (and
its rendering as an outline), console entries and a document's HTTP status. Pure: no
I/O; the driver (:mod:`rigd.browser.chromium`) sends the commands. The page is hostile
and so is the browser that renders it: every field is checked and bounded.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any

from rigd.browser.page import AX_MAX_NODES, CONSOLE_ENTRY_MAX_CHARS
from rigd.protocols.cdp import CDPError, CDPProtocolError, Event, Fields

# -- typed replies -------------------------------------------------------------------------------

@dataclass(frozen=True, slots=True)
class HistoryEntry:
    id: int
    url: str
    title: str


@dataclass(frozen=True, slots=True)
class History:
    current: int
    entries: tuple[HistoryEntry, ...]

    @property
    def entry(self) -> HistoryEntry:
        return self.entries[self.current]


def parse_history(f: Fields) -> History:
    entries = tuple(
        HistoryEntry(e.integer("id", 0, 2**31), e.string("url", 1 << 20),
                     e.string("title", 1 << 20, default=""))
        for e in f.objs("entries", 10_000)
    )
    current = f.integer("currentIndex", 0, max(0, len(entries) - 1))
    if not entries:
        raise CDPProtocolError("Page.getNavigationHistory: entries is empty")
    return History(current, entries)


@dataclass(frozen=True, slots=True)
class Navigation:
    frame_id: str
    loader_id: str | None
    error_text: str | None


def parse_navigate(f: Fields) -> Navigation:
    return Navigation(
        f.string("frameId", 128),
        f.string("loaderId", 128) if f.has("loaderId") else None,
        f.string("errorText", 300) if f.has("errorText") else None,
    )


def parse_value(f: Fields) -> Any:
    """The value of a ``Runtime.evaluate`` with ``returnByValue``; a thrown exception is an error."""
    if f.has("exceptionDetails"):
        details = f.obj("exceptionDetails")
        text = details.string("text", 100_000, default="exception")[:300]
        exc = details.opt_obj("exception")
        if exc is not None and exc.has("description"):
            text = exc.string("description", 100_000)[:300]
        raise PageScriptError(text)
    return f.obj("result").raw("value")


class PageScriptError(CDPError):
    """A script rigd ran in the page threw (the page may have replaced built-ins)."""


def quad_centre(f: Fields) -> tuple[float, float] | None:
    for i, quad in enumerate(f.items("quads", 1000)):
        q = Fields({"q": quad}, f"DOM.getContentQuads.quads[{i}]").numbers("q", 8)
        xs, ys = q[0::2], q[1::2]
        area = abs(sum(xs[k] * ys[(k + 1) % 4] - xs[(k + 1) % 4] * ys[k] for k in range(4))) / 2
        if area > 0.5:
            return sum(xs) / 4, sum(ys) / 4
    return None


@dataclass(frozen=True, slots=True)
class LayoutMetrics:
    content_w: float
    content_h: float
    page_x: float
    page_y: float
    client_w: float
    client_h: float


def parse_layout(f: Fields) -> LayoutMetrics:
    content = f.obj("cssContentSize")
    visual = f.obj("cssVisualViewport")
    return LayoutMetrics(content.number("width", 0, 1e7), content.number("height", 0, 1e7),
                         visual.number("pageX", -1e7, 1e7), visual.number("pageY", -1e7, 1e7),
                         visual.number("clientWidth", 0, 1e5), visual.number("clientHeight", 0, 1e5))


# -- the accessibility tree ----------------------------------------------------------------------

@dataclass(frozen=True, slots=True)
class AXNode:
    id: str
    parent: str | None
    ignored: bool
    role: str
    name: str
    value: str
    children: tuple[str, ...]


def _ax_text(f: Fields, name: str) -> str:
    obj = f.opt_obj(name)
    if obj is None:
        return ""
    value = obj.raw("value")
    if isinstance(value, str):
        return value[:CONSOLE_ENTRY_MAX_CHARS]
    if isinstance(value, bool | int | float):
        return str(value)
    return ""


def parse_ax_tree(f: Fields) -> list[AXNode]:
    out = []
    for n in f.objs("nodes", AX_MAX_NODES):
        listed = n.items("childIds", 100_000) if n.has("childIds") else []
        kids = tuple(k for k in listed if isinstance(k, str) and len(k) <= 64)
        out.append(AXNode(
            n.string("nodeId", 64), n.string("parentId", 64) if n.has("parentId") else None,
            n.boolean("ignored", False), _ax_text(n, "role"), _ax_text(n, "name"), _ax_text(n, "value"),
            kids,
        ))
    return out


_AX_SKIP_ROLES = frozenset({"InlineTextBox", "LineBreak"})
_AX_QUIET_ROLES = frozenset({"generic", "none", "presentation", ""})


def render_ax(nodes: list[AXNode]) -> str:
    """One line per meaningful node, indented by depth: ``role "name" = value``.

    Ignored nodes and unnamed generic containers are not printed; their
    children are, one level up. Iterative, and each node is visited once, so a
    hostile tree (deep, cyclic, shared children) costs at most its size.
    """
    by_id = {n.id: n for n in nodes}
    roots = [n for n in nodes if n.parent is None or n.parent not in by_id]
    lines: list[str] = []
    seen: set[str] = set()
    stack: list[tuple[AXNode, int]] = [(n, 0) for n in reversed(roots)]
    while stack:
        node, depth = stack.pop()
        if node.id in seen or node.role in _AX_SKIP_ROLES:
            continue
        seen.add(node.id)
        shown = not node.ignored and not (node.role in _AX_QUIET_ROLES and not node.name)
        if shown:
            line = "  " * min(depth, 64) + node.role
            if node.name:
                line += " " + json.dumps(node.name, ensure_ascii=False)
            if node.value:
                line += " = " + json.dumps(node.value, ensure_ascii=False)
            lines.append(line)
        child_depth = depth + 1 if shown else depth
        stack.extend((by_id[c], child_depth) for c in reversed(node.children) if c in by_id)
    return "\n".join(lines)


# -- console -------------------------------------------------------------------------------------

def _remote_text(obj: Any) -> str:
    if not isinstance(obj, dict):
        return "?"
    if "value" in obj:
        value = obj["value"]
        return value if isinstance(value, str) else json.dumps(value)[:CONSOLE_ENTRY_MAX_CHARS]
    for key in ("unserializableValue", "description", "type"):
        if isinstance(obj.get(key), str):
            return str(obj[key])
    return "?"


def console_line(event: Event) -> str:
    """One console entry as text, bounded: ``[log] a b`` or ``[exception] …``."""
    p = event.params
    if event.method == "Runtime.consoleAPICalled":
        kind = p.get("type")
        args = p.get("args")
        text = " ".join(_remote_text(arg) for arg in (args[:32] if isinstance(args, list) else []))
        line = f"[{kind[:20] if isinstance(kind, str) else 'log'}] {text}"
    elif event.method == "Runtime.exceptionThrown":
        details = p.get("exceptionDetails")
        details = details if isinstance(details, dict) else {}
        exc = details.get("exception")
        desc = exc.get("description") if isinstance(exc, dict) else None
        line = f"[exception] {desc if isinstance(desc, str) else str(details.get('text', ''))}"
    else:  # a dialog the driver answered
        line = f"[dialog] {p.get('type', '')}: {p.get('message', '')}"
    if len(line) > CONSOLE_ENTRY_MAX_CHARS:
        line = line[:CONSOLE_ENTRY_MAX_CHARS] + f" [... {len(line) - CONSOLE_ENTRY_MAX_CHARS} characters cut]"
    return line


def document_status(events: list[Event], loader_id: str | None) -> int | None:
    for event in events:
        p = event.params
        response = p.get("response")
        if p.get("loaderId") == loader_id and p.get("type") == "Document" and isinstance(response, dict):
            status = response.get("status")
            if isinstance(status, int | float) and not isinstance(status, bool) and 0 <= status < 1000:
                return int(status)
    return None


__all__ = [
    "AXNode", "History", "HistoryEntry", "LayoutMetrics", "Navigation", "PageScriptError", "console_line",
    "document_status", "parse_ax_tree", "parse_history", "parse_layout", "parse_navigate", "parse_value",
    "quad_centre", "render_ax",
]
