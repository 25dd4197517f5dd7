"""Study files: the one format of built-in and user studies, validated before anything runs."""

from __future__ import annotations

from pathlib import Path

import pytest

from mae_core import Config
from studies.cli import main
from studies.named_studies import STUDIES, get_study
from studies.runner import plan_study
from studies.study_files import BUILTIN_FOLDER, StudyFileError, load_study_file, write_template

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
    assert study.name == "depth_x_ratio" and study.grid_size() == 12 and study.smoke().grid_size() == 8
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
    assert study.name == "mine" and study.smoke().grid_size() >= 2
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
    cells = study.smoke().cells()
    assert [Config(**c).eval.linear_head for c in cells] == ["logreg", "bn_linear"]
    assert all(Config(**c).eval.features == "cls" for c in cells)
    plan = plan_study(get_study("mask_ratio"), smoke=True, overrides={"eval.finetune_blocks": "0,all"})
    assert plan.axes["eval.finetune_blocks"] == ["0", "all"]
    assert {Config(**c).eval.finetune_blocks for c in plan.cells} == {0, "all"}


ZIPPED = """\
name: width_x_depth
base: {dataset: digits}
axes: {decoder_depth: [1, 2]}
zip: {encoder_width: [32, 64], encoder_heads: [2, 4]}
seeds: [0, 1]
smoke_zip: {encoder_width: [32], encoder_heads: [2]}
reference: {decoder_depth: 2, encoder_width: 64, encoder_heads: 4}
"""


def _zipped_study(tmp_path, text=ZIPPED):
    path = tmp_path / "zipped.yaml"
    path.write_text(text)
    return load_study_file(path)


def test_zipped_keys_vary_together_times_the_axes(tmp_path):
    study = _zipped_study(tmp_path)
    cells = [(c["decoder_depth"], c["encoder_width"], c["encoder_heads"], c["seed"]) for c in study.cells()]
    assert cells == [(1, 32, 2, 0), (1, 32, 2, 1), (1, 64, 4, 0), (1, 64, 4, 1),
                     (2, 32, 2, 0), (2, 32, 2, 1), (2, 64, 4, 0), (2, 64, 4, 1)]
    assert study.smoke().grid_size() == 2 * 1 * 2  # smoke_zip keeps one row
    assert study.reference_cell() == {"decoder_depth": 2, "encoder_width": 64, "encoder_heads": 4}
    # the named reference is not in the smoke grid, nor a cell at the defaults: the first cell
    assert study.smoke().reference_cell() == {"decoder_depth": 1, "encoder_width": 32, "encoder_heads": 2}


def test_several_zip_groups_and_a_default_reference_that_matches_a_whole_row(tmp_path):
    study = _zipped_study(tmp_path, ZIPPED.replace(
        "zip: {encoder_width: [32, 64], encoder_heads: [2, 4]}",
        "zip: [{encoder_width: [32, 64], encoder_heads: [2, 4]}, {decoder_width: [16, 32], decoder_heads: [2, 4]}]",
    ).replace("reference: {decoder_depth: 2, encoder_width: 64, encoder_heads: 4}\n", ""))
    assert study.grid_size() == 2 * 2 * 2 * 2
    # every key at its Config default (decoder_depth 2, width 64/heads 4, decoder 32/4)
    assert study.reference_cell() == {"decoder_depth": 2, "encoder_width": 64, "encoder_heads": 4,
                                      "decoder_width": 32, "decoder_heads": 4}


def test_zipped_cells_reach_ray_as_rows_and_come_back_as_keys(tmp_path):
    from studies.runner import tune_space
    from studies.study import cell_id, trial_keys

    plan = plan_study(_zipped_study(tmp_path), smoke=False, overrides={"encoder_width": "16,32"})
    assert plan.zipped == ({"encoder_width": ["16", "32"], "encoder_heads": [2, 4]},)
    assert "encoder_width" not in plan.axes and "encoder_width" not in plan.base
    space, search, samples = tune_space(plan)
    assert search is None and samples == 1
    rows = space["zip:encoder_width+encoder_heads"]["grid_search"]
    assert rows == [{"encoder_width": "16", "encoder_heads": 2}, {"encoder_width": "32", "encoder_heads": 4}]
    # every Ray trial's keys are one of the plan's cells (so run identity and --resume agree)
    ids = {cell_id({**plan.base, **trial_keys({"decoder_depth": d, "seed": s, "zip:encoder_width+encoder_heads": row})})
           for d in plan.axes["decoder_depth"] for s in plan.axes["seed"] for row in rows}
    assert ids == {cell_id(cell) for cell in plan.cells}


def test_a_zipped_key_override_must_fit_its_group(tmp_path, monkeypatch, capsys):
    (tmp_path / "zipped.yaml").write_text(ZIPPED)
    monkeypatch.chdir(tmp_path)
    with pytest.raises(SystemExit) as exit_:
        main(["run", "zipped.yaml", "--smoke", "encoder_heads=2,4,8"])
    lines = [line for line in capsys.readouterr().err.splitlines() if line.strip()]
    assert exit_.value.code == 2 and len(lines) == 1
    assert "encoder_heads is zipped with encoder_width" in lines[0]
    assert not (tmp_path / "mlflow.db").exists() and not (tmp_path / "mae_runs").exists()


