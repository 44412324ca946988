"""The layers of ``sidecar`` import only downwards, pygls stays in the RPC layer, and there are no cycles."""

from __future__ import annotations

import ast
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
PACKAGE = ROOT / "sidecar"

LAYERS: list[tuple[str, ...]] = [
    ("sidecar", "sidecar.wire", "sidecar.assemble_reply", "sidecar.framing", "sidecar.rows", "sidecar.testing"),
    ("sidecar.config",),
    ("sidecar.engine",),
    ("sidecar.storage", "sidecar.summarizers", "sidecar.importers", "sidecar.agents"),
    ("sidecar.services",),
    ("sidecar.rpc", "sidecar.mcp", "sidecar.proxy", "sidecar.client"),
    ("sidecar.cli", "sidecar.pytest_plugin", "sidecar.__main__"),
]
"""Lowest first: a module may import its own layer and those below, never one above."""
RPC_ONLY = ("pygls", "lsprotocol", "pytest_lsp")


def module_name(path: Path) -> str:
    parts = path.relative_to(ROOT).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def place(module: str) -> tuple[int, str]:
    """The layer of ``module`` and the package (a prefix in LAYERS) it belongs to."""
    best, found = (0, "sidecar"), -1
    for index, prefixes in enumerate(LAYERS):
        for prefix in prefixes:
            if (module == prefix or module.startswith(prefix + ".")) and len(prefix) > found:
                best, found = (index, prefix), len(prefix)
    return best


def place_in(module: str, prefixes: tuple[str, ...]) -> str | None:
    """The prefix among ``prefixes`` that ``module`` is or is inside, if any."""
    return next((p for p in prefixes if module == p or module.startswith(p + ".")), None)


def rank(module: str) -> int:
    return place(module)[0]


def cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """Every cycle a depth-first walk of ``graph`` meets, as the names along it."""
    state: dict[str, int] = {}
    found: list[list[str]] = []

    def visit(name: str, trail: list[str]) -> None:
        state[name] = 1
        for target in sorted(graph.get(name, ())):
            if state.get(target) == 1:
                found.append([*trail[trail.index(target):], target] if target in trail else [name, target])
            elif target not in state:
                visit(target, [*trail, target])
        state[name] = 2

    for name in sorted(graph):
        if name not in state:
            visit(name, [name])
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
PACKAGES: dict[str, set[str]] = {}
for _name, _targets in GRAPH.items():
    PACKAGES.setdefault(place(_name)[1], set()).update(place(t)[1] for t in _targets if place(t)[1] != place(_name)[1])


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
    assert cycles(GRAPH) == []


def test_no_two_packages_import_each_other() -> None:
    """Packages of one layer may import each other, but not both ways (an arrow up the layer's own order)."""
    assert cycles(PACKAGES) == []


def test_testing_imports_only_the_standard_library() -> None:
    """Test doubles stay on the lowest layer: a test can use them without loading the sidecar."""
    testing = {name: path for name, path in MODULES.items() if name.startswith("sidecar.testing")}
    allowed = (*sys.stdlib_module_names, "sidecar.testing")
    outside = sorted(f"{name} imports {target}" for name, path in testing.items() for target in imports(path)
                     if place_in(target, allowed) is None)
    assert outside == []
