"""What was run, in words a reader of a report needs: data, model, length, seeds, command, commit,
machine, date, and where the runs live (without the temporary paths a store may sit under).

Everything comes from the MLflow store: the trials' params and the study's parent-run tags
(``command`` and ``machine`` are recorded by ``mae-study run``; a store written before they were
says so, and the command is reconstructed from the study's name).
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from datetime import datetime, timezone
from pathlib import Path
from urllib.parse import urlparse

import pandas as pd
from mlflow.exceptions import MlflowException
from mlflow.tracking import MlflowClient
from mlflow.utils.mlflow_tags import MLFLOW_GIT_COMMIT

from .figures import levels
from .labels import value_text
from .study_header import StudyHeader

# (param, how it reads) of the model, in the order a methods section states them.
_MODEL_KEYS = (("objective", "objective {}"), ("encoder_width", "ViT encoder width {}"),
               ("encoder_depth", "depth {}"), ("encoder_heads", "{} heads"),
               ("decoder_width", "decoder width {}"), ("decoder_depth", "depth {}"),
               ("patch_size", "patch {} px"), ("target", "target {}"))


@dataclass(frozen=True)
class Provenance:
    rows: list[tuple[str, str]]  # (what, value) in reading order
    command_recorded: bool


def display_uri(tracking_uri: str) -> str:
    """The store as a reader can use it: an SQLite file by name only (the folder it sat in when
    the report was made is often temporary); a server's URI as it is, without credentials."""
    if tracking_uri.startswith("sqlite:///"):
        return f"SQLite file {Path(tracking_uri.removeprefix('sqlite:///')).name}"
    parsed = urlparse(tracking_uri)
    if parsed.password or parsed.username:
        return parsed._replace(netloc=parsed.hostname + (f":{parsed.port}" if parsed.port else "")).geturl()
    return tracking_uri


def _values(frame: pd.DataFrame, key: str) -> list:
    if key not in frame:
        return []
    return list(dict.fromkeys(v for v in frame[key].tolist() if v is not None and v == v))


def _constant_or_range(frame: pd.DataFrame, key: str, fmt: str = "{}") -> str | None:
    values = _values(frame, key)
    if not values:
        return None
    if len(values) == 1:
        return fmt.format(value_text(key, values[0]))
    shown = ", ".join(value_text(key, v) for v in levels(pd.Series(values), key))
    return f"{fmt.format('').strip()} varies: {shown}"


def _model(frame: pd.DataFrame) -> str:
    parts = [text for key, fmt in _MODEL_KEYS if (text := _constant_or_range(frame, key, fmt))]
    return ", ".join(parts) or "not recorded"


def _seeds(frame: pd.DataFrame) -> str:
    seeds = sorted(int(s) for s in _values(frame, "seed"))
    return f"{', '.join(map(str, seeds))} ({len(seeds)} seeds)" if seeds else "not recorded"


def _compute(frame: pd.DataFrame) -> str:
    """The study's compute in all (per cell: summary.csv's compute columns): pretraining and
    evaluation wall time summed over trials, and pretraining FLOPs (FLOPs per update x updates)."""
    if "pretrain_seconds" not in frame or frame["pretrain_seconds"].isna().all():
        return "not recorded by these runs"

    def duration(seconds: float) -> str:
        return (f"{seconds:.3g} s" if seconds < 120 else f"{seconds / 60:.3g} min" if seconds < 7200
                else f"{seconds / 3600:.3g} h")

    logged = frame[frame["pretrain_seconds"].notna()]
    text = (f"pretraining {duration(logged['pretrain_seconds'].sum())}, evaluation "
            f"{duration(logged.get('eval_seconds', pd.Series(dtype=float)).sum())} (wall time summed over {len(logged)} trials)")
    if "steps" in logged and "flops_per_update" in logged:
        text += f"; {_pretraining_flops(logged).sum():.3g} pretraining FLOPs"
    return text


def _pretraining_flops(frame: pd.DataFrame) -> pd.Series:
    """Each trial's pretraining FLOPs (FLOPs per update x updates; NaN where not logged)."""
    if "flops_per_update" not in frame or "steps" not in frame:
        return pd.Series(float("nan"), index=frame.index)
    return frame["flops_per_update"] * pd.to_numeric(frame["steps"], errors="coerce")


