"""Where a cell's noise comes from: one variance component per source of randomness (issue 35).

A trial draws from four sources, each seeded by its own key (:data:`mae_core.config.SEED_SOURCES`):
``seed_data`` (the split), ``seed_init`` (the weights), ``seed_masks`` (I_t, V_t, the DAE's
noise) and ``seed_eval`` (every evaluation draw). ``mae-study variance`` runs a design that
varies one source at a time at one cell (Bouthillier et al. 2021, "Accounting for Variance in
Machine Learning Benchmarks"): every source at the study's first seed s, then, per source, K
trials with that source at s+1, ..., s+K and the others at s. The design is a study of its own
(:func:`variance_design`: one zipped group over the four ``seed_*`` keys), run through Ray Tune
and MLflow like any other; the trials that differ only in ``seed_eval`` share one pretraining
(:mod:`studies.pretrained`), as ``mae-study evaluate`` reuses stored encoders.

The estimate (:func:`components`). With the other sources fixed, a trial is a deterministic
function of the varied seed (on the CPU, bit for bit), so the K values of a source are K draws
of its effect and nothing else: a one-way design with one trial per level, whose between-level
mean square *is* the source's variance component (no within-level term to subtract). Its 95%
interval is the chi-square one, (K-1)s²/χ²_{0.975,K-1} to (K-1)s²/χ²_{0.025,K-1}, exact when the
effects are normal. On a GPU, run-to-run nondeterminism adds to every source's estimate alike.
A random-effects model with a residual (statsmodels' MixedLM) is not identified here: no level
has a second trial, and on the CPU the residual is exactly zero.

Outputs: ``variance.csv`` (metric, source, variance, ci_low, ci_high, levels, n, sd, share), a
figure of each metric's variance shared out by source (:func:`variance_figure`), and the report
section (:func:`section_html`), which ``mae-study report`` shows when the study's folder holds
``variance/variance.csv``.
"""

from __future__ import annotations

import html
import math
from collections.abc import Sequence
from dataclasses import replace
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd
from scipy import stats

from evaluation.metrics import DOWNSTREAM_METRICS, METRICS, RISK_METRICS
from mae_core.config import SEED_SOURCES

SOURCES = tuple(SEED_SOURCES)  # seed_data, seed_init, seed_masks, seed_eval
DEFAULT_LEVELS = 5  # --levels: trials per source (4 x 5 = 20 trials)
CONFIDENCE = 0.95
VARIANCE_FILE = "variance.csv"
VARIANCE_DIR = "variance"  # under the study's own folder: OUT/STUDY[-smoke]/variance/
COLUMNS = ["metric", "source", "variance", "ci_low", "ci_high", "levels", "n", "sd", "share"]
DESIGN_SUFFIX = "_variance"  # the design's study name: STUDY_variance
SOURCE_WORDS = {"seed_data": "data split", "seed_init": "initialisation", "seed_masks": "I_t, V_t (masks)",
                "seed_eval": "evaluation draws"}


def design_rows(seed: int, levels: int) -> dict[str, list[int]]:
    """The zipped group of the design: per source, ``levels`` rows with it at seed+1..seed+levels
    and every other source at ``seed``; ``{"seed_data": [...], "seed_init": [...], ...}`` with
    4·levels values each."""
    rows: dict[str, list[int]] = {key: [] for key in SOURCES}
    for varied in SOURCES:
        for level in range(1, levels + 1):
            for key in SOURCES:
                rows[key].append(seed + level if key == varied else seed)
    return rows


def variance_design(study, cell: dict[str, Any], levels: int):
    """The design as a :class:`studies.study.Study` named ``STUDY_variance``: ``study``'s base and
    evaluation with ``cell``'s values fixed, its first seed as ``seed``, no axes, one zipped
    group (:func:`design_rows`), no claims. ``study`` is already in smoke mode if it is to run so."""
    seed = int(study.seeds[0])
    return replace(
        study, name=study.name + DESIGN_SUFFIX, base={**study.base, **cell}, axes={}, smoke_axes=None,
        zipped=(design_rows(seed, levels),), smoke_zipped=None, seeds=(seed,), reference=None, claims=(),
        search=None, doc=f"Variance components of {study.name} at {cell or 'its only cell'}: one seed source "
                         f"varied at a time, {levels} levels each.")


