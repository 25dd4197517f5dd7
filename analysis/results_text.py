"""The results sections of README.md and docs/results/README.md, written from the committed reports.

Every number between ``<!-- results:begin -->`` and ``<!-- results:end -->`` in those two files
comes from a report folder's ``claims.csv`` and ``trials.csv``; nothing there is typed by hand,
so it cannot drift from the data. ``python -m analysis.results_text`` rewrites both sections;
``--check`` exits 1 when either differs from what it would write (the test suite runs the check).
"""

from __future__ import annotations

import argparse
import json
import math
import sys
from pathlib import Path

import pandas as pd

from .claims import seeds_text
from .markdown import markdown_table
from .registration import DECLARED

ROOT = Path(__file__).resolve().parent.parent
RESULTS = ROOT / "docs" / "results"
# claims.csv's declared labels in a phrase (docs/studies.md says it in full)
DECLARED_TEXT = ("before: in the claims block hashed when the study started, its study file committed; after: "
                 "written after the start or before registration was recorded, exploratory; unregistered: the "
                 "study file was not committed")
BEGIN, END = "<!-- results:begin -->", "<!-- results:end -->"
# The order the studies are read in (the MAE paper's figures and tables, then the lesson).
ORDER = ("mask_ratio", "objectives", "mask_token", "decoder_depth", "decoder_width", "target", "mask_sampling",
         "corruption", "schedule", "partial_finetune", "lesson", "lesson_large_decoder")
# Per-cell columns shown when the trials logged them: (metric, heading, format).
CELL_COLUMNS = (("test_mae_risk", "masked risk", ".4f"), ("test_rec_risk", "reconstruction risk", ".4f"),
                ("test_den_risk", "denoising risk", ".4f"), ("probe_linear_acc", "linear probe", ".3f"),
                ("probe_fewshot_acc", "few-shot", ".3f"), ("probe_knn_acc", "kNN", ".3f"),
                ("finetune_acc", "fine-tune", ".3f"), ("partial_finetune_acc", "partial fine-tune", ".3f"))


def report_folders(results: Path = RESULTS) -> list[Path]:
    """The committed reports with a ``claims.csv``, in :data:`ORDER` (others after, by name)."""
    found = {p.parent.name: p.parent for p in results.glob("*/claims.csv")}
    return [found[n] for n in ORDER if n in found] + [found[n] for n in sorted(found) if n not in ORDER]


def _paper(folder: Path) -> str:
    info = folder / "study.json"
    return json.loads(info.read_text(encoding="utf-8")).get("paper") or "" if info.is_file() else ""


def _effect(row) -> str:
    if not math.isfinite(row.effect):
        return "—"
    return f"{row.effect:+.3f} [{row.ci_low:+.3f}, {row.ci_high:+.3f}]"


def _needed(row) -> str:
    return seeds_text(row.n_needed) if row.verdict == "inconclusive" else ""


def _p_text(row) -> str:
    """The adjusted p, and for a row of a sequential run the look it comes from and that look's
    share of α, which it is compared with (not 0.05)."""
    if not math.isfinite(row.p_adjusted):
        return "—"
    look = getattr(row, "look", math.nan)  # NaN: a fixed-n row beside sequential ones
    return f"{row.p_adjusted:.2g}" + (f" (look {int(look)}: α {row.alpha:.2g})" if pd.notna(look) else "")


def claims_table(claims: pd.DataFrame, links: str | None = None) -> pd.DataFrame:
    """One row per hypothesis, as text: claim, comparison, n, effect [interval], verdict, n
    needed; with ``links`` (a path prefix) a first column linking each row's report folder
    (the ``report`` column of ``claims``)."""
    rows = []
    for r in claims.itertuples():
        row = {"report": f"[{r.report}]({links}{r.report}/)"} if links is not None else {}
        row.update({"claim": r.claim, "cell vs": f"{r.cell} vs {r.reference}", "n": int(r.n),
                    "effect [simultaneous interval]": _effect(r), "±delta": f"{r.delta:g}",
                    "adjusted p": _p_text(r),
                    "verdict": f"**{r.verdict}**", "seeds needed": _needed(r), "declared": r.declared})
        rows.append(row)
    return pd.DataFrame(rows)


def _cell_table(trials: pd.DataFrame) -> pd.DataFrame:
    axes = list(trials.columns[: list(trials.columns).index("seed")])
    finished = trials[trials["status"] == "FINISHED"]
    columns = [(m, h, f) for m, h, f in CELL_COLUMNS if m in finished and finished[m].notna().any()]
    rows = []
    for key, group in finished.groupby(axes, sort=False, dropna=False):
        key = key if isinstance(key, tuple) else (key,)
        row = {", ".join(axes): ", ".join(map(str, key)), "n": len(group)}
        for metric, heading, fmt in columns:
            values = group[metric].dropna()
            row[heading] = f"{values.mean():{fmt}} ± {values.std():{fmt}}" if len(values) > 1 else "—"
        rows.append(row)
    return pd.DataFrame(rows)


def _counts(claims: pd.DataFrame) -> str:
    counts = claims["verdict"].value_counts()
    return ", ".join(f"{counts[v]} {v}" for v in ("better", "worse", "equivalent", "inconclusive") if v in counts)


