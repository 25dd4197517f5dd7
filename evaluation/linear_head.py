"""The MAE paper's linear-probe head: BatchNorm without affine, then a linear layer.

He et al. (MAE, appendix A.2; ``main_linprobe.py``) put ``BatchNorm1d(F, affine=False,
eps=1e-6)`` in front of the linear classifier: a feature normaliser with no parameters of its
own, so the probe stays linear (at test time the running statistics make it an affine map of
the features). They train it with LARS (base step size 0.1 per 256 images, batch 16384, 90
epochs with 10 of linear warm-up, then cosine, no weight decay), the weight initialised
``trunc_normal(std=0.01)``. LARS's per-layer trust ratio is there for batches of 16k; at this
scale the head is trained by plain SGD with momentum 0.9 on the same schedule, and its base step
size is chosen on the validation split (``eval.bn_linear_lrs``), like the logistic regression's C.

The head trains where ``device`` says (the trial's device): the features and labels are moved
there once, every minibatch is indexed there, and a path of step sizes reads the host once, for
all its accuracies (issues 26, 36).

Shapes: ``N`` images, ``F`` feature width, ``K`` classes.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np
import torch
import torch.nn.functional as F
from torch import nn

from mae_core.config import EvalConfig
from mae_core.devices import to_device
from mae_core.optimizer import learning_rate

BN_EPS = 1e-6  # MAE's BatchNorm1d(eps=1e-6)
INIT_STD = 0.01  # MAE: trunc_normal_(head.weight, std=0.01)
MOMENTUM = 0.9  # MAE's LARS momentum, kept for plain SGD
_DEFAULTS = EvalConfig.model_fields


@dataclass(frozen=True)
class BNLinearRecipe:
    """How the head is trained (the ``eval.bn_linear_*`` keys besides the step size)."""

    epochs: int = _DEFAULTS["bn_linear_epochs"].default
    warmup_epochs: int = _DEFAULTS["bn_linear_warmup_epochs"].default
    batch_size: int = _DEFAULTS["bn_linear_batch_size"].default
    weight_decay: float = _DEFAULTS["bn_linear_weight_decay"].default

    @classmethod
    def of(cls, settings: EvalConfig) -> BNLinearRecipe:
        return cls(epochs=settings.bn_linear_epochs, warmup_epochs=settings.bn_linear_warmup_epochs,
                   batch_size=settings.bn_linear_batch_size, weight_decay=settings.bn_linear_weight_decay)


def bn_linear_head(features: int, classes: int, generator: torch.Generator | None = None,
                   device: torch.device | str | None = None) -> nn.Sequential:
    """``[N,F] -> [N,K]``: ``BatchNorm1d(F, affine=False)`` then ``Linear(F, K)`` (weight
    truncated-normal with std 0.01, bias 0, as MAE's head), on ``device`` (default the CPU).
    The weight is drawn on the host from ``generator`` (a CPU generator) and copied once, so a
    seed gives the same head on every device."""
    if device is None or torch.device(device).type == "cpu":
        linear = nn.Linear(features, classes)
        nn.init.trunc_normal_(linear.weight, std=INIT_STD, generator=generator)
        nn.init.zeros_(linear.bias)
        return nn.Sequential(nn.BatchNorm1d(features, affine=False, eps=BN_EPS), linear)
    host = bn_linear_head(features, classes, generator)
    head = nn.Sequential(nn.BatchNorm1d(features, affine=False, eps=BN_EPS, device=device),
                         nn.Linear(features, classes, device=device))
    with torch.no_grad():
        head[1].weight.copy_(to_device(host[1].weight.detach(), torch.device(device)))
        head[1].bias.zero_()
    return head


def _on(values: np.ndarray | torch.Tensor, dtype: torch.dtype, device: torch.device) -> torch.Tensor:
    """``values`` as a ``dtype`` tensor on ``device`` (a host array crosses once, not blocking)."""
    return to_device(torch.as_tensor(values, dtype=dtype), device)


@dataclass(frozen=True)
class _Draws:
    """What a seed draws for one fit, on the host: the head's initial weight ``[K,F]`` and the
    minibatch order of every epoch ``[epochs,N]``. Every step size of a path starts from the
    same draws, so they are drawn (and cross to the device) once per path, not once per fit."""

    weight: torch.Tensor
    orders: torch.Tensor

    @classmethod
    def of(cls, seed: int, features: int, classes: int, n: int, epochs: int) -> _Draws:
        generator = torch.Generator().manual_seed(seed)
        weight = nn.init.trunc_normal_(torch.empty(classes, features), std=INIT_STD, generator=generator)
        orders = torch.stack([torch.randperm(n, generator=generator) for _ in range(epochs)]) if epochs else \
            torch.empty(0, n, dtype=torch.long)
        return cls(weight, orders)

    def to(self, device: torch.device) -> _Draws:
        return _Draws(to_device(self.weight, device), to_device(self.orders, device))


def _fit(x: torch.Tensor, y: torch.Tensor, draws: _Draws, *, lr: float, recipe: BNLinearRecipe) -> nn.Sequential:
    """The head trained on device features ``x [N,F]`` and labels ``y [N]`` from ``draws`` (on
    the same device): SGD with momentum, no host read and no host-to-device copy."""
    device = x.device
    classes, features = draws.weight.shape
    # skip_init: the weight is the seed's draw, so no default initialisation (nor global RNG) is spent
    head = nn.Sequential(nn.BatchNorm1d(features, affine=False, eps=BN_EPS, device=device),
                         nn.utils.skip_init(nn.Linear, features, classes, device=device))
    linear = head[1]
    with torch.no_grad():
        linear.weight.copy_(draws.weight)
        linear.bias.zero_()
    # Weight decay on the linear weight only (MAE decays no bias; BatchNorm here has no parameters).
    optimizer = torch.optim.SGD([{"params": [linear.weight], "weight_decay": recipe.weight_decay},
                                 {"params": [linear.bias], "weight_decay": 0.0}], lr=0.0, momentum=MOMENTUM)
    batch = min(recipe.batch_size, len(x))
    per_epoch = len(x) // batch
    total, warmup = recipe.epochs * per_epoch, recipe.warmup_epochs * per_epoch
    peak = lr * batch / 256
    head.train()
    step = 0
    for order in draws.orders:
        for i in range(per_epoch):
            index = order[i * batch:(i + 1) * batch]
            for group in optimizer.param_groups:
                group["lr"] = learning_rate(step, peak=peak, warmup_steps=warmup, total_steps=total, schedule="cosine")
            loss = F.cross_entropy(head(x[index]), y[index])
            optimizer.zero_grad(set_to_none=True)
            loss.backward()
            optimizer.step()
            step += 1
    return head.eval()


def train_bn_linear(train_x: np.ndarray | torch.Tensor, train_y: np.ndarray | torch.Tensor, *, lr: float,
                    seed: int, recipe: BNLinearRecipe = BNLinearRecipe(), num_classes: int | None = None,
                    device: torch.device | str | None = None) -> nn.Sequential:
    """The head fitted to features ``[N,F]`` (N ≥ 2) and labels ``[N]``, in eval mode, on
    ``device`` (default: where ``train_x`` is).

    Minibatches of ``min(batch_size, N)`` images drawn without replacement each epoch (the
    remainder dropped, as MAE's loader does: BatchNorm never sees a batch of one); step size
    ``lr·batch/256`` after a linear warm-up of ``warmup_epochs``, cosine to 0 at the end. The
    initial weight and every epoch's order are drawn on the host from the seed (the same head
    and batches on every device) and cross once; nothing is read back while the head trains.
    """
    device = torch.device(device) if device is not None else torch.as_tensor(train_x[:0]).device
    x, y = _on(train_x, torch.float32, device), _on(train_y, torch.long, device)
    if len(x) < 2:
        raise ValueError(f"the bn_linear head needs at least 2 training images for BatchNorm, got {len(x)}")
    classes = int(y.max()) + 1 if num_classes is None else num_classes  # a host read only without num_classes
    draws = _Draws.of(seed, x.shape[1], classes, len(x), recipe.epochs).to(device)
    return _fit(x, y, draws, lr=lr, recipe=recipe)


def _correct(head: nn.Module, test_x: torch.Tensor, test_y: torch.Tensor) -> torch.Tensor:
    """How many of the test images ``head`` classifies right: a 0-d count left on the device."""
    with torch.inference_mode():
        return (head(test_x).argmax(1) == test_y).sum()


def bn_linear_path(train_x: np.ndarray, train_y: np.ndarray, test_x: np.ndarray, test_y: np.ndarray,
                   lrs: Sequence[float], *, seed: int, recipe: BNLinearRecipe = BNLinearRecipe(),
                   device: torch.device | str | None = None) -> list[float]:
    """Test accuracy of the head trained on ``device`` (default the CPU) at each base step size
    of ``lrs`` (same seed: same initialisation and batches); a single-class training split gives
    the constant rule. The features, labels and the seed's draws cross to the device once for
    the whole path, and the accuracies come back in one host read (issue 36: a sync per step
    size was one more than the path needs)."""
    if np.unique(train_y).size < 2:  # nothing to separate, as the logistic probe
        return [float(np.mean(test_y == train_y[0]))] * len(lrs)
    if len(train_x) < 2:
        raise ValueError(f"the bn_linear head needs at least 2 training images for BatchNorm, got {len(train_x)}")
    classes = int(max(np.max(train_y), np.max(test_y))) + 1
    device = torch.device("cpu") if device is None else torch.device(device)
    train_x, train_y = _on(train_x, torch.float32, device), _on(train_y, torch.long, device)
    test_x, test_y = _on(test_x, torch.float32, device), _on(test_y, torch.long, device)
    draws = _Draws.of(seed, train_x.shape[1], classes, len(train_x), recipe.epochs).to(device)
    correct = torch.stack([_correct(_fit(train_x, train_y, draws, lr=lr, recipe=recipe), test_x, test_y)
                           for lr in lrs])
    return [count / len(test_y) for count in correct.tolist()]


def bn_linear_accuracy(train_x: np.ndarray, train_y: np.ndarray, test_x: np.ndarray, test_y: np.ndarray,
                       lr: float = 0.1, *, seed: int = 0, recipe: BNLinearRecipe = BNLinearRecipe(),
                       device: torch.device | str | None = None) -> float:
    """MAE's linear probe on features ``[N,F]``: test accuracy in [0,1] (trained on ``device``)."""
    return bn_linear_path(train_x, train_y, test_x, test_y, (lr,), seed=seed, recipe=recipe, device=device)[0]
