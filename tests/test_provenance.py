"""The report's "what was run" rows name every commit a study's trials ran on: the one that
started it and those a ``--resume``, a further look or ``--add-seeds`` continued it on."""

from __future__ import annotations

import json

from mlflow.tracking import MlflowClient
from mlflow.utils.mlflow_tags import MLFLOW_GIT_COMMIT

from analysis.provenance import _commits
from studies import tracking


def test_a_study_continued_on_another_commit_names_both(tmp_path, monkeypatch):
    uri = tracking.default_tracking_uri(tmp_path)
    client = MlflowClient(uri)
    parent = tracking.create_run(client, tracking.ensure_experiment(client, "mae-study", uri), "study")
    tracking.set_tags(client, parent, {MLFLOW_GIT_COMMIT: "aaa"})
    for commit in ("aaa", "bbb", "bbb", "ccc", "unknown"):  # its own, a new one twice, another, none
        monkeypatch.setattr(tracking, "git_commit", lambda commit=commit: commit)
        tracking.record_continuing_commit(client, parent)
    tags = client.get_run(parent).data.tags
    assert json.loads(tags[tracking.CONTINUED_TAG]) == ["bbb", "ccc"]
    assert _commits(tags[MLFLOW_GIT_COMMIT], tags) == "aaa; continued on bbb, ccc"
    assert _commits("aaa", {}) == "aaa"
    assert _commits(None, {}) == "not recorded (not run from a git checkout)"
