"""Search as well as grids: config keys sampled from ranges by Ray Tune's search algorithms.

    mae-study run decoder_depth --search random --samples 8 lr=loguniform:1e-4:1e-2
    mae-study run decoder_depth --search optuna --samples 8 --metric probe_linear_acc lr=loguniform:1e-4:1e-2

A range is ``KIND:ARGS`` (on the command line, or under a study file's ``search: space:``):

* ``loguniform:LOW:HIGH`` and ``uniform:LOW:HIGH``: a real key (``lr``, ``mask_ratio``);
* ``randint:LOW:HIGH``: an integer key, both ends included (``decoder_depth=randint:1:8``);
* ``choice:V1,V2,...``: any key (``decoder_depth=choice:1,2,4``, ``target=choice:raw,norm``).

Each range is typed against the config field it names and both of its ends (every value of a
``choice``) are checked as configs with every arm of the grid, before Ray starts.

**What runs** (the question is "tune each ablation arm's learning rate fairly"): the study's
grid (its axes and zipped groups) gives the *arms*; every arm gets ``samples`` sampled configs,
and every sampled config runs once per seed of the study, so ``samples × arms × seeds`` trials.
A sampled config is then a cell like any other: the report shows its mean ± sd over the seeds,
and the search learns from that mean rather than from one lucky seed. For a cheaper search
pass ``seeds=0`` (one seed per sample) and re-run the chosen values with every seed afterwards
(a study file's ``zip`` pairs each arm with its own tuned value).

* ``random``: Tune's :class:`~ray.tune.search.basic_variant.BasicVariantGenerator` with
  ``num_samples`` and ``constant_grid_search``: sample *i* is drawn once and shared by every arm
  and seed, so the arms are tuned over the same candidates (no arm is luckier in its draws).
* ``optuna``: :class:`~studies.arm_search.ArmSearch`, one ``ray.tune.search.optuna.OptunaSearch`` (TPE) per arm,
  each told the mean of ``metric`` over the seeds of each of its samples; the direction comes
  from :data:`evaluation.metrics.METRICS`. Optuna is an extra: ``pip install mae-study[optuna]``.

Both resume through ``Tuner.restore``, which restores the search algorithm's saved state.
"""

from __future__ import annotations

import itertools
import json
import math
import re
import types
import typing
from dataclasses import dataclass, field
from typing import Any

from evaluation.metrics import METRICS
from mae_core.config import EVAL_PREFIX, Config, ConfigError, EvalConfig, parse_value
from mae_core.errors import UserError
from mae_core.grid import typed_value

ALGORITHMS = ("random", "optuna")
KINDS = ("loguniform", "uniform", "randint", "choice")
_RANGE = re.compile(rf"^({'|'.join(KINDS)}):(.*)$", re.DOTALL)
DEFAULT_METRIC = "probe_linear_acc"
DEFAULT_SAMPLES = 4
SEARCH_SEED = 0  # the samplers' seed (Optuna adds the arm's index): a search is reproducible
# Data keys: a range over one of them is checked by loading the data it names, as grid cells are.
DATA_KEYS = ("dataset", "patch_size", "target", "train_limit", "test_limit")
_MAX_CHECKED_COMBINATIONS = 64  # beyond this, each range's points are checked one key at a time
_MAX_INTEGERS_CHECKED = 32  # a randint over at most this many integers has each one checked


class SearchError(UserError):
    """A range, a search flag or a study file's ``search`` block that cannot be used (one line)."""


class OptunaMissing(SearchError):
    pass


# ------------------------------------------------------------------------------- ranges


def is_range(value: Any) -> bool:
    """``key=loguniform:1e-4:1e-2`` and the other kinds (a config value never starts so)."""
    return isinstance(value, str) and _RANGE.match(value.strip()) is not None


def split_ranges(overrides: dict[str, Any]) -> tuple[dict[str, str], dict[str, Any]]:
    """(the ranges, every other override) of the command line's ``key=value`` pairs."""
    ranges = {k: v.strip() for k, v in overrides.items() if is_range(v)}
    return ranges, {k: v for k, v in overrides.items() if k not in ranges}


def _field(key: str):
    if key.startswith(f"{EVAL_PREFIX}."):
        return EvalConfig.model_fields.get(key.removeprefix(f"{EVAL_PREFIX}."))
    return Config.model_fields.get(key) if key != EVAL_PREFIX else None


