"""Study files: one YAML format for the built-in studies (``studies/builtin/``) and a user's own.

    name: depth_x_ratio                 # optional; default: the file's name
    paper: MAE Table 1a × Figure 5      # optional: the paper row or figure it mirrors
    doc: what the study asks            # optional
    base: {dataset: digits, steps: 1000}            # keys that differ from the defaults
    axes: {decoder_depth: [1, 4], mask_ratio: [0.5, 0.75]}   # full factorial
    zip: {encoder_width: [32, 64], encoder_heads: [2, 4]}    # keys that vary together (or a list of such groups)
    seeds: [0, 1, 2, 3, 4]
    smoke: {steps: 20}                  # extra keys for --smoke (on top of the usual smoke sizes)
    smoke_axes: {decoder_depth: [1, 4], mask_ratio: [0.75]}  # a smaller grid for --smoke
    smoke_zip: {encoder_width: [32], encoder_heads: [2]}     # smaller zipped groups for --smoke
    eval: {finetune_steps: 200}         # eval.* keys: probes and fine-tuning
    reference: {decoder_depth: 4, mask_ratio: 0.75, encoder_width: 64, encoder_heads: 4}  # the row the others are compared with
    claims:                             # declared before the run; decided by the report (analysis.claims)
      - {name: deep_decoder_helps, metric: probe_linear_acc, kind: vs_reference, direction: better,
         cells: [{decoder_depth: 1}], delta: 0.01}
    search: {space: {lr: "loguniform:1e-4:1e-2"}, samples: 8, algorithm: random, metric: probe_linear_acc}
    plugins: [my_parts.py]              # modules or .py files (relative to this file): mae_core.plugins

The grid is the full factorial of ``axes`` times one row of each ``zip`` group (a group's keys
have equally many values and vary together), times ``seeds``; ``axes`` may be left out when
``zip`` or ``search`` gives the study something to vary. ``search`` samples keys from ranges
for every arm of that grid (:mod:`studies.search`).

A file is validated completely when it is read, before Ray starts or a run exists: its shape
(pydantic), then every cell of its full and smoke grids as a :class:`~mae_core.config.Config`.
Any problem is one line naming the file, the key and what is allowed.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, ValidationError

from mae_core.config import ConfigError
from mae_core.errors import UserError, first_problem
from mae_core.files import read_yaml_mapping

from analysis.claims import check_claims

from .search import DEFAULT_METRIC, DEFAULT_SAMPLES, SearchError, check_space, make_search
from .study import GridError, Study, check_distinct, check_distinct_rows, check_seeds, check_study_name

BUILTIN_FOLDER = Path(__file__).resolve().parent / "builtin"
SUFFIXES = (".yaml", ".yml")


class StudyFileError(UserError):
    """A study file that cannot be used: one line naming the file and the key."""


class SearchBlock(BaseModel):
    """A study file's ``search``: ranges sampled for every arm (see :mod:`studies.search`)."""

    model_config = ConfigDict(extra="forbid")

    space: dict[str, str | list[Any]] = Field(min_length=1)  # key -> "loguniform:1e-4:1e-2"; a list is a choice
    algorithm: Literal["random", "optuna"] = "random"
    samples: int = Field(DEFAULT_SAMPLES, ge=1)
    metric: str = DEFAULT_METRIC


class StudyFile(BaseModel):
    """The keys a study file may hold (anything else is refused)."""

    model_config = ConfigDict(extra="forbid")

    name: str | None = None  # checked by studies.study.check_study_name, as a name from the file's stem is
    paper: str = ""
    doc: str = ""
    base: dict[str, Any] = {}
    axes: dict[str, list[Any]] | None = None
    zip: dict[str, list[Any]] | list[dict[str, list[Any]]] | None = None
    seeds: list[int] = Field([0, 1, 2, 3, 4], min_length=1)
    smoke: dict[str, Any] = {}
    smoke_axes: dict[str, list[Any]] | None = None
    smoke_zip: dict[str, list[Any]] | list[dict[str, list[Any]]] | None = None
    eval: dict[str, Any] = {}
    reference: dict[str, Any] | None = None
    search: SearchBlock | None = None
    claims: list[Any] | None = None  # checked by analysis.claims.check_claims against the grid
    plugins: list[str] = []  # modules or .py files (relative to the study file) loaded before the grid is checked


def _one_line(error: ValidationError) -> str:
    key, kind, message, _ = first_problem(error)
    top = key.split(".")[0]
    if top in ("zip", "smoke_zip") and kind != "missing":
        return (f"{top}: a mapping of keys to their values (zip: {{encoder_width: [32, 64], "
                "encoder_heads: [2, 4]}), or a list of such mappings")
    if kind == "extra_forbidden":
        model, prefix = (SearchBlock, "search.") if top == "search" else (StudyFile, "")
        return f"unknown key {key!r}; allowed: {', '.join(prefix + name for name in model.model_fields)}"
    if kind == "missing":
        return f"{key}: required"
    return f"{key}: {message}"


