"""What the device-sensitive tests share (issue 26): the device they run on and a counter of
host reads. ``MAE_TEST_DEVICE=cuda`` runs them on a GPU (benchmarks/gpu_check.sh); by default
they run on the CPU, where each asserts that its outputs stay on the inputs' device and that it
reads the host no more often than it must (the pattern of tests/test_objectives_device.py)."""

from __future__ import annotations

import os
import warnings
from contextlib import contextmanager

import torch

DEVICE = torch.device(os.environ.get("MAE_TEST_DEVICE", "cpu"))
# What CUDA's sync debug mode warns at each synchronizing call (c10/cuda: warn_or_error_on_sync).
# Not its one-time notice on being switched on, "Synchronization debug mode is a prototype
# feature and does not yet detect all synchronizing operations", which the first GPU run (issue
# 36) counted as a sync because both contain "synchroniz".
SYNC_WARNING = "called a synchronizing CUDA operation"
# Every way a tensor's value reaches the host (each one is a sync on a GPU).
HOST_READS = ("cpu", "item", "tolist", "numpy", "__float__", "__int__", "__bool__", "__index__")


class HostReads:
    """Counts the host reads of tensors, patched on ``torch.Tensor`` with ``monkeypatch``:
    ``calls`` holds (method, device type) in order. With ``fake_meta`` the reads of meta
    tensors, which have no values, are answered with zeros."""

    def __init__(self, monkeypatch, fake_meta: bool = False):
        self.calls: list[tuple[str, str]] = []
        self.monkeypatch, self.paused = monkeypatch, 0
        for name in HOST_READS:
            monkeypatch.setattr(torch.Tensor, name, self._wrap(name, getattr(torch.Tensor, name), fake_meta))

    def _wrap(self, name, original, fake_meta):
        def read(tensor, *args, **kwargs):
            if not self.paused:
                self.calls.append((name, tensor.device.type))
            if fake_meta and tensor.device.type == "meta":
                return [0.0] * tensor.numel() if name == "tolist" else 0.0
            return original(tensor, *args, **kwargs)
        return read

    def ignore(self, module, name: str) -> None:
        """Reads made inside ``module.name`` are not counted: work done on host tensors by
        design (a head initialised from a seeded CPU generator), which on the CPU this counter
        cannot tell from a read of the device."""
        original = getattr(module, name)

        def uncounted(*args, **kwargs):
            self.paused += 1
            try:
                return original(*args, **kwargs)
            finally:
                self.paused -= 1
        self.monkeypatch.setattr(module, name, uncounted)


def synchronizing_calls(caught: list[warnings.WarningMessage]) -> list[str]:
    """The warnings of CUDA's sync debug mode among ``caught``, each as ``file:line`` of the
    Python line that made the call (so a failing count names the calls), the notice left out."""
    return [f"{w.filename}:{w.lineno}" for w in caught if SYNC_WARNING in str(w.message)]


@contextmanager
def cuda_syncs():
    """On CUDA, the synchronising calls made in the block (CUDA's sync debug mode) as a list of
    ``file:line``, filled when the block ends; elsewhere an empty list."""
    found: list[str] = []
    if DEVICE.type != "cuda":
        yield found
        return
    torch.cuda.synchronize()
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        torch.cuda.set_sync_debug_mode("warn")
        try:
            yield found
        finally:
            torch.cuda.set_sync_debug_mode("default")
    found.extend(synchronizing_calls(caught))
