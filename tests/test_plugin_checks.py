"""A plugin's part is held to its contract (mae_core.plugin_checks): a target, corruption or mask
sampler that returns the wrong thing, or calls sys.exit, is one line naming it and its rule, and
the trial is recorded FAILED with that reason; a dataset format's arrays and any file's labels
are refused in one line with exit status 2 before anything is recorded (issue #32, items 5, 7, 8)."""

from __future__ import annotations

import sys
import textwrap
from pathlib import Path

import numpy as np
import pytest
import torch
from mlflow.tracking import MlflowClient

from conftest import tiny_config
from mae_core import plugins, registry
from mae_core.corruptions import corrupt
from mae_core.labels import MAX_CLASSES, LabelError
from mae_core.masking import sample_visible
from mae_core.plugin_checks import PluginResultError
from mae_core.targets import apply_target
from mae_core.data import prepare_data
from mae_core.updates import batch_target
from studies.cli import main

# digits, patch 2: M=16 patches of q=4 values; a one-block model, a few updates
TINY = ["dataset=digits", "train_limit=32", "test_limit=16", "batch_size=8", "encoder_width=16",
        "encoder_depth=1", "encoder_heads=2", "decoder_width=8", "decoder_depth=1", "decoder_heads=2",
        "latent_dim=4", "steps=3", "log_every=1", "device=cpu"]


pytestmark = pytest.mark.usefixtures("fresh_plugins")  # conftest: only the built-ins, no plugin loaded


def plugin(tmp_path: Path, body: str, name: str = "parts.py") -> Path:
    path = tmp_path / name
    path.write_text("import sys\nimport torch\nfrom mae_core.registry import *\n\n" + textwrap.dedent(body))
    return path


def cli(*argv: str) -> int:
    try:
        return main(list(argv))
    except SystemExit as exit_:
        return exit_.code


def error_lines(err: str) -> list[str]:
    """The error lines of a command's stderr (the CLI prefixes each with ``mae-study: error:``)."""
    assert "Traceback" not in err, err
    return [line for line in err.splitlines() if line.startswith("mae-study: error:")]


def the_run(out: Path):
    client = MlflowClient(f"sqlite:///{out / 'mlflow.db'}")
    (run,) = client.search_runs([client.get_experiment_by_name("mae-study").experiment_id])
    return run


# ------------------------------------------------------------------------- at run time

WIDE_TARGET = """
@target("wide", out_dim=3)
def wide(patches):
    return patches  # q=4 values per patch, not the 3 it declared
"""
SHORT_CORRUPTION = """
@corruption("short")
def short(patches, level, generator):
    return patches[..., :2].clone()  # drops half of each patch
"""
REPEATING_SAMPLER = """
@mask_sampler("repeats")
def repeats(batch_size, num_patches, num_visible, grid, generator):
    visible = torch.rand(batch_size, num_patches, generator=generator).argsort(dim=1)[:, :num_visible]
    visible[-1, 1] = visible[-1, 0]  # the last image sees one patch twice
    return visible
"""
EXITING_TARGET = """
@target("quits")
def quits(patches):
    sys.exit(0)
"""


@pytest.mark.parametrize("body, keys, rule", [
    (WIDE_TARGET, ["target=wide"], "target=wide must return a floating tensor [B,M,out_dim] = [8,16,3] on cpu, "
                                   "got float32 [8,16,4] on cpu"),
    (SHORT_CORRUPTION, ["objective=dae", "corruption=short"],
     "corruption=short must return a tensor of its input's shape and dtype, float32 [8,16,4] on cpu, "
     "got float32 [8,16,2] on cpu"),
    (REPEATING_SAMPLER, ["mask_sampling=repeats"], "mask_sampling=repeats must return integer positions [B,k] = "
                                                   "[8,4], k distinct in [0,16) per row; row 7 holds position"),
    (EXITING_TARGET, ["target=quits"], "target=quits called sys.exit(0); a plugin's part must return its result"),
], ids=["target_shape", "corruption_shape", "duplicate_positions", "sys_exit_at_call"])
def test_a_part_breaking_its_rule_fails_the_run_with_the_reason(tmp_path, monkeypatch, capsys, body, keys, rule):
    monkeypatch.chdir(tmp_path)
    out = tmp_path / "out"
    status = cli("train", "--out", str(out), "--plugin", str(plugin(tmp_path, body)), *TINY, *keys)
    err = capsys.readouterr().err
    (line,) = error_lines(err)
    assert status == 1 and rule in line, err  # a run that fails while training: status 1
    run = the_run(out)
    assert run.info.status == "FAILED" and rule in run.data.tags["failure_reason"]
    assert "interrupted" not in run.data.tags
    assert line == f"mae-study: error: {run.data.tags['failure_reason']}"


