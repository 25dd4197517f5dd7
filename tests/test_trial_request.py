"""One trial request (studies.trial_request): a study's trial asks for the same things on one
process and on several workers, the study's shared encoders among them, and the workers of a
trial whose encoder another trial kept do not train it again."""

from __future__ import annotations

import json
from dataclasses import replace

import pytest
import torch
import torch.distributed as dist
from mlflow.tracking import MlflowClient

from conftest import tiny_config
from mae_core import prepare_data
from mae_core.distributed import Shard
from mae_core.local_ddp import free_port
from studies.ddp import OUTCOME_FILE, run_rank
from studies.pretrained import pretraining_key
from studies.trainable import trial_request
from studies.trial_request import TrialRequest


def _study_trial(tmp_path, trial_config, folder=None):
    return trial_request(tiny_config(**trial_config), trial_config, study_name="lesson", cell="c1",
                         tracking_uri=f"sqlite:///{tmp_path}/mlflow.db", experiment="mae-study", parent_run_id="p1",
                         run_id=None, tags={"ray_trial_id": "t1"}, baseline_dir=str(tmp_path / "baselines"),
                         lengths=(), plugins=None, folder=folder)


def test_a_trial_on_workers_asks_for_what_a_one_process_trial_asks_for(tmp_path):
    one = _study_trial(tmp_path, {"eval.fewshot": 2, "seed": 0})
    workers = _study_trial(tmp_path, {"eval.fewshot": 2, "seed": 0}, folder=str(tmp_path))
    assert workers.pretrained_dir == one.pretrained_dir == tmp_path / "pretrained"
    assert workers.baseline_dir == tmp_path / "baselines"
    assert workers.checkpoint_path == tmp_path / "checkpoints" / "p1" / "c1" / "checkpoint.pt"
    assert replace(workers, checkpoint_path=None) == one
    assert one.run_tags() == {"study": "lesson", "cell_id": "c1", "ray_trial_id": "t1"}


def test_only_cells_that_share_an_encoder_ask_for_the_shared_encoders(tmp_path):
    assert _study_trial(tmp_path, {"mask_ratio": 0.5, "seed": 0}).pretrained_dir is None
    assert _study_trial(tmp_path, {"seed_eval": 1, "seed": 0}).pretrained_dir is not None


def _rank(rank: int, world_size: int, port: int, request: TrialRequest) -> None:
    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank, world_size=world_size)
    try:
        torch.set_num_threads(1)
        run_rank(request, Shard(rank, world_size))
    finally:
        dist.destroy_process_group()


@pytest.mark.slow
def test_two_workers_train_an_encoder_once_for_cells_that_differ_in_eval_keys(tmp_path):
    import torch.multiprocessing as mp

    uri = f"sqlite:///{tmp_path}/mlflow.db"
    client = MlflowClient(uri)
    client.create_experiment("mae-study", artifact_location=str(tmp_path / "artifacts"))  # (migrated here, once)
    outcomes = []
    for fewshot in (2, 4):  # two cells of one seed: one pretraining
        config = tiny_config(batch_size=8, **{"eval.fewshot": fewshot})
        request = TrialRequest(config, uri, checkpoint_path=tmp_path / f"fewshot{fewshot}" / "checkpoint.pt",
                               pretrained_dir=tmp_path / "pretrained")
        request.checkpoint_path.parent.mkdir()
        mp.spawn(_rank, args=(2, free_port(), request), nprocs=2, join=True)  # a rank 1 left training would hang
        outcomes.append(json.loads((request.checkpoint_path.parent / OUTCOME_FILE).read_text()))
    runs = sorted(client.search_runs(["0", client.get_experiment_by_name("mae-study").experiment_id]),
                  key=lambda run: run.info.start_time)
    key = pretraining_key(config, prepare_data(config), workers=2)
    assert key != pretraining_key(config, prepare_data(config))  # never read by a one-process trial
    assert [run.data.tags["pretraining"] for run in runs] == [f"computed {key}", f"reused {key}"]
    assert runs[1].data.tags["pretraining_run"] == runs[0].info.run_id
    assert all(run.data.tags["workers_per_trial"] == "2" and run.info.status == "FINISHED" for run in runs)
    assert outcomes[0]["test_mae_risk"] == outcomes[1]["test_mae_risk"]  # the same encoder, measured twice
