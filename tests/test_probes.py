"""Probes: the pure scikit-learn probes on synthetic features, then the full call on a tiny model."""

from __future__ import annotations

import dataclasses

import numpy as np
import pytest
import torch

import evaluation.probes as probes
from evaluation.metrics import METRICS
from evaluation.probes import (
    choose_finetune_steps,
    extract_features,
    fewshot_accuracy,
    fewshot_indices,
    finetune_accuracy,
    knn_accuracy,
    linear_probe_accuracy,
    pixel_features,
    probe_metrics,
    random_init_model,
    validation_split,
)
from device_checks import DEVICE, HostReads, cuda_syncs
from mae_core import Config, ConfigError, build_model, prepare_data
from mae_core.data import count_split_duplicates

FROZEN_KEYS = {"probe_linear_acc", "probe_fewshot_acc", "probe_knn_acc", "random_probe_linear_acc",
               "random_probe_fewshot_acc", "random_probe_knn_acc", "pixel_probe_linear_acc",
               "pixel_probe_fewshot_acc", "pixel_probe_knn_acc"}
CHOSEN_KEYS = {f"{prefix}{what}" for prefix in ("probe_", "random_probe_", "pixel_probe_")
               for what in ("linear_c", "fewshot_c", "knn_k")}


def _blobs(n: int, separation: float, seed: int) -> tuple[np.ndarray, np.ndarray]:
    """Two Gaussian blobs ``[n,8]`` centred at ``±separation/2`` on every axis (apart in angle
    too, as the cosine kNN needs)."""
    rng = np.random.default_rng(seed)
    y = rng.integers(0, 2, n)
    return rng.normal(size=(n, 8)) + separation * (y[:, None] - 0.5), y


@pytest.mark.parametrize("probe", [linear_probe_accuracy, knn_accuracy])
def test_separable_features_probe_near_one(probe):
    train_x, train_y = _blobs(400, 10.0, seed=0)
    test_x, test_y = _blobs(200, 10.0, seed=1)
    assert probe(train_x, train_y, test_x, test_y) > 0.99


@pytest.mark.parametrize("probe", [linear_probe_accuracy, knn_accuracy])
def test_shuffled_labels_probe_near_chance(probe):
    # Both splits' labels shuffled, so no label carries information about its features.
    # (Shuffling only the training labels is not chance: the probe would still split the two
    # blobs and score 0, 0.5 or 1 depending on which label each blob happens to get.)
    train_x, train_y = _blobs(600, 10.0, seed=0)
    test_x, test_y = _blobs(400, 10.0, seed=1)
    rng = np.random.default_rng(2)
    accuracy = probe(train_x, rng.permutation(train_y), test_x, rng.permutation(test_y))
    assert abs(accuracy - 0.5) < 0.1


def test_fewshot_uses_few_labels_and_is_seeded():
    train_x, train_y = _blobs(400, 4.0, seed=0)
    test_x, test_y = _blobs(200, 4.0, seed=1)
    first = fewshot_accuracy(train_x, train_y, test_x, test_y, shots=4, seed=3)
    assert first == fewshot_accuracy(train_x, train_y, test_x, test_y, shots=4, seed=3)
    assert 0.8 < first <= 1.0


def test_single_class_training_set_predicts_that_class():
    x = np.zeros((4, 3))
    assert linear_probe_accuracy(x, np.ones(4, int), x, np.array([1, 1, 0, 0])) == 0.5


# -------------------------------------------------------------------- on a tiny model

TINY = dict(dataset="digits", encoder_width=16, encoder_depth=1, encoder_heads=2, decoder_width=8,
            decoder_depth=1, decoder_heads=2, train_limit=200, test_limit=100, device="cpu")


@pytest.fixture(scope="module")
def tiny():
    config = Config(**TINY)
    torch.manual_seed(1)
    return build_model(config), config, prepare_data(config)


