"""Denoising corruptions: the input is corrupted, the target stays clean.

A stochastic corruption ``X̃`` of the clean image ``X`` (spec, population denoising risk;
Vincent et al. §2.3; Goodfellow et al. §14.5). Each kind acts on pixel values independently,
so it applies equally to images ``[B,C,H,W]`` and patch sequences ``[B,M,q]``.

* ``gaussian``: additive isotropic noise, ``x + level·ε`` with ``ε ~ N(0, 1)``.
* ``masking``: masking noise, a fraction ``level`` of the values set to 0 (Vincent et al.).
* ``salt_pepper``: a fraction ``level`` of the values set to the data's min or max, each with
  probability ½ (Vincent et al.); here 0 or 1, the range of the built-in datasets.

:func:`finite_corruption_law` fixes, per image, K seeded corrupted copies with weights 1/K:
the spec's finite denoising corruption law ``(C_i, c_i)``, so ``R_den^emp`` is an exact
weighted sum.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import torch

from . import registry


def corrupt(
    x: torch.Tensor, kind: str, level: float, generator: torch.Generator | None = None
) -> torch.Tensor:
    """One draw of ``X̃`` for each element of ``x`` (any shape; returns a new tensor)."""
    if kind == "none":
        return x.clone()  # still a new tensor: a caller may edit X̃ without touching the clean X
    if kind == "gaussian":
        noise = torch.randn(x.shape, generator=generator, dtype=x.dtype, device=x.device)
        return x + level * noise
    hit = torch.rand(x.shape, generator=generator, device=x.device) < level
    if kind == "masking":
        return x.masked_fill(hit, 0.0)
    if kind == "salt_pepper":
        salt = torch.rand(x.shape, generator=generator, device=x.device) < 0.5
        return torch.where(hit, salt.to(x.dtype), x)
    return registry.corruptions.get(kind).function(x, level, generator)  # a plugin's corruption


@dataclass(frozen=True)
class FiniteCorruptionLaw:
    """``C_i`` as ``copies[i, c]`` with weights ``weights[i, c]`` summing to 1 over c.

    copies ``[N,K,...]`` (the clean item's shape after ``K``), weights ``[N,K]``.
    """

    copies: torch.Tensor
    weights: torch.Tensor


def finite_corruption_law(
    x: torch.Tensor, kind: str, level: float, num_copies: int, seed: int = 0
) -> FiniteCorruptionLaw:
    """K seeded corrupted copies of every item of ``x`` ``[N,...]``, each with weight 1/K."""
    if num_copies < 1:
        raise ValueError(f"num_copies={num_copies} must be at least 1")
    generator = torch.Generator().manual_seed(seed)
    repeated = x.unsqueeze(1).expand(x.shape[0], num_copies, *x.shape[1:])
    copies = corrupt(repeated.contiguous(), kind, level, generator)
    weights = torch.full((x.shape[0], num_copies), 1.0 / num_copies, dtype=x.dtype)
    return FiniteCorruptionLaw(copies=copies, weights=weights)


def __getattr__(name: str) -> Any:
    """``CORRUPTIONS``: every registered corruption name, built-in and plugins' (:mod:`mae_core.registry`)."""
    if name == "CORRUPTIONS":
        return registry.corruptions.names()
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
