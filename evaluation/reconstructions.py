"""Reconstruction grids: original / what the encoder saw / reconstruction, one column per image."""

from __future__ import annotations

import matplotlib

matplotlib.use("Agg")  # files only; reports run on machines without a screen
import matplotlib.pyplot as plt
import torch
from matplotlib.figure import Figure

from mae_core.config import Config
from mae_core.corruptions import corrupt
from mae_core.masking import masked_positions, sample_visible
from mae_core.patches import unpatchify
from mae_core.targets import target_moments


def _to_pixels(patches: torch.Tensor, reference: torch.Tensor, target: str) -> torch.Tensor:
    """Predictions in target space back to pixel space: a normalised target is shown with each
    patch's own mean and scale (as He et al.'s visualisations do), the inverse of ``T``."""
    if target == "raw":
        return patches
    mean, scale = target_moments(reference, target)
    return patches * scale + mean


@torch.inference_mode()
def reconstruction_figure(model, config: Config, patches: torch.Tensor, image_shape, num_images: int = 8,
                          seed: int = 0) -> Figure:
    """A 3-row grid for the first ``num_images`` of ``patches [N,M,q]``."""
    x = patches[:num_images]
    generator = torch.Generator().manual_seed(seed)
    shown = x.clone()
    if config.objective == "mae":
        visible = sample_visible(x.shape[0], x.shape[1], config.num_visible, generator,
                                 config.mask_sampling, config.grid)
        device = next(model.parameters()).device
        pred = model(x.to(device), visible.to(device)).float().cpu()
        hidden = masked_positions(visible, x.shape[1])
        shown[hidden] = 0.5  # grey where the encoder saw nothing
        middle = f"encoder input ({config.effective_mask_ratio:.0%} masked)"
    else:
        if config.objective == "dae":
            shown = corrupt(x, config.resolved_corruption, config.corruption_level, generator)
        device = next(model.parameters()).device
        pred = model(shown.to(device)).float().cpu()
        middle = "encoder input" + (f" ({config.resolved_corruption})" if config.objective == "dae" else "")
    recon = _to_pixels(pred, x, config.target)
    rows = [("original", x), (middle, shown), ("reconstruction", recon)]
    channels = image_shape[0]
    fig, axes = plt.subplots(3, x.shape[0], figsize=(1.1 * x.shape[0], 3.6), squeeze=False)
    for r, (title, values) in enumerate(rows):
        images = unpatchify(values, config.resolved_patch_size, image_shape).clamp(0, 1)
        for c in range(x.shape[0]):
            ax = axes[r, c]
            image = images[c].permute(1, 2, 0).numpy()
            ax.imshow(image[..., 0] if channels == 1 else image, cmap="gray" if channels == 1 else None,
                      vmin=0, vmax=1, interpolation="nearest")
            ax.set_xticks([]), ax.set_yticks([])
            if c == 0:
                ax.set_ylabel(title, fontsize=7)
    fig.tight_layout()
    return fig


def close(fig: Figure) -> None:
    plt.close(fig)


