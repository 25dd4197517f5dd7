"""Side-by-side speed measurements, reported as ratios against a peer measured in the same run.

1. Training step (forward + backward + AdamW) of our MAE against ``transformers``'
   ``ViTMAEForPreTraining`` on an identical model; images/s, achieved FLOP/s and the fraction
   of this machine's own fp32 matmul peak. The two alternate (A B A B ...); medians reported.
2. Visible-only encoder against MAE Table 1c's mask-token-in-encoder variant (ρ = 0.75,
   decoder depth 1): the MAE paper reports 2.8×-4.1× wall-clock (Table 2).
3. Exact empirical risk: (image, mask) pairs per second over all C(16,4)=1,820 masks of digits.
4. ``torch.compile`` of the step model: compile time, speed-up, steps to break even.

Nothing here asserts a time; ``mae-study bench`` prints a table and writes JSON and Markdown.
"""

from __future__ import annotations

import json
import platform
import statistics
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch
from torch.utils.flop_counter import FlopCounterMode

from mae_core.config import Config
from mae_core.masking import sample_visible
from mae_core.models import build_model
from mae_core.objectives import empirical_mae_risk, masked_mse
from mae_core.targets import apply_target
from mae_core.data import prepare_data
from mae_core.optimizer import build_optimizer

# Under the working directory (in a checkout: the committed results), never inside an install.
RESULTS = Path("benchmarks") / "results"

# The reference model: image 32×32×3, patch 4 (M=64, q=48), ViT 192×6 (3 heads, MLP 768),
# decoder 128×2 (4 heads, MLP 512), ρ=0.75, normalised-pixel target, batch 128, fp32.
STEP_MODEL = dict(dataset="photos", patch_size=4, encoder_width=192, encoder_depth=6, encoder_heads=3,
                  decoder_width=128, decoder_depth=2, decoder_heads=4, mlp_ratio=4.0,
                  mask_ratio=0.75, target="norm_eps", batch_size=128, device="cpu")


def matmul_peak_gflops(size: int = 2048, repeats: int = 10) -> float:
    """This machine's fp32 matrix-multiply rate, measured now (best of ``repeats``)."""
    a, b = torch.randn(size, size), torch.randn(size, size)
    a @ b
    best = min(_seconds(lambda: a @ b) for _ in range(repeats))
    return 2 * size ** 3 / best / 1e9


def _seconds(fn: Callable[[], Any]) -> float:
    start = time.perf_counter()
    fn()
    return time.perf_counter() - start


def _alternate(steps: dict[str, Callable[[], None]], rounds: int, warmup: int = 3) -> dict[str, float]:
    """Median seconds per call of each step, run in alternation (A B A B ...)."""
    for fn in steps.values():
        for _ in range(warmup):
            fn()
    times: dict[str, list[float]] = {name: [] for name in steps}
    for _ in range(rounds):
        for name, fn in steps.items():
            times[name].append(_seconds(fn))
    return {name: statistics.median(values) for name, values in times.items()}


def _flops(fn: Callable[[], None]) -> int:
    counter = FlopCounterMode(display=False)
    with counter:
        fn()
    return counter.get_total_flops()


def our_step(config: Config, images: torch.Tensor, compiled: bool = False) -> Callable[[], None]:
    from mae_core.patches import patchify

    torch.manual_seed(0)
    model = build_model(config)
    optimizer = build_optimizer(model, config)
    forward = torch.compile(model) if compiled else model
    patches = patchify(images, config.resolved_patch_size)
    target = apply_target(patches, config.target)
    generator = torch.Generator().manual_seed(0)

    def step() -> None:
        visible = sample_visible(len(patches), config.num_patches, config.num_visible, generator)
        loss = masked_mse(forward(patches, visible), target, visible).mean()
        optimizer.zero_grad(set_to_none=True)
        loss.backward()
        optimizer.step()

    return step


def peer_model(config: Config):
    """``transformers``' ViTMAEForPreTraining with our config's sizes (the same model; the config
    mapping is :func:`mae_core.transformers_port.vitmae_config`), in its own initialisation."""
    from transformers import ViTMAEForPreTraining

    from mae_core.transformers_port import vitmae_config

    torch.manual_seed(0)
    return ViTMAEForPreTraining(vitmae_config(config))


def peer_step(config: Config, images: torch.Tensor) -> Callable[[], None]:
    peer = peer_model(config)
    optimizer = torch.optim.AdamW(peer.parameters(), lr=1e-4, betas=(0.9, 0.95), fused=True)

    def step() -> None:
        loss = peer(pixel_values=images).loss
        optimizer.zero_grad(set_to_none=True)
        loss.backward()
        optimizer.step()

    return step


def step_images(config: Config) -> torch.Tensor:
    """One batch of the step model's photo crops as images ``[B,C,H,W]`` (the peer takes pixels)."""
    from mae_core.patches import unpatchify

    patches = prepare_data(config.with_updates(train_limit=config.batch_size)).train_patches
    return unpatchify(patches, config.resolved_patch_size, config.image_shape)


def bench_training_step(peak: float, rounds: int) -> dict[str, float]:
    config = Config(**STEP_MODEL)
    images = step_images(config)
    ours, peer = our_step(config, images), peer_step(config, images)
    flops = _flops(ours)
    seconds = _alternate({"ours": ours, "peer": peer}, rounds)
    batch = config.batch_size
    return {
        "ours_images_per_s": batch / seconds["ours"], "peer_images_per_s": batch / seconds["peer"],
        "step_speedup_vs_peer": seconds["peer"] / seconds["ours"],
        "step_gflops": flops / seconds["ours"] / 1e9,
        "step_peak_fraction": flops / seconds["ours"] / 1e9 / peak,
    }


