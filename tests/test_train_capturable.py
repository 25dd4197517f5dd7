"""The capturable update (issue 26): the eager loop's numbers with nothing read from the host.

On the CPU ``capturable=true`` runs uncaptured and must give the eager loop's losses, parameters
and checkpoints; ``cuda_graph`` captures only the variants that allow it and says once why not.
``MAE_TEST_DEVICE=cuda`` also captures a real CUDA graph and compares it with eager.
"""

import importlib
import os
import warnings

import pytest
import torch

from conftest import tiny_config
from mae_core import ConfigError, NonFiniteError, prepare_data, train
from mae_core.config import config_keys
from mae_core.optimizer import build_optimizer, make_capturable
from mae_core.updates import CudaGraphWarning, update_plan

updates_module = importlib.import_module("mae_core.updates")
DEVICE = torch.device(os.environ.get("MAE_TEST_DEVICE", "cpu"))
CPU, CUDA = torch.device("cpu"), torch.device("cuda")  # a torch.device needs no GPU to exist


@pytest.fixture
def short_draws(monkeypatch):
    """Draw ahead 7 updates at a time, so a run crosses several refills and its checkpoints fall
    inside a batch of draws."""
    monkeypatch.setattr(updates_module, "DRAW_AHEAD", 7)


def _same_parameters(a, b):
    sa, sb = a.model.state_dict(), b.model.state_dict()
    assert sa.keys() == sb.keys()
    for key in sa:
        assert torch.equal(sa[key], sb[key]), key


# ------------------------------------------------------------------------------ the CPU


@pytest.mark.parametrize("overrides", [dict(), dict(objective="ae")])
def test_capturable_losses_equal_the_eager_loop_over_50_updates(short_draws, overrides):
    config = tiny_config(steps=50, batch_size=32, log_every=1, **overrides)
    data = prepare_data(config)
    eager = train(config, data)
    capturable = train(config.with_updates(capturable=True), data)
    assert (eager.update_mode, capturable.update_mode) == ("eager", "capturable")
    assert [s for s, _ in capturable.history] == list(range(1, 51))
    for (_, a), (_, b) in zip(eager.history, capturable.history, strict=True):
        assert abs(a - b) <= 1e-6
    _same_parameters(eager, capturable)  # bitwise on the CPU (float64 step size, the same draws)


def test_capturable_resume_is_bitwise_and_its_checkpoint_is_the_eager_one(tmp_path, short_draws):
    keys = dict(steps=20, checkpoint_every=10, log_every=3, batch_size=32, capturable=True)
    config = tiny_config(**keys)
    data = prepare_data(config)
    uninterrupted = train(config, data)

    class Stop(Exception):
        pass

    def stop_at_10(done, path):
        if done == 10:
            raise Stop

    path = tmp_path / "ckpt.pt"
    with pytest.raises(Stop):
        train(config, data, checkpoint_path=path, on_checkpoint=stop_at_10)
    halfway = torch.load(path, weights_only=True)
    resumed = train(tiny_config(**keys), data, checkpoint_path=path)
    assert resumed.resumed_from == 10 and resumed.update_mode == "capturable"
    _same_parameters(uninterrupted, resumed)
    assert resumed.history == uninterrupted.history

    # the step-10 checkpoint holds what the eager loop's does: model, optimiser state, sampler
    eager_path = tmp_path / "eager.pt"
    with pytest.raises(Stop):
        train(tiny_config(**{**keys, "capturable": False}), data, checkpoint_path=eager_path, on_checkpoint=stop_at_10)
    eager = torch.load(eager_path, weights_only=True)
    assert torch.equal(halfway["sampler"], eager["sampler"])
    assert (halfway["running_sum"], halfway["since_log"], halfway["history"]) == (
        eager["running_sum"], eager["since_log"], eager["history"])
    for key, value in eager["model"].items():
        assert torch.equal(halfway["model"][key], value), key
    for param_id, state in eager["optimizer"]["state"].items():
        for name, value in state.items():
            assert torch.equal(halfway["optimizer"]["state"][param_id][name], value), (param_id, name)
    step_sizes = [[g["lr"] for g in state["optimizer"]["param_groups"]] for state in (halfway, eager)]
    assert step_sizes[0] == step_sizes[1] and all(isinstance(lr, float) for lr in step_sizes[0])


