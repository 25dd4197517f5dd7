"""Declared claims and their four verdicts: what a study answers.

A study file declares its claims before it runs (``claims:``, checked by :func:`check_claims`
with the file); a report decides each one from the trials (:func:`decide_claims`). Every claim
is a question about one metric with a smallest effect of interest ``delta`` (metric units):

* ``vs_reference``: each listed cell against the study's reference cell, paired by seed;
* ``peak``: one cell beats every other cell (an intersection-union test: it is ``better`` only
  when every comparison is; it is ``worse`` when some cell beats it);
* ``trend``: the metric moves one way at every step of an axis (the other axes at the
  reference), again intersection-union over the adjacent steps;
* ``vs_baseline``: a cell against a baseline measured in the same runs (``random_probe_*``,
  ``pixel_probe_*``, ``scratch_best_finetune_acc``), paired within each run.

Each hypothesis (a cell of a ``vs_reference`` or ``vs_baseline`` claim, or a whole ``peak`` or
``trend`` claim) gets one of four verdicts, all from one family (:func:`one_family`):

* ``better`` / ``worse``: the paired t-test's p, adjusted over the study's family (every
  hypothesis of every declared claim: one family per study), is below α, and the difference
  lies that way ("better" in the metric's sense: higher accuracy, lower risk);
* ``equivalent``: the paired TOST (``statsmodels.stats.weightstats.ttost_paired``) with bounds
  ±delta, adjusted in the same family, is below α, i.e. the difference is shown to be
  smaller than the smallest effect of interest (checked before better/worse: a difference
  shown to exist but shown smaller than delta is no effect of interest);
* ``inconclusive``: neither, with ``n_needed``, the seeds that would decide it at the observed
  effect and an upper confidence bound of the observed spread (see :func:`seeds_needed`).

One family, not two: the difference tests and the TOSTs of all m hypotheses are adjusted
together, step-down (Shaffer 1986, *Modified sequentially rejective multiple test procedures*,
JASA 81:826-831). A hypothesis' two nulls ("no difference" and "a difference of at least
delta") cannot both be true, so at most m of the 2m tests have a true null and each step
divides α by the hypotheses that still have a test left (m at the first). The chance of any
false verdict in the study is at most α. (Holm within each kind separately, the earlier rule,
spent α twice: 0.078 in simulation for a nominal 0.05.)

"Inconclusive" is never "no effect". The interval of each row matches its decision: at
1 - α/k for a difference decided at a step that divides α by k (it excludes 0), at 1 - 2α/k
for an equivalence (it lies inside ±delta), and for an undecided row at the level of the step
where the family stopped (it contains 0 and does not lie inside ±delta); ``ci_level`` names it.

Small n: beside every verdict stand a mixed model (cell fixed, seed random: ``statsmodels``
MixedLM, tested with t on the design's residual degrees of freedom, not z) decided by the
same rules, and the exact sign-flip test (``exact_agrees``): whether it reaches the same
verdict at the same step's level, or ``parametric`` where it cannot at that n (its smallest
two-sided p is 2/2ⁿ); ``n_exact_min`` is the seeds per cell it would need to.
"""

from __future__ import annotations

import math
import re
import warnings
from dataclasses import dataclass
from typing import Any, Literal

import numpy as np
import pandas as pd
from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator
from scipy import stats as sps
from statsmodels.regression.mixed_linear_model import MixedLM
from statsmodels.stats.power import TTestPower
from statsmodels.stats.weightstats import ttost_paired

from evaluation.metrics import METRICS
from mae_core.errors import shown
from mae_core.grid import find_cell, grid_cells, typed_value

from .stats import ALPHA, FINISHED, POWER, cell_mask, one_family

SD_BOUND = 0.80  # one-sided confidence of the spread's upper bound n_needed plans with
EXACT_MAX_N = 16  # up to this many pairs the sign-flip test enumerates all 2ⁿ patterns; above, 2¹⁶ random ones
FUTILITY_POWER = 0.02  # a look gives no seeds to a hypothesis whose conditional power at delta is below this
MAX_SEEDS = 1000  # n_needed is written as this when more would be needed (or it cannot be reached)

KINDS = ("vs_reference", "peak", "trend", "vs_baseline")
DIRECTIONS = ("better", "worse", "two-sided")
VERDICTS = ("better", "worse", "equivalent", "inconclusive")
CLAIM_KINDS_OF_METRIC = ("risk", "downstream", "reference", "diagnostic")  # what a claim may be about
# The columns other tools read, then the robustness and bookkeeping columns.
CLAIM_COLUMNS = ["study", "claim", "kind", "metric", "cell", "reference", "n", "effect", "ci_low", "ci_high",
                 "p_adjusted", "delta", "verdict", "n_needed"]
EXTRA_COLUMNS = ["direction", "outcome", "p", "p_equivalence", "p_equivalence_adjusted", "ci_level",
                 "family_size", "model_effect", "model_p_adjusted", "model_verdict", "robust", "signflip_p",
                 "declared", "hypothesis", "alpha"]
# Appended after those (and after a sequential run's ``look``), so older readers find theirs in place.
EXACT_COLUMNS = ["exact_agrees", "n_exact_min"]


