"""Hostile inputs to the study features (issue #32, items 3-6 and 8): a claim's delta, study
names and the folders they make, size limits before allocation, files read back (mlflow.db,
study.json, claims.csv, checkpoints) and repeated seeds or axis values. Each is one line naming
the input, exit status 2, no traceback, Ray never started and nothing new in --out."""

from __future__ import annotations

import os
import resource
import sqlite3
from pathlib import Path

import pytest

from analysis.claims import check_claims, trend_order
from mae_core.errors import SHOWN_CHARS, UserError, shown
from studies.cli import main
from studies.cli.common import UsageError, study_folder
from studies.named_studies import STUDIES
from studies.study import SEED_LIMIT, check_study_name
from studies.study_files import StudyFileError, load_study_file

from conftest import own_ray

STUDY = """\
name: {name}
base: {{dataset: digits, steps: 20}}
axes: {{mask_ratio: [0.5, 0.75]}}
seeds: [0, 1]
reference: {{mask_ratio: 0.75}}
"""

NAMELESS = STUDY.format(name="x").replace("name: x\n", "")  # the name comes from the file's stem

# A "billion laughs" study file of under 518 bytes: nine levels of nine aliases make base.steps
# stand for 9⁹ ≈ 3.9·10⁸ strings, which a message quoting the value would spell out in gigabytes.
ALIAS_BOMB = ("name: bomb\naxes: {mask_ratio: [0.5]}\nsmoke:\n"
              '  a: &a ["lol","lol","lol","lol","lol","lol","lol","lol","lol"]\n'
              + "".join(f"  {b}: &{b} [{','.join(['*' + a] * 9)}]\n" for a, b in zip("abcdefgh", "bcdefghi"))
              + "base: {steps: *i}\n")


@pytest.fixture(autouse=True)
def no_ray_start(monkeypatch):
    """A case that is not refused fails at once, rather than running a study on two cores."""
    import ray

    def start(*args, **kwargs):
        raise AssertionError("Ray would start: the input was not refused")

    monkeypatch.setattr(ray, "init", start)


def refused(*args: str, cwd: Path, capsys, words: str | tuple[str, ...]) -> str:
    """Run the CLI in this process in ``cwd`` and check the refusal: exit 2, one stderr line with
    ``words``, no traceback, Ray not started, and ``cwd`` (which holds --out) unchanged."""
    import ray

    own_ray()
    before = sorted(str(p.relative_to(cwd)) for p in cwd.rglob("*"))
    old = Path.cwd()
    os.chdir(cwd)
    try:
        status = main(list(args))
    except SystemExit as exit_:
        status = exit_.code
    finally:
        os.chdir(old)
    err = capsys.readouterr().err
    lines = [line for line in err.splitlines() if line.strip()]
    assert status == 2, err
    assert len(lines) == 1, err
    assert "Traceback" not in err
    for word in (words,) if isinstance(words, str) else words:
        assert word in lines[0], lines[0]
    assert sorted(str(p.relative_to(cwd)) for p in cwd.rglob("*")) == before, "nothing new in --out"
    assert not ray.is_initialized(), "Ray never started"
    return lines[0]


def study_file(folder: Path, file_name: str, text: str) -> Path:
    path = folder / file_name
    path.write_text(text)
    return path


# ------------------------------------------------------------------- item 3: a claim's delta

CLAIM = "claims:\n  - {{name: c, metric: {metric}, kind: vs_reference, delta: {delta}}}\n"

BAD_DELTAS = [
    ("true", "probe_linear_acc", "true is not a number"),
    ("yes", "probe_linear_acc", "not a number"),  # YAML 1.1's other spelling of true
    (".inf", "probe_linear_acc", "finite number"),
    ("-.inf", "probe_linear_acc", "claims[0].delta"),
    (".nan", "probe_linear_acc", "claims[0].delta"),
    ("1", "probe_linear_acc", "1 is not below the range of probe_linear_acc (0 to 1)"),
    ("1.0", "finetune_acc", "not below the range"),
    ("30", "probe_knn_acc", "not below the range"),
    (".inf", "test_mae_risk", "finite number"),
    ("0", "probe_linear_acc", "greater than 0"),
]


@pytest.mark.parametrize("delta,metric,words", BAD_DELTAS, ids=[f"{m}-{d}" for d, m, _ in BAD_DELTAS])
def test_a_claims_delta_is_a_finite_positive_number_below_the_metrics_range(delta, metric, words, tmp_path,
                                                                             capsys):
    path = study_file(tmp_path, "d.yaml", STUDY.format(name="d") + CLAIM.format(metric=metric, delta=delta))
    refused("run", str(path), "--smoke", "--out", "out", cwd=tmp_path, capsys=capsys,
            words=(str(path), "claims[0].delta", words))


