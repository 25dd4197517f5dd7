"""Sweep efficiency: does a 16-trial smoke grid keep every core busy?

Runs ``mask_ratio`` in smoke mode over 2 ratios × 8 seeds on a local Ray, then compares the
study's wall time with the ideal ``(sum of the trials' own time) / cores + Ray's start``. The
trials' own time is read from their MLflow runs (start to end, which includes evaluation);
``train_seconds`` alone is reported beside it.
"""

from __future__ import annotations

import os
import tempfile
import time
from pathlib import Path
from typing import Any

os.environ.setdefault("RAY_AUTH_MODE", "disabled")
os.environ.setdefault("RAY_USAGE_STATS_ENABLED", "0")


def bench_sweep(cores: int | None = None) -> dict[str, Any]:
    import mlflow
    import ray

    from studies.named_studies import get_study
    from studies.runner import RunOptions, plan_study, run_study

    cores = cores or os.cpu_count() or 1
    with tempfile.TemporaryDirectory() as folder:
        plan = plan_study(get_study("mask_ratio"), smoke=True, overrides={"seeds": "0,1,2,3,4,5,6,7"})
        uri = f"sqlite:///{folder}/mlflow.db"
        start = time.perf_counter()
        ray.init(num_cpus=cores, include_dashboard=False, log_to_driver=False, configure_logging=False)
        ray_start = time.perf_counter() - start
        try:
            state = run_study(plan, RunOptions(out_dir=Path(folder) / "study", tracking_uri=uri))
        finally:
            ray.shutdown()
        wall = time.perf_counter() - start
        mlflow.set_tracking_uri(uri)
        runs = mlflow.search_runs(experiment_names=["mae-study"],
                                  filter_string=f"tags.`mlflow.parentRunId` = '{state['parent_run_id']}'")
    trial_seconds = float((runs["end_time"] - runs["start_time"]).dt.total_seconds().sum())
    train_seconds = float(runs["metrics.train_seconds"].sum())
    ideal = trial_seconds / cores + ray_start
    return {
        "sweep_trials": len(runs), "sweep_cores": cores, "sweep_wall_s": wall, "sweep_ray_start_s": ray_start,
        "sweep_trial_seconds_sum": trial_seconds, "sweep_train_seconds_sum": train_seconds,
        "sweep_ideal_s": ideal, "sweep_efficiency": ideal / wall,
    }


if __name__ == "__main__":
    import json

    results = Path("benchmarks") / "results"  # under the working directory, as bench.py's
    text = json.dumps(bench_sweep(), indent=2)
    results.mkdir(parents=True, exist_ok=True)
    (results / "sweep.json").write_text(text + "\n")
    print(text)
