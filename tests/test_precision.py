"""Mixed precision on the CPU: bf16 autocast reproduces the dtype faults a GPU would hit.

Every model variant must train in bf16 (finite loss, finite gradient for every parameter,
every parameter updated); ``auto`` must be fp32 on the CPU, bitwise. ``MAE_TEST_DEVICE=cuda``
runs the same checks on a GPU (benchmarks/gpu_check.sh).
"""

import os

import pytest
import torch

from conftest import tiny_config
from mae_core import build_model, masked_mse, prepare_data, reconstruction_mse, sample_visible, train
from mae_core.precision import autocast, grad_scaler, resolve_precision

VARIANTS = {
    "mae": {},
    "mae_mask_token_in_encoder": dict(mask_token_in_encoder=True),
    "mae_class_token": dict(class_token=True),
    "mae_learned_positions": dict(pos_embed="learned"),
    "mae_block_masks": dict(mask_sampling="block"),
    "ae": dict(objective="ae"),
    "dae": dict(objective="dae"),
    "ae_class_token": dict(objective="ae", class_token=True),
}
CPU = torch.device("cpu")
DEVICE = torch.device(os.environ.get("MAE_TEST_DEVICE", "cpu"))


@pytest.mark.parametrize("variant", VARIANTS)
def test_one_bf16_step_gives_a_finite_fp32_loss_and_a_gradient_for_every_parameter(variant):
    config = tiny_config(precision="bf16", device=DEVICE.type, **VARIANTS[variant])
    torch.manual_seed(0)
    model = build_model(config).to(DEVICE)
    patches = prepare_data(config).train_patches[:8].to(DEVICE)
    with autocast(config.precision, DEVICE):
        if config.objective == "mae":
            visible = sample_visible(8, config.num_patches, config.num_visible).to(DEVICE)
            pred = model(patches, visible)
        else:
            pred = model(patches)
    assert pred.dtype == torch.bfloat16  # autocast really ran the forward pass in bf16
    loss = (masked_mse(pred.float(), patches, visible) if config.objective == "mae"
            else reconstruction_mse(pred.float(), patches)).mean()
    assert loss.dtype == torch.float32 and torch.isfinite(loss)
    loss.backward()
    for name, parameter in model.named_parameters():
        assert parameter.grad is not None, f"{name} got no gradient"
        assert torch.isfinite(parameter.grad).all(), f"{name} has a non-finite gradient"
        assert parameter.grad.dtype == torch.float32  # parameters and their gradients stay fp32


@pytest.mark.parametrize("variant", VARIANTS)
def test_every_variant_trains_in_bf16_and_updates_every_parameter(variant):
    config = tiny_config(precision="bf16", steps=3, device=DEVICE.type, **VARIANTS[variant])
    torch.manual_seed(config.seed)  # train() starts from this same initialisation
    initial = {name: p.detach().clone() for name, p in build_model(config).named_parameters()}
    result = train(config, prepare_data(config))
    assert all(torch.isfinite(torch.tensor(loss)) for _, loss in result.history)
    for name, parameter in result.model.named_parameters():
        assert parameter.dtype == torch.float32
        assert not torch.equal(parameter.detach().cpu(), initial[name]), f"{name} was not updated"


def test_fp16_trains_with_a_gradient_scaler():
    config = tiny_config(precision="fp16", steps=4, device=DEVICE.type)
    assert grad_scaler(config.precision, DEVICE).is_enabled()
    assert not grad_scaler("bf16", CPU).is_enabled()
    result = train(config, prepare_data(config))
    assert all(torch.isfinite(torch.tensor(loss)) for _, loss in result.history)


def test_auto_is_fp32_on_the_cpu_and_bf16_on_cuda():
    assert resolve_precision("auto", CPU) == "fp32"
    assert resolve_precision("auto", torch.device("cuda")) == "bf16"
    assert resolve_precision("fp16", CPU) == "fp16"
    data = prepare_data(tiny_config())
    auto = train(tiny_config(precision="auto"), data)
    fp32 = train(tiny_config(precision="fp32"), data)
    assert auto.history == fp32.history  # bitwise: no autocast at all
