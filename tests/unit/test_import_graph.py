"""No import circles among dueflow's modules: the graph of every ``import`` in src/dueflow (at
module level, inside functions and under ``TYPE_CHECKING`` alike: each says one module needs
another) has no cycle."""

from __future__ import annotations

import ast
from collections.abc import Iterator, Mapping
from pathlib import Path

SRC = Path(__file__).resolve().parents[2] / "src"


def module_name(path: Path) -> str:
    parts = path.relative_to(SRC).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def modules() -> dict[str, Path]:
    return {module_name(p): p for p in sorted((SRC / "dueflow").rglob("*.py"))}


def imported(tree: ast.AST, here: str, is_package: bool, known: Mapping[str, Path]) -> set[str]:
    """The dueflow modules ``tree`` imports: ``from a.b import c`` is ``a.b.c`` when that is a
    module, else ``a.b``."""
    found: set[str] = set()
    package = here if is_package else here.rpartition(".")[0]
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            found.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                anchor = package.split(".")[: len(package.split(".")) - node.level + 1]
                base = ".".join([*anchor, base] if base else anchor)
            for alias in node.names:
                found.add(f"{base}.{alias.name}" if f"{base}.{alias.name}" in known else base)
    return {name for name in found if name in known and name != here}


def graph() -> dict[str, set[str]]:
    known = modules()
    return {
        name: imported(ast.parse(path.read_text()), name, path.name == "__init__.py", known)
        for name, path in known.items()
    }


def cycles(edges: Mapping[str, set[str]]) -> Iterator[list[str]]:
    """Each strongly connected group of more than one module (Tarjan's algorithm), sorted."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()

    def visit(node: str) -> Iterator[list[str]]:
        index[node] = low[node] = len(index)
        stack.append(node)
        on_stack.add(node)
        for nxt in sorted(edges.get(node, ())):
            if nxt not in index:
                yield from visit(nxt)
                low[node] = min(low[node], low[nxt])
            elif nxt in on_stack:
                low[node] = min(low[node], index[nxt])
        if low[node] == index[node]:
            group = []
            while True:
                top = stack.pop()
                on_stack.discard(top)
                group.append(top)
                if top == node:
                    break
            if len(group) > 1:
                yield sorted(group)

    for node in sorted(edges):
        if node not in index:
            yield from visit(node)


def test_the_graph_is_read():
    edges = graph()
    assert "dueflow.service.deps" in edges["dueflow.bootstrap"]  # from a.b import c: a module
    assert "dueflow.store.db" in edges["dueflow.service.deps"]  # from a.b import C: a name


def test_no_import_circles():
    assert list(cycles(graph())) == []


def test_the_api_calls_use_cases_only():
    """No module of dueflow.api imports a store module: the routes and pages call the use
    cases (dueflow.service), which own the statements."""
    reaching = {
        (name, target)
        for name, targets in graph().items()
        if name == "dueflow.api" or name.startswith("dueflow.api.")
        for target in targets
        if target == "dueflow.store" or target.startswith("dueflow.store.")
    }
    assert reaching == set()
