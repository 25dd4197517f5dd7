"""patchify / unpatchify: the spec's grid X = (R^q)^M, M = HW/P², q = P²C."""

import pytest
import torch

from mae_core import PatchSizeError, patchify, unpatchify

SHAPES = [  # (C, H, W, P)
    (1, 8, 8, 2),
    (1, 8, 8, 8),  # one patch
    (1, 16, 16, 4),
    (3, 32, 32, 4),
    (3, 4, 8, 2),  # H != W
    (1, 6, 10, 2),  # H != W
    (2, 9, 6, 3),
    (3, 5, 5, 1),  # P = 1: one pixel (all channels) per patch
]


@pytest.mark.parametrize("c, h, w, p", SHAPES)
def test_roundtrip_is_exact(c, h, w, p):
    x = torch.randn(3, c, h, w, generator=torch.Generator().manual_seed(0))
    patches = patchify(x, p)
    assert patches.shape == (3, (h // p) * (w // p), p * p * c)
    assert torch.equal(unpatchify(patches, p, (c, h, w)), x)


@pytest.mark.parametrize("c, h, w, p", SHAPES)
def test_patchify_matches_reference_einsum(c, h, w, p):
    x = torch.randn(2, c, h, w, generator=torch.Generator().manual_seed(1))
    ref = torch.einsum("nchpwq->nhwpqc", x.reshape(2, c, h // p, p, w // p, p))
    assert torch.equal(patchify(x, p), ref.reshape(2, (h // p) * (w // p), p * p * c))


def test_one_element_by_hand():
    # Image [1,C=3,H=4,W=6], P=2: grid 2x3, q = 12. Give each pixel a unique value.
    c, h, w, p = 3, 4, 6, 2
    x = torch.zeros(1, c, h, w)
    for ch in range(c):
        for row in range(h):
            for col in range(w):
                x[0, ch, row, col] = 100 * ch + 10 * row + col
    patches = patchify(x, p)
    # Grid position j=4 is grid row 1, grid column 1 (row-major, 3 columns): pixels rows 2..3,
    # columns 2..3. Inner index (r, s, ch) -> r*P*C + s*C + ch; take r=1, s=0, ch=2:
    # pixel (row 3, column 2, channel 2) = 200 + 30 + 2.
    assert patches[0, 4, 1 * p * c + 0 * c + 2].item() == 232
    # and the whole first patch in (row, column, channel) order
    expected = [100 * ch + 10 * r + s for r in range(2) for s in range(2) for ch in range(3)]
    assert patches[0, 0].tolist() == expected


@pytest.mark.parametrize("c, h, w, p", [(1, 8, 8, 3), (3, 32, 32, 5), (1, 8, 12, 8), (1, 8, 8, 0)])
def test_patch_size_must_divide_height_and_width(c, h, w, p):
    with pytest.raises(PatchSizeError) as err:
        patchify(torch.zeros(1, c, h, w), p)
    assert isinstance(err.value, ValueError)
    assert f"patch_size={p}" in str(err.value)


def test_unpatchify_rejects_mismatched_patches():
    with pytest.raises(ValueError):
        unpatchify(torch.zeros(1, 16, 4), 2, (1, 8, 6))
