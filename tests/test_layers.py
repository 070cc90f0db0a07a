"""Layers point one way (issue #12), checked from the source alone.

Every import statement in p2psync/ counts: at module level, inside functions and under
``if TYPE_CHECKING:`` -- a cycle hidden behind a late import is still a cycle. The layer table
below is the one of the import-linter contract in pyproject.toml (``lint-imports``); keep the
two the same.
"""

from __future__ import annotations

import ast
from collections import defaultdict
from dataclasses import dataclass
from functools import cache
from pathlib import Path

import pytest

PACKAGE = "p2psync"
SOURCE = Path(__file__).resolve().parent.parent / PACKAGE

#: Bottom first. A top-level part of p2psync imports only from its own layer's part or from a
#: layer below; parts that share a layer are independent (neither imports the other).
#: ``errors`` (the error tree) sits under dwn and blip, which both raise its classes. home and
#: extras are the CLI's own (p2psync/cli/home.py, p2psync/cli/extras.py).
LAYERS: tuple[tuple[str, ...], ...] = (
    ("errors",),
    ("dwn", "blip"),
    ("replication",),
    ("state",),
    ("peer", "sim"),
    ("discovery", "pipeline", "conformance"),
    ("node",),
    ("demo",),
    ("cli",),
    ("__main__",),
)

#: Imports the layer order would allow but the design does not: replication is sans-I/O
#: protocol logic and knows no transport; the simulator drives protocol objects without one.
FORBIDDEN: tuple[tuple[str, str], ...] = (("replication", "blip"), ("sim", "blip"))

#: Who may import the CLI: the CLI itself and ``python -m p2psync``.
CLI = "cli"
CLI_IMPORTERS = frozenset({"cli", "__main__"})


@dataclass(frozen=True)
class Import:
    importer: str
    imported: str
    path: Path
    line: int

    def where(self) -> str:
        return f"{self.path.relative_to(SOURCE.parent)}:{self.line}: {self.importer} imports {self.imported}"


def _module_name(path: Path) -> str:
    parts = path.relative_to(SOURCE.parent).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


@cache
def _modules() -> dict[str, Path]:
    return {_module_name(p): p for p in sorted(SOURCE.rglob("*.py"))}


def _closest_module(name: str, modules: dict[str, Path]) -> str:
    """``name`` or its nearest enclosing module (``p2psync.x.attr`` -> ``p2psync.x``)."""
    while name not in modules and "." in name:
        name = name.rsplit(".", 1)[0]
    return name


def _targets(module: str, path: Path, node: ast.Import | ast.ImportFrom, modules: dict[str, Path]) -> list[str]:
    """The p2psync modules one import statement names."""
    if isinstance(node, ast.Import):
        names = [alias.name for alias in node.names]
    else:
        if node.level:
            package = module.split(".") if path.name == "__init__.py" else module.split(".")[:-1]
            base = ".".join(package[: len(package) - (node.level - 1)])
            prefix = f"{base}.{node.module}" if node.module else base
        else:
            prefix = node.module or ""
        # ``from pkg import name``: a submodule when ``pkg.name`` is one, else an attribute of pkg.
        names = [f"{prefix}.{alias.name}" if f"{prefix}.{alias.name}" in modules else prefix for alias in node.names]
    return [_closest_module(n, modules) for n in names if n == PACKAGE or n.startswith(PACKAGE + ".")]


@cache
def _imports() -> tuple[Import, ...]:
    modules = _modules()
    found = []
    for module, path in modules.items():
        tree = ast.parse(path.read_text(), filename=str(path))
        for node in ast.walk(tree):  # every statement: module level, in functions, under TYPE_CHECKING
            if isinstance(node, ast.Import | ast.ImportFrom):
                for target in _targets(module, path, node, modules):
                    if target != module:
                        found.append(Import(module, target, path, node.lineno))
    return tuple(found)


def _part(module: str) -> str:
    """The top-level part of p2psync a module belongs to (``p2psync.node.links`` -> ``node``)."""
    parts = module.split(".")
    return parts[1] if len(parts) > 1 else ""


def _layer_of() -> dict[str, int]:
    return {part: level for level, parts in enumerate(LAYERS) for part in parts}


