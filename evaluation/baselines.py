"""Baselines computed once per study and read by every cell that shares them.

A trial's baselines (the probes of a freshly initialised encoder, ``random_probe_*``; of raw
pixels, ``pixel_probe_*``; training from scratch, ``random_finetune_acc`` and
``scratch_best_finetune_*``) do not depend on what pretraining did. They are a function of the
fresh encoder's weights, the data, the evaluation settings, the seed and the device. The cells
of a mask-ratio or decoder sweep share one set per seed (the fresh encoder is drawn
independently of the decoder: :func:`evaluation.probes.random_init_model`), and training from
scratch (a run per candidate length, then the refit) is costly, so a study keeps each set in
``baselines/KEY.json`` under its folder and the other cells read it. The pretrained model's
fine-tuning (``finetune_acc``, ``finetune_best_*``) depends on the trained encoder and is never
kept here.

The key is a SHA-256 of everything the baselines read: the fresh encoder's tensors (an encoder
changed by any key, such as its width or ``encoder_init``, is another key), the splits' bytes and
labels, every ``eval.*`` setting a baseline reads, the seed, the device, the precision, the versions of torch,
numpy and scikit-learn, and the source of the modules that compute baselines. Two
cells with equal keys would compute equal numbers (the probes are deterministic on one device),
so reading one in place of computing it changes no metric; the trial's ``baselines`` tag says
which it did.
"""

from __future__ import annotations

import fcntl
import hashlib
import json
import os
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

import torch
from torch import nn

from mae_core.config import Config, EvalConfig
from mae_core.data import PatchData

FORMAT = 1  # the file's layout
# eval.* keys only the pretrained encoder's fine-tuning (or layer-wise probes) reads: cells that differ in them alone
# (partial_finetune's rows) share their baselines.
PRETRAINED_ONLY_SETTINGS = ("finetune_blocks", "finetune_layer_decay", "probe_blocks")
# eval.repeats runs the whole evaluation once per seed; a set of baselines reads one seed (hashed).
_NOT_READ = {*PRETRAINED_ONLY_SETTINGS, "repeats"}
# The code that computes baselines is part of the key: an edited probe never reads old numbers.
_SOURCES = ("probes.py", "features.py", "linear_head.py", "finetune_recipe.py", "baselines.py")


def baseline_prefixes() -> tuple[str, ...]:
    """The metric prefixes of every registered evaluator's baselines, in registration order
    (:attr:`mae_core.evaluator.Evaluator.baselines`; the built-in probes': ``random_probe_``,
    ``pixel_probe_``, ``random_finetune_``, ``scratch_best_finetune_``)."""
    from mae_core.registry import evaluators

    entries = [evaluators.get(name) for name in evaluators.names()]
    return tuple(dict.fromkeys(prefix for entry in entries
                               for prefix in getattr(entry.evaluator_class, "baselines", {})))


def is_baseline_metric(name: str) -> bool:
    """Whether ``name`` is a baseline's metric (one of :func:`baseline_prefixes`)."""
    return name.startswith(baseline_prefixes())


def _hash_tensor(digest: "hashlib._Hash", name: str, tensor: torch.Tensor) -> None:
    tensor = tensor.detach().cpu().contiguous()
    digest.update(f"{name}|{tensor.dtype}|{tuple(tensor.shape)}|".encode())
    digest.update(tensor.view(torch.uint8).numpy().tobytes() if tensor.numel() else b"")


