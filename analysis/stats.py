"""Statistics over trials: what a report may claim.

* :func:`summarise`: per-cell mean ± sd over seeds, with the test set's binomial standard error
  of each accuracy beside the seed spread.
* :func:`paired_comparisons` and :func:`verdict`: every cell against the study's reference
  cell, paired by seed, with a 95% t-interval, adjusted p's (difference and TOST, one family
  per metric: :func:`one_family`) and the smallest difference the design could detect; the
  verdict (the declared claims' four words) follows from those numbers only.
* :func:`rank_correlations`: risk vs downstream rank correlations, only among trials whose
  risk is the same quantity, with a cluster bootstrap over cells; none below
  :data:`MIN_TRIALS` trials.

Convention: a risk is better when *lower*, an accuracy when *higher* (``lower_is_better`` of
:data:`evaluation.metrics.METRICS`), so a *negative* correlation between a risk and an
accuracy means the risk ranks trials the way the downstream task does.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from functools import lru_cache

import numpy as np
import pandas as pd
from scipy import stats as sps
from scipy.optimize import brentq

from evaluation.metrics import METRICS, RISK_MEANING_AXES

FINISHED = "FINISHED"
FAILED = "FAILED"
MIN_TRIALS = 10  # fewer trials than this: no rank correlation is claimed (NaN with a reason)
# A cluster bootstrap over few cells has few distinct resamples (4 cells: 35) and an interval that
# hugs the point estimate (decoder_depth kNN: ρ = -0.497, CI [-0.501, +0.004]): at least 10.
MIN_CLUSTERS = 10
# The one level and power of the project: the two-sided level of every test, interval (95%) and
# verdict here, and the family-wise error rate of a study's claims (analysis.claims).
ALPHA = 0.05
# The power at which the smallest detectable difference is stated, and the power n_needed plans for.
POWER = 0.80
TEST_SIZE = "probe_test_size"  # the metric holding the number of test images of the probes

# Plain-language names for sentences (figures add units to their own labels).
PLAIN_NAMES = {m.name: m.plain for m in METRICS.values()
               if m.kind in ("risk", "diagnostic", "downstream", "reference")}


def plain_name(metric: str) -> str:
    return PLAIN_NAMES.get(metric, metric.replace("_", " "))


# ---------------------------------------------------------------------------- summaries


def summarise(frame: pd.DataFrame, by: list[str], metrics: list[str]) -> pd.DataFrame:
    """A row per cell (distinct values of ``by``, None/NaN kept as a value).

    Columns: ``by``; ``n`` (FINISHED runs), ``n_failed`` (FAILED), ``n_incomplete`` (any other
    status, e.g. KILLED or RUNNING); ``failure_reason`` (distinct reasons joined by "; ", or
    None); and for each metric ``<metric>_mean``, ``<metric>_std`` (sample std, ddof=1, NaN for
    one run) and ``<metric>_n`` over the FINISHED runs that logged it. Cells whose every run
    failed are kept, with NaN statistics.

    Where the frame has :data:`TEST_SIZE` (``probe_test_size``), each accuracy (unit
    "fraction", kind downstream or reference) also gets ``<metric>_binom_se``: the test set's
    binomial standard error √(p(1-p)/n_test) at the cell's mean accuracy p and its mean n_test,
    the uncertainty one trial's accuracy carries from the finite test set alone.
    """
    keys = list(by) or ["study"]  # a study with no axes is one cell
    status = frame["status"]
    work = frame.assign(_finished=status == FINISHED, _failed=status == FAILED,
                        _incomplete=~status.isin([FINISHED, FAILED]))
    grouped = work.groupby(keys, dropna=False, sort=True)
    summary = pd.DataFrame({
        "n": grouped["_finished"].sum().astype(int),
        "n_failed": grouped["_failed"].sum().astype(int),
        "n_incomplete": grouped["_incomplete"].sum().astype(int),
    })
    summary["failure_reason"] = None
    if "failure_reason" in work:
        failed = work[work["_failed"]].dropna(subset=["failure_reason"])
        reasons = failed.groupby(keys, dropna=False, sort=True)["failure_reason"].agg(
            lambda values: "; ".join(dict.fromkeys(map(str, values))))
        # Align by label: .loc with a boolean axis (mask_token_in_encoder) would read it as a mask.
        reasons = reasons.reindex(summary.index)
        summary["failure_reason"] = reasons.astype(object).where(reasons.notna(), None)
    finished = work[work["_finished"]].groupby(keys, dropna=False, sort=True)
    for metric in metrics:  # cells with no finished run get NaN statistics and n = 0
        values = finished[metric]
        summary[f"{metric}_mean"] = values.mean()
        summary[f"{metric}_std"] = values.std()  # ddof=1
        summary[f"{metric}_n"] = values.count().reindex(summary.index, fill_value=0).astype(int)
        if TEST_SIZE in work and _is_accuracy(metric):
            n_test = finished[TEST_SIZE].mean().reindex(summary.index)
            summary[f"{metric}_binom_se"] = binomial_se(summary[f"{metric}_mean"].to_numpy(), n_test.to_numpy())
    return summary.reset_index()


def _is_accuracy(metric: str) -> bool:
    known = METRICS.get(metric)
    return known is not None and known.unit == "fraction" and known.kind in ("downstream", "reference")


def binomial_se(accuracy, n_test):
    """The binomial standard error √(p(1-p)/n) of an accuracy p measured on n test images
    (elementwise over arrays; NaN where n is missing or not positive)."""
    p = np.asarray(accuracy, dtype=float)
    n = np.asarray(n_test, dtype=float)
    with np.errstate(invalid="ignore", divide="ignore"):
        return np.sqrt(p * (1 - p) / np.where(n > 0, n, np.nan))
# ---------------------------------------------------------------------- paired comparisons

COMPARISON_COLUMNS = ["metric", "n", "reference_mean", "mean", "mean_diff", "sd_diff", "ci_low",
                      "ci_high", "t", "p", "p_holm", "detectable_diff", "delta", "p_equivalence", "p_equivalence_holm"]
EXPLORATORY = "exploratory, outside the family"  # how every verdict of the findings is marked


def _is_missing(value) -> bool:
    return value is None or (isinstance(value, float) and math.isnan(value))


def cell_mask(frame: pd.DataFrame, cell: dict) -> pd.Series:
    """Rows of ``frame`` whose every key in ``cell`` has that value (None/NaN matches missing)."""
    mask = pd.Series(True, index=frame.index)
    for key, value in cell.items():
        column = frame[key]
        mask &= column.isna() if _is_missing(value) else (column == value).fillna(False).astype(bool)
    return mask


def holm(pvalues) -> np.ndarray:
    """Holm's step-down adjustment of a family of p-values: the i-th smallest of m becomes
    max over j ≤ i of min(1, (m - j + 1)·p_(j)). NaN p-values stay NaN and do not count in m.

    Hand-kept, and tested equal to statsmodels' ``multipletests(method="holm")``, which in
    statsmodels 0.15 runs a full garbage collection per call (0.3 s): too slow for the
    simulated studies that check the sequential plan.
    """
    p = np.asarray(pvalues, dtype=float)
    adjusted = np.full(p.shape, np.nan)
    finite = np.flatnonzero(np.isfinite(p))
    m = len(finite)
    running = 0.0
    for rank, i in enumerate(finite[np.argsort(p[finite], kind="stable")]):
        running = max(running, min(1.0, (m - rank) * p[i]))
        adjusted[i] = running
    return adjusted


@dataclass
class FamilyResult:
    """:func:`one_family`'s answer for m hypotheses: each test's adjusted p, the divisor of α at
    the step that tested it (``k``: it is rejected when adjusted p < α, its raw p then below
    α/k), and ``stop``, the divisor at the first step not rejected (1 when every test was)."""

    difference: np.ndarray  # [m] adjusted p of the difference tests
    equivalence: np.ndarray  # [m] adjusted p of the TOSTs
    k_difference: np.ndarray  # [m] divisor of α at each difference test's step (NaN: no p)
    k_equivalence: np.ndarray  # [m]
    stop: int


def one_family(p_difference, p_equivalence, alpha: float = ALPHA) -> FamilyResult:
    """Both tests of every hypothesis in one step-down family (Shaffer's sequentially rejective
    Bonferroni with logically related hypotheses). Sorted by p, the test at each step is compared
    with α/k, where k is the number of hypotheses that still have a test not rejected: the most
    true nulls possible once the earlier tests' nulls are false, since a hypothesis' "no
    difference" and "a difference of at least delta" exclude each other. Adjusted p's are
    ``max over earlier steps of min(1, k·p)``, as Holm's; NaN p's stay NaN and are no test.
    For one kind alone (every other p NaN) this is Holm's adjustment."""
    p_difference, p_equivalence = np.asarray(p_difference, float), np.asarray(p_equivalence, float)
    m = len(p_difference)
    p = np.r_[p_difference, p_equivalence]
    owner = np.r_[np.arange(m), np.arange(m)]
    adjusted, divisor = np.full(2 * m, np.nan), np.full(2 * m, np.nan)
    left = np.bincount(owner[np.isfinite(p)], minlength=m)  # each hypothesis' tests not yet rejected
    finite = np.flatnonzero(np.isfinite(p))
    running, stop = 0.0, None
    for i in finite[np.argsort(p[finite], kind="stable")]:
        k = int((left > 0).sum())
        running = max(running, min(1.0, k * p[i]))
        adjusted[i], divisor[i] = running, k
        if running >= alpha and stop is None:
            stop = k
        left[owner[i]] -= 1
    return FamilyResult(adjusted[:m], adjusted[m:], divisor[:m], divisor[m:], stop if stop is not None else 1)


