"""One registry per choice: the one place each objective, target, corruption, mask sampler,
dataset format, encoder and evaluator is defined, built-in or a plugin's.

A plugin module (``--plugin``, a study file's ``plugins:``, the entry-point group
``mae_study.plugins``; :mod:`mae_core.plugins`) registers its parts with the decorators below,
as the built-ins do (:mod:`mae_core.builtin_parts`). The public contract (shapes: ``B`` images,
``M`` patches, ``q`` values each):

* ``@target(name, out_dim=None)`` on ``fn(patches[B,M,q]) -> [B,M,out_dim or q]``; the
  decoder predicts ``out_dim`` values per patch. Optional ``inverse(pred[B,M,out_dim],
  patches[B,M,q]) -> [B,M,q]`` draws a prediction as pixels (pictures are skipped without one);
  optional ``domain_check(chunks, what)`` refuses data outside the target's domain (``chunks``:
  patches ``[n,M,q]`` a part of the set at a time; raise a :class:`~mae_core.errors.UserError`).
* ``@corruption(name)`` on ``fn(patches[B,M,q], level: float, generator: torch.Generator)
  -> [B,M,q]`` (a new tensor; it must act on any shape, as it also corrupts ``[N,K,M,q]``).
* ``@dataset_format(kind)`` on ``fn(path: str) -> (train_images, train_labels, test_images,
  test_labels)``: images uint8 ``[N,H,W,C]`` (read as ``byte/255``), labels int ``[N]``;
  ``dataset=kind:PATH`` then works like a built-in format.
* ``@mask_sampler(name)`` on ``fn(batch_size, num_patches, num_visible, grid, generator)
  -> LongTensor[B,k]``: k distinct positions per image (sorted by the caller).
* ``@objective(name, label=...)`` on a subclass of :class:`Objective` (or of a built-in,
  :mod:`mae_core.objective_classes`): the class owns its draws (``draw`` -> ``Draw(visible,
  inputs)``), its loss (``loss``) and its risks (``risk_names``, ``risks``); ``masked`` and
  ``corrupted`` say which model it trains and which config keys apply. The flag form
  ``objective(name, masked=..., corrupted=...)`` still declares a built-in kind under a new name.
* ``@encoder(name)`` on ``factory(config, num_patches, patch_dim) -> Encoder`` (the protocol and
  its shapes: :mod:`mae_core.encoders`, re-exported here); ``encoder=name`` then builds it.
* ``@evaluator(name, metrics=[Metric(...)])`` on ``fn(model, config, data, *, baselines) ->
  dict[str, float]``: what a trained model is measured by, run when ``eval.evaluators`` lists
  it (default ``risks,probes``, the built-ins of :mod:`evaluation.evaluators`); its ``Metric``
  rows (:mod:`evaluation.metrics`) join the metric table every report reads.
  ``@register_evaluator`` (:mod:`mae_core.evaluator`) on an ``Evaluator`` subclass does the
  same for a class with typed ``eval.<name>.*`` settings and baselines.

This module imports no torch, so the config can list every name without it.
"""

from __future__ import annotations

import importlib
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Generic, TypeVar

from .encoders import ENCODERS, encoder  # noqa: F401  (the encoder registry, one import away)
from .errors import UserError

Entry = TypeVar("Entry")
_BUILTINS = "mae_core.builtin_parts"  # registers the built-in parts on first use of any registry


class UnknownName(UserError):
    """A name no registry entry carries (one line: the config key and the allowed names)."""


class DuplicateName(UserError):
    """Two different parts registered under one name."""


class Registry(Generic[Entry]):
    """Name -> entry for one config key, in registration order (built-ins first)."""

    def __init__(self, key: str, builtins: str = _BUILTINS):
        self.key = key  # the config key these names are the values of
        self.builtins = builtins  # the module that registers the built-in entries, imported on first use
        self._entries: dict[str, Entry] = {}

    def register(self, name: str, entry: Entry, function: Callable | None = None) -> Entry:
        """Add ``entry`` under ``name``; a second, different part under one name is refused
        (the same function defined again by a reloaded module is the same part)."""
        _ensure_builtins(self.builtins)
        if not isinstance(name, str) or not name or ":" in name or "," in name:
            raise UserError(f"{self.key}: {name!r} is not a usable name (text without ':' or ',')")
        old = self._entries.get(name)
        if old is not None and not _same_part(old, entry, function):
            raise DuplicateName(f"{self.key}={name!r} is registered twice ({_origin(old)} and "
                                f"{_origin(function or entry)})")
        self._entries[name] = entry
        return entry

    def get(self, name: str) -> Entry:
        """The entry of ``name``; an unknown name is :class:`UnknownName` naming the key and the choices."""
        _ensure_builtins(self.builtins)
        try:
            return self._entries[name]
        except (KeyError, TypeError):
            raise UnknownName(f"{self.key}={name!r} is not one of {self.allowed()}") from None

    def names(self) -> tuple[str, ...]:
        _ensure_builtins(self.builtins)
        return tuple(self._entries)

    def allowed(self, separator: str = ", ") -> str:
        return separator.join(self.names())

    def __contains__(self, name: object) -> bool:
        return name in self.names()

    def snapshot(self) -> dict[str, Entry]:
        """The entries as they are now (tests put them back with :meth:`restore`)."""
        _ensure_builtins(self.builtins)
        return dict(self._entries)

    def restore(self, entries: dict[str, Entry]) -> None:
        self._entries = dict(entries)


