"""Tests for mae_core.augment: He et al.'s RandomResizedCrop + flip, per batch, seeded."""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch
from PIL import Image

from conftest import tiny_config
from mae_core import Config, ConfigError, prepare_data, train
from device_checks import DEVICE, HostReads, cuda_syncs
from mae_core.augment import CROP_ATTEMPTS, _cubic, augment, crop_flip_params, resized_crops


def _generator(seed: int = 0) -> torch.Generator:
    return torch.Generator().manual_seed(seed)


def test_none_returns_the_batch_and_draws_nothing():
    images, g = torch.rand(4, 1, 8, 8), _generator()
    assert augment(images, "none", g) is images
    assert torch.equal(g.get_state(), _generator().get_state())
    with pytest.raises(ValueError, match="augment"):
        augment(images, "jitter", g)


def test_crop_flip_is_reproducible_under_a_seed_and_changes_the_batch():
    images = torch.rand(16, 3, 32, 32)
    a, b = augment(images, "crop_flip", _generator(5)), augment(images, "crop_flip", _generator(5))
    assert torch.equal(a, b) and a.shape == images.shape
    assert not torch.equal(a, images)
    assert not torch.equal(a, augment(images, "crop_flip", _generator(6)))
    # bicubic overshoots the pixel range; clamped to it when asked (byte-valued data)
    assert a.min() < 0 or a.max() > 1
    clamped = augment(images, "crop_flip", _generator(5), (0.0, 1.0))
    assert clamped.min() >= 0 and clamped.max() <= 1 and torch.equal(clamped, a.clamp(0, 1))


def test_crop_parameters_follow_torchvision_and_use_a_fixed_number_of_draws():
    g = _generator(1)
    top, left, h, w, flip = crop_flip_params(2000, 32, 24, g)
    reference = _generator(1)
    torch.rand((2000, 2 * CROP_ATTEMPTS + 3), generator=reference, dtype=torch.float64)
    assert torch.equal(g.get_state(), reference.get_state())  # same stream whatever was accepted
    assert ((top >= 0) & (left >= 0) & (top + h <= 32) & (left + w <= 24) & (h > 0) & (w > 0)).all()
    area = (h * w).double() / (32 * 24)
    assert area.min() > 0.17 and area.max() <= 1.0  # scale (0.2, 1), up to rounding to whole pixels
    ratio = w.double() / h.double()
    assert (ratio > 0.7).all() and (ratio < 1.45).all()  # (3/4, 4/3), up to rounding
    assert abs(flip.double().mean() - 0.5) < 0.05
    assert len(set(zip(top.tolist(), left.tolist(), h.tolist(), w.tolist()))) > 1000  # each image its own crop


def test_resized_crops_place_and_mirror_the_box():
    # four constant quadrants: a crop inside one of them is that quadrant's value everywhere
    images = torch.zeros(1, 1, 8, 8)
    images[..., :4, :4], images[..., :4, 4:], images[..., 4:, :4], images[..., 4:, 4:] = 0.1, 0.2, 0.3, 0.4
    one = torch.ones(1, dtype=torch.long)
    inside = resized_crops(images, one * 4, one * 5, one * 3, one * 2, torch.tensor([False]))
    assert torch.allclose(inside, torch.full_like(inside, 0.4))
    whole = resized_crops(images, one * 0, one * 0, one * 8, one * 8, torch.tensor([False]))
    assert torch.allclose(whole, images, atol=1e-6)  # the whole image at its size: itself
    mirrored = resized_crops(images, one * 0, one * 0, one * 8, one * 8, torch.tensor([True]))
    assert torch.allclose(mirrored, images.flip(-1), atol=1e-6)


def test_resized_crops_are_pils_bicubic_resize_of_the_crop():
    """What He et al.'s transforms computed on PIL images: crop, then resize with PIL's bicubic.
    PIL rounds to bytes between its two passes, so the two agree to about one 8-bit level on
    images whose first pass does not overshoot 0..255."""
    rng = np.random.default_rng(0)
    for _ in range(20):
        img = rng.integers(80, 176, (24, 20, 3), dtype=np.uint8)
        h, w = int(rng.integers(4, 25)), int(rng.integers(4, 21))
        top, left, flip = int(rng.integers(0, 25 - h)), int(rng.integers(0, 21 - w)), bool(rng.integers(0, 2))
        pil = Image.fromarray(img).crop((left, top, left + w, top + h)).resize((20, 24), Image.BICUBIC)
        pil = pil.transpose(Image.FLIP_LEFT_RIGHT) if flip else pil
        as_tensor = lambda v: torch.tensor([v])  # noqa: E731
        ours = resized_crops(torch.from_numpy(img.transpose(2, 0, 1)[None] / np.float32(255)),
                             as_tensor(top), as_tensor(left), as_tensor(h), as_tensor(w), as_tensor(flip), (0.0, 1.0))
        assert np.abs(ours[0].numpy() * 255 - np.asarray(pil).transpose(2, 0, 1)).max() < 1.5


