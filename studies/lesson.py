"""The MAE lesson (seed 001) as a study: shapes, mask ratios against the mean-pixel baseline.

Seed 001 trains a small MAE (width 32, 2 blocks; decoder 16 wide, 1 block; Adam 1e-3; 600
full-batch steps on 400 plus/circle images) at ρ = 0.25, 0.5, 0.75, compares the masked test
error with the mean-pixel baseline, then probes the frozen ρ = 0.75 encoder with 8 labelled
examples against a random encoder over 5 seeds (it found MAE *worse* than random). Its
exercises: ρ = 0.9, and fine-tuning end to end on the same 8 labelled examples against the
frozen probe (both here: the ρ = 0.9 cell, and ``finetune_acc`` beside ``random_finetune_acc``
with ``finetune_shots=4``). The third exercise, a decoder larger than the encoder, is
``mae-study run lesson decoder_width=64 decoder_depth=3``.

    mae-study run lesson                # 4 ratios × 5 seeds = 20 trials
"""

from .study import Study

STUDY = Study(
    name="lesson",
    paper="seed 001 (MAE lesson)",
    base={"dataset": "shapes", "encoder_width": 32, "encoder_depth": 2, "encoder_heads": 4,
          "decoder_width": 16, "decoder_depth": 1, "decoder_heads": 4, "mlp_ratio": 2.0,
          "lr": 1e-3, "optimizer": "adamw", "weight_decay": 0.0, "schedule": "constant",
          "warmup_fraction": 0.0, "batch_size": 256, "steps": 600},
    axes={"mask_ratio": [0.25, 0.5, 0.75, 0.9]},
    seeds=(0, 1, 2, 3, 4),
    smoke_axes={"mask_ratio": [0.75]},
    reference={"mask_ratio": 0.75},  # the ratio whose encoder the lesson probes
    # 4 per class = the lesson's 8 labelled examples, for the frozen probe and for fine-tuning
    evaluation={"fewshot": 4, "finetune_steps": 200, "finetune_shots": 4},
    doc=__doc__,
)
