"""A study's declared claims as files: ``claims.csv``, ``claims.md`` and the forest plot.

:func:`write_claims` decides the claims (:mod:`analysis.claims`) and writes them; the report
page puts the forest plot and the table first. :func:`compare_claims` sets two reports' claims
side by side (``mae-study report STUDY --compare OLD_REPORT_DIR``).
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path

import matplotlib.pyplot as plt
import numpy as np
import pandas as pd

from evaluation.metrics import METRICS

from . import figures
from .claims import (CLAIM_COLUMNS, EXACT_COLUMNS, EXTRA_COLUMNS, FUTILITY_POWER, SD_BOUND, decide_claims,
                     resolve_claims, seeds_text)
from .markdown import markdown_table
from .partial_share import share_sentences
from .registration import DECLARED, MEANINGS, declared_labels
from .sequential import SequentialPlan, decide_sequential
from .stats import ALPHA, POWER

# Colour-blind-safe (seaborn "colorblind"): green better, vermilion worse, blue equivalent, grey open.
VERDICT_COLOURS = {"better": "#009E73", "worse": "#D55E00", "equivalent": "#0072B2", "inconclusive": "#7f7f7f"}
VERDICT_MARKERS = {"better": "o", "worse": "s", "equivalent": "D", "inconclusive": "o"}
CLAIMS_FILE = "claims.csv"


@dataclass
class Claims:
    table: pd.DataFrame  # decide_claims' rows
    text: str  # what the verdicts mean, and which claims were not decided here
    skipped: list[str] = field(default_factory=list)  # claims this grid or these trials cannot decide


def _unmeasured(frame: pd.DataFrame, claims: list[dict]) -> tuple[list[dict], list[str]]:
    """The claims whose metric (and baseline) these trials logged, and a line for each other."""
    finished = frame[frame["status"] == "FINISHED"] if "status" in frame else frame
    kept, skipped = [], []
    for claim in claims:
        missing = [m for m in (claim["metric"], claim["baseline"]) if m is not None
                   and (m not in finished or finished[m].isna().all())]
        if missing:
            skipped.append(f"{claim['name']}: not decided, these trials did not log {missing[0]}")
        else:
            kept.append(claim)
    return kept, skipped


def decide(frame: pd.DataFrame, study: str, info: dict, raw_claims: Sequence[dict], note: str = "") -> Claims:
    """Decide ``raw_claims`` (as the study file spells them) on ``frame`` against the grid in
    ``info``, each labelled in column ``declared`` (``before``, ``after`` or ``unregistered``:
    :func:`analysis.registration.declared_labels` on ``info``'s parent tags); ``note`` says more
    about when they were written, in the paragraph above the table."""
    labels = declared_labels(raw_claims, info)
    claims, skipped = resolve_claims(list(raw_claims), info)
    claims, unmeasured = _unmeasured(frame, claims)
    sequential = info.get("sequential")
    max_seeds = None  # the sequential plan's, for a run with looks
    if sequential and sequential.get("looks"):
        axes = [a for a in info.get("axes", []) if a in frame]
        plan = SequentialPlan.from_dict(sequential["plan"])
        max_seeds = plan.max_seeds
        table = decide_sequential(frame, claims, axes, plan, sequential["looks"], study, note)
    else:
        pooled = ""
        if info.get("added_outside_plan"):
            added = ", ".join(map(str, info["added_outside_plan"]))
            pooled = (f"seeds {added} were added after a look outside a sequential plan and are pooled: the "
                      f"error rate of these verdicts is not controlled")
            note += f"{'; ' if note else ''}{pooled}"
        table = decide_claims(frame, claims, study, note)
        if pooled and len(table):  # said beside every verdict it affects (DESIGN), not only above the table
            table["pooled"] = pooled
    if len(table):  # decide_claims' column of words becomes each claim's label
        table["declared"] = table["claim"].map(labels)
    text = " ".join([claims_text(table, note, info.get("smoke", False), max_seeds), *share_sentences(frame)])
    return Claims(table, text, skipped + unmeasured)


def registration_text(table: pd.DataFrame, note: str = "") -> str:
    """When the claims were written: how many of each ``declared`` label, what each means, and
    ``note`` (more about when, such as claims written from the paper's rows after the trials)."""
    counts = table["declared"].value_counts()
    labels = "; ".join(f"{counts[label]} {label} ({MEANINGS[label]})" for label in DECLARED if label in counts)
    more = f" {note[0].upper()}{note[1:]}." if note else ""
    return f"Claims by when they were declared (column declared): {labels}.{more}"


def claims_text(table: pd.DataFrame, note: str = "", smoke: bool = False, max_seeds: int | None = None) -> str:
    """The paragraph above the claims table: when they were declared (``note``: more about it),
    how they were decided and what each word means (``max_seeds``: the sequential plan's maximum
    seeds per cell, for a run with looks)."""
    if not len(table):
        return "The study declares no claim that these trials can decide."
    m = int(table["family_size"].iloc[0])
    if "look" in table:  # a sequential run: each row is the look that decided it, or the last one
        family = (f"Decided at the looks of a sequential plan whose looks spend α = {ALPHA} in all: each row "
                  f"is the look that decided its hypothesis, or the last look; each difference is the cell "
                  f"minus the reference paired by seed (or, against a baseline, within each run); the paired "
                  f"t-tests and the TOSTs of the hypotheses still open at a look are adjusted together as one "
                  f"family and compared with that look's share of α (column alpha of claims.csv); each "
                  f"interval is the one that matches its row's decision (column ci_level).")
        if max_seeds is not None:
            family += (f" Seeds went only to hypotheses they could decide: one whose conditional power (the "
                       f"chance of a verdict by the plan's {max_seeds} seeds per cell, were its true difference "
                       f"delta from that look on) fell below {FUTILITY_POWER:.0%} got no more there "
                       f"(non-binding futility, which spends less α, never more) and was still tested at each "
                       f"look on the seeds it had.")
        threshold = "that look's share of α"
    else:
        family = (f"One family of {m} hypotheses for the whole study: each difference is the cell minus the "
                  f"reference paired by seed (or, against a baseline, within each run); the paired t-tests "
                  f"and the TOSTs of all {m} are adjusted together, step-down (at most one of a hypothesis' "
                  f"two nulls can be true, so the first step divides α = {ALPHA} by {m}), which keeps the "
                  f"chance of any false verdict in the study at most α; each interval is the one that "
                  f"matches its row's decision: at 1 − α/k for better or worse (it excludes 0), at 1 − 2α/k "
                  f"for equivalent (it lies inside ±delta), k the step's divisor (column ci_level; "
                  f"{1 - ALPHA / max(m, 1):.2%} at the first step).")
        threshold = f"{ALPHA}"
    text = (f"{registration_text(table, note)} {family} Verdicts: better or worse (adjusted p < "
            f"{threshold}, in the metric's better sense: higher accuracy, lower risk); equivalent (the paired "
            f"TOST within ±delta, adjusted, < {threshold}: any difference is smaller than the smallest "
            f"effect of interest); inconclusive otherwise, which is not evidence of no effect: n needed "
            f"is the seeds per cell that would decide it at the observed effect and an {SD_BOUND:.0%} upper bound "
            f"of the spread ({POWER:.0%} power). A peak is better only when it beats every other cell; a trend "
            f"only when every step moves the same way.")
    flagged = table[table["robust"] != "yes"]
    if len(flagged):
        text += (f" {len(flagged)} verdict(s) differ under a mixed model (cell fixed, seed random, t on the "
                 f"design's residual degrees of freedom): "
                 + "; ".join(f"{r.claim} ({r.cell}): {r.verdict}, model {r.model_verdict}"
                             for r in flagged.itertuples()) + ".")
    text += _exact_text(table)
    if smoke:
        text = "Smoke run: a few dozen updates, to exercise the code; no verdict here is a finding. " + text
    return text


def _exact_text(table: pd.DataFrame) -> str:
    """What the exact sign-flip test says of the decided verdicts: how many it confirms, and
    which rest on normality alone ("parametric": too few seeds for it to reach the level)."""
    if "exact_agrees" not in table:
        return ""
    decided = table[table["verdict"] != "inconclusive"]
    agrees = decided["exact_agrees"].fillna("").astype(str)
    if not len(decided) or (agrees == "").all():
        return ""
    parametric = decided[agrees == "parametric"]
    text = (f" Exact check: the sign-flip test (no normality assumed) reaches the same verdict at the same "
            f"level for {int((agrees == 'yes').sum())} of {len(decided)} decided hypotheses")
    if (agrees == "no").any():
        text += f", not for {int((agrees == 'no').sum())}"
    if len(parametric):
        least = int(parametric["n_exact_min"].max())
        text += (f"; {len(parametric)} verdict(s) are parametric: at n = "
                 f"{', '.join(sorted(set(map(str, parametric['n']))))} its smallest p (2/2ⁿ) cannot reach the "
                 f"level, so they rest on the t-test's normality ({least} seeds per cell would let it decide)")
    return text + "."


def display_table(table: pd.DataFrame) -> pd.DataFrame:
    """The claims as text, for claims.md and the page."""
    rows = []
    for r in table.itertuples():
        interval = "—" if not math.isfinite(r.ci_low) else f"[{r.ci_low:+.3g}, {r.ci_high:+.3g}]"
        rows.append({"claim": r.claim, "metric": r.metric, "cell": r.cell, "against": r.reference, "n": r.n,
                     "effect": "—" if not math.isfinite(r.effect) else f"{r.effect:+.3g}", "interval": interval,
                     "adjusted p": "—" if not math.isfinite(r.p_adjusted) else f"{r.p_adjusted:.2g}",
                     "±delta": f"{r.delta:g}", "verdict": r.verdict,
                     "n needed": "" if r.verdict != "inconclusive" else seeds_text(r.n_needed),
                     "n exact": _n_exact(r), "exact": _exact_word(r),
                     "direction": r.direction, "mixed model": r.model_verdict, "declared": r.declared,
                     **({"pooled": "outside a sequential plan"} if isinstance(getattr(r, "pooled", None), str)
                        else {})})
    return pd.DataFrame(rows)


def _n_exact(row) -> str:
    """The seeds per cell an exact sign-flip decision needs at the row's level (beside n needed)."""
    value = getattr(row, "n_exact_min", math.nan)
    return f"{int(value)}" if isinstance(value, (int, float)) and math.isfinite(value) else ""


def _exact_word(row) -> str:
    word = getattr(row, "exact_agrees", "")
    return word if isinstance(word, str) else ""


def forest_plot(table: pd.DataFrame, width: float | str = "full") -> plt.Figure:
    """Each hypothesis' effect and simultaneous interval, in units of its delta and oriented so
    that right is better (higher accuracy, lower risk), against the ±delta band; the verdict is
    the marker's colour and the word on the right, the claim's ``declared`` label is in brackets
    after its name."""
    inches = figures._width(width)
    rows = len(table)
    with figures._styled():
        fig, ax = plt.subplots(figsize=(inches, 0.9 + 0.28 * rows))
        ax.axvspan(-1, 1, color="#e8e8e8", zorder=0, lw=0)
        ax.axvline(0, color="#555", lw=0.8, zorder=1)
        labels = []
        for y, r in enumerate(table.itertuples()):
            sign = -1.0 if METRICS[r.metric].lower_is_better else 1.0
            scale = sign / r.delta
            low, high = sorted((r.ci_low * scale, r.ci_high * scale))
            colour = VERDICT_COLOURS[r.verdict]
            if math.isfinite(low):
                ax.plot([low, high], [y, y], color=colour, lw=1.4, zorder=2)
            ax.plot([r.effect * scale], [y], VERDICT_MARKERS[r.verdict], color=colour, ms=4.5, zorder=3,
                    mfc="white" if r.verdict == "inconclusive" else colour)
            # when the claim was declared (before, after, unregistered) beside its name
            claim = f"{r.claim} [{r.declared}]"
            labels.append(f"{claim}\n{r.cell} vs {r.reference}" if inches > 4 else claim)
            ax.annotate(r.verdict, xy=(1.0, y), xycoords=("axes fraction", "data"), xytext=(4, 0),
                        textcoords="offset points", va="center", fontsize=7, color=colour)
        ax.set_yticks(range(rows), labels, fontsize=7)
        ax.set_ylim(rows - 0.5, -0.5)
        limit = np.nanmax(np.abs(np.r_[table["ci_low"] / table["delta"], table["ci_high"] / table["delta"], 2.0]))
        ax.set_xlim(-min(limit, 60) * 1.05, min(limit, 60) * 1.05)
        ax.set_xlabel("effect toward better, in units of delta (grey band: ±delta)")
        fig.tight_layout()
    return fig


def write_claims(claims: Claims, study: str, out: Path, formats: Sequence[str] = ("png", "pdf"),
                 ) -> tuple[list[Path], bytes]:
    """``claims.csv``, ``claims.md`` and ``fig_claims`` (both widths) in ``out``; returns the
    paths and the full-width PNG (empty without rows)."""
    paths = [out / CLAIMS_FILE, out / "claims.md"]
    # the older columns first, then a sequential run's look, then the newer ones (appended: readers of
    # the older files find every column where it was)
    later = [c for c in EXACT_COLUMNS + ["conditional_power"] if c in claims.table]
    extra = [c for c in claims.table.columns if c not in CLAIM_COLUMNS + EXTRA_COLUMNS + later]
    claims.table.to_csv(paths[0], index=False, columns=CLAIM_COLUMNS + EXTRA_COLUMNS + extra + later)
    skipped = "".join(f"\n- {line}" for line in claims.skipped)
    table = display_table(claims.table)
    body = markdown_table(table) if len(table) else ""
    paths[1].write_text(f"# {study}: declared claims\n\n{claims.text}\n\n{body}\n"
                        + (f"\nNot decided here:{skipped}\n" if skipped else ""), encoding="utf-8")
    png = b""
    if len(claims.table):
        figure_paths, png = figures.save_sizes(lambda w: forest_plot(claims.table, w), out, "claims", formats)
        paths += figure_paths
    return paths, png


def compare_claims(new: pd.DataFrame, old: pd.DataFrame) -> list[str]:
    """A line for every hypothesis (claim and cell) whose verdict differs between two
    ``claims.csv`` tables, with both n, effects and intervals; new and dropped ones too."""
    key = ["claim", "cell"]
    merged = new.merge(old, on=key, how="outer", suffixes=("", "_old"), indicator="presence")
    lines = []
    for r in merged.to_dict("records"):
        where = f"{r['claim']} ({r['cell']})"
        if r["presence"] == "left_only":
            lines.append(f"{where}: new, {r['verdict']} at n={int(r['n'])}")
        elif r["presence"] == "right_only":
            lines.append(f"{where}: only in the old report, {r['verdict_old']} at n={int(r['n_old'])}")
        elif r["verdict"] != r["verdict_old"]:
            lines.append(f"{where}: {r['verdict_old']} -> {r['verdict']}; n {int(r['n_old'])} -> {int(r['n'])}; "
                         f"effect {r['effect_old']:+.4g} [{r['ci_low_old']:+.4g}, {r['ci_high_old']:+.4g}] -> "
                         f"{r['effect']:+.4g} [{r['ci_low']:+.4g}, {r['ci_high']:+.4g}]")
    return lines
