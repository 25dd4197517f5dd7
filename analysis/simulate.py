"""False-verdict rates and power of the claims' procedure, simulated with the project's own code.

    python -m analysis.simulate [--reps R] [--seed S] [--markdown]

Each simulated study is one ``vs_reference`` claim over five cells against a reference (five
hypotheses, one family), delta = 0.01, paired differences of sd 0.02 (a seed effect shared by
every cell plus each trial's own noise), the setting the statistician of #29 simulated. Its
trials are decided exactly as a report decides them: :func:`analysis.claims.decide_claims` for a
fixed number of seeds, and for a sequential run the run's own loop: :func:`analysis.sequential.
decide_look` at 5, 10, ... seeds, a verdict kept once reached, :func:`analysis.sequential.
next_seeds` choosing where the next batch of five goes (with futility, or with it off: every
open hypothesis gets seeds up to the plan's maximum).

Scenarios (true gains, in the metric's better direction, of the five cells):

* ``null``: all 0. A false verdict is any better or worse.
* ``mixed``: 0, 0, delta, delta, 2·delta: a better or worse on a null cell, an equivalent (or
  worse) on the others.
* ``gain G sd`` for G in 0.5, 0.75, 1, 1.5: all five at G·0.02; power is the share of
  hypotheses called better. At 0.5 sd the gain is exactly delta: a false verdict is any
  equivalent (or worse), which the TOST must keep at α.

Columns: the study-wide false-verdict rate (any hypothesis given a verdict its true gain
contradicts: better with gain ≤ 0, worse with gain ≥ 0, equivalent with |gain| ≥ delta) and its
Monte Carlo standard error, the power and its error, and the trials a study ran (fixed grid:
6 cells × n). Every rate is over ``--reps`` studies per row, each from its own generator.
"""

from __future__ import annotations

import argparse
import math
import sys
import time
from dataclasses import dataclass

import numpy as np
import pandas as pd
from scipy import stats as sps

from .claims import check_claims, decide_claims
from .sequential import DECIDED, SequentialPlan, decide_look, next_seeds
from .stats import ALPHA

DELTA = 0.01
SD = 0.02  # sd of a paired difference
CELLS = (0.1, 0.2, 0.3, 0.4, 0.5)  # the five compared cells; the reference is 0.0
REFERENCE = 0.0
START, BATCH = 5, 5
SCENARIOS = {"null": (0.0,) * 5, "mixed": (0.0, 0.0, DELTA, DELTA, 2 * DELTA),
             "gain 0.5 sd (= delta)": (0.5 * SD,) * 5, **{f"gain {g:g} sd": (g * SD,) * 5 for g in (0.75, 1.0, 1.5)}}


@dataclass(frozen=True)
class Design:
    name: str
    max_seeds: int
    sequential: bool
    futility: bool = True


DESIGNS = (Design("fixed n=10", 10, False), Design("fixed n=20", 20, False),
           Design("sequential N=10", 10, True), Design("sequential N=10, no futility", 10, True, False),
           Design("sequential N=20", 20, True), Design("sequential N=20, no futility", 20, True, False))


def study_claims() -> list[dict]:
    axes = {"mask_ratio": [REFERENCE, *CELLS]}
    return list(check_claims([{"name": "c", "metric": "probe_linear_acc", "kind": "vs_reference", "delta": DELTA,
                               "direction": "two-sided"}], axes, (), {"mask_ratio": REFERENCE}))


def draw(gains: tuple[float, ...], max_seeds: int, rng: np.random.Generator) -> pd.DataFrame:
    """Every trial the study could run: a row per (cell, seed) up to ``max_seeds``; value = 0.9 +
    the seed's shared effect + the cell's gain + noise of sd SD/√2 (so a difference has sd SD)."""
    shared = rng.normal(0, 0.02, max_seeds)
    ratios = np.repeat([REFERENCE, *CELLS], max_seeds)
    seeds = np.tile(np.arange(max_seeds), len(CELLS) + 1)
    means = np.repeat([0.0, *gains], max_seeds)
    values = 0.9 + shared[seeds] + means + rng.normal(0, SD / math.sqrt(2), len(seeds))
    return pd.DataFrame({"status": "FINISHED", "seed": seeds, "mask_ratio": ratios, "probe_linear_acc": values})


def _key(ratio: float) -> str:
    return f"mask_ratio={ratio}"


def run_fixed(trials: pd.DataFrame, claims: list[dict], n: int) -> tuple[pd.DataFrame, int]:
    frame = trials[trials["seed"] < n]
    return decide_claims(frame, claims, robustness=False), len(frame)


