"""Reconstruction grids from arrays: original / encoder input / reconstruction, one column per image.

No torch here: a trial computes the arrays (:mod:`evaluation.reconstructions`) and logs them as
``reconstructions.npz``; the report (``analysis``) reads them back and renders the grid at print
size, as vector PDF and PNG, from the MLflow store alone. The trial renders the same grid for
MLflow's UI, so both show the same thing.

Masked patches are drawn in :data:`MASK_COLOUR`, a colour no grey-level image contains (grey 0.5
is also a real pixel value of a digit or a photo).
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path

import matplotlib

matplotlib.use("Agg")  # files only; reports run on machines without a screen
import matplotlib.pyplot as plt
import numpy as np
from matplotlib.figure import Figure

ARTIFACT = "reconstructions.npz"  # the artifact name a trial logs, and the report reads
MASK_COLOUR = (0.337, 0.706, 0.914)  # Okabe-Ito sky blue (#56B4E9): colour-blind safe, not a grey
MASK_COLOUR_NAME = "blue"
FONT_PT = 7  # row titles, at the printed width
_GAP = 0.03  # inches between images
_TITLE = 0.14  # inches above each row for its title


@dataclass(frozen=True)
class ReconstructionGrid:
    """The images of one grid, pixels in [0, 1] except where a reconstruction overshoots.

    ``original``, ``shown`` and ``reconstruction`` are ``[N,H,W,C]``; ``hidden`` is ``[N,H,W]``
    (True where the encoder saw nothing: the masked patches of an MAE, all False otherwise).
    ``denormalised``: the reconstruction was predicted in a normalised target space and mapped
    back to pixels with each patch's own mean and scale (taken from the original image).
    """

    original: np.ndarray
    shown: np.ndarray
    hidden: np.ndarray
    reconstruction: np.ndarray
    objective: str  # mae | ae | dae
    target: str  # raw | norm | norm_eps
    middle: str  # the middle row's title, e.g. "encoder input (75% masked)"

    @property
    def denormalised(self) -> bool:
        return self.target != "raw"


def save_npz(grid: ReconstructionGrid, path: Path) -> Path:
    """Write ``grid`` as a compressed ``.npz`` (arrays float32, the rest as one JSON string)."""
    meta = {"objective": grid.objective, "target": grid.target, "middle": grid.middle}
    np.savez_compressed(path, original=grid.original.astype(np.float32), shown=grid.shown.astype(np.float32),
                        hidden=grid.hidden.astype(bool), reconstruction=grid.reconstruction.astype(np.float32),
                        meta=np.array(json.dumps(meta)))
    return Path(path)


def load_npz(path: Path) -> ReconstructionGrid:
    """The grid :func:`save_npz` wrote (no pickles are read)."""
    with np.load(path, allow_pickle=False) as data:
        meta = json.loads(str(data["meta"]))
        return ReconstructionGrid(data["original"], data["shown"], data["hidden"], data["reconstruction"],
                                  meta["objective"], meta["target"], meta["middle"])


def _rgb(images: np.ndarray) -> np.ndarray:
    """``[N,H,W,C]`` (C = 1 or 3) -> ``[N,H,W,3]`` clipped to [0, 1] for display."""
    images = np.clip(images, 0.0, 1.0)
    return np.repeat(images, 3, axis=-1) if images.shape[-1] == 1 else images


def rows(grid: ReconstructionGrid) -> list[tuple[str, np.ndarray]]:
    """(title, ``[N,H,W,3]`` RGB) per row; the middle row has its hidden pixels in the mask colour."""
    middle = _rgb(grid.shown).copy()
    middle[grid.hidden] = MASK_COLOUR
    reconstruction = "reconstruction" + (" (de-normalised)" if grid.denormalised else "")
    return [("original", _rgb(grid.original)), (grid.middle, middle),
            (reconstruction, _rgb(grid.reconstruction))]


def render(grid: ReconstructionGrid, width: float = 7.0) -> Figure:
    """The 3-row grid ``width`` inches wide (height follows: square images, a title per row).

    Laid out by hand (no tight/constrained layout), so the file is exactly ``width`` wide and
    the images are exact pixels (``interpolation="none"``: PDF viewers get the raw pixels).
    """
    count = grid.original.shape[0]
    cell = (width - (count - 1) * _GAP) / count
    height = 3 * (_TITLE + cell) + _GAP
    fig = plt.figure(figsize=(width, height))
    for r, (title, images) in enumerate(rows(grid)):
        top = height - r * (_TITLE + cell)
        fig.text(0, (top - 0.02) / height, title, ha="left", va="top", fontsize=FONT_PT)
        for c in range(count):
            rect = (c * (cell + _GAP) / width, (top - _TITLE - cell) / height, cell / width, cell / height)
            ax = fig.add_axes(rect)
            ax.imshow(images[c], interpolation="none", vmin=0, vmax=1)
            ax.set_axis_off()
    return fig


def caption_note(grid: ReconstructionGrid) -> str:
    """The sentences a caption needs to read the grid right."""
    parts = []
    if grid.hidden.any():
        parts.append(f"Masked patches (never seen by the encoder) are drawn in {MASK_COLOUR_NAME}.")
    if grid.denormalised:
        parts.append(f"The model predicts the {grid.target} target (each patch normalised); its "
                     f"reconstructions are shown de-normalised with each patch's own mean and "
                     f"standard deviation, taken from the original image, as He et al. display them.")
    parts.append("Pixel values are clipped to [0, 1] for display.")
    return " ".join(parts)


def close(fig: Figure) -> None:
    plt.close(fig)
