"""Fine-tuning's step sizes: layer-wise decay groups against a hand-computed example, the
warm-up + cosine trace, and fine-tuning following both."""

from __future__ import annotations

import math

import pytest
import torch

from evaluation.finetune_recipe import depends_on_length, finetune_lr, layer_groups, layer_id
from evaluation.probes import choose_finetune_steps, finetune_accuracy, validation_split
from mae_core import Config, build_model, prepare_data

# depth 2, one class token: every kind of encoder parameter is present
TWO_BLOCKS = dict(dataset="digits", encoder_width=16, encoder_depth=2, encoder_heads=2, decoder_width=8,
                  decoder_depth=1, decoder_heads=2, class_token=True, pos_embed="learned",
                  train_limit=120, test_limit=40, device="cpu")


@pytest.fixture(scope="module")
def two_blocks():
    config = Config(**TWO_BLOCKS)
    torch.manual_seed(0)
    return build_model(config), prepare_data(config)


def test_layer_ids_follow_maes_param_groups_lrd():
    depth = 2
    for name, layer in [("encoder.patch_embed.weight", 0), ("encoder.positions.table", 0),
                        ("encoder.cls_token", 0), ("encoder_mask_token", 0),
                        ("encoder.transformer.blocks.0.attn.qkv.weight", 1),
                        ("encoder.transformer.blocks.1.mlp.0.bias", 2),
                        ("encoder.transformer.norm.weight", 3), ("head.weight", 3),
                        ("decoder.blocks.0.norm1.weight", 3)]:  # the decoder's blocks are not the encoder's
        assert layer_id(name, depth) == layer, name


def test_layer_decay_groups_have_hand_computed_scales(two_blocks):
    """depth d = 2, decay 0.5: scale = 0.5^(d+1-layer): embeddings 1/8, block 0 1/4, block 1 1/2,
    final norm and head 1."""
    model, _ = two_blocks
    head = torch.nn.Linear(16, 10)
    named = list(model.encoder.named_parameters(prefix="encoder")) + list(head.named_parameters(prefix="head"))
    groups = layer_groups(named, depth=2, decay=0.5)
    assert [(g.layer, g.scale) for g in groups] == [(0, 0.125), (1, 0.25), (2, 0.5), (3, 1.0)]
    members = [{id(p) for p in g.params} for g in groups]
    encoder = model.encoder
    assert members[0] == {id(p) for p in (encoder.patch_embed.weight, encoder.patch_embed.bias,
                                           encoder.positions.table, encoder.cls_token)}
    assert members[1] == {id(p) for p in encoder.transformer.blocks[0].parameters()}
    assert members[2] == {id(p) for p in encoder.transformer.blocks[1].parameters()}
    assert members[3] == {id(p) for p in [*encoder.transformer.norm.parameters(), *head.parameters()]}
    # decay 1 (off): one group, every parameter in the given order
    (single,) = layer_groups(named, depth=None, decay=1.0)
    assert single.scale == 1.0 and [id(p) for p in single.params] == [id(p) for _, p in named]


@pytest.mark.parametrize("name", ["timm:vit_tiny_patch16_224", "timm:vit_medium_patch16_reg4_gap_256"])
def test_a_timm_encoders_layers_are_grouped_as_the_built_in_ones(name):
    """Patch embedding, positions, class and register tokens are layer 0; block i is i+1; the final norm d+1."""
    from conftest import timm_missing

    if timm_missing():
        pytest.skip(timm_missing())
    torch.manual_seed(0)
    encoder = build_model(Config(**{**TWO_BLOCKS, "encoder": name, "class_token": "reg4" not in name})).encoder
    groups = layer_groups(encoder.named_parameters(prefix="encoder"), depth=2, decay=0.5)
    members = [{id(p) for p in g.params} for g in groups]
    embeddings = [*encoder.patch_embed.parameters(), *encoder.positions.parameters(), *encoder.norm_pre.parameters()]
    embeddings += [t for t in (encoder.cls_token, encoder.reg_token) if t is not None]
    assert members[0] == {id(p) for p in embeddings}
    assert members[1] == {id(p) for p in encoder.transformer.blocks[0].parameters()}
    assert members[2] == {id(p) for p in encoder.transformer.blocks[1].parameters()}
    assert members[3] == {id(p) for p in encoder.transformer.norm.parameters()}