def varied_source(row: pd.Series, seed: int) -> str | None:
    """The source a design trial varies: the one ``seed_*`` key not at ``seed`` (None: none or several)."""
    moved = [key for key in SOURCES if key in row and not pd.isna(row[key]) and int(row[key]) != seed]
    return moved[0] if len(moved) == 1 else None


def design_metrics(frame: pd.DataFrame) -> list[str]:
    """The risks and downstream metrics the design's trials logged (finite on some trial)."""
    named = [*RISK_METRICS, *DOWNSTREAM_METRICS]
    return [m for m in named if m in frame and frame[m].notna().any()]


def one_way(values: np.ndarray, confidence: float = CONFIDENCE) -> tuple[float, float, float]:
    """(variance, low, high) of ``values`` [K], one trial per level of one source: the sample
    variance (ddof 1) and its chi-square interval with K-1 degrees of freedom."""
    k = len(values)
    if k < 2:
        return math.nan, math.nan, math.nan
    variance = float(np.var(values, ddof=1))
    alpha = 1 - confidence
    df = k - 1
    return variance, df * variance / stats.chi2.ppf(1 - alpha / 2, df), df * variance / stats.chi2.ppf(alpha / 2, df)


def components(frame: pd.DataFrame, seed: int, metrics: Sequence[str] | None = None) -> pd.DataFrame:
    """A row per (metric, source): :data:`COLUMNS`. ``frame``: the design's trials (one row each,
    the ``seed_*`` params and metrics as columns; unfinished trials are left out); ``seed``: the
    value the fixed sources hold. ``share``: the source's part of the metric's summed variance."""
    finished = frame[frame["status"] == "FINISHED"] if "status" in frame else frame
    sources = finished.apply(lambda row: varied_source(row, seed), axis=1) if len(finished) else pd.Series()
    rows = []
    for metric in metrics if metrics is not None else design_metrics(finished):
        for source in SOURCES:
            values = finished.loc[sources == source, metric].dropna().to_numpy(float) if len(finished) else []
            levels = finished.loc[(sources == source) & finished[metric].notna(), source].nunique() \
                if len(finished) else 0
            variance, low, high = one_way(np.asarray(values))
            rows.append({"metric": metric, "source": source, "variance": variance, "ci_low": low, "ci_high": high,
                         "levels": int(levels), "n": len(values), "sd": math.sqrt(variance)
                         if variance == variance else math.nan})
    table = pd.DataFrame(rows, columns=COLUMNS[:-1])
    total = table.groupby("metric")["variance"].transform("sum")
    table["share"] = np.where(total > 0, table["variance"] / total.where(total > 0, 1.0), math.nan)
    return table[COLUMNS]


ADVICE_FILE = "variance_advice.csv"
ADVICE_COLUMNS = ["metric", "training_variance", "eval_variance", "pretrain_seconds", "eval_seconds",
                  "best_repeats", "seconds_per_seed", "seconds_ratio"]
MAX_REPEATS = 50  # eval.repeats the advice names at most


