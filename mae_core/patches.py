"""Patch grids: images ``[B,C,H,W]`` <-> patch sequences ``[B,M,q]``.

The specification's image space is ``X = (R^q)^M``: ``M = HW/P²`` patches of ``q = P²C``
values each. Grid positions are row-major; inside a patch the values are ordered
(row, column, channel), as ``einsum('nchpwq->nhwpqc')`` in He et al.'s reference code.
"""

from __future__ import annotations

import torch

from .errors import UserError


class PatchSizeError(UserError):
    """The patch size does not tile the image."""


def check_patch_size(image_shape: tuple[int, int, int], patch_size: int) -> None:
    """Raise :class:`PatchSizeError` unless ``patch_size`` divides both ``H`` and ``W``."""
    _, height, width = image_shape
    if patch_size < 1 or height % patch_size or width % patch_size:
        raise PatchSizeError(
            f"patch_size={patch_size} must be a positive divisor of the image height {height} "
            f"and width {width}"
        )


def grid_shape(image_shape: tuple[int, int, int], patch_size: int) -> tuple[int, int]:
    """Rows and columns of the patch grid, ``(H/P, W/P)``."""
    check_patch_size(image_shape, patch_size)
    return image_shape[1] // patch_size, image_shape[2] // patch_size


def patchify(images: torch.Tensor, patch_size: int) -> torch.Tensor:
    """Cut images into a row-major sequence of flattened patches.

    images ``[B,C,H,W]`` -> patches ``[B,M,q]`` with ``M = HW/P²`` and ``q = P²C``.
    """
    batch, channels, height, width = images.shape
    rows, cols = grid_shape((channels, height, width), patch_size)
    p = patch_size
    x = images.reshape(batch, channels, rows, p, cols, p)
    x = torch.einsum("nchpwq->nhwpqc", x)
    return x.reshape(batch, rows * cols, p * p * channels)


def unpatchify(
    patches: torch.Tensor, patch_size: int, image_shape: tuple[int, int, int]
) -> torch.Tensor:
    """Exact inverse of :func:`patchify`: patches ``[B,M,q]`` -> images ``[B,C,H,W]``."""
    channels, height, width = image_shape
    rows, cols = grid_shape(image_shape, patch_size)
    batch, num_patches, patch_dim = patches.shape
    p = patch_size
    if num_patches != rows * cols or patch_dim != p * p * channels:
        raise ValueError(
            f"patches of shape {tuple(patches.shape)} do not fit image {image_shape} "
            f"with patch_size={patch_size} (expected M={rows * cols}, q={p * p * channels})"
        )
    x = patches.reshape(batch, rows, cols, p, p, channels)
    x = torch.einsum("nhwpqc->nchpwq", x)
    return x.reshape(batch, channels, height, width)
