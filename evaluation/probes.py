"""Downstream quality of a trained encoder: linear, few-shot and kNN probes, and fine-tuning.

Every probe reads ``model.features(patches [B,M,q]) -> [B,F]`` with all patches visible (the
representation the pretrained encoder hands downstream). Baselines stand beside every probe:
the same probes on a freshly initialised encoder (``random_probe_*``: seed 001 found that
frozen, pooled MAE features can probe *worse* than a random encoder; one encoder per seed,
shared by every cell of a study, see :func:`random_init_model`) and on the raw pixels, the
flattened patches ``[N, M·q]`` (``pixel_probe_*``). Fine-tuning (MAE Figure 5) and partial
fine-tuning of the last n blocks (MAE Figure 9) update the encoder itself. Fine-tuning is
compared like for like: at the fixed length ``eval.finetune_steps`` (``finetune_acc`` beside
``random_finetune_acc``, training from scratch for as many updates), and at the length each
model chooses for itself on validation from one candidate grid (``finetune_best_acc`` beside
``scratch_best_finetune_acc``: same candidates, same selection, same refit), so "pretraining
helps" is tested against a well-trained model and neither side gets a search the other lacks.

What the frozen probes read is ``eval.features`` (:data:`mae_core.models.FEATURE_POOLS`: the
mean-pooled tokens, the class token MAE's linear probe reads, or both); the linear probe's head is
``eval.linear_head``: standardised logistic regression, or MAE's BatchNorm-without-affine plus
linear layer trained by SGD (:mod:`evaluation.linear_head`). Fine-tuning follows
``eval.finetune_*`` (:mod:`evaluation.finetune_recipe`): AdamW at a constant step size by default,
or MAE's recipe with layer-wise decay, warm-up and cosine.

Choices and the test split: every setting a probe chooses (the logistic-regression strength C
of the linear and few-shot probes, the bn_linear head's step size, the kNN k, the fine-tuning
length of the pretrained and of the from-scratch model) is chosen on a validation split carved
from the training split (:func:`validation_split`: stratified, ``eval.val_fraction`` of it,
seeded by the trial's seed): fit on the training split minus the validation split, scored on
the validation split, ties to the first (smallest) candidate. The chosen setting is then
refitted on the whole training split (training + validation) and the test split is scored once, at the end.
Pretraining itself reads no labels, and uses the whole training split.

Where it runs (issue 26): features, fine-tuning and the bn_linear head run on the model's device;
a split's patches and labels cross to it once (not blocking the host), every minibatch is
indexed there, and each result is one host read (the features scikit-learn fits on, an accuracy).
On CUDA (issue 36) the features stay there too: the logistic regression and the kNN vote are
fitted in torch on the device (:mod:`evaluation.torch_probes`, the same choices on the same
validation split); on the CPU scikit-learn fits them, as before.
"""

from __future__ import annotations

import copy
import dataclasses
import warnings
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass

import numpy as np
import torch
import torch.nn.functional as F
from sklearn.exceptions import ConvergenceWarning
from sklearn.linear_model import LogisticRegression
from sklearn.neighbors import KNeighborsClassifier
from sklearn.pipeline import make_pipeline
from sklearn.preprocessing import StandardScaler
from threadpoolctl import threadpool_limits
from torch import nn

from mae_core.config import Config, EvalConfig
from mae_core.devices import to_device
from mae_core.models import build_model
from mae_core.data import PatchData

from . import torch_probes
from .baselines import BaselineCache, baseline_key
from .finetune_recipe import depends_on_length, finetune_lr, layer_groups
from .linear_head import BNLinearRecipe, bn_linear_accuracy, bn_linear_head, bn_linear_path
from .metrics import block_metric_name

FEATURE_BATCH = 512  # images per forward pass when extracting features
# Defaults of the pure functions; a trial's values are its typed ``eval.*`` keys (EvalConfig).
FEWSHOT_DRAWS = EvalConfig.model_fields["fewshot_draws"].default
FINETUNE_LR = EvalConfig.model_fields["finetune_lr"].default
FINETUNE_BATCH = EvalConfig.model_fields["finetune_batch_size"].default
LOGISTIC_MAX_ITER = 1000  # lbfgs iterations; a large C that has not converged is still a candidate
# Features ``[N,F]``: a numpy array on the host (scikit-learn fits the probes) or a tensor on the
# model's device (torch fits them there: :mod:`evaluation.torch_probes`; issue 36).
Features = np.ndarray | torch.Tensor
# Who fits the frozen probes: auto = torch where the model is on CUDA, scikit-learn elsewhere (the
# pinned CPU numbers); torch or sklearn force one (a test runs the torch probes on the CPU).
PROBE_BACKENDS = ("auto", "sklearn", "torch")

# ------------------------------------------------------------------- pure probes (numpy in)


@contextmanager
def _one_blas_thread() -> Iterator[None]:
    """scikit-learn's probes on one BLAS/OpenMP thread: they are small, and on a busy machine
    spin-waiting threads made each fit 5-10x slower (measured on the digits probes)."""
    with threadpool_limits(limits=1), warnings.catch_warnings():
        warnings.simplefilter("ignore", ConvergenceWarning)  # a large C is still a candidate
        yield


def linear_probe_accuracy(train_x: np.ndarray, train_y: np.ndarray, test_x: np.ndarray,
                          test_y: np.ndarray, C: float = 1.0) -> float:
    """Standardised features ``[N,F]`` + multinomial logistic regression with inverse L2
    strength ``C``; test accuracy in [0,1]."""
    return _linear_path(train_x, train_y, test_x, test_y, (C,))[0]