def test_probe_metrics_keys_and_ranges(tiny):
    model, config, data = tiny
    model.train()
    metrics = probe_metrics(model, config, data)
    assert FROZEN_KEYS <= set(metrics)
    assert not {"finetune_acc", "partial_finetune_acc"} & set(metrics)
    assert all(0.0 <= metrics[k] <= 1.0 for k in FROZEN_KEYS)
    assert (metrics["probe_train_size"], metrics["probe_test_size"]) == (200.0, 100.0)
    assert model.training  # the caller's mode is restored


def test_random_reference_is_the_seeded_initial_model(tiny):
    """The seeded initial model of the config, its encoder that of the same seed's model with
    the decoder keys at their defaults (one random-init encoder per seed, whatever the decoder)."""
    _, config, data = tiny
    fresh = random_init_model(config)
    torch.manual_seed(config.seed)
    again = build_model(config)
    torch.manual_seed(config.seed)
    default_decoder = build_model(Config(**{**TINY, "decoder_width": 32, "decoder_depth": 2, "decoder_heads": 4}))
    assert all(torch.equal(a, b) for a, b in zip(fresh.encoder.state_dict().values(),
                                                 default_decoder.encoder.state_dict().values()))
    assert all(torch.equal(a, b) for name, a in fresh.state_dict().items() if not name.startswith("encoder.")
               for b in [again.state_dict()[name]])
    # so probing the random-init model itself reproduces the random_* row exactly
    metrics = probe_metrics(fresh, config, data)
    for name in ("linear", "fewshot", "knn"):
        assert metrics[f"probe_{name}_acc"] == metrics[f"random_probe_{name}_acc"]


def test_finetune_adds_accuracy_and_leaves_the_model_alone(tiny):
    model, config, data = tiny
    before = {k: v.clone() for k, v in model.state_dict().items()}
    metrics = probe_metrics(model, config, data, finetune_steps=20, finetune_blocks=1, scratch_max_steps=20)
    for key in ("finetune_acc", "random_finetune_acc", "partial_finetune_acc"):
        assert 0.0 <= metrics[key] <= 1.0
    assert "partial_finetune_blocks" not in metrics, "n is the eval.finetune_blocks param, not a metric"
    assert all(torch.equal(before[k], v) for k, v in model.state_dict().items())


def test_partial_finetune_updates_only_the_last_blocks(tiny, monkeypatch):
    model, config, data = tiny
    seen = {}
    original = torch.optim.AdamW

    def recording(params, **kwargs):
        params = list(params)
        seen["count"] = sum(p.numel() for p in params)
        return original(params, **kwargs)

    monkeypatch.setattr(torch.optim, "AdamW", recording)
    finetune_accuracy(model, data, 1, seed=0, blocks=0)
    head_only = seen["count"]
    finetune_accuracy(model, data, 1, seed=0, blocks=1)
    transformer = model.encoder.transformer
    last = sum(p.numel() for p in transformer.blocks[-1].parameters()) + \
        sum(p.numel() for p in transformer.norm.parameters())
    assert seen["count"] == head_only + last
    with pytest.raises(ValueError, match="finetune_blocks"):
        finetune_accuracy(model, data, 1, seed=0, blocks=5)
    with pytest.raises(ValueError, match="finetune_steps"):
        probe_metrics(model, config, data, finetune_blocks=1)


def test_fewshot_finetune_sees_only_its_labelled_examples(tiny):
    """Fine-tuning on ``shots`` per class equals fine-tuning on a train split holding only them."""
    import dataclasses

    model, config, data = tiny
    chosen = torch.from_numpy(fewshot_indices(data.train_labels.numpy(), 2, seed=3))
    assert len(chosen) == 2 * len(torch.unique(data.train_labels))
    assert all(int((data.train_labels[chosen] == c).sum()) == 2 for c in torch.unique(data.train_labels))
    only_those = dataclasses.replace(data, train_images=data.train_images[chosen],
                                     train_labels=data.train_labels[chosen])
    assert finetune_accuracy(model, data, 5, seed=3, shots=2) == finetune_accuracy(model, only_those, 5, seed=3)
    metrics = probe_metrics(model, config, data, finetune_steps=5, finetune_shots=2)
    assert "finetune_shots" not in metrics, "n is the eval.finetune_shots param, not a metric"