class ClaimSpec(BaseModel):
    """One entry of a study file's ``claims:`` list."""

    model_config = ConfigDict(extra="forbid")

    name: str = Field(pattern=r"^[A-Za-z0-9_.+-]+$")
    metric: str
    kind: Literal["vs_reference", "peak", "trend", "vs_baseline"]
    direction: Literal["better", "worse", "two-sided"] = "better"
    # the smallest effect of interest, a finite positive number (true is no number); None: the metric table's
    delta: float | None = Field(None, gt=0, allow_inf_nan=False)
    cells: list[dict[str, Any]] | None = None  # vs_reference / vs_baseline: the cells compared
    cell: dict[str, Any] | None = None  # peak: the cell claimed to beat every other
    axis: str | None = None  # trend: the axis (default: the grid's only axis); peak: compare along it only
    baseline: str | None = None  # vs_baseline: the baseline's metric (default: the metric's random init)

    @field_validator("delta", mode="before")
    @classmethod
    def _number_not_boolean(cls, value: Any) -> Any:
        if isinstance(value, bool):  # YAML's true is Python's True, which pydantic would take as 1.0
            raise ValueError(f"{str(value).lower()} is not a number; give the smallest effect of interest "
                             "in the metric's units (accuracies: 0.01)")
        return value


def _spec_problem(error: ValidationError, number: int) -> str:
    problem = error.errors()[0]
    key = ".".join(str(part) for part in problem["loc"])
    if problem["type"] == "extra_forbidden":
        return f"claims[{number}]: unknown key {key!r}; allowed: {', '.join(ClaimSpec.model_fields)}"
    if problem["type"] == "missing":
        return f"claims[{number}].{key}: required"
    return f"claims[{number}].{key}: {problem['msg'].removeprefix('Value error, ')}"


def check_claims(raw: Any, axes: dict[str, list[Any]], zipped: tuple = (),
                 reference: dict[str, Any] | None = None) -> tuple[dict[str, Any], ...]:
    """The claims of a study file, validated against its grid and completed.

    Raises ValueError with one line naming ``claims[i].key`` and what is allowed. Returns one
    JSON-ready mapping per claim: ``name, metric, kind, direction, delta`` (the metric table's
    default filled in), ``reference`` (the reference cell), ``cells`` (every cell compared, each
    naming every varied key: for ``peak`` the competitors, for ``trend`` the cells along the
    axis in order), ``cell`` (``peak``: the claimed peak), ``axis`` and ``baseline``. A cell may
    name only some keys; the rest are the reference's.
    """
    if raw is None:
        return ()
    if not isinstance(raw, list):
        raise ValueError("claims: a list of claims (each with name, metric, kind, direction, delta)")
    grid = grid_cells(axes, zipped)
    varied = list(axes) + [key for group in zipped for key in group]
    reference = dict(reference or (grid[0] if grid else {}))
    claims, names = [], set()
    for number, item in enumerate(raw):
        if not isinstance(item, dict):
            raise ValueError(f"claims[{number}]: a mapping (name, metric, kind, direction, delta)")
        try:
            spec = ClaimSpec(**item)
        except ValidationError as error:
            raise ValueError(_spec_problem(error, number)) from None
        where = f"claims[{number}]"
        if spec.name in names:
            raise ValueError(f"{where}.name: {spec.name!r} is declared twice; each claim needs its own name")
        names.add(spec.name)
        claims.append(_complete(spec, where, grid, varied, reference, axes, zipped))
    return tuple(claims)


def _metric_problem(metric: str) -> str | None:
    known = METRICS.get(metric)
    if known is not None and known.kind in CLAIM_KINDS_OF_METRIC:
        return None
    allowed = [m.name for m in METRICS.values() if m.kind in CLAIM_KINDS_OF_METRIC]
    return f"unknown metric {metric!r}; allowed: {', '.join(allowed)}"


