"""The GPU check's test list (benchmarks/gpu_check.sh) runs on a bare CUDA image without Ray or
MLflow (issue 36: ``tests/conftest.py`` imported Ray at teardown there and errored)."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]


@pytest.mark.slow  # a second pytest in a subprocess: about 10 s on two cores
def test_the_device_tests_run_where_ray_and_mlflow_cannot_be_imported():
    # Collects the whole conftest and runs its session fixtures (the MLflow store, Ray's shutdown
    # at the end) with both imports failing, as gpu_check.sh runs every device test.
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(ROOT), str(ROOT / "tests"), os.environ.get("PYTHONPATH", "")])}
    done = subprocess.run(
        [sys.executable, "-m", "pytest", "-p", "blocked_imports", "-p", "no:cacheprovider",
         "tests/test_linear_head.py::test_the_head_trains_on_the_device_and_reads_the_host_once_per_path",
         "tests/test_objectives_device.py::test_the_sync_count_is_of_synchronizing_calls_not_torchs_notice"],
        cwd=ROOT, env=env, capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stdout + done.stderr
    assert "2 passed" in done.stdout and "error" not in done.stdout.lower(), done.stdout


def test_the_blocking_plugin_makes_both_imports_fail():
    code = "import blocked_imports\nfor name in ('ray', 'mlflow'):\n    try:\n        __import__(name)\n    except ImportError:\n        print(name, 'blocked')"
    env = {**os.environ, "PYTHONPATH": str(ROOT / "tests")}
    done = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=60)
    assert done.stdout.split("\n")[:2] == ["ray blocked", "mlflow blocked"], done.stdout + done.stderr
