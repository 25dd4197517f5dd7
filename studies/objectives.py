"""Plain autoencoder vs denoising autoencoder vs MAE: same encoder, same training budget.

The comparison the spec sets up: R_rec (AE), R_den (DAE) and R_MAE (MAE) with identical ViT
encoders, steps and batch size. Only the probes compare across objectives; each risk is
defined for its own objective.

    mae-study run objectives            # 3 objectives × 3 seeds = 9 trials
"""

from .study import Study

STUDY = Study(
    name="objectives",
    paper="spec: R_rec vs R_den vs R_MAE",
    base={"dataset": "digits", "steps": 1000},
    axes={"objective": ["ae", "dae", "mae"]},
    reference={"objective": "mae"},
    doc=__doc__,
)
