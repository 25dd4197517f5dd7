"""Visible-set samplers: which k of the M patches the encoder sees.

``random`` is the specification's law, ``V ~ Uniform(V_k)`` with
``V_k = {V ⊆ [M] : |V| = k}``, drawn independently per image (spec, "For masked
autoencoding" and step 1 of the training procedure). ``block`` and ``grid`` are the MAE
paper's mask-sampling ablations (He et al., Table 1f); they are *not* the specification's
law and exist only so the ablation can be run.

Positions are 0-based here (the spec's ``[M]`` is 1-based); every sampler returns exactly k
distinct positions per image in ascending order: ``LongTensor[B,k]``.
"""

from __future__ import annotations

import itertools
import math
from typing import Any

import torch

from . import registry
from .plugin_checks import visible_positions


def num_visible_for(num_patches: int, mask_ratio: float) -> int:
    """The visible count ``k = int(M·(1-ρ))``, as in the reference code."""
    return int(num_patches * (1.0 - mask_ratio))


def _random(batch_size: int, num_patches: int, num_visible: int, grid: tuple[int, int],
            generator: torch.Generator | None) -> torch.Tensor:
    # The first k entries of a uniform random permutation form a uniform k-subset.
    noise = torch.rand(batch_size, num_patches, generator=generator)
    return noise.argsort(dim=1)[:, :num_visible]


def _block(batch_size: int, num_patches: int, num_visible: int, grid: tuple[int, int],
           generator: torch.Generator | None) -> torch.Tensor:
    # BEiT-style block-wise masking: rectangles of random size and aspect are masked one after
    # another until M-k positions are covered; the last block is cut to hit M-k exactly.
    # The bookkeeping is plain Python (torch ops on single elements cost microseconds each); the
    # draws come from ``generator`` in a fixed order, so a seed always gives the same masks.
    rows, cols = grid
    num_masked = num_patches - num_visible
    out = []
    for _ in range(batch_size):
        order: list[int] = []
        covered = [False] * num_patches
        while len(order) < num_masked:
            area = int(torch.randint(1, max(2, num_masked - len(order) + 1), (1,), generator=generator))
            log_aspect = (torch.rand(1, generator=generator).item() * 2 - 1) * math.log(3.0)
            h = max(1, min(rows, round(math.sqrt(area * math.exp(log_aspect)))))
            w = max(1, min(cols, round(math.sqrt(area / math.exp(log_aspect)))))
            top = int(torch.randint(0, rows - h + 1, (1,), generator=generator))
            left = int(torch.randint(0, cols - w + 1, (1,), generator=generator))
            new = [r * cols + c for r in range(top, top + h) for c in range(left, left + w) if not covered[r * cols + c]]
            for i in torch.randperm(len(new), generator=generator).tolist():
                covered[new[i]] = True
                order.append(new[i])
        masked = set(order[:num_masked])
        out.append([j for j in range(num_patches) if j not in masked])
    return torch.tensor(out, dtype=torch.long).view(batch_size, num_visible)


def _grid(batch_size: int, num_patches: int, num_visible: int, grid: tuple[int, int],
          generator: torch.Generator | None) -> torch.Tensor:
    # Regular lattice: keep one patch of every s×s cell (s from the ratio, s=2 at ρ=0.75 on an
    # even grid as in the paper), at a random phase; other phases fill in when k is not M/s².
    # There are only s² phases: each one's visible set is built once, then indexed per image.
    rows, cols = grid
    stride = max(1, round(math.sqrt(num_patches / num_visible)))
    r = torch.arange(num_patches) // cols
    c = torch.arange(num_patches) % cols
    phase_class = (r % stride) * stride + (c % stride)
    phases = stride * stride
    by_phase = torch.stack([
        torch.argsort(((phase_class - start) % phases) * num_patches + torch.arange(num_patches))[:num_visible]
        for start in range(phases)
    ])  # [s², k]
    return by_phase[torch.randint(0, phases, (batch_size,), generator=generator)]


def sample_visible(
    batch_size: int,
    num_patches: int,
    num_visible: int,
    generator: torch.Generator | None = None,
    scheme: str = "random",
    grid: tuple[int, int] | None = None,
) -> torch.Tensor:
    """Draw one visible set per image: ``LongTensor[B,k]``, distinct, ascending.

    ``scheme="random"`` is uniform over all k-subsets, independently per image (the spec's
    law). ``grid`` is the patch grid ``(rows, cols)`` used by the spatial ablation schemes;
    it defaults to a square grid.
    """
    if not 1 <= num_visible < num_patches:
        raise ValueError(f"num_visible={num_visible} must satisfy 1 <= k < M={num_patches}")
    sampler = registry.mask_samplers.get(scheme)  # an unknown scheme: one line, the choices
    if grid is None:
        side = math.isqrt(num_patches)
        grid = (side, num_patches // side) if side * side == num_patches else (1, num_patches)
    # sorted; a plugin's checked: [B,k], k distinct positions in [0,M) per row
    return visible_positions(sampler, batch_size, num_patches, num_visible, grid, generator)


def all_visible_sets(num_patches: int, num_visible: int) -> torch.Tensor:
    """Enumerate ``V_k``: ``LongTensor[C(M,k), k]``, each row ascending, in lexicographic order."""
    if not 1 <= num_visible < num_patches:
        raise ValueError(f"num_visible={num_visible} must satisfy 1 <= k < M={num_patches}")
    combos = list(itertools.combinations(range(num_patches), num_visible))
    return torch.tensor(combos, dtype=torch.long)


def masked_positions(visible: torch.Tensor, num_patches: int) -> torch.Tensor:
    """Boolean ``[B,M]`` that is True exactly at the masked positions ``[M] \\ V``."""
    masked = torch.ones(visible.shape[0], num_patches, dtype=torch.bool, device=visible.device)
    return masked.scatter(1, visible, False)


def __getattr__(name: str) -> Any:
    """``MASK_SAMPLINGS``: every registered sampler name, built-in and plugins' (:mod:`mae_core.registry`)."""
    if name == "MASK_SAMPLINGS":
        return registry.mask_samplers.names()
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