def repeats_advice(table: pd.DataFrame, pretrain_seconds: float, eval_seconds: float) -> pd.DataFrame:
    """Which buys a decision sooner, more seeds or more evaluation repeats, per metric of
    ``table`` (:func:`components`'s), from the measured components and a trial's seconds.

    A cell's mean over n seeds with R repeats each has variance (T + E/R)/n, T the training
    sources' components summed (``seed_data`` + ``seed_init`` + ``seed_masks``), E
    ``seed_eval``'s, and costs n(P + R·V) seconds, P ``pretrain_seconds``, V ``eval_seconds``.
    For a given precision the seconds are proportional to (T + E/R)(P + R·V), least at
    R* = sqrt(E·P / (T·V)) (two-stage sampling's optimal allocation), rounded to a whole count
    in [1, MAX_REPEATS]. ``seconds_ratio``: the seconds any decision (``n_needed``, a look of
    seeds by need) takes with ``eval.repeats`` R* over those with 1; below 1, repeats pay, and
    ``n_needed`` shrinks by (T + E/R*)/(T + E) seeds. The sources' effects are taken as additive
    and a paired comparison's variance as shared out like the cell's."""
    rows = []
    for metric, rows_of in table.groupby("metric", sort=False):
        by = rows_of.set_index("source")["variance"]
        training = float(by.reindex([s for s in SOURCES if s != "seed_eval"]).sum(min_count=1))
        evaluation = float(by.get("seed_eval", math.nan))
        if not (math.isfinite(training) and math.isfinite(evaluation)) or training + evaluation <= 0:
            best, ratio = math.nan, math.nan
        else:
            if evaluation == 0 or eval_seconds <= 0:
                best = 1
            elif training == 0:
                best = MAX_REPEATS
            else:
                best = math.sqrt(evaluation * pretrain_seconds / (training * eval_seconds))
                best = int(min(MAX_REPEATS, max(1, round(best))))
            ratio = ((training + evaluation / best) * (pretrain_seconds + best * eval_seconds)
                     / ((training + evaluation) * (pretrain_seconds + eval_seconds)))
        rows.append({"metric": metric, "training_variance": training, "eval_variance": evaluation,
                     "pretrain_seconds": pretrain_seconds, "eval_seconds": eval_seconds, "best_repeats": best,
                     "seconds_per_seed": pretrain_seconds + (best if best == best else 1) * eval_seconds,
                     "seconds_ratio": ratio})
    return pd.DataFrame(rows, columns=ADVICE_COLUMNS)


CLAIMS_SPEND_FILE = "variance_claims.csv"
CLAIMS_SPEND_COLUMNS = ["hypothesis", "metric", "n_needed", "seconds_seeds", "best_repeats",
                        "n_needed_repeats", "seconds_repeats"]


def claims_spend(claims: pd.DataFrame, advice: pd.DataFrame) -> pd.DataFrame:
    """Each open hypothesis of ``claims`` (a ``claims.csv`` table) priced both ways from
    :func:`repeats_advice`'s ``advice``: ``n_needed`` seeds per cell at one evaluation each
    (``seconds_seeds`` = n·(P + V) per cell), against ``n_needed_repeats`` =
    ⌈n·(T + E/R*)/(T + E)⌉ seeds at ``eval.repeats`` R* (``seconds_repeats`` = n'·(P + R*·V)).
    Rows: the inconclusive hypotheses with a finite ``n_needed`` whose metric the design measured; a paired
    comparison's variance is taken as shared out by source like its cell's (the advice's
    assumption)."""
    by_metric = advice.set_index("metric")
    rows = []
    open_ = claims[claims["verdict"] == "inconclusive"] if "verdict" in claims else claims
    for _, claim in open_.iterrows():
        needed, metric = float(claim.get("n_needed", math.nan)), claim.get("metric")
        if not math.isfinite(needed) or metric not in by_metric.index:
            continue
        row = by_metric.loc[metric]
        training, evaluation, best = row["training_variance"], row["eval_variance"], row["best_repeats"]
        if not (math.isfinite(best) and training + evaluation > 0):
            continue
        # (rounded first: at R* = 1 the ratio is 1 up to float error, and n must stay n)
        shrunk = math.ceil(round(needed * (training + evaluation / best) / (training + evaluation), 9))
        rows.append({"hypothesis": claim.get("hypothesis", claim.get("claim")), "metric": metric,
                     "n_needed": int(needed),
                     "seconds_seeds": needed * (row["pretrain_seconds"] + row["eval_seconds"]),
                     "best_repeats": int(best), "n_needed_repeats": shrunk,
                     "seconds_repeats": shrunk * (row["pretrain_seconds"] + best * row["eval_seconds"])})
    return pd.DataFrame(rows, columns=CLAIMS_SPEND_COLUMNS)


