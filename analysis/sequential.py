"""Seeds where they decide: a group-sequential plan for a study's declared claims.

``mae-study run STUDY --until-decided --max-seeds N`` looks at the claims after each batch of
seeds and adds seeds only to the cells an undecided claim reads. Looking repeatedly at growing
data and stopping when something is decided inflates the error rate of a fixed-n test; the plan
here keeps the study's family-wise error rate at α however many looks it takes:

* The plan is fixed before the first look and named on the parent run: α, the maximum seeds
  per cell ``N`` and the spending function
  ``α*(t) = α · ln(1 + (e − 1) · t)``, the Pocock-type function of Lan & DeMets (1983,
  *Discrete sequential boundaries for clinical trials*, Biometrika 70:659-663), where
  ``t = n/N`` is the information fraction at a look with ``n`` seeds in its fullest cell.
  It spends α early enough that a large effect is decided at the first look.
* Look ``j`` tests the hypotheses still open at the level ``α*(t_j) − α*(t_{j−1})`` (their
  difference tests and TOSTs as one step-down family, :func:`analysis.claims.decide_claims`); a hypothesis decided at a look keeps that
  verdict. By the union bound over looks the probability of any false decision is at most
  ``Σ_j (α*(t_j) − α*(t_{j−1})) = α*(t_last) ≤ α``: exact in its guarantee, conservative
  against the recursive boundaries of Jennison & Turnbull (2000, ch. 7), and it needs no
  numerical integration nor equal batches.

Seeds go where they can decide: an open hypothesis whose conditional power is below
:data:`analysis.claims.FUTILITY_POWER` (the chance that it is decided by the plan's ``N`` seeds,
given its pairs so far and a true difference of delta from then on, with the α the plan has
left: :func:`analysis.claims.conditional_power`), or a trend shown to go both ways, gets none at
that look (:func:`futile`), which only spends less α. The earlier rule, no seeds when
``n_needed`` at the observed effect exceeded ``N``, took a five-seed estimate at its word and
lost most of the power (0.26 against 0.80 at a true gain of one sd; docs/statistics.md).

A look is recorded as the seeds each cell held at it; a report replays the looks from the
trials alone (:func:`decide_sequential`), so its verdicts are the ones the run acted on.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

import pandas as pd

from .claims import (CLAIM_COLUMNS, EXACT_COLUMNS, EXTRA_COLUMNS, FUTILITY_POWER, MAX_SEEDS, cell_text,
                     claim_cells, count_hypotheses, decide_claims)
from .stats import ALPHA, FINISHED

SPENDING = "pocock-type (Lan & DeMets 1983): alpha*(t) = alpha * ln(1 + (e - 1) t)"
DECIDED = ("better", "worse", "equivalent")


def spent(t: float, alpha: float = ALPHA) -> float:
    """α spent by information fraction ``t`` (clipped to [0, 1])."""
    return alpha * math.log(1 + (math.e - 1) * min(1.0, max(0.0, t)))


@dataclass(frozen=True)
class SequentialPlan:
    """The sequential plan, fixed before the first look."""

    max_seeds: int
    alpha: float = ALPHA
    spending: str = SPENDING

    def as_dict(self) -> dict[str, Any]:
        return {"max_seeds": self.max_seeds, "alpha": self.alpha, "spending": self.spending}

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> SequentialPlan:
        return cls(int(data["max_seeds"]), float(data.get("alpha", ALPHA)), data.get("spending", SPENDING))

    def fraction(self, seeds: int) -> float:
        return min(1.0, seeds / self.max_seeds)


def _cell_keys(frame: pd.DataFrame, axes: list[str]) -> list[str]:
    """Each row's cell as ``key=value; ...`` (the claims' spelling)."""
    columns = [frame[a].tolist() for a in axes]
    return [cell_text(dict(zip(axes, values))) for values in zip(*columns)]


def seeds_per_cell(frame: pd.DataFrame, axes: list[str]) -> dict[str, list[int]]:
    """The FINISHED seeds of every cell (``key=value; ...``), sorted."""
    finished = frame[frame["status"] == FINISHED] if "status" in frame else frame
    out: dict[str, set[int]] = {}
    for key, seed in zip(_cell_keys(finished, axes), finished["seed"].tolist()):
        out.setdefault(key, set()).add(int(seed))
    return {cell: sorted(seeds) for cell, seeds in out.items()}


def at_look(frame: pd.DataFrame, axes: list[str], seeds: dict[str, list[int]]) -> pd.DataFrame:
    """The trials a look saw: each cell's rows whose seed the look lists for it."""
    allowed = {cell: set(values) for cell, values in seeds.items()}
    keep = [int(seed) in allowed.get(key, ()) for key, seed in zip(_cell_keys(frame, axes), frame["seed"].tolist())]
    return frame[keep]


def decide_look(frame: pd.DataFrame, claims: list[dict], plan: SequentialPlan, look_seeds: int, previous_seeds: int,
                open_hypotheses: set[str] | None, study: str = "", declared: str = "before the run",
                robustness: bool = True, plan_seeds: bool = True) -> pd.DataFrame:
    """One look: the open hypotheses tested at this look's share of α (see the module); the
    seeds they would need, and their conditional power, are planned at what is left to spend,
    over the open hypotheses (at the first look every hypothesis of the family, not each claim).
    ``plan_seeds=False`` leaves ``n_needed`` NaN (the futility rule does not read it; a simulation
    saves its root finding)."""
    share = spent(plan.fraction(look_seeds), plan.alpha) - spent(plan.fraction(previous_seeds), plan.alpha)
    left = plan.alpha - spent(plan.fraction(look_seeds), plan.alpha)
    m = len(open_hypotheses) if open_hypotheses is not None else count_hypotheses(frame, claims)
    table = decide_claims(frame, claims, study, declared, alpha=max(share, 1e-12), only=open_hypotheses,
                          planning_alpha=max(left, share) / max(1, m),
                          robustness=robustness, plan_seeds=plan_seeds, future=(plan.max_seeds, max(left, share)))
    return table


