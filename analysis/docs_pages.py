"""The generated reference pages docs/configuration.md and docs/mlflow.md.

The configuration page is the config's own catalogue (:func:`mae_core.config.config_keys`, the
listing ``mae-study config`` prints); the MLflow page is the fixed MLflow contract plus the metric
table :data:`evaluation.metrics.METRICS`. Nothing in either is typed by hand, so neither can
drift from the code. ``python -m analysis.docs_pages`` rewrites both; ``--check`` exits 1 when
either differs from what it would write (the test suite runs the same comparison).
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

import pandas as pd

from evaluation.metrics import COMPUTE_METRICS, METRICS, RISK_MEANING_AXES, Metric
from mae_core.config import as_typed, config_keys

from .markdown import markdown_table

ROOT = Path(__file__).resolve().parent.parent
DOCS = ROOT / "docs"
GENERATED = "<!-- written by `python -m analysis.docs_pages`; edits here are overwritten -->"

CONFIGURATION_HEAD = """# Configuration

Every key a user types: `key=value` after `mae-study train` or `mae-study run`, a YAML file
(`mae-study train --config my.yaml`), or a study file's `base`, `axes`, `zip` and `eval`. Every
key, default, unit and allowed range lives in `mae_core/config.py`; `mae-study config [KEY ...]`
prints them, and `mae-study config --yaml > my.yaml` writes every default (with its meaning as a
comment) in a file `mae-study train --config my.yaml` reads unchanged. Unknown keys and bad values
are refused with one line naming the key (exit status 2), before Ray starts or an MLflow run
exists. Also checked together: k = int(M·(1-mask_ratio)) in [1, M-1]; widths divisible by heads;
patch_size divides the image. The visible count is `k = int(M·(1-mask_ratio))` as in the reference
code; the effective ratio `(M-k)/M` is logged (as the `effective_mask_ratio` param). The `eval.*` keys are the evaluation settings
([evaluation.md](evaluation.md)); in a YAML file they nest under `eval:`.
"""

MLFLOW_HEAD = """# The MLflow contract

What a run leaves in MLflow, so that analysis is one DataFrame away (`analysis` reads only the
MLflow store). How runs are started, resumed and ended: [running.md](running.md).

## Store

The default tracking URI is `sqlite:///<absolute path>/mlflow.db` inside the command's `--out`
folder (always an absolute path: Ray trials run in their own folders); `--tracking-uri` names a
server instead.

## Runs, tags and params

- A study is a parent run tagged `study=<name>`; each trial is a child run (`mlflow.parentRunId`).
- A study's parent run holds its declared claims (`claims`) and, from its start, `claims_sha256`
  (their canonical JSON's SHA-256) and `study_file_commit` (the commit of the unchanged study
  file, or `uncommitted`): what a report's `declared` column reads ([studies.md](studies.md#what-declared-means)).
- A trial's params are its full resolved config, evaluation settings included (every key of
  [configuration.md](configuration.md)).
- MLflow's standard source tags (`mlflow.source.git.commit`, ...) and the trial's dataset as an
  input.
- An interrupted run ends KILLED with the signal in its `interrupted` tag; a trial Ray Tune
  stopped (ASHA at a rung) names the exception Ray stopped it with, or says `stopped by Ray Tune`
  when Ray ended its process before the trial could.
- A run that fails ends FAILED with its one-line reason in the `failure_reason` tag: a diverging
  one (and its `failure_step`), or one stopped by an error that is no signal (a plugin's part
  breaking its rule, a crash); a retried or resumed run keeps it as `retried_after`.
- A trial whose pretraining was computed or reused from another cell says which in its
  `pretraining` tag (`computed KEY | reused KEY`); a reusing trial names the run it read
  (`pretraining_run`) and, when it read a longer run at its own length, that run's length
  (`pretraining_source_steps`).
- Each source of randomness is a param with the seed it used: `seed_data`, `seed_init`,
  `seed_masks`, `seed_eval` (each `seed` unless the config set it).
- Metric names use snake_case; each value is logged once, as a param or as a metric (derived
  quantities such as `effective_mask_ratio` are params).

## Metrics

`test_rec_risk` is the spec's R_rec for the AE and DAE; an MAE's error with every patch visible
(k = M, outside V_k) is `test_allvisible_rec_risk` and never stands in for a risk. Every metric a
trial logs, from the one metric table (`evaluation/metrics.py`, `METRICS`), which progress lines,
frames, figures, tables and claims read. Kinds: `risk` (the spec's empirical risks), `baseline`
(the mean-pixel predictor), `diagnostic` (not a risk of the spec), `downstream` (probes,
fine-tuning), `reference` (their baselines) and `bookkeeping`. Layer-wise probes
(`eval.probe_blocks`) add `probe_linear_acc_block2`, ...: the base row's meaning after encoder
block 2. With `eval.repeats` K > 1 every metric of the evaluation is the mean of K evaluations
(seeded `seed_eval`, `seed_eval`+1, ...) and `<metric>_sd` (bookkeeping, the base row's unit)
their sample standard deviation.
"""


def _metric_row(metric: Metric) -> dict[str, str]:
    against = ", ".join(f"`{name}`" for name in (metric.reference, *metric.baselines) if name)
    return {"metric": f"`{metric.name}`", "kind": metric.kind, "label": metric.label, "unit": metric.unit,
            "better": "lower" if metric.lower_is_better else "higher", "read against": against,
            "default delta": "" if metric.delta is None else f"{metric.delta:g}"}


def configuration_page() -> str:
    """docs/configuration.md: every key of the config in declaration order, the ``eval.*`` keys last."""
    table = pd.DataFrame([{"key": f"`{key.name}`", "default": f"`{as_typed(key.default)}`",
                           "allowed": key.allowed, "unit and meaning": key.description}
                          for key in config_keys()])
    return f"{CONFIGURATION_HEAD}\n{GENERATED}\n\n{markdown_table(table)}"


def mlflow_page() -> str:
    """docs/mlflow.md: the fixed contract, then every row of the metric table."""
    table = pd.DataFrame([_metric_row(m) for m in METRICS.values()])
    compute = ", ".join(f"`{name}`" for name in COMPUTE_METRICS)
    axes = "\n".join(f"- `{axis}`: {what}" for axis, what in RISK_MEANING_AXES.items())
    return (f"{MLFLOW_HEAD}\n{GENERATED}\n\n{markdown_table(table)}\n"
            f"Compute per trial: {compute}.\n\n"
            "## Axes that change what a risk measures\n\n"
            "A risk compared across cells that differ in one of these keys compares unlike numbers:\n\n"
            f"{axes}\n")


def targets(root: Path = ROOT) -> dict[Path, str]:
    """Each generated page and the text it should hold."""
    return {root / "docs" / "configuration.md": configuration_page(), root / "docs" / "mlflow.md": mlflow_page()}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--check", action="store_true", help="exit 1 when a page differs from what would be written")
    args = parser.parse_args(argv)
    stale = [path for path, text in targets().items()
             if not path.is_file() or path.read_text(encoding="utf-8") != text]
    if args.check:
        if stale:
            print(f"stale pages: {', '.join(map(str, stale))}; run python -m analysis.docs_pages", file=sys.stderr)
            return 1
        return 0
    for path in stale:
        path.write_text(targets()[path], encoding="utf-8")
        print(f"wrote {path}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
