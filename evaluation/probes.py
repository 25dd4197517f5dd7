"""Downstream quality of a trained encoder: linear, few-shot and kNN probes, and fine-tuning.

Every probe reads ``model.features(patches [B,M,q]) -> [B,F]`` with all patches visible (the
representation the pretrained encoder hands downstream). The same probes on a freshly
initialised model of the same config give the ``random_probe_*`` reference row: seed 001
found that frozen, pooled MAE features can probe *worse* than a random encoder, so a probe
number means little without it. Fine-tuning (MAE Figure 5) and partial fine-tuning of the
last n blocks (MAE Figure 9) update the encoder itself, which is where MAE is expected to pay off.
"""

from __future__ import annotations

import copy
from functools import partial
from collections.abc import Iterator
from contextlib import contextmanager

import numpy as np
import torch
import torch.nn.functional as F
from sklearn.linear_model import LogisticRegression
from sklearn.neighbors import KNeighborsClassifier
from sklearn.pipeline import make_pipeline
from sklearn.preprocessing import StandardScaler
from torch import nn

from mae_core.config import Config, EvalConfig
from mae_core.models import build_model
from mae_core.train import PatchData

FEATURE_BATCH = 512  # images per forward pass when extracting features
# Defaults of the pure functions; a trial's values are its typed ``eval.*`` keys (EvalConfig).
FEWSHOT_DRAWS = EvalConfig.model_fields["fewshot_draws"].default
FINETUNE_LR = EvalConfig.model_fields["finetune_lr"].default
FINETUNE_BATCH = EvalConfig.model_fields["finetune_batch_size"].default

# ------------------------------------------------------------------- pure probes (numpy in)


def linear_probe_accuracy(train_x: np.ndarray, train_y: np.ndarray, test_x: np.ndarray,
                          test_y: np.ndarray) -> float:
    """Standardised features ``[N,F]`` + multinomial logistic regression; test accuracy in [0,1]."""
    if np.unique(train_y).size < 2:  # nothing to separate: the only sensible rule is the constant one
        return float(np.mean(test_y == train_y[0]))
    probe = make_pipeline(StandardScaler(), LogisticRegression(max_iter=2000))
    probe.fit(train_x, train_y)
    return float(probe.score(test_x, test_y))


def knn_accuracy(train_x: np.ndarray, train_y: np.ndarray, test_x: np.ndarray, test_y: np.ndarray,
                 k: int = 20) -> float:
    """k-nearest-neighbour vote under cosine distance (k capped at the training size)."""
    knn = KNeighborsClassifier(n_neighbors=min(k, len(train_x)), metric="cosine")
    knn.fit(train_x, train_y)
    return float(knn.score(test_x, test_y))


def fewshot_accuracy(train_x: np.ndarray, train_y: np.ndarray, test_x: np.ndarray,
                     test_y: np.ndarray, shots: int, seed: int, draws: int = FEWSHOT_DRAWS) -> float:
    """Linear probe on ``shots`` labelled examples per class (all of a smaller class), mean over
    ``draws`` seeded draws."""
    rng = np.random.default_rng(seed)
    scores = []
    for _ in range(draws):
        chosen = _per_class(train_y, shots, rng)
        scores.append(linear_probe_accuracy(train_x[chosen], train_y[chosen], test_x, test_y))
    return float(np.mean(scores))


# ------------------------------------------------------------------------------ features


@contextmanager
def _eval_mode(model: nn.Module) -> Iterator[nn.Module]:
    """``model.eval()`` for the block, then each submodule's own mode restored."""
    modes = [(m, m.training) for m in model.modules()]
    model.eval()
    try:
        yield model
    finally:
        for module, training in modes:
            module.training = training


def _device(model: nn.Module) -> torch.device:
    return next(model.parameters()).device


def extract_features(model: nn.Module, patches: torch.Tensor, batch_size: int = FEATURE_BATCH) -> np.ndarray:
    """``patches [N,M,q] -> float32 [N,F]`` on the CPU, in batches, without gradients."""
    device = _device(model)
    with _eval_mode(model), torch.inference_mode():
        parts = [model.features(patches[i:i + batch_size].to(device)).float().cpu()
                 for i in range(0, len(patches), batch_size)]
    return torch.cat(parts).numpy()