# ----------------------------------------------------- validation split, choices, baselines


def test_validation_split_is_stratified_seeded_and_disjoint(tiny):
    _, config, data = tiny
    labels = data.train_labels.numpy()
    split = validation_split(labels, 0.2, seed=0)
    assert not set(split.fit) & set(split.val)
    assert sorted([*split.fit, *split.val]) == list(range(len(labels)))
    assert abs(len(split.val) - 0.2 * len(labels)) <= len(np.unique(labels))
    assert set(labels[split.val]) == set(labels)  # every class is represented
    again = validation_split(labels, 0.2, seed=0)
    assert np.array_equal(split.val, again.val)
    assert not np.array_equal(split.val, validation_split(labels, 0.2, seed=1).val)
    # no validation image is a test image (the validation split lies inside the training split)
    assert count_split_duplicates(data.train_patches[split.val], data.test_patches) == 0
    choice = split.choice_data(data)
    assert torch.equal(choice.test_patches, data.train_patches[torch.from_numpy(split.val)])
    assert torch.equal(choice.train_patches, data.train_patches[torch.from_numpy(split.fit)])
    with pytest.raises(ValueError, match="val_fraction"):
        validation_split(labels[:1], 0.2, seed=0)


def test_eval_grid_keys_are_typed_and_validated():
    config = Config(**{"eval.linear_cs": "10, 0.1,1", "eval.knn_ks": 3, "eval.finetune_steps": 10})
    assert config.eval.linear_cs == (0.1, 1.0, 10.0) and config.eval.knn_ks == (3,)
    assert config.eval.scratch_candidates == tuple(range(5, 41, 5))  # every 5 updates up to 4 x 10
    resolved = config.resolved()
    assert resolved["eval.val_fraction"] == 0.2 and resolved["eval.linear_cs"] == (0.1, 1.0, 10.0)
    with_cap = Config(**{"eval.finetune_steps": 10, "eval.scratch_max_steps": 12, "eval.scratch_eval_every": 5})
    assert with_cap.eval.scratch_candidates == (5, 10, 12)
    for bad in ({"eval.linear_cs": "0,1"}, {"eval.knn_ks": ""}, {"eval.val_fraction": 0},
                {"eval.scratch_max_steps": 40}):  # the last: no fine-tuning to compare with
        with pytest.raises(ConfigError, match="eval"):
            Config(**bad)


@pytest.fixture(scope="module")
def recorded(tiny):
    """probe_metrics with fine-tuning, every choice function wrapped to record what it saw."""
    model, config, data = tiny
    calls: dict[str, list] = {"linear": [], "fewshot": [], "knn": [], "steps": []}

    def wrap(name, original, record):
        def wrapped(*args, **kwargs):
            calls[name].append(record(*args))
            return original(*args, **kwargs)
        return wrapped

    with pytest.MonkeyPatch.context() as patch:
        for name, attribute in (("linear", "choose_linear_c"), ("fewshot", "choose_fewshot_c"),
                                ("knn", "choose_knn_k")):
            patch.setattr(probes, attribute, wrap(name, getattr(probes, attribute),
                                                  lambda fit_x, fit_y, val_x, val_y, *rest: (fit_x, val_x)))
        patch.setattr(probes, "choose_finetune_steps",
                      wrap("steps", choose_finetune_steps, lambda model, choice, *rest: choice))
        metrics = probe_metrics(model, config, data, finetune_steps=6)
    return metrics, calls


def test_every_frozen_probe_kind_has_its_rows_for_every_baseline():
    """A kind of FROZEN_PROBE_KINDS logs its accuracy and its chosen settings under probe_ and
    each baseline prefix: each name is a row the frozen_probes evaluator declares."""
    from evaluation.probe_evaluators import FrozenProbes

    for kind in probes.FROZEN_PROBE_KINDS:
        for prefix in ("probe_", *FrozenProbes.baselines):
            for suffix in (kind.accuracy, *kind.chooses):
                assert FrozenProbes.declares(prefix + suffix), prefix + suffix


