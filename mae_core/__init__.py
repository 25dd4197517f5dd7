"""mae_core: the specification's masked autoencoder, autoencoder and denoising autoencoder.

No Ray and no MLflow here: this is the engine the studies drive.

The public names are loaded on first use (PEP 562): most of the engine imports torch, which
takes seconds, and ``mae-study --help`` or ``mae-study config`` need only the typed config.
"""

from __future__ import annotations

import importlib
import sys
import types
from typing import TYPE_CHECKING, Any

# public name -> the submodule that defines it
_EXPORTS: dict[str, str] = {
    **dict.fromkeys(("Config", "ConfigError"), "config"),
    **dict.fromkeys(("CORRUPTIONS", "FiniteCorruptionLaw", "corrupt", "finite_corruption_law"), "corruptions"),
    **dict.fromkeys(("MASK_SAMPLINGS", "all_visible_sets", "num_visible_for", "sample_visible"), "masking"),
    **dict.fromkeys(("BottleneckAutoencoder", "MaskedAutoencoder", "build_model"), "models"),
    **dict.fromkeys(("RiskEstimate", "empirical_den_risk", "empirical_mae_risk", "empirical_rec_risk",
                     "masked_mse", "mean_pixel_baseline_risk", "reconstruction_mse"), "objectives"),
    **dict.fromkeys(("PatchSizeError", "patchify", "unpatchify"), "patches"),
    **dict.fromkeys(("TARGETS", "NormDomainError", "apply_target"), "targets"),
    **dict.fromkeys(("PatchData", "prepare_data"), "data"),
    "NonFiniteError": "updates",
    "train": "train",
}

__all__ = sorted(_EXPORTS)
# read from the registries on every access: a plugin loaded later adds its names
_LIVE = frozenset(("CORRUPTIONS", "MASK_SAMPLINGS", "TARGETS"))


def __getattr__(name: str) -> Any:
    """Import the submodule that defines ``name`` the first time it is asked for."""
    module = _EXPORTS.get(name)
    if module is None:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    value = getattr(importlib.import_module(f".{module}", __name__), name)
    if name not in _LIVE:
        globals()[name] = value  # later lookups skip this function
    return value


def __dir__() -> list[str]:
    return sorted({*globals(), *_EXPORTS})


class _Package(types.ModuleType):
    """``mae_core.train`` names both a submodule and the function it defines. Importing the
    submodule binds the module to the package's attribute; the function is what
    ``from mae_core import train`` has always given, so the function is kept there."""

    def __setattr__(self, name: str, value: Any) -> None:
        if name == "train" and isinstance(value, types.ModuleType) and hasattr(value, "train"):
            value = value.train
        super().__setattr__(name, value)


sys.modules[__name__].__class__ = _Package


if TYPE_CHECKING:  # what type checkers and IDEs see: the same names, imported eagerly
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
    from .data import PatchData, prepare_data
    from .train import train
    from .updates import NonFiniteError