def _complete(spec: ClaimSpec, where: str, grid: list[dict], varied: list[str], reference: dict,
              axes: dict[str, list[Any]], zipped: tuple) -> dict[str, Any]:
    problem = _metric_problem(spec.metric)
    if problem:
        raise ValueError(f"{where}.metric: {problem}")
    delta = spec.delta if spec.delta is not None else METRICS[spec.metric].delta
    if delta is None:
        raise ValueError(f"{where}.delta: {spec.metric} has no default smallest effect of interest "
                         f"(its scale depends on the target and data); give delta in its units")
    bounds = METRICS[spec.metric].bounds
    if bounds is not None and delta >= bounds[1] - bounds[0]:
        low, high = bounds
        raise ValueError(f"{where}.delta: {delta:g} is not below the range of {spec.metric} ({low:g} to {high:g}): "
                         f"no difference could exceed it, so every claim would be equivalent; "
                         f"give a delta below {high - low:g} (accuracies: 0.01 is one point)")

    def full(cell: dict[str, Any], key: str) -> dict[str, Any]:
        unknown = [k for k in cell if k not in varied]
        if unknown:
            raise ValueError(f"{where}.{key}: {shown(unknown[0])} is not varied by the study (varied: "
                             f"{', '.join(varied) or 'nothing'})")
        found = find_cell({**reference, **cell}, axes, zipped)
        if found is None:
            raise ValueError(f"{where}.{key}: {shown(cell)} is not a cell of the study's grid")
        return {k: typed_value(k, v) for k, v in found.items()}

    claim: dict[str, Any] = {"name": spec.name, "metric": spec.metric, "kind": spec.kind,
                             "direction": spec.direction, "delta": float(delta),
                             "reference": full({}, "reference"), "cell": None, "axis": spec.axis,
                             "baseline": None}
    same = lambda a, b: all(str(a[k]) == str(b[k]) for k in varied)  # noqa: E731
    if spec.kind == "vs_reference":
        cells = [full(c, f"cells[{i}]") for i, c in enumerate(spec.cells)] if spec.cells else [
            full(c, "cells") for c in grid if not same(c, reference)]
        if any(same(c, claim["reference"]) for c in cells):
            raise ValueError(f"{where}.cells: the reference cell cannot be compared with itself")
        if not cells:
            raise ValueError(f"{where}.cells: the grid has no cell besides the reference")
        claim["cells"] = cells
    elif spec.kind == "vs_baseline":
        baseline = spec.baseline or METRICS[spec.metric].reference
        known = METRICS.get(baseline or "")
        if known is None or known.kind not in ("reference", "baseline"):
            allowed = [m.name for m in METRICS.values() if m.kind in ("reference", "baseline")]
            raise ValueError(f"{where}.baseline: {baseline!r} is not a baseline metric; allowed: "
                             f"{', '.join(allowed)}")
        claim["baseline"] = baseline
        claim["cells"] = [full(c, f"cells[{i}]") for i, c in enumerate(spec.cells)] if spec.cells else [
            claim["reference"]]
    elif spec.kind == "peak":
        if not spec.cell:
            raise ValueError(f"{where}.cell: required for a peak claim (the cell claimed to beat every other)")
        peak = full(spec.cell, "cell")
        if spec.axis is not None and spec.axis not in axes:
            raise ValueError(f"{where}.axis: {spec.axis!r} is not an axis (axes: {', '.join(axes)})")
        others = [c for c in grid if not same(c, peak)
                  and (spec.axis is None or all(str(c[k]) == str(peak[k]) for k in varied if k != spec.axis))]
        if not others:
            raise ValueError(f"{where}.cell: no other cell to beat")
        claim.update(cell=peak, cells=[full(c, "cells") for c in others])
    else:  # trend
        axis = spec.axis or (next(iter(axes)) if len(axes) == 1 else None)
        if axis is None or axis not in axes:
            raise ValueError(f"{where}.axis: name the axis of the trend (axes: {', '.join(axes) or 'none'})")
        if len(axes[axis]) < 2:
            raise ValueError(f"{where}.axis: {axis} has one value; a trend needs at least two")
        claim.update(axis=axis, cells=[full({axis: v}, "axis") for v in trend_order(axis, axes[axis])])
    return claim


def trend_order(axis: str, values: list[Any]) -> list[Any]:
    """The steps of a trend along ``axis``: numbers ascending, as the config types them ("10"
    after "9", not before); any other values (text, true/false) in the order the study declares
    them, which is the order its author means (``target: [pixels, hog, clip]``), never alphabetical."""
    numbers = [typed_value(axis, value) for value in values]
    if all(isinstance(n, (int, float)) and not isinstance(n, bool) for n in numbers):
        return [value for _, value in sorted(zip(numbers, values), key=lambda pair: pair[0])]
    return list(values)


def cell_text(cell: dict[str, Any]) -> str:
    """A cell as ``key=value; key=value`` (the claims.csv form)."""
    return "; ".join(f"{k}={v}" for k, v in cell.items())


# ------------------------------------------------------------------------------- statistics


@dataclass
class Paired:
    """One paired comparison: ``x`` (the cell) against ``r`` (reference or baseline), aligned
    by seed; ``sign`` is +1 when higher is better for the metric, -1 when lower is."""

    cell: dict[str, Any]
    reference: dict[str, Any] | str
    x: np.ndarray
    r: np.ndarray
    seeds: np.ndarray
    sign: int
    delta: float

    @property
    def d(self) -> np.ndarray:
        return self.x - self.r

    @property
    def n(self) -> int:
        return len(self.x)

    @property
    def effect(self) -> float:
        return float(self.d.mean()) if self.n else math.nan

    @property
    def sd(self) -> float:
        return float(self.d.std(ddof=1)) if self.n > 1 else math.nan

    @property
    def without_spread(self) -> bool:
        """Differences equal up to rounding: a t statistic would be ±inf or noise over noise."""
        return self.sd <= 1e-12 * max(1.0, abs(self.effect))

    @property
    def gain(self) -> float:
        """The effect in the metric's better direction (positive: the cell is better)."""
        return self.sign * self.effect

    def p(self) -> float:
        """Two-sided paired t-test p (scipy); 0 or 1 when the differences have no spread."""
        if self.n < 2:
            return math.nan
        if self.without_spread:
            return 0.0 if self.effect != 0 else 1.0
        return float(sps.ttest_1samp(self.d, 0.0).pvalue)

    def p_equivalence(self) -> float:
        """Paired TOST p for |difference| < delta (statsmodels ``ttost_paired``)."""
        if self.n < 2:
            return math.nan
        if self.without_spread:
            return 0.0 if abs(self.effect) < self.delta else 1.0
        return float(ttost_paired(self.x, self.r, -self.delta, self.delta)[0])

    def interval(self, level: float) -> tuple[float, float]:
        if self.n < 2:
            return (math.nan, math.nan)
        if self.sd == 0:
            return (self.effect, self.effect)
        half = sps.t.ppf(0.5 + level / 2, self.n - 1) * self.sd / math.sqrt(self.n)
        return (self.effect - half, self.effect + half)

    def signflip_p(self, shift: float = 0.0, alternative: str = "two-sided") -> float:
        """The sign-flip p of the mean of ``d - shift`` (scipy's permutation test over the 2ⁿ sign
        patterns; above :data:`EXACT_MAX_N` pairs 2¹⁶ random patterns with a fixed generator);
        NaN with fewer than 2 pairs. Exact under symmetry of the differences about ``shift``,
        with no normality: its smallest value is 2/2ⁿ two-sided, 1/2ⁿ one-sided."""
        if self.n < 2:
            return math.nan
        exact = self.n <= EXACT_MAX_N
        test = sps.permutation_test((self.d - shift,), lambda d, axis: np.mean(d, axis=axis), vectorized=True,
                                    permutation_type="samples", n_resamples=np.inf if exact else 2 ** 16,
                                    alternative=alternative, random_state=0)
        return float(test.pvalue)

    def signflip_equivalence_p(self) -> float:
        """The sign-flip analogue of the TOST: the larger of the one-sided p's of mean > -delta
        and mean < +delta."""
        return max(self.signflip_p(-self.delta, "greater"), self.signflip_p(self.delta, "less"))