def test_a_target_is_checked_wherever_it_is_applied(tmp_path):
    plugins.load_plugins([str(plugin(tmp_path, WIDE_TARGET + """
@target("ints")
def ints(patches):
    return (patches * 255).long()

@target("listed")
def listed(patches):
    return patches.tolist()
"""))])
    patches = torch.rand(5, 16, 4)
    for apply in (batch_target, apply_target):
        with pytest.raises(PluginResultError, match=r"target=wide .* \[5,16,3\] on cpu, got float32 \[5,16,4\]"):
            apply(patches, "wide")
        with pytest.raises(PluginResultError, match=r"target=ints must return a floating tensor .* got int64"):
            apply(patches, "ints")
        with pytest.raises(PluginResultError, match=r"target=listed .* got a list, not a tensor"):
            apply(patches, "listed")


def test_a_corruption_keeps_shape_and_dtype_of_any_input(tmp_path):
    plugins.load_plugins([str(plugin(tmp_path, """
@corruption("halves")
def halves(patches, level, generator):
    return patches.half()

@corruption("fine")
def fine(patches, level, generator):
    return patches + level
"""))])
    x = torch.rand(3, 2, 16, 4)  # [N,K,M,q]: the finite law's copies
    assert torch.equal(corrupt(x, "fine", 1.0), x + 1.0)
    with pytest.raises(PluginResultError, match=r"corruption=halves .* float32 \[3,2,16,4\] on cpu, got float16"):
        corrupt(x, "halves", 0.5)


@pytest.mark.parametrize("returned, got", [
    ("torch.zeros(batch_size, num_visible, dtype=torch.long)", "row 0 holds position 0 twice"),
    ("torch.arange(num_visible).repeat(batch_size, 1) + num_patches - 3", "got position 16"),
    ("torch.arange(num_visible).float().repeat(batch_size, 1)", "got float32 [4,4] on cpu"),
    ("torch.arange(num_visible + 1).repeat(batch_size, 1)", "got int64 [4,5] on cpu"),
    ("torch.arange(num_visible).repeat(batch_size, 1).tolist()", "got a list, not a tensor"),
], ids=["duplicates", "out_of_range", "float", "wrong_k", "list"])
def test_a_mask_sampler_returns_k_distinct_positions_per_row(tmp_path, returned, got):
    plugins.load_plugins([str(plugin(tmp_path, f"""
@mask_sampler("broken")
def broken(batch_size, num_patches, num_visible, grid, generator):
    return {returned}
"""))])
    with pytest.raises(PluginResultError) as caught:
        sample_visible(4, 16, 4, torch.Generator().manual_seed(0), "broken")
    message = str(caught.value)
    assert message.startswith("mask_sampling=broken must return integer positions [B,k] = [4,4], "
                              "k distinct in [0,16) per row; ") and got in message and "\n" not in message


def test_an_int32_sampler_is_accepted_and_sorted(tmp_path):
    plugins.load_plugins([str(plugin(tmp_path, """
@mask_sampler("backwards")
def backwards(batch_size, num_patches, num_visible, grid, generator):
    return torch.arange(num_visible, 0, -1, dtype=torch.int32).repeat(batch_size, 1)
"""))])
    visible = sample_visible(2, 16, 4, None, "backwards")
    assert visible.dtype == torch.long and visible.tolist() == [[1, 2, 3, 4]] * 2


