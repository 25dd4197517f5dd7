"""``mae-study evaluate``: trained encoders evaluated again with other ``eval.*`` settings, no training.

What it reads: every FINISHED trial of a study's newest parent run (``--smoke``: newest smoke run)
in the store, or one run (``--run ID``). Each trial's encoder comes from its logged checkpoint
(the ``checkpoint/checkpoint.pt`` artifact: the full model, so the risks are measured as well as
the probes, and the trial's resolved config); a trial that reused another trial's encoder
(:mod:`studies.pretrained`) logged none and points to that run with its ``pretraining_run`` tag,
which is followed.

What it writes: a new parent run, named ``<study>-eval-<time>``, tagged ``evaluation_of`` (the
parent run it re-evaluates; for a run without a parent, that run), ``evaluation`` (the keys
changed) and the study's tags (``study``, ``smoke``, ``grid``, ``study_axes``, ``reference``,
``claims``...; an axis the command sets to one value is no longer an axis, and the claims are
then dropped), so ``mae-study report STUDY --run <its id>`` reports it like a study run (a
report without ``--run`` keeps reading the newest *training* run). Under it, one child run per
trial: the trial's config with the new ``eval.*`` keys as params, its dataset inputs, every
final metric (risks, probes, baselines, fine-tuning; ``eval_seconds``) and the reconstructions, tagged
``pretraining_run`` (the run whose checkpoint was read), ``evaluated_run`` (the trial) and the
trial's ``study`` and ``cell_id``. No ``train_loss`` history, no ``train_seconds`` or other
pretraining metric, no checkpoint or model of its own: nothing was trained.

Only ``eval.*`` keys may change: any other key needs a new pretraining (``mae-study run``).
Every check (keys, runs, checkpoints, configs, data) is made before the first run is created.
"""

from __future__ import annotations

import ast
import tempfile
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from mlflow.entities import Run
from mlflow.exceptions import MlflowException
from mlflow.tracking import MlflowClient
from mlflow.utils.mlflow_tags import MLFLOW_PARENT_RUN_ID, MLFLOW_RUN_NAME

from analysis.trials_frame import search_all
from analysis.study_header import StudyHeader, choose_parent
from mae_core.config import EVAL_PREFIX, Config, EvalConfig, parse_overrides
from mae_core.errors import UserError

from . import tracking
from .pretrained import SOURCE_TAG

EVALUATION_OF_TAG = "evaluation_of"  # on the new parent: the run re-evaluated (a study's parent run)
EVALUATION_TAG = "evaluation"  # on the new parent: the eval.* keys the command set
EVALUATED_RUN_TAG = "evaluated_run"  # on each new child: the trial it re-evaluates
CHECKPOINT_ARTIFACT = "checkpoint/checkpoint.pt"  # where studies.trial logs a trial's checkpoint


class EvaluateError(UserError):
    """Nothing to evaluate, or a run that cannot be evaluated again (one line)."""


def eval_overrides(pairs: list[str]) -> dict[str, Any]:
    """``["eval.knn_ks=5,20"]`` -> ``{"eval.knn_ks": "5,20"}`` (a comma is part of the value);
    refuses any key but ``eval.*``: changing it needs a new pretraining."""
    keys = parse_overrides(pairs)
    other = [key for key in keys if not key.startswith(f"{EVAL_PREFIX}.")]
    if other:
        raise EvaluateError(f"evaluate changes only eval.* keys (the encoders are not trained again); "
                            f"{other[0]} needs a new pretraining: mae-study run")
    online = [key for key in keys if key in (f"{EVAL_PREFIX}.every", f"{EVAL_PREFIX}.online_images")]
    if online:  # evaluation.online measures during training, which evaluate does not repeat
        raise EvaluateError(f"{online[0]} is measured while the encoder trains; evaluate does not train: "
                            f"mae-study run")
    return keys


# ------------------------------------------------------------------------- what to read