def _part(entry: Any, function: Callable | None = None) -> Any:
    return function or getattr(entry, "function", None) or entry


def _same_part(old: Any, new: Any, function: Callable | None) -> bool:
    before, after = _part(old), _part(new, function)
    if before is after:
        return True
    named = [(getattr(f, "__module__", None), getattr(f, "__qualname__", None)) for f in (before, after)]
    return callable(before) and callable(after) and None not in named[0] and named[0] == named[1]


def _origin(part: Any) -> str:
    part = _part(part)
    return f"{getattr(part, '__module__', '?')}.{getattr(part, '__qualname__', type(part).__name__)}"


_loading: set[str] = set()


def _ensure_builtins(module: str = _BUILTINS) -> None:
    """Import a registry's built-in parts once (lazily: the registries exist before their entries)."""
    if module not in _loading:
        _loading.add(module)
        importlib.import_module(module)


# ------------------------------------------------------------------------------ entries


class Objective:
    """An objective as a class (solo-learn's methods): what its updates draw beside ``I_t``
    (:meth:`draw`), its loss ``L_t`` (:meth:`loss`) and the test risks it is judged by
    (:meth:`risk_names`, :meth:`risks`). The built-ins, MAE, AE and DAE, are in
    :mod:`mae_core.objective_classes`; a plugin subclasses one of them (or this) and registers
    it with ``@objective(name, label=...)``.

    ``masked`` and ``corrupted`` say which model the objective trains and which config keys apply:
    ``masked`` the visible-only MAE on the ``k`` patches of ``V_t`` (``mask_ratio``,
    ``mask_token_in_encoder``), otherwise the bottleneck pair on all ``M`` patches
    (``latent_dim``); ``corrupted`` takes a ``corruption=``."""

    masked: bool = False  # the encoder sees the k visible patches of V_t; False: all M patches
    corrupted: bool = False  # the encoder's input is a corrupted copy X̃ (a corruption is required)
    # True when the draw reads the images (a corruption): every rank draws the global batch's
    reads_images: bool = False
    # why the draws cannot be made ahead into fixed buffers (capturable, CUDA graphs); None: they can
    capture_blocker: str | None = None

    def __init__(self, name: str, *, label: str = "", doc: str = ""):
        self.name, self.label, self.doc = name, label, doc

    def __repr__(self) -> str:
        return f"{type(self).__name__}(name={self.name!r}, label={self.label!r})"

    @property
    def function(self) -> type:
        """The class: what the registry compares when a module registers the name again."""
        return type(self)

    def risk_names(self) -> tuple[str, ...]:
        """The test risks a trial of this objective logs (:meth:`risks`)."""
        raise NotImplementedError

    def draw(self, clean, config, sampler, noise, batch_size=None):
        """What update t draws beside ``I_t`` for a batch of ``batch_size`` images (None: the
        ``B`` of ``clean [B,M,q]``, which is the global batch when :attr:`reads_images`), from
        ``sampler`` or ``noise`` (:meth:`noise_generator`): a :class:`~mae_core.objective_classes.Draw`.
        By default what :meth:`draw_ahead` draws, for a draw that does not read the images."""
        return self.draw_ahead(config, sampler, batch_size or len(clean))

    def draw_ahead(self, config, sampler, batch_size):
        """:meth:`draw` without the images, as the capturable loop draws it ahead."""
        raise NotImplementedError(f"objective={self.name} {self.capture_blocker or 'draws nothing ahead'}")

    def loss(self, predict, clean, target, draw):
        """``L_t``, a 0-d tensor; ``predict(*inputs)`` is the model's forward pass in fp32."""
        raise NotImplementedError

    def noise_generator(self, config, device, sampler):
        """The generator of the draws that are not the sampler's (the DAE's off the CPU)."""
        return sampler

    def risks(self, model, config, test) -> dict[str, float]:
        """The risks of :meth:`risk_names` of ``model`` on ``test [N,M,q]`` (on its device)."""
        raise NotImplementedError


