"""The layers of ``sidecar`` import only downwards, pygls stays in the RPC layer, and there are no cycles."""

from __future__ import annotations

import ast
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
PACKAGE = ROOT / "sidecar"

LAYERS: list[tuple[str, ...]] = [
    ("sidecar", "sidecar.wire", "sidecar.assemble_reply"),
    ("sidecar.config", "sidecar.engine", "sidecar.storage", "sidecar.summarizers", "sidecar.importers",
     "sidecar.testing"),
    ("sidecar.services",),
    ("sidecar.rpc", "sidecar.mcp", "sidecar.client"),
    ("sidecar.tools", "sidecar.pytest_plugin", "sidecar.__main__"),
]
"""Lowest first: a module may import its own layer and those below, never one above."""
RPC_ONLY = ("pygls", "lsprotocol", "pytest_lsp")


def module_name(path: Path) -> str:
    parts = path.relative_to(ROOT).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def rank(module: str) -> int:
    best, found = -1, 0
    for index, prefixes in enumerate(LAYERS):
        for prefix in prefixes:
            if (module == prefix or module.startswith(prefix + ".")) and len(prefix) > best:
                best, found = len(prefix), index
    return found


def imports(path: Path) -> set[str]:
    """Every module ``path`` imports, at any depth (TYPE_CHECKING and function-level imports included)."""
    found: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
        if isinstance(node, ast.Import):
            found.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            found.add(node.module)
            found.update(f"{node.module}.{alias.name}" for alias in node.names)
    return found


MODULES = {module_name(path): path for path in PACKAGE.rglob("*.py")}
GRAPH = {name: {target for target in imports(path) if target in MODULES and target != name}
         for name, path in MODULES.items()}


def test_every_module_has_a_layer() -> None:
    assert all(any(name == p or name.startswith(p + ".") for layer in LAYERS for p in layer) for name in MODULES)


def test_no_module_imports_a_higher_layer() -> None:
    upward = sorted(f"{name} -> {target}" for name, targets in GRAPH.items() for target in targets
                    if rank(target) > rank(name))
    assert upward == []


def test_pygls_is_used_only_in_the_rpc_layer() -> None:
    leaks = sorted(f"{name} imports {target}" for name, path in MODULES.items() for target in imports(path)
                   if target.split(".")[0] in RPC_ONLY and not name.startswith("sidecar.rpc"))
    assert leaks == []


def test_there_are_no_import_cycles() -> None:
    state: dict[str, int] = {}
    cycles: list[list[str]] = []

    def visit(name: str, trail: list[str]) -> None:
        state[name] = 1
        for target in sorted(GRAPH[name]):
            if state.get(target) == 1:
                cycles.append([*trail[trail.index(target):], target] if target in trail else [name, target])
            elif target not in state:
                visit(target, [*trail, target])
        state[name] = 2

    for name in sorted(GRAPH):
        if name not in state:
            visit(name, [name])
    assert cycles == []
