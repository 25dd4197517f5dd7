"""Fractional GPUs pack trials onto one GPU: Ray is told of one logical GPU on this CPU machine,
and two trials asking for half of it each run at the same time on GPU 0."""

from __future__ import annotations

import contextlib
import io

import mlflow
import pandas as pd

from conftest import own_ray
from studies.named_studies import get_study
from studies.runner import RunOptions, plan_study, run_study


def test_two_trials_share_one_gpu_at_half_each(tmp_path):
    import ray

    own_ray()  # this test's Ray has a logical GPU
    ray.init(address="local", num_cpus=2, num_gpus=1, include_dashboard=False, log_to_driver=False, configure_logging=False)
    try:
        plan = plan_study(get_study("mask_ratio"), smoke=True, overrides={"seeds": "0", "steps": "120"})
        uri = f"sqlite:///{tmp_path}/mlflow.db"
        state = run_study(plan, RunOptions(out_dir=tmp_path / "study", tracking_uri=uri,
                                           cpus_per_trial=1, gpus_per_trial=0.5))
    finally:
        ray.shutdown()
    assert state["errored"] == 0 and state["complete"]
    mlflow.set_tracking_uri(uri)
    runs = mlflow.search_runs(experiment_names=["mae-study"],
                              filter_string=f"tags.`mlflow.parentRunId` = '{state['parent_run_id']}'")
    assert len(runs) == 2 and set(runs["status"]) == {"FINISHED"}
    assert list(runs["tags.ray_gpu_ids"]) == ["0", "0"]  # both saw the same (logical) GPU
    start, end = pd.to_datetime(runs["start_time"]), pd.to_datetime(runs["end_time"])
    assert start.max() < end.min(), "the two half-GPU trials ran at the same time"


def test_trials_per_gpu_packs_k_trials_on_each_device(tmp_path):
    """``--trials-per-gpu 2`` on two logical GPUs: four trials, two on each device at once, each
    run tagged with the GPU Ray gave it and the device it trained on; the parent records K."""
    import ray

    from studies.cli import main

    own_ray()  # this test's Ray has two logical GPUs and a CPU for each of the four trials
    ray.init(address="local", num_cpus=4, num_gpus=2, include_dashboard=False, log_to_driver=False, configure_logging=False)
    try:
        with contextlib.chdir(tmp_path), contextlib.redirect_stderr(io.StringIO()):
            status = main(["run", "mask_ratio", "--smoke", "--trials-per-gpu", "2", "--out", "out",
                           "seeds=0,1", "steps=60"])
    finally:
        ray.shutdown()
    assert status == 0
    mlflow.set_tracking_uri(f"sqlite:///{tmp_path}/out/mlflow.db")
    parent = mlflow.search_runs(experiment_names=["mae-study"], filter_string="tags.study = 'mask_ratio'",
                                output_format="list")
    parent = [run for run in parent if "mlflow.parentRunId" not in run.data.tags][0]
    assert parent.data.tags["trials_per_gpu"] == "2" and parent.data.tags["gpus_per_trial"] == "0.5"
    runs = mlflow.search_runs(experiment_names=["mae-study"],
                              filter_string=f"tags.`mlflow.parentRunId` = '{parent.info.run_id}'")
    assert len(runs) == 4 and set(runs["status"]) == {"FINISHED"}
    assert sorted(runs["tags.ray_gpu_ids"]) == ["0", "0", "1", "1"]  # K=2 to a device
    assert set(runs["tags.trial_device"]) == {"cpu"}  # device=auto: no CUDA here behind the logical GPUs
    for gpu, on_it in runs.groupby("tags.ray_gpu_ids"):
        start, end = pd.to_datetime(on_it["start_time"]), pd.to_datetime(on_it["end_time"])
        assert start.max() < end.min(), f"the two trials on GPU {gpu} ran at the same time"