def test_choices_never_see_the_test_split(tiny, recorded):
    model, config, data = tiny
    metrics, calls = recorded
    split = validation_split(data.train_labels.numpy(), config.eval.val_fraction, config.seed)
    features = [extract_features(model, data.train_patches),
                extract_features(random_init_model(config), data.train_patches),
                pixel_features(data.train_patches)]
    test_pixels = {row.tobytes() for row in pixel_features(data.test_patches)}
    for name in ("linear", "fewshot", "knn"):
        assert len(calls[name]) == 3  # pretrained, random init, raw pixels
        for (fit_x, val_x), train_x in zip(calls[name], features):
            assert np.array_equal(fit_x, train_x[split.fit]) and np.array_equal(val_x, train_x[split.val])
        pixels_fit, pixels_val = calls[name][2]
        assert not test_pixels & {row.tobytes() for row in np.concatenate([pixels_fit, pixels_val])}
    assert len(calls["steps"]) == 2  # the pretrained model's tuned length, then the from-scratch one
    for choice in calls["steps"]:
        assert torch.equal(choice.train_patches, data.train_patches[torch.from_numpy(split.fit)])
        assert torch.equal(choice.test_patches, data.train_patches[torch.from_numpy(split.val)])
    assert metrics["probe_val_size"] == len(split.val)


def test_pixel_probes_are_the_probes_on_flattened_patches(tiny, recorded):
    _, config, data = tiny
    metrics, _ = recorded
    assert FROZEN_KEYS | CHOSEN_KEYS <= set(metrics)
    train_x, test_x = pixel_features(data.train_patches), pixel_features(data.test_patches)
    assert train_x.shape == (200, 16 * 4)
    train_y, test_y = data.train_labels.numpy(), data.test_labels.numpy()
    assert metrics["pixel_probe_linear_acc"] == linear_probe_accuracy(
        train_x, train_y, test_x, test_y, C=metrics["pixel_probe_linear_c"])
    assert metrics["pixel_probe_knn_acc"] == knn_accuracy(train_x, train_y, test_x, test_y,
                                                          int(metrics["pixel_probe_knn_k"]))
    assert metrics["pixel_probe_linear_c"] in config.eval.linear_cs
    assert metrics["pixel_probe_knn_acc"] > 0.8  # digits' raw pixels are a strong baseline


def test_scratch_baseline_chooses_its_length_on_validation(tiny, recorded):
    _, config, data = tiny
    metrics, _ = recorded
    for key in ("finetune_acc", "random_finetune_acc", "scratch_best_finetune_acc"):
        assert 0.0 <= metrics[key] <= 1.0
    settings = Config(**{**TINY, "eval.finetune_steps": 6}).eval
    steps = metrics["scratch_best_finetune_steps"]
    assert steps in settings.scratch_candidates == (3, 6, 9, 12, 15, 18, 21, 24)
    fresh = random_init_model(config)
    refit = finetune_accuracy(fresh, data, int(steps), seed=config.seed, num_classes=10)
    assert metrics["scratch_best_finetune_acc"] == pytest.approx(refit)
    if steps == 6:
        assert metrics["scratch_best_finetune_acc"] == metrics["random_finetune_acc"]


def test_chunked_scratch_training_is_one_run(tiny):
    """The validation score at n updates is that of a model trained for exactly n updates."""
    _, config, data = tiny
    fresh = random_init_model(config)
    choice = validation_split(data.train_labels.numpy(), 0.2, seed=0).choice_data(data)
    steps, accuracy = choose_finetune_steps(fresh, choice, (2, 4), seed=0, num_classes=10)
    assert steps in (2, 4)
    assert accuracy == finetune_accuracy(fresh, choice, steps, seed=0, num_classes=10)