def _linear_path(train_x: Features, train_y: np.ndarray, test_x: Features, test_y: np.ndarray,
                 grid: Sequence[float]) -> list[float]:
    """Test accuracy of the linear probe at each C of ``grid`` (ascending), one regularisation
    path: each fit starts from the previous solution (the same optimum, fewer iterations).
    Features in a torch tensor are fitted by :func:`evaluation.torch_probes.logistic_path` on
    their device, a numpy array by scikit-learn."""
    if np.unique(train_y).size < 2:  # nothing to separate: the only sensible rule is the constant one
        return [float(np.mean(test_y == train_y[0]))] * len(grid)
    if isinstance(train_x, torch.Tensor):
        return torch_probes.logistic_path(train_x, train_y, test_x, test_y, grid, max_iter=LOGISTIC_MAX_ITER)
    scaler = StandardScaler().fit(train_x)
    train_z, test_z = scaler.transform(train_x), scaler.transform(test_x)
    probe = LogisticRegression(max_iter=LOGISTIC_MAX_ITER, warm_start=True)
    scores = []
    with _one_blas_thread():
        for c in grid:
            probe.set_params(C=c).fit(train_z, train_y)
            scores.append(float(probe.score(test_z, test_y)))
    return scores


def knn_accuracy(train_x: Features, train_y: np.ndarray, test_x: Features, test_y: np.ndarray,
                 k: int = 20) -> float:
    """k-nearest-neighbour vote under cosine distance (k capped at the training size); torch
    features vote on their device (:func:`evaluation.torch_probes.knn_accuracy`)."""
    if isinstance(train_x, torch.Tensor):
        return torch_probes.knn_accuracy(train_x, train_y, test_x, test_y, k)
    knn = KNeighborsClassifier(n_neighbors=min(k, len(train_x)), metric="cosine")
    with _one_blas_thread():
        knn.fit(train_x, train_y)
        return float(knn.score(test_x, test_y))


def fewshot_accuracy(train_x: np.ndarray, train_y: np.ndarray, test_x: np.ndarray,
                     test_y: np.ndarray, shots: int, seed: int, draws: int = FEWSHOT_DRAWS,
                     C: float = 1.0) -> float:
    """Linear probe on ``shots`` labelled examples per class (all of a smaller class), mean over
    ``draws`` seeded draws."""
    return _fewshot_path(train_x, train_y, test_x, test_y, shots, seed, draws, (C,))[0]


def _fewshot_path(train_x: np.ndarray, train_y: np.ndarray, test_x: np.ndarray, test_y: np.ndarray,
                  shots: int, seed: int, draws: int, grid: Sequence[float]) -> list[float]:
    """:func:`fewshot_accuracy` at each C of ``grid``, on the same draws."""
    rng = np.random.default_rng(seed)
    scores = []
    for _ in range(draws):
        chosen = _per_class(train_y, shots, rng)
        scores.append(_linear_path(train_x[chosen], train_y[chosen], test_x, test_y, grid))
    return [float(v) for v in np.mean(scores, axis=0)]


# ------------------------------------------------------------ the validation split, choices


@dataclass(frozen=True)
class ValidationSplit:
    """Indices into the training split: ``fit`` (what a choice trains on) and ``val`` (what it
    is scored on); disjoint, together every training index."""

    fit: np.ndarray
    val: np.ndarray

    def choice_data(self, data: PatchData) -> PatchData:
        """``data`` as a choice sees it: train = the fit part, and the validation split in the
        place of the test split (the test split itself is not in it)."""
        fit, val = torch.from_numpy(self.fit), torch.from_numpy(self.val)
        return dataclasses.replace(
            data, train_images=data.train_images[self.fit], train_labels=data.train_labels[fit],
            test_images=data.train_images[self.val], test_labels=data.train_labels[val])


def validation_split(labels: np.ndarray, fraction: float, seed: int) -> ValidationSplit:
    """Hold out ``round(fraction·n_c)`` images of each class c (a class always keeps one image
    in the fit part; at least one image is held out), drawn with ``seed``."""
    labels = np.asarray(labels)
    if len(labels) < 2:
        raise ValueError(f"eval.val_fraction: a validation split needs at least 2 training images, "
                         f"got {len(labels)}")
    rng = np.random.default_rng([seed, 1])  # its own stream: the few-shot draws use default_rng(seed)
    held: list[np.ndarray] = []
    for c in np.unique(labels):
        members = rng.permutation(np.flatnonzero(labels == c))
        held.append(members[:min(int(round(fraction * len(members))), len(members) - 1)])
    val = np.concatenate(held)
    if val.size == 0:  # every class too small to spare an image
        val = rng.permutation(len(labels))[:1]
    val = np.sort(val)
    fit = np.setdiff1d(np.arange(len(labels)), val)
    return ValidationSplit(fit=fit, val=val)


def _first_best(candidates: Sequence, scores: Sequence[float]):
    """The candidate with the highest score; a tie goes to the first."""
    return candidates[int(np.argmax(scores))]


def choose_linear_c(fit_x: np.ndarray, fit_y: np.ndarray, val_x: np.ndarray, val_y: np.ndarray,
                    grid: Sequence[float]) -> float:
    """The C of ``grid`` whose linear probe, fitted on the fit part, scores best on validation."""
    grid = sorted(grid)
    return _first_best(grid, _linear_path(fit_x, fit_y, val_x, val_y, grid))