def _by_seed(frame: pd.DataFrame, cell: dict, metric: str, cache: dict) -> tuple[np.ndarray, np.ndarray]:
    """(seeds, values) of the cell's ``metric``, sorted by seed, one value per seed (the mean of a
    seed's trials), missing values dropped; computed once per call of :func:`decide_claims`
    (``cache``: a reference cell is read by every hypothesis against it). numpy, not a pandas
    groupby per pair: simulations call this tens of thousands of times."""
    key = (cell_text(cell), metric)
    if key not in cache:
        if metric not in frame:
            cache[key] = (np.array([]), np.array([]))
        else:
            mask = cell_mask(frame, cell).to_numpy()
            seeds = frame["seed"].to_numpy()[mask]
            values = frame[metric].to_numpy(float)[mask]
            kept = np.isfinite(values)
            seeds, values = seeds[kept], values[kept]
            unique, where = np.unique(seeds, return_inverse=True)
            cache[key] = (unique, np.bincount(where, values, len(unique)) / np.bincount(where, None, len(unique)))
    return cache[key]


def _pairs(frame: pd.DataFrame, claim: dict, cell: dict, reference: dict | None, cache: dict | None = None) -> Paired:
    """The paired values of ``claim``'s metric: ``cell`` against ``reference`` by seed, or
    (``reference`` None) against the claim's baseline within each of the cell's runs."""
    metric, sign = claim["metric"], -1 if METRICS[claim["metric"]].lower_is_better else 1
    cache = {} if cache is None else cache
    if reference is None:
        mine = frame[cell_mask(frame, cell)]
        both = mine[["seed", metric, claim["baseline"]]].dropna().groupby("seed").mean()
        return Paired(cell, claim["baseline"], both[metric].to_numpy(float), both[claim["baseline"]].to_numpy(float),
                      both.index.to_numpy(), sign, claim["delta"])
    (x_seeds, x), (r_seeds, r) = _by_seed(frame, cell, metric, cache), _by_seed(frame, reference, metric, cache)
    seeds, in_x, in_r = np.intersect1d(x_seeds, r_seeds, assume_unique=True, return_indices=True)
    return Paired(cell, reference, x[in_x], r[in_r], seeds, sign, claim["delta"])


@dataclass
class Hypothesis:
    """One member of the study's family: a claim's single comparison, or the comparisons a
    peak or trend claim tests together (intersection-union)."""

    claim: dict
    pairs: list[Paired]
    union: bool  # peak or trend: every pair must agree for better (and, for trend, worse)

    @property
    def key(self) -> str:
        """The hypothesis' name across looks: the claim's, with the cell for a per-cell claim."""
        return self.claim["name"] if self.union else f"{self.claim['name']}: {cell_text(self.pairs[0].cell)}"

    def cannot_be_decided(self, level: float) -> bool:
        """A trend shown to go both ways: one step's interval (at ``level``) above zero and
        another's below, with a step at least delta away. Then it is neither better nor worse at
        every step, nor equivalent, however many seeds follow: more seeds only sharpen steps
        already shown to disagree. (A peak or a single comparison can always still be decided.)"""
        if self.claim["kind"] != "trend":
            return False
        shown = [sorted(pair.sign * bound for bound in pair.interval(level)) for pair in self.pairs]
        up = any(low > 0 for low, _ in shown)
        down = any(high < 0 for _, high in shown)
        return up and down and any(abs(pair.effect) >= self.claim["delta"] for pair in self.pairs)

    def direction_and_p(self, p_values: list[float], gains: list[float]) -> tuple[str, float]:
        """(direction, p) of the difference test. Single pair: its two-sided p and its sign.
        Trend: better (worse) when every step is better (worse): the largest p (IUT). Peak:
        better when the peak beats every cell (largest p), worse when some cell beats it
        (Bonferroni over the cells that do); the smaller of the two decides."""
        if any(not math.isfinite(p) for p in p_values) or not p_values:
            return "better", math.nan
        if not self.union:
            return ("better" if gains[0] >= 0 else "worse"), p_values[0]
        better = max(p_values) if all(g > 0 for g in gains) else 1.0
        if self.claim["kind"] == "trend":
            worse = max(p_values) if all(g < 0 for g in gains) else 1.0
        else:
            beaten = [p for p, g in zip(p_values, gains) if g < 0]
            worse = min(1.0, len(p_values) * min(beaten)) if beaten else 1.0
        return ("better", better) if better <= worse else ("worse", worse)

    def binding(self) -> Paired:
        """The comparison a row reports: the only one, or for a peak the strongest competitor
        and for a trend the weakest step (the one the verdict hinges on)."""
        if not self.union:
            return self.pairs[0]
        return min(self.pairs, key=lambda pair: pair.gain if math.isfinite(pair.gain) else math.inf)


