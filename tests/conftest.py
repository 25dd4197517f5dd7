"""Shared tiny-config helpers for the engine's property tests (two CPU cores, seconds per test)."""

from __future__ import annotations

import contextlib
import functools
import io
import os
import shutil
import sqlite3
import sys
import tempfile
from dataclasses import dataclass
from pathlib import Path

import pytest
import torch

from mae_core import Config
from studies.environment import quiet_libraries

# One intra-op thread per test process. The models here are tiny, so a second thread buys nothing,
# and on a busy machine two spin-waiting threads made a 2 s trial take 6 s; the suite runs in two
# xdist processes on two cores instead (the Makefile). A study's trial under Ray gets one too
# (OMP_NUM_THREADS), and tests/test_probes.py's pinned numbers were computed with one. The
# variable gives the commands and benches tests start as subprocesses one thread too.
torch.set_num_threads(1)
os.environ.setdefault("OMP_NUM_THREADS", "1")
# Ray and MLflow settings every test shares (and the subprocesses they start inherit).
quiet_libraries()

# A model small enough that one forward/backward on a handful of images takes milliseconds.
TINY_MODEL = dict(encoder_width=16, encoder_depth=1, encoder_heads=2,
                  decoder_width=8, decoder_depth=1, decoder_heads=2, latent_dim=4)


def tiny_config(**overrides) -> Config:
    """digits (8x8, patch 2: M=16, q=4), a one-block model, a few images and steps."""
    keys = dict(dataset="digits", train_limit=64, test_limit=16, batch_size=8, steps=5,
                log_every=1, device="cpu", **TINY_MODEL)
    keys.update(overrides)
    return Config(**keys)


def timm_missing() -> str | None:
    """Why ``encoder=timm:NAME`` cannot be built here (None: it can); its tests skip with this reason."""
    from mae_core.timm_encoder import _import_timm

    try:
        _import_timm()
    except ValueError as error:
        return str(error)
    return None


def shared_ray() -> None:
    """The suite's one two-CPU local Ray, started by the first test that asks and kept for the
    next (a start costs seconds); a test that needs a Ray of its own shuts it down first
    (:func:`own_ray`) and the next user starts it again."""
    import ray

    if not ray.is_initialized():
        ray.init(address="local", num_cpus=2, include_dashboard=False, log_to_driver=False, configure_logging=False)


@pytest.fixture
def local_ray():
    shared_ray()
    yield


@dataclass
class Command:
    """What ``mae-study ARGS`` returned and printed."""
    returncode: int
    stdout: str
    stderr: str


def run_cli(args: list[str], cwd: Path) -> Command:
    """``mae-study ARGS`` in ``cwd``, in this process, on the shared Ray: no interpreter, Ray or
    fresh store to start. For commands whose driver need not receive a signal; those run as
    subprocesses (tests/scenarios/test_interrupts.py)."""
    from studies.cli import main

    shared_ray()
    out, err = io.StringIO(), io.StringIO()
    with contextlib.chdir(cwd), contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
        try:
            status = main(args)
        except SystemExit as stop:
            status = stop.code if isinstance(stop.code, int) else 1
    return Command(status, out.getvalue(), err.getvalue())


def own_ray() -> None:
    """Shut down the shared Ray before a test starts a Ray of other resources or a cluster.

    Ray is looked up, never imported: a session that never imported it has no Ray to shut down,
    and the device tests (benchmarks/gpu_check.sh) run on an image where it is not installed."""
    ray = sys.modules.get("ray")
    if ray is not None and ray.is_initialized():
        ray.shutdown()


# ------------------------------------------------------------ MLflow stores, migrated once