def detectable_difference(n: int, sd: float, *, alpha: float = ALPHA, power: float = POWER) -> float:
    """The smallest true mean difference |δ| that a two-sided paired t-test at level ``alpha``
    detects with probability ``power``, for ``n`` pairs whose differences have sd ``sd``.

    Exact for normal differences: the t statistic is noncentral t with n-1 degrees of freedom
    and noncentrality δ√n/sd (scipy.stats.nct); solved for δ by root finding. NaN for n < 2 or
    no spread. Not adjusted for multiplicity (a Holm-corrected test needs a larger δ).
    """
    if n < 2 or not (sd > 0 and math.isfinite(sd)):
        return math.nan
    return _noncentrality(int(n) - 1, alpha, power) * sd / math.sqrt(n)


@lru_cache(maxsize=256)
def _noncentrality(df: int, alpha: float, power: float) -> float:
    """The noncentrality at which a two-sided t-test with ``df`` degrees of freedom rejects at
    level ``alpha`` with probability ``power`` (δ scales with sd, so one root per n serves all)."""
    crit = sps.t.ppf(1 - alpha / 2, df)

    def shortfall(nc: float) -> float:
        # the far tail (T < -crit at nc ≥ 0) is below rounding where scipy's series gives NaN
        far = sps.nct.cdf(-crit, df, nc)
        return sps.nct.sf(crit, df, nc) + (0.0 if math.isnan(far) else far) - power

    upper = crit + 4.0
    while shortfall(upper) < 0:
        upper *= 2
    return float(brentq(shortfall, 0.0, upper, xtol=1e-10))


