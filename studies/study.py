"""What a study is: a base config, the axes it varies, the seeds, a smoke size and a reference row.

A study states only the keys that differ from :class:`~mae_core.config.Config`'s defaults
(house style: defaults live in one typed place). Its grid is the full factorial of its axes,
times one row of each *zipped* group (keys that vary together: ``encoder_width: [32, 64]``
with ``encoder_heads: [2, 4]`` is two cells, not four), times its seeds; every cell is one
trial and one MLflow child run.

The *reference* is the cell every other cell is compared with, paired by seed (the spec's or
the paper's default). Documented default, used when a study names none or when the grid that
runs (``--smoke``, an axis override) lacks the named cell: :func:`default_reference`, the cell
whose axis values equal the Config defaults, else the first cell of the grid.
"""

from __future__ import annotations

import hashlib
import json
import re
from dataclasses import dataclass, field, replace
from typing import Any

from mae_core.config import EVAL_PREFIX, Config, parse_value
from mae_core.errors import UserError, clipped, shown
from mae_core.files import NAME_RULE, STUDY_NAME
from mae_core.grid import Zipped, default_reference, find_cell, grid_cells, typed_value, zip_rows

# Every study's trials: exact masked risk where |V_k| is at most 500, Monte Carlo with 64 masks
# per test image (and its standard error) above, so evaluation stays a few seconds per trial.
STUDY_DEFAULTS = {"risk_exact_budget": 500, "risk_mc_masks": 64}

# Applied on top of a study in --smoke mode: seconds on two cores, every code path exercised.
SMOKE = {"steps": 30, "train_limit": 256, "test_limit": 48, "log_every": 10,
         "checkpoint_every": 10, "risk_exact_budget": 200, "risk_mc_masks": 4}


def smoke_eval() -> dict[str, Any]:
    """The smoke evaluation: each registered evaluator's ``smoke`` settings as ``eval.*`` keys
    (:func:`mae_core.evaluator.smoke_keys`; the probes': one candidate per choice, one few-shot
    draw); a study's own eval keys win over these."""
    from mae_core.evaluator import smoke_keys

    return smoke_keys()


SMOKE_FINETUNE_STEPS = 20  # a study that fine-tunes does so for at most this many steps in smoke mode


class GridError(UserError):
    """An override or a search that does not fit the study's grid (one line naming the key)."""


SEED_LIMIT = 10_000  # seeds in one list (seeds=, a study file's seeds, --add-seeds): far past any study's need


def check_study_name(name: str, where: str) -> str:
    """``name`` when it matches :data:`~mae_core.files.STUDY_NAME`; else a GridError naming ``where`` it came from."""
    if not isinstance(name, str) or not re.fullmatch(STUDY_NAME, name) or len(name) > 200:
        raise GridError(f"{where}: study name {shown(name)}: use {NAME_RULE}, at most 200 characters")
    return name


def parse_seed_list(text: str, label: str) -> list[int]:
    """``5-9``, ``5,6,7`` or a mix (``5-7,12``) -> the seeds in the order given. One line naming
    ``label`` (``seeds=...``, ``--add-seeds ...``) when malformed, when a seed repeats, or past
    :data:`SEED_LIMIT` seeds (counted from the ranges' ends, before any list is built)."""
    parts = [re.fullmatch(r"\s*(\d{1,18})\s*(?:-\s*(\d{1,18})\s*)?", part) for part in str(text).split(",")]
    if not all(parts) or any(m[2] is not None and int(m[2]) < int(m[1]) for m in parts):
        raise GridError(f"{label}: give seeds as 5-9 or 5,6,7 (non-negative integers, ranges ascending)")
    count = sum(int(m[2] or m[1]) - int(m[1]) + 1 for m in parts)
    if count > SEED_LIMIT:
        raise GridError(f"{label}: {count} seeds; at most {SEED_LIMIT} in one list")
    seeds = [seed for m in parts for seed in range(int(m[1]), int(m[2] or m[1]) + 1)]
    return check_distinct("seed", seeds, label)


def check_seeds(seeds: list[int], label: str) -> list[int]:
    """A list of seeds as given (a study file's ``seeds:``): at most :data:`SEED_LIMIT`, each once."""
    if len(seeds) > SEED_LIMIT:
        raise GridError(f"{label}: {len(seeds)} seeds; at most {SEED_LIMIT} in one list")
    return check_distinct("seed", seeds, label)


def check_distinct(key: str, values: list[Any], label: str) -> list[Any]:
    """``values`` of ``key`` when no two are the same config value ("0.5" and 0.50 are); a
    repeated value would run the same cell twice and pool it as more seeds."""
    seen: set = set()
    for value in values:
        marker = _marker(key, value)
        if marker in seen:
            raise GridError(f"{label}: {key} {shown(typed_value(key, value))} is given twice; give each value once")
        seen.add(marker)
    return values


