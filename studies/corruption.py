"""Denoising autoencoders over corruption kinds and levels (clean target, corrupted input).

Mirrors Vincent et al. (2008/2010) §2.3 and Goodfellow et al. §14.5: additive Gaussian noise,
masking noise and salt-and-pepper at two levels each, with the same encoder as the MAE.

    mae-study run corruption            # 3 kinds × 2 levels × 3 seeds = 18 trials
"""

from .study import Study

STUDY = Study(
    name="corruption",
    paper="Vincent et al. 2010, Table 3",
    base={"dataset": "digits", "objective": "dae", "steps": 1000},
    axes={"corruption": ["gaussian", "masking", "salt_pepper"], "corruption_level": [0.1, 0.3]},
    smoke_axes={"corruption": ["gaussian", "masking"], "corruption_level": [0.3]},
    # Config resolves a DAE's corruption to gaussian; 0.3 is the level the smoke grid also runs
    reference={"corruption": "gaussian", "corruption_level": 0.3},
    doc=__doc__,
)