def test_a_loaded_optimizer_state_is_made_capturable_again():
    config = tiny_config()
    model = torch.nn.Linear(3, 2)
    eager = build_optimizer(model, config)
    model(torch.ones(1, 3)).sum().backward()
    eager.step()
    optimizer = build_optimizer(model, config, capturable=True)
    lr = torch.tensor(0.5, dtype=torch.float64)
    make_capturable(optimizer, lr)
    optimizer.load_state_dict(eager.state_dict())  # restores the saved groups: lr a number, capturable off
    assert optimizer.param_groups[0]["capturable"] is False
    make_capturable(optimizer, lr)
    for group in optimizer.param_groups:
        assert group["lr"] is lr and group["capturable"] is True
        for parameter in group["params"]:
            step = optimizer.state[parameter]["step"]
            assert step.dtype == torch.float32 and step.device == parameter.device


def test_capturable_divergence_names_the_step():
    config = tiny_config(optimizer="sgd", lr=1e6, steps=50, schedule="constant", warmup_fraction=0.0,
                         capturable=True)
    with pytest.raises(NonFiniteError) as err:
        train(config, prepare_data(config))
    eager = tiny_config(optimizer="sgd", lr=1e6, steps=50, schedule="constant", warmup_fraction=0.0)
    with pytest.raises(NonFiniteError) as eager_err:
        train(eager, prepare_data(eager))
    assert err.value.step == eager_err.value.step and f"t={err.value.step}" in str(err.value)


# ------------------------------------------------------------------------- which update


def _graph_notes(record):
    return [str(w.message) for w in record if issubclass(w.category, CudaGraphWarning)]


@pytest.mark.parametrize("overrides, reason, mode", [
    (dict(objective="dae"), "objective=dae", "eager"),
    (dict(mask_sampling="block"), "mask_sampling=block", "eager"),
    (dict(mask_sampling="block", capturable=True), "mask_sampling=block", "capturable"),
])
def test_cuda_graph_true_on_a_variant_that_cannot_be_captured_stays_eager_and_says_why_once(
        overrides, reason, mode):
    config = tiny_config(steps=4, cuda_graph="true", **overrides)
    with warnings.catch_warnings(record=True) as record:
        warnings.simplefilter("always")
        result = train(config, prepare_data(config))
    notes = _graph_notes(record)
    assert len(notes) == 1 and reason in notes[0] and "cuda_graph=true" in notes[0]
    assert result.update_mode == mode and len(result.history) == 4


def test_cuda_graph_auto_on_the_cpu_says_nothing():
    config = tiny_config(steps=2)
    assert config.cuda_graph == "auto" and config.capturable is False
    with warnings.catch_warnings(record=True) as record:
        warnings.simplefilter("always")
        result = train(config, prepare_data(config))
    assert _graph_notes(record) == [] and result.update_mode == "eager"


@pytest.mark.parametrize("overrides, device, capturable, graph, note", [
    (dict(), CUDA, True, True, None),  # auto captures the default run on CUDA
    (dict(precision="fp32", mask_sampling="grid", objective="ae"), CUDA, True, True, None),
    (dict(cuda_graph="false"), CUDA, False, False, None),
    (dict(cuda_graph="false", capturable=True), CUDA, True, False, None),
    (dict(), CPU, False, False, None),  # auto on the CPU: the eager loop, nothing said
    (dict(capturable=True), CPU, True, False, None),
    (dict(cuda_graph="true"), CPU, False, False, "no CUDA device"),
    (dict(objective="dae"), CUDA, False, False, "objective=dae"),
    (dict(mask_sampling="block"), CUDA, False, False, "mask_sampling=block"),
    (dict(precision="fp16"), CUDA, False, False, "precision=fp16"),
    (dict(optimizer="sgd"), CUDA, False, False, "optimizer=sgd"),
    (dict(augment="crop_flip"), CUDA, False, False, "augment=crop_flip"),
])
def test_update_plan(overrides, device, capturable, graph, note):
    plan = update_plan(tiny_config(**overrides), device)
    assert (plan.capturable, plan.graph) == (capturable, graph)
    assert (plan.note is None) if note is None else (note in plan.note)