def check_distinct_rows(group: dict[str, list[Any]], label: str) -> dict[str, list[Any]]:
    """A zipped group whose rows differ (two equal rows would run one cell twice)."""
    seen: set = set()
    for number, row in enumerate(zip_rows(group)):
        marker = tuple(_marker(key, value) for key, value in row.items())
        if marker in seen:
            raise GridError(f"{label}: row {number + 1} ({shown(row)}) repeats an earlier row; give each row once")
        seen.add(marker)
    return group


def _marker(key: str, value: Any):
    """What two values of ``key`` share when they are the same config value (1 and True differ)."""
    typed = typed_value(key, value)
    return (type(typed).__name__, typed) if isinstance(typed, (bool, int, float, str)) else repr(typed)


@dataclass(frozen=True)
class Study:
    name: str
    paper: str  # the paper row or figure it mirrors
    base: dict[str, Any]  # keys that differ from Config's defaults
    axes: dict[str, list[Any]]  # key -> values; full factorial
    seeds: tuple[int, ...] = (0, 1, 2, 3, 4)
    smoke_keys: dict[str, Any] = field(default_factory=dict)  # extra smoke-mode keys (a study file's ``smoke:``)
    smoke_axes: dict[str, list[Any]] | None = None  # a smaller grid for --smoke, if needed
    evaluation: dict[str, Any] = field(default_factory=dict)  # eval.* keys (EvalConfig), without the prefix
    doc: str = ""
    # The cell every other row is compared with (axis -> value); None: default_reference(axes)
    reference: dict[str, Any] | None = None
    zipped: Zipped = ()  # groups of keys that vary together (equal lengths), each a factor of the grid
    smoke_zipped: Zipped | None = None  # the zipped groups for --smoke, if smaller
    # A study file's ``search`` block (space, algorithm, samples, metric): studies.search.make_search reads it
    search: dict[str, Any] | None = None
    # The claims declared before the run, as the study file spells them (analysis.claims checks
    # them against the grid; the parent run's ``claims`` tag carries them to the report).
    claims: tuple[dict[str, Any], ...] = ()
    is_smoke: bool = False  # :meth:`smoke` made it: its grid is the smoke grid, its reference may lie outside
    # The study file it was read from (None: built in code); its git commit is recorded when the
    # study starts (studies.registration), so a report can tell claims registered before the run
    source: str | None = None

    def __post_init__(self) -> None:
        if self.reference is None or self.is_smoke:
            return
        keys = set(self.axes).union(*self.zipped)
        if set(self.reference) != keys:
            raise ValueError(f"study {self.name}: reference keys {sorted(self.reference)} "
                             f"are not its axes {sorted(keys)}")
        if find_cell(self.reference, self.axes, self.zipped) is None:
            grid = {**self.axes, **{k: v for group in self.zipped for k, v in group.items()}}
            raise ValueError(f"study {self.name}: reference {shown(self.reference)} is not a cell of {shown(grid)}")

    def smoke(self) -> Study:
        """This study in smoke mode, resolved once, here: the smoke grid (``smoke_axes``,
        ``smoke_zipped``) and two seeds; the smoke evaluation (:func:`smoke_eval`) under the
        study's keys, fine-tuning shortened to :data:`SMOKE_FINETUNE_STEPS`; and :data:`SMOKE`
        then the study's ``smoke:`` keys over everything but the command line's. Every method
        of the result answers for the smoke run; nothing downstream asks whether it is one."""
        if self.is_smoke:
            return self
        return replace(
            self, base={**smoke_eval(), **self.base}, axes=dict(self.smoke_axes or self.axes), smoke_axes=None,
            zipped=self.smoke_zipped if self.smoke_zipped is not None else self.zipped, smoke_zipped=None,
            seeds=self.seeds[:2], evaluation=self._smoke_evaluation(), is_smoke=True)

    def _smoke_evaluation(self) -> dict[str, Any]:
        """The evaluation keys with fine-tuning shortened to :data:`SMOKE_FINETUNE_STEPS` and the
        from-scratch baseline's own budget up to twice that."""
        evaluation = dict(self.evaluation)
        if evaluation.get("finetune_steps"):
            evaluation["finetune_steps"] = min(int(evaluation["finetune_steps"]), SMOKE_FINETUNE_STEPS)
            evaluation.setdefault("scratch_max_steps", 2 * SMOKE_FINETUNE_STEPS)
        return evaluation

    def reference_cell(self, overrides: dict[str, Any] | None = None) -> dict[str, Any]:
        """The reference cell of the grid that runs: :attr:`reference` where that grid holds
        it, else :func:`default_reference` of that grid; values typed as Config holds them."""
        axes, zipped = self.grid_axes(overrides), self.grid_zipped(overrides)
        named = find_cell(self.reference, axes, zipped) if self.reference is not None else None
        cell = named if named is not None else default_reference(axes, zipped)
        return {key: typed_value(key, value) for key, value in cell.items()}

    def grid_axes(self, overrides: dict[str, Any] | None = None) -> dict[str, list[Any]]:
        """The axes of the grid. An override of an axis key (``mask_ratio=0.5,0.75``) replaces its
        values; any other key given several values (``decoder_depth=1,4``) becomes a new axis.
        A zipped key is not an axis: :meth:`grid_zipped` takes its overrides."""
        axes = dict(self.axes)
        zipped_keys = set().union(*self.zipped)
        for key, value in (overrides or {}).items():
            if key not in zipped_keys and (key in axes or is_axis_override(value)):
                axes[key] = check_distinct(key, override_values(value), f"{key}={clipped(value)}")
        return axes

    def grid_zipped(self, overrides: dict[str, Any] | None = None) -> Zipped:
        """The zipped groups of the grid. An override of a zipped key replaces its column: one
        value (``encoder_width=64``) for every row, or as many values as the group has rows;
        any other count is a GridError naming the key and its partners."""
        groups = []
        for group in self.zipped:
            group, rows = dict(group), len(next(iter(group.values())))
            for key in group.keys() & (overrides or {}).keys():
                values = override_values(overrides[key])
                if len(values) not in (1, rows):
                    partners = ", ".join(k for k in group if k != key)
                    raise GridError(f"{key}={clipped(overrides[key])}: {key} is zipped with {partners} "
                                     f"({rows} values each); give one value or {rows}")
                group[key] = values * rows if len(values) == 1 else values
            overridden = [f"{key}={clipped(overrides[key])}" for key in group if key in (overrides or {})]
            if overridden:  # one value for every row can make two rows equal
                check_distinct_rows(group, " ".join(overridden))
            groups.append(group)
        return tuple(groups)

    def cells(self, *, overrides: dict[str, Any] | None = None,
              seeds: tuple[int, ...] | None = None) -> list[dict[str, Any]]:
        """Every trial's config keys: base, then overrides, then the axis values and the seed."""
        axes, zipped = self.grid_axes(overrides), self.grid_zipped(overrides)
        varied = set(axes).union(*zipped)
        fixed = {k: v for k, v in (overrides or {}).items() if k not in varied}
        smoke = {**SMOKE, **self.smoke_keys} if self.is_smoke else {}
        base = {**STUDY_DEFAULTS, **self.base, **self.eval_keys(), **smoke, **fixed}
        cells = []
        for cell in grid_cells(axes, zipped):
            for seed in seeds if seeds is not None else self.seeds:
                cells.append({**base, **cell, "seed": seed})
        return cells

    def eval_keys(self) -> dict[str, Any]:
        """The study's evaluation settings as ``eval.<key>`` config keys."""
        return {f"{EVAL_PREFIX}.{key}": value for key, value in self.evaluation.items()}

    def configs(self, **kwargs: Any) -> list[Config]:
        """The validated configs of :meth:`cells` (raises ConfigError on the first bad one)."""
        return [Config(**cell) for cell in self.cells(**kwargs)]

    def grid_size(self) -> int:
        return len(self.cells())

    @property
    def summary(self) -> str:
        return (self.doc.strip().splitlines() or [self.name])[0]