ZIP_MALFORMED = {
    "unequal": ("zip: {encoder_width: [32, 64], encoder_heads: [2]}",
                "zip.encoder_heads: 1 values, but encoder_width has 2"),
    "unequal_in_a_list": ("zip: [{encoder_width: [32, 64], encoder_heads: [2, 4]}, {decoder_width: [16], decoder_heads: [2, 4]}]",
                          "zip[1].decoder_heads: 2 values, but decoder_width has 1"),
    "two_groups": ("zip: [{encoder_width: [32, 64], encoder_heads: [2, 4]}, {encoder_width: [8], decoder_depth: [1]}]",
                   "zip[1].encoder_width: in two zipped groups"),
    "also_an_axis": ("zip: {decoder_depth: [1, 2], encoder_heads: [2, 4]}", "zip.decoder_depth: also an axis"),
    "not_a_mapping": ("zip: 3", "zip: a mapping of keys to their values"),
    "empty_value": ("zip: {encoder_width: [], encoder_heads: []}", "zip.encoder_width: a zipped key needs at least one value"),
    "bad_row": ("zip: {encoder_width: [32, 64], encoder_heads: [2, 3]}", "divisible"),
}


@pytest.mark.parametrize("case", ZIP_MALFORMED)
def test_a_malformed_zip_is_one_line_naming_the_file_and_key(case, tmp_path, monkeypatch, capsys):
    line, words = ZIP_MALFORMED[case]
    text = ZIPPED.replace("zip: {encoder_width: [32, 64], encoder_heads: [2, 4]}", line)
    text = text.replace("smoke_zip: {encoder_width: [32], encoder_heads: [2]}\n", "")
    text = text.replace("reference: {decoder_depth: 2, encoder_width: 64, encoder_heads: 4}\n", "")
    path = tmp_path / f"{case}.yaml"
    path.write_text(text)
    monkeypatch.chdir(tmp_path)
    with pytest.raises(SystemExit) as exit_:
        main(["run", str(path), "--smoke"])
    lines = [line for line in capsys.readouterr().err.splitlines() if line.strip()]
    assert exit_.value.code == 2 and len(lines) == 1, lines
    assert str(path) in lines[0] and words in lines[0], lines[0]
    assert not (tmp_path / "mlflow.db").exists() and not (tmp_path / "mae_runs").exists()


def test_a_study_file_search_block_is_checked_and_read(tmp_path):
    from studies.search import make_search

    text = ("base: {dataset: digits}\naxes: {decoder_depth: [1, 2]}\nseeds: [0]\n"
            "search: {space: {lr: 'loguniform:1e-4:1e-2', decoder_width: [16, 32]}, samples: 3, algorithm: optuna}\n")
    study = _zipped_study(tmp_path, text)
    spec = make_search(algorithm=None, samples=None, metric=None, ranges={}, file_search=study.search)
    assert spec.algorithm == "optuna" and spec.samples == 3
    assert spec.space["decoder_width"].values == (16, 32)  # a YAML list is a choice
    for bad, words in [("lr: 'loguniform:1e-4:1e-2'}, colour: 1}", "unknown key 'search.colour'"),
                       ("decoder_depth: 'choice:1,2'}}", "search.space.decoder_depth: also an axis"),
                       ("mask_ratio: 'uniform:0.5:1.0'}}", "search: mask_ratio=uniform:0.5:1.0")]:
        path = tmp_path / "bad.yaml"
        path.write_text(text.split("search:")[0] + "search: {space: {" + bad + "\n")
        with pytest.raises(StudyFileError, match=words):
            load_study_file(path)


def test_the_templates_optional_zip_and_search_blocks_are_valid_when_uncommented(tmp_path):
    template = write_template("mine", tmp_path).read_text()
    lines = template.splitlines()
    start = next(i for i, line in enumerate(lines) if line.startswith("# zip:"))
    opened = []
    for i, line in enumerate(lines):
        optional = line.startswith(("# zip:", "#   encoder", "# search:", "#   space:", "#     lr:", "#   algorithm:",
                                    "#   samples:", "#   metric:"))
        opened.append(line[2:] if optional else line)
    text = "\n".join(opened).replace("  mask_ratio: 0.75\n", "  mask_ratio: 0.75\n  encoder_width: 64\n  encoder_heads: 4\n")
    path = tmp_path / "opened.yaml"
    path.write_text(text)
    study = load_study_file(path)
    assert start and study.zipped == ({"encoder_width": [32, 64], "encoder_heads": [2, 4]},)
    assert study.search["space"] == {"lr": "loguniform:1e-4:1e-2"} and study.search["samples"] == 8
