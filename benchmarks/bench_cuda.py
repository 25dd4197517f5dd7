"""GPU measurements in one script that finishes well inside ten minutes on one H200.

    python -m benchmarks.bench_cuda [--out DIR]           # on a CUDA machine
    python -m benchmarks.bench_cuda --tiny --device cpu   # the same code paths in seconds, anywhere

It needs ``mae_core`` (torch, pydantic, numpy, scikit-learn) and, for the peer, ``transformers``;
not Ray or MLflow, which a bare GPU image may lack. Every number is measured in this run:

1. ``peak_tflops``: the bf16 matrix-multiply rate at 8192³ (best of several), the yardstick;
2. ViT-B/16 MAE at 224 px (encoder 768×12, decoder 512×8, ρ = 0.75, batch 256, bf16 autocast,
   fused AdamW): our step and ``transformers``' ``ViTMAEForPreTraining``, each eager and under
   ``torch.compile``; images/s, TFLOP/s, fraction of the peak, peak memory; ratios against the
   peer's *best* (never its eager step alone);
3. the same model in the trainer's own loop (``mae_core.train.train``: sampling, the divergence
   watch and logging included), time per update from two run lengths (setup cancels out);
4. the default digits run (2,000 updates): training seconds, per update, and its test risk;
5. the exact masked risk on digits: (image, mask) pairs per second.

Results go to ``benchmarks/results/bench_cuda.json`` and ``.md`` (``--out`` to change).
"""

from __future__ import annotations

import argparse
import json
import platform
import statistics
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
import torch
from torch.utils.flop_counter import FlopCounterMode

from mae_core.config import Config
from mae_core.masking import sample_visible
from mae_core.models import build_model
from mae_core.objectives import empirical_mae_risk, masked_mse
from mae_core.patches import patchify
from mae_core.precision import autocast
from mae_core.targets import apply_target
from mae_core.train import build_optimizer, prepare_data, train

RESULTS = Path("benchmarks") / "results"
VIT_B = dict(patch_size=16, encoder_width=768, encoder_depth=12, encoder_heads=12, decoder_width=512,
             decoder_depth=8, decoder_heads=16, mlp_ratio=4.0, mask_ratio=0.75, target="norm_eps",
             batch_size=256, precision="bf16")
# --tiny: every code path in seconds on a CPU (numbers meaningless, for checking the script only)
TINY = dict(patch_size=8, encoder_width=32, encoder_depth=1, encoder_heads=2, decoder_width=16,
            decoder_depth=1, decoder_heads=2, mlp_ratio=2.0, mask_ratio=0.75, target="norm_eps",
            batch_size=8, precision="bf16")


