"""Checkpoints of the training loop: written atomically, read back with their damage named,
and restored into a run (model, optimiser, sampler, the DAE's noise generator, scaler, and where
the loop stands), so that resuming reproduces the uninterrupted run exactly on the CPU.
"""

from __future__ import annotations

import os
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch
from torch import nn

from .config import SEED_SOURCES, Config


class CheckpointError(RuntimeError):
    """A checkpoint file cannot be read (for example truncated by a crash mid-write)."""



def save_checkpoint(path: Path, state: dict[str, Any]) -> None:
    """Write atomically: a temporary file in the same folder, fsync, then rename. The previous
    checkpoint is kept as ``<name>.prev`` so a damaged newest file still leaves a good one."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(path.name + ".tmp")
    with open(tmp, "wb") as handle:
        torch.save(state, handle)
        handle.flush()
        os.fsync(handle.fileno())
    if path.exists():
        os.replace(path, path.with_name(path.name + ".prev"))
    os.replace(tmp, path)


CHECKPOINT_KEYS = ("step", "model", "config")  # what every checkpoint save_checkpoint writes holds


def load_checkpoint(path: Path) -> dict[str, Any]:
    """Load with ``weights_only=True``; raise :class:`CheckpointError` (one line naming the file)
    if the file is damaged or is not a checkpoint this trainer wrote."""
    try:
        state = torch.load(path, map_location="cpu", weights_only=True)
    except Exception as error:  # a truncated zip raises several different types
        reason = str(error).strip().splitlines()[0][:200] if str(error).strip() else type(error).__name__
        raise CheckpointError(f"checkpoint {path} cannot be read: {reason}") from error
    if not isinstance(state, dict) or any(key not in state for key in CHECKPOINT_KEYS):
        raise CheckpointError(f"checkpoint {path} cannot be read: not a checkpoint mae-study wrote "
                              f"(a mapping with {', '.join(CHECKPOINT_KEYS)})")
    return state


def load_latest_checkpoint(path: Path) -> tuple[dict[str, Any] | None, list[str]]:
    """The newest readable checkpoint at ``path`` (or its ``.prev``), with warnings about any
    damaged file that was skipped."""
    warnings: list[str] = []
    for candidate in (Path(path), Path(path).with_name(Path(path).name + ".prev")):
        if not candidate.exists():
            continue
        try:
            return load_checkpoint(candidate), warnings
        except CheckpointError as error:
            warnings.append(str(error))
    return None, warnings



def changed_keys(config: Config, saved: dict[str, Any]) -> list[str]:
    """Keys whose value differs from a checkpoint's config. A key the checkpoint predates
    (added to Config later) counts as unchanged while it keeps its default. ``compile_enabled``
    is not compared: it follows from ``compile`` and ``steps`` (compared) and the machine's
    device class, and a run may resume on another machine."""
    defaults = {name: field.default for name, field in Config.model_fields.items()}
    # A checkpoint written before the seed_* keys drew every source from its ``seed``.
    defaults.update({key: saved.get("seed") for key in SEED_SOURCES})
    return sorted(k for k, v in config.resolved().items()
                  if k != "compile_enabled"
                  and saved.get(k, defaults.get(k, v)) != v)



@dataclass
class LoopState:
    """Where the loop starts: step 0 with nothing recorded, or where a checkpoint left it. The
    loss summed since the last record travels too, so a resumed history equals the uninterrupted
    one even when checkpoint_every is no multiple of log_every."""
    step: int = 0
    history: list[tuple[int, float]] = field(default_factory=list)  # (step, mean train_loss)
    running_sum: float = 0.0
    since_log: int = 0
    resumed: bool = False



def restore_loop(checkpoint_path: Path | None, config: Config, model: nn.Module,
                 optimizer: torch.optim.Optimizer, sampler: torch.Generator,
                 scaler, noise: torch.Generator | None = None) -> tuple[LoopState, list[str]]:
    """Load the newest readable checkpoint under ``checkpoint_path`` into the model, optimizer,
    sampler, scaler and the DAE's ``noise`` generator (when it is not the sampler), and say where
    the loop resumes (a fresh LoopState when there is none). Refuses, with CheckpointError, a
    checkpoint written with another config. A checkpoint without the noise generator's state
    (written on the CPU, or before issue 26) resumes with that generator seeded afresh from the
    step, said in the warnings: the run goes on, but not bitwise as an uninterrupted one."""
    state, warnings = load_latest_checkpoint(checkpoint_path) if checkpoint_path else (None, [])
    if state is None:
        return LoopState(), warnings
    changed = changed_keys(config, state["config"])
    if changed:
        raise CheckpointError(f"checkpoint {checkpoint_path} was written with different "
                              f"values of {', '.join(changed)}; resume with the same config")
    model.load_state_dict(state["model"])
    optimizer.load_state_dict(state["optimizer"])
    sampler.set_state(state["sampler"])
    if noise is not None and noise is not sampler:
        if "noise" in state:
            noise.set_state(state["noise"])
        else:
            noise.manual_seed(config.masks_seed + 2 + int(state["step"]))
            warnings = [*warnings, f"checkpoint {checkpoint_path} holds no state of the DAE's noise generator "
                        f"on {noise.device.type} (written on the CPU or before issue 26): its noise after step "
                        f"{int(state['step'])} is drawn afresh, so this run is not bitwise an uninterrupted one"]
    if "scaler" in state:
        scaler.load_state_dict(state["scaler"])
    return LoopState(step=int(state["step"]),
                     history=[(int(s), float(v)) for s, v in state["history"]],
                     running_sum=float(state.get("running_sum", 0.0)),
                     since_log=int(state.get("since_log", 0)), resumed=True), warnings

