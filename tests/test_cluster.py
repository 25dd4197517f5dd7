"""A smoke study on a two-node Ray cluster (two raylets on this machine) uses both nodes."""

from __future__ import annotations

import os

import mlflow
import pytest

from studies.registry import get_study
from studies.runner import RunOptions, plan_study, run_study

pytestmark = pytest.mark.slow
os.environ.setdefault("RAY_AUTH_MODE", "disabled")
os.environ.setdefault("RAY_USAGE_STATS_ENABLED", "0")


def test_two_node_cluster_runs_trials_on_both_nodes(tmp_path):
    import ray
    from ray.cluster_utils import Cluster

    cluster = Cluster(initialize_head=True, head_node_args={"num_cpus": 1})
    cluster.add_node(num_cpus=1)
    try:
        ray.init(address=cluster.address, log_to_driver=False)
        plan = plan_study(get_study("mask_ratio"), smoke=True, overrides={"seeds": "0"})
        uri = f"sqlite:///{tmp_path}/mlflow.db"
        state = run_study(plan, RunOptions(out_dir=tmp_path / "study", tracking_uri=uri, smoke=True,
                                           address=cluster.address))
    finally:
        ray.shutdown()
        cluster.shutdown()
    assert state["errored"] == 0
    mlflow.set_tracking_uri(uri)
    runs = mlflow.search_runs(experiment_names=["mae-study"],
                              filter_string=f"tags.`mlflow.parentRunId` = '{state['parent_run_id']}'")
    assert len(runs) == len(plan.cells) == 2
    assert set(runs["status"]) == {"FINISHED"}
    assert runs["tags.ray_node_id"].nunique() == 2, "one trial per node"