def test_a_delta_inside_the_range_or_on_an_unbounded_metric_is_kept(tmp_path):
    axes, reference = {"mask_ratio": [0.5, 0.75]}, {"mask_ratio": 0.75}
    claim = {"name": "c", "kind": "vs_reference", "cells": [{"mask_ratio": 0.5}]}
    kept = check_claims([{**claim, "metric": "probe_linear_acc", "delta": 0.99},
                         {**claim, "name": "r", "metric": "test_mae_risk", "delta": 5}], axes, (), reference)
    assert [c["delta"] for c in kept] == [0.99, 5.0]  # a risk's scale has no upper end
    with pytest.raises(ValueError, match="not below the range"):
        check_claims([{**claim, "metric": "random_probe_linear_acc", "delta": 1}], axes, (), reference)


# -------------------------------------------------------------------- item 4: study names

BAD_NAMES = {  # file name, content, words
    "dots_stem": ("...yaml", NAMELESS, "study name '..'"),
    "html_stem": ("<img x>.yaml", NAMELESS, "study name '<img x>'"),
    "hidden_stem": (".hidden.yaml", NAMELESS, "study name '.hidden'"),
    "dots_name": ("ok.yaml", STUDY.format(name="'..'"), "name: study name '..'"),
    "slash_name": ("ok.yaml", STUDY.format(name="a/b"), "study name 'a/b'"),
    "dot_name": ("ok.yaml", STUDY.format(name="'.'"), "study name '.'"),
    "long_name": ("ok.yaml", STUDY.format(name="x" * 300), "at most 200 characters"),
}


@pytest.mark.parametrize("case", BAD_NAMES)
def test_a_study_name_from_the_file_or_its_stem_is_a_safe_name(case, tmp_path, capsys):
    file_name, text, words = BAD_NAMES[case]
    path = study_file(tmp_path, file_name, text)
    line = refused("run", str(path), "--smoke", "--out", "out", cwd=tmp_path, capsys=capsys,
                   words=(str(path), words, "letters, digits"))
    assert len(line) < 300


@pytest.mark.parametrize("command", [["report", "..", "--out", "out"], ["report", ".x", "--out", "out"],
                                     ["report", "a/../b", "--out", "out"], ["evaluate", "..", "--out", "out"],
                                     ["report", "--paper", "..", "--out", "out"], ["new-study", ".."],
                                     ["new-study", "../up"]])
def test_report_evaluate_and_new_study_refuse_the_same_names(command, tmp_path, capsys):
    refused(*command, cwd=tmp_path, capsys=capsys, words=("study name", "letters, digits"))


NAMES = ["mask_ratio", "my.study-v2_1", "A1", "_x", "-x", "x.", "..", ".x", "a b", "<img x>", "ü", "a/b", ""]


@pytest.mark.parametrize("name", NAMES)
def test_report_accepts_every_name_run_accepts(name, tmp_path, capsys):
    """One pattern: a file stem that run loads is a name report takes (it then finds no store)."""
    try:
        runs = "/" not in name and load_study_file(study_file(tmp_path, f"{name}.yaml", NAMELESS)).name == name
    except StudyFileError:
        runs = False
    assert runs == check_study_name_ok(name)
    try:
        main(["report", name, "--out", str(tmp_path / "out")])
    except SystemExit as exit_:
        assert exit_.code == 2
    err = capsys.readouterr().err
    assert ("study name" not in err) == runs, err
    assert runs or name in err or not name


def check_study_name_ok(name: str) -> bool:
    try:
        check_study_name(name, "test")
    except UserError:
        return False
    return True


def test_every_builtin_name_is_a_safe_name():
    assert all(check_study_name_ok(name) for name in STUDIES)


def test_a_study_folder_stays_inside_out_after_links_are_followed(tmp_path, capsys):
    root, outside = tmp_path / "out", tmp_path / "elsewhere"
    root.mkdir()
    outside.mkdir()
    (root / "evil").symlink_to(outside)
    (root / "evil-smoke").symlink_to(outside)
    with pytest.raises(UsageError, match="outside --out"):
        study_folder(root, "evil", False)
    assert study_folder(root, "fine", True) == root / "fine-smoke"
    path = study_file(tmp_path, "evil.yaml", STUDY.format(name="evil"))
    refused("run", str(path), "--smoke", "--out", "out", cwd=tmp_path, capsys=capsys, words="outside --out")
    assert list(outside.iterdir()) == []


