"""The results sections of README.md and docs/results/README.md, written from the committed reports.

Every number between ``<!-- results:begin -->`` and ``<!-- results:end -->`` in those two files,
and between ``<!-- demo:begin -->`` and ``<!-- demo:end -->`` in README.md (what ``make demo``
found: the :data:`DEMO` study's report), comes from a report folder's ``claims.csv`` and
``trials.csv``; nothing there is typed by hand, so it cannot drift from the data. ``python -m analysis.results_text`` rewrites both sections;
``--check`` exits 1 when either differs from what it would write (the test suite runs the check).
"""

from __future__ import annotations

import argparse
import json
import math
import sys
from pathlib import Path

import pandas as pd

from .claims import MAX_SEEDS, seeds_text
from .markdown import markdown_table
from .registration import DECLARED
from .stats import ALPHA

ROOT = Path(__file__).resolve().parent.parent
RESULTS = ROOT / "docs" / "results"
# claims.csv's declared labels in a phrase (docs/studies.md says it in full)
DECLARED_TEXT = ("before: in the claims block hashed when the study started, its study file committed; after: "
                 "written after the start or before registration was recorded, exploratory; unregistered: the "
                 "study file was not committed")
BEGIN, END = "<!-- results:begin -->", "<!-- results:end -->"
DEMO_BEGIN, DEMO_END = "<!-- demo:begin -->", "<!-- demo:end -->"
DEMO = "fashion_mask_ratio"  # the study `make demo` runs (Makefile) where Fashion-MNIST is available
# The order the studies are read in (the demo, the MAE paper's figures and tables, then the lesson).
ORDER = (DEMO, "fashion_objectives", "fashion_mask_token", "fashion_decoder_depth", "fashion_decoder_width",
         "fashion_target", "fashion_mask_sampling", "mask_ratio", "objectives", "mask_token", "decoder_depth", "decoder_width", "target", "mask_sampling",
         "corruption", "schedule", "partial_finetune", "lesson", "lesson_large_decoder")


# A report's testbed, from its trials' dataset (issue 34): Fashion-MNIST's 10,000 test images can
# decide a one-point claim; the small testbed (8x8 digits, 360 test images; photo crops for the
# target study) mostly cannot, so README.md lists its reports' verdicts in one line.
TESTBEDS = {"fashion_mnist": "Fashion-MNIST"}
SMALL_TESTBED = "the digits testbed"


# What a committed report's trials lack, from fixes that came after them (issue 34): said beside
# the report, since its numbers stay as they ran.
LACKS = {
    "decoder_depth": "its trials predate a fix: a random-init encoder was drawn per cell rather than once per "
                     "seed, so its random_probe_* baselines differ between the cells of one seed",
    "decoder_width": "its trials predate a fix: a random-init encoder was drawn per cell rather than once per "
                     "seed, so its random_probe_* baselines differ between the cells of one seed",
    "mask_ratio": "its trials predate the validated-length fine-tuning of the pretrained encoder "
                  "(finetune_best_acc): fine-tuning there is at the fixed length only",
}


def testbed_of(folder: Path) -> str:
    """"Fashion-MNIST", :data:`SMALL_TESTBED`, or "" when the folder has no ``trials.csv``."""
    path = folder / "trials.csv"
    if not path.is_file():
        return ""
    datasets = set(pd.read_csv(path, usecols=lambda c: c == "dataset").get("dataset", pd.Series()).dropna())
    names = {TESTBEDS.get(str(d), SMALL_TESTBED) for d in datasets}
    return names.pop() if len(names) == 1 else SMALL_TESTBED


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
    needed (and, where claims.csv has them, the seeds an exact decision needs); with ``links`` (a path prefix) a first column linking each row's report folder
    (the ``report`` column of ``claims``)."""
    rows = []
    exact = "n_exact_min" in claims and claims["n_exact_min"].notna().any()  # reports decided since #29
    for r in claims.itertuples():
        row = {"report": f"[{r.report}]({links}{r.report}/)"} if links is not None else {}
        row.update({"claim": r.claim, "cell vs": f"{r.cell} vs {r.reference}", "n": int(r.n),
                    "effect [interval]": _effect(r), "±delta": f"{r.delta:g}",
                    "adjusted p": _p_text(r),
                    "verdict": f"**{r.verdict}**", "seeds needed": _needed(r)})
        if exact:
            row["seeds for an exact decision"] = _exact(r)
        row["declared"] = r.declared
        rows.append(row)
    return pd.DataFrame(rows)


def _exact(row) -> str:
    """The seeds per cell the exact sign-flip test needs at the row's level, and for a decided
    row whether it agrees ("parametric": it cannot at this n); empty for reports before #29."""
    value = getattr(row, "n_exact_min", math.nan)
    if not isinstance(value, (int, float)) or not math.isfinite(value):
        return ""
    agrees = getattr(row, "exact_agrees", "")
    return f"{int(value)}" + (f" ({agrees})" if isinstance(agrees, str) and agrees else "")


