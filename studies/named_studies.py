"""Studies by name or by file: the built-in study files (``studies/builtin/*.yaml``) and any
study file a user names (``mae-study run my_study.yaml``); one format for both."""

from __future__ import annotations

from pathlib import Path

from mae_core.errors import UserError

from .study import Study
from .study_files import builtin_files, is_study_file, load_study_file

STUDIES: dict[str, Study] = {study.name: study for study in map(load_study_file, builtin_files())}


class UnknownStudyError(UserError):
    pass


def get_study(name: str) -> Study:
    """A built-in study by name, or the study file at ``name`` (``*.yaml``/``*.yml``)."""
    if is_study_file(name) or Path(name).is_file():
        return load_study_file(name)
    if name not in STUDIES:
        raise UnknownStudyError(f"unknown study {name!r}; built-in studies: {', '.join(STUDIES)}; "
                                "or name a study file (my_study.yaml; `mae-study new-study NAME` writes one)")
    return STUDIES[name]
