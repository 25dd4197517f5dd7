#!/usr/bin/env bash
# The GPU issue's device check as one command for the device tool (a bare CUDA image: Python
# 3.12, torch, transformers, numpy, scikit-learn; no pydantic, Ray or MLflow). Prepare here with
# `make gpu-wheels` (pydantic's wheels into .gpu-wheels/, git-ignored), then run there with
# carry [".gpu-wheels"] and:  bash benchmarks/gpu_check.sh
# It runs the bf16 tests of every model variant on CUDA, then the bench (well inside 10 minutes);
# the results land in $OUT (or benchmarks/results without it).
set -euo pipefail
cd "$(dirname "$0")/.."
export PYTHONUNBUFFERED=1 PYTHONPATH="$PWD"
python -m pip install --quiet --no-index --find-links .gpu-wheels pydantic pyyaml rich 2>/dev/null \
  || python -m pip install --quiet --no-index .gpu-wheels/*.whl
nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv
out="${OUT:-benchmarks/results}"
MAE_TEST_DEVICE=cuda python -m pytest -q -p no:cacheprovider tests/test_precision.py 2>&1 | tee "$out/gpu_precision_tests.txt"
python -m benchmarks.bench_cuda --out "$out"
