"""The words of a paper (analysis/labels.py): Table 1's columns and baseline rows are read from
the metric table, and the values of objectives, targets and corruptions from their registry
entries' labels, at each call, so a plugin registered after import is in them."""

from __future__ import annotations

import ast
from pathlib import Path

import numpy as np
import pytest

from analysis import figures
from analysis.labels import PART_REGISTRIES, VALUE_LABELS, baseline_rows, table_columns, value_text
from analysis.report_figures import probe_panels
from evaluation.metrics import Metric
from mae_core.registry import corruption, evaluator, objective

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


def test_a_plugin_probe_registered_later_has_its_reference_drawn_as_a_band(a_plugin_probe):
    assert figures._baselines("probe_ridge_acc") == ("random_probe_ridge_acc",)
    assert figures._baselines("probe_linear_acc") == ("random_probe_linear_acc", "pixel_probe_linear_acc")
    assert figures._baselines("probe_linear_acc_block2") == ()  # a layer's panel: no final-layer bands


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


@pytest.mark.parametrize("axis, value, text", [
    ("objective", "mae", "MAE"), ("objective", "ae", "AE"), ("objective", "dae", "DAE"),
    ("target", "raw", "pixel (w/o norm)"), ("target", "norm", "pixel (w/ norm)"),
    ("target", "norm_eps", "pixel (w/ norm+ε)"), ("corruption", "salt_pepper", "salt & pepper"),
    ("corruption", "gaussian", "gaussian"), ("corruption", "none", "none"), ("corruption", None, "none"),
    ("mask_token_in_encoder", False, "not in encoder"), ("class_token", True, "class token"),
    ("mask_token_in_encoder", 1, "1"), ("decoder_depth", np.int64(4), "4"), ("lr", 1e-05, "1e-05"),
])
def test_values_read_as_the_paper_writes_them(axis, value, text):
    assert value_text(axis, value) == text


def test_a_registered_part_reads_as_its_entrys_label_and_nowhere_else(fresh_plugins):
    corruption("speckle", label="speckle noise")(lambda patches, level, generator: patches)
    objective("noisy_ae", masked=False, corrupted=True)
    assert value_text("corruption", "speckle") == "speckle noise"
    assert value_text("objective", "noisy_ae") == "noisy_ae"  # no label: the name
    assert not set(PART_REGISTRIES) & set(VALUE_LABELS)  # labelled where registered, not restated here
