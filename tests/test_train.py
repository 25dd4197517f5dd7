"""The training procedure: sample (I_t, V_t), ℓ_MAE, gradient, update U_t; schedule; checkpoints."""

import importlib
import math

import pytest
import torch

from conftest import tiny_config
from device_checks import DEVICE
from mae_core import (
    NonFiniteError,
    NormDomainError,
    apply_target,
    build_model,
    corrupt,
    masked_mse,
    patchify,
    prepare_data,
    sample_visible,
    train,
)
from mae_core.checkpoint import load_latest_checkpoint
from mae_core.optimizer import learning_rate

updates = importlib.import_module("mae_core.updates")
train_module = importlib.import_module("mae_core.train")  # the module: mae_core.train is the function


# ------------------------------------------------------------------------------ schedule


def test_learning_rate_warms_up_linearly_then_follows_a_cosine():
    lr = [learning_rate(t, peak=1.0, warmup_steps=10, total_steps=110, schedule="cosine") for t in range(110)]
    assert lr[0] == pytest.approx(0.1) and lr[4] == pytest.approx(0.5) and lr[9] == pytest.approx(1.0)
    assert lr[10] == pytest.approx(1.0)  # cosine starts at the peak
    assert lr[60] == pytest.approx(0.5)  # half way through the cosine
    assert 0 < lr[109] < 1e-3  # ends near 0 ...
    assert all(a >= b for a, b in zip(lr[10:], lr[11:]))  # ... decreasing after warm-up
    assert all(v > 0 for v in lr)  # η_t > 0 at every step, as the spec's SGD needs


def test_learning_rate_constant_and_no_warmup():
    assert learning_rate(0, peak=0.3, warmup_steps=0, total_steps=5, schedule="cosine") == pytest.approx(0.3)
    for t in (0, 2, 4):
        assert learning_rate(t, peak=0.3, warmup_steps=0, total_steps=5, schedule="constant") == 0.3
    assert learning_rate(1, peak=0.3, warmup_steps=2, total_steps=5, schedule="constant") == 0.3


# ------------------------------------------------------------------------------ procedure


@pytest.mark.parametrize("objective", ["mae", "dae"])
def test_first_step_is_the_spec_update_with_plain_sgd(objective):
    # J=1 with plain SGD: θ_1 = θ_0 - η_0 ∇L_0, where L_0 is the loss on the replayed draws:
    # (I_0, V_0) and ℓ_MAE for the MAE; I_0, a corruption of the input and the clean target for the DAE.
    config = tiny_config(objective=objective, optimizer="sgd", lr=0.1, steps=1, batch_size=4)
    data = prepare_data(config)
    torch.manual_seed(config.seed)
    model = build_model(config)
    sampler = torch.Generator().manual_seed(config.seed + 1)  # train()'s stream for I_t, V_t, X̃
    index = torch.randint(data.train_patches.shape[0], (4,), generator=sampler)
    x = data.train_patches[index]
    if objective == "mae":
        visible = sample_visible(4, config.num_patches, config.num_visible, sampler, "random", config.grid)
        loss = masked_mse(model(x, visible), x, visible).mean()
    else:
        noisy = corrupt(x, "gaussian", config.corruption_level, sampler)
        loss = ((model(noisy) - x) ** 2).mean()  # the target is the clean x
    loss.backward()
    result = train(config, data)
    assert result.history == [(1, pytest.approx(loss.item(), rel=1e-6))]
    trained = dict(result.model.named_parameters())
    for name, parameter in model.named_parameters():
        assert torch.allclose(trained[name], parameter - 0.1 * parameter.grad, atol=1e-6), name


@pytest.mark.parametrize("overrides", [
    dict(batch_size=1),  # the spec's literal loop: one (I_t, V_t) per update
    dict(objective="ae"),
    dict(objective="dae"),
    dict(objective="dae", corruption="masking", corruption_level=0.3),
    dict(mask_sampling="block"),
    dict(mask_sampling="grid"),
    dict(target="norm_eps"),
    dict(mask_token_in_encoder=True, class_token=True),
    dict(dataset="shapes", test_limit=4),
])
def test_training_runs_and_the_loss_is_finite(overrides):
    config = tiny_config(steps=4, **overrides)
    torch.manual_seed(config.seed)  # train() initialises the same way
    before = build_model(config).state_dict()
    result = train(config, prepare_data(config))
    assert result.steps == 4 and [s for s, _ in result.history] == [1, 2, 3, 4]
    assert all(math.isfinite(v) and v >= 0 for _, v in result.history)
    after = result.model.state_dict()
    assert any(not torch.equal(before[k], after[k]) for k in after)  # it did update