# ------------------------------------------------------- item 5: size limits before allocation

SEED_CAPS = [(["--add-seeds", "0-999999999"], "--add-seeds 0-999999999: 1000000000 seeds; at most 10000"),
             (["seeds=0-99999999"], "seeds=0-99999999: 100000000 seeds; at most 10000"),
             (["--add-seeds", "0-5000,6000-12000"], "11002 seeds; at most 10000"),
             (["seeds=0-1" + "0" * 40], "seeds=0-1000")]  # past 18 digits: no seed at all


@pytest.mark.parametrize("args,words", SEED_CAPS, ids=[" ".join(a)[:30] for a, _ in SEED_CAPS])
def test_seed_ranges_are_capped_before_a_list_is_built(args, words, tmp_path, capsys):
    refused("run", "mask_ratio", "--smoke", "--out", "out", *args, cwd=tmp_path, capsys=capsys, words=words)


def test_a_study_files_seeds_are_capped(tmp_path, capsys):
    path = study_file(tmp_path, "many.yaml", STUDY.format(name="many").replace(
        "seeds: [0, 1]", f"seeds: [{', '.join(map(str, range(SEED_LIMIT + 1)))}]"))
    refused("run", str(path), "--smoke", "--out", "out", cwd=tmp_path, capsys=capsys,
            words=(str(path), f"at most {SEED_LIMIT}"))


def test_a_yaml_alias_bomb_is_refused_without_expanding_it(tmp_path, capsys):
    assert len(ALIAS_BOMB) < 518
    bomb = study_file(tmp_path, "bomb.yaml", ALIAS_BOMB)
    cycle = study_file(tmp_path, "cycle.yaml", STUDY.format(name="cycle") + "doc: &d [1, *d]\n")
    before = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss  # KiB on Linux
    refused("run", str(bomb), "--smoke", "--out", "out", cwd=tmp_path, capsys=capsys,
            words=(str(bomb), "more than 100000 values"))
    refused("train", "--config", str(bomb), "--out", "out", cwd=tmp_path, capsys=capsys,
            words=(f"--config {bomb}", "aliases"))
    refused("run", str(cycle), "--smoke", "--out", "out", cwd=tmp_path, capsys=capsys,
            words=(str(cycle), "inside its own anchor"))
    assert resource.getrusage(resource.RUSAGE_SELF).ru_maxrss - before < 200 * 1024, "no gigabytes taken"
    shared = study_file(tmp_path, "shared.yaml", STUDY.format(name="shared").replace(
        "base: {dataset: digits, steps: 20}", "base: &b {dataset: digits, steps: 20}") + "smoke: *b\n")
    assert load_study_file(shared).smoke_keys == {"dataset": "digits", "steps": 20}  # modest aliases still read


def test_a_large_or_binary_yaml_file_is_refused_by_size_and_encoding(tmp_path, capsys):
    big = study_file(tmp_path, "big.yaml", "doc: " + "x" * (2 << 20) + "\n")
    binary = tmp_path / "binary.yaml"
    binary.write_bytes(bytes(range(128, 256)) * 4)
    deep = study_file(tmp_path, "deep.yaml", "doc: " + "[" * 5000 + "]" * 5000 + "\n")
    for path, words in ((big, "bytes; a YAML file here is at most"), (binary, "not UTF-8 text"),
                        (deep, "nested too deeply")):
        refused("run", str(path), "--smoke", "--out", "out", cwd=tmp_path, capsys=capsys, words=(str(path), words))


def test_an_error_message_never_embeds_a_whole_value(tmp_path, capsys):
    long_axis = "mask_ratio=" + ",".join(["0.5"] * 20000)
    line = refused("run", "mask_ratio", "--smoke", "--out", "out", long_axis, cwd=tmp_path, capsys=capsys,
                   words="mask_ratio 0.5 is given twice")
    assert len(line) < 300
    line = refused("train", "mask_ratio=" + "9" * 100_000, "--out", "out", cwd=tmp_path, capsys=capsys,
                   words="mask_ratio=")
    assert len(line) < 400
    path = study_file(tmp_path, "cell.yaml", STUDY.format(name="cell") + CLAIM.format(
        metric="probe_linear_acc", delta=0.01).replace("delta: 0.01", "delta: 0.01, cells: [{mask_ratio: 0."
                                                       + "3" * 5000 + "}]"))
    line = refused("run", str(path), "--smoke", "--out", "out", cwd=tmp_path, capsys=capsys, words="not a cell")
    assert len(line) < 400
    assert len(shown(list(range(10**6)))) <= SHOWN_CHARS and len(shown("x" * 10**6)) <= SHOWN_CHARS