def frozen_probes(model: nn.Module, data: PatchData, *, fewshot: int, knn_k: int, seed: int,
                  prefix: str = "probe_", fewshot_draws: int = FEWSHOT_DRAWS) -> dict[str, float]:
    """Linear, few-shot and kNN accuracy of ``model``'s frozen features on ``data``'s test split."""
    train_x = extract_features(model, data.train_patches)
    test_x = extract_features(model, data.test_patches)
    train_y, test_y = data.train_labels.numpy(), data.test_labels.numpy()
    return {
        f"{prefix}linear_acc": linear_probe_accuracy(train_x, train_y, test_x, test_y),
        f"{prefix}fewshot_acc": fewshot_accuracy(train_x, train_y, test_x, test_y, fewshot, seed,
                                                 draws=fewshot_draws),
        f"{prefix}knn_acc": knn_accuracy(train_x, train_y, test_x, test_y, knn_k),
    }


def random_init_model(config: Config, device: torch.device | None = None) -> nn.Module:
    """The config's model at initialisation (``torch.manual_seed(config.seed)``, as a trial
    starts), without touching the caller's global RNG state."""
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(config.seed)
        model = build_model(config)
    return model.to(device) if device is not None else model


# ----------------------------------------------------------------------------- fine-tuning


class _Classifier(nn.Module):
    """The encoder's ``features()`` followed by a linear head: ``[B,M,q] -> [B,classes]``."""

    def __init__(self, encoder_model: nn.Module, feature_dim: int, num_classes: int):
        super().__init__()
        self.body = encoder_model
        self.head = nn.Linear(feature_dim, num_classes)

    def forward(self, patches: torch.Tensor) -> torch.Tensor:
        return self.head(self.body.features(patches))


def _trainable_encoder_parts(model: nn.Module, blocks: int | None) -> list[nn.Parameter]:
    """Parameters fine-tuning may update: all of them (``blocks=None``), or the last ``blocks``
    encoder blocks plus the final norm that reads them (MAE Figure 9's partial fine-tuning)."""
    if blocks is None:
        return list(model.parameters())
    transformer = model.encoder.transformer
    depth = len(transformer.blocks)
    if not 0 <= blocks <= depth:
        raise ValueError(f"finetune_blocks={blocks} must lie in [0, {depth}] (the encoder's depth)")
    if blocks == 0:  # the head alone: a linear probe trained by SGD
        return []
    chosen = list(transformer.blocks[depth - blocks:]) + [transformer.norm]
    return [p for module in chosen for p in module.parameters()]


def fewshot_indices(labels: np.ndarray, shots: int, seed: int) -> np.ndarray:
    """``shots`` training indices per class (all of a smaller class), drawn with ``seed``; the
    first draw :func:`fewshot_accuracy` makes with the same seed."""
    return _per_class(labels, shots, np.random.default_rng(seed))


def _per_class(labels: np.ndarray, shots: int, rng: np.random.Generator) -> np.ndarray:
    return np.concatenate([
        rng.choice(np.flatnonzero(labels == c), size=min(shots, int(np.sum(labels == c))), replace=False)
        for c in np.unique(labels)
    ])


