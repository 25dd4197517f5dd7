"""One trial asked for, and the one function that runs it.

``mae-study train``, the Ray Tune trainable (:mod:`studies.trainable`) and the data-parallel path
(:mod:`studies.ddp`) each build a :class:`TrialRequest` and call :func:`run_request`, so a trial
gets the same things whichever way it runs: its run (name, parent, tags, a run to reopen), its
checkpoint, and the study's shared baselines and pretrained encoders. What stays with the caller
is what belongs to its process: progress callbacks, the interruption handler and the rank.

A request is plain data (a frozen dataclass of a config, strings and paths), so Ray can ship it
to a Tune trial's Ray Train workers as it is.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

from mae_core.config import Config
from mae_core.distributed import Shard

from . import tracking
from .interrupts import Interruption


@dataclass(frozen=True)
class TrialRequest:
    """What one trial needs to run: ``config`` and where it logs (``tracking_uri``,
    ``experiment``); ``run_name``; ``run_id``, a run the caller found to reopen (a retried trial);
    ``parent_run_id``, its study's parent run; ``study`` and ``cell`` (its ``cell_id``), tagged on
    the run with ``tags``; ``checkpoint_path``; ``baseline_dir``, the study's shared baselines
    (:mod:`evaluation.baselines`; None: its own); ``pretrained_dir``, the study's shared encoders
    (:mod:`studies.pretrained`; None: it trains its own) with the study's training ``lengths``;
    ``plugins``, the driver's, which a process that builds parts for it imports first."""

    config: Config
    tracking_uri: str
    experiment: str = tracking.DEFAULT_EXPERIMENT
    run_name: str | None = None
    run_id: str | None = None
    parent_run_id: str | None = None
    study: str | None = None
    cell: str | None = None
    tags: dict[str, str] = field(default_factory=dict)
    checkpoint_path: Path | None = None
    baseline_dir: Path | None = None
    pretrained_dir: Path | None = None
    lengths: tuple[int, ...] = ()
    plugins: tuple[str, ...] = ()

    def run_tags(self) -> dict[str, str]:
        """The tags a new run gets: ``study`` and ``cell_id`` (when it belongs to a study), then ``tags``."""
        identity = {"study": self.study, "cell_id": self.cell}
        return {**{key: value for key, value in identity.items() if value is not None}, **self.tags}


def run_request(request: TrialRequest, data=None, *, shard: Shard = Shard(),
                on_progress: Callable[[int, dict[str, float]], None] | None = None,
                on_checkpoint: Callable[[int, Path], None] | None = None,
                interruption: Interruption | None = None):
    """Run ``request`` (on ``data``, else the config's data): its :class:`~studies.trial.TrialOutcome`.

    ``shard``: this process's rank of a data-parallel trial. Rank 0 runs the whole trial (its
    MLflow run, the evaluation); another rank trains its slice of each batch alongside and returns
    None, or returns at once when rank 0 reads an encoder the study kept for this pretraining key
    (:func:`studies.trial.pretraining_decided`).
    """
    from evaluation.baselines import BaselineCache
    from mae_core.data import prepare_data
    from mae_core.train import train

    from . import testing_hooks
    from .pretrained import PretrainedCache
    from .trial import pretraining_decided, run_trial

    config = request.config
    data = data if data is not None else prepare_data(config)
    pretrained = (PretrainedCache(Path(request.pretrained_dir), lengths=tuple(request.lengths),
                                  workers=shard.world_size)
                  if request.pretrained_dir is not None else None)
    if shard.rank != 0:
        if pretrained is None or pretraining_decided(shard, config):
            train(config, data, checkpoint_path=request.checkpoint_path, shard=shard,
                  after_update=testing_hooks.pause_after_update(None))
        return None
    return run_trial(config, data, tracking_uri=request.tracking_uri, experiment=request.experiment,
                     run_name=request.run_name, run_id=request.run_id, parent_run_id=request.parent_run_id,
                     tags=request.run_tags() or None, checkpoint_path=request.checkpoint_path,
                     baselines=BaselineCache(Path(request.baseline_dir)) if request.baseline_dir else None,
                     pretrained=pretrained, on_progress=on_progress, on_checkpoint=on_checkpoint,
                     interruption=interruption, shard=shard)