@dataclass(frozen=True)
class Target:
    """``T`` applied patch by patch: ``function(patches[B,M,q]) -> [B,M,out_dim or q]``."""

    name: str
    function: Callable
    out_dim: int | None = None  # None: q, the patch's own width
    inverse: Callable | None = None  # (pred[B,M,out], patches[B,M,q]) -> pixels [B,M,q]; None: no pictures
    domain_check: Callable[[Iterable, str], None] | None = None  # (chunks of [n,M,q], what) -> None or raise
    min_patch_dim: int = 1  # q below this is refused at config time (a per-patch std needs q >= 2)
    label: str = ""  # how figures and tables write ``target=name`` ("pixel (w/ norm)"); empty: the name

    def width(self, patch_dim: int) -> int:
        """Values the decoder predicts per patch."""
        return self.out_dim if self.out_dim is not None else patch_dim


@dataclass(frozen=True)
class Corruption:
    """A draw of ``X̃``: ``function(patches[B,M,q], level, generator) -> [B,M,q]``."""

    name: str
    function: Callable
    level_at_most: float | None = None  # e.g. 1 for a fraction of the values
    label: str = ""  # how figures and tables write ``corruption=name`` ("salt & pepper"); empty: the name


@dataclass(frozen=True)
class MaskSampler:
    """``function(batch_size, num_patches, num_visible, grid, generator) -> LongTensor[B,k]``."""

    name: str
    function: Callable


@dataclass(frozen=True)
class DatasetFormat:
    """How ``dataset=kind:PATH`` is read.

    ``load(path: Path, ram_bytes: int) -> Splits`` (:class:`mae_core.formats.Splits`);
    ``image_shape(path) -> (C, H, W)`` without loading where it can (None: from a load);
    ``patch_size``: the default patch side, or None for the rule of
    :func:`mae_core.data.default_patch_size` (from the image size)."""

    kind: str
    load: Callable
    image_shape: Callable | None = None
    patch_size: int | None = None
    function: Callable | None = None  # a plugin's fn(path), for duplicate checks


@dataclass(frozen=True)
class Evaluator:
    """What a trial measures once it is trained: ``function(model, config, data, *, baselines)
    -> {metric name: value}`` (``model`` in eval mode on the trial's device, ``data`` its
    :class:`~mae_core.data.PatchData`, ``baselines`` the study's shared baseline cache or None).
    ``metrics``: the rows it logs (:class:`evaluation.metrics.Metric`: name, kind, label, unit,
    direction, ...), which the report, tables and claims read like the built-in ones; a
    trial fails on a metric its evaluator did not declare."""

    name: str
    function: Callable  # a class-based evaluator's entry: its class (mae_core.evaluator)
    metrics: tuple = ()
    doc: str = ""
    # @register_evaluator's: the mae_core.evaluator.Evaluator subclass and its pydantic Settings
    # (the eval.<name>.* keys); None for an @evaluator function, which has no keys of its own
    evaluator_class: type | None = None
    settings: type | None = None

    @property
    def during_training(self) -> bool:
        """Runs while the model trains (``online``), never listed in ``eval.evaluators``."""
        return bool(getattr(self.evaluator_class, "during_training", False))


objectives: Registry[Objective] = Registry("objective")
targets: Registry[Target] = Registry("target")
corruptions: Registry[Corruption] = Registry("corruption")
mask_samplers: Registry[MaskSampler] = Registry("mask_sampling")
dataset_formats: Registry[DatasetFormat] = Registry("dataset")
# The built-in evaluators (risks, probes) live a layer up, in the evaluation package, which this
# one never imports: their module is named here and imported on first use, as a plugin is (the
# config, in this layer, checks eval.evaluators against these names). The one arrow up by string
# that tests/test_layers.py allows.
evaluators: Registry[Evaluator] = Registry("eval.evaluators", builtins="evaluation.evaluators")


# --------------------------------------------------------------------------- decorators