def baseline_key(fresh: nn.Module, config: Config, data: PatchData, settings: EvalConfig, seed: int,
                 device: torch.device) -> str:
    """The SHA-256 (hex) of what the baselines of ``fresh`` (the config's model at
    initialisation) on ``data`` read. Of the model, the encoder's tensors: features and
    fine-tuning read the encoder alone (a decoder weight gets no gradient there). Cells that
    differ only in the decoder (width, depth, heads) share a key: their fresh encoders are the
    one encoder of their seed (:func:`evaluation.probes.random_init_model`), and no decoder key
    is hashed. The model's class is: an MAE and an AE/DAE cell keep their own sets."""
    import numpy
    import sklearn

    digest = hashlib.sha256()
    digest.update(json.dumps({"format": FORMAT, "model": type(fresh).__name__, "seed": seed,
                              "device": str(device), "precision": config.precision,
                              "versions": [torch.__version__, numpy.__version__, sklearn.__version__],
                              "eval": settings.model_dump(mode="json", exclude=_NOT_READ)},
                             sort_keys=True).encode())
    here = Path(__file__).parent
    for source in _SOURCES:
        digest.update((here / source).read_bytes())
    for name, tensor in fresh.encoder.state_dict().items():
        _hash_tensor(digest, f"encoder.{name}", tensor)
    for name in ("train_patches", "train_labels", "test_patches", "test_labels"):
        _hash_tensor(digest, name, getattr(data, name))
    return digest.hexdigest()


@dataclass
class BaselineCache:
    """``folder/KEY.json`` per set of baselines, written whole (temporary file, then rename), so
    a reader never sees half of one. A trial that asks for a key another trial is computing
    waits for it (a lock file per key) rather than computing it twice. ``outcomes`` lists
    ``(key, "computed" | "reused")`` in the order this object served them."""

    folder: Path
    outcomes: list[tuple[str, str]] = field(default_factory=list)

    def get_or_compute(self, key: str, compute: Callable[[], dict[str, float]]) -> dict[str, float]:
        path = self.folder / f"{key}.json"
        self.folder.mkdir(parents=True, exist_ok=True)
        with (self.folder / f"{key}.lock").open("w") as lock:
            fcntl.flock(lock, fcntl.LOCK_EX)  # released when the file closes, or its process dies
            if path.exists():
                self.outcomes.append((key, "reused"))
                return {name: float(value) for name, value in json.loads(path.read_text())["metrics"].items()}
            metrics = compute()
            temporary = path.with_suffix(f".{os.getpid()}.tmp")
            temporary.write_text(json.dumps({"format": FORMAT, "metrics": metrics}, indent=1, sort_keys=True))
            os.replace(temporary, path)
        self.outcomes.append((key, "computed"))
        return metrics


def evaluator_baseline_key(evaluator, trial, which: str) -> str:
    """The key of one baseline of a class-based evaluator (:class:`evaluation.evaluators.FrozenFeatureProbe`):
    :func:`baseline_key` of the trial's encoder at initialisation, and the evaluator's name, that
    baseline (``which``: prefix and reference), its settings and its module's source (an edited
    plugin never reads old numbers)."""
    import inspect
    import sys

    features, config = trial.features, trial.config
    digest = hashlib.sha256(baseline_key(features.random_init_model(), config, trial.data, config.eval,
                                         config.eval_seed, features.device).encode())
    digest.update(json.dumps({"evaluator": evaluator.name, "baseline": which,
                              "settings": evaluator.settings.model_dump(mode="json")}, sort_keys=True).encode())
    module = sys.modules.get(type(evaluator).__module__)
    try:
        digest.update(inspect.getsource(module).encode() if module is not None else b"")
    except (OSError, TypeError):  # no source to read (an interactive definition): the name alone
        digest.update(type(evaluator).__qualname__.encode())
    return digest.hexdigest()


def cached_baseline(evaluator, trial, which: str, compute) -> dict[str, float]:
    """One baseline of a class-based evaluator: from the study's cache (:class:`BaselineCache`)
    when another cell computed it under :func:`evaluator_baseline_key`, else ``compute()`` (and
    kept for the others); computed outright where the trial has no cache."""
    if trial.baselines is None:
        return compute()
    return trial.baselines.get_or_compute(evaluator_baseline_key(evaluator, trial, which), compute)