def _hypotheses(frame: pd.DataFrame, claims: list[dict]) -> list[Hypothesis]:
    found, cache = [], {}
    for claim in claims:
        if claim["kind"] == "vs_reference":
            found += [Hypothesis(claim, [_pairs(frame, claim, cell, claim["reference"], cache)], False)
                      for cell in claim["cells"]]
        elif claim["kind"] == "vs_baseline":
            found += [Hypothesis(claim, [_pairs(frame, claim, cell, None, cache)], False) for cell in claim["cells"]]
        elif claim["kind"] == "peak":
            found.append(Hypothesis(claim, [_pairs(frame, claim, claim["cell"], other, cache)
                                            for other in claim["cells"]], True))
        else:  # trend: each step against the one before
            cells = claim["cells"]
            found.append(Hypothesis(claim, [_pairs(frame, claim, b, a, cache) for a, b in zip(cells, cells[1:])], True))
    return found


def seeds_needed(effect: float, sd: float, n: int, delta: float, alpha: float) -> float:
    """The seeds (pairs) that would decide a comparison at the observed effect: the smaller of
    the n at which a two-sided paired t-test at ``alpha`` detects ``effect`` with
    :data:`POWER`, and (when ``|effect| < delta``) the n at which the paired TOST shows
    equivalence within ±delta (each one-sided test at ``alpha``, planned with power
    1 - (1 - POWER)/2, the usual conservative split of the two sides). Both use an upper confidence bound of the
    sd (one-sided :data:`SD_BOUND`, chi-square with n - 1 df), not the sd itself, since a
    five-seed sd is itself uncertain (statsmodels ``TTestPower``). Capped at :data:`MAX_SEEDS`;
    NaN with fewer than 2 pairs."""
    if n < 2 or not math.isfinite(sd):
        return math.nan
    bound = sd * math.sqrt((n - 1) / sps.chi2.ppf(1 - SD_BOUND, n - 1)) if sd > 0 else 0.0
    if bound == 0:
        return float(n)
    solver, candidates = TTestPower(), []
    for size, alternative, power in ((abs(effect) / bound, "two-sided", POWER),
                                     ((delta - abs(effect)) / bound, "larger", 1 - (1 - POWER) / 2)):
        if size <= 1e-9:
            continue
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            try:
                needed = float(solver.solve_power(effect_size=size, nobs=None, alpha=alpha, power=power,
                                                  alternative=alternative))
            except (ValueError, RuntimeError, ZeroDivisionError):
                continue
        if math.isfinite(needed) and needed > 0:
            candidates.append(needed)
    return float(min(MAX_SEEDS, max(n + 1, math.ceil(min(candidates))))) if candidates else float(MAX_SEEDS)


def _seeds_to_decide(h: Hypothesis, alpha: float) -> float:
    """:func:`seeds_needed` for an undecided hypothesis. A trend is decided only when every
    step is (all better, all worse, or all within ±delta), so it needs the seeds of its hardest
    step; where its steps go both ways by at least delta, no number of seeds decides it at the
    observed effects (:data:`MAX_SEEDS`, written "≥ 1000"), and a count read off one step would
    promise a verdict more seeds cannot give. A single pair or a peak: its binding comparison."""
    delta = h.claim["delta"]
    if h.claim["kind"] != "trend":
        pair = h.binding()
        return seeds_needed(pair.effect, pair.sd, pair.n, delta, alpha)
    gains = [pair.gain for pair in h.pairs]
    if not all(map(math.isfinite, gains)):
        return math.nan
    both_ways = any(g > 0 for g in gains) and any(g < 0 for g in gains)
    if both_ways and any(abs(pair.effect) >= delta for pair in h.pairs):
        return float(MAX_SEEDS)
    return max(seeds_needed(pair.effect, pair.sd, pair.n, delta, alpha) for pair in h.pairs)


def seeds_text(n_needed: float) -> str:
    """``n_needed`` as a report writes it: the count, ``≥ MAX_SEEDS`` at the cap, ``unknown`` for NaN."""
    if not math.isfinite(n_needed):
        return "unknown"
    return f"≥ {MAX_SEEDS}" if n_needed >= MAX_SEEDS else f"{int(n_needed)}"


