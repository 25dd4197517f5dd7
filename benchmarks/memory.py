"""Peak memory of a CIFAR-sized load and the start of pretraining: bytes stored, floats per batch.

Writes CIFAR-10's python batches (5 x 10,000 training and 10,000 test images of random bytes:
the real format and size) to a temporary folder, then, in a fresh Python process per code tree,
measures the resident memory above the process's own after imports while it runs
``prepare_data`` and ``train`` for a few updates of the default model (what a trial holds while
it pretrains; the evaluation afterwards reads the labelled splits as float32 either way).
Linux only (``/proc/self/status``). Nothing is asserted; the numbers are printed, and with
``--json`` written as one JSON object.

    python -m benchmarks.memory                          # this checkout
    python -m benchmarks.memory --against ../main        # and another checkout (e.g. before a change)
"""

from __future__ import annotations

import argparse
import json
import os
import pickle
import subprocess
import sys
import tempfile
from pathlib import Path

import numpy as np

# Run in the child: VmRSS after the imports, then VmHWM (the peak) after loading and training.
_CHILD = r"""
import json, sys, warnings
warnings.simplefilter("ignore")
from mae_core import Config, prepare_data, train

def status(key):
    for line in open("/proc/self/status"):
        if line.startswith(key):
            return int(line.split()[1]) * 1024
    raise KeyError(key)

import torch  # imported before the baseline: its own memory is no part of the load
base = status("VmRSS:")  # before Config: validating a file dataset once loaded it whole
config = Config(dataset="cifar10:" + sys.argv[1], steps=int(sys.argv[2]), batch_size=128, device="cpu",
                compile=False, checkpoint_every=0, log_every=1)
data = prepare_data(config)
train(config, data)
print(json.dumps({"baseline_rss": base, "peak_rss": status("VmHWM:")}))
"""


def write_cifar10(root: Path, per_batch: int = 10_000, seed: int = 0) -> int:
    """CIFAR-10 python batches data_batch_1..5 and test_batch of random bytes; returns the image count."""
    rng = np.random.default_rng(seed)
    names = [f"data_batch_{i}" for i in range(1, 6)] + ["test_batch"]
    for name in names:
        batch = {b"batch_label": name.encode(), b"labels": rng.integers(0, 10, per_batch).tolist(),
                 b"data": rng.integers(0, 256, (per_batch, 3072), dtype=np.uint8),
                 b"filenames": [b"x.png"] * per_batch}
        (root / name).write_bytes(pickle.dumps(batch, protocol=4))
    return per_batch * len(names)


def measure(tree: Path, dataset: Path, steps: int) -> dict[str, float]:
    """Peak resident MB above the post-import baseline, for the code in ``tree``."""
    env = {**os.environ, "PYTHONPATH": str(tree)}
    out = subprocess.run([sys.executable, "-c", _CHILD, str(dataset), str(steps)], env=env, cwd=tree,
                         capture_output=True, text=True, check=True)
    numbers = json.loads(out.stdout.strip().splitlines()[-1])
    return {"peak_above_baseline_mb": (numbers["peak_rss"] - numbers["baseline_rss"]) / 2**20,
            "peak_rss_mb": numbers["peak_rss"] / 2**20}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--against", type=Path, action="append", default=[],
                        help="another checkout to measure the same way (repeatable)")
    parser.add_argument("--steps", type=int, default=3, help="updates of the default model")
    parser.add_argument("--json", action="store_true", help="print one JSON object")
    args = parser.parse_args(argv)
    trees = {"this checkout": Path.cwd(), **{str(p): p.resolve() for p in args.against}}
    with tempfile.TemporaryDirectory() as folder:
        count = write_cifar10(Path(folder))
        results = {name: measure(tree, Path(folder), args.steps) for name, tree in trees.items()}
    report = {"images": count, "float32_bytes_mb": count * 3072 * 4 / 2**20,
              "uint8_bytes_mb": count * 3072 / 2**20, "steps": args.steps, "results": results}
    if args.json:
        print(json.dumps(report, indent=1))
    else:
        print(f"{count} CIFAR-sized images: {report['uint8_bytes_mb']:.0f} MB as bytes, "
              f"{report['float32_bytes_mb']:.0f} MB as float32")
        for name, numbers in results.items():
            print(f"  {name}: peak {numbers['peak_above_baseline_mb']:.0f} MB above the post-import "
                  f"baseline ({numbers['peak_rss_mb']:.0f} MB resident)")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
