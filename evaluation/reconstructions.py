"""Reconstruction grids: original / what the encoder saw / reconstruction, one column per image.

:func:`reconstruction_grid` computes the images (torch); :mod:`evaluation.reconstruction_grid`
draws them and writes them as the ``reconstructions.npz`` artifact a report renders again.
"""

from __future__ import annotations

import numpy as np
import torch
from matplotlib.figure import Figure

from mae_core import registry
from mae_core.config import Config
from mae_core.masking import masked_positions
from mae_core.patches import unpatchify

from .reconstruction_grid import ReconstructionGrid, render


def _to_pixels(patches: torch.Tensor, reference: torch.Tensor, target: str) -> torch.Tensor:
    """Predictions in target space back to pixel space: the target's registered inverse (a
    normalised target is shown with each patch's own mean and scale, as He et al.'s
    visualisations do)."""
    inverse = registry.targets.get(target).inverse
    if inverse is None:
        raise ValueError(f"target={target} has no inverse: its predictions cannot be drawn as pixels")
    return inverse(patches, reference)


def can_draw(config: Config) -> bool:
    """Whether predictions of ``config``'s target can be drawn as pixels (it has an inverse)."""
    return registry.targets.get(config.target).inverse is not None


def _images(patches: torch.Tensor, config: Config, image_shape) -> np.ndarray:
    """``[N,M,q]`` -> ``[N,H,W,C]`` numpy (channels last, for drawing)."""
    return unpatchify(patches, config.resolved_patch_size, image_shape).permute(0, 2, 3, 1).numpy()


@torch.inference_mode()
def reconstruction_grid(model, config: Config, patches: torch.Tensor, image_shape, num_images: int = 8,
                        seed: int = 0) -> ReconstructionGrid:
    """The first ``num_images`` of ``patches [N,M,q]``: originals, encoder inputs (masked
    positions marked), reconstructions in pixel space."""
    x = patches[:num_images]
    generator = torch.Generator().manual_seed(seed)
    shown = x.clone()
    hidden = torch.zeros_like(x, dtype=torch.bool)  # [N,M,q]: True where the encoder saw nothing
    device = next(model.parameters()).device
    draw = config.objective_spec.draw(x, config, generator, generator)  # as a training update draws
    if draw.visible is not None:  # the masked encoder: the visible patches, the rest marked hidden
        pred = model(x.to(device), draw.visible.to(device)).float().cpu()
        hidden[masked_positions(draw.visible, x.shape[1])] = True
        middle = f"encoder input ({config.effective_mask_ratio:.0%} masked)"
    else:
        if draw.inputs is not None:  # a corrupted copy
            shown = draw.inputs
        pred = model(shown.to(device)).float().cpu()
        middle = "encoder input" + (f" ({config.resolved_corruption})" if draw.inputs is not None else "")
    recon = _to_pixels(pred, x, config.target)
    hidden_pixels = _images(hidden.float(), config, image_shape).any(axis=-1)  # [N,H,W]
    return ReconstructionGrid(_images(x, config, image_shape), _images(shown, config, image_shape),
                              hidden_pixels, _images(recon, config, image_shape), config.objective,
                              config.target, middle)


def reconstruction_figure(model, config: Config, patches: torch.Tensor, image_shape, num_images: int = 8,
                          seed: int = 0) -> Figure:
    """The 3-row grid for the first ``num_images`` of ``patches [N,M,q]``, full text width."""
    return render(reconstruction_grid(model, config, patches, image_shape, num_images, seed))
