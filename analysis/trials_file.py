"""A study read back from the ``trials.csv`` its report wrote, without the MLflow store.

``mae-study report`` writes ``trials.csv`` (a row per trial: the axes, the seed, then every param
and final metric) and ``study.json`` (the parent run's header: axes, grid, reference, paper,
smoke) beside it, so a committed report is enough to rebuild its statistics and its part of MAE
Table 1 (``mae-study report --paper STUDY=path/to/trials.csv``) after the store is gone.

A ``trials.csv`` without ``study.json`` (reports written before it existed) is read against the
built-in study of the same name, looked up by the caller's ``find_study`` (the study layer's
``studies.named_studies.get_study``: analysis sits below studies and never imports it): its paper, reference and zipped groups, provided the file holds
exactly that study's full grid (a smoke run or a run with other axis values is refused, since
nothing in the file would say which it was).
"""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pandas as pd

from mae_core.errors import UserError

from .trials_frame import ReportError, cast_param, typed_frame
from .study_header import StudyHeader

STUDY_FILE = "study.json"
_TEXT_COLUMNS = ("run_id", "run_name", "status", "study", "cell_id", "failure_reason")


def write_study_info(info: dict[str, Any], out: Path) -> Path:
    """``study.json`` beside ``trials.csv``: the header :func:`load_trials` reads back."""
    path = out / STUDY_FILE
    path.write_text(json.dumps(info, indent=1, default=str) + "\n", encoding="utf-8")
    return path


# a study's name -> its Study (axes, zipped, paper, reference); raises a UserError for an unknown name
FindStudy = Callable[[str], Any]


def load_trials(path: Path, study: str, find_study: FindStudy | None = None) -> tuple[pd.DataFrame, dict[str, Any]]:
    """``trials.csv`` -> (the frame :func:`analysis.trials_frame.load_runs` would give, the header
    :func:`analysis.trials_frame.load_study_info` would give). Raises ReportError (one line) when the
    file is not a report's ``trials.csv`` or, without ``study.json``, is not the full grid of
    the built-in study ``study``."""
    try:
        text = pd.read_csv(path, dtype=str, keep_default_na=False)
    except (OSError, pd.errors.ParserError, pd.errors.EmptyDataError) as error:
        raise ReportError(f"cannot read {path}: {error}") from None
    if "seed" not in text:
        raise ReportError(f"{path} has no 'seed' column: not a trials.csv written by mae-study report")
    rows = [{key: _cell(key, value) for key, value in row.items()} for row in text.to_dict("records")]
    axes = list(text.columns[: list(text.columns).index("seed")])  # written first: the axes, then seed
    frame = typed_frame(pd.DataFrame(rows, columns=text.columns), axes)
    info_path = path.parent / STUDY_FILE
    if info_path.is_file():
        info = json.loads(info_path.read_text(encoding="utf-8"))
        info["axes"] = axes
        return frame, info
    return frame, _builtin_info(path, study, frame, axes, find_study)


def _cell(key: str, value: str) -> Any:
    """A CSV cell back to its value: empty is None, text columns stay text, params and metrics
    are cast as :func:`analysis.trials_frame.load_runs` casts MLflow's strings."""
    if value == "":
        return None
    return value if key in _TEXT_COLUMNS else cast_param(key, value)


def _builtin_info(path: Path, study: str, frame: pd.DataFrame, axes: list[str],
                  find_study: FindStudy | None) -> dict[str, Any]:
    if find_study is None:
        raise ReportError(f"{path} has no {STUDY_FILE} beside it: regenerate its report with mae-study report")
    try:
        builtin = find_study(study)
    except UserError:
        raise ReportError(f"{path} has no {STUDY_FILE} beside it and {study!r} is not a built-in study: "
                          f"regenerate its report with mae-study report") from None
    grid = {**builtin.axes, **{key: values for group in builtin.zipped for key, values in group.items()}}
    found = {axis: sorted(map(str, pd.unique(frame[axis]))) for axis in axes}
    expected = {axis: sorted(map(str, values)) for axis, values in grid.items()}
    if found != expected:
        raise ReportError(f"{path} is not the full grid of the built-in study {study} ({found} against "
                          f"{expected}) and has no {STUDY_FILE} to say what it is")
    return StudyHeader(study=study, paper=builtin.paper, study_axes=axes, grid=builtin.axes,
                       reference=builtin.reference, zip=[dict(group) for group in builtin.zipped],
                       run_name=path.parent.name).to_json()
