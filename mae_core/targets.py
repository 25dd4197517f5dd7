"""Reconstruction targets ``T`` applied patch by patch: ``[B,M,q] -> [B,M,q]``.

* ``raw``: ``T_raw(u) = u`` (spec).
* ``norm``: the specification's ``T_norm(u) = (u - ū·1) / s(u)`` with the *population*
  standard deviation ``s(u) = (q⁻¹ Σ_r (u_r - ū)²)^½`` and no epsilon. It is defined only
  for ``s(u) > 0``, so a training set must lie in ``D_norm = {x : s(x_j) > 0 ∀ j}``.
* ``norm_eps``: He et al.'s implementation (``models_mae.py``, ``forward_loss``): per-patch
  mean and *unbiased* variance (``target.var(dim=-1)``, divisor ``q-1``, torch's default),
  ``(u - ū)/sqrt(var(u) + 1e-6)``; defined everywhere (``q >= 2``). It is *not* the spec's
  ``T_norm`` (whose ``s(u)`` divides by ``q``, with no epsilon); it exists for the target
  ablation and for data with constant patches.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any

import torch

from . import registry
from .errors import UserError
from .plugin_checks import target_result

NORM_EPS = 1e-6  # He et al.'s reference code (models_mae.py, forward_loss)


class NormDomainError(UserError):
    """A patch has zero standard deviation, so the spec's ``T_norm`` is undefined there."""


@dataclass(frozen=True)
class NormDomainReport:
    """How many images and patches of a set fall outside ``D_norm``."""

    num_images: int
    num_bad_images: int
    num_bad_patches: int
    first_bad: tuple[int, int] | None  # (image, patch), 0-based

    @property
    def ok(self) -> bool:
        return self.num_bad_patches == 0


def constant_patches(patches: torch.Tensor) -> torch.Tensor:
    """Boolean ``[B,M]``: True where ``s(x_j) = 0``, i.e. all q values of the patch are equal.

    Tested exactly (max == min) rather than by a floating-point variance, which can come out
    as a tiny positive number for a constant patch.
    """
    return patches.amax(dim=-1) == patches.amin(dim=-1)


def norm_domain_report(patches: torch.Tensor) -> NormDomainReport:
    """Check a set ``[N,M,q]`` against ``D_norm`` (spec, definition of ``D_norm``)."""
    bad = constant_patches(patches)
    bad_images = bad.any(dim=1)
    first = None
    if bad.any():
        image, patch = (int(v) for v in torch.nonzero(bad)[0])
        first = (image, patch)
    return NormDomainReport(
        num_images=patches.shape[0],
        num_bad_images=int(bad_images.sum()),
        num_bad_patches=int(bad.sum()),
        first_bad=first,
    )


def require_norm_domain(patches: torch.Tensor, what: str = "the training set") -> None:
    """Raise :class:`NormDomainError` unless every patch of every image has ``s > 0``."""
    report = norm_domain_report(patches)
    if not report.ok:
        raise_outside_norm_domain(report, what)


def require_norm_domain_chunks(chunks: Iterable[torch.Tensor], what: str) -> None:
    """:func:`require_norm_domain` over a set given a part ``[n,M,q]`` at a time: one error for
    the whole set, its first bad image counted from the start of the set."""
    offset, first, totals = 0, None, [0, 0, 0]  # images, bad images, bad patches
    for patches in chunks:
        report = norm_domain_report(patches)
        if first is None and report.first_bad is not None:
            first = (offset + report.first_bad[0], report.first_bad[1])
        offset += report.num_images
        totals = [totals[0] + report.num_images, totals[1] + report.num_bad_images,
                  totals[2] + report.num_bad_patches]
    raise_outside_norm_domain(NormDomainReport(*totals, first_bad=first), what)


def raise_outside_norm_domain(report: NormDomainReport, what: str) -> None:
    """Raise the :class:`NormDomainError` that a failed report calls for (one line)."""
    if not report.ok:
        image, patch = report.first_bad
        raise NormDomainError(
            f"target=norm is undefined on {what}: {report.num_bad_images} of "
            f"{report.num_images} images have {report.num_bad_patches} zero-variance patches "
            f"(first: image {image}, patch {patch}); use target=norm_eps or target=raw"
        )


def target_moments(patches: torch.Tensor, kind: str) -> tuple[torch.Tensor, torch.Tensor]:
    """``(mean, scale)`` per patch, each ``[B,M,1]``, with ``T(u) = (u - mean) / scale``:
    ``norm``: the population std ``s(u)`` (spec); ``norm_eps``: ``sqrt(var(u) + 1e-6)`` with
    the unbiased variance (He et al.). Also maps a normalised prediction back to pixels."""
    if kind not in ("norm", "norm_eps"):
        raise ValueError(f"target={kind!r} has no per-patch moments (norm or norm_eps)")
    if patches.shape[-1] < 2:
        raise ValueError(f"target={kind} needs at least 2 values per patch (q={patches.shape[-1]})")
    mean = patches.mean(dim=-1, keepdim=True)
    if kind == "norm_eps":
        return mean, torch.sqrt(patches.var(dim=-1, keepdim=True) + NORM_EPS)  # unbiased, as He et al.
    return mean, patches.var(dim=-1, keepdim=True, unbiased=False).sqrt()  # population, as the spec


def apply_target(patches: torch.Tensor, kind: str) -> torch.Tensor:
    """``T(x_j)`` for every patch: ``[B,M,q] -> [B,M,out_dim or q]`` (the registered target ``kind``).

    A target with a domain check refuses patches outside it first: ``norm`` raises
    :class:`NormDomainError` naming the offending image and patch.
    """
    entry = registry.targets.get(kind)
    if entry.domain_check is not None:
        entry.domain_check([patches], "these images")
    return target_result(entry, patches)  # a plugin's result checked


def __getattr__(name: str) -> Any:
    """``TARGETS``: every registered target name, built-in and plugins' (:mod:`mae_core.registry`)."""
    if name == "TARGETS":
        return registry.targets.names()
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
