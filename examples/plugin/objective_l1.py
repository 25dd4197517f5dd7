"""A new objective in one file: the MAE with an L1 loss on the masked patches.

Load it with ``--plugin examples/plugin/objective_l1.py`` and train with ``objective=mae_l1``.
The class keeps everything of the MAE (its draw of ``V_t``, its visible-only model, its risks,
which stay the spec's squared ``R_MAE^emp`` so the two losses are judged alike) and replaces
only the per-example loss: ``((M-k)q)⁻¹ Σ_{j∉V} ||x̂_j - T(x_j)||₁`` instead of the squared
norm (shapes: B images, M patches, k visible, q values per patch).
"""

from __future__ import annotations

import torch

from mae_core.masking import masked_positions
from mae_core.objective_classes import MAE
from mae_core.registry import objective


@objective("mae_l1", label="MAE (L1)")
class MaskedL1(MAE):
    """masked L1: the encoder sees k visible patches, the loss is the mean absolute error of the masked ones"""

    def example_loss(self, pred: torch.Tensor, target: torch.Tensor, draw) -> torch.Tensor:
        """pred, target ``[B,M,d]``, ``draw.visible`` ``[B,k]`` -> ``[B]``."""
        num_patches, width = pred.shape[1], pred.shape[2]
        masked = masked_positions(draw.visible, num_patches)[..., None]  # [B,M,1]
        # where() before the absolute value: a non-finite visible prediction cannot leak in
        error = torch.where(masked, pred - target, torch.zeros((), dtype=pred.dtype, device=pred.device)).abs()
        return error.sum(dim=(1, 2)) / ((num_patches - draw.visible.shape[1]) * width)
