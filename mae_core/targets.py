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

from dataclasses import dataclass

import torch

from .errors import UserError

TARGETS = ("raw", "norm", "norm_eps")
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
    """``T(x_j)`` for every patch: ``[B,M,q] -> [B,M,q]``.

    ``norm`` raises :class:`NormDomainError` naming the offending image and patch.
    """
    if kind == "raw":
        return patches
    if kind not in TARGETS:
        raise ValueError(f"target={kind!r} is not one of {', '.join(TARGETS)}")
    if kind == "norm":
        require_norm_domain(patches, what="these images")
    mean, scale = target_moments(patches, kind)
    return (patches - mean) / scale