def is_axis_override(value: Any) -> bool:
    """``key=v1,v2`` on the command line: several values make the key an axis."""
    return isinstance(value, str) and "," in value


def override_values(value: Any) -> list[Any]:
    """The values of ``key=v1,v2`` (one value without a comma), parsed as the CLI parses them."""
    return [parse_value(v.strip()) for v in str(value).split(",")]


def cell_id(keys: dict[str, Any]) -> str:
    """A stable short id for one grid cell (the same keys give the same id across resumes)."""
    text = json.dumps({k: keys[k] for k in sorted(keys)}, sort_keys=True, default=str)
    return hashlib.sha256(text.encode()).hexdigest()[:12]


ZIP_PREFIX = "zip:"  # a zipped group's name in Ray Tune's param space: "zip:encoder_width+encoder_heads"


def zip_space_key(group: dict[str, list[Any]]) -> str:
    return ZIP_PREFIX + "+".join(group)


def trial_keys(trial_config: dict[str, Any]) -> dict[str, Any]:
    """A Ray trial's config as config keys: a zipped group's row (one dict under its
    :func:`zip_space_key`) becomes its keys."""
    keys: dict[str, Any] = {}
    for key, value in trial_config.items():
        if key.startswith(ZIP_PREFIX) and isinstance(value, dict):
            keys.update(value)
        else:
            keys[key] = value
    return keys


def without_keys(study: Study, keys: set[str]) -> Study:
    """``study`` with ``keys`` no longer axes (a search samples them instead); a zipped key
    cannot leave its group (GridError naming it)."""
    for group in (*study.zipped, *(study.smoke_zipped or ())):
        for key in keys & set(group):
            raise GridError(f"{key}: zipped with {', '.join(k for k in group if k != key)}; "
                             "a zipped key cannot be searched")

    def drop(axes):
        return None if axes is None else {k: v for k, v in axes.items() if k not in keys}

    reference = drop(study.reference)
    return replace(study, axes=drop(study.axes), smoke_axes=drop(study.smoke_axes),
                   reference=reference if reference else None)