def test_images_read_from_disk_are_not_captured():
    plan = update_plan(tiny_config(), CUDA, images_in_memory=False)
    assert not plan.graph and "from disk" in plan.note


# -------------------------------------------------------------------------------- config


@pytest.mark.parametrize("keys, named", [
    (dict(cuda_graph="maybe"), "cuda_graph"),
    (dict(capturable="perhaps"), "capturable"),
    (dict(capturable=True, objective="dae"), "capturable"),
    (dict(capturable=True, augment="crop_flip"), "capturable"),
])
def test_bad_values_name_the_key(keys, named):
    with pytest.raises(ConfigError, match=named):
        tiny_config(**keys)


def test_a_checkpoint_resumes_on_another_device_class():
    """compile_enabled follows the machine (compile=auto, 2,000 updates: on for CUDA, off for the
    CPU): it is no reason to refuse a checkpoint; the new keys are compared like any other."""
    from mae_core.checkpoint import changed_keys

    config = tiny_config(steps=2_000)
    saved = {**config.resolved(), "compile_enabled": True}
    assert changed_keys(config, saved) == []
    assert changed_keys(config.with_updates(capturable=True), config.resolved()) == ["capturable"]


def test_the_keys_parse_and_are_listed():
    assert tiny_config(cuda_graph="TRUE").cuda_graph is True
    assert tiny_config(cuda_graph="false", capturable="true").capturable is True
    catalogue = {key.name: key for key in config_keys()}
    assert (catalogue["capturable"].default, catalogue["capturable"].allowed) == (False, "true | false")
    assert (catalogue["cuda_graph"].default, catalogue["cuda_graph"].allowed) == ("auto", "auto | true | false")
    assert "CUDA graph" in catalogue["cuda_graph"].description


# ------------------------------------------------------------------------------- CUDA


@pytest.mark.skipif(DEVICE.type != "cuda" or not torch.cuda.is_available(),
                    reason="a CUDA graph needs MAE_TEST_DEVICE=cuda and a GPU")
@pytest.mark.parametrize("overrides, rel", [
    (dict(precision="fp32"), 1e-4),
    (dict(precision="bf16"), 2e-2),
    (dict(precision="bf16", objective="ae"), 2e-2),
    (dict(precision="bf16", compile="true"), 2e-2),  # torch.compile's kernels inside the graph
])
def test_a_captured_update_gives_the_eager_losses_on_cuda(overrides, rel):
    # The tolerances are a first guess, not calibrated on a GPU: eager steps with a float64 step
    # size and the captured update with a float32 one, and CUDA's scatter/index backward adds
    # in a nondeterministic order.
    config = tiny_config(steps=30, batch_size=32, log_every=1, device="cuda", **overrides)
    data = prepare_data(config)
    eager = train(config.with_updates(cuda_graph="false"), data)
    with warnings.catch_warnings(record=True) as record:
        warnings.simplefilter("always")
        captured = train(config.with_updates(cuda_graph="true"), data)
    assert _graph_notes(record) == []
    assert (eager.update_mode, captured.update_mode) == ("eager", "cuda_graph")
    assert [s for s, _ in captured.history] == [s for s, _ in eager.history]
    for (_, a), (_, b) in zip(eager.history, captured.history, strict=True):
        assert b == pytest.approx(a, rel=rel)
