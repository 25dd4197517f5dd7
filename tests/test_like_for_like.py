"""Like-for-like baselines (issue 24): the pretrained model's fine-tuning length is chosen on the
same grid, by the same selection, as the from-scratch model's; and one random-init encoder per
seed stands beside every cell of a study, whatever its decoder."""

from __future__ import annotations

import pytest
import torch

import evaluation.probes as probes
from evaluation.baselines import is_baseline_metric
from evaluation.probes import finetune_accuracy, probe_metrics, random_init_model, validation_split
from mae_core import Config, build_model, prepare_data

# Tiny data and steps; the probes' grids as in a smoke study (the probes evaluator's smoke settings, studies.study.smoke_eval).
TINY = dict(dataset="digits", encoder_width=16, encoder_depth=1, encoder_heads=2, decoder_width=8,
            decoder_depth=1, decoder_heads=2, train_limit=100, test_limit=60, device="cpu",
            **{"eval.linear_cs": "1.0", "eval.knn_ks": "5", "eval.fewshot_draws": 1,
               "eval.finetune_steps": 4, "eval.scratch_max_steps": 8, "eval.scratch_eval_every": 2})
CANDIDATES = (2, 4, 6, 8)


def _cell(**keys) -> tuple[torch.nn.Module, Config]:
    config = Config(**{**TINY, **keys})
    torch.manual_seed(100 + config.seed)  # the "pretrained" model: any model of the config
    return build_model(config), config


@pytest.fixture(scope="module")
def data():
    return prepare_data(Config(**TINY))


def test_the_pretrained_length_is_a_candidate_and_refitted_on_the_whole_training_split(data):
    model, config = _cell()
    assert config.eval.scratch_candidates == CANDIDATES
    metrics = probe_metrics(model, config, data)
    steps = metrics["finetune_best_steps"]
    assert steps in CANDIDATES
    refit = finetune_accuracy(model, data, int(steps), seed=config.seed, num_classes=10)
    assert metrics["finetune_best_acc"] == pytest.approx(refit)
    assert metrics["finetune_acc"] == finetune_accuracy(model, data, 4, seed=config.seed, num_classes=10)


def test_a_chosen_length_of_finetune_steps_reuses_the_fixed_length_run(data, monkeypatch):
    model, config = _cell()
    runs = []
    original = probes.finetune_accuracy
    monkeypatch.setattr(probes, "choose_finetune_steps", lambda *args, **kwargs: (4, 0.5))
    monkeypatch.setattr(probes, "finetune_accuracy",
                        lambda model, data, steps, **kwargs: runs.append(steps) or original(model, data, steps, **kwargs))
    metrics = probe_metrics(model, config, data)
    assert metrics["finetune_best_steps"] == 4.0 == metrics["scratch_best_finetune_steps"]
    assert metrics["finetune_best_acc"] == metrics["finetune_acc"]
    assert metrics["scratch_best_finetune_acc"] == metrics["random_finetune_acc"]
    assert runs == [4, 4]  # finetune_acc and random_finetune_acc only: no refit at the same length


def test_pretrained_and_scratch_lengths_are_chosen_on_one_grid_the_same_way(data, monkeypatch):
    model, config = _cell(**{"eval.finetune_layer_decay": 0.75})
    calls = []
    original = probes.choose_finetune_steps

    def recording(model, choice, candidates, **options):
        calls.append((model, choice, tuple(candidates), options))
        return original(model, choice, candidates, **options)

    monkeypatch.setattr(probes, "choose_finetune_steps", recording)
    metrics = probe_metrics(model, config, data)
    (pretrained, *pre), (fresh, *scratch) = calls
    assert pretrained is model and fresh is not model
    split = validation_split(data.train_labels.numpy(), config.eval.val_fraction, config.seed)
    for choice, candidates, _ in (pre, scratch):
        assert candidates == CANDIDATES
        assert torch.equal(choice.train_patches, data.train_patches[torch.from_numpy(split.fit)])
        assert torch.equal(choice.test_patches, data.train_patches[torch.from_numpy(split.val)])
    # every option the same but the layer decay, which only the pretrained encoder has
    assert pre[2].pop("layer_decay") == 0.75 and scratch[2].pop("layer_decay", 1.0) == 1.0
    assert pre[2] == scratch[2]
    assert metrics["finetune_best_steps"] in CANDIDATES and metrics["scratch_best_finetune_steps"] in CANDIDATES


def _random_metrics(data, **keys) -> dict[str, float]:
    model, config = _cell(**keys)
    metrics = probe_metrics(model, config, data if data is not None else prepare_data(config))
    return {name: value for name, value in metrics.items() if is_baseline_metric(name)}


def test_one_random_init_encoder_per_seed_whatever_the_decoder(data):
    shapes = ({}, dict(decoder_width=16, decoder_depth=2, mask_ratio=0.5), dict(objective="ae", latent_dim=4))
    encoders = [random_init_model(Config(**{**TINY, **keys})).encoder.state_dict() for keys in shapes]
    for other in encoders[1:]:
        assert all(torch.equal(encoders[0][name], other[name]) for name in encoders[0])
    reference = _random_metrics(data)
    assert {"random_probe_linear_acc", "random_finetune_acc", "scratch_best_finetune_acc"} <= set(reference)
    assert _random_metrics(data, **shapes[1]) == reference  # every random-init metric, bitwise
    another_seed = _random_metrics(None, seed=1)  # its own split of the data, too
    assert another_seed["random_probe_linear_acc"] != reference["random_probe_linear_acc"]
    assert another_seed["random_finetune_acc"] != reference["random_finetune_acc"]
    seed_one = random_init_model(Config(**{**TINY, "seed": 1})).encoder.state_dict()
    assert not torch.equal(seed_one["patch_embed.weight"], encoders[0]["patch_embed.weight"])
