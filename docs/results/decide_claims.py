"""Decide the declared claims of every committed report from its trials.csv alone.

    .venv/bin/python docs/results/decide_claims.py [NAME ...]     # default: every folder here

Writes claims.csv, claims.md and fig_claims.* into each report folder and rewrites its
correlations.csv/.md under the current rules (at least 10 clusters, no p-values that treat trials
as independent) and its exploratory comparisons (comparisons.csv, baselines.csv, findings.md) in
the claims' four verdicts, "exploratory, outside the family" (issue 35 part 4). index.html needs
the run's MLflow store (histories, reconstructions, provenance): a folder whose store is gone
keeps the page it was written with, and its csv and md files are the current numbers. A report whose run carried its claims (study.json's "claims") is decided with
them; reports of runs that predate claims are decided with the claims its built-in study file
declares now, and say so above the table. Every claim is labelled in the column declared as the
report labels it (analysis.registration): these runs predate the tags that register claims at
the start (claims_sha256, study_file_commit), so every one is "after". Then run
`python -m analysis.results_text` to rewrite the results sections of the READMEs.
"""

from __future__ import annotations

import sys
from pathlib import Path

from analysis.claims_report import decide, write_claims
from analysis.findings import write_findings
from analysis.tables import write_correlations
from analysis.trials_file import load_trials
from studies.named_studies import get_study

HERE = Path(__file__).resolve().parent
AFTER = ("written after these trials ran, from the paper's rows (the trials predate declared claims), not chosen "
         "after reading their numbers")
UNTAGGED = ("these claims are the ones the run read from its study file (the parent's claims tag), but the run "
            "predates the tags that register them when a study starts (claims_sha256, study_file_commit), so "
            "nothing checkable shows they were committed before it")


def decide_folder(folder: Path) -> str:
    frame, info = load_trials(folder / "trials.csv", folder.name, get_study)
    study = str(frame["study"].dropna().iloc[0]) if "study" in frame else folder.name
    if info.get("claims"):  # registered at the start (claims_sha256): the labels say it all
        raw, note = info["claims"], "" if info.get("claims_sha256") else UNTAGGED
    else:
        raw, note = list(get_study(study).claims), AFTER
    claims = decide(frame, study, info, raw, note)
    write_claims(claims, study, folder)
    axes = [a for a in info["axes"] if a in frame]
    write_correlations(frame, study, axes, folder, smoke=bool(info.get("smoke")))
    if not info.get("search"):
        write_findings(frame, study, axes, info, folder)
    counts = claims.table["verdict"].value_counts().to_dict()
    return f"{folder.name}: {len(claims.table)} hypotheses {counts}; not decided: {len(claims.skipped)}"


def main(names: list[str]) -> int:
    folders = [HERE / n for n in names] if names else sorted(p.parent for p in HERE.glob("*/trials.csv"))
    for folder in folders:
        if folder.name == "paper":
            continue
        print(decide_folder(folder), flush=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))