def study_trials(client: MlflowClient, experiment_id: str, study: str, smoke: bool) -> tuple[Run, list[Run]]:
    """(the newest training parent run of ``study``, smoke or full; its FINISHED child runs)."""
    quoted = study.replace("'", "\\'")
    parents = [run for run in search_all(client, experiment_id, f"tags.study = '{quoted}'")
               if MLFLOW_PARENT_RUN_ID not in run.data.tags and EVALUATION_OF_TAG not in run.data.tags]
    if not parents:
        raise EvaluateError(f"no runs of study {study!r} in this store (mae-study run {study} first)")
    parent = choose_parent(parents, smoke)
    if parent is None:
        raise EvaluateError(f"study {study!r} has only {'full' if smoke else 'smoke'} runs here: "
                            + ("drop --smoke" if smoke else "pass --smoke"))
    children = search_all(client, experiment_id, f"tags.`{MLFLOW_PARENT_RUN_ID}` = '{parent.info.run_id}'")
    finished = sorted((run for run in children if run.info.status == "FINISHED"),
                      key=lambda run: run.info.start_time or 0)
    if not finished:
        raise EvaluateError(f"study {study!r} (run {parent.info.run_id}) has no finished trial to evaluate")
    return parent, finished


def one_run(client: MlflowClient, run_id: str) -> tuple[Run | None, list[Run]]:
    """(its parent run, or None; [the run]) for ``--run``."""
    try:
        run = client.get_run(run_id)
    except MlflowException:
        raise EvaluateError(f"--run {run_id}: no such run in this store") from None
    if run.info.status != "FINISHED":
        raise EvaluateError(f"--run {run_id}: the run is {run.info.status}, not FINISHED; its encoder is not final")
    parent_id = run.data.tags.get(MLFLOW_PARENT_RUN_ID)
    return (client.get_run(parent_id) if parent_id else None), [run]


def _has_checkpoint(client: MlflowClient, run_id: str) -> bool:
    try:
        return any(item.path == CHECKPOINT_ARTIFACT for item in client.list_artifacts(run_id, "checkpoint"))
    except (MlflowException, OSError):
        return False


def pretraining_run(client: MlflowClient, run: Run) -> str:
    """The run whose checkpoint artifact holds ``run``'s encoder: the run itself, or the run its
    ``pretraining_run`` tag names (followed as far as it goes)."""
    current, seen = run, set()
    while not _has_checkpoint(client, current.info.run_id):
        seen.add(current.info.run_id)
        pointer = current.data.tags.get(SOURCE_TAG)
        if not pointer or pointer in seen:
            raise EvaluateError(f"run {run.info.run_id} ({run.info.run_name}) has no {CHECKPOINT_ARTIFACT} "
                                "artifact to read its encoder from")
        try:
            current = client.get_run(pointer)
        except MlflowException:
            raise EvaluateError(f"run {run.info.run_id}: its {SOURCE_TAG} {pointer} is not in this store") from None
    return current.info.run_id


def _eval_field(key: str) -> bool:
    return key.startswith(f"{EVAL_PREFIX}.") and key.removeprefix(f"{EVAL_PREFIX}.") in EvalConfig.model_fields


def _param_value(text: str) -> Any:
    """An ``eval.*`` param as logged (``str`` of the value: ``(5, 20)``, ``None``, ``0.01``,
    ``all``) back to a value EvalConfig reads."""
    try:
        return ast.literal_eval(text)
    except (ValueError, SyntaxError):
        return text


def config_with(saved: dict[str, Any], params: dict[str, str], overrides: dict[str, Any]) -> Config:
    """The trial's config with ``overrides``: its pretraining keys as the checkpoint saved them
    (``Config.resolved()``; derived values and keys the current Config no longer has are left
    out), its ``eval.*`` keys from its own params (a trial that reused another's encoder has
    its own), else from the checkpoint."""
    keys = {key: value for key, value in saved.items()
            if (key in Config.model_fields and key != EVAL_PREFIX) or _eval_field(key)}
    keys.update({key: _param_value(text) for key, text in params.items() if _eval_field(key)})
    return Config(**{**keys, **overrides})


