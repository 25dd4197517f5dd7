"""A study's header: the tags on its parent MLflow run, and which parent run is the study's.

A study is a parent run tagged ``study=<name>``; the rest of its header says what ran (``grid``,
``study_axes``, ``reference``, ``zip``, ``search``, ``claims``, ``sequential_plan``), whether it
was a smoke run (``smoke`` = "True"), what it mirrors (``paper``), how it ran (``ray_address``,
``machine``, ``command``, ``workers_per_trial``, ``gpus_per_trial``, ``trials_per_gpu``), what was
registered when it started (``claims_sha256``, ``study_file_commit``: :mod:`analysis.registration`)
and what its later looks added (``sequential_looks``, ``seeds_added_outside_plan``).

:class:`StudyHeader` is the one place that writes and reads those tags: the runner writes
:meth:`StudyHeader.to_tags`, a report reads :meth:`StudyHeader.from_run` and writes
:meth:`StudyHeader.to_json` as its ``study.json``, and ``mae-study evaluate`` copies the study's
part onto its own parent. Tag names and encodings are those the runner has always written, so an
existing store reads the same. :func:`choose_parent` is the one rule for which parent run is the
study's: the newest of the requested kind (smoke or full).

Lives in ``analysis`` (MLflow's run objects, no Ray), so the report and the study layer above it
both use it.
"""

from __future__ import annotations

import json
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field, replace
from typing import Any

from .registration import CLAIMS_HASH_TAG, COMMIT_TAG

LOOKS_TAG = "sequential_looks"  # the seeds each cell held at every look (studies.seeds_by_need)
ADDED_TAG = "seeds_added_outside_plan"  # --add-seeds without a sequential plan
# The tags that say which study ran and what it varied: an evaluation parent run carries them
# (studies.reevaluate), so a report reads it like a study run.
STUDY_TAGS = ("study", "smoke", "paper", "grid", "study_axes", "reference", "claims", "zip", "search")
_COMPACT = (",", ":")
TAG_LIMIT = 8000  # characters of a tag's value MLflow stores  # claims, sequential plan and looks: long JSON, written without spaces


def _json(tags: Mapping[str, str], key: str, kind: type) -> Any:
    """The JSON tag ``key`` when it holds a ``kind``; None when absent or unreadable."""
    try:
        value = json.loads(tags[key]) if key in tags else None
    except (json.JSONDecodeError, TypeError):
        return None
    return value if isinstance(value, kind) else None