@pytest.mark.parametrize("dataset, target", [("digits", "raw"), ("photos", "norm"), ("shapes", "norm_eps")])
def test_a_batch_converted_from_bytes_is_the_gathered_float_set(dataset, target):
    """What the loop computes per batch (bytes -> floats -> patches -> T) equals what it
    computed before on the whole float set, then gathered: bitwise, so no loss changes."""
    from mae_core.images import DeviceImages
    from mae_core.updates import batch_target

    config = tiny_config(dataset=dataset, target=target, train_limit=None, patch_size=None)
    data = prepare_data(config)
    whole = data.train_patches  # float32 [N,M,q], made once from the stored images
    index = torch.randint(len(whole), (64,), generator=torch.Generator().manual_seed(0))
    batch = patchify(DeviceImages(data.pretraining, torch.device("cpu"))(index), config.resolved_patch_size)
    assert torch.equal(batch, whole[index])
    assert torch.equal(batch_target(batch, target), apply_target(whole, target)[index])


def test_norm_target_outside_d_norm_is_refused():
    config = tiny_config(dataset="shapes", target="norm_eps")
    data = prepare_data(config)  # accepted for norm_eps ...
    with pytest.raises(NormDomainError):  # ... but the strict T_norm is undefined on it
        train(tiny_config(dataset="shapes", target="norm"), data)


def test_huge_sgd_step_raises_non_finite_error_naming_the_step():
    config = tiny_config(optimizer="sgd", lr=1e6, steps=50, schedule="constant", warmup_fraction=0.0)
    with pytest.raises(NonFiniteError) as err:
        train(config, prepare_data(config))
    step = err.value.step
    assert isinstance(step, int) and 1 <= step < 50  # step 0 starts from a finite θ_0
    assert f"t={step}" in str(err.value)


def test_divergence_watch_names_the_first_bad_step_when_checked_later():
    from mae_core.updates import DivergenceWatch

    model = torch.nn.Linear(2, 1)
    watch = DivergenceWatch(torch.device("cpu"))
    for step, value in enumerate([1.0, 2.0, float("nan"), float("inf"), 3.0]):
        model.weight.grad = torch.full_like(model.weight, value if step != 3 else 1.0)
        watch.observe(step, torch.tensor(1.0 if step != 3 else value), model)
        if step == 1:
            watch.check(lambda t: 0.1)  # all finite so far: no error
    with pytest.raises(NonFiniteError) as err:
        watch.check(lambda t: 0.5 * t)
    assert (err.value.step, err.value.what) == (2, "gradient")  # not 3, where the loss went bad
    assert "lr=1" in str(err.value)


# ------------------------------------------------------------------------------ checkpoints


class _Stop(Exception):
    pass


def _stop_at(step):
    def on_checkpoint(done, path):
        if done == step:
            raise _Stop
    return on_checkpoint


@pytest.mark.parametrize("overrides", [
    dict(),  # adamw, mae
    dict(optimizer="sgd", lr=0.05),
    dict(objective="dae"),  # the corruption draws come from the same sampler
    dict(precision="bf16"),
    dict(precision="fp16"),  # the gradient scaler's state travels in the checkpoint
    dict(augment="crop_flip"),  # the crops and flips draw from the checkpointed sampler
    dict(augment="crop_flip", objective="dae", target="norm_eps"),
])
def test_resume_is_bitwise_identical_to_an_uninterrupted_run(tmp_path, overrides):
    config = tiny_config(steps=20, checkpoint_every=10, log_every=3, **overrides)
    data = prepare_data(config)
    uninterrupted = train(config, data)

    path = tmp_path / "ckpt.pt"
    with pytest.raises(_Stop):
        train(config, data, checkpoint_path=path, on_checkpoint=_stop_at(10))
    resumed = train(tiny_config(steps=20, checkpoint_every=10, log_every=3, **overrides), data,
                    checkpoint_path=path)

    assert resumed.resumed_from == 10 and resumed.warnings == []
    assert torch.load(path, weights_only=True)["step"] == 20
    a, c = uninterrupted.model.state_dict(), resumed.model.state_dict()
    assert a.keys() == c.keys()
    for key in a:
        assert torch.equal(a[key], c[key]), key
    assert resumed.history == uninterrupted.history


