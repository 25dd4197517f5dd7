"""What a study's parent run records when it starts, so its report can tell claims registered
before the run from those written after (:mod:`analysis.registration` says what each label means).

``study_file_commit`` is HEAD's commit when the study file is tracked by git and its bytes equal
HEAD's copy (the file's own git checkout: a user's project, or this repository for the built-in
study files, which live in the package); otherwise ``uncommitted`` (edited since, never added,
or no git at all, as for a package installed from a wheel).
"""

from __future__ import annotations

import subprocess
from pathlib import Path

from analysis.registration import CLAIMS_HASH_TAG, COMMIT_TAG, UNCOMMITTED, claims_sha256

from .study import Study

GIT_TIMEOUT_S = 10


def _git(folder: Path, *args: str) -> bytes:
    return subprocess.run(["git", "-C", str(folder), *args], capture_output=True, check=True,
                          timeout=GIT_TIMEOUT_S).stdout


def study_file_commit(path: Path | str | None) -> str:
    """HEAD's commit if the file at ``path`` is committed there unchanged, else ``uncommitted``."""
    if path is None:
        return UNCOMMITTED
    path = Path(path).resolve()
    try:
        head = _git(path.parent, "rev-parse", "--verify", "HEAD").decode().strip()
        committed = _git(path.parent, "show", f"HEAD:./{path.name}")  # ./: relative to the file's folder
        unchanged = committed == path.read_bytes()
    except (OSError, subprocess.SubprocessError):  # no git, not a checkout, not tracked, no commit yet
        return UNCOMMITTED
    return head if unchanged else UNCOMMITTED


def registration_tags(study: Study) -> dict[str, str]:
    """The parent run's ``claims_sha256`` and ``study_file_commit`` tags for ``study``."""
    return {CLAIMS_HASH_TAG: claims_sha256(study.claims), COMMIT_TAG: study_file_commit(study.source)}