def _no_spread(differences: np.ndarray) -> bool:
    """Differences equal up to rounding: a t statistic would be ±inf or noise over noise."""
    scale = max(float(np.abs(differences).max()), np.finfo(float).tiny)
    return float(np.std(differences)) <= 1e-9 * scale


def paired_difference(values: np.ndarray, reference: np.ndarray, delta: float | None = None) -> dict[str, float]:
    """Paired statistics of ``values - reference`` (arrays aligned by seed): n, means, the mean
    difference, its sd, the 95% t-interval, t, the two-sided p (scipy.stats.ttest_1samp), the
    smallest detectable difference and, with ``delta`` (the metric's smallest effect of
    interest), the paired TOST p within ±delta (t, n - 1 df). With fewer than 2 pairs, or
    differences without spread, the interval, t and p's are NaN."""
    values, reference = np.asarray(values, dtype=float), np.asarray(reference, dtype=float)
    differences = values - reference
    n = len(differences)
    out = {"n": n, "reference_mean": math.nan, "mean": math.nan, "mean_diff": math.nan,
           "sd_diff": math.nan, "ci_low": math.nan, "ci_high": math.nan, "t": math.nan,
           "p": math.nan, "detectable_diff": math.nan, "delta": math.nan if delta is None else float(delta),
           "p_equivalence": math.nan}
    if n == 0:
        return out
    out.update(reference_mean=float(reference.mean()), mean=float(values.mean()),
               mean_diff=float(differences.mean()))
    if n < 2:
        return out
    if _no_spread(differences):
        out["sd_diff"] = 0.0
        return out
    sd = float(differences.std(ddof=1))
    test = sps.ttest_1samp(differences, 0.0)
    interval = test.confidence_interval(1 - ALPHA)
    out.update(sd_diff=sd, ci_low=float(interval.low), ci_high=float(interval.high),
               t=float(test.statistic), p=float(test.pvalue), detectable_diff=detectable_difference(n, sd))
    if delta is not None:
        se, mean = sd / math.sqrt(n), float(differences.mean())
        out["p_equivalence"] = float(max(sps.t.sf((mean + delta) / se, n - 1), sps.t.cdf((mean - delta) / se, n - 1)))
    return out