def test_the_built_in_parts_are_called_unchecked(monkeypatch):
    """Their hot path is as before: no check runs for a built-in target, corruption or sampler."""
    from mae_core import plugin_checks

    def no_check(*args, **kwargs):
        raise AssertionError("a built-in part was checked")

    monkeypatch.setattr(plugin_checks, "call_part", no_check)
    patches = torch.rand(2, 16, 4)
    batch_target(patches, "norm_eps"), corrupt(patches, "gaussian", 0.1)
    for scheme in ("random", "block", "grid"):
        sample_visible(2, 16, 4, torch.Generator().manual_seed(0), scheme)


# --------------------------------------------------------------------------- at import


def test_sys_exit_at_import_is_one_line_and_exit_2(tmp_path, capsys):
    path = plugin(tmp_path, "sys.exit(0)\n")
    status = cli("train", "--out", str(tmp_path / "out"), "--plugin", str(path), *TINY)
    (line,) = error_lines(capsys.readouterr().err)
    assert status == 2 and line == (f"mae-study: error: plugin {path} called sys.exit(0) while importing; "
                                    "a plugin registers its parts and must not exit")
    assert not (tmp_path / "out").exists()


def test_sys_exit_in_a_module_plugin_is_an_error(tmp_path, monkeypatch):
    (tmp_path / "exiting_parts.py").write_text("import sys\nsys.exit('no')\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    with pytest.raises(plugins.PluginError, match=r"plugin exiting_parts called sys.exit\('no'\) while importing"):
        plugins.load_plugins(["exiting_parts"])


def test_a_plugin_directory_says_it_is_one(tmp_path, capsys):
    folder = tmp_path / "my_parts"
    folder.mkdir()
    status = cli("train", "--out", str(tmp_path / "out"), "--plugin", f"{folder}{'/'}", *TINY)
    (line,) = error_lines(capsys.readouterr().err)
    assert status == 2 and line == (f"mae-study: error: plugin {folder} is a directory; give a module name "
                                    "(importable where mae-study runs) or a path to a .py file")


def test_a_plugin_module_that_is_a_bare_folder_is_refused(tmp_path, monkeypatch):
    (tmp_path / "bare_parts").mkdir()
    monkeypatch.syspath_prepend(str(tmp_path))
    with pytest.raises(plugins.PluginError, match=r"plugin bare_parts: a directory without __init__.py"):
        plugins.load_plugins(["bare_parts"])


# ----------------------------------------------------------------------- dataset formats

FORMAT = """
import numpy as np

@dataset_format("arrays")
def arrays(path):
    rng = np.random.default_rng(0)
    images = rng.integers(0, 256, (12, 8, 8, 1), dtype=np.uint8)
    labels = np.arange(12) % 2
    return {returned}
"""


@pytest.mark.parametrize("returned, rule", [
    ("images.astype(np.float32), labels, images, labels",
     "train images must be uint8 [N,H,W,C] with N >= 1 and C in (1, 3), got float32 (12, 8, 8, 1)"),
    ("images, labels[:10], images, labels", "train labels must be 12 integers, got int64 (10,)"),
    ("images, labels, images, labels.astype(float)", "test labels must be 12 integers, got float64 (12,)"),
    ("images, labels, images, np.where(labels == 1, 2**31 - 1, 0)",
     f"labels must be class numbers in [0, {MAX_CLASSES}) (at most 10,000 classes), got 2147483647"),
    ("images, labels - 1, images, labels", f"labels must be class numbers in [0, {MAX_CLASSES})"),
    ("sys.exit(3)", "dataset=arrays called sys.exit(3)"),
    ("np.load(path)['missing']", "the format's reader failed: "),
], ids=["float_images", "count_mismatch", "float_labels", "huge_label", "negative_label", "sys_exit", "raises"])
def test_a_dataset_format_is_one_line_and_exit_2_before_anything_is_recorded(tmp_path, capsys, returned, rule):
    path = plugin(tmp_path, FORMAT.format(returned=returned))
    data = tmp_path / "data.npz"
    np.savez(data, x=np.zeros(1))
    out = tmp_path / "out"
    status = cli("train", "--out", str(out), "--plugin", str(path), *TINY, f"dataset=arrays:{data}")
    (line,) = error_lines(capsys.readouterr().err)
    assert status == 2 and "dataset=arrays" in line and rule in line, line
    assert not out.exists(), "refused before --out or an MLflow store is made"


# ---------------------------------------------------------------------------------- labels


def test_a_huge_label_in_an_npz_is_refused_before_any_allocation(tmp_path, capsys):
    rng = np.random.default_rng(0)
    labels = np.arange(12) % 2
    labels[5] = 2**31 - 1
    np.savez(tmp_path / "d.npz", images=rng.integers(0, 256, (12, 8, 8), dtype=np.uint8), labels=labels)
    out = tmp_path / "out"
    status = cli("train", "--out", str(out), *TINY, f"dataset=npz:{tmp_path / 'd.npz'}")
    (line,) = error_lines(capsys.readouterr().err)
    assert status == 2 and line == (f"mae-study: error: npz {tmp_path / 'd.npz'}: labels must be class numbers "
                                    f"in [0, 10000) (at most 10,000 classes), got 2147483647")
    assert not out.exists()


def test_the_label_cap_also_holds_with_class_names(tmp_path):
    from mae_core.data import load_dataset

    names = np.array([f"c{i}" for i in range(MAX_CLASSES + 1)])
    labels = np.arange(12) % 2
    labels[0] = MAX_CLASSES
    np.savez(tmp_path / "d.npz", images=np.zeros((12, 8, 8), np.uint8), labels=labels, class_names=names)
    with pytest.raises(LabelError, match=r"labels must be class numbers in \[0, 10000\)"):
        load_dataset(f"npz:{tmp_path / 'd.npz'}")


def one_class_npz(tmp_path: Path) -> str:
    rng = np.random.default_rng(0)
    np.savez(tmp_path / "one.npz", images=rng.integers(0, 256, (20, 8, 8), dtype=np.uint8),
             labels=np.full(20, 3))
    return f"npz:{tmp_path / 'one.npz'}"


def test_one_class_data_is_refused_for_training_with_probes(tmp_path, capsys):
    spec = one_class_npz(tmp_path)
    out = tmp_path / "out"
    status = cli("train", "--out", str(out), *TINY, f"dataset={spec}")  # train_limit=32 keeps all 16
    (line,) = error_lines(capsys.readouterr().err)
    assert status == 2 and line == (f"mae-study: error: the training split of dataset={spec} holds one class "
                                    "(label 3); the probes (eval.evaluators lists probes) need two classes or "
                                    "more: give data with two labels or more, or set eval.evaluators=risks")
    assert not out.exists()


def test_one_class_data_trains_without_probes_and_a_limit_is_named(tmp_path):
    spec = one_class_npz(tmp_path)
    data = prepare_data(tiny_config(dataset=spec, train_limit=None, **{"eval.evaluators": "risks"}))
    assert set(data.train_labels.tolist()) == {3}
    # a limit that keeps a single class of two-class data says so
    rng = np.random.default_rng(0)
    np.savez(tmp_path / "sorted.npz", images=rng.integers(0, 256, (40, 8, 8), dtype=np.uint8),
             labels=np.repeat([0, 1], 20), test_images=rng.integers(0, 256, (8, 8, 8), dtype=np.uint8),
             test_labels=np.arange(8) % 2)
    with pytest.raises(LabelError, match=r"the training split \(its first 10 images, train_limit\) of .* "
                                         r"holds one class \(label 0\)"):
        prepare_data(tiny_config(dataset=f"npz:{tmp_path / 'sorted.npz'}", train_limit=10))


def test_sys_exit_in_an_encoder_factory_or_evaluator_names_it(tmp_path):
    from evaluation import evaluate_trial
    from mae_core.models import build_model

    plugins.load_plugins([str(plugin(tmp_path, """
from mae_core.encoders import encoder

@encoder("leaves")
def leaves(config, num_patches, patch_dim):
    sys.exit(1)

@evaluator("leaves_too")
def leaves_too(model, config, data, *, baselines):
    sys.exit(0)
"""))])
    with pytest.raises(PluginResultError, match=r"^encoder=leaves called sys.exit\(1\)"):
        build_model(tiny_config(encoder="leaves"))
    config = tiny_config(**{"eval.evaluators": "leaves_too"})
    with pytest.raises(PluginResultError, match=r"^eval.evaluators=leaves_too called sys.exit\(0\)"):
        evaluate_trial(build_model(config), config, prepare_data(config))