def finetune_accuracy(model: nn.Module, data: PatchData, steps: int, *, seed: int,
                      blocks: int | None = None, shots: int | None = None, lr: float = FINETUNE_LR,
                      batch_size: int = FINETUNE_BATCH) -> float:
    """Fine-tune a deep copy of ``model`` plus a linear head with AdamW and cross-entropy for
    ``steps`` minibatches; accuracy on the test split. ``model`` is untouched.

    The labelled set is the whole train split, or ``shots`` examples per class (seed 001's
    exercise: fine-tune end to end on the few-shot probe's examples); a labelled set no larger
    than ``batch_size`` is used whole at every step.
    """
    device = _device(model)
    pool = (torch.from_numpy(fewshot_indices(data.train_labels.numpy(), shots, seed))
            if shots is not None else torch.arange(len(data.train_patches)))
    num_classes = int(max(data.train_labels.max(), data.test_labels.max())) + 1
    with torch.random.fork_rng(devices=[]):  # the head's init and the batches are seeded here
        torch.manual_seed(seed)
        body = copy.deepcopy(model)
        for parameter in body.parameters():
            parameter.requires_grad_(False)
        trainable = _trainable_encoder_parts(body, blocks)
        for parameter in trainable:
            parameter.requires_grad_(True)
        with _eval_mode(body), torch.no_grad():
            feature_dim = body.features(data.train_patches[:1].to(device)).shape[1]
        classifier = _Classifier(body, feature_dim, num_classes).to(device)
        optimizer = torch.optim.AdamW(trainable + list(classifier.head.parameters()), lr=lr)
        sampler = torch.Generator().manual_seed(seed)
        classifier.train()
        for _ in range(steps):
            index = pool if len(pool) <= batch_size else pool[torch.randint(len(pool), (batch_size,), generator=sampler)]
            logits = classifier(data.train_patches[index].to(device))
            loss = F.cross_entropy(logits, data.train_labels[index].to(device))
            optimizer.zero_grad(set_to_none=True)
            loss.backward()
            optimizer.step()
    classifier.eval()
    correct = 0
    with torch.inference_mode():
        for i in range(0, len(data.test_patches), FEATURE_BATCH):
            logits = classifier(data.test_patches[i:i + FEATURE_BATCH].to(device))
            correct += int((logits.argmax(1).cpu() == data.test_labels[i:i + FEATURE_BATCH]).sum())
    return correct / len(data.test_patches)


# ------------------------------------------------------------------------------ one call


def probe_metrics(model: nn.Module, config: Config, data: PatchData, *, seed: int | None = None,
                  **overrides) -> dict[str, float]:
    """Every downstream metric of one trial (names are the MLflow metric names), with the
    settings of ``config.eval`` (``overrides`` replace some of them: ``finetune_steps=20``).

    ``probe_{linear,fewshot,knn}_acc`` on ``model``; ``random_probe_*`` on a fresh model of the
    same config; with ``finetune_steps > 0`` also ``finetune_acc`` (all weights) and
    ``random_finetune_acc`` (the same from random init, i.e. training from scratch); with
    ``finetune_blocks=n`` also ``partial_finetune_acc`` (last n blocks + head); with
    ``finetune_shots=n`` every fine-tuning uses n labelled examples per class instead of the
    whole train split. n itself is not a metric: it is the ``eval.finetune_blocks`` or
    ``eval.finetune_shots`` param (each value is logged once). Sizes of the splits are
    ``probe_train_size``/``probe_test_size``.
    """
    settings = EvalConfig(**{**config.eval.model_dump(), **overrides}) if overrides else config.eval
    seed = config.seed if seed is None else seed
    device = _device(model)
    fresh = random_init_model(config, device)
    frozen = partial(frozen_probes, data=data, fewshot=settings.fewshot, knn_k=settings.knn_k, seed=seed,
                     fewshot_draws=settings.fewshot_draws)
    metrics = frozen(model)
    metrics.update(frozen(fresh, prefix="random_probe_"))
    if settings.finetune_steps > 0:
        tune = partial(finetune_accuracy, steps=settings.finetune_steps, seed=seed,
                       shots=settings.finetune_shots, lr=settings.finetune_lr,
                       batch_size=settings.finetune_batch_size)
        metrics["finetune_acc"] = tune(model, data)
        metrics["random_finetune_acc"] = tune(fresh, data)
        if settings.finetune_blocks is not None:
            metrics["partial_finetune_acc"] = tune(model, data, blocks=settings.finetune_blocks)
    metrics["probe_train_size"] = float(len(data.train_patches))
    metrics["probe_test_size"] = float(len(data.test_patches))
    return metrics