def synchronize(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def timed(fn: Callable[[], Any], device: torch.device) -> float:
    synchronize(device)
    start = time.perf_counter()
    fn()
    synchronize(device)
    return time.perf_counter() - start


def median_seconds(fn: Callable[[], None], device: torch.device, rounds: int, warmup: int = 3) -> float:
    for _ in range(warmup):
        fn()
    return statistics.median(timed(fn, device) for _ in range(rounds))


def peak_tflops(device: torch.device, size: int) -> float:
    """bf16 matmul rate (fp32 on a CPU, where bf16 matmuls are emulated)."""
    dtype = torch.bfloat16 if device.type == "cuda" else torch.float32
    a, b = (torch.randn(size, size, device=device, dtype=dtype) for _ in range(2))
    best = min(timed(lambda: a @ b, device) for _ in range(10))
    return 2 * size ** 3 / best / 1e12


def step_flops(fn: Callable[[], None]) -> int:
    counter = FlopCounterMode(display=False)
    with counter:
        fn()
    return counter.get_total_flops()


def image_dataset(shape: tuple[int, int, int], count: int, folder: Path) -> str:
    """An npz of ``count`` random uint8 images of ``shape`` (C, H, W): a dataset spec for Config."""
    rng = np.random.default_rng(0)
    path = folder / f"images_{shape[1]}.npz"
    np.savez(path, images=rng.integers(0, 256, (count, *shape), dtype=np.uint8),
             labels=rng.integers(0, 10, count))
    return f"npz:{path}"


# ----------------------------------------------------------------------------- the steps


def our_step(config: Config, images: torch.Tensor, device: torch.device, compiled: bool) -> Callable[[], None]:
    torch.manual_seed(0)
    model = build_model(config).to(device)
    optimizer = build_optimizer(model, config)
    forward = torch.compile(model) if compiled else model
    patches = patchify(images, config.resolved_patch_size).to(device)
    target = apply_target(patches, config.target)
    generator = torch.Generator().manual_seed(0)

    def step() -> None:
        visible = sample_visible(len(patches), config.num_patches, config.num_visible, generator).to(device)
        with autocast(config.precision, device):
            pred = forward(patches, visible)
        loss = masked_mse(pred.float(), target, visible).mean()
        optimizer.zero_grad(set_to_none=True)
        loss.backward()
        optimizer.step()

    return step


def peer_step(config: Config, images: torch.Tensor, device: torch.device, compiled: bool) -> Callable[[], None]:
    from .bench import peer_model

    peer = peer_model(config).to(device)
    optimizer = torch.optim.AdamW(peer.parameters(), lr=1e-4, betas=(0.9, 0.95), fused=True)
    forward = torch.compile(peer) if compiled else peer
    pixels = images.to(device)

    def step() -> None:
        with autocast(config.precision, device):
            loss = forward(pixel_values=pixels).loss
        optimizer.zero_grad(set_to_none=True)
        loss.float().backward()
        optimizer.step()

    return step


def say(text: str) -> None:
    print(f"[{time.strftime('%H:%M:%S')}] {text}", flush=True)


def bench_large_model(config: Config, device: torch.device, peak: float, rounds: int,
                      compile_too: bool) -> dict[str, Any]:
    """Ours and the peer, eager and (with ``compile_too``) compiled, one after the other."""
    images = torch.rand(config.batch_size, *config.image_shape)
    flops = step_flops(our_step(config, images, device, compiled=False))
    results: dict[str, Any] = {"vit_step_tflop": flops / 1e12}
    best_peer = None
    for name, make in (("ours", our_step), ("peer", peer_step)):
        for compiled in (False, True) if compile_too else (False,):
            key = f"{name}_{'compiled' if compiled else 'eager'}"
            say(f"step: {key}")
            try:
                step = make(config, images, device, compiled)
            except ImportError:
                results[f"{key}_images_per_s"] = None
                continue
            if device.type == "cuda":
                torch.cuda.reset_peak_memory_stats(device)
            first = timed(step, device)  # compilation included
            seconds = median_seconds(step, device, rounds)
            results[f"{key}_first_step_s"] = first
            results[f"{key}_images_per_s"] = config.batch_size / seconds
            results[f"{key}_tflops"] = flops / seconds / 1e12
            results[f"{key}_peak_fraction"] = flops / seconds / 1e12 / peak
            if device.type == "cuda":
                results[f"{key}_peak_memory_gib"] = torch.cuda.max_memory_allocated(device) / 2 ** 30
            if name == "peer":
                best_peer = max(best_peer or 0.0, results[f"{key}_images_per_s"])
            del step
            if device.type == "cuda":
                torch.cuda.empty_cache()
    ours_best = max(results.get("ours_eager_images_per_s") or 0.0, results.get("ours_compiled_images_per_s") or 0.0)
    results["ours_best_vs_peer_best"] = ours_best / best_peer if best_peer else None
    return results


def bench_trainer_loop(config: Config, device: torch.device, peak_flops: float, step_tflop: float,
                       short: int, long: int) -> dict[str, float]:
    """Per-update time of ``train()`` itself: (T(long) - T(short)) / (long - short)."""
    def run(steps: int) -> float:
        return timed(lambda: train(config.with_updates(steps=steps, log_every=max(1, steps // 4)), data), device)

    data = prepare_data(config)
    run(short)  # warm-up: cuDNN/cuBLAS heuristics, allocator
    per_update = (run(long) - run(short)) / (long - short)
    return {"trainer_update_s": per_update, "trainer_images_per_s": config.batch_size / per_update,
            "trainer_peak_fraction": step_tflop / per_update / peak_flops}


def bench_digits(device: torch.device, steps: int, test_images: int | None = None) -> dict[str, float]:
    """The default digits run as ``mae-study train`` does it (2,000 updates), and its exact test
    risk (on the first ``test_images`` only, when given: --tiny)."""
    config = Config(dataset="digits", device=device.type, steps=steps)
    data = prepare_data(config)
    result: dict[str, Any] = {}
    seconds = timed(lambda: result.update(run=train(config, data)), device)
    model = result["run"].model
    risk = empirical_mae_risk(model, data.test_patches[:test_images].to(device), config.num_visible, config.target)
    return {"digits_steps": steps, "digits_train_s": seconds, "digits_update_ms": 1000 * seconds / steps,
            "digits_test_mae_risk": risk.value}


def bench_exact_risk(device: torch.device, num_images: int) -> dict[str, float]:
    config = Config(dataset="digits", device=device.type)
    data = prepare_data(config)
    torch.manual_seed(0)
    model = build_model(config).to(device).eval()
    patches = data.train_patches[:num_images].to(device)
    empirical_mae_risk(model, patches[:2], config.num_visible)  # warm-up
    seconds = timed(lambda: empirical_mae_risk(model, patches, config.num_visible), device)
    return {"exact_risk_images": num_images,
            "exact_risk_pairs_per_s": num_images * config.num_visible_sets / seconds}


def run(device: torch.device, tiny: bool) -> dict[str, Any]:
    torch.manual_seed(0)
    if device.type == "cuda":
        torch.backends.cuda.matmul.allow_tf32 = True
        torch.backends.cudnn.allow_tf32 = True
    results: dict[str, Any] = {
        "device": torch.cuda.get_device_name(device) if device.type == "cuda" else platform.processor() or "cpu",
        "torch": torch.__version__, "date": time.strftime("%Y-%m-%d"), "tiny": tiny,
    }
    peak = peak_tflops(device, 512 if tiny else 8192)
    results["peak_tflops"] = peak
    say(f"peak {peak:.4g} TFLOP/s")
    with tempfile.TemporaryDirectory() as folder:
        shape = (3, 32, 32) if tiny else (3, 224, 224)
        spec = image_dataset(shape, 32 if tiny else 1024, Path(folder))
        config = Config(dataset=spec, device=device.type, **(TINY if tiny else VIT_B))
        results.update(bench_large_model(config, device, peak, rounds=3 if tiny else 10,
                                         compile_too=device.type == "cuda"))
        say("trainer loop")
        results.update(bench_trainer_loop(config, device, peak, results["vit_step_tflop"],
                                          short=2 if tiny else 10, long=4 if tiny else 40))
    say("digits run")
    results.update(bench_digits(device, 20 if tiny else 2000, 8 if tiny else None))
    say("exact risk")
    results.update(bench_exact_risk(device, 8 if tiny else 500))
    return results


def write(results: dict[str, Any], folder: Path) -> tuple[Path, Path]:
    folder.mkdir(parents=True, exist_ok=True)
    stem = "bench_cuda_tiny" if results["tiny"] else "bench_cuda"
    json_path, md_path = folder / f"{stem}.json", folder / f"{stem}.md"
    json_path.write_text(json.dumps(results, indent=2, default=str) + "\n")
    rows = "\n".join(f"| `{k}` | {v:.4g} |" if isinstance(v, float) else f"| `{k}` | {v} |"
                     for k, v in results.items())
    md_path.write_text(f"# mae-study bench on {results['device']} ({results['date']})\n\n"
                       f"| measure | value |\n| --- | --- |\n{rows}\n")
    return json_path, md_path


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m benchmarks.bench_cuda", description=__doc__.splitlines()[0])
    parser.add_argument("--device", default="cuda", choices=("cuda", "cpu"))
    parser.add_argument("--tiny", action="store_true", help="tiny sizes: checks the code paths in seconds")
    parser.add_argument("--out", type=Path, default=RESULTS)
    args = parser.parse_args(argv)
    if args.device == "cuda" and not torch.cuda.is_available():
        parser.error("--device cuda: no CUDA device here (use --device cpu --tiny to check the script)")
    results = run(torch.device(args.device), args.tiny)
    json_path, md_path = write(results, args.out)
    print(md_path.read_text())
    print(f"written: {json_path} and {md_path}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
