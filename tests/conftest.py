"""Shared tiny-config helpers for the engine's property tests (two CPU cores, seconds per test)."""

from __future__ import annotations

import os

import pytest
import torch

from mae_core import Config

torch.set_num_threads(2)
# Ray and MLflow settings every test shares (and the subprocesses they start inherit).
os.environ.setdefault("RAY_AUTH_MODE", "disabled")
os.environ.setdefault("RAY_USAGE_STATS_ENABLED", "0")
os.environ.setdefault("RAY_AIR_NEW_OUTPUT", "0")
os.environ.setdefault("MLFLOW_LOGGING_LEVEL", "WARNING")

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


@pytest.fixture(scope="module")
def local_ray():
    """A two-CPU local Ray for the tests of one module, shut down after them."""
    import ray

    ray.init(address="local", num_cpus=2, include_dashboard=False, log_to_driver=False, configure_logging=False)
    yield
    ray.shutdown()


def pytest_collection_modifyitems(items):
    """Scenario tests (tests/scenarios: whole commands and Ray clusters under crashes, signals,
    faults and load) are all slow: ``make test-fast`` leaves them out, ``make test`` runs them."""
    for item in items:
        if "scenarios" in item.path.parts:
            item.add_marker(pytest.mark.slow)