def paired_comparisons(frame: pd.DataFrame, axes: list[str], reference: dict, metrics: list[str]) -> pd.DataFrame:
    """Every non-reference cell against the ``reference`` cell, per metric, paired by seed.

    ``frame`` holds one row per trial (``status``, ``seed``, the ``axes`` and the metrics);
    only FINISHED trials count, and a pair needs both trials of a seed to have logged the
    metric. ``reference`` maps every axis to its value. A row per (cell, metric), cells in
    grid order, metrics in the given order; columns: the axes, then
    :data:`COMPARISON_COLUMNS`: ``n`` pairs, ``reference_mean`` and ``mean`` over those pairs,
    ``mean_diff`` (cell - reference) and ``sd_diff``, the 95% t-interval ``ci_low``/``ci_high``,
    the paired t-test's ``t`` and two-sided ``p``, ``p_holm``, ``detectable_diff`` (see
    :func:`detectable_difference`), the metric's ``delta``, the TOST's ``p_equivalence`` and
    ``p_equivalence_holm``.

    Multiplicity: ``p_holm`` and ``p_equivalence_holm`` are adjusted within each metric's family
    (:func:`one_family`: both tests of every non-reference cell against the reference on that
    metric; each metric is its own question: does the axis change this quantity?). Rows
    without a p (fewer than 2 pairs, no spread) are not in the family.
    """
    if set(reference) != set(axes):
        raise ValueError(f"the reference {reference} does not name every axis of {list(axes)}")
    finished = frame[frame["status"] == FINISHED] if "status" in frame else frame
    metrics = [m for m in metrics if m in finished]
    is_reference = cell_mask(finished, reference)
    by_seed = finished[is_reference].groupby("seed")[metrics].mean()  # the reference, per seed
    rows = []
    if axes:
        for key, cell in finished[~is_reference].groupby(list(axes), dropna=False, sort=True):
            values = dict(zip(axes, key))
            mine = cell.groupby("seed")[metrics].mean()
            for metric in metrics:
                pairs = pd.concat([mine[metric].rename("x"), by_seed[metric].rename("r")], axis=1,
                                  join="inner").dropna()
                rows.append({**values, "metric": metric,
                             **paired_difference(pairs["x"].to_numpy(), pairs["r"].to_numpy(), _delta(metric))})
    return _comparison_table(rows, [*axes, *COMPARISON_COLUMNS], families="metric")


def _delta(metric: str) -> float | None:
    known = METRICS.get(metric)
    return known.delta if known is not None else None