def read_yaml(path: Path) -> dict[str, Any]:
    """The file's mapping; StudyFileError for a missing file, bad YAML or a non-mapping."""
    if not path.is_file():
        raise StudyFileError(f"{path}: no such study file")
    try:
        return read_yaml_mapping(path, str(path), "a mapping of study keys (name, axes, ...)")
    except UserError as error:
        raise StudyFileError(str(error)) from None

def load_study_file(path: str | Path) -> Study:
    """Read, validate and build the study in ``path`` (every cell checked as a Config, every
    search range at its ends with every arm)."""
    path = Path(path)
    try:
        spec = StudyFile(**read_yaml(path))
    except ValidationError as error:
        raise StudyFileError(f"{path}: {_one_line(error)}") from None
    name = _study_name(path, spec.name)
    _load_plugins(path, spec.plugins)
    zipped = _zip_groups(path, "zip", spec.zip)
    smoke_zipped = _zip_groups(path, "smoke_zip", spec.smoke_zip) if spec.smoke_zip is not None else None
    search = _search_block(spec.search)
    if not spec.axes and not zipped and not search:
        raise StudyFileError(f"{path}: axes: required (name at least one key with its values), "
                             "unless zip or search varies something")
    _check_distinct(path, spec, zipped, smoke_zipped)
    for where, axes, groups in (("zip", spec.axes or {}, zipped),
                                ("smoke_zip", spec.smoke_axes or spec.axes or {},
                                 smoke_zipped if smoke_zipped is not None else zipped)):
        for key in set(axes).intersection(*groups) if groups else ():
            raise StudyFileError(f"{path}: {where}.{key}: also an axis; a key is an axis or zipped, not both")
    varied = set(spec.axes or {}).union(*zipped)
    for key in varied & set((search or {}).get("space", {})):
        raise StudyFileError(f"{path}: search.space.{key}: also an axis or zipped; a key is varied one way")
    try:
        study = Study(name=name, paper=spec.paper, doc=spec.doc or spec.paper,
                      base=spec.base, axes=spec.axes or {}, seeds=tuple(spec.seeds), smoke_keys=spec.smoke,
                      smoke_axes=spec.smoke_axes, evaluation=spec.eval, reference=spec.reference,
                      zipped=zipped, smoke_zipped=smoke_zipped, search=search,
                      claims=tuple(spec.claims or ()), source=str(path.resolve()))
        check_claims(spec.claims, study.grid_axes(), study.grid_zipped(), study.reference_cell())
        for grid in (study, study.smoke()):
            grid.configs()
        if search:
            searched = make_search(algorithm=None, samples=None, metric=None, ranges={}, file_search=search)
            for grid in (study, study.smoke()):
                check_space(searched, grid.cells())
    except SearchError as error:
        raise StudyFileError(f"{path}: search: {error}") from None
    except (ConfigError, ValueError) as error:
        raise StudyFileError(f"{path}: {error}") from None
    return study


def _study_name(path: Path, name: str | None) -> str:
    """The file's ``name:``, else its stem; either must be a safe name (a folder under --out)."""
    try:
        return check_study_name(name if name is not None else path.stem,
                                "name" if name is not None else "its file name (add a name: key)")
    except GridError as error:
        raise StudyFileError(f"{path}: {error}") from None


def _check_distinct(path: Path, spec: StudyFile, zipped, smoke_zipped) -> None:
    """Each axis value, zipped row and seed given once (a repeat would run one cell twice and
    pool it as more seeds); every axis with at least one value."""
    try:
        check_seeds(spec.seeds, "seeds")
        for where, axes in (("axes", spec.axes or {}), ("smoke_axes", spec.smoke_axes or {})):
            for key, values in axes.items():
                if not values:
                    raise StudyFileError(f"{path}: {where}.{key}: an axis needs at least one value")
                check_distinct(key, values, f"{where}.{key}")
        for where, groups in (("zip", zipped), ("smoke_zip", smoke_zipped or ())):
            for number, group in enumerate(groups):
                check_distinct_rows(group, where if len(groups) == 1 else f"{where}[{number}]")
    except GridError as error:
        raise StudyFileError(f"{path}: {error}") from None


def _load_plugins(path: Path, specs: list[str]) -> None:
    """The file's ``plugins:`` imported (files relative to the study file), before any cell is
    checked: a plugin's target or format is then a value like any other."""
    if not specs:
        return
    from mae_core.plugins import load_plugins

    try:
        load_plugins(specs, relative_to=path.parent)
    except UserError as error:
        raise StudyFileError(f"{path}: plugins: {error}") from None


