"""Training-time augmentation, off by default: outside the specification's procedure.

The spec samples ``I_t`` and trains on the image as it is. ``augment=crop_flip`` is the MAE
paper's pretraining augmentation instead (He et al. 2022, ``main_pretrain.py``:
``RandomResizedCrop(input_size, scale=(0.2, 1.0), interpolation=bicubic)`` then
``RandomHorizontalFlip()``, on PIL images), with the output the dataset's own size. It runs per batch on the
trial's device, every image its own crop and flip, with the parameters drawn on the CPU from the
run's sampler: a run is reproducible under its seed and resumes bitwise from a checkpoint (the
sampler state is saved), and ``augment=none`` draws nothing, so it leaves every number as before.
Only the 5·B crop parameters cross to the device; the resize matrices are built there (issue 26:
float64 [B,H,H] and [B,W,W] built on the CPU every step were about 200 MB a step at 224 px).
"""

from __future__ import annotations

import math

import torch

from .devices import to_device

AUGMENTATIONS = ("none", "crop_flip")
CROP_SCALE = (0.2, 1.0)  # crop area / image area (He et al.)
CROP_RATIO = (3 / 4, 4 / 3)  # crop width / height (torchvision's default, kept by He et al.)
CROP_ATTEMPTS = 10  # torchvision's get_params tries this many draws, then falls back to a centre crop


def augment(images: torch.Tensor, kind: str, generator: torch.Generator,
            value_range: tuple[float, float] | None = None) -> torch.Tensor:
    """``images`` float32 [B, C, H, W] (any device) -> augmented [B, C, H, W] on the same device.
    ``none`` returns ``images`` and draws nothing from ``generator`` (a CPU generator). Bicubic
    overshoots: the output is clamped to ``value_range`` when given (``(0, 1)`` for images made
    of bytes, as PIL clamps its 8-bit output)."""
    if kind == "none":
        return images
    if kind != "crop_flip":
        raise ValueError(f"augment={kind!r} is not one of {', '.join(AUGMENTATIONS)}")
    batch, _, height, width = images.shape
    top, left, h, w, flip = crop_flip_params(batch, height, width, generator)
    return resized_crops(images, top, left, h, w, flip, value_range)


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
                  w: torch.Tensor, flip: torch.Tensor,
                  value_range: tuple[float, float] | None = None) -> torch.Tensor:
    """Crop image b to rows ``top..top+h``, columns ``left..left+w``, resize the crop back to
    [H, W] and mirror it left-right where ``flip``: [B, C, H, W] -> [B, C, H, W].

    The resize is PIL's bicubic (what He et al.'s transforms ran): separable, each axis a
    matrix of the filter's weights over the crop's own pixels (taps outside the crop dropped
    and the weights renormalised, as PIL does), so out = R_rows · image · R_colsᵀ, one batched
    product (PIL rounds to bytes between its two passes; this stays in float)."""
    _, _, height, width = images.shape
    # the 5·B parameters cross to the device in one copy that does not block the host
    top, left, h, w, flip = to_device(torch.stack([top, left, h, w, flip.long()]), images.device)
    rows = _resize_matrix(top, h, height, images.dtype)  # [B, H, H]
    cols = _resize_matrix(left, w, width, images.dtype)  # [B, W, W]
    cols = torch.where(flip.bool()[:, None, None], cols.flip(1), cols)
    out = rows[:, None] @ images @ cols.transpose(1, 2)[:, None]
    return out if value_range is None else out.clamp(*value_range)


def _cubic(x: torch.Tensor, a: float = -0.5) -> torch.Tensor:
    """PIL's bicubic kernel (a = -0.5; torch's own bicubic uses -0.75)."""
    x = x.abs()
    near = ((a + 2) * x - (a + 3)) * x * x + 1
    far = (((x - 5) * x + 8) * x - 4) * a
    return torch.where(x < 1, near, torch.where(x < 2, far, torch.zeros_like(x)))


def _resize_matrix(start: torch.Tensor, length: torch.Tensor, size: int, dtype: torch.dtype) -> torch.Tensor:
    """Per image b, the [size, size] matrix that resizes pixels ``start..start+length`` of an
    axis of ``size`` pixels to ``size`` pixels (an upscale: crops are never larger than the
    image), PIL's way: output i is centred at ``(i + ½)·length/size`` in the crop and reads
    the crop pixels j with ``|j + ½ - centre| < 2``, weights renormalised to sum to 1.
    ``dtype`` [B, size, size] on the device of ``start`` and ``length``. The taps and their
    weights ([B, size, 5], small) are float64, so every floor and comparison is the one PIL's
    double arithmetic makes; only the weights are rounded to ``dtype``, and each matrix entry
    holds at most one non-zero weight (in-crop taps are distinct pixels), so for float32 the
    matrix equals the float64 one rounded to float32."""
    device = start.device
    scale = length.double() / size  # [B]
    centre = (torch.arange(size, dtype=torch.float64, device=device) + 0.5)[None, :] * scale[:, None]  # [B, size]
    first = torch.floor(centre - 1.5)
    taps = first[..., None] + torch.arange(5, dtype=torch.float64, device=device)  # [B, size, 5], crop-local
    inside = (taps >= 0) & (taps < length[:, None, None]) & (taps < torch.floor(centre + 2.5)[..., None])
    weights = _cubic(taps + 0.5 - centre[..., None]) * inside
    weights = weights / weights.sum(dim=-1, keepdim=True)
    columns = (taps.long() + start[:, None, None]).clamp(0, size - 1)  # outside taps weigh 0
    matrix = torch.zeros(len(start), size, size, dtype=dtype, device=device)
    return matrix.scatter_add_(2, columns, weights.to(dtype))
