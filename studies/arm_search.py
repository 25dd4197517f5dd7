"""Optuna per arm of a grid, as one Ray Tune search algorithm (``--search optuna``).

Imports Ray Tune and Optuna when imported: :mod:`studies.search` imports it only to run a search.
"""

from __future__ import annotations

import math
import pickle
from typing import Any

from ray.tune.search import Searcher


class ArmSearch(Searcher):
    """One Optuna study per arm of the grid: ``samples`` suggestions each, every suggestion run
    once per seed; Optuna is told the mean of ``metric`` over the seeds that finished (a sample
    whose every seed failed or diverged is a failed Optuna trial).

    Ray Tune sees no metric on this searcher (its own ``metric`` stays None), so the trials'
    checkpoint reports need not carry ``metric``; the arms' searchers get only final means.
    """

    def __init__(self, arms: list[dict[str, Any]], seeds: list[int], space: dict[str, Any], *,
                 samples: int, metric: str, mode: str, seed: int):
        import optuna
        from ray.tune.search.optuna import OptunaSearch

        # Optuna logs every trial at INFO ("A new study created ..."): the progress lines say it
        optuna.logging.set_verbosity(optuna.logging.WARNING)
        super().__init__(metric=None, mode=None)
        space = OptunaSearch.convert_search_space(space)  # Tune's domains -> Optuna's distributions
        self.arms, self.seeds, self.samples = [dict(a) for a in arms], list(seeds), samples
        self.target, self.target_mode = metric, mode
        self.searchers = [OptunaSearch(space=dict(space), metric=metric, mode=mode, seed=seed + i)
                          for i in range(len(self.arms))]
        self.asked = [0] * len(self.arms)  # samples suggested per arm
        self.next_arm = 0
        self.queue: list[tuple[str, dict[str, Any]]] = []  # (sample, trial config) still to hand out
        self.sample_of: dict[str, str] = {}  # Ray trial id -> sample id
        self.open: dict[str, dict[str, Any]] = {}  # sample id -> arm, seeds still running, values

    def set_search_properties(self, metric, mode, config, **spec) -> bool:
        return True  # the space, metric and mode were given at construction

    def suggest(self, trial_id: str):
        if not self.queue and not self._new_sample():
            return self.FINISHED
        sample, config = self.queue.pop(0)
        self.sample_of[trial_id] = sample
        return config

    def _new_sample(self) -> bool:
        """Ask the next arm (round robin) with samples left for one; False when none has."""
        for offset in range(len(self.arms)):
            arm = (self.next_arm + offset) % len(self.arms)
            if self.asked[arm] < self.samples:
                break
        else:
            return False
        self.next_arm = arm + 1
        sample = f"arm{arm}-sample{self.asked[arm]}"
        self.asked[arm] += 1
        params = self.searchers[arm].suggest(sample)
        self.open[sample] = {"arm": arm, "left": len(self.seeds), "values": []}
        self.queue += [(sample, {**self.arms[arm], **params, "seed": seed}) for seed in self.seeds]
        return True

    def on_trial_complete(self, trial_id: str, result: dict | None = None, error: bool = False) -> None:
        sample = self.sample_of.pop(trial_id, None)
        if sample is None:
            return
        entry = self.open[sample]
        value = (result or {}).get(self.target)
        if not error and isinstance(value, (int, float)) and math.isfinite(value):
            entry["values"].append(float(value))
        entry["left"] -= 1
        if entry["left"] == 0:
            del self.open[sample]
            values = entry["values"]
            mean = {self.target: sum(values) / len(values)} if values else None
            self.searchers[entry["arm"]].on_trial_complete(sample, mean, error=not values)

    def save(self, checkpoint_path: str) -> None:
        with open(checkpoint_path, "wb") as file:
            pickle.dump(self.__dict__, file)

    def restore(self, checkpoint_path: str) -> None:
        with open(checkpoint_path, "rb") as file:
            self.__dict__.update(pickle.load(file))
