"""The 95% t-interval of a mean over seeds, kept inside the range its quantity can take.

Figures and paper tables show each cell as its mean with this interval (not ± sd: with n=3
seeds an sd band says little and runs past 100% or below zero). Where the interval would leave
the quantity's range (an accuracy beyond [0, 1], a squared error below 0) it is clipped there:
the quantity cannot be outside, whatever a symmetric interval says.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np
from scipy import stats as sps

LEVEL = 0.95


@dataclass(frozen=True)
class Interval:
    mean: float
    low: float  # NaN when n < 2 (no spread to estimate)
    high: float
    n: int
    half_width: float = math.nan  # t·sd/√n before clipping (NaN for n < 2)


def t_half_width(values, level: float = LEVEL) -> float:
    """t_{(1+level)/2, n-1} · sd / √n of the finite ``values`` (NaN for fewer than 2)."""
    x = np.asarray(values, dtype=float)
    x = x[np.isfinite(x)]
    if len(x) < 2:
        return math.nan
    return float(sps.t.ppf((1 + level) / 2, len(x) - 1) * x.std(ddof=1) / math.sqrt(len(x)))


def mean_interval(values, bounds: tuple[float, float] = (-math.inf, math.inf),
                  level: float = LEVEL) -> Interval:
    """Mean of the finite ``values`` [n] with its ``level`` t-interval clipped to ``bounds``."""
    x = np.asarray(values, dtype=float)
    x = x[np.isfinite(x)]
    if len(x) == 0:
        return Interval(math.nan, math.nan, math.nan, 0)
    mean = float(x.mean())
    half = t_half_width(x, level)
    if half != half:
        return Interval(mean, math.nan, math.nan, len(x))
    low, high = max(bounds[0], mean - half), min(bounds[1], mean + half)
    return Interval(mean, low, high, len(x), half)
