"""Study files: the one format of built-in and user studies, validated before anything runs."""

from __future__ import annotations

from pathlib import Path

import pytest

from mae_core import Config
from studies.cli import main
from studies.registry import STUDIES, get_study
from studies.runner import plan_study
from studies.study_files import BUILTIN_FOLDER, load_study_file, write_template

GOOD = """\
name: depth_x_ratio
paper: MAE Table 1a x Figure 5
base: {dataset: digits, steps: 200}
axes: {decoder_depth: [1, 2], mask_ratio: [0.5, 0.75]}
seeds: [0, 1, 2]
smoke_axes: {decoder_depth: [1, 2], mask_ratio: [0.5, 0.75]}
eval: {fewshot: 4}
reference: {decoder_depth: 2, mask_ratio: 0.75}
"""

# (file content, words the one line must contain besides the file's name)
MALFORMED = {
    "unknown_key": (GOOD + "colour: blue\n", "unknown key 'colour'"),
    "empty_axis": (GOOD.replace("axes: {decoder_depth: [1, 2], ", "axes: {decoder_depth: [], "),
                   "axes.decoder_depth: an axis needs at least one value"),
    "out_of_range": (GOOD.replace("mask_ratio: [0.5, 0.75]}\nseeds", "mask_ratio: [0.5, 1.5]}\nseeds"), "mask_ratio"),
    "bad_yaml": ("axes: {decoder_depth: [1, 2\n", "not valid YAML"),
    "unknown_config_key": (GOOD.replace("steps: 200", "stepz: 200"), "unknown key 'stepz'"),
    "bad_eval_key": (GOOD.replace("fewshot: 4", "fewshot: 0"), "eval.fewshot"),
    "reference_off_grid": (GOOD.replace("reference: {decoder_depth: 2,", "reference: {decoder_depth: 8,"),
                           "is not a cell"),
    "not_a_mapping": ("- 1\n- 2\n", "expected a mapping"),
    "no_axes": ("name: x\nbase: {dataset: digits}\n", "axes: required"),
}


def test_every_builtin_study_is_a_file_of_the_one_format():
    files = sorted(BUILTIN_FOLDER.glob("*.yaml"))
    assert {path.stem for path in files} == set(STUDIES)
    for path in files:
        assert load_study_file(path).name == path.stem


def test_a_user_file_loads_with_every_key(tmp_path):
    path = tmp_path / "grid.yaml"
    path.write_text(GOOD)
    study = get_study(str(path))
    assert study.name == "depth_x_ratio" and study.grid_size() == 12 and study.grid_size(smoke=True) == 8
    assert study.evaluation == {"fewshot": 4}
    plan = plan_study(study, smoke=True, overrides={})
    assert set(plan.axes) == {"decoder_depth", "mask_ratio", "seed"}
    assert all(cell["eval.fewshot"] == 4 for cell in plan.cells)


@pytest.mark.parametrize("case", MALFORMED)
def test_a_malformed_study_file_is_one_line_exit_2_and_no_run(case, tmp_path, monkeypatch, capsys):
    content, words = MALFORMED[case]
    path = tmp_path / f"{case}.yaml"
    path.write_text(content)
    monkeypatch.chdir(tmp_path)
    with pytest.raises(SystemExit) as exit_:
        main(["run", str(path), "--smoke"])
    err = capsys.readouterr().err
    lines = [line for line in err.splitlines() if line.strip()]
    assert exit_.value.code == 2 and len(lines) == 1, err
    assert str(path) in lines[0] and words in lines[0], lines[0]
    assert not (tmp_path / "mlflow.db").exists() and not (tmp_path / "mae_runs").exists()


def test_any_config_key_becomes_an_axis_from_the_command_line():
    plan = plan_study(get_study("mask_ratio"), smoke=True, overrides={"decoder_depth": "1,4"})
    assert plan.axes["decoder_depth"] == ["1", "4"]
    assert len(plan.cells) == 2 * 2 * 2  # two ratios × two depths × two seeds
    assert {int(cell["decoder_depth"]) for cell in plan.cells} == {1, 4}


def test_new_study_writes_a_template_that_runs_and_never_overwrites(tmp_path, monkeypatch, capsys):
    monkeypatch.chdir(tmp_path)
    assert main(["new-study", "mine"]) == 0
    study = load_study_file(tmp_path / "mine.yaml")
    assert study.name == "mine" and study.grid_size(smoke=True) >= 2
    assert "#" in (tmp_path / "mine.yaml").read_text()  # explained, not bare
    with pytest.raises(SystemExit) as exit_:
        main(["new-study", "mine"])
    assert exit_.value.code == 2 and "exists" in capsys.readouterr().err


def test_list_shows_local_study_files(tmp_path, monkeypatch, capsys):
    write_template("local_grid", Path(tmp_path))
    monkeypatch.chdir(tmp_path)
    assert main(["list"]) == 0
    out = capsys.readouterr().out
    assert "local_grid.yaml" in out and "mask_ratio" in out


def test_partial_finetune_study_mirrors_mae_figure_9():
    """An eval.* key is an axis like any config key: the built-in Figure 9 study varies the
    fine-tuned depth, every cell validated, its smoke grid built with the paper's recipe."""
    study = get_study("partial_finetune")
    assert study.paper == "MAE Figure 9"
    assert study.axes == {"eval.finetune_blocks": [0, 1, 2, "all"]}
    assert study.reference_cell() == {"eval.finetune_blocks": 0}
    plan = plan_study(study, smoke=True, overrides={})
    assert set(plan.axes) == {"eval.finetune_blocks", "seed"} and len(plan.cells) == 2 * 2
    configs = [Config(**cell) for cell in plan.cells]
    assert {c.eval.finetune_blocks for c in configs} == {0, "all"}
    for config in configs:
        assert config.eval.finetune_steps == 20  # shortened in smoke mode
        assert (config.eval.finetune_layer_decay, config.eval.finetune_schedule) == (0.75, "cosine")
        assert config.eval.finetune_head == "bn_linear"  # 0 blocks = MAE's linear-probe head
        assert config.resolved()["eval.finetune_blocks"] in (0, "all")  # logged as a param


def test_eval_keys_become_axes_from_a_file_and_the_command_line(tmp_path):
    path = tmp_path / "heads.yaml"
    path.write_text("axes: {eval.linear_head: [logreg, bn_linear]}\nbase: {class_token: true}\n"
                    "eval: {features: cls}\nseeds: [0]\n")
    study = load_study_file(path)
    cells = study.cells(smoke=True)
    assert [Config(**c).eval.linear_head for c in cells] == ["logreg", "bn_linear"]
    assert all(Config(**c).eval.features == "cls" for c in cells)
    plan = plan_study(get_study("mask_ratio"), smoke=True, overrides={"eval.finetune_blocks": "0,all"})
    assert plan.axes["eval.finetune_blocks"] == ["0", "all"]
    assert {Config(**c).eval.finetune_blocks for c in plan.cells} == {0, "all"}