def test_new_metrics_are_in_the_table():
    for name in (*FROZEN_KEYS, *CHOSEN_KEYS, "scratch_best_finetune_acc", "scratch_best_finetune_steps",
                 "finetune_best_acc", "finetune_best_steps",
                 "probe_val_size", "data_train_test_duplicates", "test_allvisible_rec_risk"):
        assert name in METRICS, name
    assert METRICS["probe_linear_acc"].reference == "random_probe_linear_acc"
    assert METRICS["probe_linear_acc"].baselines == ("pixel_probe_linear_acc",)
    assert METRICS["finetune_acc"].baselines == ("scratch_best_finetune_acc",)
    assert METRICS["test_allvisible_rec_risk"].kind != "risk"


# ------------------------------------------------ the paper's probes: features, head, recipe


@pytest.fixture(scope="module")
def with_class_token():
    config = Config(**TINY, class_token=True)
    torch.manual_seed(1)
    return build_model(config), config, prepare_data(config)


@pytest.mark.parametrize("pool, width", [("auto", 32), ("both", 32), ("mean", 16), ("cls", 16)])
def test_each_feature_mode_has_its_shape(with_class_token, pool, width):
    model, _, data = with_class_token
    features = extract_features(model, data.test_patches[:7], pool=pool)
    assert features.shape == (7, width)  # D = 16; both = [class token, mean] side by side
    both = extract_features(model, data.test_patches[:7], pool="both")
    part = {"cls": both[:, :16], "mean": both[:, 16:]}.get(pool, both)
    assert np.array_equal(features, part)


def test_without_a_class_token_features_are_the_mean_and_cls_is_refused(tiny):
    model, _, data = tiny
    assert np.array_equal(extract_features(model, data.test_patches[:5]),
                          extract_features(model, data.test_patches[:5], pool="mean"))
    with pytest.raises(ValueError, match="class token"):
        extract_features(model, data.test_patches[:5], pool="cls")
    for pool in ("cls", "both"):  # refused by the config, before anything runs
        with pytest.raises(ConfigError, match=f"eval.features={pool} reads the class token"):
            Config(**TINY, **{"eval.features": pool})
    assert Config(**TINY, class_token=True, **{"eval.features": "cls"}).eval.features == "cls"


def test_cls_probes_read_the_class_token(with_class_token, monkeypatch):
    """eval.features=cls: the pretrained and random-init probes see the class token alone."""
    model, config, data = with_class_token
    seen = []
    original = probes.choose_knn_k

    def recording(fit_x, *rest):
        seen.append(fit_x.shape[1])
        return original(fit_x, *rest)

    monkeypatch.setattr(probes, "choose_knn_k", recording)
    cls_config = config.with_updates(**{"eval.features": "cls", "eval.linear_cs": "1", "eval.knn_ks": "5"})
    metrics = probe_metrics(model, cls_config, data)
    assert seen == [16, 16, 16 * 4]  # pretrained, random init (class token D=16), raw pixels (M·q)
    split = validation_split(data.train_labels.numpy(), 0.2, config.seed)
    features = extract_features(model, data.train_patches, pool="cls")
    test = extract_features(model, data.test_patches, pool="cls")
    assert metrics["probe_knn_acc"] == knn_accuracy(features, data.train_labels.numpy(), test,
                                                    data.test_labels.numpy(), int(metrics["probe_knn_k"]))
    assert len(split.val) == metrics["probe_val_size"]


def test_bn_linear_head_in_the_probes(tiny):
    """eval.linear_head=bn_linear: every linear probe (pretrained, random init, pixels) is the
    BatchNorm + linear head at a step size chosen on validation, logged instead of a C."""
    from evaluation.linear_head import BNLinearRecipe, bn_linear_accuracy

    model, config, data = tiny
    keys = {"eval.linear_head": "bn_linear", "eval.bn_linear_epochs": 5, "eval.bn_linear_warmup_epochs": 1,
            "eval.bn_linear_lrs": "0.1,1", "eval.linear_cs": "1", "eval.knn_ks": "5", "eval.fewshot_draws": 1}
    settings = config.with_updates(**keys)
    metrics = probe_metrics(model, settings, data)
    for prefix in ("probe_", "random_probe_", "pixel_probe_"):
        assert f"{prefix}linear_c" not in metrics and metrics[f"{prefix}linear_lr"] in (0.1, 1.0)
        assert METRICS[f"{prefix}linear_lr"].kind == "bookkeeping"
    train_x, test_x = pixel_features(data.train_patches), pixel_features(data.test_patches)
    assert metrics["pixel_probe_linear_acc"] == bn_linear_accuracy(
        train_x, data.train_labels.numpy(), test_x, data.test_labels.numpy(), metrics["pixel_probe_linear_lr"],
        seed=config.seed, recipe=BNLinearRecipe.of(settings.eval))
    assert metrics["pixel_probe_linear_acc"] > 0.8  # digits' pixels are linearly separable enough


