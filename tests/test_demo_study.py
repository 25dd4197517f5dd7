"""The demo study (`make demo`: fashion_mask_ratio, issue 34 part 4): Fashion-MNIST's whole test
split in every full-grid cell, claims enough to decide, and its smoke cell run end to end on a small
MNIST-format fixture, so the file is tested where Debian's dataset-fashion-mnist is absent."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from analysis import results_text
from mae_core.config import Config
from mae_core.data import prepare_data
from studies.named_studies import STUDIES
from studies.trial import run_trial
from test_idx import write_idx

ROOT = Path(__file__).resolve().parent.parent
DEMO = STUDIES[results_text.DEMO]


def test_make_demo_runs_the_study_whose_report_the_readme_shows():
    makefile = (ROOT / "Makefile").read_text(encoding="utf-8")
    assert re.search(rf"^DEMO_STUDY\s*:=\s*{results_text.DEMO}$", makefile, re.M)
    assert "<!-- demo:begin -->" in (ROOT / "README.md").read_text(encoding="utf-8")


def test_every_full_cell_reads_the_whole_fashion_mnist_test_split():
    configs = DEMO.configs()
    assert len(configs) == 10 and {c.mask_ratio for c in configs} == {0.25, 0.75}
    for config in configs:
        assert config.dataset == "fashion_mnist" and config.test_limit is None  # all 10,000 images
        assert config.train_limit == 5000 and config.num_patches == 16
    assert DEMO.reference_cell() == {"mask_ratio": 0.75}
    assert len(DEMO.claims) >= 4 and all(c.get("metric") for c in DEMO.claims)


@pytest.mark.slow  # trains and fine-tunes: about a minute on two shared cores
def test_the_smoke_cell_trains_and_logs_every_metric_its_claims_read(tmp_path, monkeypatch):
    write_idx(tmp_path / "data" / "fashion-mnist", n_train=300, n_test=60, gz=True)
    monkeypatch.setenv("MAE_STUDY_DATA", str(tmp_path / "data"))
    smoke = DEMO.smoke()
    cell = next(c for c in smoke.cells() if c["mask_ratio"] == 0.75)
    config = Config(**cell)
    assert config.test_limit == 48 and config.eval.scratch_max_steps == 40  # seconds, not minutes
    outcome = run_trial(config, prepare_data(config), tracking_uri=f"sqlite:///{tmp_path / 'mlflow.db'}")
    read = {c[key] for c in DEMO.claims for key in ("metric", "baseline") if c.get(key)}
    missing = read - set(outcome.metrics)
    assert not missing, f"the demo's claims read metrics its trials do not log: {sorted(missing)}"
