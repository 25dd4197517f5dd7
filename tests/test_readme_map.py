"""tests/README.md maps every module to the tests that exercise it (issue 37 part 6).

``python tests/test_readme_map.py`` prints the table afresh: a module's own test file first
(``test_<module>.py``), then the test files that import it, by path, four at most and a count of
the rest. The test below fails when a module has no row or a row names a module that is gone.
"""

from __future__ import annotations

import ast
import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
PACKAGES = ("analysis", "evaluation", "mae_core", "studies")
SHOWN = 4  # test files named per row; the rest are counted


def modules() -> list[str]:
    """Every first-party module as a path (``studies/cli/run.py``), ``__init__`` and ``__main__`` left out."""
    return sorted(str(path.relative_to(ROOT)) for package in PACKAGES for path in (ROOT / package).rglob("*.py")
                  if path.stem not in ("__init__", "__main__"))


def _imported(path: Path) -> set[str]:
    """Dotted first-party names a test file imports, each ``from X import name`` as X and X.name."""
    names = set()
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
        if isinstance(node, ast.Import):
            names.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom) and node.module and not node.level:
            names.add(node.module)
            names.update(f"{node.module}.{alias.name}" for alias in node.names)
    return names


def rows() -> dict[str, list[str]]:
    """Module path -> the test files (relative to tests/) that test it, own file first."""
    tests = sorted((ROOT / "tests").rglob("test_*.py"))
    imports = {path: _imported(path) for path in tests}
    stems = [Path(module).stem for module in modules()]
    table = {}
    for module in modules():
        dotted = module.removesuffix(".py").replace("/", ".")
        own = [p for p in tests if p.name == f"test_{Path(module).stem}.py" and p.parent.name == "tests"
               and (dotted in imports[p] or stems.count(Path(module).stem) == 1)]  # two labels.py: the one it imports
        others = [p for p in tests if p not in own and dotted in imports[p]]
        table[module] = [str(p.relative_to(ROOT / "tests")) for p in own + others]
    return table


def markdown() -> str:
    lines = ["| module | tests |", "| --- | --- |"]
    for module, files in rows().items():
        named = ", ".join(f"`{f}`" for f in files[:SHOWN]) + (f" (+{len(files) - SHOWN})" if len(files) > SHOWN else "")
        lines.append(f"| `{module}` | {named or '— (no test imports it directly)'} |")
    return "\n".join(lines)


def test_every_module_has_one_row_and_every_row_a_module():
    text = (ROOT / "tests" / "README.md").read_text(encoding="utf-8")
    listed = re.findall(r"^\| `([\w/]+\.py)` \|", text, re.M)
    assert sorted(listed) == modules(), "python tests/test_readme_map.py prints the table afresh"


if __name__ == "__main__":
    print(markdown())
