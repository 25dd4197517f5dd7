"""Mask sampling: the spec's uniform random masks vs block-wise vs regular grid masks.

Mirrors MAE Table 1f (He et al.): random sampling worked best; block masking at 75% was
too hard, grid sampling too easy. ``block`` and ``grid`` are not the spec's Uniform(V_k).
Masked risk is always evaluated under the spec's uniform law.

    mae-study run mask_sampling         # 3 samplers × 3 seeds = 9 trials
"""

from .study import Study

STUDY = Study(
    name="mask_sampling",
    paper="MAE Table 1f",
    base={"dataset": "digits", "steps": 1000},
    axes={"mask_sampling": ["random", "block", "grid"]},
    reference={"mask_sampling": "random"},  # the spec's Uniform(V_k)
    doc=__doc__,
)
