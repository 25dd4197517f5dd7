"""Reconstruction-side metrics of a trained model on the held-out split."""

from __future__ import annotations

import torch
from torch import nn

from mae_core.config import Config
from mae_core.corruptions import finite_corruption_law
from mae_core.objectives import (
    empirical_den_risk,
    empirical_mae_risk,
    empirical_rec_risk,
    mean_pixel_baseline_risk,
)
from mae_core.data import PatchData


def reconstruction_metrics(model: nn.Module, config: Config, data: PatchData) -> dict[str, float]:
    """The test metrics of the MLflow contract that concern reconstruction.

    ``test_mae_risk`` (``R_MAE^emp`` at the trial's k; exact when ``C(M,k)`` fits the budget)
    exists for the MAE only: the AE/DAE encoder is not a masked encoder, so the spec defines no
    masked risk for it. ``test_rec_risk`` is the AE's and DAE's ``R_rec^emp``; an MAE's error
    with every patch visible (``k = M``, outside ``V_k``: not one of its risks) is logged as
    ``test_allvisible_rec_risk``, a diagnostic that never stands in for a risk.
    ``test_den_risk`` is ``R_den^emp`` over the finite law of ``corruption_copies`` seeded copies.
    """
    test = data.test_patches
    # The risks run on the model's device: the test split goes there once, not once per risk.
    parameter = next(model.parameters(), None)
    on_model = test if parameter is None else test.to(parameter.device)
    all_visible = empirical_rec_risk(model, on_model, config.target)
    metrics: dict[str, float] = {
        "test_baseline_risk": mean_pixel_baseline_risk(data.train_patches, test, config.target),
        "test_allvisible_rec_risk" if config.objective_spec.masked else "test_rec_risk": all_visible,
    }
    if config.objective_spec.masked:
        risk = empirical_mae_risk(
            model, on_model, config.num_visible, config.target, masks="exact",
            generator=torch.Generator().manual_seed(config.eval_seed + 2),
            exact_budget=config.risk_exact_budget, mc_masks=config.risk_mc_masks,
        )
        metrics.update(test_mae_risk=risk.value, test_mae_risk_stderr=risk.stderr,
                       test_mae_risk_masks=float(risk.num_masks))
    if config.objective_spec.corrupted:
        # the law is drawn on the host (its seeded CPU generator); the risk moves it once
        law = finite_corruption_law(test, config.resolved_corruption, config.corruption_level,
                                    config.corruption_copies, seed=config.eval_seed + 3)
        metrics["test_den_risk"] = empirical_den_risk(model, on_model, law, config.target)
    return metrics
