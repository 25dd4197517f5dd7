"""The house has no import circle and no arrow up (issue 27 part 4).

Every import in the four packages, at module level or inside a function, is an edge of one
graph. The layers, lowest first: ``mae_core`` (the engine), ``evaluation`` (risks and probes),
``analysis`` (reports from runs), ``studies`` (Ray, MLflow and the command line). A module may
import its own layer and the ones below, never one above; and no chain of imports between
modules leads back to where it started.

A module named by a string is imported too, only later: ``importlib.import_module("x.y")``,
``__import__("x")``, or a dotted string that is a first-party module's name handed to code that
imports it (``Registry(..., builtins="evaluation.evaluators")``). Those count for the layer rule
(an arrow up by string is still an arrow up), not for circles: a late import is how a registry
loads the parts that register themselves with it (``mae_core.registry`` <-> ``builtin_parts``).
"""

from __future__ import annotations

import ast
from pathlib import Path

import networkx as nx

ROOT = Path(__file__).resolve().parents[1]
LAYERS = ("mae_core", "evaluation", "analysis", "studies")
IMPORT_CALLS = ("import_module", "__import__")  # importlib.import_module(name), __import__(name)
# The arrows up by string the design allows, each with why. The registry of evaluators lives in
# mae_core, since the config (mae_core) checks ``eval.evaluators`` against its names, but the
# built-in evaluators (risks, probes) need the evaluation layer: the registry imports them on its
# first use by name, as it imports a plugin's parts. Everything else imports nothing above.
ALLOWED_UP_BY_STRING = {("mae_core.registry", "evaluation.evaluators")}


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


def _string_imports(path: Path, modules) -> set[str]:
    """First-party modules ``path`` names by string: the first argument of an
    :data:`IMPORT_CALLS` call, or any string constant that is exactly a dotted name in ``modules``."""
    found = set()
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
        if isinstance(node, ast.Call) and node.args and isinstance(node.args[0], ast.Constant):
            called = node.func.attr if isinstance(node.func, ast.Attribute) else getattr(node.func, "id", None)
            if called in IMPORT_CALLS and isinstance(node.args[0].value, str):
                found.add(node.args[0].value)
        if isinstance(node, ast.Constant) and isinstance(node.value, str) and "." in node.value \
                and node.value in modules:
            found.add(node.value)
    return {name for name in found if name.split(".")[0] in LAYERS}


def import_graph(strings: bool = False) -> nx.DiGraph:
    """Module -> the first-party modules it imports; ``strings``: and those it names by string."""
    modules = {_module_name(p): p for layer in LAYERS for p in (ROOT / layer).rglob("*.py")}
    graph = nx.DiGraph()
    graph.add_nodes_from(modules)
    for module, path in modules.items():
        for target in _imports(path, module) | (_string_imports(path, modules) if strings else set()):
            while target not in modules and "." in target:  # X.name where name is not a module
                target = target.rpartition(".")[0]
            if target in modules and target != module and not module.startswith(target + "."):
                graph.add_edge(module, target)
    return graph


def _arrows_up(graph: nx.DiGraph) -> set[tuple[str, str]]:
    rank = {layer: i for i, layer in enumerate(LAYERS)}
    return {(a, b) for a, b in graph.edges if rank[b.split(".")[0]] > rank[a.split(".")[0]]}


def test_no_module_imports_a_layer_above_its_own():
    up = _arrows_up(import_graph())
    assert not up, up


def test_no_module_names_a_layer_above_its_own_by_string_but_the_allowed_ones():
    up = _arrows_up(import_graph(strings=True))
    assert up - ALLOWED_UP_BY_STRING == set(), up - ALLOWED_UP_BY_STRING
    assert ALLOWED_UP_BY_STRING <= up  # an allowance nothing needs any more goes


def test_string_imports_are_seen(tmp_path):
    """The scanner finds each way a module is named by string, and skips words that are no module."""
    source = tmp_path / "late.py"
    source.write_text("import importlib\n"
                      "importlib.import_module('studies.runner')\n"
                      "__import__('analysis')\n"
                      "entries = Registry('eval.evaluators', builtins='evaluation.probes')\n"
                      "TAG = 'evaluation'  # a tag's name, not an import\n"
                      "doc = 'see evaluation.probes for more'\n", encoding="utf-8")
    modules = {"studies.runner", "analysis", "evaluation", "evaluation.probes"}
    assert _string_imports(source, modules) == {"studies.runner", "analysis", "evaluation.probes"}


def test_no_import_circle_between_modules():
    graph = import_graph()
    # a package's __init__ re-exporting its own modules is not a circle of the design
    graph.remove_edges_from([(a, b) for a, b in list(graph.edges) if b.startswith(a + ".") or a.startswith(b + ".")])
    cycles = list(nx.simple_cycles(graph))
    assert not cycles, cycles[:5]
