"""Eight trials logging at once to the default SQLite store lose nothing."""

from __future__ import annotations

import multiprocessing as mp

from mlflow.tracking import MlflowClient

from studies import tracking

WRITERS, STEPS = 8, 60


def _writer(uri: str, run_id: str, queue) -> None:
    client = MlflowClient(uri)
    try:
        for step in range(STEPS):  # one write per step: harsher than a trial (one per log_every)
            tracking.log_metrics(client, run_id, {"train_loss": 1.0 / (step + 1)}, step, 1_700_000_000_000 + step)
        client.set_terminated(run_id, "FINISHED")
        queue.put(None)
    except Exception as error:  # reported to the parent, which fails the test with it
        queue.put(repr(error))


def test_eight_concurrent_writers_lose_no_metric_step(tmp_path):
    uri = tracking.default_tracking_uri(tmp_path)
    client = MlflowClient(uri)  # the driver creates schema, experiment and runs first
    experiment = tracking.ensure_experiment(client, "mae-study", uri)
    run_ids = [tracking.create_run(client, experiment, f"writer-{i}") for i in range(WRITERS)]
    queue = mp.get_context("spawn").Queue()
    workers = [mp.get_context("spawn").Process(target=_writer, args=(uri, run_id, queue)) for run_id in run_ids]
    for worker in workers:
        worker.start()
    errors = [queue.get(timeout=300) for _ in workers]
    for worker in workers:
        worker.join(timeout=60)
    assert errors == [None] * WRITERS
    for run_id in run_ids:
        steps = [m.step for m in client.get_metric_history(run_id, "train_loss")]
        assert sorted(steps) == list(range(STEPS))
        assert client.get_run(run_id).info.status == "FINISHED"