def _verdict(p_adjusted: float, p_equivalence_adjusted: float, direction: str, alpha: float = ALPHA) -> str:
    if p_equivalence_adjusted < alpha:
        return "equivalent"
    if p_adjusted < alpha:
        return direction
    return "inconclusive"


def _outcome(verdict: str, declared: str) -> str:
    if verdict == "inconclusive":
        return "undecided"
    if verdict == "equivalent":
        return "no difference of interest"
    if declared == "two-sided":
        return "decided"
    return "as declared" if verdict == declared else "against the declaration"


# ------------------------------------------------------------------------ the mixed model


def _model_pairs(hypothesis: Hypothesis) -> list[tuple[float, float, float]]:
    """(estimate, standard error, degrees of freedom) of each of the hypothesis' comparisons from
    one linear mixed model of the cells involved (cell fixed, seed a random intercept:
    statsmodels MixedLM), fitted by REML; NaN when it cannot be fitted.

    The degrees of freedom are the residual df of the additive cell + seed model, observations −
    seeds − cells + 1: for a contrast within seeds in a complete design this is exactly the
    Satterthwaite (and Kenward-Roger) df, e.g. n − 1 for two cells, where the z test MixedLM's
    summary uses would have a 12% size at a nominal 5% with 4 df. With missing cells it is the
    same count, an approximation. statsmodels has no Satterthwaite df for MixedLM."""
    labels: dict[str, int] = {}
    rows = []
    for pair in hypothesis.pairs:
        for which, values in (("x", pair.x), ("r", pair.r)):
            key = _label(pair.cell if which == "x" else pair.reference)
            labels.setdefault(key, len(labels))
            rows += [(key, seed, value) for seed, value in zip(pair.seeds, values)]
    data = pd.DataFrame(rows, columns=["cell", "seed", "value"]).drop_duplicates(["cell", "seed"])
    if data["seed"].nunique() < 3 or len(labels) < 2:
        return [(math.nan, math.nan, math.nan)] * len(hypothesis.pairs)
    names = list(labels)
    df = len(data) - data["seed"].nunique() - len(names) + 1
    exog = np.column_stack([np.ones(len(data))] + [(data["cell"] == name).to_numpy(float) for name in names[1:]])
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            fit = MixedLM(data["value"].to_numpy(float), exog, groups=data["seed"].to_numpy()).fit(reml=True)
        coef = np.asarray(fit.fe_params)
        cov = np.asarray(fit.cov_params())[: len(coef), : len(coef)]
    except (ValueError, np.linalg.LinAlgError):
        return [(math.nan, math.nan, math.nan)] * len(hypothesis.pairs)
    out = []
    for pair in hypothesis.pairs:
        contrast = np.zeros(len(coef))
        for key, weight in ((_label(pair.cell), 1.0), (_label(pair.reference), -1.0)):
            index = names.index(key)
            if index > 0:
                contrast[index] += weight
        variance = float(contrast @ cov @ contrast)
        out.append((float(contrast @ coef), math.sqrt(variance) if variance > 0 else math.nan, float(df)))
    return out


def _label(cell: dict | str) -> str:
    return cell if isinstance(cell, str) else cell_text(cell)


def _model_tests(estimate: float, se: float, delta: float, df: float) -> tuple[float, float]:
    """(two-sided p, TOST p within ±delta) of one model contrast, t with ``df`` degrees of
    freedom (see :func:`_model_pairs`)."""
    if not (math.isfinite(estimate) and math.isfinite(se) and se > 0 and df >= 1):
        return math.nan, math.nan
    p = float(2 * sps.t.sf(abs(estimate) / se, df))
    tost = float(max(sps.t.sf((estimate + delta) / se, df), sps.t.cdf((estimate - delta) / se, df)))
    return p, tost


# ------------------------------------------------------------------------------ decision


def conditional_power(effect: float, sd: float, n: int, max_n: int, delta: float, alpha: float) -> float:
    """The chance that a comparison still open at ``n`` pairs is decided by ``max_n`` pairs, given
    the pairs so far (mean ``effect``, sd ``sd``) and a true difference of ``delta`` from here on,
    in the direction observed (for better or worse), or of 0 (for equivalent): the larger of the
    two. Each final test at ``alpha`` (two-sided for the difference, each side for the TOST),
    t critical values at ``max_n - 1`` df, the observed sd taken as known (normal conditional
    distribution of the final mean). 0 when no pairs are left to add; NaN with fewer than 2.

    This is the futility rule's measure (:data:`FUTILITY_POWER`): unlike the seeds needed at the
    observed effect, it does not take a noisy small estimate at its word, so a true effect of
    delta or more keeps its seeds (Jennison & Turnbull 2000, ch. 10)."""
    if n < 2 or not (math.isfinite(effect) and math.isfinite(sd)):
        return math.nan
    if n >= max_n:
        return 0.0
    if sd <= 0:
        return 1.0
    final_se = sd / math.sqrt(max_n)
    noise = sd * math.sqrt(max_n - n) / max_n  # sd of the final mean given the pairs so far
    way = 1.0 if effect >= 0 else -1.0
    towards = way * (n * effect + (max_n - n) * way * delta) / max_n  # expected final mean, signed the observed way
    critical = sps.t.ppf(1 - alpha / 2, max_n - 1) * final_se
    difference = sps.norm.sf((critical - towards) / noise) + sps.norm.cdf((-critical - towards) / noise)
    margin = delta - sps.t.ppf(1 - alpha, max_n - 1) * final_se  # |final mean| below this: equivalent
    at_zero = n * effect / max_n
    equivalence = (sps.norm.cdf((margin - at_zero) / noise) - sps.norm.cdf((-margin - at_zero) / noise)
                   if margin > 0 else 0.0)
    return float(max(difference, equivalence))