# ------------------------------------------------- item 6: one line for every file read back

def test_bad_seed_overrides_are_one_line(tmp_path, capsys):
    for value in ("abc", "", "1,,2", "-1", "3-1", "0.5"):
        refused("run", "mask_ratio", "--smoke", "--out", "out", f"seeds={value}", cwd=tmp_path, capsys=capsys,
                words=(f"seeds={value}:", "give seeds as 5-9 or 5,6,7"))
    for value in ("abc", ""):
        refused("train", "--out", "out", f"seeds={value}", cwd=tmp_path, capsys=capsys, words="unknown key 'seeds'")


@pytest.fixture(scope="module")
def mlflow_store(tmp_path_factory) -> Path:
    """A real (small) MLflow store: one experiment with a parent and a child run."""
    from mlflow.tracking import MlflowClient

    store = tmp_path_factory.mktemp("store") / "mlflow.db"
    client = MlflowClient(f"sqlite:///{store}")
    experiment = client.create_experiment("mae-study")
    parent = client.create_run(experiment, tags={"study": "mask_ratio"})
    for step in range(50):
        client.log_metric(parent.info.run_id, "probe_linear_acc", step / 50, step=step)
    return store


def damaged_stores(store: Path) -> dict[str, bytes]:
    good = store.read_bytes()
    other = store.with_name("other.db")
    with sqlite3.connect(other) as db:
        db.execute("create table if not exists t (x)")
    return {"garbage": os.urandom(5000), "truncated": good[:len(good) // 2], "header_only": good[:3000],
            "another_database": other.read_bytes()}


@pytest.mark.parametrize("command", [["report", "mask_ratio"], ["evaluate", "mask_ratio", "eval.knn_ks=5"],
                                     ["report", "--paper", "mask_ratio"], ["run", "mask_ratio", "--smoke"],
                                     ["train", "--smoke"]])
def test_a_damaged_mlflow_db_is_one_line_naming_it(command, mlflow_store, tmp_path, capsys):
    for case, content in damaged_stores(mlflow_store).items():
        out = tmp_path / case
        out.mkdir()
        (out / "mlflow.db").write_bytes(content)
        refused(*command, "--out", case, cwd=tmp_path, capsys=capsys,
                words=(f"{out / 'mlflow.db'}: cannot be read as an MLflow store",))


def test_a_damaged_study_json_is_one_line_naming_it(tmp_path, capsys):
    folder = tmp_path / "out" / "mask_ratio-smoke"
    folder.mkdir(parents=True)
    for content in ('{"cells": [', "\x00\xff garbage", "[1, 2]", '{"name": "x"}', '{"cells": 3}'):
        (folder / "study.json").write_text(content, errors="surrogateescape")
        for extra in ([], ["--resume"], ["--add-seeds", "5"]):
            refused("run", "mask_ratio", "--smoke", "--out", "out", *extra, cwd=tmp_path, capsys=capsys,
                    words=f"{folder / 'study.json'}:")


BAD_CLAIMS_CSV = {"binary": b"\x00\xff\xfe" * 100, "empty": b"", "no_columns": b"a,b\n1,2\n",
                  "bad_n": b"claim,cell,verdict,n,effect,ci_low,ci_high\nc,x,better,many,0.1,0,0.2\n",
                  "ragged": b"claim,cell,verdict\n\"unclosed,x\n"}


@pytest.mark.parametrize("case", BAD_CLAIMS_CSV)
def test_report_compare_refuses_a_bad_claims_csv_in_one_line(case, mlflow_store, tmp_path, capsys):
    (tmp_path / "out").mkdir()
    (tmp_path / "out" / "mlflow.db").write_bytes(mlflow_store.read_bytes())
    old = tmp_path / "old"
    old.mkdir()
    (old / "claims.csv").write_bytes(BAD_CLAIMS_CSV[case])
    refused("report", "mask_ratio", "--out", "out", "--compare", "old", cwd=tmp_path, capsys=capsys,
            words=("--compare old/claims.csv: not a claims.csv written by mae-study report",))


@pytest.mark.parametrize("damage", ["truncated", "garbage", "not_a_checkpoint"])
def test_train_resume_names_a_damaged_checkpoint(damage, tmp_path, capsys):
    import torch

    from studies.cli import resolve_config
    from studies.study import SMOKE, smoke_eval
    from studies.trial import trial_run_name

    config = resolve_config(None, [], smoke={**smoke_eval(), **SMOKE})
    path = tmp_path / "out" / "checkpoints" / f"{trial_run_name(config, prefix='smoke-')}.pt"
    path.parent.mkdir(parents=True)
    torch.save({"step": 3, "model": {}, "config": {}} if damage == "truncated" else [1, 2, 3], path)
    if damage == "truncated":
        path.write_bytes(path.read_bytes()[:40])
    elif damage == "garbage":
        path.write_bytes(os.urandom(300))
    refused("train", "--smoke", "--resume", "--out", "out", cwd=tmp_path, capsys=capsys,
            words=("--resume:", f"checkpoint {path} cannot be read"))


# ------------------------------------------- item 8: repeated seeds and values, trend order

REPEATS = [
    (["seeds=0,0"], "seeds=0,0: seed 0 is given twice"),
    (["seeds=0-3,2"], "seed 2 is given twice"),
    (["mask_ratio=0.5,0.50"], "mask_ratio=0.5,0.50: mask_ratio 0.5 is given twice"),
    (["decoder_depth=1,2,1"], "decoder_depth 1 is given twice"),
    (["--add-seeds", "5,5"], "--add-seeds 5,5: seed 5 is given twice"),
    (["--add-seeds", "5-9,7"], "seed 7 is given twice"),
]


@pytest.mark.parametrize("args,words", REPEATS, ids=[" ".join(a) for a, _ in REPEATS])
def test_repeated_seeds_or_axis_values_on_the_command_line_are_refused(args, words, tmp_path, capsys):
    refused("run", "mask_ratio", "--smoke", "--out", "out", *args, cwd=tmp_path, capsys=capsys, words=words)


R = STUDY.format(name="r")
REPEATS_IN_FILES = {
    "seeds": (R.replace("seeds: [0, 1]", "seeds: [1, 0, 1]"), "seeds: seed 1 is given twice"),
    "axis": (R.replace("[0.5, 0.75]", "[0.5, 0.5, 0.75]"), "axes.mask_ratio: mask_ratio 0.5 is given twice"),
    "smoke_axis": (R + "smoke_axes: {mask_ratio: [0.75, 0.75]}\n", "smoke_axes.mask_ratio"),
    "zip_row": (R.replace("axes: {mask_ratio: [0.5, 0.75]}", "zip: {encoder_width: [32, 32], encoder_heads: "
                          "[2, 2]}").replace("reference: {mask_ratio: 0.75}\n", ""), "zip: row 2"),
}


@pytest.mark.parametrize("case", REPEATS_IN_FILES)
def test_repeated_seeds_or_axis_values_in_a_study_file_are_refused(case, tmp_path, capsys):
    text, words = REPEATS_IN_FILES[case]
    path = study_file(tmp_path, "r.yaml", text)
    refused("run", str(path), "--smoke", "--out", "out", cwd=tmp_path, capsys=capsys, words=(str(path), words))


def test_a_trend_follows_numbers_ascending_and_other_values_as_declared(tmp_path):
    def steps(axis: str, values: list) -> list:
        claim = {"name": "t", "metric": "probe_linear_acc", "kind": "trend", "axis": axis}
        return [cell[axis] for cell in check_claims([claim], {axis: values})[0]["cells"]]

    assert steps("target", ["pixels", "hog", "clip"]) == ["pixels", "hog", "clip"]  # not alphabetical
    assert steps("mask_sampling", ["random", "block"]) == ["random", "block"]
    assert steps("steps", ["1000", "200", "30"]) == [30, 200, 1000]  # numbers, not text order
    assert steps("mask_ratio", [0.75, 0.25, 0.5]) == [0.25, 0.5, 0.75]
    assert trend_order("class_token", [True, False]) == [True, False]
    assert trend_order("lr", ["1e-3", "1e-4"]) == ["1e-4", "1e-3"]  # the values as declared, ordered by number
    path = study_file(tmp_path, "t.yaml", STUDY.format(name="t").replace(
        "axes: {mask_ratio: [0.5, 0.75]}", "axes: {mask_sampling: [random, block]}").replace(
        "reference: {mask_ratio: 0.75}", "reference: {mask_sampling: random}")
        + "claims:\n  - {name: t, metric: probe_linear_acc, kind: trend, axis: mask_sampling}\n")
    study = load_study_file(path)
    resolved = check_claims(list(study.claims), study.grid_axes(), study.grid_zipped(), study.reference_cell())
    assert [c["mask_sampling"] for c in resolved[0]["cells"]] == ["random", "block"]
