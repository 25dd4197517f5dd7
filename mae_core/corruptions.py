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

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import torch

from . import registry
from .devices import to_device
from .plugin_checks import corruption_result


def _draw(sample: Callable[..., torch.Tensor], x: torch.Tensor, generator: torch.Generator | None,
          dtype: torch.dtype | None = None) -> torch.Tensor:
    """``sample`` (``torch.randn`` or ``torch.rand``) of ``x``'s shape, drawn on the generator's
    device (``x``'s without one) and put on ``x``'s: a generator on the device draws there with
    no host sync; a host generator's draw crosses once, so its numbers do not depend on ``x``'s device."""
    device = x.device if generator is None else generator.device
    return to_device(sample(x.shape, generator=generator, dtype=dtype, device=device), x.device)


def no_corruption(x: torch.Tensor, level: float, generator: torch.Generator | None = None) -> torch.Tensor:
    """``X̃ = X``, still a new tensor: a caller may edit X̃ without touching the clean X."""
    return x.clone()


def gaussian(x: torch.Tensor, level: float, generator: torch.Generator | None = None) -> torch.Tensor:
    """``x + level·ε``, ``ε ~ N(0, 1)`` elementwise."""
    return x + level * _draw(torch.randn, x, generator, x.dtype)


def masking(x: torch.Tensor, level: float, generator: torch.Generator | None = None) -> torch.Tensor:
    """A fraction ``level`` of the values set to 0."""
    return x.masked_fill(_draw(torch.rand, x, generator) < level, 0.0)


def salt_pepper(x: torch.Tensor, level: float, generator: torch.Generator | None = None) -> torch.Tensor:
    """A fraction ``level`` of the values set to 0 or 1, each with probability ½."""
    hit = _draw(torch.rand, x, generator) < level
    salt = _draw(torch.rand, x, generator) < 0.5
    return torch.where(hit, salt.to(x.dtype), x)


# the built-in kinds (registered in mae_core.builtin_parts): fn(x [B,M,q] (any shape), level,
# generator) -> X̃ of x's shape, on x's device
CORRUPTION_KINDS: dict[str, Callable[..., torch.Tensor]] = {
    "none": no_corruption, "gaussian": gaussian, "masking": masking, "salt_pepper": salt_pepper}


def corrupt(
    x: torch.Tensor, kind: str, level: float, generator: torch.Generator | None = None
) -> torch.Tensor:
    """One draw of ``X̃`` for each element of ``x`` (any shape, any device; returns a new tensor
    on ``x``'s device). A built-in kind draws its noise where ``generator`` lives (issue 26: a
    generator on the trial's device draws with no host sync; a CPU generator gives the same
    numbers whatever device ``x`` is on); any other kind is a plugin's (:mod:`mae_core.registry`)."""
    if kind in CORRUPTION_KINDS:
        return CORRUPTION_KINDS[kind](x, level, generator)
    return corruption_result(registry.corruptions.get(kind), x, level, generator)  # a plugin's, checked


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