def _zip_groups(path: Path, where: str, value) -> tuple[dict[str, list[Any]], ...]:
    """The zipped groups of ``zip``/``smoke_zip`` (one mapping or a list of them): each group's
    keys with equally many values, at least one, and no key in two groups."""
    groups = [value] if isinstance(value, dict) else list(value or [])
    seen: set[str] = set()
    for number, group in enumerate(groups):
        label = where if isinstance(value, dict) else f"{where}[{number}]"
        if not group:
            raise StudyFileError(f"{path}: {label}: name the keys that vary together, each with its values")
        first_key, first = next(iter(group.items()))
        for key, values in group.items():
            if not values:
                raise StudyFileError(f"{path}: {label}.{key}: a zipped key needs at least one value")
            if len(values) != len(first):
                raise StudyFileError(f"{path}: {label}.{key}: {len(values)} values, but {first_key} has "
                                     f"{len(first)} (zipped keys vary together: give each as many values)")
            if key in seen:
                raise StudyFileError(f"{path}: {label}.{key}: in two zipped groups; a key varies with one group")
            seen.add(key)
    return tuple(dict(group) for group in groups)


def _search_block(block: SearchBlock | None) -> dict[str, Any] | None:
    """The ``search`` block as :func:`~studies.search.make_search` reads it (a list is a choice)."""
    if block is None:
        return None
    space = {key: value if isinstance(value, str) else "choice:" + ",".join(map(str, value))
             for key, value in block.space.items()}
    return {**block.model_dump(), "space": space}


def is_study_file(name: str) -> bool:
    return name.endswith(SUFFIXES)


def builtin_files() -> list[Path]:
    return sorted(BUILTIN_FOLDER.glob("*.yaml"))


def local_files(folder: Path) -> list[Path]:
    """Study files in ``folder`` (a YAML file with an ``axes``, ``zip`` or ``search`` key), for
    ``mae-study list``."""
    found = []
    for path in sorted(p for suffix in SUFFIXES for p in folder.glob(f"*{suffix}")):
        try:
            if {"axes", "zip", "search"} & set(read_yaml(path)):
                found.append(path)
        except StudyFileError:
            continue
    return found


TEMPLATE = """\
# A mae-study study file: `mae-study run {name}.yaml` (add --smoke for a seconds-long check).
# Every key below is optional except something to vary (axes, zip or search). Config keys: `mae-study config`.
name: {name}
paper: ""                  # the paper row or figure this mirrors, e.g. "MAE Table 1a"
doc: |
  What this study asks, in a sentence or two.
base:                      # keys every trial shares (differences from the defaults)
  dataset: digits          # digits | shapes | photos | fashion_mnist | cifar10:PATH | folder:PATH | npz:PATH | idx:DIR
  steps: 1000
axes:                      # full factorial: every combination is one trial per seed
  decoder_depth: [1, 2, 4]
  mask_ratio: [0.5, 0.75]
# zip:                     # keys that vary together, row by row (equal lengths), times the axes above:
#   encoder_width: [32, 64]  # two rows (32 with 2 heads, 64 with 4), not four; several groups: a list
#   encoder_heads: [2, 4]    # of such mappings. A zipped key is in the reference row too.
seeds: [0, 1, 2, 3, 4]     # paired comparisons need enough seeds; the report states what n resolves
smoke:                     # extra keys for --smoke (on top of tiny data and steps)
  steps: 20
smoke_axes:                # a smaller grid for --smoke (smoke_zip: the same for zip)
  decoder_depth: [1, 4]
  mask_ratio: [0.75]
eval:                      # probe and fine-tuning settings (eval.* keys)
  fewshot: 8
reference:                 # the row every other row is compared with, paired by seed
  decoder_depth: 2
  mask_ratio: 0.75
claims:                    # declared before the run; the report decides each one as better, worse,
  - name: deeper_decoder_helps_linear   # equivalent (within ±delta) or inconclusive (with the seeds it needs)
    metric: probe_linear_acc
    kind: vs_reference     # vs_reference | peak (cell: beats every other) | trend (axis) | vs_baseline (baseline)
    direction: better      # better | worse | two-sided
    cells: [{{decoder_depth: 4}}]
    delta: 0.01            # the smallest effect of interest, in the metric's units (accuracies: 0.01)
# search:                  # sample keys from ranges for every arm of the grid above (each sample runs
#   space:                 # once per seed); the command line's --search/--samples/--metric override it
#     lr: "loguniform:1e-4:1e-2"   # also uniform:LOW:HIGH, randint:LOW:HIGH (both ends), choice:A,B
#   algorithm: random      # random (the same samples for every arm) | optuna (pip install 'mae-study[optuna]')
#   samples: 8             # sampled configs per arm
#   metric: probe_linear_acc  # what to optimise and rank by (its direction: the metric table)
"""


def write_template(name: str, folder: Path) -> Path:
    """``NAME.yaml`` with every key explained; never overwrites a file."""
    path = folder / f"{name}.yaml"
    if path.exists():
        raise StudyFileError(f"{path} exists; choose another name or edit it")
    path.write_text(TEMPLATE.format(name=name))
    return path