def trial_seconds(frame: pd.DataFrame) -> tuple[float, float]:
    """(pretrain, eval) seconds of one trial of the design: the medians over its finished trials
    that trained their own encoder (a ``seed_eval`` trial reusing one reports no pretraining)."""
    finished = frame[frame["status"] == "FINISHED"] if "status" in frame else frame
    own = finished["seed_eval"] == finished["seed"] if {"seed_eval", "seed"} <= set(finished) else True
    trained = finished[own]
    pretrain = trained["pretrain_seconds"].median() if "pretrain_seconds" in trained else math.nan
    evaluation = finished["eval_seconds"].median() if "eval_seconds" in finished else math.nan
    return float(pretrain), float(evaluation)


def variance_figure(table: pd.DataFrame):
    """Each metric's variance shared out by source: one horizontal bar per metric, split by
    source (seaborn's palette), share of the summed components; None when no metric varied."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    import seaborn as sns

    shares = table.dropna(subset=["share"]).pivot(index="metric", columns="source", values="share")
    if shares.empty:
        return None
    shares = shares.reindex(columns=[s for s in SOURCES if s in shares.columns])
    labels = [METRICS[m].label if m in METRICS else m for m in shares.index]
    colours = sns.color_palette("colorblind", len(shares.columns))
    fig, ax = plt.subplots(figsize=(7, 0.45 * len(shares) + 1.3))
    left = np.zeros(len(shares))
    for colour, source in zip(colours, shares.columns):
        ax.barh(labels, shares[source].to_numpy(), left=left, color=colour, label=SOURCE_WORDS[source])
        left += shares[source].fillna(0).to_numpy()
    ax.set_xlim(0, 1)
    ax.invert_yaxis()
    ax.set_xlabel("share of the metric's variance (of the four components' sum)")
    ax.legend(ncol=2, loc="lower center", bbox_to_anchor=(0.5, 1.0), frameon=False, fontsize=8)
    return fig


def write_variance(table: pd.DataFrame, out: Path, formats: Sequence[str] = ("png",),
                   advice: pd.DataFrame | None = None) -> list[Path]:
    """``variance.csv``, ``variance_advice.csv`` (with ``advice``: :func:`repeats_advice`) and
    ``fig_variance.<format>`` in ``out`` (made if missing); their paths."""
    import matplotlib.pyplot as plt

    out.mkdir(parents=True, exist_ok=True)
    paths = [out / VARIANCE_FILE]
    table.to_csv(paths[0], index=False)
    if advice is not None:
        paths.append(out / ADVICE_FILE)
        advice.to_csv(paths[-1], index=False)
    fig = variance_figure(table)
    if fig is not None:
        for fmt in formats:
            paths.append(out / f"fig_variance.{fmt}")
            fig.savefig(paths[-1], dpi=150, bbox_inches="tight")
        plt.close(fig)
    return paths


def read_variance(folder: Path) -> pd.DataFrame | None:
    """The ``variance.csv`` in ``folder`` (None: there is none, or it is not one this module wrote)."""
    path = folder / VARIANCE_FILE
    if not path.is_file():
        return None
    try:
        table = pd.read_csv(path)
    except (pd.errors.ParserError, pd.errors.EmptyDataError, UnicodeDecodeError, ValueError):
        return None
    return table if all(column in table for column in COLUMNS) else None


INTRO = ("Where the noise of one cell comes from: each source of randomness varied alone ({levels} levels), the "
         "others fixed. variance: the sample variance over its levels (one trial per level, a deterministic "
         "function of its seed on the CPU, so the between-level mean square is the component); interval: "
         "95% chi-square, exact for normal effects. share: its part of the four components' sum. A source "
         "with a large share is what more seeds of that kind average away: seed_eval by eval.repeats "
         "(no retraining), the others only by more trials.")


def advice_text(advice: pd.DataFrame) -> list[str]:
    """A sentence per metric of :func:`repeats_advice`'s table: repeats or seeds, and by how much."""
    lines = []
    for _, row in advice.dropna(subset=["seconds_ratio"]).iterrows():
        if row["best_repeats"] > 1 and row["seconds_ratio"] < 1:
            lines.append(f"{row['metric']}: eval.repeats {int(row['best_repeats'])} decides in "
                         f"{row['seconds_ratio']:.0%} of the seconds more seeds alone would take")
        else:
            lines.append(f"{row['metric']}: more seeds (evaluation repeats would not pay: seed_eval holds "
                         f"{row['eval_variance'] / (row['training_variance'] + row['eval_variance']):.0%} "
                         "of its variance)")
    return lines