def _own_noise_generator(config, device, sampler):
    """What a GPU run does (:func:`mae_core.updates.noise_generator`), on the CPU: the DAE's noise
    from a generator of its own rather than the sampler."""
    return torch.Generator(device).manual_seed(config.seed + 2)


def test_a_dae_noise_generator_of_its_own_is_checkpointed_and_resumes_bitwise(tmp_path, monkeypatch):
    """Issue 26: off the CPU the corruption is drawn from a generator on the device; its state
    travels in the checkpoint, so the resumed run is the uninterrupted one bitwise. A checkpoint
    without it (written before issue 26, or on the CPU) still resumes, saying it is not bitwise."""
    monkeypatch.setattr(train_module, "noise_generator", _own_noise_generator)
    config = tiny_config(objective="dae", steps=20, checkpoint_every=10, log_every=3)
    data = prepare_data(config)
    uninterrupted = train(config, data)
    path = tmp_path / "ckpt.pt"
    with pytest.raises(_Stop):
        train(config, data, checkpoint_path=path, on_checkpoint=_stop_at(10))
    halfway = torch.load(path, weights_only=True)
    assert "noise" in halfway  # the generator of its own is checkpointed
    resumed = train(config, data, checkpoint_path=path)
    assert resumed.resumed_from == 10 and resumed.warnings == []
    assert resumed.history == uninterrupted.history
    for key, value in uninterrupted.model.state_dict().items():
        assert torch.equal(resumed.model.state_dict()[key], value), key

    del halfway["noise"]  # a checkpoint from before the noise generator
    torch.save(halfway, path)
    old = train(config, data, checkpoint_path=path)
    assert old.resumed_from == 10 and len(old.warnings) == 1
    assert "noise generator" in old.warnings[0] and "not bitwise" in old.warnings[0]
    assert old.history[:3] == uninterrupted.history[:3]  # the records before step 10 are the checkpoint's


def test_the_dae_noise_is_drawn_on_the_trials_device_from_its_own_generator():
    sampler = torch.Generator().manual_seed(1)
    assert updates.noise_generator(tiny_config(objective="dae"), torch.device("cpu"), sampler) is sampler
    assert updates.noise_generator(tiny_config(objective="mae"), DEVICE, sampler) is sampler
    if DEVICE.type != "cpu":
        noise = updates.noise_generator(tiny_config(objective="dae"), DEVICE, sampler)
        assert noise is not sampler and noise.device.type == DEVICE.type


def test_checkpoint_loads_with_weights_only(tmp_path):
    config = tiny_config(steps=4, checkpoint_every=2)
    path = tmp_path / "ckpt.pt"
    result = train(config, prepare_data(config), checkpoint_path=path, checkpoint_extra={"run_id": "abc"})
    state = torch.load(path, weights_only=True)
    assert state["step"] == 4 and state["extra"] == {"run_id": "abc"}
    assert state["config"]["num_visible"] == config.num_visible
    for key, value in result.model.state_dict().items():
        assert torch.equal(state["model"][key], value)
    assert torch.load(path.with_name("ckpt.pt.prev"), weights_only=True)["step"] == 2


def test_truncated_checkpoint_falls_back_to_prev(tmp_path):
    config = tiny_config(steps=4, checkpoint_every=2)
    path = tmp_path / "ckpt.pt"
    train(config, prepare_data(config), checkpoint_path=path)
    blob = path.read_bytes()
    path.write_bytes(blob[: len(blob) // 2])  # a crash mid-write of a non-atomic copy
    state, warnings = load_latest_checkpoint(path)
    assert state is not None and state["step"] == 2
    assert len(warnings) == 1 and "ckpt.pt" in warnings[0]
    # train() resumes from the good .prev, says so, and finishes the run
    result = train(config, prepare_data(config), checkpoint_path=path)
    assert result.resumed_from == 2 and result.warnings == warnings


def test_no_checkpoint_at_all(tmp_path):
    assert load_latest_checkpoint(tmp_path / "missing.pt") == (None, [])
