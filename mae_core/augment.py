"""Training-time augmentation, off by default: outside the specification's procedure.

The spec samples ``I_t`` and trains on the image as it is. ``augment=crop_flip`` is the MAE
paper's pretraining augmentation instead (He et al. 2022, ``main_pretrain.py``:
``RandomResizedCrop(input_size, scale=(0.2, 1.0), interpolation=bicubic)`` then
``RandomHorizontalFlip()``), with the output the dataset's own size. It runs per batch on the
trial's device, every image its own crop and flip, with the parameters drawn on the CPU from the
run's sampler: a run is reproducible under its seed and resumes bitwise from a checkpoint (the
sampler state is saved), and ``augment=none`` draws nothing, so it leaves every number as before.
"""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F

AUGMENTATIONS = ("none", "crop_flip")
CROP_SCALE = (0.2, 1.0)  # crop area / image area (He et al.)
CROP_RATIO = (3 / 4, 4 / 3)  # crop width / height (torchvision's default, kept by He et al.)
CROP_ATTEMPTS = 10  # torchvision's get_params tries this many draws, then falls back to a centre crop


def augment(images: torch.Tensor, kind: str, generator: torch.Generator) -> torch.Tensor:
    """``images`` float32 [B, C, H, W] (any device) -> augmented [B, C, H, W] on the same device.
    ``none`` returns ``images`` and draws nothing from ``generator`` (a CPU generator)."""
    if kind == "none":
        return images
    if kind != "crop_flip":
        raise ValueError(f"augment={kind!r} is not one of {', '.join(AUGMENTATIONS)}")
    batch, _, height, width = images.shape
    top, left, h, w, flip = crop_flip_params(batch, height, width, generator)
    return resized_crops(images, top, left, h, w, flip)


def crop_flip_params(batch: int, height: int, width: int,
                     generator: torch.Generator) -> tuple[torch.Tensor, ...]:
    """torchvision's ``RandomResizedCrop.get_params`` for each of ``batch`` images, plus a fair
    flip: (top, left, h, w) int64 [B] each, in pixels, and flip bool [B]. Always draws the same
    amount (B x 23 uniforms), whatever is accepted, so the sampler's stream is a function of the
    step alone."""
    u = torch.rand((batch, 2 * CROP_ATTEMPTS + 3), generator=generator, dtype=torch.float64)
    area = height * width
    target = area * (CROP_SCALE[0] + (CROP_SCALE[1] - CROP_SCALE[0]) * u[:, :CROP_ATTEMPTS])
    log_lo, log_hi = math.log(CROP_RATIO[0]), math.log(CROP_RATIO[1])
    aspect = torch.exp(log_lo + (log_hi - log_lo) * u[:, CROP_ATTEMPTS:2 * CROP_ATTEMPTS])
    ws = torch.round(torch.sqrt(target * aspect)).long()  # [B, attempts]
    hs = torch.round(torch.sqrt(target / aspect)).long()
    ok = (ws > 0) & (ws <= width) & (hs > 0) & (hs <= height)
    first = torch.argmax(ok.long(), dim=1, keepdim=True)  # the first accepted attempt
    w, h = ws.gather(1, first)[:, 0], hs.gather(1, first)[:, 0]
    found = ok.any(dim=1)
    fallback_h, fallback_w = _centre_crop_size(height, width)
    w, h = torch.where(found, w, fallback_w), torch.where(found, h, fallback_h)
    top = torch.floor(u[:, -3] * (height - h + 1)).long()
    left = torch.floor(u[:, -2] * (width - w + 1)).long()
    top = torch.where(found, top, (height - h) // 2)
    left = torch.where(found, left, (width - w) // 2)
    return top, left, h, w, u[:, -1] < 0.5


def _centre_crop_size(height: int, width: int) -> tuple[int, int]:
    """torchvision's fallback when no attempt fits: the whole image, its ratio clamped."""
    ratio = width / height
    if ratio < CROP_RATIO[0]:
        return int(round(width / CROP_RATIO[0])), width
    if ratio > CROP_RATIO[1]:
        return height, int(round(height * CROP_RATIO[1]))
    return height, width


def resized_crops(images: torch.Tensor, top: torch.Tensor, left: torch.Tensor, h: torch.Tensor,
                  w: torch.Tensor, flip: torch.Tensor) -> torch.Tensor:
    """Crop image b to rows ``top..top+h``, columns ``left..left+w`` and resize it back to
    [H, W] (bicubic, as He et al.; each output image clamped to its source's range, since bicubic
    overshoots), mirrored left-right where ``flip``: [B, C, H, W] -> [B, C, H, W].

    One batched ``grid_sample``: with ``align_corners=False`` an output pixel centre x maps to the
    source point ``left + (x + ½)·w/W``, what resizing the crop samples."""
    batch, _, height, width = images.shape
    sx, sy = w.double() / width, h.double() / height
    theta = torch.zeros(batch, 2, 3, dtype=torch.float64)
    theta[:, 0, 0] = torch.where(flip, -sx, sx)
    theta[:, 0, 2] = (2 * left + w).double() / width - 1
    theta[:, 1, 1] = sy
    theta[:, 1, 2] = (2 * top + h).double() / height - 1
    theta = theta.to(device=images.device, dtype=images.dtype, non_blocking=True)
    grid = F.affine_grid(theta, list(images.shape), align_corners=False)
    out = F.grid_sample(images, grid, mode="bicubic", padding_mode="border", align_corners=False)
    low = images.amin(dim=(1, 2, 3), keepdim=True)
    high = images.amax(dim=(1, 2, 3), keepdim=True)
    return torch.maximum(torch.minimum(out, high), low)
