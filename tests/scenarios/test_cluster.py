"""A smoke study on a two-node Ray cluster (two raylets on this machine) uses both nodes."""

from __future__ import annotations


import mlflow
import pytest

from conftest import own_ray
from studies.named_studies import get_study
from studies.runner import RunOptions, plan_study, run_study

pytestmark = pytest.mark.slow


def test_two_node_cluster_runs_trials_on_both_nodes(tmp_path):
    import ray
    from ray.cluster_utils import Cluster

    own_ray()  # the driver joins this cluster instead
    cluster = Cluster(initialize_head=True, head_node_args={"num_cpus": 1})
    cluster.add_node(num_cpus=1)
    try:
        ray.init(address=cluster.address, log_to_driver=False)
        plan = plan_study(get_study("mask_ratio"), smoke=True, overrides={"seeds": "0"})
        uri = f"sqlite:///{tmp_path}/mlflow.db"
        state = run_study(plan, RunOptions(out_dir=tmp_path / "study", tracking_uri=uri,
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


def test_losing_a_worker_node_reschedules_its_trials(tmp_path):
    """Three nodes (a head without CPUs and two one-CPU workers); a worker is removed while a
    trial runs on it: the trial is retried elsewhere and the study ends with one run per cell."""
    import sqlite3
    import threading
    import time

    import ray
    from ray.cluster_utils import Cluster

    own_ray()  # the driver joins this cluster instead
    cluster = Cluster(initialize_head=True, head_node_args={"num_cpus": 0})
    cluster.add_node(num_cpus=1)
    doomed = cluster.add_node(num_cpus=1)
    db = tmp_path / "mlflow.db"
    removed: list[str] = []

    def remove_when_busy() -> None:
        query = ("SELECT COUNT(*) FROM runs r JOIN tags t ON t.run_uuid = r.run_uuid "
                 "AND t.key = 'ray_node_id' AND t.value = ? WHERE r.status = 'RUNNING'")
        deadline = time.monotonic() + 180
        while time.monotonic() < deadline:
            time.sleep(0.5)
            try:
                with sqlite3.connect(f"file:{db}?mode=ro", uri=True, timeout=10) as connection:
                    busy = connection.execute(query, (doomed.node_id,)).fetchone()[0]
            except sqlite3.Error:
                continue
            if busy:
                cluster.remove_node(doomed)
                removed.append(doomed.node_id)
                return

    try:
        ray.init(address=cluster.address, log_to_driver=False)
        plan = plan_study(get_study("mask_ratio"), smoke=True, overrides={"seeds": "0", "steps": "300"})
        watcher = threading.Thread(target=remove_when_busy, daemon=True)
        watcher.start()
        uri = f"sqlite:///{db}"
        state = run_study(plan, RunOptions(out_dir=tmp_path / "study", tracking_uri=uri,
                                           address=cluster.address))
        watcher.join(timeout=5)
    finally:
        ray.shutdown()
        cluster.shutdown()
    assert removed, "the worker node was never busy"
    assert state["errored"] == 0
    mlflow.set_tracking_uri(uri)
    runs = mlflow.search_runs(experiment_names=["mae-study"],
                              filter_string=f"tags.`mlflow.parentRunId` = '{state['parent_run_id']}'")
    assert len(runs) == len(plan.cells) == 2 and set(runs["status"]) == {"FINISHED"}
    assert runs["tags.cell_id"].nunique() == 2
