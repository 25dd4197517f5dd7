"""A pytest plugin (``-p blocked_imports``) that makes ``import ray`` and ``import mlflow`` fail,
as on the bare CUDA image benchmarks/gpu_check.sh runs its device tests on (issue 36: the suite's
conftest imported Ray at teardown there). ``sys.modules[name] = None`` is Python's own way to make
an import raise ImportError."""

import sys

for name in ("ray", "mlflow"):
    sys.modules[name] = None
