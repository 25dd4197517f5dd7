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
with ``eval.every > 0`` also the ``eval.*`` keys of :data:`evaluation.online.READS`; of the
``seed_*`` keys those that differ from ``seed``, and ``seed_eval`` only with ``eval.every > 0``:
trials that differ only in ``seed_eval`` share their pretraining), the
device the trial trains on (and, for a data-parallel trial, its number of workers), the versions of torch and numpy, the source of every module of the
``mae_core`` package (the engine that trains: an edited engine never reads an old encoder;
robust to uncommitted edits, which a git commit is not), and the stored bytes of the pretraining
images. ``KEY.pt`` is written whole (a temporary file, fsync, then rename), so a reader never
sees half of one; a trial killed while training holds no file, and the lock (``fcntl.flock``)
is released when its process dies. A trial that resumes its own training (it has a checkpoint)
finishes it even if another trial kept an encoder for its key meanwhile (it keeps that file).

A study over training lengths (a ``steps`` axis) trains a shorter length once for all: where
the first S updates of a longer run are exactly a run of S updates (:func:`prefix_lengths`: the
same learning rate at every one of them, and the loss logged at S), the longer trial keeps its
model at update S under the S-update trial's key, and that trial evaluates it (``reused KEY``,
with ``pretraining_source_steps`` naming the longer run's length, and the model it read logged as
its own ``checkpoint/checkpoint.pt`` artifact, which ``mae-study evaluate`` reads). The longer trial reserves
those keys before it trains, without waiting (:meth:`PretrainedCache.reserve`): a key some
other trial holds is left to it, so a shorter run is never waited for by a longer one. The
longest lengths run first (:func:`studies.planning.tune_space`), and a shorter trial gives them a
few seconds to reserve its key before it claims it (:meth:`PretrainedCache.await_reservation`).
"""

from __future__ import annotations

import fcntl
import functools
import hashlib
import json
import logging
import os
import time
from collections.abc import Iterable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import torch

from evaluation.online import READS as ONLINE_READS
from mae_core.config import EVAL_PREFIX, SEED_SOURCES, Config
from mae_core.images import ImageStore
from mae_core.data import PatchData
from mae_core.devices import resolve_device
from mae_core.optimizer import learning_rate

FORMAT = 1  # the file's layout
PRETRAINED_DIR = "pretrained"  # in the study's output folder, beside baselines/
TAG = "pretraining"  # "computed KEY" or "reused KEY"
SOURCE_TAG = "pretraining_run"  # the run whose trained encoder (checkpoint artifact) this run evaluated
SOURCE_STEPS_TAG = "pretraining_source_steps"  # a prefix's reader: the length of the run it was kept from
PREFIX_GRACE_S = 30.0  # how long a shorter trial gives a longer one to reserve its key (PretrainedCache.await_reservation)


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
    keys = {key: value for key, value in config.resolved().items()
            if not key.startswith(f"{EVAL_PREFIX}.") or key in online}
    if config.eval.every == 0:  # seed_eval draws only after training: its trials share one pretraining
        keys.pop("seed_eval")
    # A source seeded by ``seed`` itself is left out, so a key is the one it was before the
    # seed_* keys existed, and seed_init=None and seed_init=seed (the same training) share it.
    return {key: value for key, value in keys.items() if key not in SEED_SOURCES or value != config.seed}


def _hash_store(digest: "hashlib._Hash", name: str, images: ImageStore) -> None:
    digest.update(f"{name}|{np.dtype(images.source.dtype)}|{images.shape}|".encode())
    if images.table is not None:
        digest.update(images.table.tobytes())
    for _, stored in images.chunks():
        digest.update(np.ascontiguousarray(stored).tobytes())


def images_digest(data: PatchData) -> str:
    """SHA-256 (hex) of the stored pretraining images (one pass over them)."""
    digest = hashlib.sha256()
    _hash_store(digest, "pretraining", data.pretraining)
    return digest.hexdigest()


def pretraining_key(config: Config, data: PatchData, images: str | None = None, workers: int = 1) -> str:
    """The SHA-256 (hex) of what pretraining ``config`` on ``data`` reads (the module docstring);
    ``images``: :func:`images_digest` of ``data`` when the caller has it. ``workers``: the
    processes one run trains on (:mod:`studies.ddp`); a data-parallel run sums its gradients in
    another order, so its encoder is kept under a key of its own (one process: the key as ever)."""
    digest = hashlib.sha256()
    digest.update(json.dumps({"format": FORMAT, "config": pretraining_config(config),
                              "device": str(resolve_device(config.device)),
                              "versions": [torch.__version__, np.__version__],
                              **({"workers": workers} if workers > 1 else {})},
                             sort_keys=True, default=str).encode())
    digest.update(code_digest().encode())
    digest.update((images or images_digest(data)).encode())
    return digest.hexdigest()


@dataclass(frozen=True)
class SharedEncoder:
    """What ``KEY.pt`` holds: the trained model's tensors (CPU), the pretraining's
    ``train_loss`` history, the computing run and its training seconds."""

    model: dict[str, torch.Tensor]
    history: list[tuple[int, float]]
    run_id: str
    train_seconds: float
    source_steps: int | None = None  # kept at an update of a longer run (its length); None: at its end

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
             train_seconds: float, source_steps: int | None = None) -> None:
        """Write the trained model whole (temporary file, fsync, rename)."""
        if not self.keep_existing:
            _write(self.path, self.key, model, history, run_id, train_seconds, source_steps)


def _write(path: Path, key: str, model: torch.nn.Module, history: list[tuple[int, float]], run_id: str,
           train_seconds: float, source_steps: int | None) -> None:
    state = {"format": FORMAT, "key": key, "run_id": run_id, "train_seconds": float(train_seconds),
             "history": [(int(step), float(value)) for step, value in history],
             "model": {name: tensor.detach().cpu() for name, tensor in model.state_dict().items()},
             **({"source_steps": int(source_steps)} if source_steps is not None else {})}
    temporary = path.with_name(f"{path.name}.{os.getpid()}.tmp")
    with open(temporary, "wb") as handle:
        torch.save(state, handle)
        handle.flush()
        os.fsync(handle.fileno())
    os.replace(temporary, path)


@dataclass
class Reservation:
    """A shorter length's key held by the longer trial that will keep its model (its lock file
    open until :meth:`release`; released too when the process dies)."""

    key: str
    path: Path
    steps: int
    lock: Any  # the open lock file

    def keep(self, model: torch.nn.Module, history: list[tuple[int, float]], run_id: str,
             train_seconds: float, source_steps: int) -> None:
        """Write the model at update ``steps`` (the history up to it), then let the reader in."""
        _write(self.path, self.key, model, [(s, v) for s, v in history if s <= self.steps], run_id,
               train_seconds, source_steps)
        self.release()

    def release(self) -> None:
        if not self.lock.closed:
            self.lock.close()


def read_encoder(path: Path) -> SharedEncoder | None:
    """The encoder kept at ``path``; None when there is none or it cannot be read."""
    if not path.exists():
        return None
    try:
        state = torch.load(path, map_location="cpu", weights_only=True)
        return SharedEncoder(model=state["model"], history=[(int(s), float(v)) for s, v in state["history"]],
                             run_id=str(state["run_id"]), train_seconds=float(state["train_seconds"]),
                             source_steps=int(state["source_steps"]) if "source_steps" in state else None)
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
    # the study's training lengths (a steps axis): a trial keeps its model at the shorter ones
    # that are prefixes of its run (prefix_lengths) for the trials of those lengths
    lengths: tuple[int, ...] = ()
    workers: int = 1  # processes each trial trains on (pretraining_key)

    def key(self, config: Config, data: PatchData, images: str | None = None) -> str:
        """:func:`pretraining_key` of a trial of this study."""
        return pretraining_key(config, data, images, self.workers)

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

    def await_reservation(self, key: str, timeout: float = PREFIX_GRACE_S) -> None:
        """Give a longer trial of the study up to ``timeout`` seconds to reserve ``key`` (it starts
        first, but may reach its reservation after this trial reaches its claim): return once the
        key is stored, held, or the time is up. Only how much is shared depends on this wait,
        never a result: a key nobody reserved is then claimed and trained as any other."""
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline and not self.path(key).exists():
            lock = self._try_lock(key)
            if lock is None:
                return  # held: the claim waits for the holder
            lock.close()
            time.sleep(0.25)

    def reserve(self, key: str, steps: int) -> Reservation | None:
        """``key``'s lock taken without waiting, for a model kept at update ``steps`` of a longer
        run; None when another trial holds the key or an encoder is stored for it already."""
        lock = self._try_lock(key)
        if lock is None:
            return None
        if read_encoder(self.path(key)) is not None:
            lock.close()
            return None
        return Reservation(key=key, path=self.path(key), steps=steps, lock=lock)

    def _try_lock(self, key: str):
        """``key``'s lock file, open and locked, or None when another process holds it."""
        self.folder.mkdir(parents=True, exist_ok=True)
        lock = (self.folder / f"{key}.lock").open("w")
        try:
            fcntl.flock(lock, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            lock.close()
            return None
        return lock


def read_from_longer(config: Config, lengths: Iterable[int]) -> bool:
    """Whether a longer length of ``lengths`` passes through ``config``'s run (a longer trial
    of the study keeps its model at ``config.steps``)."""
    return any(config.steps in prefix_lengths(with_steps(config, longer), [config.steps])
               for longer in lengths if longer > config.steps)


def _rates(config: Config, updates: int) -> list[float]:
    return [learning_rate(t, peak=config.actual_lr, warmup_steps=config.warmup_updates,
                          total_steps=config.steps, schedule=config.schedule) for t in range(updates)]


def with_steps(config: Config, steps: int) -> Config:
    """``config`` as a run of ``steps`` updates (validated, as that trial builds it)."""
    return Config(**{**config.model_dump(exclude_unset=True), "steps": steps})


def prefix_lengths(config: Config, lengths: Iterable[int]) -> list[int]:
    """The lengths S among ``lengths`` (shorter than ``config.steps``) whose whole run is the first
    S updates of ``config``'s run: the learning rate of every update t < S is the same in both
    (a constant schedule without warm-up or with one of ``warmup_steps`` updates; a cosine or a
    warm-up in fractions depends on the length), and both record the loss (and the online evaluation) at S, so the histories agree.
    The draws of I_t and V_t, the initialisation and every other key are the same already."""
    found = []
    for steps in sorted({int(s) for s in lengths if 0 < int(s) < config.steps}):
        if config.log_every <= 0 or steps % config.log_every:
            continue
        if config.eval.every > 0 and steps % config.eval.every:
            continue
        try:
            shorter = with_steps(config, steps)
        except ValueError:  # not a valid run of that length (pydantic's ValidationError is one)
            continue
        if _rates(shorter, steps) == _rates(config, steps):
            found.append(steps)
    return found


@contextmanager
def reserved_prefixes(cache: PretrainedCache, config: Config, data: PatchData,
                      resumes_at: int = 0) -> Iterator[dict[int, Reservation]]:
    """The shorter lengths of ``cache.lengths`` this run will keep a model for (steps ->
    :class:`Reservation`): those that are prefixes of it, that it has still to pass (a run
    resumed at update ``resumes_at`` cannot keep an earlier one, so it leaves those to their own
    trials at once), and that no other trial holds or has kept. Whatever is not kept when the
    block ends is released (an interrupted run keeps nothing)."""
    reserved: dict[int, Reservation] = {}
    lengths = [steps for steps in prefix_lengths(config, cache.lengths) if steps > resumes_at]
    images = images_digest(data) if lengths else None
    try:
        for steps in lengths:
            reservation = cache.reserve(cache.key(with_steps(config, steps), data, images), steps)
            if reservation is not None:
                reserved[steps] = reservation
        yield reserved
    finally:
        for reservation in reserved.values():
            reservation.release()