def _comparison_table(rows: list[dict], columns: list[str], families: str | list[str]) -> pd.DataFrame:
    """The rows as a table with ``p_holm`` and ``p_equivalence_holm``: the difference tests and
    the TOSTs of each group of ``families`` adjusted together (:func:`one_family`, the claims'
    rule; Holm's where no TOST could be computed)."""
    table = pd.DataFrame(rows, columns=columns)
    table["n"] = table["n"].astype(int)
    table["p_holm"] = np.nan
    table["p_equivalence_holm"] = np.nan
    for _, family in table.groupby(families, sort=False).groups.items():
        adjusted = one_family(table.loc[family, "p"].to_numpy(), table.loc[family, "p_equivalence"].to_numpy())
        table.loc[family, "p_holm"] = adjusted.difference
        table.loc[family, "p_equivalence_holm"] = adjusted.equivalence
    return table


def baseline_comparisons(frame: pd.DataFrame, axes: list[str], pairs: list[tuple[str, str]]) -> pd.DataFrame:
    """Every cell's ``metric`` against each of its baselines, per ``(metric, baseline)`` pair
    (e.g. ``("finetune_acc", "scratch_best_finetune_acc")``), paired within each finished trial:
    the baseline was measured in the same run, on the same seed, data split and test images.
    Columns: the axes, ``baseline``, then :data:`COMPARISON_COLUMNS` (``reference_mean`` is the
    baseline's mean). ``p_holm`` and ``p_equivalence_holm`` are adjusted within each (metric,
    baseline) family, the cells of the grid (:func:`one_family`)."""
    finished = frame[frame["status"] == FINISHED] if "status" in frame else frame
    pairs = [(m, b) for m, b in pairs if m in finished and b in finished]
    groups = finished.groupby(list(axes), dropna=False, sort=True) if axes else [((), finished)]
    rows = []
    for key, cell in groups:
        values = dict(zip(axes, key if isinstance(key, tuple) else (key,)))
        for metric, baseline in pairs:
            both = cell[[metric, baseline]].dropna()
            rows.append({**values, "baseline": baseline, "metric": metric,
                         **paired_difference(both[metric].to_numpy(), both[baseline].to_numpy(), _delta(metric))})
    return _comparison_table(rows, [*axes, "baseline", *COMPARISON_COLUMNS], families=["metric", "baseline"])


def _direction_of(metric: str) -> str:
    if metric not in METRICS:
        raise ValueError(f"no better direction known for {metric!r}; pass direction='higher' or 'lower'")
    return "lower" if METRICS[metric].lower_is_better else "higher"


def verdict(row, direction: str | None = None) -> str:
    """The verdict of one :func:`paired_comparisons` (or baseline) row, in the declared claims'
    four words, from its numbers alone; a report marks them :data:`EXPLORATORY`.

    Convention: the difference is the row's cell minus the reference, paired by seed;
    ``direction`` is where "better" lies: "higher" or "lower" (None: the metric's better
    direction from ``lower_is_better`` in :data:`evaluation.metrics.METRICS`).

    * "equivalent": the TOST within ±delta, adjusted with the row's family (``p_equivalence_holm``),
      is below 0.05 (checked first, as for claims);
    * "better" / "worse": the adjusted difference test ``p_holm`` is below 0.05 and the
      difference lies in ``direction`` / the other way;
    * "inconclusive" otherwise (no TOST without a delta: never "equivalent" then), which is not
      evidence of no effect; ``detectable_diff`` says what the design could detect.
    """
    direction = direction or _direction_of(row["metric"])
    if direction not in ("higher", "lower"):
        raise ValueError(f"direction {direction!r}: expected 'higher' or 'lower'")
    p, difference = float(row["p_holm"]), float(row["mean_diff"])
    p_equivalence = float(row.get("p_equivalence_holm", math.nan)) if hasattr(row, "get") else math.nan
    if p_equivalence < ALPHA:
        return "equivalent"
    if p < ALPHA and difference != 0:
        return "better" if (difference > 0) == (direction == "higher") else "worse"
    return "inconclusive"


# ------------------------------------------------------------------------- correlations


def _ranks(values: np.ndarray) -> np.ndarray:
    """Average ranks along the last axis (ties share their mean rank, as Spearman needs)."""
    return sps.rankdata(values, axis=-1)