def test_augment_is_a_typed_key_logged_with_the_config_and_refused_with_strict_norm():
    assert Config().augment == "none"
    config = tiny_config(augment="crop_flip")
    assert config.resolved()["augment"] == "crop_flip"
    with pytest.raises(ConfigError, match="augment"):
        tiny_config(augment="mixup")
    with pytest.raises(ConfigError, match="norm_eps"):
        tiny_config(augment="crop_flip", target="norm")


def test_training_with_crop_flip_is_seeded_and_differs_from_plain_training():
    config = tiny_config(augment="crop_flip", steps=6)
    data = prepare_data(config)
    first, again = train(config, data).history, train(config, data).history
    assert first == again and all(math.isfinite(v) for _, v in first)
    assert first != train(config.with_updates(augment="none"), data).history


# ------------------------------------------------- on the device, in the activations' dtype (issue 26)


def _old_resize_matrix(start, length, size):
    """The float64 CPU matrix crop_flip built before issue 26, kept as the reference."""
    scale = length.double() / size
    centre = (torch.arange(size, dtype=torch.float64) + 0.5)[None, :] * scale[:, None]
    first = torch.floor(centre - 1.5)
    taps = first[..., None] + torch.arange(5, dtype=torch.float64)
    inside = (taps >= 0) & (taps < length[:, None, None]) & (taps < torch.floor(centre + 2.5)[..., None])
    weights = _cubic(taps + 0.5 - centre[..., None]) * inside
    weights = weights / weights.sum(dim=-1, keepdim=True)
    columns = (taps.long() + start[:, None, None]).clamp(0, size - 1)
    return torch.zeros(len(start), size, size, dtype=torch.float64).scatter_add_(2, columns, weights)


def _old_resized_crops(images, top, left, h, w, flip):
    _, _, height, width = images.shape
    rows = _old_resize_matrix(top, h, height).to(images.dtype)
    cols = _old_resize_matrix(left, w, width)
    cols = torch.where(flip[:, None, None], cols.flip(1), cols).to(images.dtype)
    return rows[:, None] @ images @ cols.transpose(1, 2)[:, None]


@pytest.mark.parametrize("size", [(32, 24), (224, 224)])
def test_crop_flip_matrices_built_on_the_device_match_the_float64_path(size):
    """fp32: the float64 weights rounded once, so the output is the old path's to fp32 rounding."""
    height, width = size
    images = torch.rand(6, 3, height, width, generator=_generator(3))
    params = crop_flip_params(6, height, width, _generator(4))
    expected = _old_resized_crops(images, *params)
    got = resized_crops(images.to(DEVICE), *params)
    assert got.device.type == DEVICE.type and got.dtype == torch.float32
    torch.testing.assert_close(got.cpu(), expected, rtol=1e-5, atol=1e-6)


def test_crop_flip_in_bf16_stays_in_bf16_within_its_rounding():
    images = torch.rand(4, 3, 16, 16, generator=_generator(1))
    params = crop_flip_params(4, 16, 16, _generator(2))
    got = resized_crops(images.to(DEVICE, torch.bfloat16), *params)
    assert got.dtype == torch.bfloat16 and got.device.type == DEVICE.type
    torch.testing.assert_close(got.float().cpu(), _old_resized_crops(images, *params), rtol=0.05, atol=0.05)


def test_crop_flip_reads_nothing_back_from_the_device(monkeypatch):
    """The parameters are drawn on the host and cross once; nothing is read back (no host sync)."""
    images = torch.rand(4, 1, 8, 8).to(DEVICE)
    reads = HostReads(monkeypatch)
    with cuda_syncs() as syncs:
        out = augment(images, "crop_flip", _generator(0), (0.0, 1.0))
    assert out.device == images.device and out.shape == images.shape
    assert reads.calls == [] and syncs == []
