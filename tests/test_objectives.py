"""ℓ_MAE and the empirical risks R_MAE^emp, R_rec^emp, checked against explicit loops."""

import itertools
import math

import pytest
import torch
from torch import nn

from conftest import tiny_config
from mae_core import (
    NormDomainError,
    apply_target,
    build_model,
    empirical_mae_risk,
    empirical_rec_risk,
    masked_mse,
    mean_pixel_baseline_risk,
    prepare_data,
)


def _loop_masked_mse(pred, target, visible_set, m, q) -> float:
    """((M-k)q)⁻¹ Σ_{j∉V} ||pred_j - target_j||², one image, by hand."""
    total = 0.0
    for j in range(m):
        if j in visible_set:
            continue
        for r in range(q):
            total += (float(pred[j, r]) - float(target[j, r])) ** 2
    return total / ((m - len(visible_set)) * q)


def test_masked_mse_is_the_formula():
    gen = torch.Generator().manual_seed(0)
    b, m, q = 3, 5, 3
    pred = torch.randn(b, m, q, generator=gen, dtype=torch.float64)
    target = torch.randn(b, m, q, generator=gen, dtype=torch.float64)
    visible = torch.tensor([[0, 3], [1, 2], [2, 4]])
    loss = masked_mse(pred, target, visible)
    assert loss.shape == (b,)
    for i in range(b):
        expected = _loop_masked_mse(pred[i], target[i], set(visible[i].tolist()), m, q)
        assert float(loss[i]) == pytest.approx(expected, rel=1e-12)


def test_masked_mse_ignores_visible_positions_exactly():
    gen = torch.Generator().manual_seed(1)
    pred = torch.randn(2, 6, 4, generator=gen)
    target = torch.randn(2, 6, 4, generator=gen)
    visible = torch.tensor([[1, 4], [0, 5]])
    is_visible = torch.zeros(2, 6, dtype=torch.bool).scatter(1, visible, True)
    other = pred.clone()
    other[is_visible] = torch.randn(4, 4, generator=gen) * 1e3
    assert torch.equal(masked_mse(pred, target, visible), masked_mse(other, target, visible))
    other[is_visible] = float("inf")  # a non-finite visible prediction cannot leak in
    assert torch.equal(masked_mse(pred, target, visible), masked_mse(other, target, visible))

    pred.requires_grad_(True)
    masked_mse(pred, target, visible).sum().backward()
    assert bool((pred.grad[is_visible] == 0).all())
    assert bool((pred.grad[~is_visible] != 0).all())
    other.requires_grad_(True)
    masked_mse(other, target, visible).sum().backward()
    assert torch.equal(other.grad, pred.grad)  # inf at visible slots: still exactly 0 there


class _ConstantModel(nn.Module):
    """Predicts one value for every pixel, whatever it sees."""

    def __init__(self, value: float):
        super().__init__()
        self.value = nn.Parameter(torch.tensor(float(value)))

    def forward(self, patches, visible=None):
        return self.value.expand(patches.shape).clone()


def _mae(patch_size: int, mask_ratio: float, n: int = 5, **overrides):
    config = tiny_config(patch_size=patch_size, mask_ratio=mask_ratio, test_limit=n, **overrides)
    torch.manual_seed(0)
    return build_model(config).eval(), config, prepare_data(config).test_patches


def _brute_force_mae_risk(model, patches, k, target="raw") -> float:
    n, m, q = patches.shape
    targets = apply_target(patches, target)
    total, count = 0.0, 0
    with torch.no_grad():
        for i in range(n):
            for visible_set in itertools.combinations(range(m), k):
                pred = model(patches[i:i + 1], torch.tensor([visible_set]))[0]
                total += _loop_masked_mse(pred, targets[i], set(visible_set), m, q)
                count += 1
    assert count == n * math.comb(m, k)
    return total / count


