"""Fractional GPUs pack trials onto one GPU: Ray is told of one logical GPU on this CPU machine,
and two trials asking for half of it each run at the same time on GPU 0."""

from __future__ import annotations

import mlflow
import pandas as pd

from conftest import own_ray
from studies.registry import get_study
from studies.runner import RunOptions, plan_study, run_study


def test_two_trials_share_one_gpu_at_half_each(tmp_path):
    import ray

    own_ray()  # this test's Ray has a logical GPU
    ray.init(address="local", num_cpus=2, num_gpus=1, include_dashboard=False, log_to_driver=False, configure_logging=False)
    try:
        plan = plan_study(get_study("mask_ratio"), smoke=True, overrides={"seeds": "0", "steps": "120"})
        uri = f"sqlite:///{tmp_path}/mlflow.db"
        state = run_study(plan, RunOptions(out_dir=tmp_path / "study", tracking_uri=uri, smoke=True,
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
