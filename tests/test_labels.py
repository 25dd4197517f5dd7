"""The words of a paper (analysis/labels.py): Table 1's columns and baseline rows are read from
the metric table at each call, so a plugin evaluator registered after import is in them."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

from analysis.labels import baseline_rows, table_columns
from analysis.report import probe_panels
from evaluation.metrics import Metric
from mae_core.registry import evaluator

ROOT = Path(__file__).resolve().parents[1]


@pytest.fixture
def a_plugin_probe(fresh_plugins):
    """A plugin evaluator, registered after every module above was imported, that logs a probe
    with a Table 1 column, a panel in the probes figure and its random-init reference."""
    rows = [Metric("probe_ridge_acc", "downstream", "ridge probe", "ridge-probe accuracy", "fraction", False,
                   reference="random_probe_ridge_acc", column="ridge", column_rank=9, figure="probes"),
            Metric("random_probe_ridge_acc", "reference", "ridge-probe accuracy (random init)",
                   "ridge-probe accuracy of a random-init encoder", "fraction", False, table_row="random init")]
    evaluator("ridge", metrics=rows)(lambda model, config, data, *, baselines=None: {})


def test_a_plugin_probe_registered_later_is_a_column_a_baseline_fill_and_a_panel(a_plugin_probe):
    assert list(table_columns())[-1] == "probe_ridge_acc" and table_columns()["probe_ridge_acc"] == "ridge"
    assert baseline_rows()["random init"]["probe_ridge_acc"] == "random_probe_ridge_acc"
    assert probe_panels()[-1] == "probe_ridge_acc"


def test_the_built_in_columns_rows_and_panels_keep_their_order():
    assert table_columns() == {"finetune_acc": "fine-tune", "probe_linear_acc": "linear",
                               "probe_fewshot_acc": "few-shot", "probe_knn_acc": "kNN"}
    assert list(baseline_rows()) == ["random init", "raw pixels", "from scratch"]
    assert probe_panels()[:3] == ("probe_linear_acc", "probe_fewshot_acc", "probe_knn_acc")


def test_no_analysis_module_keeps_a_snapshot_of_its_own_live_function():
    """``NAME = f()`` at module level, with ``f`` defined in the same module, freezes what ``f``
    reads at import time (issue 37 part 5: TABLE_COLUMNS, BASELINE_ROWS, PROBE_PANELS)."""
    found = []
    for path in sorted((ROOT / "analysis").rglob("*.py")):
        tree = ast.parse(path.read_text(encoding="utf-8"))
        functions = {node.name for node in tree.body if isinstance(node, ast.FunctionDef)}
        for node in tree.body:
            value = getattr(node, "value", None) if isinstance(node, (ast.Assign, ast.AnnAssign)) else None
            if isinstance(value, ast.Call) and isinstance(value.func, ast.Name) and value.func.id in functions:
                found.append(f"{path.relative_to(ROOT)}:{node.lineno}")
    assert not found, found