@pytest.mark.parametrize("patch_size, mask_ratio, target, n", [
    (4, 0.5, "raw", 5),  # M=4, k=2: 6 masks
    (4, 0.75, "norm_eps", 5),  # M=4, k=1: 4 masks
    (2, 0.875, "raw", 3),  # M=16, k=2: 120 masks
])
def test_exact_mae_risk_is_the_double_loop(patch_size, mask_ratio, target, n):
    model, config, patches = _mae(patch_size, mask_ratio, n=n)
    k = config.num_visible
    risk = empirical_mae_risk(model, patches, k, target=target, masks="exact",
                              pairs_per_batch=7)  # small chunks: the slicing must not matter
    assert risk.exact is True and risk.stderr == 0
    assert risk.num_masks == math.comb(config.num_patches, k)
    assert risk.value == pytest.approx(_brute_force_mae_risk(model, patches, k, target), rel=1e-5)


def test_monte_carlo_mae_risk_agrees_with_exact():
    model, config, patches = _mae(2, 0.875, n=8)  # M=16, k=2
    exact = empirical_mae_risk(model, patches, 2, masks="exact")
    mc = empirical_mae_risk(model, patches, 2, masks=64, generator=torch.Generator().manual_seed(0))
    assert mc.exact is False and mc.num_masks == 64 and mc.stderr > 0
    assert abs(mc.value - exact.value) < 4 * mc.stderr
    again = empirical_mae_risk(model, patches, 2, masks=64, generator=torch.Generator().manual_seed(0))
    assert again == mc  # reproducible by seed
    # "exact" over budget falls back to mc_masks Monte Carlo masks
    over = empirical_mae_risk(model, patches, 2, masks="exact", exact_budget=100, mc_masks=16,
                              generator=torch.Generator().manual_seed(1))
    assert over.exact is False and over.num_masks == 16


def test_monte_carlo_needs_two_masks():
    model, config, patches = _mae(4, 0.5)
    with pytest.raises(ValueError):
        empirical_mae_risk(model, patches, 2, masks=1)


def test_mae_risk_with_norm_target_refuses_constant_patches():
    model, config, patches = _mae(4, 0.5)
    patches = patches.clone()
    patches[0, 0] = 0.0
    with pytest.raises(NormDomainError):
        empirical_mae_risk(model, patches, 2, target="norm")


def test_risk_evaluation_leaves_training_mode_alone():
    model, config, patches = _mae(4, 0.5)
    model.train()
    empirical_mae_risk(model, patches, 2)
    empirical_rec_risk(model, patches)
    assert model.training


@pytest.mark.parametrize("overrides", [dict(objective="mae"), dict(objective="ae"),
                                       dict(objective="mae", mask_token_in_encoder=True)])
def test_rec_risk_is_the_mean_over_all_positions(overrides):
    config = tiny_config(test_limit=4, **overrides)
    torch.manual_seed(0)
    model = build_model(config).eval()
    patches = prepare_data(config).test_patches
    n, m, q = patches.shape
    total = 0.0
    with torch.no_grad():
        for i in range(n):
            x = patches[i:i + 1]
            pred = model(x, torch.arange(m)[None]) if config.objective == "mae" else model(x)
            total += sum((float(pred[0, j, r]) - float(x[0, j, r])) ** 2 for j in range(m) for r in range(q))
    assert empirical_rec_risk(model, patches) == pytest.approx(total / (n * m * q), rel=1e-5)


@pytest.mark.parametrize("target", ["raw", "norm_eps"])
def test_mean_pixel_baseline_is_the_masked_risk_of_a_constant_predictor(target):
    config = tiny_config(patch_size=4, mask_ratio=0.5, train_limit=20, test_limit=5)  # M=4, k=2
    data = prepare_data(config)
    baseline = mean_pixel_baseline_risk(data.train_patches, data.test_patches, target)
    fill = float(apply_target(data.train_patches, target).double().mean())
    constant = _ConstantModel(fill)
    brute = _brute_force_mae_risk(constant, data.test_patches, 2, target)
    assert baseline == pytest.approx(brute, rel=1e-6)
    via_risk = empirical_mae_risk(constant, data.test_patches, 2, target=target)
    assert via_risk.value == pytest.approx(baseline, rel=1e-6)
    # ... for every k, not only this one
    for k in (1, 3):
        assert _brute_force_mae_risk(constant, data.test_patches, k, target) == pytest.approx(baseline, rel=1e-6)
