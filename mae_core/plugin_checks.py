"""What a plugin's part must return, checked where the engine calls it (the contract of
:mod:`mae_core.registry`; shapes: ``B`` images, ``M`` patches, ``q`` values each).

* a target: a floating tensor ``[B,M,out_dim or q]`` (its input's leading shape) on its input's device;
* a corruption: a tensor of its input's shape and dtype, on its input's device;
* a mask sampler: integer positions ``[B,k]``, k distinct positions in ``[0,M)`` per row;
* a dataset format: checked where its arrays become splits (:func:`mae_core.formats.array_splits`).

A plugin's part is checked on every call: reading a result's shape, dtype and device costs
microseconds beside an update, and a mask sampler's rows are checked after the sort its caller
makes anyway (on the host, ``[B,k]``), so a sampler that repeats a position only now and then
is still caught. The built-in parts (:mod:`mae_core.builtin_parts`) are held to the same rules
by their own tests and are called unchecked: the hot path stays as it was.

A broken rule is a :class:`PluginResultError`: one line naming the part (its config key and
registered name) and the rule. So is a part that calls ``sys.exit``: a plugin's ``SystemExit``
must not end the command quietly (or, in a Ray trial, look like Ray stopping it). A trial that
meets either ends FAILED with the line as its ``failure_reason`` (:mod:`studies.trial`).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from .errors import UserError

BUILTIN_MODULE = "mae_core.builtin_parts"  # where the built-in parts are registered


class PluginResultError(UserError):
    """A plugin's part returned what its rule forbids, or called ``sys.exit`` (one line)."""


def is_builtin(function: Callable) -> bool:
    """Whether ``function`` is one of the built-in parts (called unchecked)."""
    return getattr(function, "__module__", None) == BUILTIN_MODULE


def call_part(what: str, function: Callable, *args: Any, **kwargs: Any) -> Any:
    """``function(*args, **kwargs)``; a ``SystemExit`` it raises becomes a
    :class:`PluginResultError` naming ``what`` (e.g. ``target=wide``)."""
    try:
        return function(*args, **kwargs)
    except SystemExit as stop:
        raise PluginResultError(f"{what} called sys.exit({stop.code!r}); a plugin's part must return "
                                "its result or raise an exception") from None


def target_result(entry, patches) -> Any:
    """The target ``entry`` applied to ``patches [...,M,q]``: ``[...,M,out_dim or q]``, floating,
    on ``patches``' device (a plugin's result checked)."""
    if is_builtin(entry.function):
        return entry.function(patches)
    what = f"target={entry.name}"
    result = call_part(what, entry.function, patches)
    expected = (*patches.shape[:-1], entry.width(patches.shape[-1]))
    width = "out_dim" if entry.out_dim is not None else "q"
    if not (_is_tensor(result) and tuple(result.shape) == expected and result.dtype.is_floating_point
            and result.device == patches.device):
        raise PluginResultError(f"{what} must return a floating tensor [B,M,{width}] = {_dims(expected)} on "
                                f"{patches.device}, got {_describe(result)}")
    return result


def corruption_result(entry, x, level: float, generator) -> Any:
    """The corruption ``entry`` of ``x`` (any shape): a tensor of ``x``'s shape, dtype and
    device (a plugin's result checked)."""
    if is_builtin(entry.function):
        return entry.function(x, level, generator)
    what = f"corruption={entry.name}"
    result = call_part(what, entry.function, x, level, generator)
    if not (_is_tensor(result) and result.shape == x.shape and result.dtype == x.dtype
            and result.device == x.device):
        raise PluginResultError(f"{what} must return a tensor of its input's shape and dtype, "
                                f"{_describe(x)}, got {_describe(result)}")
    return result


def visible_positions(entry, batch_size: int, num_patches: int, num_visible: int,
                      grid: tuple[int, int], generator) -> Any:
    """The mask sampler ``entry``'s visible sets, sorted: ``LongTensor[B,k]`` (a plugin's
    checked: integer ``[B,k]``, k distinct positions in ``[0,M)`` per row)."""
    if is_builtin(entry.function):
        return entry.function(batch_size, num_patches, num_visible, grid, generator).sort(dim=1).values
    what = f"mask_sampling={entry.name}"
    result = call_part(what, entry.function, batch_size, num_patches, num_visible, grid, generator)
    rule = f"{what} must return integer positions [B,k] = [{batch_size},{num_visible}], k distinct in [0,{num_patches}) per row"
    dtype = getattr(result, "dtype", None)
    if not (_is_tensor(result) and tuple(result.shape) == (batch_size, num_visible)
            and not (dtype.is_floating_point or dtype.is_complex) and str(dtype) != "torch.bool"):
        raise PluginResultError(f"{rule}; got {_describe(result)}")
    positions = result.long().sort(dim=1).values
    low, high = int(positions[:, 0].min()), int(positions[:, -1].max())
    if low < 0 or high >= num_patches:
        raise PluginResultError(f"{rule}; got position {low if low < 0 else high}")
    repeats = (positions[:, 1:] == positions[:, :-1]).nonzero()
    if len(repeats):
        row, column = (int(v) for v in repeats[0])
        raise PluginResultError(f"{rule}; row {row} holds position {int(positions[row, column])} twice")
    return positions


def _is_tensor(value: Any) -> bool:
    import torch

    return isinstance(value, torch.Tensor)


def _dims(shape) -> str:
    return "[" + ",".join(str(int(n)) for n in shape) + "]"


def _describe(value: Any) -> str:
    """``float32 [8,16,3] on cpu``, or the type of what is not a tensor."""
    if not _is_tensor(value):
        return f"a {type(value).__name__}, not a tensor"
    return f"{str(value.dtype).removeprefix('torch.')} {_dims(value.shape)} on {value.device}"