@functools.cache
def migrated_store() -> Path:
    """An empty MLflow SQLite store with every migration applied, made once per test process.

    A fresh store runs MLflow's migrations (about 2 s on two cores); the suite opens dozens, so
    each starts as a copy of this one instead (:func:`copy_migrated_store`, and the patch below
    for stores a test's own process creates)."""
    from mlflow.store.tracking.sqlalchemy_store import SqlAlchemyStore

    folder = Path(tempfile.mkdtemp(prefix="mae-test-store-"))
    SqlAlchemyStore(f"sqlite:///{folder}/mlflow.db", str(folder / "artifacts")).engine.dispose()
    return folder / "mlflow.db"


def copy_migrated_store(path: Path) -> Path:
    """Place a migrated empty store at ``path`` (for a command a test starts as a subprocess)."""
    path.parent.mkdir(parents=True, exist_ok=True)
    shutil.copyfile(migrated_store(), path)
    return path


def seed_command_store(args: list[str], cwd: Path) -> None:
    """Before a test starts ``mae-study ARGS`` in ``cwd`` as a subprocess: a migrated store where
    ``train``/``run`` open their default one (``--out``'s mlflow.db), unless one is there."""
    if not args or args[0] not in ("train", "run") or "--tracking-uri" in args:
        return
    from studies.cli.common import DEFAULT_OUT  # train's --out defaults to the working folder

    out = args[args.index("--out") + 1] if "--out" in args else ("." if args[0] == "train" else DEFAULT_OUT)
    store = Path(cwd) / out / "mlflow.db"
    if not store.exists():
        copy_migrated_store(store)


def _initialize_from_migrated(engine, original) -> None:
    """``mlflow.store.db.utils._initialize_tables`` for SQLite files: copy the migrated store in."""
    database = engine.url.database
    if engine.url.get_backend_name() != "sqlite" or not database or database == ":memory:":
        return original(engine)
    with sqlite3.connect(migrated_store()) as source, sqlite3.connect(database) as target:
        source.backup(target)
    return None


@pytest.fixture
def fresh_plugins(monkeypatch):
    """The test starts and ends with only the built-in parts registered and no plugin loaded."""
    from mae_core import plugins, registry

    registries = [registry.targets, registry.corruptions, registry.mask_samplers, registry.dataset_formats,
                  registry.evaluators, registry.objectives]
    saved = [r.snapshot() for r in registries]
    monkeypatch.setattr(plugins, "_loaded", {})
    monkeypatch.setenv(plugins.ENVIRONMENT_VARIABLE, "")
    modules = set(sys.modules)
    yield
    for r, entries in zip(registries, saved):
        r.restore(entries)
    for name in set(sys.modules) - modules:
        if name.startswith("mae_study_plugin_"):
            del sys.modules[name]


# A study with a claim, small enough for seeds by need (tests/test_seed_flags.py, scenarios/test_seeds_by_need.py)
SEEDS_BY_NEED_STUDY = """\
name: seeds_by_need
base: {dataset: digits}
axes: {mask_ratio: [0.5, 0.75]}
seeds: [0, 1]
reference: {mask_ratio: 0.75}
claims:
  - {name: half_masked_linear, metric: probe_linear_acc, kind: vs_reference, delta: 0.0001}
"""


@pytest.fixture(autouse=True, scope="session")
def _stores_start_migrated():
    try:
        from mlflow.store.db import utils
    except ImportError:  # benchmarks/gpu_check.sh runs the device tests where MLflow is not installed
        yield
        return

    original = utils._initialize_tables
    migrated_store()
    utils._initialize_tables = functools.partial(_initialize_from_migrated, original=original)
    yield
    utils._initialize_tables = original
    shutil.rmtree(migrated_store().parent, ignore_errors=True)


@pytest.fixture(autouse=True, scope="session")
def _ray_down_at_the_end():
    yield
    own_ray()


def pytest_collection_modifyitems(items):
    """Scenario tests (tests/scenarios: whole commands and Ray clusters under crashes, signals,
    faults and load) are all slow: ``make test-fast`` leaves them out, ``make test`` runs them."""
    for item in items:
        if "scenarios" in item.path.parts:
            item.add_marker(pytest.mark.slow)