def choose_fewshot_c(fit_x: np.ndarray, fit_y: np.ndarray, val_x: np.ndarray, val_y: np.ndarray,
                     grid: Sequence[float], shots: int, seed: int, draws: int) -> float:
    """The C of ``grid`` whose few-shot probe (shots drawn from the fit part) scores best on
    validation, averaged over the same ``draws``."""
    grid = sorted(grid)
    return _first_best(grid, _fewshot_path(fit_x, fit_y, val_x, val_y, shots, seed, draws, grid))


def choose_bn_linear_lr(fit_x: np.ndarray, fit_y: np.ndarray, val_x: np.ndarray, val_y: np.ndarray,
                        grid: Sequence[float], *, seed: int, recipe: BNLinearRecipe,
                        device: torch.device | None = None) -> float:
    """The base step size of ``grid`` whose bn_linear head, trained on the fit part (on
    ``device``), scores best on validation."""
    grid = sorted(grid)
    return _first_best(grid, bn_linear_path(fit_x, fit_y, val_x, val_y, grid, seed=seed, recipe=recipe,
                                            device=device))


def choose_knn_k(fit_x: np.ndarray, fit_y: np.ndarray, val_x: np.ndarray, val_y: np.ndarray,
                 grid: Sequence[int]) -> int:
    """The k of ``grid`` (each capped at the fit part's size) whose kNN vote scores best on validation."""
    usable = sorted({min(int(k), len(fit_x)) for k in grid})
    return _first_best(usable, [knn_accuracy(fit_x, fit_y, val_x, val_y, k) for k in usable])


@dataclass(frozen=True)
class ProbeInputs:
    """What a frozen-feature probe reads: features ``[N,F]`` of the training and test splits with
    their labels, the validation split's ``choice`` (fit features, fit labels, validation features,
    validation labels), the trial's ``settings`` and ``seed``, and the ``device`` a head trains on."""

    train_x: Features
    train_y: np.ndarray
    test_x: Features
    test_y: np.ndarray
    choice: tuple
    settings: EvalConfig
    seed: int
    device: torch.device | None


@dataclass(frozen=True)
class Chosen:
    """A probe's settings chosen on the validation split (``{metric suffix: value}``, logged as
    ``<prefix><suffix>``) and ``test()``, its refitted probe's accuracy on the test split."""

    settings: dict[str, float]
    test: Callable[[], float]


def _linear_probe(inputs: ProbeInputs) -> Chosen:
    """The linear probe: ``eval.linear_head``'s C (logreg) or SGD base step size (bn_linear)."""
    x = inputs
    if x.settings.linear_head == "bn_linear":
        recipe = BNLinearRecipe.of(x.settings)
        lr = choose_bn_linear_lr(*x.choice, x.settings.bn_linear_lrs, seed=x.seed, recipe=recipe, device=x.device)
        return Chosen({"linear_lr": float(lr)}, lambda: bn_linear_accuracy(
            x.train_x, x.train_y, x.test_x, x.test_y, lr, seed=x.seed, recipe=recipe, device=x.device))
    c = choose_linear_c(*x.choice, x.settings.linear_cs)
    return Chosen({"linear_c": float(c)}, lambda: linear_probe_accuracy(x.train_x, x.train_y, x.test_x, x.test_y, C=c))


def _fewshot_probe(inputs: ProbeInputs) -> Chosen:
    """The few-shot probe: its C, on ``eval.fewshot`` shots per class over ``eval.fewshot_draws`` draws."""
    x, s = inputs, inputs.settings
    c = choose_fewshot_c(*x.choice, s.linear_cs, s.fewshot, x.seed, s.fewshot_draws)
    return Chosen({"fewshot_c": float(c)}, lambda: fewshot_accuracy(
        x.train_x, x.train_y, x.test_x, x.test_y, s.fewshot, x.seed, draws=s.fewshot_draws, C=c))


def _knn_probe(inputs: ProbeInputs) -> Chosen:
    """The kNN vote: its k."""
    x = inputs
    k = choose_knn_k(*x.choice, x.settings.knn_ks)
    return Chosen({"knn_k": float(k)}, lambda: knn_accuracy(x.train_x, x.train_y, x.test_x, x.test_y, k))


@dataclass(frozen=True)
class FrozenProbeKind:
    """One probe of frozen features: ``accuracy``, the suffix of its test accuracy's metric
    (``probe_`` + ``linear_acc``); ``chooses``, the suffixes of the settings it may log as chosen;
    ``choose(inputs) -> Chosen``, its choices on the validation split."""

    accuracy: str
    chooses: tuple[str, ...]
    choose: Callable[[ProbeInputs], Chosen]


# The frozen-feature probes, in the order they choose, are tested and are logged (the few-shot
# draws and the bn_linear head seed their own generators, so the order is the metrics' too).
FROZEN_PROBE_KINDS: tuple[FrozenProbeKind, ...] = (
    FrozenProbeKind("linear_acc", ("linear_c", "linear_lr"), _linear_probe),
    FrozenProbeKind("fewshot_acc", ("fewshot_c",), _fewshot_probe),
    FrozenProbeKind("knn_acc", ("knn_k",), _knn_probe),
)


