"""A study's reference row: named per built-in study, the documented default otherwise, and
recorded on the study's parent MLflow run so a report reads it from MLflow alone."""

from __future__ import annotations

import json

import pytest
from mlflow.tracking import MlflowClient

from analysis.trials_frame import load_study_info
from studies.named_studies import STUDIES
from studies.study import Study, default_reference, find_cell

EXPECTED = {
    "mask_ratio": {"mask_ratio": 0.75}, "decoder_depth": {"decoder_depth": 2},
    "decoder_width": {"decoder_width": 32}, "target": {"target": "raw"},
    "mask_sampling": {"mask_sampling": "random"}, "mask_token": {"mask_token_in_encoder": False},
    "corruption": {"corruption": "gaussian", "corruption_level": 0.3},
    "objectives": {"objective": "mae"}, "schedule": {"steps": 2000}, "lesson": {"mask_ratio": 0.75},
    "partial_finetune": {"eval.finetune_blocks": 0},  # the head alone on the frozen encoder
    "fashion_mask_ratio": {"mask_ratio": 0.75}, "fashion_decoder_depth": {"decoder_depth": 2},
    "fashion_decoder_width": {"decoder_width": 32}, "fashion_mask_token": {"mask_token_in_encoder": False},
    "fashion_target": {"target": "raw"}, "fashion_mask_sampling": {"mask_sampling": "random"},
    "fashion_objectives": {"objective": "mae"},
}


def test_every_built_in_study_names_its_reference():
    assert set(EXPECTED) == set(STUDIES)
    for name, study in STUDIES.items():
        assert study.reference == EXPECTED[name], name
        assert study.reference_cell() == EXPECTED[name], name
        for grid in (study, study.smoke()):  # the reference is a cell of the grid that runs
            assert find_cell(grid.reference_cell(), grid.grid_axes()) is not None, name


def test_the_default_is_the_config_default_cell_else_the_first():
    assert default_reference({"decoder_depth": [1, 2, 4], "seed": [0, 1]}) == {"decoder_depth": 2}
    assert default_reference({"mask_ratio": [0.5, 0.9]}) == {"mask_ratio": 0.5}  # no 0.75: the first
    # the declared default (None) is not the resolved one (gaussian for a DAE): the first cell
    assert default_reference({"corruption": ["masking", "gaussian"]}) == {"corruption": "masking"}
    assert default_reference({"mask_token_in_encoder": [True, False]}) == {"mask_token_in_encoder": False}
    assert default_reference({"eval.fewshot": [2, 8]}) == {"eval.fewshot": 8}
    assert default_reference({}) == {}


def test_a_grid_without_the_named_cell_falls_back_to_the_default():
    schedule = STUDIES["schedule"]
    assert schedule.smoke().reference_cell() == {"steps": 20}  # smoke runs 20 and 40 updates
    mask_ratio = STUDIES["mask_ratio"]
    assert mask_ratio.reference_cell(overrides={"mask_ratio": "0.5,0.75"}) == {"mask_ratio": 0.75}
    cell = mask_ratio.reference_cell(overrides={"mask_ratio": "0.5,0.9"})
    assert cell == {"mask_ratio": 0.5} and isinstance(cell["mask_ratio"], float)
    study = Study(name="x", paper="p", base={}, axes={"mask_ratio": [0.5, 0.9]})  # names none
    assert study.reference is None and study.reference_cell() == {"mask_ratio": 0.5}


def test_a_reference_outside_the_grid_is_refused():
    with pytest.raises(ValueError, match="not a cell"):
        Study(name="x", paper="p", base={}, axes={"mask_ratio": [0.5, 0.9]}, reference={"mask_ratio": 0.75})
    with pytest.raises(ValueError, match="not its axes"):
        Study(name="x", paper="p", base={}, axes={"mask_ratio": [0.5]}, reference={"steps": 10})