def _admits(annotation: Any) -> set[type]:
    """The scalar types a field admits: ``int | None`` -> {int, NoneType}; Literal -> its values' types."""
    origin = typing.get_origin(annotation)
    if origin is typing.Literal:
        return {type(v) for v in typing.get_args(annotation)}
    if origin in (typing.Union, types.UnionType):
        return {t for arg in typing.get_args(annotation) for t in _admits(arg)}
    return {origin or annotation}


@dataclass(frozen=True)
class Range:
    """One key's range: ``kind`` with ``values`` = (low, high), or the choices."""

    key: str
    kind: str
    values: tuple[Any, ...]
    text: str  # as the user wrote it, for messages and the MLflow tag

    def domain(self):
        """The Ray Tune search space of this range."""
        from ray import tune

        if self.kind == "loguniform":
            return tune.loguniform(*self.values)
        if self.kind == "uniform":
            return tune.uniform(*self.values)
        if self.kind == "randint":
            return tune.randint(self.values[0], self.values[1] + 1)  # Tune's upper end is exclusive
        return tune.choice(list(self.values))

    def check_points(self) -> list[Any]:
        """The values checked before Ray starts: both ends, every choice, and every integer of
        a short ``randint`` (divisibility checks such as width by heads can fail between the ends)."""
        if self.kind == "choice":
            return list(self.values)
        low, high = self.values
        if self.kind == "randint" and high - low < _MAX_INTEGERS_CHECKED:
            return list(range(low, high + 1))
        return [low, high]


def parse_range(key: str, text: str) -> Range:
    """``key`` and ``KIND:ARGS`` -> a :class:`Range` typed against the config field ``key``
    (SearchError naming the key and what is allowed otherwise). Bounds are checked later,
    against the arms (:func:`check_space`)."""
    text = str(text).strip()
    match = _RANGE.match(text)
    where = f"{key}={text}"
    if match is None:
        raise SearchError(f"{where}: a range is one of {', '.join(k + ':...' for k in KINDS)}")
    if key == "seed":
        raise SearchError(f"{where}: seeds are replicates, not searched; give them as seeds=0,1,2")
    spec = _field(key)
    if spec is None:
        raise SearchError(f"{where}: unknown key {key!r} (mae-study config lists every key)")
    kind, args = match.groups()
    admits = _admits(spec.annotation)
    if kind == "choice":
        texts = [v.strip() for v in args.split(",")]
        if not all(texts):
            raise SearchError(f"{where}: choice needs values separated by commas, e.g. {key}=choice:1,2,4")
        return Range(key, kind, tuple(typed_value(key, parse_value(v)) for v in texts), text)
    parts = args.split(":")
    if len(parts) != 2:
        raise SearchError(f"{where}: expected {kind}:LOW:HIGH")
    number = int if kind == "randint" else float
    if number is float and float not in admits:
        raise SearchError(f"{where}: {key} is not a real-valued key; use randint:LOW:HIGH or choice:...")
    if number is int and int not in admits:
        raise SearchError(f"{where}: {key} is not an integer key; use "
                          f"{'uniform:LOW:HIGH or ' if float in admits else ''}choice:...")
    try:
        low, high = (number(p) for p in parts)
    except ValueError:
        raise SearchError(f"{where}: LOW and HIGH must be {'integers' if number is int else 'numbers'}") from None
    if not (math.isfinite(low) and math.isfinite(high)) or low > high or (low == high and number is float):
        raise SearchError(f"{where}: needs LOW < HIGH" + (" (LOW <= HIGH for randint)" if number is int else ""))
    if kind == "loguniform" and low <= 0:
        raise SearchError(f"{where}: loguniform needs LOW > 0")
    return Range(key, kind, (low, high), text)


# ------------------------------------------------------------------------------- the search


@dataclass(frozen=True)
class SearchSpec:
    """What a search samples and how: the algorithm, samples per arm, the metric it optimises."""

    algorithm: str
    samples: int
    metric: str
    space: dict[str, Range] = field(default_factory=dict)

    @property
    def mode(self) -> str:
        """``min`` or ``max``: the metric's direction in the one metric table."""
        return "min" if METRICS[self.metric].lower_is_better else "max"

    def describe(self) -> dict[str, Any]:
        """JSON-ready: the parent run's ``search`` tag and the saved state's (compared on --resume)."""
        return {"algorithm": self.algorithm, "samples": self.samples, "metric": self.metric,
                "mode": self.mode, "space": {key: r.text for key, r in self.space.items()}}