def feature_probes(train_x: np.ndarray, train_y: np.ndarray, test_x: np.ndarray, test_y: np.ndarray,
                   split: ValidationSplit, settings: EvalConfig, *, seed: int,
                   prefix: str = "probe_", device: torch.device | None = None) -> dict[str, float]:
    """The test accuracy of each probe of :data:`FROZEN_PROBE_KINDS` (linear, few-shot, kNN) on
    features ``[N,F]``, every setting chosen on ``split`` first (logged as ``<prefix>linear_c``,
    or ``<prefix>linear_lr`` for the bn_linear head, ``<prefix>fewshot_c``, ``<prefix>knn_k``),
    then refitted on the whole training split. The bn_linear head trains on ``device`` (default
    the CPU)."""
    fit, val = split.fit, split.val
    inputs = ProbeInputs(train_x, train_y, test_x, test_y, (train_x[fit], train_y[fit], train_x[val], train_y[val]),
                         settings, seed, device)
    chosen = [(kind, kind.choose(inputs)) for kind in FROZEN_PROBE_KINDS]
    # Every choice is made: the test split is read once, by the refitted probes.
    metrics = {f"{prefix}{kind.accuracy}": made.test() for kind, made in chosen}
    for _, made in chosen:
        metrics.update({f"{prefix}{name}": value for name, value in made.settings.items()})
    return metrics


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


def extract_features(model: nn.Module, patches: torch.Tensor, batch_size: int = FEATURE_BATCH,
                     pool: str = "auto", blocks: int | None = None, on_device: bool = False) -> Features:
    """``patches [N,M,q] -> float32 [N,F]`` on the CPU, in batches, without gradients; ``pool``
    (``eval.features``) picks mean-pooled tokens, the class token or both (``auto``: the
    model's own ``features``); ``blocks``: after the first b encoder blocks (``eval.probe_blocks``).
    The patches cross to the model's device once and the features come back once (``on_device``:
    they stay there, a tensor for the torch probes)."""
    device = _device(model)
    patches = to_device(patches, device)
    options = {**({"pool": pool} if pool != "auto" else {}), **({"blocks": blocks} if blocks is not None else {})}

    def features(x: torch.Tensor) -> torch.Tensor:
        return model.features(x, **options)

    with _eval_mode(model), torch.inference_mode():
        parts = [features(patches[i:i + batch_size]).float() for i in range(0, len(patches), batch_size)]
    if on_device:
        return torch.cat(parts).clone()  # clone: a normal tensor (not an inference one) for the probes
    return torch.cat(parts).cpu().numpy()


def pixel_features(patches: torch.Tensor, device: torch.device | None = None) -> Features:
    """The raw-pixel baseline's features: ``patches [N,M,q] -> float32 [N, M·q]``, a numpy array
    (``device=None``) or a tensor on ``device`` for the torch probes."""
    flat = patches.reshape(len(patches), -1).float()
    return flat.numpy() if device is None else to_device(flat, device)


def probes_on_device(backend: str, device: torch.device) -> bool:
    """Whether the torch probes fit on ``device`` (``backend`` of :data:`PROBE_BACKENDS`)."""
    if backend not in PROBE_BACKENDS:
        raise ValueError(f"probe backend {backend!r}: one of {', '.join(PROBE_BACKENDS)}")
    return backend == "torch" or (backend == "auto" and device.type == "cuda")


def frozen_probes(model: nn.Module, data: PatchData, split: ValidationSplit, settings: EvalConfig, *,
                  seed: int, prefix: str = "probe_", blocks: int | None = None,
                  backend: str = "auto", features=None, role: str = "pretrained") -> dict[str, float]:
    """:func:`feature_probes` on ``model``'s frozen features of ``data`` (``settings.features``);
    ``blocks=b``: of the features after the first b encoder blocks, every name suffixed
    ``_block<b>`` (:func:`evaluation.metrics.block_metric_name`). With the torch probes
    (:func:`probes_on_device`) the features stay on the model's device and are fitted there.
    ``features``: the trial's :class:`~evaluation.features.TrialFeatures`, whose set ``role``
    (``model``'s) is read instead of extracted again, and the metrics of a call made before with
    the same arguments are returned rather than fitted again (the frozen and layer-wise probes)."""
    if features is None:
        return _fit_frozen_probes(model, data, split, settings, seed=seed, prefix=prefix, blocks=blocks,
                                  backend=backend)
    key = ("frozen_probes", role, blocks, prefix, seed, backend, settings.model_dump_json())
    return features.remembered(key, lambda: _fit_frozen_probes(
        model, data, split, settings, seed=seed, prefix=prefix, blocks=blocks, backend=backend,
        features=features, role=role))


def _fit_frozen_probes(model: nn.Module, data: PatchData, split: ValidationSplit, settings: EvalConfig, *,
                       seed: int, prefix: str, blocks: int | None, backend: str, features=None,
                       role: str = "pretrained") -> dict[str, float]:
    pool, device = settings.features, _device(model)
    on_device = probes_on_device(backend, device)
    if features is not None:
        train_x, test_x = features.pair(role, pool=pool, blocks=blocks, on_device=on_device)
    else:
        train_x, test_x = (extract_features(model, patches, pool=pool, blocks=blocks, on_device=on_device)
                           for patches in (data.train_patches, data.test_patches))
    metrics = feature_probes(train_x, data.train_labels.numpy(), test_x, data.test_labels.numpy(), split,
                             settings, seed=seed, prefix=prefix, device=device)
    return metrics if blocks is None else {block_metric_name(k, blocks): v for k, v in metrics.items()}


