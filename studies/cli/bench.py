"""``mae-study bench``: the benchmarks of the source checkout."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from .common import UsageError


def cmd_bench(args: argparse.Namespace) -> int:
    """Runs ``python -m benchmarks.bench`` from the source checkout: the benchmarks sit above the
    studies (they drive them), so the CLI starts them rather than importing them."""
    import subprocess

    if not Path("benchmarks", "bench.py").is_file():  # ``python -m`` finds it in the working directory
        raise UsageError("bench: the benchmarks live in the source checkout (benchmarks/); "
                         "run `mae-study bench` from its root")
    if args.device == "cuda":  # the GPU measurements: benchmarks/bench_cuda.py
        flags = ["--device", "cuda", *(["--out", args.out] if args.out else [])]
        return subprocess.call([sys.executable, "-m", "benchmarks.bench_cuda", *flags])
    flags = [*(["--quick"] if args.quick else []), *(["--json"] if args.json else []),
             *(["--out", args.out] if args.out else [])]
    return subprocess.call([sys.executable, "-m", "benchmarks.bench", *flags])
