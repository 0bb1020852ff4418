"""The packages are layers and imports point one way (docs/architecture.md, "Module
map"): every import in rigd/ and netgate/, at module level or inside a function,
read from the source."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]

#: Where a package's modules may not import from (prefixes of dotted module names).
RULES: dict[str, tuple[str, ...]] = {
    "netgate": ("rigd",),
    "rigd.verbs": ("rigd.rigs", "rigd.tools", "rigd.client", "rigd.server", "rigd.backends", "rigd.browser"),
    "rigd.protocols": ("rigd.rigs", "rigd.tools", "rigd.client", "rigd.server", "rigd.backends",
                       "rigd.browser"),
    "rigd.store": ("rigd.rigs", "rigd.tools", "rigd.client", "rigd.server", "rigd.backends"),
    "rigd.images": ("rigd.rigs", "rigd.tools", "rigd.client", "rigd.server", "rigd.backends"),
    "rigd.ports": ("rigd.rigs", "rigd.tools", "rigd.client", "rigd.server"),
    "rigd.model": ("rigd.rigs", "rigd.tools", "rigd.client", "rigd.server", "rigd.backends"),
    "rigd.framing": ("rigd.rigs", "rigd.tools", "rigd.client", "rigd.server", "rigd.backends"),
    "rigd.errors": ("rigd.rigs", "rigd.tools", "rigd.client", "rigd.server", "rigd.backends"),
    "rigd.browser": ("rigd.rigs", "rigd.tools", "rigd.client", "rigd.server"),
    "rigd.backends": ("rigd.rigs", "rigd.tools", "rigd.client", "rigd.server"),
    "rigd.rigs": ("rigd.tools", "rigd.client", "rigd.server"),
    "rigd.tools": ("rigd.client", "rigd.server"),
    "rigd.nurseries": ("rigd",),
}
#: The one way up: ``rigd serve`` and the local commands start what they run.
ALLOWED = {("rigd.client.cli", "rigd.server")}


def module_name(path: Path) -> str:
    parts = list(path.relative_to(REPO).with_suffix("").parts)
    if parts[-1] == "__init__":
        parts.pop()
    return ".".join(parts)


def imports(path: Path) -> set[str]:
    found: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Import):
            found |= {a.name for a in node.names}
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            found.add(node.module)
            found |= {f"{node.module}.{a.name}" for a in node.names}
    return found


def sources() -> list[Path]:
    return sorted([*(REPO / "rigd").rglob("*.py"), *(REPO / "netgate").rglob("*.py")])


def under(name: str, prefix: str) -> bool:
    return name == prefix or name.startswith(prefix + ".")


def test_the_sources_are_found() -> None:
    names = {module_name(p) for p in sources()}
    assert {"rigd.rigs.manager", "rigd.tools.mcp", "rigd.client.cli", "netgate.policy"} <= names


@pytest.mark.parametrize("layer", sorted(RULES))
def test_imports_point_one_way(layer: str) -> None:
    wrong = []
    for path in sources():
        mod = module_name(path)
        if not under(mod, layer):
            continue
        for imported in imports(path):
            for banned in RULES[layer]:
                if under(imported, banned) and (mod, banned) not in ALLOWED:
                    wrong.append(f"{mod} imports {imported}")
    assert not wrong, "\n".join(sorted(set(wrong)))
