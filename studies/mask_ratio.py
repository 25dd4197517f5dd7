"""Mask ratio sweep: masked risk, reconstruction and probes as ρ goes from 0.1 to 0.9.

Mirrors MAE Figure 5 (He et al.): fine-tuning and linear probing against the masking ratio,
which peaked near ρ = 0.75 on ImageNet. On digits (8×8, patch 2: M=16) the visible count is
k = int(16·(1-ρ)), so the effective ratios are 0.125, 0.25, 0.5, 0.75 and 0.9375.

    mae-study run mask_ratio            # 5 ratios × 3 seeds = 15 trials, under 10 minutes on 2 cores
    mae-study run mask_ratio --smoke    # seconds
"""

from .study import Study

STUDY = Study(
    name="mask_ratio",
    paper="MAE Figure 5",
    base={"dataset": "digits", "steps": 700},  # keeps `make demo` under ten minutes on two cores
    axes={"mask_ratio": [0.1, 0.25, 0.5, 0.75, 0.9]},
    seeds=(0, 1, 2),
    smoke_axes={"mask_ratio": [0.25, 0.75]},
    reference={"mask_ratio": 0.75},  # MAE's default and the Config default
    evaluation={"finetune_steps": 200},  # MAE Figure 5 sets fine-tuning beside the linear probe
    doc=__doc__,
)