def layer_probes(model: nn.Module, data: PatchData, split: ValidationSplit, settings: EvalConfig, *,
                 seed: int, final: dict[str, float], backend: str = "auto", features=None) -> dict[str, float]:
    """The frozen probes after each block of ``settings.probe_blocks`` (``probe_*_block<b>``):
    the same probes, choices and pooling as the final layer's, on the tokens after b blocks with
    the encoder's final norm applied. The features after ``encoder_depth`` blocks are the
    final-layer features bitwise, so that block reuses ``final`` (the final-layer probes'
    metrics) rather than fitting the same probes twice."""
    metrics: dict[str, float] = {}
    for blocks in settings.probe_blocks:
        if blocks == _depth(model):
            metrics.update({block_metric_name(k, blocks): v for k, v in final.items()})
        else:
            metrics.update(frozen_probes(model, data, split, settings, seed=seed, blocks=blocks, backend=backend,
                                         features=features))
    return metrics


# Config keys that shape only what sits beside the encoder (the decoder, the objective's heads,
# an MAE's mask tokens): the random-init reference's encoder is drawn as if they were at their
# defaults, so it is one encoder per seed (and encoder keys), whatever the decoder of a cell.
DECODER_ONLY_KEYS = ("objective", "mask_token_in_encoder", "decoder_width", "decoder_depth",
                     "decoder_heads", "latent_dim")


def random_init_model(config: Config, device: torch.device | None = None) -> nn.Module:
    """The config's model at initialisation, its encoder shared by every cell of a seed; the
    caller's global RNG state is left alone.

    The model is the config's (``build_model`` under ``torch.manual_seed(seed_init)``, as a
    trial starts), but its encoder is replaced by the encoder of the same seed's model built with
    :data:`DECODER_ONLY_KEYS` at their defaults. ``init_weights`` draws the encoder's weights
    from the one generator after every layer's default initialisation, the decoder's included,
    so without this each decoder shape (or objective) drew another encoder, and the baselines of
    one seed differed across the cells of a decoder sweep. Probes and fine-tuning read the
    encoder alone (``features``), so the decoder left in the model changes no baseline. For a
    config whose decoder keys are the defaults this is exactly its own initial model."""
    shared = config.model_copy(update={key: Config.model_fields[key].default for key in DECODER_ONLY_KEYS})
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(config.init_seed)
        model = build_model(config)
        torch.manual_seed(config.init_seed)
        encoder = build_model(shared).encoder
    model.encoder.load_state_dict(encoder.state_dict())
    return model.to(device) if device is not None else model


# ----------------------------------------------------------------------------- fine-tuning


class _Classifier(nn.Module):
    """The encoder's ``features()`` followed by a head: ``[B,M,q] -> [B,classes]``; ``linear``
    (torch's default initialisation) or ``bn_linear`` (MAE's linear-probe head, BatchNorm
    without affine then linear: the features' scale no longer sets the head's pace)."""

    def __init__(self, encoder_model: nn.Module, feature_dim: int, num_classes: int, head: str = "linear"):
        super().__init__()
        self.body = encoder_model
        self.head = nn.Linear(feature_dim, num_classes) if head == "linear" else bn_linear_head(feature_dim, num_classes)

    def forward(self, patches: torch.Tensor) -> torch.Tensor:
        return self.head(self.body.features(patches))


def _trainable_encoder_parts(model: nn.Module, blocks: int | str | None) -> list[nn.Parameter]:
    """Parameters fine-tuning may update: all of them (``blocks=None`` or ``"all"``), or the last
    ``blocks`` encoder blocks plus the final norm that reads them (MAE Figure 9's partial fine-tuning)."""
    if blocks is None or blocks == "all":
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


def _accuracy(classifier: nn.Module, patches: torch.Tensor, labels: torch.Tensor) -> float:
    """Accuracy on ``patches [N,M,q]``, ``labels [N]`` (moved to the classifier's device once,
    a no-op when already there): counted there, one host read."""
    device = _device(classifier)
    patches, labels = to_device(patches, device), to_device(labels, device)
    correct = torch.zeros((), dtype=torch.long, device=device)
    with _eval_mode(classifier), torch.inference_mode():
        for i in range(0, len(patches), FEATURE_BATCH):
            logits = classifier(patches[i:i + FEATURE_BATCH])
            correct += (logits.argmax(1) == labels[i:i + FEATURE_BATCH]).sum()
    return int(correct) / len(patches)


def _named(model: nn.Module, params: list[nn.Parameter]) -> list[tuple[str, nn.Parameter]]:
    names = {id(p): name for name, p in model.named_parameters()}
    return [(names[id(p)], p) for p in params]


def _depth(model: nn.Module) -> int | None:
    """The encoder's block count, or None for a model without the built-in layout."""
    blocks = getattr(getattr(getattr(model, "encoder", None), "transformer", None), "blocks", None)
    return len(blocks) if blocks is not None else None