def _exact(h: Hypothesis, verdict: str, divisor: float, alpha: float) -> tuple[str, float]:
    """(exact_agrees, n_exact_min) of one row: the seeds per cell at which the sign-flip test
    could reach this row's level at all (2/2ⁿ ≤ α/k two-sided for a difference, 1/2ⁿ ≤ α/k per
    side for an equivalence), and for a decided row whether it reaches the same verdict:
    "yes", "no", or "parametric" where n is below that minimum (the verdict rests on the
    t-test's normality). Empty for an undecided row."""
    level = alpha / divisor if math.isfinite(divisor) and divisor > 0 else math.nan
    if not math.isfinite(level):
        return "", math.nan
    sides = 1 if verdict == "equivalent" else 2
    n_min = float(max(2, math.ceil(math.log2(sides / level) - 1e-12)))
    if verdict == "inconclusive":
        return "", n_min
    if min(pair.n for pair in h.pairs) < n_min:
        return "parametric", n_min
    if verdict == "equivalent":
        p = max(pair.signflip_equivalence_p() for pair in h.pairs)
        return ("yes" if p <= level else "no"), n_min
    direction, p = h.direction_and_p([pair.signflip_p() for pair in h.pairs], [pair.gain for pair in h.pairs])
    return ("yes" if direction == verdict and p <= level else "no"), n_min


def decide_claims(frame: pd.DataFrame, claims: list[dict] | tuple[dict, ...], study: str = "",
                  declared: str = "before the run", *, alpha: float = ALPHA,
                  only: set[str] | None = None, planning_alpha: float | None = None,
                  robustness: bool = True, plan_seeds: bool = False,
                  future: tuple[int, float] | None = None) -> pd.DataFrame:
    """A row per hypothesis of the study's claims (columns :data:`CLAIM_COLUMNS`,
    :data:`EXTRA_COLUMNS`, then :data:`EXACT_COLUMNS`), decided as one family
    (:func:`one_family`) over the FINISHED trials of ``frame``.

    ``claims`` are :func:`check_claims`'s mappings. ``cell`` and ``reference`` are the cells as
    ``key=value; ...`` (the baseline's metric name for ``vs_baseline``); ``effect`` is cell
    minus reference paired by seed (for a peak: the peak against its strongest competitor; for
    a trend: the weakest step, the later value minus the earlier); ``ci_low``/``ci_high`` its
    interval at ``ci_level``, the level that matches the row's decision (see the module);
    ``p`` the unadjusted difference test and ``p_adjusted`` its adjustment in the family;
    ``p_equivalence`` the TOST p and its adjustment; ``model_*`` the same decisions from the
    mixed model; ``robust`` says whether the two agree; ``signflip_p`` the sign-flip p of the
    row's pair; ``exact_agrees``/``n_exact_min`` whether the exact sign-flip test reaches the
    same verdict and the seeds per cell it needs to be able to; ``declared`` when the claims
    were written; ``hypothesis`` the row's name across looks.

    ``alpha`` is the family's level (a sequential look tests at its share of α, see
    :mod:`analysis.sequential`); ``only`` restricts the family to those hypotheses (the ones a
    look still has open); ``planning_alpha`` is the level ``n_needed`` plans for (default
    ``alpha`` over the family); ``robustness=False`` skips the mixed model, the sign-flip
    tests and, unless ``plan_seeds``, ``n_needed`` (their columns NaN), for a sequential look and
    for simulations; ``plan_seeds`` computes ``n_needed`` even then. ``future`` (a sequential
    look's (maximum seeds per cell, α the plan has left)) adds the column ``conditional_power``
    of every undecided row (:func:`conditional_power` at α left over the family's m; 0 for a
    trend shown to go both ways), which the run's futility rule reads.
    """
    finished = frame[frame["status"] == FINISHED] if "status" in frame else frame
    claims = [c for c in claims if c["metric"] in finished and (c["baseline"] is None or c["baseline"] in finished)]
    hypotheses = [h for h in _hypotheses(finished, claims) if only is None or h.key in only]
    columns = CLAIM_COLUMNS + EXTRA_COLUMNS + EXACT_COLUMNS + (["conditional_power"] if future else [])
    if not hypotheses:
        return pd.DataFrame(columns=columns)
    tests = []
    for h in hypotheses:
        p_values = [pair.p() for pair in h.pairs]
        direction, p = h.direction_and_p(p_values, [pair.gain for pair in h.pairs])
        equivalence = [pair.p_equivalence() for pair in h.pairs]
        p_eq = max(equivalence) if equivalence and all(map(math.isfinite, equivalence)) else math.nan
        model = _model_pairs(h) if robustness else [(math.nan, math.nan, math.nan)] * len(h.pairs)
        model_tests = [_model_tests(est, se, h.claim["delta"], df) for est, se, df in model]
        model_direction, model_p = h.direction_and_p(
            [t[0] for t in model_tests], [pair.sign * est for pair, (est, _, _) in zip(h.pairs, model)])
        model_eq = [t[1] for t in model_tests]
        tests.append(dict(direction=direction, p=p, p_eq=p_eq, model_direction=model_direction, model_p=model_p,
                          model_eq=max(model_eq) if all(map(math.isfinite, model_eq)) else math.nan,
                          model=model))
    m = sum(math.isfinite(t["p"]) for t in tests)
    bonferroni = 1 - alpha / max(m, 1)
    planning = planning_alpha if planning_alpha is not None else alpha / max(m, 1)
    family = one_family([t["p"] for t in tests], [t["p_eq"] for t in tests], alpha)
    model_family = one_family([t["model_p"] for t in tests], [t["model_eq"] for t in tests], alpha)
    rows = []
    for i, (h, t) in enumerate(zip(hypotheses, tests)):
        pair = h.binding()
        verdict = _verdict(family.difference[i], family.equivalence[i], t["direction"], alpha)
        model_verdict = (_verdict(model_family.difference[i], model_family.equivalence[i], t["model_direction"],
                                  alpha) if math.isfinite(model_family.difference[i]) else "not fitted")
        divisor = (family.k_equivalence[i] if verdict == "equivalent" else family.k_difference[i]
                   if verdict in ("better", "worse") else family.stop)
        level = 1 - (2 if verdict == "equivalent" else 1) * alpha / divisor
        low, high = pair.interval(level)
        futile_trend = verdict == "inconclusive" and h.cannot_be_decided(bonferroni)
        needed = (float(pair.n) if verdict != "inconclusive"
                  else float(MAX_SEEDS) if futile_trend  # a sequential run adds it no seeds
                  else _seeds_to_decide(h, planning) if robustness or plan_seeds else math.nan)
        model_effect = t["model"][h.pairs.index(pair)][0]
        exact_agrees, n_exact_min = _exact(h, verdict, divisor, alpha) if robustness else ("", math.nan)
        row = {
            "study": study, "claim": h.claim["name"], "kind": h.claim["kind"], "metric": h.claim["metric"],
            "cell": cell_text(pair.cell), "reference": _label(pair.reference), "n": pair.n,
            "effect": pair.effect, "ci_low": low, "ci_high": high, "p_adjusted": family.difference[i],
            "delta": h.claim["delta"], "verdict": verdict, "n_needed": needed,
            "direction": h.claim["direction"], "outcome": _outcome(verdict, h.claim["direction"]), "p": t["p"],
            "p_equivalence": t["p_eq"], "p_equivalence_adjusted": family.equivalence[i], "ci_level": level,
            "family_size": m, "model_effect": model_effect, "model_p_adjusted": model_family.difference[i],
            "model_verdict": model_verdict,
            "robust": "yes" if model_verdict == verdict else f"no: the mixed model says {model_verdict}",
            "signflip_p": pair.signflip_p() if robustness else math.nan, "declared": declared,
            "hypothesis": h.key, "alpha": alpha, "exact_agrees": exact_agrees, "n_exact_min": n_exact_min,
        }
        if future:
            max_n, left = future
            row["conditional_power"] = (math.nan if verdict != "inconclusive" else 0.0 if futile_trend else
                                        conditional_power(pair.effect, pair.sd, pair.n, max_n, h.claim["delta"],
                                                          left / max(m, 1)))
        rows.append(row)
    table = pd.DataFrame(rows, columns=columns)
    table["n"] = table["n"].astype(int)
    return table


