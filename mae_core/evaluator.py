"""An evaluator as a class (big_vision's evaluators, each with its own typed config): what a
trained model is measured by, with its settings, its metric rows and its baselines in one place.

A subclass states

* ``name``: how ``eval.evaluators`` lists it, and the prefix of its keys, ``eval.<name>.<key>``;
* ``Settings``: a pydantic model of those keys (defaults, ranges, units in its field
  descriptions); a wrong key or value is a :class:`~mae_core.config.ConfigError`, one line
  naming ``eval.<name>.<key>``, before Ray or MLflow start;
* ``metrics``: its rows of the metric table (:class:`evaluation.metrics.Metric`: name, label,
  unit, direction), every name it logs;
* ``needs_labels``: whether it reads the labels (a probe) or not (a risk);
* ``baselines``: metric-name prefix -> how that reference is measured, :data:`RANDOM_INIT`
  (the same measurement on the trial's encoder at initialisation) or :data:`PIXELS` (on the
  raw pixels): ``random_`` + ``centroid_acc`` is ``random_centroid_acc``;
* ``parts`` (optional): the names of the evaluators it stands for, run in their place in that
  order (``probes`` is ``frozen_probes, layer_probes, finetune``; :func:`expand`);
* ``measure(trial) -> {metric name: value}``, ``trial`` being the evaluation layer's
  :class:`evaluation.features.Trial` (the model, its config and data, the study's baseline cache
  and the features extracted once per trial).

:func:`register_evaluator` puts the class in :data:`mae_core.registry.evaluators`, whose
entry carries the class and its ``Settings``. This module imports no torch.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any, ClassVar

from pydantic import BaseModel, ConfigDict, ValidationError

from . import registry
from .errors import UserError, first_problem, shown

RANDOM_INIT = "random_init"  # the measurement on the trial's encoder at initialisation
PIXELS = "pixels"  # the measurement on the raw pixels, the flattened patches [N, M·q]
REFERENCES = (RANDOM_INIT, PIXELS)


class NoSettings(BaseModel):
    """An evaluator without keys of its own: any ``eval.<name>.<key>`` is unknown."""

    model_config = ConfigDict(extra="forbid", frozen=True)


class Evaluator:
    """The base of every evaluator (see the module's docstring for what a subclass states)."""

    name: ClassVar[str] = ""
    Settings: ClassVar[type[BaseModel]] = NoSettings
    metrics: ClassVar[tuple] = ()
    needs_labels: ClassVar[bool] = True
    baselines: ClassVar[Mapping[str, str]] = {}
    # Its settings in smoke mode (--smoke: seconds on two cores, every code path exercised);
    # a study's own keys win over these (studies.study.smoke_eval)
    smoke: ClassVar[Mapping[str, Any]] = {}
    # True: runs while the model trains (every eval.every updates), never after training
    during_training: ClassVar[bool] = False
    # True for the built-ins whose keys predate evaluators with settings: their keys stay the
    # top-level eval.<key> (the logged params, the contract) and eval.<name>.<key> is an alias.
    flat_keys: ClassVar[bool] = False
    # The evaluators it names, run in its place in this order (an alias: probes); () = itself
    parts: ClassVar[tuple[str, ...]] = ()

    @classmethod
    def declares(cls, name: str) -> bool:
        """Whether ``name`` is a metric it may log: one of its rows (a layer-wise probe derives
        names from another evaluator's rows and says so here)."""
        return any(row.name == name for row in cls.metrics)

    def __init__(self, settings: BaseModel | None = None):
        self.settings = settings if settings is not None else self.Settings()

    @classmethod
    def from_config(cls, config: Any) -> Evaluator:
        """The evaluator with the settings ``config`` (a :class:`~mae_core.config.Config`) gives it."""
        return cls(cls.settings_of(config.eval))

    @classmethod
    def settings_of(cls, eval_config: Any) -> BaseModel:
        """This evaluator's validated settings in ``eval_config`` (an ``EvalConfig``)."""
        if cls.flat_keys:
            return cls.Settings(**{key: getattr(eval_config, key) for key in cls.Settings.model_fields})
        return cls.Settings(**(eval_config.evaluator_settings().get(cls.name) or {}))

    def active(self) -> bool:
        """Whether it runs at all with its settings (``online``: only with ``eval.every > 0``)."""
        return True

    def during(self, config: Any, data: Any) -> Any:
        """A during-training evaluator's ``measure(model) -> {metric: value}`` for one trial,
        called at each online evaluation with the model as it is then."""
        raise NotImplementedError(f"evaluator {self.name!r} does not run during training")

    def measure(self, trial: Any) -> dict[str, float]:
        raise NotImplementedError(f"evaluator {self.name!r} does not define measure(trial)")

    def __call__(self, trial: Any) -> dict[str, float]:
        return self.measure(trial)


def expand(names: tuple[str, ...] | list[str]) -> tuple[str, ...]:
    """``eval.evaluators`` with each alias replaced by its ``parts``, in order:
    ``(risks, probes)`` -> ``(risks, frozen_probes, layer_probes, finetune)``."""
    expanded: list[str] = []
    for name in names:
        cls = registry.evaluators.get(name).evaluator_class
        expanded += list(getattr(cls, "parts", ()) or (name,))
    return tuple(expanded)


def smoke_keys() -> dict[str, Any]:
    """Every registered evaluator's ``smoke`` settings as config keys: ``eval.<key>`` for a
    built-in with ``flat_keys``, ``eval.<name>.<key>`` otherwise."""
    keys: dict[str, Any] = {}
    for name in registry.evaluators.names():
        cls = registry.evaluators.get(name).evaluator_class
        for key, value in (getattr(cls, "smoke", None) or {}).items():
            keys[f"eval.{key}" if cls.flat_keys else f"eval.{name}.{key}"] = value
    return keys


def register_evaluator(cls: type[Evaluator]) -> type[Evaluator]:
    """Class decorator: ``cls`` becomes ``eval.evaluators=<cls.name>`` (and ``eval.<name>.*``)."""
    if not (isinstance(cls, type) and issubclass(cls, Evaluator)):
        raise UserError(f"@register_evaluator: {cls!r} is not a subclass of mae_core.evaluator.Evaluator")
    name = cls.name
    if not (isinstance(cls.Settings, type) and issubclass(cls.Settings, BaseModel)):
        raise UserError(f"evaluator {name!r}: Settings must be a pydantic model")
    unknown = sorted(set(cls.baselines.values()) - set(REFERENCES))
    if unknown:
        raise UserError(f"evaluator {name!r}: baselines are measured as one of {', '.join(REFERENCES)}, "
                        f"not {', '.join(unknown)}")
    for row in cls.metrics:
        if not isinstance(getattr(row, "name", None), str) or not hasattr(row, "lower_is_better"):
            raise UserError(f"evaluator {name!r}: metrics must be evaluation.metrics.Metric rows, not {row!r}")
    registry.evaluators.register(name, registry.Evaluator(
        name, cls, tuple(cls.metrics), (cls.__doc__ or "").strip(),
        evaluator_class=cls, settings=cls.Settings), cls)
    return cls


def validate_settings(name: str, values: Mapping[str, Any]) -> dict[str, Any]:
    """``eval.<name>.*`` keys of a registered evaluator -> its settings as given (defaults left
    out, so a config that gives none logs no new param); a wrong key or value raises
    ``ValueError`` with one line naming ``eval.<name>.<key>``. A built-in with ``flat_keys``
    is checked for its key names only: its values are the ``eval.<key>`` fields' to validate."""
    entry = registry.evaluators.get(name)
    model = entry.settings or NoSettings
    unknown = [key for key in values if key not in model.model_fields]
    if unknown:
        known = ", ".join(f"eval.{name}.{k}" for k in model.model_fields) or "none"
        raise ValueError(f"unknown key eval.{name}.{unknown[0]}; its keys: {known}")
    if getattr(entry.evaluator_class, "flat_keys", False):
        return dict(values)
    try:
        model(**values)
    except ValidationError as error:
        key, _, message, value = first_problem(error)
        raise ValueError(f"eval.{name}.{key}={shown(value)}: {message}" if key else f"eval.{name}: {message}") from None
    return dict(values)