def _finetune_scores(model: nn.Module, data: PatchData, checkpoints: Sequence[int], *, seed: int,
                     score: Callable[[nn.Module], float], blocks: int | str | None = None,
                     shots: int | None = None, lr: float = FINETUNE_LR, batch_size: int = FINETUNE_BATCH,
                     num_classes: int | None = None, layer_decay: float = 1.0,
                     warmup_fraction: float = 0.0, schedule: str = "constant", head: str = "linear") -> list[float]:
    """Fine-tune a deep copy of ``model`` plus a head on ``data``'s train split with
    AdamW and cross-entropy; ``score(classifier)`` after each of the ascending update counts
    ``checkpoints``. The step size follows the schedule of a run as long as the last checkpoint
    (:func:`~evaluation.finetune_recipe.finetune_lr`), scaled per layer by ``layer_decay``
    (:func:`~evaluation.finetune_recipe.layer_groups`); ``head``: see :class:`_Classifier`.
    One run: with a constant step size and no warm-up, the classifier scored at n updates is the
    one :func:`finetune_accuracy` with ``steps=n`` trains."""
    device = _device(model)
    pool = (torch.from_numpy(fewshot_indices(data.train_labels.numpy(), shots, seed))
            if shots is not None else torch.arange(len(data.train_patches)))
    num_classes = int(data.train_labels.max()) + 1 if num_classes is None else num_classes
    # the split crosses to the device once; each step sends only its B indices (drawn on the host)
    patches, labels = to_device(data.train_patches, device), to_device(data.train_labels, device)
    whole = to_device(pool, device)
    scores: list[float] = []
    with torch.random.fork_rng(devices=[]):  # the head's init and the batches are seeded here
        torch.manual_seed(seed)
        body = copy.deepcopy(model)
        for parameter in body.parameters():
            parameter.requires_grad_(False)
        trainable = _trainable_encoder_parts(body, blocks)
        for parameter in trainable:
            parameter.requires_grad_(True)
        with _eval_mode(body), torch.no_grad():
            feature_dim = body.features(patches[:1]).shape[1]
        classifier = _Classifier(body, feature_dim, num_classes, head).to(device, non_blocking=True)  # the head: no host wait
        named = _named(body, trainable) + [(f"head.{n}", p) for n, p in classifier.head.named_parameters()]
        groups = layer_groups(named, _depth(body), layer_decay)
        if len(groups) == 1:  # one step size for every weight (layer decay off)
            optimizer = torch.optim.AdamW(groups[0].params, lr=lr)
        else:
            optimizer = torch.optim.AdamW([{"params": g.params, "lr": lr * g.scale} for g in groups], lr=lr)
        total = checkpoints[-1] if checkpoints else 0
        sampler = torch.Generator().manual_seed(seed)
        classifier.train()
        done = 0
        for until in checkpoints:
            for step in range(done, until):
                rate = finetune_lr(step, peak=lr, total=total, warmup_fraction=warmup_fraction, schedule=schedule)
                for param_group, group in zip(optimizer.param_groups, groups):
                    param_group["lr"] = rate * group.scale
                index = (whole if len(pool) <= batch_size else
                         to_device(pool[torch.randint(len(pool), (batch_size,), generator=sampler)], device))
                logits = classifier(patches[index])
                loss = F.cross_entropy(logits, labels[index])
                optimizer.zero_grad(set_to_none=True)
                loss.backward()
                optimizer.step()
            done = max(done, until)
            scores.append(score(classifier))  # in eval mode; training mode restored after
    return scores


def finetune_accuracy(model: nn.Module, data: PatchData, steps: int, *, seed: int,
                      blocks: int | str | None = None, shots: int | None = None, lr: float = FINETUNE_LR,
                      batch_size: int = FINETUNE_BATCH, num_classes: int | None = None,
                      layer_decay: float = 1.0, warmup_fraction: float = 0.0, schedule: str = "constant",
                      head: str = "linear") -> float:
    """Fine-tune a deep copy of ``model`` plus a head (``linear`` or MAE's ``bn_linear``) with
    AdamW and cross-entropy for ``steps`` minibatches; accuracy on the test split. ``model`` is
    untouched. Peak step size ``lr``, scaled per layer by ``layer_decay``, over ``schedule``
    after a warm-up of ``warmup_fraction`` of the steps (defaults: a constant ``lr`` for every
    weight, a linear head).

    The labelled set is the whole train split, or ``shots`` examples per class (seed 001's
    exercise: fine-tune end to end on the few-shot probe's examples); a labelled set no larger
    than ``batch_size`` is used whole at every step. The head has ``num_classes`` outputs
    (default: the largest training label + 1).
    """
    (accuracy,) = _finetune_scores(
        model, data, (steps,), seed=seed, blocks=blocks, shots=shots, lr=lr, batch_size=batch_size,
        num_classes=num_classes, layer_decay=layer_decay, warmup_fraction=warmup_fraction, schedule=schedule,
        head=head, score=lambda classifier: _accuracy(classifier, data.test_patches, data.test_labels))
    return accuracy


def choose_finetune_steps(model: nn.Module, choice: PatchData, candidates: Sequence[int], *, seed: int,
                          shots: int | None = None, lr: float = FINETUNE_LR, batch_size: int = FINETUNE_BATCH,
                          num_classes: int | None = None, layer_decay: float = 1.0,
                          warmup_fraction: float = 0.0, schedule: str = "constant",
                          head: str = "linear") -> tuple[int, float]:
    """``(steps, validation accuracy)``: the update count of ``candidates`` at which fine-tuning
    ``model`` on ``choice``'s train split (the fit part) scores best on its test split (the
    validation split, see :meth:`ValidationSplit.choice_data`). One run scored in chunks when
    the step size does not depend on the run's length; with warm-up or cosine, one run per
    candidate (each length has its own schedule)."""
    candidates = sorted(candidates)
    device = _device(model)
    val_patches, val_labels = to_device(choice.test_patches, device), to_device(choice.test_labels, device)  # once
    options = dict(seed=seed, shots=shots, lr=lr, batch_size=batch_size, num_classes=num_classes,
                   layer_decay=layer_decay, warmup_fraction=warmup_fraction, schedule=schedule, head=head,
                   score=lambda classifier: _accuracy(classifier, val_patches, val_labels))
    if depends_on_length(warmup_fraction, schedule):
        scores = [_finetune_scores(model, choice, (n,), **options)[0] for n in candidates]
    else:
        scores = _finetune_scores(model, choice, candidates, **options)
    best = int(np.argmax(scores))
    return candidates[best], scores[best]


