"""Claims registered before a study ran: the parent's claims_sha256 and study_file_commit tags,
made from study files in a throwaway git repository, and the report's declared column: before
for an unchanged committed study file, after for a claim added after the start, unregistered for
a study file that was not committed."""

from __future__ import annotations

import json
import subprocess
from pathlib import Path

import pandas as pd
import pytest
from mlflow.tracking import MlflowClient

from analysis.claims_report import decide
from analysis.registration import canonical_claims, claims_sha256, declared_labels
from analysis.report import write_report
from studies.planning import RunOptions, plan_study
from studies.registration import registration_tags, study_file_commit
from studies.runner import _create_parent
from studies.study_files import load_study_file
from tests.test_claims import AXES, REFERENCE, planted
from tests.test_report import SAMPLERS, _sampling_metrics, _study_store

STUDY = """\
name: sampling
paper: MAE Table 1f
base: {dataset: digits, steps: 20}
axes:
  mask_sampling: [random, block, grid]
reference: {mask_sampling: random}
claims:
  - {name: block_worse, metric: probe_linear_acc, kind: vs_reference, direction: worse,
     cells: [{mask_sampling: block}]}
"""
ADDED = """\
  - {name: grid_worse, metric: probe_linear_acc, kind: vs_reference, direction: worse,
     cells: [{mask_sampling: grid}]}
"""


def git(repo: Path, *args: str) -> str:
    return subprocess.run(["git", "-C", str(repo), "-c", "user.name=test", "-c", "user.email=test@example.org",
                           "-c", "commit.gpgsign=false", *args], capture_output=True, text=True, check=True).stdout.strip()


@pytest.fixture
def repo(tmp_path) -> Path:
    """A git repository whose one commit holds ``sampling.yaml``."""
    folder = tmp_path / "project"
    folder.mkdir()
    git(folder, "init", "-q")
    (folder / "sampling.yaml").write_text(STUDY)
    git(folder, "add", "sampling.yaml")
    git(folder, "commit", "-q", "-m", "the study, claims first")
    return folder


def test_the_canonical_block_ignores_key_order_and_spacing_but_not_claim_order():
    a = [{"name": "x", "metric": "m", "cell": {"r": 0.75, "d": 1}}, {"name": "y", "metric": "m"}]
    b = [{"cell": {"d": 1, "r": 0.75}, "metric": "m", "name": "x"}, {"metric": "m", "name": "y"}]
    assert canonical_claims(a) == canonical_claims(b) == json.dumps(b, sort_keys=True, separators=(",", ":"))
    assert claims_sha256(a) == claims_sha256(b) != claims_sha256(a[::-1])


def test_the_commit_of_an_unchanged_committed_study_file(repo):
    study = load_study_file(repo / "sampling.yaml")
    tags = registration_tags(study)
    assert tags == {"claims_sha256": claims_sha256(study.claims), "study_file_commit": git(repo, "rev-parse", "HEAD")}
    # edited after the commit, never added, or outside any checkout: uncommitted
    (repo / "sampling.yaml").write_text(STUDY + ADDED)
    assert study_file_commit(repo / "sampling.yaml") == "uncommitted"
    (repo / "other.yaml").write_text(STUDY)
    assert study_file_commit(repo / "other.yaml") == "uncommitted"
    assert study_file_commit(None) == "uncommitted"


def test_a_fresh_study_records_both_tags_on_its_parent_run(repo, tmp_path):
    plan = plan_study(load_study_file(repo / "sampling.yaml"), smoke=True, overrides={})
    uri = f"sqlite:///{tmp_path}/mlflow.db"
    client = MlflowClient(uri)
    experiment = client.create_experiment("mae-study", artifact_location=str(tmp_path / "artifacts"))
    options = RunOptions(out_dir=tmp_path / "sampling", tracking_uri=uri)
    options.out_dir.mkdir()
    state = _create_parent(client, experiment, plan, options)
    tags = client.get_run(state["parent_run_id"]).data.tags
    assert tags["study_file_commit"] == git(repo, "rev-parse", "HEAD")
    assert tags["claims_sha256"] == claims_sha256(json.loads(tags["claims"]))
    info = {"claims": json.loads(tags["claims"]), **{k: tags[k] for k in ("claims_sha256", "study_file_commit")}}
    assert declared_labels(info["claims"], info) == {"block_worse": "before"}


def _declared(tmp_path: Path, tags: dict[str, str]) -> dict[str, str]:
    """The declared column of a report on a planted store whose parent carries ``tags``."""
    uri = _study_store(tmp_path, "mask_sampling", "mask_sampling", SAMPLERS, {"smoke": "False", "reference": json.dumps({"mask_sampling": "random"}), **tags},
                       _sampling_metrics)
    index = write_report("mask_sampling", uri, tmp_path / "report", formats=("png",))
    table = pd.read_csv(index.parent / "claims.csv")
    page, notes = index.read_text(encoding="utf-8"), (index.parent / "claims.md").read_text(encoding="utf-8")
    for label in set(table["declared"]):  # on the page and in claims.md too
        assert f"<td>{label}</td>" in page and f"| {label} |" in notes
    return dict(zip(table["claim"], table["declared"]))


def _start_tags(path: Path) -> dict[str, str]:
    """What _create_parent records for the study file at ``path``: its claims and both tags."""
    study = load_study_file(path)
    return {"claims": json.dumps(study.claims, separators=(",", ":")), **registration_tags(study)}


def test_an_unchanged_committed_study_file_is_declared_before(repo, tmp_path):
    assert _declared(tmp_path, _start_tags(repo / "sampling.yaml")) == {"block_worse": "before"}


def test_a_claim_added_after_the_start_is_declared_after(repo, tmp_path):
    tags = _start_tags(repo / "sampling.yaml")
    (repo / "sampling.yaml").write_text(STUDY + ADDED)  # added once the study had started
    later = load_study_file(repo / "sampling.yaml")
    info = {**{k: tags[k] for k in ("claims_sha256", "study_file_commit")}, "claims": json.loads(tags["claims"])}
    assert declared_labels(later.claims, info) == {"block_worse": "before", "grid_worse": "after"}
    # and the parent's claims tag rewritten with the longer block: nothing hashed at the start vouches for it
    rewritten = {**tags, "claims": json.dumps(later.claims, separators=(",", ":"))}
    assert _declared(tmp_path, rewritten) == {"block_worse": "after", "grid_worse": "after"}


def test_an_uncommitted_study_file_is_unregistered(repo, tmp_path):
    (repo / "sampling.yaml").write_text(STUDY + "# an edit not committed\n")
    tags = _start_tags(repo / "sampling.yaml")
    assert tags["study_file_commit"] == "uncommitted"
    assert _declared(tmp_path, tags) == {"block_worse": "unregistered"}


def test_a_run_that_predates_registration_is_after_and_the_text_says_what_each_label_means():
    info = {"grid": {**AXES, "seed": list(range(8))}, "axes": ["mask_ratio"], "zip": [], "reference": REFERENCE}
    raw = [{"name": "peak", "metric": "probe_linear_acc", "kind": "peak", "cell": {"mask_ratio": 0.75}}]
    claims = decide(planted({0.25: 0.80, 0.5: 0.84, 0.75: 0.90, 0.9: 0.80}, sd=0.003), "s", info, raw,
                    "written from the paper's rows")
    assert list(claims.table["declared"]) == ["after"]
    assert claims.text.startswith("Claims by when they were declared (column declared): 1 after (written or changed "
                                  "after the study started, or the run predates registration: exploratory). "
                                  "Written from the paper's rows.")