def test_finetune_blocks_all_is_full_finetuning(tiny):
    model, config, data = tiny
    metrics = probe_metrics(model, config, data, finetune_steps=4, finetune_blocks="all", scratch_max_steps=4)
    assert metrics["partial_finetune_acc"] == metrics["finetune_acc"]
    assert finetune_accuracy(model, data, 4, seed=0, blocks="all", num_classes=10) == metrics["finetune_acc"]


def test_layer_decay_applies_to_the_pretrained_encoder_only(tiny, monkeypatch):
    """MAE's recipe: decayed groups for fine-tuning the pretrained encoder; training from
    scratch (random init, tuned length) keeps one step size."""
    model, config, data = tiny
    groups = []
    original = torch.optim.AdamW

    def recording(params, **kwargs):
        params = list(params)
        groups.append(len(params) if isinstance(params[0], dict) else 1)
        return original(params, **kwargs)

    monkeypatch.setattr(torch.optim, "AdamW", recording)
    probe_metrics(model, config, data, finetune_steps=2, finetune_blocks=1, scratch_max_steps=2, scratch_eval_every=2,
                  finetune_layer_decay=0.75, linear_cs=(1.0,), knn_ks=(5,))
    # finetune_acc (embeddings, block, norm + head), its tuned-length search (one candidate, 2 =
    # finetune_steps: its refit is finetune_acc's run), partial (last block; its norm and the
    # head), then the baselines: random_finetune_acc, the scratch search (the same one candidate)
    assert groups == [3, 3, 2, 1, 1]


def test_finetune_head_bn_linear_puts_batchnorm_before_every_finetuning_head(tiny, monkeypatch):
    model, config, data = tiny
    heads = []

    class Recording(probes._Classifier):
        def __init__(self, *args, **kwargs):
            super().__init__(*args, **kwargs)
            heads.append(self.head)

    monkeypatch.setattr(probes, "_Classifier", Recording)
    probe_metrics(model, config, data, finetune_steps=2, finetune_head="bn_linear", scratch_max_steps=2,
                  scratch_eval_every=2, linear_cs=(1.0,), knn_ks=(5,))
    assert len(heads) == 4  # pretrained, its length search, random init, the from-scratch length search
    for norm, linear in heads:
        assert isinstance(norm, torch.nn.BatchNorm1d) and not norm.affine and linear.out_features == 10
        assert int(norm.num_batches_tracked) == 2  # trained: two updates' batch statistics
    with pytest.raises(ConfigError, match="finetune_head=bn_linear needs eval.finetune_steps > 0"):
        Config(**TINY, **{"eval.finetune_head": "bn_linear"})


# --------------------------------------------------- defaults keep main's numbers, bitwise

MAIN_COMMIT = "bccb6415aef97b9395616921de1b11d5e0055a04"  # main before the paper's probes (issue 16)


def _module_at_main(path: str, name: str, monkeypatch) -> object:
    """``path`` as it was at :data:`MAIN_COMMIT`, imported as module ``name`` (skips outside a git checkout)."""
    import subprocess
    import types
    from pathlib import Path

    root = Path(__file__).resolve().parents[1]
    try:
        source = subprocess.run(["git", "show", f"{MAIN_COMMIT}:{path}"], cwd=root, capture_output=True,
                                text=True, check=True).stdout
    except (OSError, subprocess.CalledProcessError):
        pytest.skip(f"needs the git history holding main's {path} at {MAIN_COMMIT[:7]}")
    module = types.ModuleType(name)
    monkeypatch.setitem(__import__("sys").modules, name, module)  # dataclasses look their module up
    exec(compile(source, f"{MAIN_COMMIT[:7]}:{path}", "exec"), module.__dict__)
    return module


