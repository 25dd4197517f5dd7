"""Decoder depth: 1, 2, 4 and 8 transformer blocks behind the same encoder.

Mirrors MAE Table 1a (He et al.): a deeper decoder helped linear probing (by up to 8 points)
and barely changed fine-tuning.

    mae-study run decoder_depth         # 4 depths × 3 seeds = 12 trials
"""

from .study import Study

STUDY = Study(
    name="decoder_depth",
    paper="MAE Table 1a",
    base={"dataset": "digits", "steps": 1000},
    axes={"decoder_depth": [1, 2, 4, 8]},
    smoke_axes={"decoder_depth": [1, 2]},
    reference={"decoder_depth": 2},  # the Config default (MAE's 8 is for ViT-L on ImageNet)
    doc=__doc__,
)
