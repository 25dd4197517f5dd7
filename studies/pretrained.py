"""Pretrain once, evaluate many: the trials of a study that differ only in ``eval.*`` keys share
one trained encoder.

A trial's pretraining (the J updates of :func:`mae_core.train.train`) reads every config key
except the ``eval.*`` ones, the seed among them, the pretraining images and the engine's code;
its evaluation reads the trained model and the ``eval.*`` settings. The cells of
``partial_finetune`` (four values of ``eval.finetune_blocks``) or of a study file with
``axes: {eval.fewshot: [2, 4]}`` therefore train the same encoder once per seed: the first trial
that asks for a key trains it (with its checkpoints, as any trial) and keeps the trained model in
``pretrained/KEY.pt`` under the study's folder (beside ``baselines/``); the others wait for it on
the key's lock file and evaluate that model. Each trial stays its own MLflow child run with its
own ``eval.*`` params and every metric; its ``pretraining`` tag says ``computed KEY`` or
``reused KEY``.

A reusing trial carries the computing trial's pretraining as its own, since it is the same
computation: the ``train_loss`` history (the same steps and values), with ``eval.every > 0`` the
online evaluation's histories (copied from the computing run; the ``eval.*`` keys they read are
then part of the key), ``train_seconds`` (what its
encoder took to train), and a pointer, the ``pretraining_run`` tag (the computing run's id, whose
``checkpoint/checkpoint.pt`` artifact holds the encoder; ``mae-study evaluate`` follows it). It
logs no checkpoint of its own.

The key is a SHA-256 of: every key of ``Config.resolved()`` but ``eval.*`` (seed included;
with ``eval.every > 0`` also the ``eval.*`` keys of :data:`evaluation.online.READS`), the
device the trial trains on, the versions of torch and numpy, the source of every module of the
``mae_core`` package (the engine that trains: an edited engine never reads an old encoder;
robust to uncommitted edits, which a git commit is not), and the stored bytes of the pretraining
images. ``KEY.pt`` is written whole (a temporary file, fsync, then rename), so a reader never
sees half of one; a trial killed while training holds no file, and the lock (``fcntl.flock``)
is released when its process dies. A trial that resumes its own training (it has a checkpoint)
finishes it even if another trial kept an encoder for its key meanwhile (it keeps that file).
"""

from __future__ import annotations

import fcntl
import functools
import hashlib
import json
import logging
import os
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import torch

from evaluation.online import READS as ONLINE_READS
from mae_core.config import EVAL_PREFIX, Config
from mae_core.images import ImageStore
from mae_core.train import PatchData, resolve_device

FORMAT = 1  # the file's layout
PRETRAINED_DIR = "pretrained"  # in the study's output folder, beside baselines/
TAG = "pretraining"  # "computed KEY" or "reused KEY"
SOURCE_TAG = "pretraining_run"  # the run whose trained encoder (checkpoint artifact) this run evaluated


@functools.lru_cache(maxsize=1)
def code_digest() -> str:
    """SHA-256 of every ``mae_core`` source file (relative path and bytes), read once per process:
    the code this process trains with."""
    import mae_core

    root = Path(mae_core.__file__).parent
    digest = hashlib.sha256()
    for path in sorted(root.rglob("*.py")):
        digest.update(f"{path.relative_to(root).as_posix()}|".encode())
        digest.update(path.read_bytes())
    return digest.hexdigest()


def pretraining_config(config: Config) -> dict[str, Any]:
    """Every resolved key the pretraining reads: all but the ``eval.*`` ones, except, with
    ``eval.every > 0``, those the online evaluation reads while it trains (its histories are
    part of what a reusing trial carries over)."""
    online = {f"{EVAL_PREFIX}.{key}" for key in ONLINE_READS} if config.eval.every > 0 else set()
    return {key: value for key, value in config.resolved().items()
            if not key.startswith(f"{EVAL_PREFIX}.") or key in online}


