"""The generated pages (docs/configuration.md, docs/mlflow.md) are what analysis.docs_pages writes,
README.md stays a short entry point, and no relative link in README.md or docs/*.md is broken."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from analysis import docs_pages

ROOT = docs_pages.ROOT
PAGES = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]
LINK = re.compile(r"!?\[[^\]]*\]\(([^)\s]+)\)")  # [text](target) and ![alt](target)


def test_the_generated_pages_are_the_modules_output():
    for path, text in docs_pages.targets().items():
        assert path.is_file() and path.read_text(encoding="utf-8") == text, (
            f"{path.name} is stale; run .venv/bin/python -m analysis.docs_pages")


def test_the_check_flags_a_stale_page(tmp_path, monkeypatch):
    (tmp_path / "docs").mkdir()
    monkeypatch.setattr(docs_pages, "ROOT", tmp_path)
    monkeypatch.setattr(docs_pages, "targets", lambda root=tmp_path: {tmp_path / "docs" / "mlflow.md": "new\n"})
    (tmp_path / "docs" / "mlflow.md").write_text("old\n", encoding="utf-8")
    assert docs_pages.main(["--check"]) == 1
    assert docs_pages.main([]) == 0 and (tmp_path / "docs" / "mlflow.md").read_text() == "new\n"
    assert docs_pages.main(["--check"]) == 0


def test_every_config_key_and_metric_is_on_its_page():
    from evaluation.metrics import METRICS
    from mae_core.config import config_keys

    configuration, mlflow = docs_pages.configuration_page(), docs_pages.mlflow_page()
    assert all(f"| `{key.name}` |" in configuration for key in config_keys())
    assert all(f"| `{name}` |" in mlflow for name in METRICS)


def test_the_readme_is_at_most_150_lines():
    lines = (ROOT / "README.md").read_text(encoding="utf-8").splitlines()
    assert len(lines) <= 150, f"README.md has {len(lines)} lines; move detail to docs/"


def _anchors(page: Path) -> set[str]:
    """GitHub's heading anchors: lower case, punctuation dropped, spaces to hyphens."""
    headings = re.findall(r"^#+ (.+)$", page.read_text(encoding="utf-8"), flags=re.M)
    return {re.sub(r"[^\w\- ]", "", h.strip().lower()).replace(" ", "-") for h in headings}


@pytest.mark.parametrize("page", PAGES, ids=lambda p: p.relative_to(ROOT).as_posix())
def test_every_relative_link_points_to_a_file(page):
    broken = []
    for target in LINK.findall(page.read_text(encoding="utf-8")):
        if re.match(r"[a-z][a-z0-9+.-]*:", target):  # a URL
            continue
        path, _, anchor = target.partition("#")
        file = page.parent / path if path else page
        if not file.exists() or (anchor and file.suffix == ".md" and anchor not in _anchors(file)):
            broken.append(target)
    assert not broken, f"{page.name}: broken links {broken}"
