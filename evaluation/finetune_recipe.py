"""Fine-tuning's step sizes: which parameter learns how fast (layer-wise decay) and when (the schedule).

Layer-wise learning-rate decay is MAE's fine-tuning recipe (He et al. appendix A.1, after BEiT;
their ``util/lr_decay.py``): with an encoder of ``d`` blocks, the embeddings (patch embedding,
positions, class token) are layer 0, block ``i`` (counted from 0) is layer ``i+1``, and what
reads the last block (its final norm, the classifier head) is layer ``d+1``. A parameter of
layer ``l`` learns at ``decay^(d+1-l)`` times the step size: the head at the full step size, the
patch embedding at ``decay^(d+1)``, so the lower, more generic layers move least. ``decay = 1``
is one group at one step size (today's fine-tuning). Weight decay is left as AdamW's default
for every group (MAE also exempts norms and biases; the harness's fine-tuning never did).

The schedule is the trainer's (:func:`mae_core.optimizer.learning_rate`): linear warm-up over
``warmup_fraction`` of the run, then constant or cosine to 0 at its last update.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass

from torch import nn

from mae_core.optimizer import learning_rate

# Parameter names of the models (MaskedAutoencoder, BottleneckAutoencoder) around either encoder
# (mae_core.encoders.Encoder: the built-in ViT, or timm's, whose register tokens and pre-norm
# are embeddings too).
BLOCKS = "encoder.transformer.blocks."
EMBEDDINGS = ("encoder.patch_embed.", "encoder.positions.", "encoder.cls_token", "encoder_mask_token",
              "encoder.reg_token", "encoder.norm_pre.")


def layer_id(name: str, depth: int) -> int:
    """The layer of the parameter called ``name`` in an encoder of ``depth`` blocks: 0 for the
    embeddings, ``i+1`` for block ``i``, ``depth+1`` for the rest (final norm, head)."""
    if name.startswith(BLOCKS):
        return int(name[len(BLOCKS):].split(".", 1)[0]) + 1
    if name.startswith(EMBEDDINGS):
        return 0
    return depth + 1


def layer_scale(layer: int, depth: int, decay: float) -> float:
    """``decay^(depth+1-layer)``: the factor on the step size of that layer's parameters."""
    return decay ** (depth + 1 - layer)


@dataclass(frozen=True)
class LayerGroup:
    layer: int
    scale: float  # step size = scale × the scheduled step size
    params: list[nn.Parameter]


def layer_groups(named: Iterable[tuple[str, nn.Parameter]], depth: int | None, decay: float) -> list[LayerGroup]:
    """The parameters ``(name, parameter)`` grouped by layer, lowest layer first, each with its
    scale; ``decay == 1`` gives one group of every parameter in the given order (``depth`` may
    then be None: a model without the built-in block names fine-tunes as before)."""
    named = list(named)
    if decay == 1.0:
        return [LayerGroup(layer=0, scale=1.0, params=[p for _, p in named])]
    if depth is None:
        raise ValueError("layer-wise decay needs the encoder's depth")
    by_layer: dict[int, list[nn.Parameter]] = {}
    for name, parameter in named:
        by_layer.setdefault(layer_id(name, depth), []).append(parameter)
    return [LayerGroup(layer, layer_scale(layer, depth, decay), by_layer[layer]) for layer in sorted(by_layer)]


def finetune_lr(step: int, *, peak: float, total: int, warmup_fraction: float, schedule: str) -> float:
    """The step size of update ``step`` (from 0) of a ``total``-update fine-tuning run."""
    return learning_rate(step, peak=peak, warmup_steps=int(warmup_fraction * total), total_steps=total,
                         schedule=schedule)


def depends_on_length(warmup_fraction: float, schedule: str) -> bool:
    """Whether the step size at update t depends on the run's length (warm-up or cosine): then a
    model trained for n updates is not a prefix of a longer run, and every length is its own run."""
    return warmup_fraction > 0 or schedule != "constant"
