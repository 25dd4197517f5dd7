"""The built-in objectives as classes (solo-learn's methods): each owns what its updates draw
beside ``I_t``, its loss ``L_t`` and the test risks it is judged by.

The definitions are the spec's (/work/shared/seeds/000_db022355b4c18074.txt):

* :class:`MAE`: step 1 draws ``V_t ~ Uniform(V_k)``; step 3's ``L_t`` is ``ℓ_MAE``, the mean
  squared error over the masked positions ``[M] \\ V_t`` only, divided by ``(M-k)q``; judged by
  ``R_MAE^emp`` (and, as a diagnostic, its error with every patch visible).
* :class:`AE`: nothing drawn; the full-image error of ``R_rec`` (all ``M`` positions, ``/Mq``).
* :class:`DAE`: a fresh corruption ``X̃`` of the images each update (a stochastic denoising
  corruption; Vincent et al. eq. 5), the encoder reads ``X̃`` and the loss is against the clean
  target, as in ``R_den``; judged by ``R_rec^emp`` and ``R_den^emp``.

Shapes: ``B`` images, ``M`` patches, ``k`` visible, ``q`` values each. torch and the arithmetic
modules are imported when a method first runs: the registry's names stay readable without torch
(``mae-study config``).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from .registry import Objective, objective

if TYPE_CHECKING:
    import torch


@dataclass(frozen=True)
class Draw:
    """What update t draws beside ``I_t``: ``visible`` ``V_t`` ``[B,k]`` (None: the encoder
    sees every patch) and ``inputs`` the encoder's input ``[B,M,q]`` (None: the clean patches)."""

    visible: torch.Tensor | None = None
    inputs: torch.Tensor | None = None

    def rows(self, rows: slice) -> Draw:
        """This rank's rows of a draw for the global batch."""
        return Draw(None if self.visible is None else self.visible[rows],
                    None if self.inputs is None else self.inputs[rows])

    def to(self, device: Any) -> Draw:
        """``V_t`` on ``device`` (queued, not waited for); the inputs are drawn there already."""
        return Draw(None if self.visible is None else self.visible.to(device, non_blocking=True), self.inputs)


class Reconstruction(Objective):
    """The bottleneck pair on every patch: the shared predictions and full-image error of the AE
    and the DAE (spec, ``R_rec`` and ``R_den``: ``(Mq)⁻¹ Σ_j ||D(E(input))_j - T(x_j)||²``)."""

    def draw_ahead(self, config, sampler, batch_size) -> Draw:
        return Draw()

    def example_loss(self, pred, target, draw: Draw):
        """Per-example loss ``[B]`` of the predictions ``[B,M,d]`` against ``T(clean)``."""
        from .objectives import reconstruction_mse

        return reconstruction_mse(pred, target)

    def loss(self, predict, clean, target, draw: Draw):
        """``L_t``: the batch mean of :meth:`example_loss` of the encoder's input's reconstruction."""
        return self.example_loss(predict(clean if draw.inputs is None else draw.inputs), target, draw).mean()

    def risk_names(self) -> tuple[str, ...]:
        return ("test_rec_risk",)

    def risks(self, model, config, test) -> dict[str, float]:
        """``R_rec^emp`` (spec: the empirical reconstruction risk on uncorrupted images)."""
        from .objectives import empirical_rec_risk

        return {"test_rec_risk": empirical_rec_risk(model, test, config.target)}


@objective("mae", label="MAE")  # the labels are MAE Table 1d's words, as figures write them
class MAE(Objective):
    """masked risk: the encoder sees k visible patches, the loss the masked ones"""

    masked = True

    def draw_ahead(self, config, sampler, batch_size) -> Draw:
        """``V_t`` of each image, uniform over ``V_k`` (or the configured sampler), from the run's sampler."""
        from .masking import sample_visible

        return Draw(visible=sample_visible(batch_size, config.num_patches, config.num_visible, sampler,
                                           config.mask_sampling, config.grid))

    def example_loss(self, pred, target, draw: Draw):
        """``ℓ_MAE`` per example ``[B]``: only the masked positions enter, divided by ``(M-k)d``."""
        from .objectives import masked_mse

        return masked_mse(pred, target, draw.visible)

    def loss(self, predict, clean, target, draw: Draw):
        """``L_t``: the batch mean of ``ℓ_MAE`` at ``V_t`` (spec, step 3)."""
        return self.example_loss(predict(clean, draw.visible), target, draw).mean()

    def risk_names(self) -> tuple[str, ...]:
        return ("test_mae_risk", "test_allvisible_rec_risk")

    def risks(self, model, config, test) -> dict[str, float]:
        """``R_MAE^emp`` at the trial's k (exact when ``C(M,k)`` fits the budget) and, as a
        diagnostic, the error with every patch visible (``k = M`` lies outside ``V_k``: not a risk
        of the MAE, so it never stands in for one)."""
        import torch

        from .objectives import empirical_mae_risk, empirical_rec_risk

        all_visible = empirical_rec_risk(model, test, config.target)
        risk = empirical_mae_risk(
            model, test, config.num_visible, config.target, masks="exact",
            generator=torch.Generator().manual_seed(config.eval_seed + 2),
            exact_budget=config.risk_exact_budget, mc_masks=config.risk_mc_masks,
        )
        return {"test_allvisible_rec_risk": all_visible, "test_mae_risk": risk.value,
                "test_mae_risk_stderr": risk.stderr, "test_mae_risk_masks": float(risk.num_masks)}


@objective("ae", label="AE")
class AE(Reconstruction):
    """reconstruction risk: the bottleneck pair on every patch"""


@objective("dae", label="DAE")
class DAE(Reconstruction):
    """denoising risk: the bottleneck pair on a corrupted copy"""

    corrupted = True
    reads_images = True
    capture_blocker = "draws its corruption per update, not ahead into fixed buffers"

    def draw(self, clean, config, sampler, noise, batch_size=None) -> Draw:
        """``X̃``, a fresh corruption of the images, drawn from ``noise`` beside them."""
        from .corruptions import corrupt

        return Draw(inputs=corrupt(clean, config.resolved_corruption, config.corruption_level, noise))

    def noise_generator(self, config, device, sampler):
        """Where ``X̃`` is drawn: on the CPU from the run's sampler (after I_t, as before issue
        26: every CPU number unchanged), on any other device from a generator of its own there,
        seeded ``seed_masks + 2`` (the sampler is ``seed_masks + 1``), so the noise is drawn beside
        the images with no host sync. That generator's state is checkpointed (``noise``), so a
        resumed run draws the noise the uninterrupted one would have. The spec allows either: a
        stochastic denoising corruption is any random image on the same probability space as X,
        its dependence arbitrary (spec, population denoising risk)."""
        import torch

        if device.type == "cpu":
            return sampler
        return torch.Generator(device).manual_seed(config.masks_seed + 2)

    def risk_names(self) -> tuple[str, ...]:
        return (*super().risk_names(), "test_den_risk")

    def risks(self, model, config, test) -> dict[str, float]:
        """``R_rec^emp`` and ``R_den^emp`` over the finite law of ``corruption_copies`` seeded
        copies (spec: the empirical denoising risk of a finite corruption law)."""
        from .corruptions import finite_corruption_law
        from .objectives import empirical_den_risk

        # the law is drawn on the host (its seeded CPU generator); the risk moves it once
        law = finite_corruption_law(test.cpu(), config.resolved_corruption, config.corruption_level,
                                    config.corruption_copies, seed=config.eval_seed + 3)
        return {**super().risks(model, config, test), "test_den_risk": empirical_den_risk(model, test, law, config.target)}