def _seeds_by_need(frame: pd.DataFrame, info: dict) -> str | None:
    """For a run with ``--until-decided``: its looks, and the trials and pretraining FLOPs it
    spent against a fixed grid of every cell at the plan's maximum seeds (each cell's trials at
    their mean cost); None for any other run."""
    sequential = info.get("sequential") or {}
    looks, plan = sequential.get("looks"), sequential.get("plan") or {}
    if not looks or "max_seeds" not in plan:
        return None
    cells = len(looks[-1])
    fixed = cells * int(plan["max_seeds"])
    seeds = ", ".join(str(max(look.values(), default=0)) for look in looks)
    text = (f"{len(looks)} look(s) at up to {seeds} seeds per cell; {len(frame)} trials against {fixed} for a "
            f"fixed grid at the plan's {plan['max_seeds']} seeds per cell")
    flops = _pretraining_flops(frame)
    axes = [a for a in info.get("axes", []) if a in frame]
    if flops.notna().all() and len(frame):
        per_cell = flops.groupby([frame[a] for a in axes]).mean() if axes else pd.Series([flops.mean()])
        fixed_flops = per_cell.sum() * int(plan["max_seeds"])
        text += f"; {flops.sum():.3g} pretraining FLOPs against {fixed_flops:.3g} ({flops.sum() / fixed_flops:.0%})"
    return text


def _encoders(frame: pd.DataFrame) -> str | None:
    """How many encoders were trained and how many trials read another trial's
    (:mod:`studies.pretrained`), and for a study over lengths which were read from which; None
    where every trial trained its own and the study has one length."""
    lengths = "steps" in frame and frame["steps"].nunique() > 1
    if "pretraining" not in frame or frame["pretraining"].isna().all():
        return "every length trained on its own" if lengths else None
    how = frame["pretraining"].value_counts()
    text = f"{int(how.get('computed', 0))} trained, {int(how.get('reused', 0))} read from another trial's training"
    if "pretraining_source_steps" in frame and frame["pretraining_source_steps"].notna().any():
        read = frame[frame["pretraining_source_steps"].notna()]
        pairs = sorted({(int(s), int(l)) for s, l in zip(read["steps"], read["pretraining_source_steps"])})
        text += ("; shorter lengths read at that update of a longer run with the same learning rates: "
                 + ", ".join(f"{s} of {l}" for s, l in pairs))
    elif lengths:
        text += "; every length trained on its own"
    return text


def _tags(tracking_uri: str, run_id: str) -> dict[str, str]:
    try:
        return dict(MlflowClient(tracking_uri).get_run(run_id).data.tags)
    except MlflowException:
        return {}


def _commits(commit: str | None, tags: dict[str, str]) -> str:
    """The commit that started the study, and those its later drivers continued it on
    (``--resume``, a further look, ``--add-seeds``: the parent's ``continued_on_commits``)."""
    text = commit or "not recorded (not run from a git checkout)"
    later = json.loads(tags.get("continued_on_commits", "[]"))
    return text + (f"; continued on {', '.join(later)}" if later else "")


def provenance(tracking_uri: str, study: str, info: dict, frame: pd.DataFrame) -> Provenance:
    """The rows of a report's "what was run" block, from the store alone."""
    tags = _tags(tracking_uri, info["run_id"])
    header = StudyHeader.from_tags(tags)
    commit = tags.get(MLFLOW_GIT_COMMIT)
    command = header.command
    recorded = command is not None
    if not recorded:
        command = f"mae-study run {study}{' --smoke' if info.get('smoke') else ''} (reconstructed: " \
                  f"this store does not record the command or its overrides)"
    started = (datetime.fromtimestamp(info["start_time"] / 1000, timezone.utc).strftime("%Y-%m-%d %H:%M UTC")
               if info.get("start_time") else "unknown")
    status = frame["status"].value_counts() if "status" in frame else pd.Series(dtype=int)
    trials = f"{len(frame)} trials: {', '.join(f'{int(v)} {k.lower()}' for k, v in status.items())}"
    steps = _constant_or_range(frame, "steps", "{} updates")
    batch = _constant_or_range(frame, "batch_size", "batch {}")
    if batch and (header.workers_per_trial or 1) > 1:  # run --workers-per-trial N (parent tag)
        batch += f" (the global batch, split over {header.workers_per_trial} workers per trial)"
    rows = [
        ("study", study + (f" (mirrors {info['paper']})" if info.get("paper") else "")
         + (" — smoke run, not a finding" if info.get("smoke") else "")),
        ("dataset", _constant_or_range(frame, "dataset") or "not recorded"),
        ("model", _model(frame)),
        ("pretraining", ", ".join(p for p in (steps, batch) if p) or "not recorded"),
        ("seeds", _seeds(frame)),
        ("trials", trials),
        ("compute", _compute(frame)),
        *[("encoders", text) for text in (_encoders(frame),) if text],
        *[("seeds by need", text) for text in (_seeds_by_need(frame, info),) if text],
        ("command", command),
        ("git commit", _commits(commit, tags)),
        ("machine", header.machine if header.machine is not None else "not recorded by this store"),
        ("started", started),
        ("runs", f"MLflow parent run {info['run_id']} in {display_uri(tracking_uri)}"),
    ]
    return Provenance(rows, recorded)
