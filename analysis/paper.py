"""``mae-study report --paper``: MAE Table 1 for several studies at once, and Figure 5.

Each study is read from its own MLflow store (``STUDY=STORE``: a tracking URI, an ``mlflow.db``
file, or a folder holding one, as ``docs/results/republish.sh`` leaves them), from the default
store, or from the ``trials.csv`` a report wrote (``STUDY=path/trials.csv``, see
:mod:`analysis.trials_file`: a committed report is enough). Written to the output folder:

* ``table1.tex``: one ``table*`` with a sub-table per study, (a), (b), ... in the order given
  (:func:`analysis.paper_table.combined_latex`), one label ``tab:ablations``;
* ``fig_mask_ratio{,_column}.{pdf,png}`` and ``fig_mask_ratio.tex``: MAE Figure 5 (mask ratio
  against fine-tuning and linear-probe accuracy) from the first study that varies the mask ratio;
* ``paper_preview.tex``: a minimal two-column document that inputs both, for ``pdflatex``.
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

from mae_core import files
from mae_core.errors import clipped
from mae_core.files import FolderNotWritable, writable_folder

from . import figures, paper_table
from .trials_frame import ReportError, load_runs, load_study_info
from .labels import table_columns
from .paper_table import tex
from .findings import study_reference
from .report_figures import figure_caption
from .trials_file import FindStudy, load_trials

STUDY_NAME = re.compile(files.STUDY_NAME)  # the one pattern run, report and evaluate take
FIGURE5 = "mask_ratio"  # the file stem of MAE Figure 5's counterpart
FIGURE5_METRICS = ("finetune_acc", "probe_linear_acc")  # MAE Figure 5: fine-tuning above, linear below


@dataclass(frozen=True)
class StudySource:
    study: str
    tracking_uri: str
    trials: Path | None = None  # a report's trials.csv, read instead of the store


def _trials_file(text: str) -> Path | None:
    """``text`` as a report's ``trials.csv`` when it names an existing ``.csv`` file, else None."""
    path = Path(text).expanduser()
    return path.resolve() if path.suffix == ".csv" and path.is_file() else None


def store_uri(text: str) -> str:
    """A store as a user names it -> a tracking URI: a URI (``scheme://...``) as it is; a folder
    -> its ``mlflow.db``; a file -> ``sqlite:///`` its absolute path. A path that does not
    exist is an error (reading must not create an empty store)."""
    if "://" in text:
        if text.startswith("sqlite:///") and not Path(text.removeprefix("sqlite:///")).is_file():
            raise ReportError(f"no MLflow store at {text.removeprefix('sqlite:///')}")
        return text
    path = Path(text).expanduser()
    if path.is_dir():
        path = path / "mlflow.db"
    if not path.is_file():
        raise ReportError(f"no MLflow store at {path} (give a tracking URI, an mlflow.db file or its folder)")
    return f"sqlite:///{path.resolve()}"


def parse_sources(items: Sequence[str], default_uri: str) -> list[StudySource]:
    """``STUDY`` or ``STUDY=STORE`` items -> sources; ``STUDY`` alone reads ``default_uri``."""
    sources = []
    for item in items:
        study, sep, store = item.partition("=")
        if not STUDY_NAME.fullmatch(study):
            raise ReportError(f"--paper {clipped(item)}: a study name uses {files.NAME_RULE}")
        if sep and not store:
            raise ReportError(f"--paper {item}: name a store after '=' (a tracking URI, an mlflow.db or its folder)")
        if sep and (trials := _trials_file(store)):
            sources.append(StudySource(study, "", trials))
        else:
            sources.append(StudySource(study, store_uri(store) if sep else default_uri))
    if not sources:
        raise ReportError("--paper needs at least one STUDY or STUDY=STORE")
    return sources


def _figure5(frame, info: dict, out: Path, formats: Sequence[str]) -> list[Path]:
    """MAE Figure 5 from a mask-ratio study: the figure at both widths and its LaTeX float."""
    metrics = [m for m in FIGURE5_METRICS if m in frame and frame[m].notna().any()]
    if not metrics:
        return []
    paths, _ = figures.save_sizes(lambda w: figures.metric_vs_axis(frame, "mask_ratio", metrics, width=w),
                                  out, FIGURE5, formats)
    what = " and ".join(table_columns()[m] for m in metrics)
    caption = figure_caption(info, f"Mask ratio against {what} accuracy", frame, ["mask_ratio"])
    snippet = out / f"fig_{FIGURE5}.tex"
    snippet.write_text("\n".join([
        r"\begin{figure}[t]", r"\centering",
        rf"\includegraphics[width=\columnwidth]{{fig_{FIGURE5}_column.pdf}}",
        rf"\caption{{{tex(caption)}}}", rf"\label{{fig:{FIGURE5}-{info['run_id'][:7]}}}", r"\end{figure}", "",
    ]), encoding="utf-8")
    return [*paths, snippet]


def _read(source: StudySource, experiment: str, smoke: bool, find_study: FindStudy | None) -> tuple:
    """(frame, header) of a source: its trials.csv, or its store's newest full (smoke) run."""
    if source.trials is not None:
        frame, info = load_trials(source.trials, source.study, find_study)
        if bool(info.get("smoke")) != smoke:
            kind = "a smoke run" if info.get("smoke") else "a full run"
            raise ReportError(f"{source.trials} holds {kind} of {source.study}"
                              + ("; add --smoke to put it in a table" if info.get("smoke") else "; drop --smoke"))
        return frame, info
    frame = load_runs(source.tracking_uri, source.study, experiment, smoke=smoke)
    return frame, load_study_info(source.tracking_uri, source.study, experiment, smoke=smoke)


def write_paper(sources: Sequence[StudySource], out_dir: Path, *, formats: Sequence[str] = ("png", "pdf"),
                experiment: str = "mae-study", smoke: bool = False,
                find_study: FindStudy | None = None) -> list[Path]:
    """Write ``table1.tex`` (a sub-table per source, in order), the Figure 5 files when a study
    varies the mask ratio, and ``paper_preview.tex``; return every path written. Each study's
    newest full run is read (with ``smoke``, its newest smoke run, and every caption says so):
    a smoke run never lands in a paper's table unannounced. ``find_study`` reads a ``trials.csv``
    without ``study.json`` against a built-in study (:func:`analysis.trials_file.load_trials`)."""
    try:
        out = writable_folder(out_dir)
    except FolderNotWritable as error:
        raise ReportError(f"--out {error}") from None
    if "pdf" not in formats:
        formats = [*formats, "pdf"]  # the LaTeX files include the PDF
    tables, written, figure_done = [], [], False
    for source in sources:
        frame, info = _read(source, experiment, smoke, find_study)
        axes = [a for a in info["axes"] if a in frame]
        reference, _ = study_reference(info, frame, axes)
        tables.append(paper_table.study_table(frame, source.study, axes, reference, info.get("paper"),
                                              info["run_id"], smoke=info["smoke"]))
        if not figure_done and FIGURE5 in axes:
            made = _figure5(frame, info, out, formats)
            written += made
            figure_done = bool(made)
    table = out / "table1.tex"
    table.write_text(f"% MAE Table 1 form. Needs: {' '.join(paper_table.PACKAGES)}\n"
                     + paper_table.combined_latex(tables), encoding="utf-8")
    body = [r"\input{table1.tex}"] + ([rf"\input{{fig_{FIGURE5}.tex}}"] if figure_done else [])
    preview = out / "paper_preview.tex"
    preview.write_text(paper_table.preview_document("\n".join(body + [r"\clearpage"])), encoding="utf-8")
    return [table, *written, preview]