def _pearson_rows(x: np.ndarray, y: np.ndarray) -> np.ndarray:
    """Pearson r of each row pair ``[R,n]``; NaN where a row is constant."""
    x = x - x.mean(axis=-1, keepdims=True)
    y = y - y.mean(axis=-1, keepdims=True)
    denominator = np.sqrt((x * x).sum(-1) * (y * y).sum(-1))
    with np.errstate(invalid="ignore", divide="ignore"):
        return np.where(denominator > 0, (x * y).sum(-1) / denominator, np.nan)


def _kendall_rows(x: np.ndarray, y: np.ndarray) -> np.ndarray:
    """Kendall's τ_b of each row pair ``[R,n]``: Σ sgn(Δx)sgn(Δy) / √(Σ sgn(Δx)² · Σ sgn(Δy)²)
    over pairs, which is τ_b's tie correction (scipy's default variant)."""
    sx = np.sign(x[..., :, None] - x[..., None, :])
    sy = np.sign(y[..., :, None] - y[..., None, :])
    denominator = np.sqrt((sx * sx).sum((-2, -1)) * (sy * sy).sum((-2, -1)))
    with np.errstate(invalid="ignore", divide="ignore"):
        return np.where(denominator > 0, (sx * sy).sum((-2, -1)) / denominator, np.nan)


def _percentile_interval(samples: np.ndarray, level: float = 0.95) -> tuple[float, float]:
    finite = samples[np.isfinite(samples)]
    if finite.size == 0:
        return (np.nan, np.nan)
    tail = 100 * (1 - level) / 2
    low, high = np.percentile(finite, [tail, 100 - tail])
    return float(low), float(high)


def cluster_bootstrap_indices(clusters, n_boot: int, rng: np.random.Generator) -> list[np.ndarray]:
    """``n_boot`` bootstrap samples of trial indices that resample *clusters*, not trials:
    each sample draws as many clusters as there are, with replacement, and takes every trial of
    each drawn cluster (trials of one grid cell share its config, so they are not independent
    draws). ``clusters`` labels each trial (any hashable values; None/NaN is a label too)."""
    codes, uniques = pd.factorize(pd.Series(list(clusters), dtype=object), use_na_sentinel=False)
    members = [np.flatnonzero(codes == c) for c in range(len(uniques))]
    draws = rng.integers(0, len(members), size=(n_boot, len(members)))
    return [np.concatenate([members[c] for c in row]) for row in draws]


