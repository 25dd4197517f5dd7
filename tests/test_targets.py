"""Targets T: raw (identity), norm (the spec's strict T_norm on D_norm), norm_eps (He et al.)."""

import pytest
import torch

from conftest import tiny_config
from mae_core import NormDomainError, apply_target, prepare_data
from mae_core.targets import NORM_EPS


def _patches(seed: int = 0, dtype=torch.float64) -> torch.Tensor:
    return torch.rand(3, 16, 4, generator=torch.Generator().manual_seed(seed), dtype=dtype)


def test_raw_is_identity():
    x = _patches()
    assert torch.equal(apply_target(x, "raw"), x)


def test_norm_has_mean_zero_and_population_std_one():
    x = _patches()
    t = apply_target(x, "norm")
    assert t.shape == x.shape
    assert torch.allclose(t.mean(dim=-1), torch.zeros(3, 16, dtype=torch.float64), atol=1e-12)
    assert torch.allclose(t.std(dim=-1, unbiased=False), torch.ones(3, 16, dtype=torch.float64), atol=1e-12)


def test_norm_is_the_spec_formula_on_one_patch():
    u = torch.tensor([[[1.0, 2.0, 4.0, 9.0]]], dtype=torch.float64)
    mean = 4.0
    s = ((1 - mean) ** 2 + (2 - mean) ** 2 + (4 - mean) ** 2 + (9 - mean) ** 2) / 4
    expected = torch.tensor([[[(v - mean) / s ** 0.5 for v in (1.0, 2.0, 4.0, 9.0)]]], dtype=torch.float64)
    assert torch.allclose(apply_target(u, "norm"), expected, atol=1e-14)


@pytest.mark.parametrize("value", [0.0, 1.0, 0.1, 1 / 3])  # 0.1, 1/3: float variance may be tiny, not 0
@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
def test_norm_refuses_a_constant_patch_naming_image_and_patch(value, dtype):
    x = _patches(dtype=dtype)
    x[2, 5] = value  # 4 equal values
    with pytest.raises(NormDomainError) as err:
        apply_target(x, "norm")
    assert isinstance(err.value, ValueError)
    assert "image 2" in str(err.value) and "patch 5" in str(err.value)


def test_norm_refuses_sixteen_copies_of_a_tenth():
    x = torch.rand(2, 4, 16)
    x[1, 3] = 0.1  # a shapes-sized patch (q=16) of copies of 0.1 in float32
    with pytest.raises(NormDomainError, match="image 1.*patch 3"):
        apply_target(x, "norm")


def test_norm_eps_is_he_et_al_formula_and_finite_on_constant_patches():
    x = _patches()
    x[0, 0] = 0.5
    t = apply_target(x, "norm_eps")
    q = x.shape[-1]
    mean = x.mean(dim=-1, keepdim=True)
    var = ((x - mean) ** 2).sum(dim=-1, keepdim=True) / (q - 1)  # unbiased, torch's default
    assert NORM_EPS == 1e-6
    assert torch.allclose(t, (x - mean) / torch.sqrt(var + 1e-6), atol=1e-12)
    assert bool(torch.isfinite(t).all())
    assert torch.equal(t[0, 0], torch.zeros(4, dtype=torch.float64))


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
def test_norm_eps_equals_he_et_al_reference_code(dtype):
    """models_mae.py, forward_loss (norm_pix_loss=True), on the same patches."""
    target = _patches(seed=5, dtype=dtype)
    mean = target.mean(dim=-1, keepdim=True)
    var = target.var(dim=-1, keepdim=True)
    expected = (target - mean) / (var + 1.e-6)**.5
    assert torch.allclose(apply_target(target, "norm_eps"), expected, rtol=1e-6, atol=1e-6)
    # ... and it is not the spec's strict T_norm (population std): the ratio is sqrt(q/(q-1))
    q = target.shape[-1]
    strict = apply_target(target, "norm")
    assert not torch.allclose(apply_target(target, "norm_eps"), strict, atol=1e-3)
    assert torch.allclose(strict * ((q - 1) / q) ** 0.5, expected, rtol=1e-4, atol=1e-4)


def test_normalised_targets_need_two_values_per_patch():
    with pytest.raises(ValueError, match="q=1"):
        apply_target(torch.rand(2, 3, 1), "norm_eps")
    with pytest.raises(ValueError, match="patch_size"):
        tiny_config(patch_size=1, target="norm_eps")


def test_unknown_target_is_an_error():
    with pytest.raises(ValueError, match="foo"):
        apply_target(_patches(), "foo")


def test_prepare_data_refuses_norm_on_shapes():
    # shapes images have all-zero background patches: outside D_norm.
    with pytest.raises(NormDomainError) as err:
        prepare_data(tiny_config(dataset="shapes", target="norm"))
    message = str(err.value)
    assert "norm_eps" in message
    assert "of 64 images" in message  # how many images (train_limit=64) and how many are bad
    assert "\n" not in message


@pytest.mark.parametrize("target", ["raw", "norm_eps"])
def test_prepare_data_accepts_other_targets_on_shapes(target):
    data = prepare_data(tiny_config(dataset="shapes", target=target))
    assert data.train_patches.shape == (64, 16, 16)


def test_photos_lie_in_d_norm():
    data = prepare_data(tiny_config(dataset="photos", target="norm", train_limit=200, test_limit=50))
    assert data.train_patches.shape == (200, 64, 48)
    t = apply_target(data.train_patches.double(), "norm")
    assert bool(torch.isfinite(t).all())
