"""Moving tensors to a trial's device without waiting for it (issue 26).

A plain ``tensor.to("cuda")`` from pageable host memory waits for the device's stream: a host
sync. A host tensor copied through pinned memory with ``non_blocking`` is queued instead, so the
host keeps queuing work; pinning needs CUDA, so nothing is pinned on a CPU-only machine.
"""

from __future__ import annotations

import torch


def to_device(tensor: torch.Tensor, device: torch.device | str) -> torch.Tensor:
    """``tensor`` on ``device`` (itself when already there); a host tensor reaches a CUDA device
    through pinned memory, without blocking the host."""
    device = torch.device(device)
    if tensor.device == device or (device.index is None and tensor.device.type == device.type):
        return tensor
    if device.type == "cuda" and tensor.device.type == "cpu":
        return tensor.pin_memory().to(device, non_blocking=True)
    return tensor.to(device)


def pin_if_cuda(tensor: torch.Tensor) -> torch.Tensor:
    """``tensor`` in pinned host memory when CUDA is available (an asynchronous copy to the GPU
    reads it), else itself: pinning on a CPU-only machine raises."""
    return tensor.pin_memory() if torch.cuda.is_available() else tensor


def resolve_device(choice: str) -> torch.device:
    """The ``device`` key resolved: ``auto`` is CUDA where there is one, else the CPU."""
    if choice == "auto":
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    if choice == "cuda" and not torch.cuda.is_available():
        raise ValueError("device=cuda but no CUDA device is available; use device=auto or cpu")
    return torch.device(choice)