def make_search(*, algorithm: str | None, samples: int | None, metric: str | None,
                ranges: dict[str, str], file_search: dict[str, Any] | None = None) -> SearchSpec | None:
    """The search a ``run`` asks for: the study file's ``search`` block (if any), then the
    command line's ``--search``, ``--samples``, ``--metric`` and ranges on top; None for a
    plain grid. Bad combinations are one line each (whether Optuna is installed is
    :func:`require_optuna`'s question, asked when the search runs)."""
    file_search = file_search or {}
    space = {**file_search.get("space", {}), **ranges}
    algorithm = algorithm or file_search.get("algorithm") or (None if not file_search else "random")
    if algorithm is None:
        if ranges:
            key, text = next(iter(ranges.items()))
            raise SearchError(f"{key}={text}: a range needs --search random|optuna (and --samples N)")
        for flag, given in (("--samples", samples), ("--metric", metric)):
            if given is not None:
                raise SearchError(f"{flag}: only with --search random|optuna")
        return None
    if algorithm not in ALGORITHMS:
        raise SearchError(f"--search {algorithm}: allowed are {', '.join(ALGORITHMS)}")
    if not space:
        raise SearchError(f"--search {algorithm}: give at least one range, e.g. lr=loguniform:1e-4:1e-2")
    samples = samples if samples is not None else file_search.get("samples", DEFAULT_SAMPLES)
    if samples < 1:
        raise SearchError(f"--samples {samples}: must be at least 1")
    metric = metric or file_search.get("metric") or DEFAULT_METRIC
    if metric not in METRICS:
        known = [m.name for m in METRICS.values() if m.kind in ("risk", "downstream")] + ["train_loss"]
        raise SearchError(f"metric {metric!r}: not a metric trials log; e.g. {', '.join(known)}")
    return SearchSpec(algorithm, samples, metric, {k: parse_range(k, v) for k, v in space.items()})


def require_optuna() -> None:
    try:
        import optuna  # noqa: F401
    except ImportError:
        raise OptunaMissing("--search optuna needs Optuna: pip install 'mae-study[optuna]'") from None


def check_space(spec: SearchSpec, cells: list[dict[str, Any]]) -> list[Config]:
    """Every range's check points as configs with every arm (``cells``), or a SearchError naming
    the range; returns the configs whose data must still be loaded (ranges over data keys).

    Together while the combinations are few (a width range with a heads range can fail only
    together), else one range at a time."""
    ranges = list(spec.space.values())
    combinations = math.prod(len(r.check_points()) for r in ranges)
    if combinations <= _MAX_CHECKED_COMBINATIONS:
        groups = [ranges]
    else:
        groups = [[r] for r in ranges]
    data_ranges = any(r.key in DATA_KEYS for r in ranges)
    arms = cells if data_ranges else list({json.dumps(_no_seed(c), sort_keys=True, default=str): c
                                           for c in cells}.values())
    checked = []
    for group in groups:
        for points in itertools.product(*(r.check_points() for r in group)):
            sampled = dict(zip((r.key for r in group), points))
            for cell in arms:
                try:
                    config = Config(**{**cell, **sampled})
                except ConfigError as error:
                    named = " with ".join(f"{r.key}={r.text}" for r in group)
                    raise SearchError(f"{named}: at {sampled}: {error}") from None
                if data_ranges:
                    checked.append(config)
    return checked


def _no_seed(cell: dict[str, Any]) -> dict[str, Any]:
    return {k: v for k, v in cell.items() if k != "seed"}


# ------------------------------------------------------------------------------ Ray Tune


def tune_search(spec: SearchSpec, grid_space: dict[str, Any], arms: list[dict[str, Any]],
                seeds: list[int]) -> tuple[dict[str, Any], Any, int]:
    """(the Tuner's param_space, its search algorithm, its num_samples) for ``spec`` over the
    grid whose Tune space (grid_search per axis and zipped group, seeds included) is
    ``grid_space`` and whose arms (without seeds) are ``arms``."""
    if spec.algorithm == "random":
        from ray.tune.search.basic_variant import BasicVariantGenerator

        space = {**grid_space, **{key: r.domain() for key, r in spec.space.items()}}
        return space, BasicVariantGenerator(constant_grid_search=True, random_state=SEARCH_SEED), spec.samples
    from .arm_search import ArmSearch

    searcher = ArmSearch(arms, seeds, {key: r.domain() for key, r in spec.space.items()},
                         samples=spec.samples, metric=spec.metric, mode=spec.mode, seed=SEARCH_SEED)
    return {}, searcher, spec.samples * len(arms) * len(seeds)