def bench_visible_only(rounds: int) -> dict[str, float]:
    config = Config(**{**STEP_MODEL, "decoder_depth": 1})
    images = torch.rand(config.batch_size, *config.image_shape)
    visible_only = our_step(config, images)
    with_tokens = our_step(config.with_updates(mask_token_in_encoder=True), images)
    seconds = _alternate({"visible_only": visible_only, "mask_token_in_encoder": with_tokens}, rounds)
    return {"visible_only_step_s": seconds["visible_only"],
            "mask_token_in_encoder_step_s": seconds["mask_token_in_encoder"],
            "visible_only_speedup": seconds["mask_token_in_encoder"] / seconds["visible_only"]}


def bench_compile(peak: float, rounds: int) -> dict[str, float | None]:
    """torch.compile on the step model: the first compiled step (compilation included; the
    inductor cache makes it much shorter on a second run), then eager, compiled and the peer
    alternated; the compiled step's speed-up over eager and over the peer, its peak fraction,
    and the number of steps after which compiling has paid for itself."""
    config = Config(**STEP_MODEL)
    images = step_images(config)
    steps = {"eager": our_step(config, images), "compiled": our_step(config, images, compiled=True)}
    first = _seconds(steps["compiled"])
    flops = _flops(steps["eager"])
    try:
        steps["peer"] = peer_step(config, images)
    except ImportError:
        pass
    seconds = _alternate(steps, rounds)
    saving = seconds["eager"] - seconds["compiled"]
    return {
        "compile_first_step_s": first,
        "compiled_step_speedup": seconds["eager"] / seconds["compiled"],
        "compiled_speedup_vs_peer": seconds["peer"] / seconds["compiled"] if "peer" in seconds else None,
        "compiled_peak_fraction": flops / seconds["compiled"] / 1e9 / peak,
        "compile_break_even_steps": first / saving if saving > 0 else None,
    }


def bench_exact_risk(peak: float, num_images: int) -> dict[str, float]:
    config = Config(dataset="digits")
    data = prepare_data(config)
    torch.manual_seed(0)
    model = build_model(config).eval()
    patches = data.train_patches[:num_images]
    pairs = num_images * config.num_visible_sets
    pair_flops = _flops(lambda: empirical_mae_risk(model, patches[:1], config.num_visible)) / config.num_visible_sets
    seconds = _seconds(lambda: empirical_mae_risk(model, patches, config.num_visible))
    return {"exact_risk_images": num_images, "exact_risk_pairs_per_s": pairs / seconds,
            "exact_risk_seconds": seconds,
            "exact_risk_peak_fraction": pair_flops * pairs / seconds / 1e9 / peak}


def run_benchmarks(quick: bool = False, sweep: bool = True) -> dict[str, Any]:
    torch.manual_seed(0)
    peak = matmul_peak_gflops()
    rounds = 5 if quick else 15
    results: dict[str, Any] = {
        "peak_gflops": peak, "torch": torch.__version__, "threads": torch.get_num_threads(),
        "machine": platform.processor() or platform.machine(), "quick": quick,
    }
    try:
        results.update(bench_training_step(peak, rounds))
    except ImportError:
        results.update(step_speedup_vs_peer=None, step_peak_fraction=None,
                       peer_missing="pip install -e '.[bench]' (transformers)")
    results.update(bench_visible_only(rounds))
    if not quick:  # a compile takes up to a minute
        results.update(bench_compile(peak, rounds))
    results.update(bench_exact_risk(peak, 50 if quick else 500))
    results["sweep_efficiency"] = None
    if sweep:
        from .sweep import bench_sweep

        results.update(bench_sweep())
    return results


def write_results(results: dict[str, Any], folder: Path = RESULTS) -> tuple[Path, Path]:
    folder.mkdir(parents=True, exist_ok=True)
    stem = "bench_quick" if results.get("quick") else "bench"
    json_path = folder / f"{stem}.json"
    json_path.write_text(json.dumps(results, indent=2, default=str) + "\n")
    rows = "\n".join(f"| `{k}` | {v:.4g} |" if isinstance(v, float) else f"| `{k}` | {v} |"
                     for k, v in results.items())
    md_path = folder / f"{stem}.md"
    md_path.write_text(f"# mae-study bench\n\n| measure | value |\n| --- | --- |\n{rows}\n")
    return json_path, md_path


def main(argv: list[str] | None = None) -> int:
    """``python -m benchmarks.bench [--quick] [--json] [--out DIR]`` (what ``mae-study bench`` runs)."""
    import argparse

    parser = argparse.ArgumentParser(prog="mae-study bench", description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="fewer rounds and images")
    parser.add_argument("--json", action="store_true", help="print one JSON object as the last line")
    parser.add_argument("--out", type=Path, default=RESULTS, help=f"results folder (default: {RESULTS})")
    args = parser.parse_args(argv)
    results = run_benchmarks(quick=args.quick)
    json_path, md_path = write_results(results, args.out)
    if args.json:
        print(json.dumps(results, default=str))
    else:
        print(md_path.read_text())
        print(f"written: {json_path} and {md_path}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