def objective(name: str, *, masked: bool | None = None, corrupted: bool = False, doc: str = "",
              label: str = ""):
    """Declare ``objective=name``. As a class decorator, ``@objective(name, label=...)`` on a
    subclass of :class:`Objective` registers an instance of it (``label``: how figures and tables
    write it; empty: the name; ``doc``: its docstring when empty).

    The flag form of before issue 37, ``objective(name, masked=..., corrupted=...)``, still
    declares one of the three built-in kinds under a new name: ``masked`` the MAE, ``corrupted``
    the DAE, neither the AE. Not both: no risk of the spec judges a masked model on corrupted
    inputs."""
    if masked is None:
        def register(cls: type) -> type:
            if not (isinstance(cls, type) and issubclass(cls, Objective)):
                raise UserError(f"objective {name!r}: @objective decorates a subclass of "
                                f"mae_core.registry.Objective, not {cls!r}")
            objectives.register(name, cls(name, label=label, doc=doc or (cls.__doc__ or "").strip()), cls)
            return cls
        return register
    if masked and corrupted:
        raise UserError(f"objective {name!r}: masked or corrupted, not both (no risk of the spec covers both)")
    kind = type(objectives.get("mae" if masked else "dae" if corrupted else "ae"))
    return objectives.register(name, kind(name, label=label, doc=doc))


def target(name: str, out_dim: int | None = None, *, inverse: Callable | None = None,
           domain_check: Callable | None = None, min_patch_dim: int = 1, label: str = "") -> Callable:
    """Register ``fn(patches[B,M,q]) -> [B,M,out_dim or q]`` as ``target=name`` (``label``: how
    figures and tables write it; empty: the name)."""
    if out_dim is not None and (not isinstance(out_dim, int) or out_dim < 1):
        raise UserError(f"target {name!r}: out_dim={out_dim!r} must be a positive integer or None")

    def register(fn: Callable) -> Callable:
        targets.register(name, Target(name, fn, out_dim, inverse, domain_check, min_patch_dim, label), fn)
        return fn
    return register


def corruption(name: str, *, level_at_most: float | None = None, label: str = "") -> Callable:
    """Register ``fn(patches[B,M,q], level, generator) -> [B,M,q]`` as ``corruption=name``
    (``label``: how figures and tables write it; empty: the name)."""
    def register(fn: Callable) -> Callable:
        corruptions.register(name, Corruption(name, fn, level_at_most, label), fn)
        return fn
    return register


def mask_sampler(name: str) -> Callable:
    """Register ``fn(batch_size, num_patches, num_visible, grid, generator) -> LongTensor[B,k]``
    as ``mask_sampling=name``."""
    def register(fn: Callable) -> Callable:
        mask_samplers.register(name, MaskSampler(name, fn), fn)
        return fn
    return register


def dataset_format(kind: str) -> Callable:
    """Register ``fn(path) -> (train_images, train_labels, test_images, test_labels)`` (uint8
    ``[N,H,W,C]`` images, int ``[N]`` labels) as ``dataset=kind:PATH``."""
    def register(fn: Callable) -> Callable:
        dataset_formats.register(kind, DatasetFormat(kind, _array_loader(kind, fn), function=fn), fn)
        return fn
    return register


def evaluator(name: str, *, metrics: Iterable = (), doc: str = "") -> Callable:
    """Register ``fn(model, config, data, *, baselines) -> dict[str, float]`` as an evaluator
    that ``eval.evaluators`` can list; ``metrics``: the :class:`evaluation.metrics.Metric` rows
    it logs (each name new to the table, or one of the built-in rows it computes again)."""
    rows = tuple(metrics)
    for row in rows:
        if not isinstance(getattr(row, "name", None), str) or not hasattr(row, "lower_is_better"):
            raise UserError(f"evaluator {name!r}: metrics must be evaluation.metrics.Metric rows, not {row!r}")

    def register(fn: Callable) -> Callable:
        evaluators.register(name, Evaluator(name, fn, rows, doc or (fn.__doc__ or "").strip()), fn)
        return fn
    return register


def _array_loader(kind: str, fn: Callable) -> Callable:
    """``fn(path)``'s four arrays -> the :class:`~mae_core.formats.Splits` a built-in reader gives."""
    def load(path: Path, ram_bytes: int):
        from .formats import DataError, array_splits
        from .plugin_checks import call_part

        where = f"dataset={kind}:{path}"
        try:
            arrays = call_part(f"dataset={kind}", fn, str(path))
        except UserError:
            raise
        except Exception as error:  # the plugin's reader failing on this file: one line, as a built-in's
            raise DataError(f"{where}: the format's reader failed: {type(error).__name__}: "
                            f"{' '.join(str(error).split())}") from None
        return array_splits(arrays, where)
    return load
