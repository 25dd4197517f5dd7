"""The results sections of README.md and docs/results/README.md are what the script writes
from the committed reports: no number there is typed by hand."""

from __future__ import annotations

import pytest

from analysis import results_text


def test_the_results_sections_are_the_scripts_output():
    for path, text in results_text.targets().items():
        assert path.read_text(encoding="utf-8") == text, (
            f"{path}: its results section is stale; run .venv/bin/python -m analysis.results_text")


def test_every_committed_report_has_its_claims():
    reports = {p.parent.name for p in results_text.RESULTS.glob("*/trials.csv")}
    assert reports and reports == {p.name for p in results_text.report_folders()}


def test_a_file_without_the_markers_is_refused(tmp_path):
    with pytest.raises(ValueError, match="no <!-- results:begin -->"):
        results_text.splice("# no markers\n", "table", tmp_path / "README.md")
