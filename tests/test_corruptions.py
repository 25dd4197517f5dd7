"""Denoising corruptions X̃ of the clean X, and the finite corruption law (C_i, c_i)."""

import pytest
import torch

from conftest import tiny_config
from device_checks import DEVICE, HostReads, cuda_syncs
from mae_core import build_model, corrupt, empirical_den_risk, finite_corruption_law, prepare_data

KINDS = ["gaussian", "masking", "salt_pepper"]


def _images(n: int = 4, seed: int = 0) -> torch.Tensor:
    # values in (0.05, 1): no exact zeros or ones, so every hit is visible
    return 0.05 + 0.9 * torch.rand(n, 1, 16, 16, generator=torch.Generator().manual_seed(seed))


@pytest.mark.parametrize("kind", KINDS)
def test_input_changes_and_clean_tensor_does_not(kind):
    x = _images()
    clean = x.clone()
    noisy = corrupt(x, kind, 0.3, torch.Generator().manual_seed(0))
    assert torch.equal(x, clean)  # the clean target is untouched
    assert noisy is not x and noisy.data_ptr() != x.data_ptr()
    assert noisy.shape == x.shape and not torch.equal(noisy, x)


def test_masking_zeros_about_the_level_fraction():
    x = _images(8)
    noisy = corrupt(x, "masking", 0.3, torch.Generator().manual_seed(0))
    zeroed = (noisy == 0).double().mean().item()
    assert abs(zeroed - 0.3) < 0.03  # 2048 pixels: stderr ~0.01
    kept = noisy != 0
    assert torch.equal(noisy[kept], x[kept])


def test_salt_pepper_hits_are_zero_or_one_half_each():
    x = _images(8)
    noisy = corrupt(x, "salt_pepper", 0.4, torch.Generator().manual_seed(0))
    hit = noisy != x
    assert set(noisy[hit].unique().tolist()) <= {0.0, 1.0}
    assert abs(hit.double().mean().item() - 0.4) < 0.03
    assert abs((noisy[hit] == 1).double().mean().item() - 0.5) < 0.05


def test_gaussian_at_level_zero_equals_input_and_has_the_level_as_std():
    x = _images(8)
    assert torch.equal(corrupt(x, "gaussian", 0.0, torch.Generator().manual_seed(0)), x)
    noise = corrupt(x, "gaussian", 0.2, torch.Generator().manual_seed(0)) - x
    assert abs(noise.std().item() - 0.2) < 0.01 and abs(noise.mean().item()) < 0.01


def test_none_leaves_values_alone_and_unknown_kind_is_an_error():
    x = _images()
    same = corrupt(x, "none", 0.3)
    assert torch.equal(same, x) and same.data_ptr() != x.data_ptr()
    with pytest.raises(ValueError, match="blur"):
        corrupt(x, "blur", 0.3)


@pytest.mark.parametrize("kind", KINDS)
def test_finite_law_shapes_weights_and_seed(kind):
    x = _images(5).flatten(1).reshape(5, 16, 16)  # any item shape: here [N,M,q]
    law = finite_corruption_law(x, kind, 0.3, num_copies=3, seed=4)
    assert law.copies.shape == (5, 3, 16, 16) and law.weights.shape == (5, 3)
    assert bool((law.weights >= 0).all())
    assert torch.allclose(law.weights.sum(dim=1), torch.ones(5))
    again = finite_corruption_law(x, kind, 0.3, num_copies=3, seed=4)
    other = finite_corruption_law(x, kind, 0.3, num_copies=3, seed=5)
    assert torch.equal(law.copies, again.copies) and not torch.equal(law.copies, other.copies)
    assert not torch.equal(law.copies[:, 0], law.copies[:, 1])  # the K copies are different draws


def test_finite_law_needs_a_copy():
    with pytest.raises(ValueError):
        finite_corruption_law(_images(), "gaussian", 0.3, num_copies=0)


def test_empirical_den_risk_is_the_weighted_sum_by_loops():
    config = tiny_config(objective="dae", test_limit=5)
    torch.manual_seed(0)
    model = build_model(config).eval()
    clean = prepare_data(config).test_patches  # [5,16,4]
    law = finite_corruption_law(clean, "gaussian", 0.3, num_copies=3, seed=1)
    # uneven weights, still summing to 1 per image: the risk must use them, not 1/K
    law = type(law)(copies=law.copies, weights=torch.tensor([[0.5, 0.3, 0.2]] * 5))
    n, num_copies = law.weights.shape
    m, q = clean.shape[1:]
    expected = 0.0
    with torch.no_grad():
        for i in range(n):
            for c in range(num_copies):
                pred = model(law.copies[i, c][None])[0].double()
                sq = sum(float(((pred[j] - clean[i, j].double()) ** 2).sum()) for j in range(m))
                expected += float(law.weights[i, c]) * sq / (m * q)
    expected /= n
    assert empirical_den_risk(model, clean, law) == pytest.approx(expected, rel=1e-5)


# ----------------------------------------------------------------- on the device (issue 26)


@pytest.mark.parametrize("kind", ["none", *KINDS])
def test_corrupt_draws_on_its_generators_device_and_reads_nothing_back(kind, monkeypatch):
    """A generator on the images' device: X̃ stays there, with no host read (no sync per step)."""
    x = _images().to(DEVICE)
    generator = torch.Generator(DEVICE).manual_seed(0)
    reads = HostReads(monkeypatch)
    with cuda_syncs() as syncs:
        noisy = corrupt(x, kind, 0.3, generator)
    assert noisy.device == x.device and noisy.shape == x.shape and noisy.dtype == x.dtype
    assert reads.calls == [] and syncs == []


@pytest.mark.parametrize("kind", KINDS)
def test_a_host_generator_gives_the_same_corruption_on_any_device(kind):
    """corrupt() used to raise on CUDA images with a CPU generator; now the draw crosses once."""
    x = _images()
    expected = corrupt(x, kind, 0.3, torch.Generator().manual_seed(0))
    got = corrupt(x.to(DEVICE), kind, 0.3, torch.Generator().manual_seed(0))
    assert got.device == x.to(DEVICE).device
    torch.testing.assert_close(got.cpu(), expected, rtol=1e-6, atol=1e-6)


def test_each_kind_is_a_function_of_patches_level_and_generator():
    from mae_core.corruptions import CORRUPTION_KINDS, CORRUPTIONS

    assert set(CORRUPTION_KINDS) <= set(CORRUPTIONS)  # the built-ins, registered
    patches = torch.rand(2, 4, 16, generator=torch.Generator().manual_seed(1))  # [B,M,q]
    for kind, fn in CORRUPTION_KINDS.items():
        assert torch.equal(fn(patches, 0.3, torch.Generator().manual_seed(0)),
                           corrupt(patches, kind, 0.3, torch.Generator().manual_seed(0))), kind