def decide_sequential(frame: pd.DataFrame, claims: list[dict], axes: list[str], plan: SequentialPlan,
                      looks: list[dict[str, list[int] | int]], study: str = "",
                      declared: str = "before the run", robustness: bool = True) -> pd.DataFrame:
    """Replay every recorded look (``looks``: the seeds each cell held, in order, as a list or
    as a count: its first seeds) and return a row per hypothesis: the row of the look that
    decided it, or of the last look for one still inconclusive; with columns ``look`` and
    ``alpha`` (that look's share of α)."""
    decided: dict[str, dict] = {}
    last: dict[str, dict] = {}
    previous = 0
    held = seeds_per_cell(frame, axes)
    for number, look in enumerate(looks, start=1):
        seeds = {cell: held.get(cell, [])[:n] if isinstance(n, int) else list(n) for cell, n in look.items()}
        fullest = max((len(s) for s in seeds.values()), default=0)
        still_open = None if number == 1 else {h for h in last if h not in decided}
        if still_open is not None and not still_open:
            break
        table = decide_look(at_look(frame, axes, seeds), claims, plan, fullest, previous, still_open, study, declared,
                            robustness)
        for row in table.to_dict("records"):
            row["look"] = number
            last[row["hypothesis"]] = row
            if row["verdict"] in DECIDED:
                decided.setdefault(row["hypothesis"], row)
        previous = fullest
    rows = [decided.get(h, row) for h, row in last.items()]
    return pd.DataFrame(rows, columns=CLAIM_COLUMNS + EXTRA_COLUMNS + ["look"] + EXACT_COLUMNS + ["conditional_power"])


def cells_to_extend(table: pd.DataFrame, claims: list[dict], max_seeds: int | None = None) -> list[str]:
    """The cells (``key=value; ...``) the still-inconclusive hypotheses read: a per-cell
    hypothesis its cell (and the reference, against which it is paired), a peak or a trend
    every cell of its claim. Two kinds of open hypothesis get none (:func:`futile`): a trend
    shown to go both ways, which no seed can decide, and one whose conditional power at delta
    is below :data:`~analysis.claims.FUTILITY_POWER`. Not testing a hypothesis again, or testing it on the seeds it
    has, spends less α than the plan allows, never more (non-binding futility, Jennison &
    Turnbull 2000, ch. 10), so the seeds go to the claims they can decide."""
    by_name = {claim["name"]: claim for claim in claims}
    cells: dict[str, None] = {}
    open_rows = table[(table["verdict"] == "inconclusive") & ~futile(table, max_seeds)]
    for row in open_rows.to_dict("records"):
        claim = by_name[row["claim"]]
        if claim["kind"] in ("vs_reference", "vs_baseline"):
            cells.setdefault(row["cell"])
            if claim["kind"] == "vs_reference":
                cells.setdefault(cell_text(claim["reference"]))
        else:
            for cell in claim_cells(claim):
                cells.setdefault(cell_text(cell))
    return list(cells)


def futile(table: pd.DataFrame, max_seeds: int | None = None) -> pd.Series:
    """Which rows of a look get no more seeds: those whose ``conditional_power`` (a look's column,
    0 for a trend shown to go both ways: :meth:`analysis.claims.Hypothesis.cannot_be_decided`)
    is below :data:`~analysis.claims.FUTILITY_POWER`. NaN, as with fewer than two pairs, is never
    futile. A table without the column (one not from :func:`decide_look`) falls back to its
    ``n_needed``: at the cap, or above ``max_seeds``."""
    if "conditional_power" in table:
        return table["conditional_power"].astype(float) < FUTILITY_POWER
    needed = table["n_needed"].astype(float)
    return (needed >= MAX_SEEDS) | ((needed > max_seeds) if max_seeds is not None else False)


def left_without_seeds(table: pd.DataFrame, max_seeds: int) -> dict[str, float]:
    """The open hypotheses a look gives no seeds (:func:`futile`), with the seeds per cell each
    would need (``MAX_SEEDS``: none would decide it), for the run to say which it left."""
    rows = table[(table["verdict"] == "inconclusive") & futile(table, max_seeds)]
    return {row["hypothesis"]: float(row["n_needed"]) for row in rows.to_dict("records")}


def next_seeds(table: pd.DataFrame, claims: list[dict], seeds: dict[str, list[int]], plan: SequentialPlan,
               batch: int) -> dict[str, list[int]]:
    """The seeds to add before the next look: ``batch`` more (numbered after the cell's last)
    for every cell an inconclusive hypothesis reads, up to the plan's maximum per cell; empty
    when every hypothesis is decided, futile (:func:`futile`) or every cell it needs is full."""
    added = {}
    for cell in cells_to_extend(table, claims, plan.max_seeds):
        have = seeds.get(cell, [])
        room = plan.max_seeds - len(have)
        if room > 0:
            start = max(have, default=-1) + 1
            added[cell] = list(range(start, start + min(batch, room)))
    return added