@dataclasses.dataclass(frozen=True)
class _MainPatchData:
    """``PatchData`` as main's probes knew it (float patches as fields; since then the images are
    stored as bytes and the patches made on first read)."""
    train_patches: torch.Tensor
    train_labels: torch.Tensor
    test_patches: torch.Tensor
    test_labels: torch.Tensor
    image_shape: tuple[int, int, int]
    patch_size: int
    train_test_duplicates: int = 0


# What main's probes (at MAIN_COMMIT) gave on this test's config, recorded with that source so the
# test holds in a clone without the history; where the history is there, it is also run bitwise.
# metric: (value without the class token, value with it)
MAIN_PAIRS = {
    "finetune_acc": (0.15, 0.14), "partial_finetune_acc": (0.15, 0.13),
    "pixel_probe_fewshot_acc": (0.86, 0.86), "pixel_probe_fewshot_c": (0.1, 0.1),
    "pixel_probe_knn_acc": (0.92, 0.92), "pixel_probe_knn_k": (5.0, 5.0),
    "pixel_probe_linear_acc": (0.91, 0.91), "pixel_probe_linear_c": (0.1, 0.1),
    "probe_fewshot_acc": (0.575, 0.665), "probe_fewshot_c": (1.0, 1.0), "probe_knn_acc": (0.45, 0.54),
    "probe_knn_k": (5.0, 10.0), "probe_linear_acc": (0.68, 0.81), "probe_linear_c": (1.0, 1.0),
    "probe_test_size": (100.0, 100.0), "probe_train_size": (200.0, 200.0), "probe_val_size": (42.0, 42.0),
    "random_finetune_acc": (0.1, 0.12), "random_probe_fewshot_acc": (0.545, 0.61),
    "random_probe_fewshot_c": (1.0, 1.0), "random_probe_knn_acc": (0.44, 0.54),
    "random_probe_knn_k": (10.0, 5.0), "random_probe_linear_acc": (0.63, 0.62),
    "random_probe_linear_c": (1.0, 0.1), "scratch_best_finetune_acc": (0.1, 0.09),
    "scratch_best_finetune_steps": (3.0, 18.0),
}
MAIN_METRICS = {token: {name: pair[token] for name, pair in MAIN_PAIRS.items()} for token in (False, True)}


@pytest.mark.parametrize("class_token", [False, True])
def test_default_settings_reproduce_mains_metrics_bitwise(class_token, monkeypatch):
    """The new keys at their defaults (features auto, logreg head, no layer decay, constant step
    size, no warm-up) give exactly the metrics main's probes and models gave, fine-tuning and
    partial fine-tuning included."""
    config = Config(**{**TINY, "class_token": class_token, "eval.linear_cs": "0.1,1", "eval.knn_ks": "5,10",
                       "eval.fewshot_draws": 2, "eval.finetune_steps": 6, "eval.finetune_blocks": 1})
    data = prepare_data(config)
    torch.manual_seed(3)
    new = probe_metrics(build_model(config), config, data)
    added = {"finetune_best_acc", "finetune_best_steps"}  # issue 24: the tuned-length pretrained pair
    assert added <= set(new)
    kept = {k: v for k, v in new.items() if k not in added}
    assert kept == pytest.approx(MAIN_METRICS[class_token], abs=1e-12)

    old_models = _module_at_main("mae_core/models.py", "main_models", monkeypatch)  # skips without history
    old_probes = _module_at_main("evaluation/probes.py", "main_probes", monkeypatch)
    monkeypatch.setattr(old_probes, "build_model", old_models.build_model)
    # Since issue 24 the random-init reference's encoder is one per seed, whatever the decoder
    # (tests/test_like_for_like.py): main's probes read today's reference here.
    monkeypatch.setattr(old_probes, "random_init_model", random_init_model)
    main_data = _MainPatchData(data.train_patches, data.train_labels, data.test_patches, data.test_labels,
                               data.image_shape, data.patch_size, data.train_test_duplicates)
    torch.manual_seed(3)
    assert kept == old_probes.probe_metrics(old_models.build_model(config), config, main_data)