def _counts(claims: pd.DataFrame) -> str:
    """The verdicts counted, the inconclusive ones with how many are capped (n needed ≥ MAX_SEEDS)."""
    counts = claims["verdict"].value_counts()
    words = [f"{counts[v]} {v}" for v in ("better", "worse", "equivalent", "inconclusive") if v in counts]
    capped = _capped(claims)
    if capped and words:
        words[-1] += f" ({capped} of them capped: n needed ≥ {MAX_SEEDS})"
    return ", ".join(words)


def _capped(claims: pd.DataFrame) -> int:
    """Inconclusive rows whose n needed is at the cap (written "≥ MAX_SEEDS"): no count of seeds."""
    return int(((claims["verdict"] == "inconclusive") & (claims["n_needed"] >= MAX_SEEDS)).sum())


def _median_needed(claims: pd.DataFrame) -> str:
    """The median n needed of the inconclusive rows below the cap (capped values have no number
    to take a median of), saying how many it leaves out; empty without inconclusive rows."""
    open_ = claims[claims["verdict"] == "inconclusive"]
    below = open_[open_["n_needed"] < MAX_SEEDS]["n_needed"].dropna()
    if not len(open_):
        return ""
    if not len(below):
        return f"all {len(open_)} capped"
    text = seeds_text(below.median())
    return text + (f" ({len(open_) - len(below)} capped, left out)" if len(below) < len(open_) else "")


def study_of(folder: Path) -> str:
    """The study a report ran (claims.csv's study column; the folder's name without one)."""
    claims = pd.read_csv(folder / "claims.csv")
    names = claims["study"].dropna().astype(str) if "study" in claims else pd.Series(dtype=str)
    return names.iloc[0] if len(names) else folder.name


def counted_folders(folders: list[Path]) -> tuple[list[Path], dict[str, str]]:
    """The reports the totals count, one per distinct study, and the variants left out of them
    (folder name -> the study it is a variant of). A study's own report is the folder named
    after it (the fixed design as the study file declares it); another report of the same study
    (run until decided, or with overrides such as lesson_large_decoder) is a variant: shown on
    its own row, not counted again, since it decides the same study's claims once more."""
    by_study: dict[str, list[Path]] = {}
    for folder in folders:
        by_study.setdefault(study_of(folder), []).append(folder)
    counted, variants = [], {}
    for study, group in by_study.items():
        own = next((f for f in group if f.name == study), group[0])
        counted.append(own)
        variants.update({f.name: study for f in group if f is not own})
    return [f for f in folders if f in counted], variants


COUNTING = ("Counted once per study: a study's own report (the folder named after it) counts; "
            "another report of the same study (run until decided, or with overrides) is a variant, "
            "shown but not counted again.")


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
    counted, variants = counted_folders(folders)
    total = everything[everything["report"].isin([f.name for f in counted])]
    median = _median_needed(total)
    by_testbed = {}
    for folder in counted:
        by_testbed.setdefault(testbed_of(folder), []).append(folder.name)
    per_testbed = " ".join(
        f"On {testbed or 'an unknown testbed'}: {len(names)} studies, "
        f"{_counts(total[total['report'].isin(names)]) or 'no claims'}." for testbed, names in by_testbed.items())
    text = (f"{len(total)} hypotheses in {len(counted)} studies: {_counts(total)}. {per_testbed} {COUNTING} "
            f"Variants here: "
            f"{', '.join(f'{v} (of {s})' for v, s in variants.items()) or 'none'}. Each report is one family at "
            f"α = {ALPHA}; \"inconclusive\" is not \"no effect\": the last column gives the seeds per cell that "
            f"would decide it at the observed effect and spread"
            + (f" (median over the counted studies {median})." if median else ".")
            + f" Declared: {_declared(total)} ({DECLARED_TEXT}).\n\n")
    return text + markdown_table(claims_table(everything, links))


def study_section(folder: Path) -> str:
    claims = pd.read_csv(folder / "claims.csv")
    trials = pd.read_csv(folder / "trials.csv")
    paper = _paper(folder)
    title = f"### {folder.name}" + (f" ({paper})" if paper else "")
    study = study_of(folder)
    if study != folder.name:
        title += f"\n\nA variant of {study} (another run of the same study's claims), not counted in the totals."
    finished = int((trials["status"] == "FINISHED").sum())
    seeds = sorted(trials["seed"].unique())
    dataset = ", ".join(sorted(map(str, trials["dataset"].unique()))) if "dataset" in trials else "?"
    steps = ", ".join(map(str, sorted(trials["steps"].unique()))) if "steps" in trials else "?"
    testbed = testbed_of(folder)
    lacks = f" What it lacks: {LACKS[folder.name]}." if folder.name in LACKS else ""
    head = (f"{title}\n\n[report]({folder.name}/) · {testbed or 'testbed unknown'}: {len(trials)} trials "
            f"({finished} finished), seeds {seeds[0]}-{seeds[-1]}, {dataset}, {steps} updates. Claims declared: "
            f"{_declared(claims)}; verdicts: {_counts(claims) or 'none'}.{lacks}\n\n")
    return head + markdown_table(claims_table(claims))


