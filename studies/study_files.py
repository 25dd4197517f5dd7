"""Study files: one YAML format for the built-in studies (``studies/builtin/``) and a user's own.

    name: depth_x_ratio                 # optional; default: the file's name
    paper: MAE Table 1a × Figure 5      # optional: the paper row or figure it mirrors
    doc: what the study asks            # optional
    base: {dataset: digits, steps: 1000}            # keys that differ from the defaults
    axes: {decoder_depth: [1, 4], mask_ratio: [0.5, 0.75]}   # full factorial
    seeds: [0, 1, 2, 3, 4]
    smoke: {steps: 20}                  # extra keys for --smoke (on top of the usual smoke sizes)
    smoke_axes: {decoder_depth: [1, 4], mask_ratio: [0.75]}  # a smaller grid for --smoke
    eval: {finetune_steps: 200}         # eval.* keys: probes and fine-tuning
    reference: {decoder_depth: 4, mask_ratio: 0.75}          # the row the others are compared with

A file is validated completely when it is read, before Ray starts or a run exists: its shape
(pydantic), then every cell of its full and smoke grids as a :class:`~mae_core.config.Config`.
Any problem is one line naming the file, the key and what is allowed.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from pydantic import BaseModel, ConfigDict, Field, ValidationError

from mae_core.config import ConfigError
from mae_core.errors import UserError, first_problem
from mae_core.files import read_yaml_mapping

from .study import Study

BUILTIN_FOLDER = Path(__file__).resolve().parent / "builtin"
SUFFIXES = (".yaml", ".yml")


class StudyFileError(UserError):
    """A study file that cannot be used: one line naming the file and the key."""


class StudyFile(BaseModel):
    """The keys a study file may hold (anything else is refused)."""

    model_config = ConfigDict(extra="forbid")

    name: str | None = Field(None, pattern=r"^[A-Za-z0-9_.-]+$")
    paper: str = ""
    doc: str = ""
    base: dict[str, Any] = {}
    axes: dict[str, list[Any]]
    seeds: list[int] = Field([0, 1, 2, 3, 4], min_length=1)
    smoke: dict[str, Any] = {}
    smoke_axes: dict[str, list[Any]] | None = None
    eval: dict[str, Any] = {}
    reference: dict[str, Any] | None = None


def _one_line(error: ValidationError) -> str:
    key, kind, message, _ = first_problem(error)
    if kind == "extra_forbidden":
        return f"unknown key {key!r}; allowed: {', '.join(StudyFile.model_fields)}"
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
    """Read, validate and build the study in ``path`` (every cell checked as a Config)."""
    path = Path(path)
    try:
        spec = StudyFile(**read_yaml(path))
    except ValidationError as error:
        raise StudyFileError(f"{path}: {_one_line(error)}") from None
    for where, axes in (("axes", spec.axes), ("smoke_axes", spec.smoke_axes or {})):
        if where == "axes" and not axes:
            raise StudyFileError(f"{path}: axes: name at least one key with its values")
        for key, values in axes.items():
            if not values:
                raise StudyFileError(f"{path}: {where}.{key}: an axis needs at least one value")
    try:
        study = Study(name=spec.name or path.stem, paper=spec.paper, doc=spec.doc or spec.paper,
                      base=spec.base, axes=spec.axes, seeds=tuple(spec.seeds), smoke=spec.smoke,
                      smoke_axes=spec.smoke_axes, evaluation=spec.eval, reference=spec.reference)
        for smoke in (False, True):
            study.configs(smoke=smoke)
    except (ConfigError, ValueError) as error:
        raise StudyFileError(f"{path}: {error}") from None
    return study


def is_study_file(name: str) -> bool:
    return name.endswith(SUFFIXES)


def builtin_files() -> list[Path]:
    return sorted(BUILTIN_FOLDER.glob("*.yaml"))


def local_files(folder: Path) -> list[Path]:
    """Study files in ``folder`` (a YAML file with an ``axes`` key), for ``mae-study list``."""
    found = []
    for path in sorted(p for suffix in SUFFIXES for p in folder.glob(f"*{suffix}")):
        try:
            if "axes" in read_yaml(path):
                found.append(path)
        except StudyFileError:
            continue
    return found


TEMPLATE = """\
# A mae-study study file: `mae-study run {name}.yaml` (add --smoke for a seconds-long check).
# Every key below is optional except axes. Config keys: `mae-study config`.
name: {name}
paper: ""                  # the paper row or figure this mirrors, e.g. "MAE Table 1a"
doc: |
  What this study asks, in a sentence or two.
base:                      # keys every trial shares (differences from the defaults)
  dataset: digits          # digits | shapes | photos | cifar10:PATH | folder:PATH | npz:PATH
  steps: 1000
axes:                      # full factorial: every combination is one trial per seed
  decoder_depth: [1, 2, 4]
  mask_ratio: [0.5, 0.75]
seeds: [0, 1, 2, 3, 4]     # paired comparisons need enough seeds; the report states what n resolves
smoke:                     # extra keys for --smoke (on top of tiny data and steps)
  steps: 20
smoke_axes:                # a smaller grid for --smoke
  decoder_depth: [1, 4]
  mask_ratio: [0.75]
eval:                      # probe and fine-tuning settings (eval.* keys)
  fewshot: 8
reference:                 # the row every other row is compared with, paired by seed
  decoder_depth: 2
  mask_ratio: 0.75
"""


def write_template(name: str, folder: Path) -> Path:
    """``NAME.yaml`` with every key explained; never overwrites a file."""
    path = folder / f"{name}.yaml"
    if path.exists():
        raise StudyFileError(f"{path} exists; choose another name or edit it")
    path.write_text(TEMPLATE.format(name=name))
    return path