# ------------------------------------------------------------------------------ one call


def _finetune_options(settings: EvalConfig, data: PatchData, seed: int) -> dict:
    """The keyword arguments every fine-tuning run of a trial shares (layer decay aside)."""
    return dict(seed=seed, shots=settings.finetune_shots, lr=settings.finetune_lr,
                batch_size=settings.finetune_batch_size, num_classes=int(data.train_labels.max()) + 1,
                warmup_fraction=settings.finetune_warmup_fraction, schedule=settings.finetune_schedule,
                head=settings.finetune_head)


def tuned_finetune(model: nn.Module, data: PatchData, split: ValidationSplit, settings: EvalConfig, *,
                   fixed_acc: float, options: dict) -> tuple[float, int]:
    """``(test accuracy, steps)`` of fine-tuning ``model`` for the length it scores best at on
    the validation split: the candidates ``settings.scratch_candidates`` (the one grid every
    model of a trial, pretrained or from scratch, is tuned over), chosen by
    :func:`choose_finetune_steps` on ``split.choice_data(data)``, then refitted on the whole
    training split. ``fixed_acc`` is the accuracy of the same fine-tuning (same ``options``) at
    ``settings.finetune_steps`` updates: a choice of that length reuses it rather than run twice."""
    steps, _ = choose_finetune_steps(model, split.choice_data(data), settings.scratch_candidates, **options)
    accuracy = fixed_acc if steps == settings.finetune_steps else finetune_accuracy(model, data, steps, **options)
    return accuracy, steps



def fixed_and_tuned_finetune(model: nn.Module, data: PatchData, split: ValidationSplit, settings: EvalConfig,
                             options: dict, *, fixed: str, best: str) -> dict[str, float]:
    """Fine-tuning ``model`` (with ``options``) at ``settings.finetune_steps`` updates, as metric
    ``fixed``, and at the validated length (:func:`tuned_finetune`), as metric ``best`` with its
    length as ``best``'s ``_steps`` twin (``finetune_best_acc`` -> ``finetune_best_steps``): the
    pretrained encoder and the from-scratch baseline are fine-tuned by this one pair of runs."""
    fixed_acc = finetune_accuracy(model, data, settings.finetune_steps, **options)
    accuracy, steps = tuned_finetune(model, data, split, settings, fixed_acc=fixed_acc, options=options)
    return {fixed: fixed_acc, best: accuracy, best.removesuffix("_acc") + "_steps": float(steps)}

def frozen_baselines(fresh: nn.Module, data: PatchData, split: ValidationSplit, settings: EvalConfig, *,
                     seed: int, backend: str = "auto", features=None) -> dict[str, float]:
    """The frozen probes' baselines: the probes of ``fresh`` (:func:`random_init_model`,
    ``random_probe_*``) and of the raw pixels (``pixel_probe_*``)."""
    train_y, test_y = data.train_labels.numpy(), data.test_labels.numpy()
    device = _device(fresh)
    metrics = frozen_probes(fresh, data, split, settings, seed=seed, prefix="random_probe_", backend=backend,
                            features=features, role="random_init")
    on_device = probes_on_device(backend, device)
    if features is not None:
        train_x, test_x = features.pair("pixels", on_device=on_device)
    else:
        pixels_on = device if on_device else None
        train_x, test_x = pixel_features(data.train_patches, pixels_on), pixel_features(data.test_patches, pixels_on)
    metrics.update(feature_probes(train_x, train_y, test_x, test_y, split, settings, seed=seed,
                                  prefix="pixel_probe_", device=device))
    return metrics


def scratch_baselines(fresh: nn.Module, data: PatchData, split: ValidationSplit, settings: EvalConfig, *,
                      options: dict) -> dict[str, float]:
    """Fine-tuning's baselines, with ``finetune_steps > 0``: training ``fresh`` from scratch for
    as many updates (``random_finetune_acc``) and for the candidate length best on validation
    (``scratch_best_finetune_*``, :func:`tuned_finetune`), refitted on the whole training split."""
    if settings.finetune_steps == 0:
        return {}
    return fixed_and_tuned_finetune(fresh, data, split, settings, options,
                                    fixed="random_finetune_acc", best="scratch_best_finetune_acc")


def baseline_metrics(fresh: nn.Module, data: PatchData, split: ValidationSplit, settings: EvalConfig, *,
                     seed: int, options: dict, backend: str = "auto", features=None) -> dict[str, float]:
    """The baselines of :func:`probe_metrics` (names under the ``probes`` evaluator's ``baselines`` prefixes,
    :func:`evaluation.baselines.baseline_prefixes`): :func:`frozen_baselines`, then :func:`scratch_baselines`."""
    metrics = frozen_baselines(fresh, data, split, settings, seed=seed, backend=backend, features=features)
    metrics.update(scratch_baselines(fresh, data, split, settings, options=options))
    return metrics


def pretrained_finetune(model: nn.Module, data: PatchData, split: ValidationSplit, settings: EvalConfig, *,
                        options: dict) -> dict[str, float]:
    """The pretrained encoder's fine-tuning, with ``finetune_steps > 0``: ``finetune_acc``,
    ``finetune_best_*`` (:func:`fixed_and_tuned_finetune`) and, with ``finetune_blocks``,
    ``partial_finetune_acc``; ``options`` carry its layer-wise decay."""
    if settings.finetune_steps == 0:
        return {}
    metrics = fixed_and_tuned_finetune(model, data, split, settings, options,
                                       fixed="finetune_acc", best="finetune_best_acc")
    if settings.finetune_blocks == "all":  # every weight: finetune_acc's run, not run twice
        metrics["partial_finetune_acc"] = metrics["finetune_acc"]
    elif settings.finetune_blocks is not None:
        metrics["partial_finetune_acc"] = finetune_accuracy(model, data, settings.finetune_steps,
                                                            blocks=settings.finetune_blocks, **options)
    return metrics