def results_readme(folders: list[Path]) -> str:
    """docs/results/README.md's generated section: the overview, then a section per study."""
    parts = ["## Every declared claim\n", overview(folders, ""), "## By study\n"]
    parts += [study_section(f) for f in folders]
    return "\n".join(parts)


def main_readme(folders: list[Path]) -> str:
    """README.md's generated section: the verdicts counted per report (every claim is in
    docs/results/README.md), so it stays short however many claims the studies declare."""
    rows = []
    counted, variants = counted_folders(folders)
    testbeds: dict[str, list[pd.DataFrame]] = {}
    variant_lines: list[str] = []
    for folder in folders:
        claims = pd.read_csv(folder / "claims.csv")
        testbed = testbed_of(folder)
        if folder in counted:
            testbeds.setdefault(testbed, []).append(claims)
        if testbed == SMALL_TESTBED:
            continue  # one line below the table; every row is in docs/results
        name = f"[{folder.name}](docs/results/{folder.name}/)"
        if folder.name in variants:  # one line below the table, so the README stays short
            variant_lines.append(f"{name} (of {variants[folder.name]}: {_counts(claims) or 'none'})")
            continue
        counts = claims["verdict"].value_counts()
        rows.append({"report": name,
                     "paper": _paper(folder), "hypotheses": len(claims),
                     **{v: int(counts.get(v, 0)) for v in ("better", "worse", "equivalent", "inconclusive")},
                     f"capped (≥ {MAX_SEEDS})": _capped(claims),
                     "seeds needed (median of the inconclusive below the cap)": _median_needed(claims),
                     "declared": _declared(claims)})
    empty = pd.DataFrame(columns=["verdict", "n_needed", "declared"])
    totals = {testbed: pd.concat(tables, ignore_index=True) for testbed, tables in testbeds.items()} or {"": empty}
    counts = " ".join(f"{'On ' + testbed + ', ' if testbed else ''}{len(total)} hypotheses in "
                      f"{len(testbeds.get(testbed, []))} studies: {_counts(total) or 'none'}; declared: "
                      f"{_declared(total) or 'none'}." for testbed, total in totals.items())
    head = (f"{counts} {COUNTING} Each report is one family at α = {ALPHA}; \"inconclusive\" is not \"no effect\"; "
            f"a capped one has no seed count (n needed ≥ {MAX_SEEDS}, e.g. a trend shown to go both ways) and "
            f"is left out of the medians. Declared: {DECLARED_TEXT}. Every claim, its effect, interval and the "
            f"seeds it needs: [docs/results](docs/results/README.md).\n\n")
    small = [f.name for f in folders if testbed_of(f) == SMALL_TESTBED]
    tail = (f"\nThe {len(small)} reports of {SMALL_TESTBED} ({', '.join(small)}) are counted above and listed "
            f"in [docs/results](docs/results/README.md).\n") if small else ""
    if variant_lines:
        tail = (f"\nOther runs of the studies above (variants, not counted): {'; '.join(variant_lines)}.\n"
                + tail)
    return head + markdown_table(pd.DataFrame(rows)) + tail


def demo_section(folder: Path) -> str:
    """README.md's "What `make demo` found": the demo report's trials in a line and every declared
    claim decided, linked to the report (its cells, mean ± sd over seeds, are in the report)."""
    claims = pd.read_csv(folder / "claims.csv")
    trials = pd.read_csv(folder / "trials.csv")
    seeds = sorted(trials["seed"].unique())
    finished = int((trials["status"] == "FINISHED").sum())
    head = (f"[The report](docs/results/{folder.name}/): {len(trials)} trials ({finished} finished), seeds "
            f"{seeds[0]}-{seeds[-1]}; {len(claims)} claims, declared: {_declared(claims)}; verdicts: "
            f"{_counts(claims) or 'none'} (one family at α = {ALPHA}).\n\n")
    return head + markdown_table(claims_table(claims))


def splice(text: str, section: str, path: Path, begin: str = BEGIN, end: str = END) -> str:
    """``text`` with everything between the markers ``begin`` and ``end`` replaced by ``section``."""
    if begin not in text or end not in text:
        raise ValueError(f"{path} has no {begin} … {end} section")
    head, rest = text.split(begin, 1)
    _, tail = rest.split(end, 1)
    return f"{head}{begin}\n<!-- written by `python -m analysis.results_text` from docs/results/*/claims.csv and " \
           f"trials.csv; edits here are overwritten -->\n\n{section.rstrip()}\n\n{end}{tail}"


def targets(root: Path = ROOT) -> dict[Path, str]:
    """Each file and the text it should hold."""
    folders = report_folders(root / "docs" / "results")
    wanted = {}
    for path, section in ((root / "README.md", main_readme(folders)),
                          (root / "docs" / "results" / "README.md", results_readme(folders))):
        wanted[path] = splice(path.read_text(encoding="utf-8"), section, path)
    demo = root / "docs" / "results" / DEMO
    if (demo / "claims.csv").is_file():
        readme = root / "README.md"
        wanted[readme] = splice(wanted[readme], demo_section(demo), readme, DEMO_BEGIN, DEMO_END)
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
