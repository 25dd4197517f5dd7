"""The built-in studies, by name (an explicit table: adding a study is one line here)."""

from __future__ import annotations

from mae_core.errors import UserError

from . import (
    corruption,
    decoder_depth,
    decoder_width,
    lesson,
    mask_ratio,
    mask_sampling,
    mask_token,
    objectives,
    schedule,
    target,
)
from .study import Study

STUDIES: dict[str, Study] = {
    module.STUDY.name: module.STUDY
    for module in (mask_ratio, decoder_depth, decoder_width, target, mask_sampling, mask_token,
                   corruption, objectives, schedule, lesson)
}


class UnknownStudyError(UserError):
    pass


def get_study(name: str) -> Study:
    if name not in STUDIES:
        raise UnknownStudyError(f"unknown study {name!r}; built-in studies: {', '.join(STUDIES)}")
    return STUDIES[name]
