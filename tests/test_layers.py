"""The house has no import circle and no arrow up (issue 27 part 4).

Every import in the four packages, at module level or inside a function, is an edge of one
graph. The layers, lowest first: ``mae_core`` (the engine), ``evaluation`` (risks and probes),
``analysis`` (reports from runs), ``studies`` (Ray, MLflow and the command line). A module may
import its own layer and the ones below, never one above; and no chain of imports between
modules leads back to where it started.
"""

from __future__ import annotations

import ast
from pathlib import Path

import networkx as nx

ROOT = Path(__file__).resolve().parents[1]
LAYERS = ("mae_core", "evaluation", "analysis", "studies")


def _module_name(path: Path) -> str:
    parts = path.relative_to(ROOT).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def _imports(path: Path, module: str) -> set[str]:
    """First-party modules ``path`` imports (relative imports resolved; ``from X import name``
    counts X.name when that is a module, X otherwise)."""
    package = module if path.name == "__init__.py" else module.rpartition(".")[0]
    found = set()
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
        if isinstance(node, ast.Import):
            found |= {alias.name for alias in node.names}
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                anchor = package.split(".")[: len(package.split(".")) - node.level + 1]
                base = ".".join([*anchor, *([base] if base else [])])
            found |= {f"{base}.{alias.name}" for alias in node.names} | {base}
    return {name for name in found if name.split(".")[0] in LAYERS}


def import_graph() -> nx.DiGraph:
    modules = {_module_name(p): p for layer in LAYERS for p in (ROOT / layer).rglob("*.py")}
    graph = nx.DiGraph()
    graph.add_nodes_from(modules)
    for module, path in modules.items():
        for target in _imports(path, module):
            while target not in modules and "." in target:  # X.name where name is not a module
                target = target.rpartition(".")[0]
            if target in modules and target != module and not module.startswith(target + "."):
                graph.add_edge(module, target)
    return graph


def test_no_module_imports_a_layer_above_its_own():
    rank = {layer: i for i, layer in enumerate(LAYERS)}
    up = [(a, b) for a, b in import_graph().edges if rank[b.split(".")[0]] > rank[a.split(".")[0]]]
    assert not up, up


def test_no_import_circle_between_modules():
    graph = import_graph()
    # a package's __init__ re-exporting its own modules is not a circle of the design
    graph.remove_edges_from([(a, b) for a, b in list(graph.edges) if b.startswith(a + ".") or a.startswith(b + ".")])
    cycles = list(nx.simple_cycles(graph))
    assert not cycles, cycles[:5]