def _cycles(edges: dict[str, set[str]]) -> list[list[str]]:
    """Strongly connected components of more than one module (Tarjan, iterative)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    found: list[list[str]] = []
    counter = 0
    for root in sorted(edges):
        if root in index:
            continue
        work = [(root, iter(sorted(edges[root])))]
        index[root] = low[root] = counter
        counter += 1
        stack.append(root)
        on_stack.add(root)
        while work:
            node, children = work[-1]
            child = next(children, None)
            if child is not None:
                if child not in index:
                    index[child] = low[child] = counter
                    counter += 1
                    stack.append(child)
                    on_stack.add(child)
                    work.append((child, iter(sorted(edges.get(child, ())))))
                elif child in on_stack:
                    low[node] = min(low[node], index[child])
                continue
            work.pop()
            if work:
                low[work[-1][0]] = min(low[work[-1][0]], low[node])
            if low[node] == index[node]:
                component = []
                while True:
                    member = stack.pop()
                    on_stack.discard(member)
                    component.append(member)
                    if member == node:
                        break
                if len(component) > 1:
                    found.append(sorted(component))
    return found


def _one_loop(component: list[str], edges: dict[str, set[str]]) -> list[str]:
    """A shortest path from the component's first module back to itself, to show the cycle."""
    start, inside = component[0], set(component)
    previous: dict[str, str] = {}
    frontier = [start]
    while frontier:
        following = []
        for node in frontier:
            for child in sorted(edges.get(node, ())):
                if child == start:
                    loop = [start]
                    while node != start:
                        loop.append(node)
                        node = previous[node]
                    return [start, *reversed(loop[1:]), start]
                if child in inside and child not in previous:
                    previous[child] = node
                    following.append(child)
        frontier = following
    return component


def test_the_walk_sees_late_and_type_checking_imports() -> None:
    """The graph is only as good as the walk: it must count what a top-level scan would miss."""
    source = """
from typing import TYPE_CHECKING
if TYPE_CHECKING:
    from p2psync.node.config import NodeConfig
def f():
    from . import sibling
    import p2psync.dwn.store
"""
    modules = {"p2psync.cli.x": SOURCE / "cli" / "x.py", "p2psync.cli.sibling": SOURCE / "cli" / "sibling.py",
               "p2psync.node.config": SOURCE / "node" / "config.py", "p2psync.dwn.store": SOURCE / "dwn" / "store.py"}
    seen = [t for node in ast.walk(ast.parse(source)) if isinstance(node, ast.Import | ast.ImportFrom)
            for t in _targets("p2psync.cli.x", SOURCE / "cli" / "x.py", node, modules)]
    assert seen == ["p2psync.node.config", "p2psync.cli.sibling", "p2psync.dwn.store"]
    assert len(_imports()) > 100  # the real tree: a broken walk would find nothing and pass


def test_no_import_cycles() -> None:
    edges: dict[str, set[str]] = defaultdict(set)
    for imp in _imports():
        edges[imp.importer].add(imp.imported)
    cycles = _cycles(edges)
    lines = [f"{len(c)} modules: {', '.join(c)}\n    e.g. {' -> '.join(_one_loop(c, edges))}" for c in cycles]
    if cycles:
        pytest.fail("import cycles:\n  " + "\n  ".join(lines), pytrace=False)


def test_nothing_imports_the_cli() -> None:
    offenders = [imp.where() for imp in _imports()
                 if _part(imp.imported) == CLI and _part(imp.importer) not in CLI_IMPORTERS]
    if offenders:
        pytest.fail("only p2psync.cli and __main__ may import the CLI:\n  " + "\n  ".join(offenders), pytrace=False)


def test_every_part_has_a_layer() -> None:
    layer_of = _layer_of()
    unknown = sorted({_part(m) for m in _modules()} - set(layer_of) - {""})
    assert not unknown, f"add {unknown} to LAYERS here and to the contract in pyproject.toml"


def test_imports_point_down_the_layers() -> None:
    layer_of = _layer_of()
    offenders = []
    for imp in _imports():
        src, dst = _part(imp.importer), _part(imp.imported)
        if src == dst or dst == "" or src not in layer_of or dst not in layer_of:
            continue  # inside one part, the package root (__version__), or unknown (the test above)
        if layer_of[dst] > layer_of[src]:
            offenders.append(f"{imp.where()} (up: {src} is below {dst})")
        elif layer_of[dst] == layer_of[src]:
            offenders.append(f"{imp.where()} ({src} and {dst} share a layer and are independent)")
        elif (src, dst) in FORBIDDEN:
            offenders.append(f"{imp.where()} (forbidden: {src} must not use {dst})")
    if offenders:
        pytest.fail("imports against the layers:\n  " + "\n  ".join(offenders), pytrace=False)


#: What sans-I/O protocol code never touches: an event loop, a socket, a clock, a thread, a
#: database, a WebSocket (issue #12: "no trio, no clock, no socket and no SQLite inside").
IO_MODULES = frozenset({"trio", "anyio", "asyncio", "socket", "ssl", "time", "threading", "apsw", "sqlite3",
                        "websockets", "zeroconf"})


def test_the_replication_core_imports_no_io() -> None:
    offenders: list[str] = []
    for path in sorted((SOURCE / "replication").rglob("*.py")):
        for node in ast.walk(ast.parse(path.read_text(), str(path))):
            names: list[str] = []
            if isinstance(node, ast.Import):
                names = [alias.name for alias in node.names]
            elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
                names = [node.module]
            offenders += [f"{path.relative_to(SOURCE.parent)}:{node.lineno}: {name}"
                          for name in names if name.split(".")[0] in IO_MODULES]
    assert offenders == [], "\n".join(offenders)