@dataclass(frozen=True)
class Planned:
    """One trial to evaluate again: the trial, the run whose checkpoint holds its encoder, that
    checkpoint (downloaded) and the trial's config with the new keys."""

    trial: Run
    source: str
    checkpoint: Path
    config: Config


@dataclass(frozen=True)
class EvaluationPlan:
    parent: Run | None  # the study's parent run (None: a run without one)
    trials: list[Planned]
    overrides: dict[str, Any]

    @property
    def study(self) -> str | None:
        return (self.parent.data.tags.get("study") if self.parent is not None
                else self.trials[0].trial.data.tags.get("study"))

    @property
    def smoke(self) -> bool:
        return self.parent is not None and StudyHeader.from_run(self.parent).smoke


def plan_evaluation(client: MlflowClient, experiment: str, tracking_uri: str, folder: Path, *,
                    study: str | None, run_id: str | None, smoke: bool, overrides: dict[str, Any]) -> EvaluationPlan:
    """Every check before a run is created: the runs, their checkpoints (downloaded into
    ``folder``), their configs with ``overrides`` and their data (loaded once each)."""
    from mae_core.checkpoint import CheckpointError, load_checkpoint
    from mae_core.data import prepare_data

    experiment_id = client.get_experiment_by_name(experiment)
    if experiment_id is None:
        raise EvaluateError(f"no experiment {experiment!r} in {tracking_uri}")
    if run_id is not None:
        parent, trials = one_run(client, run_id)
    else:
        parent, trials = study_trials(client, experiment_id.experiment_id, study, smoke)
    downloaded: dict[str, tuple[Path, dict[str, Any]]] = {}
    planned, data_checked = [], set()
    for trial in trials:
        source = pretraining_run(client, trial)
        if source not in downloaded:
            (folder / source).mkdir(parents=True, exist_ok=True)
            path = Path(client.download_artifacts(source, CHECKPOINT_ARTIFACT, str(folder / source)))
            try:
                state = load_checkpoint(path)
            except CheckpointError as error:
                raise EvaluateError(f"run {source}: {error}") from None
            downloaded[source] = (path, {"config": state["config"], "step": int(state["step"])})
            del state
        path, saved = downloaded[source]
        config = config_with(saved["config"], trial.data.params, overrides)
        if saved["step"] < config.steps:
            raise EvaluateError(f"run {source}: its checkpoint is at step {saved['step']} of {config.steps}")
        key = _data_key(config)
        if key not in data_checked:
            prepare_data(config)  # data problems surface here, before any run exists
            data_checked.add(key)
        planned.append(Planned(trial=trial, source=source, checkpoint=path, config=config))
    return EvaluationPlan(parent=parent, trials=planned, overrides=overrides)


def _data_key(config: Config) -> tuple:
    """What :func:`mae_core.data.prepare_data` reads (as studies.runner.check_data keys it)."""
    return (config.dataset, config.data_seed, config.target, config.train_limit, config.test_limit,
            config.resolved_patch_size, config.data_ram_mb)


# ---------------------------------------------------------------------------- the runs


def parent_tags(plan: EvaluationPlan, command: str | None) -> dict[str, str]:
    """The evaluation parent's tags: the study's (an axis set to one value is dropped, and the
    claims with it), what it evaluates, and the keys it changed."""
    source = plan.parent if plan.parent is not None else plan.trials[0].trial
    header = StudyHeader.from_run(source)
    evaluated = header.without(plan.overrides)  # an axis set to one value is no longer one
    # the tags the source carries (a lone trial carries only ``study``), and the axes it lost
    carried = set(source.data.tags) | ({"study_axes", "grid"} if evaluated is not header else set())
    tags = {key: value for key, value in evaluated.study_tags().items() if key in carried}
    tags.update({EVALUATION_OF_TAG: source.info.run_id, "machine": tracking.machine(),
                 EVALUATION_TAG: " ".join(f"{k}={v}" for k, v in plan.overrides.items()) or "(same eval.* keys)"})
    if command:
        tags["command"] = command
    return tags