def test_warmup_then_cosine_trace():
    """10 updates, warm-up 0.2 (2 updates): peak·1/2, peak, then peak·(1+cos(π·j/8))/2 for j = 1..7."""
    trace = [finetune_lr(t, peak=1.0, total=10, warmup_fraction=0.2, schedule="cosine") for t in range(10)]
    expected = [0.5, 1.0] + [0.5 * (1 + math.cos(math.pi * j / 8)) for j in range(8)]
    assert trace == pytest.approx(expected)
    assert trace[2] == 1.0 and trace[-1] < 0.05
    assert [finetune_lr(t, peak=1e-3, total=10, warmup_fraction=0.0, schedule="constant")
            for t in range(10)] == [1e-3] * 10  # today's fine-tuning: exactly the peak
    assert not depends_on_length(0.0, "constant")
    assert depends_on_length(0.1, "constant") and depends_on_length(0.0, "cosine")


class _Recording(torch.optim.AdamW):
    """AdamW that records every group's step size at every update, and its parameters' starting values."""

    last: _Recording | None = None

    def __init__(self, params, **kwargs):
        super().__init__(params, **kwargs)
        self.lrs: list[list[float]] = []
        self.start = [[p.detach().clone() for p in g["params"]] for g in self.param_groups]
        _Recording.last = self

    def step(self, closure=None):
        self.lrs.append([g["lr"] for g in self.param_groups])
        return super().step(closure)


def _movement(params: list[torch.Tensor], start: list[torch.Tensor]) -> float:
    """Mean |change| of ``params`` from their ``start`` values."""
    return float(torch.cat([(p.detach() - s).abs().flatten() for p, s in zip(params, start)]).mean())


def test_finetuning_follows_the_decayed_schedule(two_blocks, monkeypatch):
    model, data = two_blocks
    monkeypatch.setattr(torch.optim, "AdamW", _Recording)
    finetune_accuracy(model, data, 5, seed=0, lr=1e-2, layer_decay=0.5, warmup_fraction=0.4, schedule="cosine")
    decayed = _Recording.last
    scales = [0.125, 0.25, 0.5, 1.0]
    assert len(decayed.lrs) == 5
    for t, lrs in enumerate(decayed.lrs):
        rate = finetune_lr(t, peak=1e-2, total=5, warmup_fraction=0.4, schedule="cosine")
        assert lrs == pytest.approx([rate * s for s in scales]), t
    finetune_accuracy(model, data, 5, seed=0, lr=1e-2, warmup_fraction=0.4, schedule="cosine")
    flat = _Recording.last
    (group,) = flat.param_groups
    # What decay changes: the embeddings move far less than without it (AdamW's step is about
    # the step size per weight, so about 1/8 here); the head (the last two) is not slowed.
    names = [name for name, _ in model.named_parameters()]  # the deep copy keeps this order
    embeddings = [i for i, name in enumerate(names) if layer_id(name, 2) == 0]
    assert [group["params"][i].shape for i in embeddings] == [p.shape for p in decayed.param_groups[0]["params"]]
    decayed_embeddings = _movement(decayed.param_groups[0]["params"], decayed.start[0])
    flat_embeddings = _movement([group["params"][i] for i in embeddings], [flat.start[0][i] for i in embeddings])
    assert decayed_embeddings < 0.5 * flat_embeddings
    head = slice(-2, None)
    decayed_head = _movement(decayed.param_groups[-1]["params"][head], decayed.start[-1][head])
    assert decayed_head > 0.5 * _movement(group["params"][head], flat.start[0][head])


def test_scratch_length_search_with_a_schedule_trains_each_length_alone(two_blocks):
    """With warm-up or cosine the step size at t depends on the run's length, so the score at n
    updates is that of a run of exactly n updates (not a prefix of the longest)."""
    model, data = two_blocks
    choice = validation_split(data.train_labels.numpy(), 0.2, seed=0).choice_data(data)
    options = dict(seed=0, num_classes=10, warmup_fraction=0.5, schedule="cosine")
    steps, accuracy = choose_finetune_steps(model, choice, (2, 4), **options)
    assert accuracy == finetune_accuracy(model, choice, steps, **options)