def _bootstrap_rows(x: np.ndarray, y: np.ndarray, samples: list[np.ndarray]) -> tuple[np.ndarray, np.ndarray]:
    """Spearman ρ and Kendall τ_b of every bootstrap sample (samples of one length at a time,
    in chunks that keep the Kendall sign matrices small)."""
    rhos, taus = [], []
    by_length: dict[int, list[np.ndarray]] = {}
    for index in samples:
        by_length.setdefault(len(index), []).append(index)
    for length, group in by_length.items():
        index = np.stack(group)
        chunk = max(1, 2_000_000 // max(1, length * length))
        for start in range(0, len(index), chunk):
            part = index[start:start + chunk]
            xb, yb = x[part], y[part]
            rhos.append(_pearson_rows(_ranks(xb), _ranks(yb)))
            taus.append(_kendall_rows(xb, yb))
    return np.concatenate(rhos), np.concatenate(taus)


# No p-values: scipy's treat trials as independent draws, which trials of one cell are not.
_CORRELATION_KEYS = ("spearman_rho", "spearman_low", "spearman_high", "kendall_tau", "kendall_low",
                     "kendall_high")


def correlation_with_interval(x: np.ndarray, y: np.ndarray, *, clusters=None, n_boot: int = 2000,
                              seed: int = 0) -> dict[str, float]:
    """Spearman ρ and Kendall τ_b of paired ``x [n]``, ``y [n]`` with 95% percentile bootstrap
    intervals from a cluster bootstrap
    (:func:`cluster_bootstrap_indices`; ``clusters=None``: every trial its own cluster).

    Also ``n`` (trials), ``n_clusters`` and ``reason``: None when the statistics are stated,
    else why they are NaN (fewer than :data:`MIN_TRIALS` trials; fewer than
    :data:`MIN_CLUSTERS` clusters; or a constant column). No p-value is given: scipy's would
    treat trials as independent, and trials of one cell are not; the intervals respect the
    clusters.
    """
    x, y = np.asarray(x, dtype=float), np.asarray(y, dtype=float)
    n = len(x)
    labels = list(range(n)) if clusters is None else list(clusters)
    n_clusters = len(pd.unique(pd.Series(labels, dtype=object))) if n else 0
    out = {"n": n, "n_clusters": n_clusters, "reason": None}
    reason = None
    if n < MIN_TRIALS:
        reason = f"not enough trials: {n} of {MIN_TRIALS}"
    elif n_clusters < MIN_CLUSTERS:
        reason = (f"not enough trials: {n_clusters} of {MIN_CLUSTERS} independent clusters (cells; the "
                  f"trials of one cell share its config)")
    elif np.ptp(x) == 0 or np.ptp(y) == 0:
        reason = "a constant column: no rank order to correlate"
    if reason is not None:
        return out | {key: np.nan for key in _CORRELATION_KEYS} | {"reason": reason}
    spearman = sps.spearmanr(x, y)
    kendall = sps.kendalltau(x, y)
    samples = cluster_bootstrap_indices(labels, n_boot, np.random.default_rng(seed))
    rho_samples, tau_samples = _bootstrap_rows(x, y, samples)
    rho_low, rho_high = _percentile_interval(rho_samples)
    tau_low, tau_high = _percentile_interval(tau_samples)
    return out | {
        "spearman_rho": float(spearman.statistic), "spearman_low": rho_low,
        "spearman_high": rho_high,
        "kendall_tau": float(kendall.statistic), "kendall_low": tau_low,
        "kendall_high": tau_high,
    }


CORRELATION_COLUMNS = ["stratum", "risk", "downstream", "n", "n_clusters", *_CORRELATION_KEYS, "reason"]
STRATUM_KEYS = (*RISK_MEANING_AXES, "steps")  # trials correlated together share all of these


def _label(keys: list[str], values: tuple) -> str:
    return ", ".join(f"{k}={v}" for k, v in zip(keys, values)) or "all trials"


def rank_correlations(frame: pd.DataFrame, risks: list[str], downstream: list[str], *,
                      axes: list[str] | tuple[str, ...] = (), n_boot: int = 2000, seed: int = 0) -> pd.DataFrame:
    """A row per (stratum, risk, downstream) over FINISHED trials that logged both.

    A *stratum* is a set of trials whose risk is the same quantity: they share every key of
    :data:`STRATUM_KEYS` (the config keys of ``RISK_MEANING_AXES``, which change what a risk
    measures, plus the training length ``steps``) present in ``frame``, and every evaluation
    setting (``eval.*``) that varies: trials that differ only in how they are evaluated share
    their pretrained encoder, so across them one model would count as several (partial_finetune:
    four cells, one encoder per seed). ``stratum`` names the keys that vary in ``frame`` ("all
    trials" when none does). Correlations are computed only
    within a stratum: across the cells it holds (cells differ on the other ``axes``), or within
    one cell across its seeds. The bootstrap resamples cells (every trial of a drawn cell goes
    along) when a stratum holds several cells (at least :data:`MIN_CLUSTERS` are needed),
    trials when it holds one.

    Columns: :data:`CORRELATION_COLUMNS`; statistics are NaN, with a ``reason``, below
    :data:`MIN_TRIALS` trials or for a constant column. Pairs whose columns are absent from
    ``frame`` are skipped.
    """
    finished = frame[frame["status"] == FINISHED] if "status" in frame else frame
    evaluation = [c for c in finished.columns if c.startswith("eval.") and finished[c].nunique(dropna=False) > 1]
    keys = [k for k in STRATUM_KEYS if k in finished] + evaluation
    shown = [k for k in keys if finished[k].nunique(dropna=False) > 1]
    cell_keys = [a for a in axes if a in finished]
    strata = finished.groupby(keys, dropna=False, sort=True) if keys else [((), finished)]
    rows = []
    for values, stratum in strata:
        label = _label(shown, tuple(dict(zip(keys, values))[k] for k in shown))
        if cell_keys:
            clusters = list(stratum[cell_keys].astype(str).itertuples(index=False, name=None))
            one_cell = len(set(clusters)) == 1
        else:
            clusters, one_cell = None, True
        for risk in risks:
            for target in downstream:
                if risk not in finished or target not in finished:
                    continue
                keep = stratum[[risk, target]].notna().all(axis=1).to_numpy()
                labels = None if one_cell else [c for c, k in zip(clusters, keep) if k]
                paired = stratum[keep]
                rows.append({"stratum": label, "risk": risk, "downstream": target,
                             **correlation_with_interval(paired[risk].to_numpy(), paired[target].to_numpy(),
                                                         clusters=labels, n_boot=n_boot, seed=seed)})
    return pd.DataFrame(rows, columns=CORRELATION_COLUMNS)


def correlation_reading(correlations: pd.DataFrame) -> str:
    """One plain-language paragraph: which risks ranked trials like which downstream metric.

    Reads the Spearman rows of :func:`rank_correlations`; an interval that contains 0 is
    reported as no supported monotone relation; strata below :data:`MIN_TRIALS` trials are
    counted, not read.
    """
    usable = correlations.dropna(subset=["spearman_rho"])
    if usable.empty:
        n = int(correlations["n"].max()) if len(correlations) else 0
        return (f"Too few finished trials with both a risk and a downstream metric whose risk is "
                f"the same quantity (at most n={n} per stratum; at least {MIN_TRIALS} trials, and "
                f"{MIN_CLUSTERS} cells when a stratum spans several, are needed), so no Spearman "
                f"or Kendall rank correlation is claimed.")
    strata = list(dict.fromkeys(usable["stratum"]))
    ns = sorted(set(usable["n"].astype(int)))
    trials = f"{ns[0]} trials" if len(ns) == 1 else f"{ns[0]}–{ns[-1]} trials (pairs differ in coverage)"
    where = "" if strata == ["all trials"] else (
        f" of {strata[0]}" if len(strata) == 1 else f" per stratum ({len(strata)} strata)")
    sentences = [f"Across {trials}{where}: lower risk is better and higher accuracy is better, so a "
                 f"negative rank correlation means the risk orders trials the way the downstream "
                 f"task does. Only trials whose risk is the same quantity are correlated together "
                 f"(same {', '.join(STRATUM_KEYS)}); intervals are 95% bootstrap intervals that "
                 f"resample cells, not trials."]
    for row in usable.itertuples():
        risk, target = plain_name(row.risk), plain_name(row.downstream)
        prefix = "" if len(strata) == 1 else f"At {row.stratum}: "
        stat = (f"Spearman ρ={row.spearman_rho:+.2f}, 95% CI [{row.spearman_low:+.2f}, "
                f"{row.spearman_high:+.2f}]; Kendall τ={row.kendall_tau:+.2f}; n={int(row.n)} trials "
                f"in {int(row.n_clusters)} clusters")
        if not (row.spearman_low > 0 or row.spearman_high < 0):
            sentences.append(f"{prefix}For {risk} and {target} the interval contains 0 ({stat}), so no "
                             f"monotone relation is supported.")
        elif row.spearman_rho < 0:
            sentences.append(f"{prefix}Lower {risk} went with higher {target} ({stat}): the good direction.")
        else:
            sentences.append(f"{prefix}Lower {risk} went with lower {target} ({stat}): reconstruction and "
                             f"this downstream task disagree.")
    refused = len(correlations) - len(usable)
    if refused:
        sentences.append(f"{refused} further row(s) of risk and downstream metric claim nothing "
                         f"(fewer than {MIN_TRIALS} trials or {MIN_CLUSTERS} cells in their "
                         f"stratum, or a constant column; see their reason).")
    return " ".join(sentences)
