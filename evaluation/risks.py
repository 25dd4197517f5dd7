"""Reconstruction-side metrics of a trained model on the held-out split."""

from __future__ import annotations

from torch import nn

from mae_core.config import Config
from mae_core.data import PatchData
from mae_core.objectives import mean_pixel_baseline_risk


def reconstruction_metrics(model: nn.Module, config: Config, data: PatchData) -> dict[str, float]:
    """The test metrics of the MLflow contract that concern reconstruction.

    ``test_mae_risk`` (``R_MAE^emp`` at the trial's k; exact when ``C(M,k)`` fits the budget)
    exists for the MAE only: the AE/DAE encoder is not a masked encoder, so the spec defines no
    masked risk for it. ``test_rec_risk`` is the AE's and DAE's ``R_rec^emp``; an MAE's error
    with every patch visible (``k = M``, outside ``V_k``: not one of its risks) is logged as
    ``test_allvisible_rec_risk``, a diagnostic that never stands in for a risk.
    ``test_den_risk`` is ``R_den^emp`` over the finite law of ``corruption_copies`` seeded copies.
    Which risks a trial logs is its objective's (:meth:`mae_core.registry.Objective.risks`).
    """
    test = data.test_patches
    # The risks run on the model's device: the test split goes there once, not once per risk.
    parameter = next(model.parameters(), None)
    on_model = test if parameter is None else test.to(parameter.device)
    return {"test_baseline_risk": mean_pixel_baseline_risk(data.train_patches, test, config.target),
            **config.objective_spec.risks(model, config, on_model)}