def read_advice(folder: Path) -> pd.DataFrame | None:
    """The ``variance_advice.csv`` in ``folder`` (None: none, or not one this module wrote)."""
    path = folder / ADVICE_FILE
    try:
        advice = pd.read_csv(path) if path.is_file() else None
    except (pd.errors.ParserError, pd.errors.EmptyDataError, UnicodeDecodeError, ValueError):
        return None
    return advice if advice is not None and all(c in advice for c in ADVICE_COLUMNS) else None


ADVICE_INTRO = ("A cell's mean over n seeds with R evaluation repeats has variance (T + E/R)/n (T: the training "
                "sources' components, E: seed_eval's) and costs n(P + R·V) seconds (P, V: a trial's pretraining "
                "and evaluation seconds); the seconds to reach any precision are least at R = √(E·P / (T·V)). "
                "Below, each metric's best eval.repeats and the share of the seconds a decision (n_needed, a look "
                "of seeds by need) then takes, against one evaluation per seed; n_needed shrinks by (T + E/R)/(T + E).")


def section_html(table: pd.DataFrame, figure_png: bytes | None = None, advice: pd.DataFrame | None = None,
                 spend: pd.DataFrame | None = None) -> str:
    """The report's section on ``table`` (:func:`components`'s), with the figure, the
    seeds-or-repeats advice (:func:`repeats_advice`) and the open claims priced both ways
    (:func:`claims_spend`) when given."""
    import base64

    e = html.escape
    shown = table.copy()
    for column in ("variance", "ci_low", "ci_high", "sd"):
        shown[column] = shown[column].map(lambda v: "—" if pd.isna(v) else f"{v:.3g}")
    shown["share"] = shown["share"].map(lambda v: "—" if pd.isna(v) else f"{v:.0%}")
    levels = int(table["levels"].max()) if len(table) else 0
    parts = ["<h2>Where the noise comes from</h2>", f"<p>{e(INTRO.format(levels=levels))}</p>"]
    if figure_png is not None:
        data = base64.b64encode(figure_png).decode("ascii")
        parts.append(f'<figure id="variance"><img src="data:image/png;base64,{data}" alt="variance">'
                     "<figcaption><code>variance</code>: each metric's variance shared out by source.</figcaption>"
                     "</figure>")
    parts += ['<div class="scroll">' + shown.to_html(index=False, border=0, escape=True) + "</div>",
              "<p class='meta'>Every number: <a href='variance.csv'><code>variance.csv</code></a>.</p>"]
    if advice is not None and len(advice):
        seconds = advice.iloc[0]
        parts += [f"<h3>More seeds or more evaluation repeats?</h3><p>{e(ADVICE_INTRO)} Measured here: "
                  f"{seconds['pretrain_seconds']:.1f} s of pretraining and {seconds['eval_seconds']:.1f} s of "
                  "evaluation per trial.</p>",
                  "<ul>" + "".join(f"<li>{e(line)}</li>" for line in advice_text(advice)) + "</ul>",
                  "<p class='meta'>Every number: <a href='variance_advice.csv'><code>variance_advice.csv"
                  "</code></a>.</p>"]
    if spend is not None and len(spend):
        shown = spend.copy()
        for column in ("seconds_seeds", "seconds_repeats"):
            shown[column] = shown[column].map(lambda v: f"{v / 60:.0f} min")
        parts += ["<h3>What each open claim would cost</h3><p>Seeds per cell that would decide it at the "
                  "observed effect (<code>n_needed</code>) and a cell's seconds for them, against the seeds "
                  "and seconds at the metric's best <code>eval.repeats</code> (fewer seeds, each evaluated "
                  "R times).</p>",
                  '<div class="scroll">' + shown.to_html(index=False, border=0, escape=True) + "</div>",
                  f"<p class='meta'>Every number: <a href='{CLAIMS_SPEND_FILE}'><code>{CLAIMS_SPEND_FILE}"
                  "</code></a>.</p>"]
    return "\n".join(parts)