def split_sizes(data: PatchData, split: ValidationSplit) -> dict[str, float]:
    """``probe_train_size`` (the whole training split, which every refit uses), ``probe_val_size``
    (its validation part) and ``probe_test_size``."""
    return {"probe_train_size": float(len(data.train_patches)), "probe_val_size": float(len(split.val)),
            "probe_test_size": float(len(data.test_patches))}


def probe_metrics(model: nn.Module, config: Config, data: PatchData, *, seed: int | None = None,
                  baselines: BaselineCache | None = None, probe_backend: str = "auto", features=None,
                  **overrides) -> dict[str, float]:
    """Every downstream metric of one trial (names are the MLflow metric names), with the
    settings of ``config.eval`` (``overrides`` replace some of them: ``finetune_steps=20``).

    ``probe_{linear,fewshot,knn}_acc`` on ``model``; the same probes on a random-init encoder
    (``random_probe_*``, :func:`random_init_model`: one encoder per seed, whatever the decoder)
    and on raw pixels (``pixel_probe_*``), each with the settings it chose on the validation
    split (``*_linear_c``, ``*_fewshot_c``, ``*_knn_k``). With ``probe_blocks``, the pretrained
    model's frozen probes also after each of those blocks (:func:`layer_probes`:
    ``probe_linear_acc_block2``, ...). With ``finetune_steps > 0``, fine-tuning
    like for like, two ways:

    * fixed length: ``finetune_acc`` (every weight of ``model`` plus a head, ``finetune_steps``
      updates, no choice) beside ``random_finetune_acc`` (the same from random init, i.e.
      training from scratch for as many updates);
    * tuned length: ``finetune_best_acc`` (``model`` fine-tuned for ``finetune_best_steps``
      updates) beside ``scratch_best_finetune_acc`` (from scratch for
      ``scratch_best_finetune_steps``). Both lengths are chosen by :func:`tuned_finetune` from
      the same candidates ``eval.scratch_candidates`` (multiples of ``eval.scratch_eval_every``
      up to ``eval.scratch_max_steps``, default 4 x ``finetune_steps``) on the same validation
      split, then refitted on the whole training split; a chosen length of ``finetune_steps``
      reuses the fixed-length run.

    With
    ``finetune_blocks=n`` also ``partial_finetune_acc`` (last n blocks + head; ``all``: every
    weight, which is ``finetune_acc``'s run); with
    ``finetune_shots=n`` every fine-tuning uses n labelled examples per class instead of the
    whole train split (n itself is the ``eval.finetune_blocks`` / ``eval.finetune_shots``
    param, not a metric: each value is logged once). Sizes:
    ``probe_train_size`` (the whole training split, which every refit uses),
    ``probe_val_size`` (its validation part) and ``probe_test_size``. Every fine-tuning run
    follows ``eval.finetune_warmup_fraction`` and ``eval.finetune_schedule``; the layer-wise
    decay ``eval.finetune_layer_decay`` applies to the pretrained encoder's runs only (training
    from scratch has no pretrained layers to preserve, as in MAE's from-scratch recipe); every
    other fine-tuning setting is the same for the pretrained and the from-scratch runs.
    With ``baselines`` (a study's :class:`~evaluation.baselines.BaselineCache`) the baselines are
    read from a cell that computed them for the same key, or computed and kept for the others;
    the pretrained model's runs (``finetune_best_*`` included) are never cached.
    ``probe_backend`` (:data:`PROBE_BACKENDS`): who fits the frozen probes; ``auto``: torch on
    the model's device where that is CUDA (:mod:`evaluation.torch_probes`), scikit-learn elsewhere.
    ``features``: the trial's :class:`~evaluation.features.TrialFeatures` (of ``model``): the
    frozen probes read its sets, shared with the trial's other evaluators, rather than extract them.
    """
    settings = EvalConfig(**{**config.eval.model_dump(), **overrides}) if overrides else config.eval
    seed = config.eval_seed if seed is None else seed
    device = _device(model)
    if features is not None and features.model is not model:
        features = None  # another model's features: extracted here, as without a cache
    fresh = features.random_init_model() if features is not None else random_init_model(config, device)
    split = validation_split(data.train_labels.numpy(), settings.val_fraction, seed)
    options = _finetune_options(settings, data, seed)
    pretrained = dict(options, layer_decay=settings.finetune_layer_decay)
    metrics = frozen_probes(model, data, split, settings, seed=seed, backend=probe_backend, features=features)
    metrics.update(layer_probes(model, data, split, settings, seed=seed, final=metrics, backend=probe_backend,
                                features=features))
    metrics.update(pretrained_finetune(model, data, split, settings, options=pretrained))

    def compute_baselines() -> dict[str, float]:
        return baseline_metrics(fresh, data, split, settings, seed=seed, options=options, backend=probe_backend,
                                features=features)

    if baselines is None:
        metrics.update(compute_baselines())
    else:
        key = baseline_key(fresh, config, data, settings, seed, device)
        metrics.update(baselines.get_or_compute(key, compute_baselines))
    metrics.update(split_sizes(data, split))
    return metrics
