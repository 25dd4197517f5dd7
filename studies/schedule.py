"""Training length: 250, 500, 1000 and 2000 updates at ρ = 0.75.

Mirrors MAE Figure 7 (He et al.): accuracy kept improving with longer pretraining.

    mae-study run schedule              # 4 lengths × 3 seeds = 12 trials
"""

from .study import Study

STUDY = Study(
    name="schedule",
    paper="MAE Figure 7",
    base={"dataset": "digits"},
    axes={"steps": [250, 500, 1000, 2000]},
    smoke_axes={"steps": [20, 40]},
    reference={"steps": 2000},  # the Config default, the longest schedule
    doc=__doc__,
)
