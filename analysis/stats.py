"""Statistics over trials: per-cell mean ± std over seeds, and rank correlations between risks
and downstream accuracy with bootstrap intervals.

Convention: a risk is better when *lower*, an accuracy when *higher*, so a *negative*
correlation between a risk and an accuracy means the risk ranks trials the way the downstream
task does.
"""

from __future__ import annotations

import numpy as np
import pandas as pd
from scipy import stats as sps

from evaluation.metrics import METRICS

FINISHED = "FINISHED"
FAILED = "FAILED"
MIN_TRIALS = 3  # fewer paired trials than this give no rank correlation worth stating

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
    return summary.reset_index()


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


def correlation_with_interval(x: np.ndarray, y: np.ndarray, *, n_boot: int = 2000,
                              seed: int = 0) -> dict[str, float]:
    """Spearman ρ and Kendall τ_b of paired ``x [n]``, ``y [n]`` with their p-values (scipy)
    and 95% percentile bootstrap intervals (trials resampled with replacement, pairs kept)."""
    x, y = np.asarray(x, dtype=float), np.asarray(y, dtype=float)
    n = len(x)
    out = {"n": n}
    if n < MIN_TRIALS or np.ptp(x) == 0 or np.ptp(y) == 0:
        return out | {key: np.nan for key in ("spearman_rho", "spearman_low", "spearman_high",
                                              "spearman_p", "kendall_tau", "kendall_low",
                                              "kendall_high", "kendall_p")}
    spearman = sps.spearmanr(x, y)
    kendall = sps.kendalltau(x, y)
    index = np.random.default_rng(seed).integers(0, n, size=(n_boot, n))
    xb, yb = x[index], y[index]  # [n_boot, n]
    rho_low, rho_high = _percentile_interval(_pearson_rows(_ranks(xb), _ranks(yb)))
    tau_low, tau_high = _percentile_interval(_kendall_rows(xb, yb))
    return out | {
        "spearman_rho": float(spearman.statistic), "spearman_low": rho_low,
        "spearman_high": rho_high, "spearman_p": float(spearman.pvalue),
        "kendall_tau": float(kendall.statistic), "kendall_low": tau_low,
        "kendall_high": tau_high, "kendall_p": float(kendall.pvalue),
    }


def rank_correlations(frame: pd.DataFrame, risks: list[str], downstream: list[str], *,
                      n_boot: int = 2000, seed: int = 0) -> pd.DataFrame:
    """A row per (risk, downstream) pair over FINISHED trials that logged both.

    Columns: ``risk, downstream, n, spearman_rho, spearman_low, spearman_high, spearman_p,
    kendall_tau, kendall_low, kendall_high, kendall_p`` (NaN with fewer than 3 trials or a
    constant column). Pairs whose columns are absent from ``frame`` are skipped.
    """
    finished = frame[frame["status"] == FINISHED] if "status" in frame else frame
    rows = []
    for risk in risks:
        for target in downstream:
            if risk not in finished or target not in finished:
                continue
            paired = finished[[risk, target]].dropna()
            rows.append({"risk": risk, "downstream": target,
                         **correlation_with_interval(paired[risk].to_numpy(), paired[target].to_numpy(),
                                                     n_boot=n_boot, seed=seed)})
    columns = ["risk", "downstream", "n", "spearman_rho", "spearman_low", "spearman_high",
               "spearman_p", "kendall_tau", "kendall_low", "kendall_high", "kendall_p"]
    return pd.DataFrame(rows, columns=columns)


def correlation_reading(correlations: pd.DataFrame) -> str:
    """One plain-language paragraph: which risks ranked trials like which downstream metric.

    Reads the Spearman rows of :func:`rank_correlations`; an interval that contains 0 is
    reported as no supported monotone relation.
    """
    usable = correlations.dropna(subset=["spearman_rho"])
    if usable.empty:
        n = int(correlations["n"].max()) if len(correlations) else 0
        return (f"Too few finished trials with both a risk and a downstream metric (n={n}; at least "
                f"{MIN_TRIALS} are needed) to state a rank correlation.")
    ns = sorted(set(usable["n"].astype(int)))
    trials = f"{ns[0]} trials" if len(ns) == 1 else f"{ns[0]}–{ns[-1]} trials (pairs differ in coverage)"
    sentences = [f"Across {trials}: lower risk is better and higher accuracy is better, so a "
                 f"negative rank correlation means the risk orders trials the way the downstream "
                 f"task does."]
    for row in usable.itertuples():
        risk, target = plain_name(row.risk), plain_name(row.downstream)
        stat = (f"Spearman ρ={row.spearman_rho:+.2f}, 95% CI [{row.spearman_low:+.2f}, "
                f"{row.spearman_high:+.2f}]; Kendall τ={row.kendall_tau:+.2f}")
        if row.spearman_low <= 0 <= row.spearman_high:
            sentences.append(f"For {risk} and {target} the interval contains 0 ({stat}), so no "
                             f"monotone relation is supported.")
        elif row.spearman_rho < 0:
            sentences.append(f"Lower {risk} went with higher {target} ({stat}): the good direction.")
        else:
            sentences.append(f"Lower {risk} went with lower {target} ({stat}): reconstruction and "
                             f"this downstream task disagree.")
    return " ".join(sentences)
