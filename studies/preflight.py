"""What is checked before Ray or MLflow start: the Ray address answers, the resources fit, and
``--resume`` finds the study it should continue (``study.json``, :mod:`studies.lifecycle`).
"""

from __future__ import annotations

import os
import socket
from typing import Any
from urllib.parse import urlparse

from .lifecycle import load_state
from .planning import RunOptions, StudyPlan, StudySetupError
from .study import cell_id


def check_address(address: str | None, timeout_s: float = 3.0) -> None:
    """Fail within seconds on an address nothing listens at (``ray.init`` can hang instead)."""
    if address in (None, "auto", "local"):
        return
    parsed = urlparse(address if "://" in address else f"ray://{address}")
    if not parsed.hostname or not parsed.port:
        raise StudySetupError(f"--address {address}: expected auto, host:port or ray://host:port")
    try:
        with socket.create_connection((parsed.hostname, parsed.port), timeout=timeout_s):
            pass
    except OSError as error:
        raise StudySetupError(f"--address {address}: no Ray cluster reachable ({error.strerror or error})") from None


def available_resources(address: str | None) -> dict[str, float] | None:
    """CPUs and GPUs the study's Ray offers: the running Ray's, or for a local Ray still to be
    started this machine's (its CPUs and CUDA devices); None for a cluster not yet joined."""
    import ray

    if ray.is_initialized():
        return {name: float(ray.cluster_resources().get(name, 0.0)) for name in ("CPU", "GPU")}
    if address in (None, "local"):
        import torch

        return {"CPU": float(os.cpu_count() or 1), "GPU": float(torch.cuda.device_count())}
    return None


def check_resources(options: RunOptions, available: dict[str, float], where: str) -> None:
    """Refuse a per-trial request no node could ever meet: Ray would wait for it forever."""
    for name, asked in (("CPU", options.cpus_per_trial), ("GPU", options.gpus_per_trial)):
        flag = f"--{name.lower()}s-per-trial {asked:g}"
        if name == "GPU" and options.trials_per_gpu is not None:  # the flag the user gave
            flag = f"--trials-per-gpu {options.trials_per_gpu} ({asked:g} GPU per trial)"
        if options.workers_per_trial > 1:  # every worker of a trial asks for that share
            flag, asked = f"{flag} × --workers-per-trial {options.workers_per_trial}", asked * options.workers_per_trial
        if asked < 0 or (name == "CPU" and asked == 0):
            raise StudySetupError(f"{flag}: must be {'positive' if name == 'CPU' else 'at least 0'}")
        if asked > available.get(name, 0.0):
            raise StudySetupError(f"{flag}: each trial asks for {asked:g} {name}(s) but {where} has "
                                  f"{available.get(name, 0.0):g}")


def default_gpus_per_trial(num_trials: int, cpus_per_trial: float, address: str | None) -> float:
    """A GPU's share per trial when the user named none: 0 without a local CUDA device; else the
    trials that can run at once (by CPUs, at most 8: small models share a GPU well) split one GPU."""
    import torch

    if address not in (None, "local") or not torch.cuda.is_available():
        return 0.0
    at_once = max(1, min(8, num_trials, int((os.cpu_count() or 1) // max(cpus_per_trial, 1e-9))))
    return 1.0 / at_once


def check_resume(plan: StudyPlan, options: RunOptions) -> dict[str, Any] | None:
    """The saved state to resume, or None for a fresh study; refuses a changed grid, and refuses
    to start afresh over an interrupted study (its state would be overwritten, and with it the
    only way to resume it)."""
    state = load_state(options.out_dir)
    if not options.resume:
        if state is not None and not state.get("complete", False):
            name = f" ({state['name']})" if state.get("name") else ""
            raise StudySetupError(f"{options.out_dir} holds an unfinished study{name}: pass --resume "
                                  "to continue it, or --out FOLDER to start anew")
        return None
    from ray.tune import Tuner

    if state is None:
        raise StudySetupError(f"--resume: no study to resume in {options.out_dir}")
    if sorted(cell_id(c) for c in plan.cells) != sorted(state["cells"]):
        raise StudySetupError(
            f"--resume: the grid differs from the interrupted study in {options.out_dir} "
            "(same study, overrides and --smoke are required); run without --resume to start anew"
        )
    searched = plan.search.describe() if plan.search is not None else None
    if state.get("search") != searched:
        raise StudySetupError(f"--resume: the search differs from the interrupted study in {options.out_dir} "
                              "(same --search, --samples, --metric and ranges are required)")
    # Interrupted before Ray wrote anything: the grid starts in Ray afresh, under the same
    # parent run (cells whose child run already FINISHED are not trained again).
    state["ray_restorable"] = Tuner.can_restore(state["ray_path"])
    return state