def _hash_store(digest: "hashlib._Hash", name: str, images: ImageStore) -> None:
    digest.update(f"{name}|{np.dtype(images.source.dtype)}|{images.shape}|".encode())
    if images.table is not None:
        digest.update(images.table.tobytes())
    for _, stored in images.chunks():
        digest.update(np.ascontiguousarray(stored).tobytes())


def pretraining_key(config: Config, data: PatchData) -> str:
    """The SHA-256 (hex) of what pretraining ``config`` on ``data`` reads (the module docstring)."""
    digest = hashlib.sha256()
    digest.update(json.dumps({"format": FORMAT, "config": pretraining_config(config),
                              "device": str(resolve_device(config.device)),
                              "versions": [torch.__version__, np.__version__]},
                             sort_keys=True, default=str).encode())
    digest.update(code_digest().encode())
    _hash_store(digest, "pretraining", data.pretraining)
    return digest.hexdigest()


@dataclass(frozen=True)
class SharedEncoder:
    """What ``KEY.pt`` holds: the trained model's tensors (CPU), the pretraining's
    ``train_loss`` history, the computing run and its training seconds."""

    model: dict[str, torch.Tensor]
    history: list[tuple[int, float]]
    run_id: str
    train_seconds: float

    def load_into(self, module: torch.nn.Module) -> torch.nn.Module:
        module.load_state_dict(self.model)
        return module


@dataclass
class Claim:
    """A key held under its lock: ``found`` is the stored encoder to reuse (None: compute it,
    then :meth:`keep` it)."""

    key: str
    path: Path
    found: SharedEncoder | None
    keep_existing: bool  # a readable file is there already (a resumed computing trial keeps it)

    def keep(self, model: torch.nn.Module, history: list[tuple[int, float]], run_id: str,
             train_seconds: float) -> None:
        """Write the trained model whole (temporary file, fsync, rename)."""
        if self.keep_existing:
            return
        state = {"format": FORMAT, "key": self.key, "run_id": run_id, "train_seconds": float(train_seconds),
                 "history": [(int(step), float(value)) for step, value in history],
                 "model": {name: tensor.detach().cpu() for name, tensor in model.state_dict().items()}}
        temporary = self.path.with_name(f"{self.path.name}.{os.getpid()}.tmp")
        with open(temporary, "wb") as handle:
            torch.save(state, handle)
            handle.flush()
            os.fsync(handle.fileno())
        os.replace(temporary, self.path)


def read_encoder(path: Path) -> SharedEncoder | None:
    """The encoder kept at ``path``; None when there is none or it cannot be read."""
    if not path.exists():
        return None
    try:
        state = torch.load(path, map_location="cpu", weights_only=True)
        return SharedEncoder(model=state["model"], history=[(int(s), float(v)) for s, v in state["history"]],
                             run_id=str(state["run_id"]), train_seconds=float(state["train_seconds"]))
    except Exception as error:  # damaged: computed again and replaced
        logging.getLogger(__name__).warning("shared encoder %s cannot be read (%s); training it again", path, error)
        return None


@dataclass
class PretrainedCache:
    """``folder/KEY.pt`` per trained encoder, one lock file (``KEY.lock``) per key: a trial that
    asks for a key another trial is training waits for it rather than training it twice.
    ``outcomes`` lists ``(key, "computed" | "reused")`` in the order this object served them."""

    folder: Path
    outcomes: list[tuple[str, str]] = field(default_factory=list)

    def path(self, key: str) -> Path:
        return self.folder / f"{key}.pt"

    @contextmanager
    def claim(self, key: str, *, own_work: bool = False) -> Iterator[Claim]:
        """Hold ``key``'s lock for the block. ``own_work``: the caller resumes its own training
        of this key (it has a checkpoint) and computes whatever is stored."""
        self.folder.mkdir(parents=True, exist_ok=True)
        with (self.folder / f"{key}.lock").open("w") as lock:
            fcntl.flock(lock, fcntl.LOCK_EX)  # released when the file closes, or its process dies
            stored = read_encoder(self.path(key))
            claim = Claim(key=key, path=self.path(key), found=None if own_work else stored,
                          keep_existing=stored is not None)
            yield claim
        self.outcomes.append((key, "reused" if claim.found is not None else "computed"))
