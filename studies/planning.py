"""A study's plan: every cell's resolved config, the Ray Tune space, the tags of its parent run.

Pure planning (no Ray, no MLflow): :func:`plan_study` turns a study and the command line's
overrides into a :class:`StudyPlan`, checking every cell's config and data first.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

from mae_core.config import SEED_SOURCES, Config
from mae_core.errors import UserError, clipped
from mae_core.data import prepare_data

from . import tracking
from .search import SearchSpec
from .study import Study, cell_id, parse_seed_list, without_keys, zip_space_key

BASELINES_DIR = "baselines"  # in the study's output folder: one JSON per shared set (evaluation.baselines)


class StudySetupError(UserError):
    """Bad input found before Ray starts (one line)."""


@dataclass(frozen=True)
class RunOptions:
    out_dir: Path  # the study's folder (absolute)
    tracking_uri: str
    experiment: str = tracking.DEFAULT_EXPERIMENT
    resume: bool = False  # (whether it is a smoke run is the plan's: plan.study.is_smoke)
    address: str | None = None  # None: a local Ray on this machine's CPUs
    max_concurrent: int | None = None
    cpus_per_trial: float = 1.0
    gpus_per_trial: float = 0.0
    # >1: each trial is a Ray Train TorchTrainer (DDP) on this many workers, each with
    # cpus_per_trial CPUs and gpus_per_trial GPUs; batch_size stays the global batch (studies.ddp)
    workers_per_trial: int = 1
    trials_per_gpu: int | None = None  # --trials-per-gpu K: gpus_per_trial is 1/K (recorded on the parent)
    max_failures: int = 2  # Ray retries of a crashed trial (a diverging trial is not retried)
    scheduler: str = "fifo"  # fifo: every cell runs to the end; asha: stop poor trials early (exploration only)
    command: str | None = None  # the command line that started the study, for its report


@dataclass(frozen=True)
class StudyPlan:
    study: Study
    base: dict[str, Any]  # keys every trial shares
    axes: dict[str, list[Any]]  # the grid_search axes, seeds included as "seed"
    cells: list[dict[str, Any]]
    reference: dict[str, Any]  # the reference cell of this grid (Study.reference_cell)
    zipped: tuple[dict[str, list[Any]], ...] = ()  # groups of keys that vary together (Study.grid_zipped)
    search: SearchSpec | None = None  # keys sampled for every arm of the grid (studies.search)
    # --until-decided: the sequential plan (analysis.sequential.SequentialPlan.as_dict), named on the
    # parent run before the first look
    sequential: dict[str, Any] | None = None
    batch: bool = False  # a batch of seeds added to a study that ran (studies.seeds_by_need): no summary yet

    @property
    def num_trials(self) -> int:
        """Trials Ray runs: every cell, times the samples of a search."""
        return len(self.cells) * (self.search.samples if self.search is not None else 1)

    @property
    def varied(self) -> list[str]:
        """Every key a trial's cell varies (axes, zipped keys, searched keys), seed last."""
        keys = [a for a in self.axes if a != "seed"] + [k for group in self.zipped for k in group]
        return keys + list(self.search.space if self.search else ()) + ["seed"]


def plan_study(study: Study, *, smoke: bool, overrides: dict[str, Any],
               search: SearchSpec | None = None) -> StudyPlan:
    """Every cell validated and its data loadable, or a ConfigError/DataError/NormDomainError;
    with ``search``, its ranges checked with every arm (a searched key is no longer an axis).
    Smoke mode is resolved here, once (:meth:`Study.smoke`): the plan's study is the one that runs."""
    overrides = dict(overrides)  # the caller's dict is left as it was
    seeds = overrides.pop("seeds", None)
    seed_values = tuple(parse_seed_list(seeds, f"seeds={clipped(seeds)}")) if seeds is not None else None
    if search is not None:
        study = without_keys(study, set(search.space))
    study = study.smoke() if smoke else study
    cells = study.cells(overrides=overrides, seeds=seed_values)
    configs = [Config(**cell) for cell in cells]
    if search is not None:
        from .search import check_space

        configs += check_space(search, cells)
    check_data(configs)
    axes = study.grid_axes(overrides)
    zipped = study.grid_zipped(overrides)
    axes["seed"] = sorted({cell["seed"] for cell in cells})
    varied = set(axes).union(*zipped)
    base = {k: v for k, v in cells[0].items() if k not in varied}
    return StudyPlan(study=study, base=base, axes=axes, cells=cells,
                     reference=study.reference_cell(overrides), zipped=zipped, search=search)


def cell_settings(cells: list[dict[str, Any]]) -> list[str]:
    """The distinct settings of ``cells``, seeds left out: a :func:`cell_id` of each cell's
    resolved config (so ``lr=0.001`` typed on the command line is the file's ``lr: 0.001``).
    What seeds added to a study must share with the trials it ran (``study.json``'s ``settings``)."""
    def settings(cell: dict[str, Any]) -> dict[str, Any]:
        values = Config(**cell).model_dump(mode="json")
        # Keys issue 35 added, at their defaults, are left out: a study.json written before them
        # keeps its ids (--add-seeds to it still matches).
        if values["eval"]["repeats"] == 1:
            del values["eval"]["repeats"]
        return {k: v for k, v in values.items() if k != "seed" and not (k in SEED_SOURCES and v is None)}

    return sorted({cell_id(settings(cell)) for cell in cells})


def check_data(configs: list[Config]) -> None:
    """Load each distinct dataset the configs name once: data problems surface here, not
    inside a Ray worker."""
    checked: set[tuple] = set()
    for config in configs:
        key = (config.dataset, config.data_seed, config.target, config.train_limit, config.test_limit,
               config.resolved_patch_size)
        if key not in checked:
            prepare_data(config)
            checked.add(key)


def tune_space(plan: StudyPlan) -> tuple[dict[str, Any], Any, int]:
    """(param_space, search_alg, num_samples) of the Tuner: a grid_search per axis and zipped
    group (a row of its keys per value), or a search over that grid (:func:`studies.search.tune_search`)."""
    from ray import tune

    # the longest training lengths first: they keep the shorter lengths' models (shared_lengths)
    space = {axis: tune.grid_search(sorted(values, reverse=True) if axis == "steps" and shared_lengths(plan)
                                    else values)
             for axis, values in plan.axes.items()}
    for group in plan.zipped:
        space[zip_space_key(group)] = tune.grid_search([dict(zip(group, row)) for row in zip(*group.values())])
    if plan.search is None:
        return space, None, 1
    from .search import tune_search

    grid_keys = [a for a in plan.axes if a != "seed"] + [k for group in plan.zipped for k in group]
    arms = list({cell_id(a): a for a in ({k: c[k] for k in grid_keys} for c in plan.cells)}.values())
    return tune_search(plan.search, space, arms, plan.axes["seed"])


def shared_lengths(plan: StudyPlan) -> tuple[int, ...]:
    """The study's training lengths when it varies ``steps`` as a grid axis (not zipped, not
    searched): a longer trial keeps its model at each shorter length that is a prefix of its run
    (:func:`studies.pretrained.prefix_lengths`), and the trials of that length evaluate it."""
    lengths = plan.axes.get("steps", [])
    return tuple(sorted(int(s) for s in lengths)) if plan.search is None and len(lengths) > 1 else ()