def count_hypotheses(frame: pd.DataFrame, claims: list[dict] | tuple[dict, ...]) -> int:
    """The hypotheses of ``claims`` that ``frame`` can test (the family's m before any is decided)."""
    claims = [c for c in claims if c["metric"] in frame and (c["baseline"] is None or c["baseline"] in frame)]
    return sum(len(c["cells"]) if c["kind"] in ("vs_reference", "vs_baseline") else 1 for c in claims)


def claim_cells(claim: dict) -> list[dict[str, Any]]:
    """Every cell a claim's hypotheses read (for a sequential look: where more seeds help it)."""
    cells = [*claim["cells"], *([claim["cell"]] if claim.get("cell") else [])]
    if claim["kind"] == "vs_reference":
        cells.append(claim["reference"])
    return cells


def resolve_claims(raw: list[dict] | tuple[dict, ...], info: dict[str, Any]) -> tuple[list[dict], list[str]]:
    """The declared ``raw`` claims completed against the grid that ran (``info``: a report's
    study header with ``grid``, ``zip`` and ``reference``), and a line for each claim that does
    not apply to it (a smoke grid lacks its cells, an axis was overridden away)."""
    axes = {k: v for k, v in (info.get("grid") or {}).items() if k != "seed" and k in (info.get("axes") or [])}
    zipped = tuple(info.get("zip") or ())
    reference = info.get("reference") or None
    claims, skipped = [], []
    for item in raw:
        try:
            claims += check_claims([item], axes, zipped, reference)
        except ValueError as error:
            skipped.append(f"{item.get('name', '?')}: not decided in this grid ({str(error).split(': ', 1)[-1]})")
    return claims, skipped


_SAFE = re.compile(r"[^A-Za-z0-9_.=+-]+")


def slug(text: str) -> str:
    return _SAFE.sub("-", text).strip("-")
