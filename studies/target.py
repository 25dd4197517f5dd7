"""Reconstruction target: raw pixels vs the spec's strict T_norm vs He et al.'s norm_eps.

Mirrors MAE Table 1d (He et al.): per-patch normalised pixels improved accuracy. Runs on the
photo crops (RGB 32×32, patch 4: M=64), which lie inside D_norm so strict ``norm`` is defined.
Risks are in each target's own space, so compare them across targets only through the probes.

    mae-study run target                # 3 targets × 3 seeds = 9 trials
"""

from .study import Study

STUDY = Study(
    name="target",
    paper="MAE Table 1d",
    base={"dataset": "photos", "steps": 600, "test_limit": 200},
    axes={"target": ["raw", "norm", "norm_eps"]},
    reference={"target": "raw"},  # the Config default
    doc=__doc__,
)
