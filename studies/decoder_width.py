"""Decoder width: 16, 32, 64 and 128 channels behind the same encoder.

Mirrors MAE Table 1b (He et al.): 512-d was the default; narrower decoders cost a little.

    mae-study run decoder_width         # 4 widths × 3 seeds = 12 trials
"""

from .study import Study

STUDY = Study(
    name="decoder_width",
    paper="MAE Table 1b",
    base={"dataset": "digits", "steps": 1000},
    axes={"decoder_width": [16, 32, 64, 128]},
    smoke_axes={"decoder_width": [16, 32]},
    reference={"decoder_width": 32},  # the Config default (MAE's 512 is for ViT-L on ImageNet)
    doc=__doc__,
)