def run_sequential(trials: pd.DataFrame, claims: list[dict], design: Design) -> tuple[pd.DataFrame, int]:
    """The run's loop (studies.seeds_by_need) on pre-drawn trials: look, keep what is decided, add a batch
    where :func:`next_seeds` says. Returns the final verdicts and the trials it ran."""
    plan = SequentialPlan(max_seeds=design.max_seeds)
    held = {_key(r): list(range(START)) for r in (REFERENCE, *CELLS)}
    decided: dict[str, dict] = {}
    last: dict[str, dict] = {}
    previous, open_ = 0, None
    cell_of = trials["mask_ratio"].map(_key)
    while True:
        frame = trials[trials["seed"] < cell_of.map(lambda c: len(held[c]))]  # next_seeds numbers on from the last
        fullest = max(len(s) for s in held.values())
        table = decide_look(frame, claims, plan, fullest, previous, open_, robustness=False, plan_seeds=False)
        for row in table.to_dict("records"):
            last[row["hypothesis"]] = row
            if row["verdict"] in DECIDED:
                decided.setdefault(row["hypothesis"], row)
        previous = fullest
        open_ = {h for h in last if h not in decided}
        planned = table if design.futility else table.assign(conditional_power=np.nan)  # NaN: never futile
        added = next_seeds(planned[planned["hypothesis"].isin(open_)], claims, held, plan, BATCH) if open_ else {}
        if not added:
            rows = [decided.get(h, row) for h, row in last.items()]
            return pd.DataFrame(rows), sum(len(s) for s in held.values())
        for cell, seeds in added.items():
            held[cell] = held[cell] + seeds


def false_verdicts(table: pd.DataFrame, gains: dict[str, float]) -> int:
    """How many rows carry a verdict the true gain contradicts."""
    wrong = 0
    for row in table.to_dict("records"):
        gain = gains[row["cell"]]
        wrong += ((row["verdict"] == "better" and gain <= 0) or (row["verdict"] == "worse" and gain >= 0)
                  or (row["verdict"] == "equivalent" and abs(gain) >= DELTA - 1e-12))
    return wrong


def simulate_row(scenario: str, design: Design, reps: int, seed: int = 0) -> dict:
    """One row of the table: ``reps`` studies of ``scenario`` under ``design``."""
    gains = SCENARIOS[scenario]
    by_cell = {_key(r): g for r, g in zip(CELLS, gains)}
    claims = study_claims()
    any_false, better, positive, trials = 0, 0, 0, 0
    for rep in range(reps):
        rng = np.random.default_rng([seed, rep, list(SCENARIOS).index(scenario)])
        drawn = draw(gains, design.max_seeds, rng)
        table, ran = (run_sequential(drawn, claims, design) if design.sequential
                      else run_fixed(drawn, claims, design.max_seeds))
        any_false += false_verdicts(table, by_cell) > 0
        lifted = table[table["cell"].map(by_cell) > 0]
        better += int((lifted["verdict"] == "better").sum())
        positive += len(lifted)
        trials += ran
    rate = any_false / reps
    power = better / positive if positive else math.nan
    return {"scenario": scenario, "design": design.name, "reps": reps, "false_verdict_rate": rate,
            "false_verdict_se": math.sqrt(rate * (1 - rate) / reps),
            "false_verdict_upper99": upper_bound(any_false, reps),
            "power": power, "power_se": math.sqrt(power * (1 - power) / positive) if positive else math.nan,
            "mean_trials": trials / reps, "mean_seeds_per_cell": trials / reps / (len(CELLS) + 1)}


def upper_bound(count: int, reps: int, confidence: float = 0.99) -> float:
    """One-sided Clopper-Pearson upper bound of a binomial rate (scipy)."""
    return float(sps.binomtest(count, reps).proportion_ci(confidence_level=2 * confidence - 1).high)


def simulate(reps: int, seed: int = 0, scenarios=None, designs=DESIGNS) -> pd.DataFrame:
    return pd.DataFrame([simulate_row(s, d, reps, seed) for s in (scenarios or SCENARIOS) for d in designs])


def markdown(table: pd.DataFrame) -> str:
    """The table as docs/statistics.md prints it: rates ± Monte Carlo standard errors."""
    from .markdown import markdown_table

    rows = []
    for r in table.to_dict("records"):
        power = "—" if not math.isfinite(r["power"]) else f"{r['power']:.3f} ± {r['power_se']:.3f}"
        rows.append({"scenario": r["scenario"], "design": r["design"],
                     "false verdicts (study)": f"{r['false_verdict_rate']:.3f} ± {r['false_verdict_se']:.3f}",
                     "99% upper": f"{r['false_verdict_upper99']:.3f}", "power (per hypothesis)": power,
                     "seeds per cell": f"{r['mean_seeds_per_cell']:.1f}"})
    return markdown_table(pd.DataFrame(rows))


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--reps", type=int, default=400, help="simulated studies per row (default 400)")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--markdown", action="store_true", help="print the table as markdown (docs/statistics.md)")
    args = parser.parse_args(argv)
    if args.reps < 1:
        print(f"--reps {args.reps}: a positive number of simulated studies", file=sys.stderr)
        return 2
    start, cpu = time.perf_counter(), time.process_time()
    table = simulate(args.reps, args.seed)
    print(markdown(table) if args.markdown else table.to_string(index=False))
    print(f"\n{args.reps} studies per row, alpha {ALPHA}, {time.perf_counter() - start:.0f} s wall, "
          f"{time.process_time() - cpu:.0f} s CPU", file=sys.stderr)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