@dataclass(frozen=True)
class StudyHeader:
    """A study's parent-run header (see the module). ``None`` or empty fields are tags the run
    does not carry; ``run_id``, ``run_name`` and ``start_time`` (ms) come from the run itself."""

    study: str
    smoke: bool = False
    paper: str | None = None
    study_axes: list[str] | None = None  # the varied keys (seed excluded), as the runner wrote them
    grid: dict[str, Any] = field(default_factory=dict)  # axis -> values
    reference: dict[str, Any] | None = None  # axis -> value of the row every other row is compared with
    zip: list[dict[str, Any]] = field(default_factory=list)
    search: dict[str, Any] | None = None  # algorithm, samples, metric, mode, space; None for a grid
    claims: list[dict[str, Any]] = field(default_factory=list)  # as declared in the study file
    sequential_plan: dict[str, Any] | None = None  # --until-decided's plan, fixed before the first look
    claims_sha256: str | None = None
    study_file_commit: str | None = None
    ray_address: str | None = None
    machine: str | None = None
    command: str | None = None
    workers_per_trial: int | None = None  # processes per trial (absent: one)
    gpus_per_trial: float | None = None
    trials_per_gpu: int | None = None
    sequential_looks: list[dict[str, int]] = field(default_factory=list)
    added_outside_plan: list[int] = field(default_factory=list)
    run_id: str = ""
    run_name: str = ""
    start_time: int | None = None

    # ------------------------------------------------------------------ writing

    def to_tags(self) -> dict[str, str]:
        """The parent run's tags, each encoded as the runner has always written it."""
        tags = {"study": self.study, "smoke": str(self.smoke),
                "grid": json.dumps(self.grid, default=str)}
        if self.study_axes is not None:
            tags["study_axes"] = json.dumps(self.study_axes)
        optional = {
            "paper": self.paper, "ray_address": self.ray_address, "machine": self.machine,
            "command": self.command,
            "reference": None if self.reference is None else json.dumps(self.reference, default=str),
            "zip": json.dumps(self.zip, default=str) if self.zip else None,
            "search": None if self.search is None else json.dumps(self.search, sort_keys=True),
            "claims": json.dumps(self.claims, default=str, separators=_COMPACT) if self.claims else None,
            "sequential_plan": (None if self.sequential_plan is None
                                else json.dumps(self.sequential_plan, separators=_COMPACT)),
            "gpus_per_trial": None if self.gpus_per_trial is None else f"{self.gpus_per_trial:g}",
            "workers_per_trial": None if self.workers_per_trial is None else str(self.workers_per_trial),
            "trials_per_gpu": None if self.trials_per_gpu is None else str(self.trials_per_gpu),
            CLAIMS_HASH_TAG: self.claims_sha256, COMMIT_TAG: self.study_file_commit,
            **(look_tags(self.sequential_looks) if self.sequential_looks else {}),
            **(added_tags(self.added_outside_plan) if self.added_outside_plan else {}),
        }
        tags.update({key: value for key, value in optional.items() if value is not None})
        return tags

    def study_tags(self) -> dict[str, str]:
        """The :data:`STUDY_TAGS` part of :meth:`to_tags`."""
        return {key: value for key, value in self.to_tags().items() if key in STUDY_TAGS}

    def to_json(self) -> dict[str, Any]:
        """The report's header (``study.json``; :func:`analysis.trials_frame.load_study_info`)."""
        return {"run_id": self.run_id, "run_name": self.run_name, "start_time": self.start_time,
                "axes": self.axes, "grid": self.grid, "smoke": self.smoke, "paper": self.paper,
                "reference": self.reference, "zip": self.zip, "search": self.search, "claims": self.claims,
                "sequential": ({"plan": self.sequential_plan, "looks": self.sequential_looks}
                               if self.sequential_plan else None),
                # pre-registration (analysis.registration): absent from runs that predate it
                **({CLAIMS_HASH_TAG: self.claims_sha256} if self.claims_sha256 is not None else {}),
                **({COMMIT_TAG: self.study_file_commit} if self.study_file_commit is not None else {}),
                "added_outside_plan": self.added_outside_plan}

    # ------------------------------------------------------------------ reading

    @classmethod
    def from_tags(cls, tags: Mapping[str, str], **run: Any) -> StudyHeader:
        """The header a run's ``tags`` hold; an unreadable JSON tag reads as absent. ``run``:
        ``run_id``, ``run_name``, ``start_time``."""
        def number(key: str, kind: type, default: Any = None) -> Any:
            try:
                return kind(tags[key]) if key in tags else default
            except ValueError:
                return default

        axes = _json(tags, "study_axes", list)
        return cls(
            study=tags.get("study", ""), smoke=tags.get("smoke") == "True", paper=tags.get("paper"),
            study_axes=axes,
            grid=_json(tags, "grid", dict) or {}, reference=_json(tags, "reference", dict),
            zip=[g for g in _json(tags, "zip", list) or [] if isinstance(g, dict)],
            search=_json(tags, "search", dict),
            claims=[c for c in _json(tags, "claims", list) or [] if isinstance(c, dict)],
            sequential_plan=_json(tags, "sequential_plan", dict) or None,
            claims_sha256=tags.get(CLAIMS_HASH_TAG), study_file_commit=tags.get(COMMIT_TAG),
            ray_address=tags.get("ray_address"), machine=tags.get("machine"), command=tags.get("command"),
            workers_per_trial=number("workers_per_trial", int), gpus_per_trial=number("gpus_per_trial", float),
            trials_per_gpu=number("trials_per_gpu", int),
            sequential_looks=_json(tags, LOOKS_TAG, list) or [],
            added_outside_plan=_json(tags, ADDED_TAG, list) or [], **run)

    @classmethod
    def from_run(cls, run) -> StudyHeader:
        """The header of an MLflow ``Run`` (its tags, id, name and start time)."""
        return cls.from_tags(run.data.tags, run_id=run.info.run_id, run_name=run.info.run_name,
                             start_time=run.info.start_time)

    @property
    def axes(self) -> list[str]:
        """The axis keys the study varies, seeds aside (they are replicates): ``study_axes``,
        else ``grid``'s keys."""
        keys = self.study_axes if self.study_axes is not None else list(self.grid)
        return [axis for axis in keys if axis != "seed"]

    def without(self, keys: Iterable[str]) -> StudyHeader:
        """This study with ``keys`` set to one value each (``mae-study evaluate``): they are no
        longer axes, and the declared claims, made for the grid that ran, are dropped."""
        keys = set(keys)
        if not keys & (set(self.study_axes or []) | set(self.grid)):
            return self
        return replace(self, study_axes=[a for a in self.study_axes or [] if a not in keys],
                       grid={k: v for k, v in self.grid.items() if k not in keys},
                       reference=(None if self.reference is None
                                  else {k: v for k, v in self.reference.items() if k not in keys}),
                       claims=[])


def look_tags(looks: list[dict[str, int]], verdicts: Mapping[str, str] | None = None) -> dict[str, str]:
    """The parent's tags of a sequential study's looks so far (written at every look): the seeds
    per cell of each, and with ``verdicts`` the last look's (``look_J``: hypothesis -> verdict;
    left out when longer than MLflow's 8000-character tag limit)."""
    tags = {LOOKS_TAG: json.dumps(looks, separators=_COMPACT)}
    text = json.dumps(dict(verdicts or {}), separators=_COMPACT)
    if verdicts is not None and len(text) < TAG_LIMIT:
        tags[f"look_{len(looks)}"] = text
    return tags


def added_tags(seeds: list[int]) -> dict[str, str]:
    """The parent's tag of the seeds ``--add-seeds`` added outside a sequential plan."""
    return {ADDED_TAG: json.dumps(seeds)}


def grid_tags(axes: Mapping[str, Any]) -> dict[str, str]:
    """The parent's ``seeds`` and ``grid`` tags once seeds were added (every seed so far)."""
    return {"seeds": json.dumps(axes["seed"]), "grid": json.dumps(axes, default=str)}


# ------------------------------------------------------------------ which parent run


def is_smoke(run) -> bool:
    """A smoke run of a study (its ``smoke`` tag is "True")."""
    return run.data.tags.get("smoke") == "True"


def of_kind(parents: Iterable, smoke: bool | None) -> list:
    """The smoke (``smoke`` True) or full (False) runs among ``parents``; all for None."""
    return [run for run in parents if smoke is None or is_smoke(run) == smoke]


def newest(runs: Iterable):
    """The run that started last (None for none): re-running a study replaces its report."""
    return max(runs, key=lambda run: run.info.start_time or 0, default=None)


def choose_parent(parents: Iterable, smoke: bool | None = None):
    """The study's parent run among ``parents``: the newest of the requested kind (None: any);
    None when there is none of that kind (the caller says which flag to pass)."""
    return newest(of_kind(parents, smoke))
