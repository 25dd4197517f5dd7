"""Mixed precision: which dtype the forward pass runs in, and the gradient scaler fp16 needs.

The loss, the risks and the optimiser state stay fp32 whatever the choice: only the model's
forward pass runs under autocast (the trainer casts predictions to fp32 before the loss).
``auto`` is bf16 on CUDA (same exponent range as fp32, so no scaler) and fp32 on the CPU,
where bf16 matmuls are not faster on most machines.
"""

from __future__ import annotations

import contextlib

import torch

PRECISIONS = ("auto", "fp32", "bf16", "fp16")
_DTYPES = {"bf16": torch.bfloat16, "fp16": torch.float16}


def resolve_precision(precision: str, device: torch.device) -> str:
    """``auto`` -> ``bf16`` on CUDA, ``fp32`` elsewhere; any other choice is kept."""
    if precision not in PRECISIONS:
        raise ValueError(f"precision={precision!r} is not one of {', '.join(PRECISIONS)}")
    if precision == "auto":
        return "bf16" if device.type == "cuda" else "fp32"
    return precision


def autocast(precision: str, device: torch.device, cache_enabled: bool = True) -> contextlib.AbstractContextManager:
    """The forward pass's context: ``torch.autocast`` in bf16/fp16, nothing for fp32.
    ``cache_enabled=False`` turns off autocast's cache of cast weights, as torch's CUDA-graph
    notes require for a captured region under autocast (a cast cached during capture would not
    be recomputed on replay)."""
    resolved = resolve_precision(precision, device)
    if resolved == "fp32":
        return contextlib.nullcontext()
    return torch.autocast(device.type, dtype=_DTYPES[resolved], cache_enabled=cache_enabled)


def grad_scaler(precision: str, device: torch.device) -> torch.amp.GradScaler:
    """A loss scaler, enabled for fp16 only (its 5-bit exponent underflows small gradients).

    A step whose scaled gradients overflow is skipped by the scaler and the scale is lowered:
    that is the scaler working, not the run diverging.
    """
    return torch.amp.GradScaler(device.type, enabled=resolve_precision(precision, device) == "fp16")
