"""What a trial logs beside params and metrics: dataset inputs with content digests, and the
encoder as an ``mlflow.pytorch`` model (once, within a size cap, or not at all when asked)."""

from __future__ import annotations

import mlflow
import mlflow.pytorch
import numpy as np
import pytest
import torch
from conftest import tiny_config
from mlflow.tracking import MlflowClient

from mae_core import build_model, prepare_data
from studies import run_artifacts, tracking


def test_the_digest_reads_the_whole_content():
    patches = torch.zeros(20_000, 4)  # more than the 10,000 values MLflow's own digest reads
    labels = np.zeros(20_000, np.int64)
    same = run_artifacts.content_digest(patches.clone(), labels.copy())
    assert run_artifacts.content_digest(patches, labels) == same and len(same) == run_artifacts.DIGEST_CHARS
    patches[-1, -1] = 1.0  # the very last value
    assert run_artifacts.content_digest(patches, labels) != same
    assert run_artifacts.content_digest(patches.double(), labels) != run_artifacts.content_digest(patches, labels)


def _run(tmp_path) -> tuple[str, MlflowClient, str]:
    uri = tracking.default_tracking_uri(tmp_path)
    client = MlflowClient(uri)
    experiment = tracking.ensure_experiment(client, "mae-study", uri)
    return uri, client, tracking.create_run(client, experiment, "trial")


def test_an_encoder_over_the_cap_or_switched_off_is_not_logged_and_the_run_says_why(tmp_path):
    uri, client, run_id = _run(tmp_path)
    config = tiny_config(log_model_max_mb=0.001)  # a kilobyte: the tiny encoder is larger
    model = build_model(config)
    size = run_artifacts.encoder_megabytes(run_artifacts.feature_encoder(model))
    assert run_artifacts.log_encoder(client, run_id, model, config, torch.zeros(2, 16, 4)) is None
    assert client.get_run(run_id).data.tags[run_artifacts.MODEL_SKIPPED_TAG] == (
        f"encoder is {size:.1f} MB, over log_model_max_mb=0.001; raise the key to log it")
    _, client, other = _run(tmp_path)
    assert run_artifacts.log_encoder(client, other, model, tiny_config(log_model=False), torch.zeros(2, 16, 4)) is None
    assert run_artifacts.MODEL_SKIPPED_TAG not in client.get_run(other).data.tags
    # the client's store, not mlflow's global tracking URI (another test may have set that)
    assert list(client.search_logged_models([client.get_run(other).info.experiment_id])) == []


def test_the_encoder_and_the_splits_are_logged_once_to_the_active_run(tmp_path):
    config = tiny_config()
    data = prepare_data(config)
    model = build_model(config)
    uri, client, run_id = _run(tmp_path)
    for _ in range(2):  # a resumed trial logs nothing twice
        with tracking.fluent_run(uri, run_id=run_id, system_metrics=False):
            model_id = run_artifacts.log_encoder(client, run_id, model, config, data.test_patches[:2])
            run_artifacts.log_dataset_inputs(client, run_id, config, data)
            client.set_terminated(run_id, "FINISHED")
    run = client.get_run(run_id)
    assert run.info.status == "FINISHED" and run.data.tags[run_artifacts.MODEL_ID_TAG] == model_id
    assert [m.model_id for m in run.outputs.model_outputs] == [model_id]
    inputs = run.inputs.dataset_inputs
    assert sorted(t.value for i in inputs for t in i.tags if t.key == "mlflow.data.context") == ["test", "train"]
    assert {i.dataset.digest for i in inputs} == {run_artifacts.content_digest(data.train_patches, data.train_labels),
                                                  run_artifacts.content_digest(data.test_patches, data.test_labels)}
    # by its artifact location: "models:/ID" would resolve through mlflow's global tracking URI
    loaded = mlflow.pytorch.load_model(client.get_logged_model(model_id).artifact_location)
    with torch.no_grad():
        torch.testing.assert_close(loaded(data.test_patches[:3]), model.features(data.test_patches[:3]))


def test_logging_the_inputs_makes_no_float_copy_of_the_splits(tmp_path, monkeypatch):
    import json

    from mae_core import images

    monkeypatch.setattr(images, "CHUNK_BYTES", 64 * 100)  # digits: 100 images a chunk, 15 chunks
    config = tiny_config(train_limit=None, test_limit=None)
    data = prepare_data(config)
    uri, client, run_id = _run(tmp_path)
    with tracking.fluent_run(uri, run_id=run_id, system_metrics=False):
        run_artifacts.log_dataset_inputs(client, run_id, config, data)
    assert "train_patches" not in vars(data) and "test_patches" not in vars(data)  # never made
    inputs = {next(t.value for t in i.tags if t.key == "mlflow.data.context"): i.dataset
              for i in client.get_run(run_id).inputs.dataset_inputs}
    assert inputs["train"].digest == run_artifacts.content_digest(data.train_patches, data.train_labels)
    assert inputs["test"].digest == run_artifacts.content_digest(data.test_patches, data.test_labels)
    assert json.loads(inputs["train"].profile)["features_shape"] == list(data.train_patches.shape)


def test_two_trials_that_log_the_same_splits_at_once_both_succeed(tmp_path, monkeypatch):
    """MLflow's store checks for the dataset, then inserts it: a trial starting beside another
    can miss the other's row and fail the unique constraint. The race is replayed here by making
    the store's existence check miss once, after the first trial has logged the same splits."""
    from mlflow.store.tracking.dbmodels.models import SqlDataset
    from sqlalchemy.orm import Query

    config = tiny_config()
    data = prepare_data(config)
    uri, client, first = _run(tmp_path)
    with tracking.fluent_run(uri, run_id=first, system_metrics=False):
        run_artifacts.log_dataset_inputs(client, first, config, data)
    misses = []
    real_all = Query.all

    def all_missing_once(query):
        if not misses and query.column_descriptions[0]["entity"] is SqlDataset:
            misses.append(query)
            return []  # what the second trial sees before the first trial's insert commits
        return real_all(query)

    monkeypatch.setattr(Query, "all", all_missing_once)
    second = tracking.create_run(client, client.get_run(first).info.experiment_id, "trial")
    with tracking.fluent_run(uri, run_id=second, system_metrics=False):
        run_artifacts.log_dataset_inputs(client, second, config, data)
    assert misses, "the existence check was not replayed as a miss"
    digests = [{i.dataset.digest for i in client.get_run(run).inputs.dataset_inputs} for run in (first, second)]
    assert digests[0] == digests[1] and len(digests[0]) == 2


def test_a_store_error_that_is_not_the_race_is_raised_at_once(monkeypatch):
    from mlflow.exceptions import MlflowException

    calls = []

    def failing(dataset, context):
        calls.append(context)
        raise MlflowException("permission denied")

    monkeypatch.setattr(mlflow, "log_input", failing)
    with pytest.raises(MlflowException, match="permission denied"):
        run_artifacts._log_input_once(object(), "train")
    assert calls == ["train"]