def _one_seed_parent(tmp_path, name: str):
    """A store in ``tmp_path`` and the plan of built-in study ``name`` at seed 0: (client,
    experiment id, uri, create), ``create(options)`` making the plan's parent run."""
    from studies import tracking
    from studies.runner import StudyPlan, _create_parent

    study = STUDIES[name]
    plan = StudyPlan(study=study, base={}, axes={**study.grid_axes(), "seed": [0]},
                     cells=study.cells(seeds=(0,)), reference=study.reference_cell())
    uri = f"sqlite:///{tmp_path}/mlflow.db"
    client = MlflowClient(uri)
    experiment = tracking.ensure_experiment(client, "mae-study", uri)
    return client, experiment, uri, lambda options: _create_parent(client, experiment, plan, options)


def test_the_parent_run_records_the_reference(tmp_path):
    from studies.runner import RunOptions

    client, experiment, uri, create = _one_seed_parent(tmp_path, "decoder_depth")
    state = create(RunOptions(out_dir=tmp_path / "out", tracking_uri=uri))
    tags = client.get_run(state["parent_run_id"]).data.tags
    assert json.loads(tags["reference"]) == {"decoder_depth": 2} and tags["smoke"] == "False"
    run = client.create_run(experiment, tags={"study": "decoder_depth",
                                              "mlflow.parentRunId": state["parent_run_id"]})
    client.set_terminated(run.info.run_id, "FINISHED")
    info = load_study_info(uri, "decoder_depth")
    assert info["reference"] == {"decoder_depth": 2} and info["smoke"] is False


def test_a_zipped_group_matches_only_whole_rows():
    zipped = ({"encoder_width": [32, 64], "encoder_heads": [4, 2]},)
    axes = {"decoder_depth": [1, 2]}
    # width 64 and heads 4 are both defaults but never in one row: no cell at the defaults
    assert default_reference(axes, zipped) == {"decoder_depth": 1, "encoder_width": 32, "encoder_heads": 4}
    assert find_cell({"decoder_depth": 2, "encoder_width": "64", "encoder_heads": 2}, axes, zipped) == \
        {"decoder_depth": 2, "encoder_width": 64, "encoder_heads": 2}
    assert find_cell({"decoder_depth": 2, "encoder_width": 64, "encoder_heads": 4}, axes, zipped) is None
    with pytest.raises(ValueError, match="not a cell"):
        Study(name="x", paper="p", base={}, axes=axes, zipped=zipped,
              reference={"decoder_depth": 2, "encoder_width": 64, "encoder_heads": 4})


def test_the_report_finds_the_default_reference_of_a_zipped_grid():
    import pandas as pd

    from analysis.findings import study_reference

    info = {"grid": {"decoder_depth": [1, 2], "seed": [0]},
            "zip": [{"encoder_width": [32, 64], "encoder_heads": [2, 4]}]}
    frame = pd.DataFrame({"decoder_depth": [1, 2], "encoder_width": [32, 64], "encoder_heads": [2, 4]})
    reference, named = study_reference(info, frame, ["decoder_depth", "encoder_width", "encoder_heads"])
    assert not named and reference == {"decoder_depth": 2, "encoder_width": 64, "encoder_heads": 4}


def test_the_parent_run_records_the_command_and_the_machine_for_the_report(tmp_path):
    from studies.runner import RunOptions

    client, _, uri, create = _one_seed_parent(tmp_path, "mask_token")
    command = "mae-study run mask_token seeds=0"
    state = create(RunOptions(out_dir=tmp_path / "out", tracking_uri=uri, command=command))
    tags = client.get_run(state["parent_run_id"]).data.tags
    assert tags["command"] == command and tags["paper"] == "MAE Table 1c"
    assert "CPU cores" in tags["machine"] and "torch" in tags["machine"]
    state = create(RunOptions(out_dir=tmp_path / "out2", tracking_uri=uri))
    assert "command" not in client.get_run(state["parent_run_id"]).data.tags  # none made up