def _declared(claims: pd.DataFrame) -> str:
    """How many claims carry each ``declared`` label (before, after, unregistered)."""
    counts = claims["declared"].value_counts()
    return ", ".join(f"{counts[label]} {label}" for label in DECLARED if label in counts)


def overview(folders: list[Path], links: str) -> str:
    """Every claim of every report in one table, with the counts of each verdict; report
    folders linked as ``links + NAME/``."""
    tables = [pd.read_csv(f / "claims.csv").assign(report=f.name) for f in folders]
    everything = pd.concat(tables, ignore_index=True) if tables else pd.DataFrame()
    if not len(everything):
        return "No committed report has declared claims yet.\n"
    inconclusive = everything[everything["verdict"] == "inconclusive"]
    text = (f"{len(everything)} hypotheses in {len(folders)} reports: {_counts(everything)}. "
            f"Each report is one family (Holm); \"inconclusive\" is not \"no effect\": the last column "
            f"gives the seeds per cell that would decide it at the observed effect and spread"
            + (f" (median {int(inconclusive['n_needed'].median())})." if len(inconclusive) else ".")
            + f" Declared: {_declared(everything)} ({DECLARED_TEXT}).\n\n")
    return text + markdown_table(claims_table(everything, links))


def study_section(folder: Path) -> str:
    claims = pd.read_csv(folder / "claims.csv")
    trials = pd.read_csv(folder / "trials.csv")
    paper = _paper(folder)
    title = f"### {folder.name}" + (f" ({paper})" if paper else "")
    finished = int((trials["status"] == "FINISHED").sum())
    seeds = sorted(trials["seed"].unique())
    dataset = ", ".join(sorted(map(str, trials["dataset"].unique()))) if "dataset" in trials else "?"
    steps = ", ".join(map(str, sorted(trials["steps"].unique()))) if "steps" in trials else "?"
    head = (f"{title}\n\n[report]({folder.name}/) · {len(trials)} trials ({finished} finished), "
            f"seeds {seeds[0]}-{seeds[-1]}, {dataset}, {steps} updates. Claims declared: "
            f"{_declared(claims)}; verdicts: {_counts(claims) or 'none'}.\n\n")
    return (head + markdown_table(_cell_table(trials)) + "\nMean ± sd over seeds.\n\n"
            + markdown_table(claims_table(claims)))


def results_readme(folders: list[Path]) -> str:
    """docs/results/README.md's generated section: the overview, then a section per study."""
    parts = ["## Every declared claim\n", overview(folders, ""), "## By study\n"]
    parts += [study_section(f) for f in folders]
    return "\n".join(parts)


def main_readme(folders: list[Path]) -> str:
    """README.md's generated section: the verdicts counted per report (every claim is in
    docs/results/README.md), so it stays short however many claims the studies declare."""
    rows = []
    everything = []
    for folder in folders:
        claims = pd.read_csv(folder / "claims.csv")
        everything.append(claims)
        counts = claims["verdict"].value_counts()
        open_ = claims[claims["verdict"] == "inconclusive"]
        rows.append({"report": f"[{folder.name}](docs/results/{folder.name}/)", "paper": _paper(folder),
                     "hypotheses": len(claims),
                     **{v: int(counts.get(v, 0)) for v in ("better", "worse", "equivalent", "inconclusive")},
                     "seeds needed (median of the inconclusive)":
                         seeds_text(open_["n_needed"].median()) if len(open_) else "",
                     "declared": _declared(claims)})
    total = pd.concat(everything, ignore_index=True) if everything else pd.DataFrame(columns=["verdict", "declared"])
    head = (f"{len(total)} hypotheses in {len(folders)} reports: {_counts(total) or 'none'}. Each report is one "
            f"family (Holm); \"inconclusive\" is not \"no effect\". Declared: {_declared(total)} "
            f"({DECLARED_TEXT}). Every claim, its effect, interval and "
            f"the seeds it needs: [docs/results](docs/results/README.md).\n\n")
    return head + markdown_table(pd.DataFrame(rows))


def splice(text: str, section: str, path: Path) -> str:
    """``text`` with everything between the markers replaced by ``section``."""
    if BEGIN not in text or END not in text:
        raise ValueError(f"{path} has no {BEGIN} … {END} section")
    head, rest = text.split(BEGIN, 1)
    _, tail = rest.split(END, 1)
    return f"{head}{BEGIN}\n<!-- written by `python -m analysis.results_text` from docs/results/*/claims.csv and " \
           f"trials.csv; edits here are overwritten -->\n\n{section.rstrip()}\n\n{END}{tail}"


def targets(root: Path = ROOT) -> dict[Path, str]:
    """Each file and the text it should hold."""
    folders = report_folders(root / "docs" / "results")
    wanted = {}
    for path, section in ((root / "README.md", main_readme(folders)),
                          (root / "docs" / "results" / "README.md", results_readme(folders))):
        wanted[path] = splice(path.read_text(encoding="utf-8"), section, path)
    return wanted


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--check", action="store_true", help="exit 1 when a file differs from what would be written")
    args = parser.parse_args(argv)
    stale = []
    for path, text in targets().items():
        if path.read_text(encoding="utf-8") != text:
            stale.append(path)
            if not args.check:
                path.write_text(text, encoding="utf-8")
    if args.check and stale:
        print(f"stale results sections: {', '.join(map(str, stale))}; run python -m analysis.results_text",
              file=sys.stderr)
        return 1
    for path in stale:
        print(f"wrote {path}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