# ----------------------------------------------------------------- on the device (issue 26)


def test_features_cross_to_the_device_once_and_come_back_once(tiny, monkeypatch):
    model, _, data = tiny
    on_cpu = extract_features(model, data.test_patches, batch_size=32)
    model = random_init_model(Config(**TINY)).to(DEVICE)
    model.load_state_dict(tiny[0].state_dict())
    reads = HostReads(monkeypatch)
    with cuda_syncs() as syncs:
        features = extract_features(model, data.test_patches, batch_size=32)  # 4 batches, host patches
    assert reads.calls == [("cpu", DEVICE.type), ("numpy", "cpu")], reads.calls
    assert DEVICE.type != "cuda" or len(syncs) == 1, syncs
    np.testing.assert_allclose(features, on_cpu, rtol=1e-4, atol=1e-5)


def _reads_of_the_device(monkeypatch) -> HostReads:
    """Host reads, less those of host tensors by design: AdamW's step counters (torch keeps them
    on the host unless capturable) and the bn_linear head's seeded initialisation."""
    reads = HostReads(monkeypatch)
    reads.ignore(torch.optim.AdamW, "step")
    reads.ignore(probes, "bn_linear_head")
    return reads


@pytest.mark.parametrize("head", ["linear", "bn_linear"])
def test_finetuning_indexes_its_batches_on_the_device_and_reads_the_host_once(tiny, head, monkeypatch):
    """Issue 26: fine-tuning copied every batch from the CPU; now the split crosses once and each
    accuracy is one read (the count of correct predictions, kept on the device until then)."""
    model, _, data = tiny
    on_cpu = finetune_accuracy(model, data, 4, seed=0, num_classes=10, batch_size=16, head=head)
    reads = _reads_of_the_device(monkeypatch)
    moved = model.to(DEVICE) if DEVICE.type == "cpu" else __import__("copy").deepcopy(model).to(DEVICE)
    with cuda_syncs() as syncs:
        accuracy = finetune_accuracy(moved, data, 4, seed=0, num_classes=10, batch_size=16, head=head)
    assert reads.calls == [("__int__", DEVICE.type)], reads.calls
    assert DEVICE.type != "cuda" or len(syncs) == 1, syncs
    assert accuracy == pytest.approx(on_cpu, abs=0.03)
    assert next(moved.parameters()).device.type == DEVICE.type  # the model itself is untouched, where it was


def test_choosing_the_finetuning_length_reads_once_per_candidate(tiny, monkeypatch):
    model, config, data = tiny
    choice = validation_split(data.train_labels.numpy(), 0.2, seed=0).choice_data(data)
    fresh = random_init_model(config, DEVICE)
    reads = _reads_of_the_device(monkeypatch)
    choose_finetune_steps(fresh, choice, (2, 4), seed=0, num_classes=10, batch_size=16)
    assert reads.calls == [("__int__", DEVICE.type)] * 2, reads.calls


def test_frozen_probes_train_the_bn_linear_head_on_the_models_device(tiny, monkeypatch):
    model, config, data = tiny
    config = config.with_updates(**{"eval.linear_head": "bn_linear", "eval.bn_linear_epochs": 2, "eval.bn_linear_warmup_epochs": 1,
                                    "eval.bn_linear_lrs": "0.1"})
    split = validation_split(data.train_labels.numpy(), 0.2, seed=0)
    seen = []
    original = probes.bn_linear_path

    def recorded(*args, device=None, **kwargs):
        seen.append(torch.device(device).type)
        return original(*args, device=device, **kwargs)

    monkeypatch.setattr(probes, "bn_linear_path", recorded)
    probes.frozen_probes(random_init_model(config, DEVICE), data, split, config.eval, seed=0)
    assert seen == [DEVICE.type]  # the choice on validation; the refit goes through bn_linear_accuracy
