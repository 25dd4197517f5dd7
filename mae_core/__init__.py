"""mae_core: the specification's masked autoencoder, autoencoder and denoising autoencoder.

No Ray and no MLflow here: this is the engine the studies drive.
"""

from .config import Config, ConfigError
from .corruptions import CORRUPTIONS, FiniteCorruptionLaw, corrupt, finite_corruption_law
from .masking import MASK_SAMPLINGS, all_visible_sets, num_visible_for, sample_visible
from .models import BottleneckAutoencoder, MaskedAutoencoder, build_model
from .objectives import (
    RiskEstimate,
    empirical_den_risk,
    empirical_mae_risk,
    empirical_rec_risk,
    masked_mse,
    mean_pixel_baseline_risk,
    reconstruction_mse,
)
from .patches import PatchSizeError, patchify, unpatchify
from .targets import TARGETS, NormDomainError, apply_target
from .train import NonFiniteError, PatchData, prepare_data, train

__all__ = [
    "CORRUPTIONS", "MASK_SAMPLINGS", "TARGETS",
    "BottleneckAutoencoder", "Config", "ConfigError", "FiniteCorruptionLaw", "MaskedAutoencoder",
    "NonFiniteError", "NormDomainError", "PatchData", "PatchSizeError", "RiskEstimate",
    "all_visible_sets", "apply_target", "build_model", "corrupt", "empirical_den_risk",
    "empirical_mae_risk", "empirical_rec_risk", "finite_corruption_law", "masked_mse",
    "mean_pixel_baseline_risk", "num_visible_for", "patchify", "prepare_data",
    "reconstruction_mse", "sample_visible", "train", "unpatchify",
]