def run_evaluation(plan: EvaluationPlan, client: MlflowClient, *, tracking_uri: str, experiment: str,
                   baseline_dir: Path | None, command: str | None = None,
                   on_trial: Callable[[Run, str, dict[str, float]], None] | None = None,
                   interrupted_by: Callable[[], str] = lambda: "SIGINT") -> str:
    """Create the evaluation parent run and a child run per planned trial; the parent's id.
    The baselines are shared through ``baseline_dir`` (the study's ``baselines/``: their key
    holds every eval setting they read), else through a folder of this command's own. An
    interruption (KeyboardInterrupt) leaves the parent and its unfinished children KILLED, with
    ``interrupted_by()`` as their ``interrupted`` tag."""
    import torch

    from evaluation import evaluate_trial
    from evaluation.baselines import BaselineCache
    from mae_core.models import build_model
    from mae_core.checkpoint import load_checkpoint
    from mae_core.data import prepare_data
    from mae_core.devices import resolve_device

    from . import lifecycle, run_artifacts
    from .trial import BASELINES_TAG, _log_reconstructions

    experiment_id = tracking.ensure_experiment(client, experiment, tracking_uri)
    name_of = plan.study or (plan.trials[0].trial.info.run_name or "run")
    parent_id = tracking.create_run(client, experiment_id, f"{name_of}-eval-{time.strftime('%Y%m%d-%H%M%S')}",
                                    tags=parent_tags(plan, command))
    with tempfile.TemporaryDirectory(prefix="mae-eval-baselines-") as scratch:
        baselines = BaselineCache(baseline_dir if baseline_dir is not None else Path(scratch))
        loaded: tuple[tuple, Any] | None = None  # the last trial's data: trials of one seed share it
        try:
            for item in sorted(plan.trials, key=lambda item: _data_key(item.config)):
                config, trial = item.config, item.trial
                tags = {key: trial.data.tags[key] for key in ("study", "cell_id") if key in trial.data.tags}
                tags.update({SOURCE_TAG: item.source, EVALUATED_RUN_TAG: trial.info.run_id})
                name = f"{trial.data.tags.get(MLFLOW_RUN_NAME, trial.info.run_name)}-eval"
                with lifecycle.opened(client, None, tracking_uri=tracking_uri, experiment=experiment,
                                      run_name=name, parent_run_id=parent_id, tags=tags) as run_id:
                    if loaded is None or loaded[0] != _data_key(config):
                        loaded = (_data_key(config), prepare_data(config))
                    data = loaded[1]
                    tracking.log_params(client, run_id, config.resolved())
                    run_artifacts.log_dataset_inputs(client, run_id, config, data)
                    torch.manual_seed(config.init_seed)
                    model = build_model(config)
                    model.load_state_dict(load_checkpoint(item.checkpoint)["model"])
                    model = model.to(resolve_device(config.device)).eval()
                    served, started = len(baselines.outcomes), time.perf_counter()
                    metrics = evaluate_trial(model, config, data, baselines=baselines)
                    metrics["eval_seconds"] = time.perf_counter() - started
                    if len(baselines.outcomes) > served:
                        key, how = baselines.outcomes[-1]
                        tracking.set_tags(client, run_id, {BASELINES_TAG: f"{how} {key}"})
                    tracking.log_metrics(client, run_id, metrics, config.steps, int(time.time() * 1000))
                    _log_reconstructions(client, run_id, model, config, data)
                    lifecycle.finished(client, run_id)
                if on_trial is not None:
                    on_trial(trial, run_id, metrics)
        except KeyboardInterrupt:
            tracking.mark_killed(client, parent_id, interrupted_by())
            raise
        except BaseException:
            client.set_terminated(parent_id, "FAILED")
            raise
    client.set_terminated(parent_id, "FINISHED")
    return parent_id
