"""One trial end to end against a real MLflow store (no Ray): crash, damaged checkpoint, resume."""

from __future__ import annotations

import pytest
from conftest import tiny_config
from mlflow.tracking import MlflowClient

from evaluation import evaluate_trial
from mae_core import build_model, prepare_data
from mae_core.config import EvalConfig
from studies.trial import run_trial


class Crash(Exception):
    """Stands in for the trial crashing right after a checkpoint."""


def test_truncated_checkpoint_falls_back_to_previous_with_a_warning_in_the_run(tmp_path):
    config = tiny_config(steps=30, checkpoint_every=10, log_every=5)
    data = prepare_data(config)
    uri = f"sqlite:///{tmp_path}/mlflow.db"
    checkpoint = tmp_path / "trial.pt"

    def crash_at_20(step, path):
        if step == 20:
            raise Crash

    with pytest.raises(Crash):
        run_trial(config, data, tracking_uri=uri, checkpoint_path=checkpoint, on_checkpoint=crash_at_20)
    client = MlflowClient(uri)
    (run,) = client.search_runs([client.get_experiment_by_name("mae-study").experiment_id])
    assert run.info.status == "FAILED" and run.data.tags["failure_reason"] == "Crash"  # an error, not a signal

    checkpoint.write_bytes(checkpoint.read_bytes()[: checkpoint.stat().st_size // 2])  # crash mid-write
    outcome = run_trial(config, data, tracking_uri=uri, checkpoint_path=checkpoint)

    assert outcome.run_id == run.info.run_id, "the same MLflow run was reopened"
    finished = client.get_run(outcome.run_id)
    assert finished.info.status == "FINISHED"
    assert "cannot be read" in finished.data.tags["checkpoint_warning"]
    assert finished.data.tags["resumed_from_step"] == "10"
    assert finished.data.tags["retried_after"] == "Crash" and "failure_reason" not in finished.data.tags
    steps = [m.step for m in client.get_metric_history(outcome.run_id, "train_loss")]
    assert sorted(steps) == list(range(5, 31, 5)), "no step lost, none logged twice"


def test_a_trial_run_carries_the_standard_source_tags_and_logs_each_value_once(tmp_path):
    import subprocess
    from pathlib import Path

    from mlflow.utils.mlflow_tags import MLFLOW_GIT_COMMIT, MLFLOW_SOURCE_NAME, MLFLOW_SOURCE_TYPE, MLFLOW_USER

    from studies.tracking import user

    config = tiny_config(steps=4, **{"eval.finetune_steps": 2, "eval.finetune_shots": 2, "eval.finetune_blocks": 1})
    uri = f"sqlite:///{tmp_path}/mlflow.db"
    outcome = run_trial(config, prepare_data(config), tracking_uri=uri)
    run = MlflowClient(uri).get_run(outcome.run_id)

    tags = run.data.tags
    assert tags[MLFLOW_SOURCE_NAME] == "mae-study"
    assert tags[MLFLOW_SOURCE_TYPE] == "LOCAL"
    assert tags[MLFLOW_USER] == user() == run.info.user_id
    head = subprocess.run(["git", "rev-parse", "HEAD"], capture_output=True, text=True,
                          cwd=Path(__file__).resolve().parent).stdout.strip()
    assert tags[MLFLOW_GIT_COMMIT] == head
    assert "git_commit" not in tags, "the standard tag replaced the custom one"

    params, metrics = run.data.params, run.data.metrics
    assert not set(params) & set(metrics), "each value is logged once, as a param or as a metric"
    assert float(params["effective_mask_ratio"]) == config.effective_mask_ratio
    assert (params["eval.finetune_shots"], params["eval.finetune_blocks"]) == ("2", "1")
    assert "partial_finetune_acc" in metrics and "test_mae_risk" in metrics


def test_a_trial_logs_its_baselines_and_trust_metrics(tmp_path):
    """Pixel probes, both from-scratch fine-tuning baselines, the duplicate count and the MAE's
    all-visible error (never as test_rec_risk) reach the MLflow run; eval.* settings as params."""
    # every evaluator and option on, so that every metric a trial can log is checked below
    config = tiny_config(steps=3, **{"eval.finetune_steps": 2, "eval.fewshot": 2, "eval.fewshot_draws": 2,
                                     "eval.probe_blocks": 1, "eval.finetune_blocks": 1, "eval.every": 3})
    uri = f"sqlite:///{tmp_path}/mlflow.db"
    outcome = run_trial(config, prepare_data(config), tracking_uri=uri)
    run = MlflowClient(uri).get_run(outcome.run_id)
    metrics, params = run.data.metrics, run.data.params
    for name in ("pixel_probe_linear_acc", "pixel_probe_fewshot_acc", "pixel_probe_knn_acc",
                 "random_probe_linear_acc", "probe_linear_acc", "finetune_acc", "random_finetune_acc",
                 "scratch_best_finetune_acc", "finetune_best_acc"):
        assert 0.0 <= metrics[name] <= 1.0, name
    assert metrics["scratch_best_finetune_steps"] in (1, 2, 3, 4, 5, 6, 7, 8)
    assert metrics["finetune_best_steps"] in (1, 2, 3, 4, 5, 6, 7, 8)
    assert metrics["data_train_test_duplicates"] == 0.0
    assert metrics["probe_val_size"] > 0
    assert "test_allvisible_rec_risk" in metrics and "test_rec_risk" not in metrics
    assert "test_mae_risk" in metrics
    assert params["eval.val_fraction"] == "0.2" and params["eval.scratch_max_steps"] == "None"
    assert params["eval.linear_cs"] == "(0.01, 0.1, 1.0, 10.0, 100.0)"
    # the paper's probe and fine-tuning keys, at their defaults (today's probes and fine-tuning)
    assert (params["eval.features"], params["eval.linear_head"], params["eval.bn_linear_lrs"]) == (
        "auto", "logreg", "(0.01, 0.1, 1.0, 10.0)")
    assert (params["eval.finetune_layer_decay"], params["eval.finetune_warmup_fraction"],
            params["eval.finetune_schedule"]) == ("1.0", "0.0", "constant")
    assert {f"eval.{key}" for key in EvalConfig.model_fields} <= set(params)
    # every metric a trial logs is a row of the one metric table (labels, units, directions)
    from evaluation.metrics import METRICS

    assert [name for name in metrics if name not in METRICS and not name.startswith("system/")] == []  # MLflow's own
    assert {"probe_linear_acc_block1", "partial_finetune_acc", "online_knn_acc", "flops_per_update"} <= set(metrics)


def test_the_ae_logs_its_reconstruction_risk():
    config = tiny_config(objective="ae")
    data = prepare_data(config)
    metrics = evaluate_trial(build_model(config), config, data, probes=False)
    assert "test_rec_risk" in metrics and "test_allvisible_rec_risk" not in metrics
    assert metrics["data_train_test_duplicates"] == 0.0


def test_the_duplicate_count_is_logged_whatever_the_evaluators():
    """The leak check is the data's bookkeeping: a probes-only evaluation (the demo's) logs it
    too, and repeats log it once, without a spread."""
    config = tiny_config(**{"eval.evaluators": ["probes"], "eval.repeats": 2})
    metrics = evaluate_trial(build_model(config), config, prepare_data(config))
    assert "test_baseline_risk" not in metrics and "probe_linear_acc" in metrics
    assert metrics["data_train_test_duplicates"] == 0.0 and "data_train_test_duplicates_sd" not in metrics


def test_planted_duplicates_reach_the_trial_metrics(tmp_path):
    import warnings

    import numpy as np

    rng = np.random.default_rng(0)
    images = rng.integers(0, 256, (12, 8, 8), dtype=np.uint8)
    test_images = np.concatenate([images[[2, 5, 5]], rng.integers(0, 256, (3, 8, 8), dtype=np.uint8)])
    np.savez(tmp_path / "d.npz", images=images, labels=np.arange(12) % 2, test_images=test_images,
             test_labels=np.zeros(6, np.int64))
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # the DuplicateSplitWarning itself is test_data's business
        config = tiny_config(dataset=f"npz:{tmp_path / 'd.npz'}", train_limit=None, test_limit=None)
        data = prepare_data(config)
        assert data.train_test_duplicates == 3
        assert prepare_data(config.with_updates(test_limit=2)).train_test_duplicates == 2  # the images kept
    metrics = evaluate_trial(build_model(config), config, data, probes=False)
    assert metrics["data_train_test_duplicates"] == 3.0


def test_a_trial_logs_its_reconstructions_as_arrays_a_report_can_redraw(tmp_path):
    import numpy as np

    from evaluation import reconstruction_grid

    config = tiny_config(steps=4, target="norm_eps", mask_ratio=0.5)
    uri = f"sqlite:///{tmp_path}/mlflow.db"
    outcome = run_trial(config, prepare_data(config), tracking_uri=uri)
    client = MlflowClient(uri)
    assert {a.path for a in client.list_artifacts(outcome.run_id)} >= {"reconstructions.png",
                                                                       reconstruction_grid.ARTIFACT}
    grid = reconstruction_grid.load_npz(client.download_artifacts(outcome.run_id, reconstruction_grid.ARTIFACT,
                                                                  str(tmp_path)))
    assert grid.original.shape == grid.reconstruction.shape == (8, 8, 8, 1) and grid.hidden.shape == (8, 8, 8)
    assert grid.target == "norm_eps" and grid.denormalised and grid.objective == "mae"
    # every image hides exactly the effective ratio of its pixels (patch 2: whole patches)
    assert np.allclose(grid.hidden.mean(axis=(1, 2)), config.effective_mask_ratio)
    assert np.array_equal(grid.shown[~grid.hidden], grid.original[~grid.hidden])
