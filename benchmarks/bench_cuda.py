"""GPU measurements in one script that keeps every value it measured, whatever happens later.

    python -m benchmarks.bench_cuda [--out DIR] [--budget-s S]    # on a CUDA machine
    python -m benchmarks.bench_cuda --device cpu --tiny            # every code path in seconds, anywhere

It needs ``mae_core`` (torch, pydantic, numpy, scikit-learn) and, for the peer, ``transformers``;
not Ray or MLflow, which a bare GPU image may lack. Every number is measured in this run, in
parts, each guarded on its own (an error is recorded with its part, and the next part runs):

1. ``peak``: the bf16 matrix-multiply rate at 8192³, the yardstick (fp32 at 512³ with --tiny on a CPU);
2. ``vit_flops``, ``ours_eager``, ``peer_eager``: ViT-B/16 MAE at 224 px (encoder 768×12,
   decoder 512×8, ρ = 0.75, batch 256, bf16 autocast, fused AdamW), our step and
   ``transformers``' ``ViTMAEForPreTraining``; images/s, TFLOP/s, fraction of the peak, memory;
3. ``trainer_loop``: the same model in the trainer's own loop (``mae_core.train.train``:
   sampling, the divergence watch and logging included), per update from two run lengths;
4. ``digits``: the default digits run (2,000 updates): training seconds and its exact test risk;
5. ``exact_risk``: the exact masked risk on digits, (image, mask) pairs per second;
6. ``trial``: one mask_ratio trial (the study's reference cell, first seed; its smoke size with
   --tiny) without MLflow: pretraining and the whole evaluation (risks, probes, baselines,
   fine-tuning), each timed, and where the probes ran (issue 36);
7. ``compile_cost``: the digits model in the trainer's own loop (its update captured in a CUDA
   graph where the trainer captures it), eager and compiled: compile's cost (the compiled run's
   extra seconds, cold and warm inductor cache) and its gain per update, and what
   ``compile=auto`` (:mod:`mae_core.compile_policy`) would decide from them for the default run;
8. ``ours_compiled``, ``peer_compiled``: both steps under ``torch.compile`` (last: the longest).
``summary`` (ours' best against the peer's *best*; ViT-B/16's compile cost, gain per update and
break-even from ``ours_eager`` and ``ours_compiled``) is derived from whatever was measured.

How it times: device work with CUDA events around each of at least 10 repetitions after a
warm-up (``time.perf_counter`` on a CPU), the median reported; the peak takes the fastest
repetition. The timed steps copy nothing from the host: both get the same images on the device
beforehand, and each computes its own target and draws its own masks on the device inside the
step. TF32 is on only inside the ViT-B parts (2, 3, 6); the digits run and the risks keep
PyTorch's default fp32 matmuls.

The JSON (``bench_cuda.json``, ``bench_cuda_tiny.json`` with --tiny) is rewritten atomically after
every value: a part reads ``running`` while it runs, then ``ok``, ``error`` (with the error text),
``skipped`` (past ``--budget-s``) or ``interrupted`` (SIGTERM/SIGINT). The Markdown table is
written beside it. Test hooks: ``MAE_BENCH_FAIL=part[,part]`` makes those parts raise;
``MAE_BENCH_STALL_AFTER=part`` sleeps after that part (to be killed).
"""

from __future__ import annotations

import argparse
import contextlib
import functools
import gc
import json
import os
import platform
import signal
import statistics
import tempfile
import time
import traceback
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import numpy as np
import torch
from torch.utils.flop_counter import FlopCounterMode

from mae_core.config import Config
from mae_core.models import build_model
from mae_core.objectives import empirical_mae_risk, masked_mse
from mae_core.patches import patchify
from mae_core.precision import autocast
from mae_core.compile_policy import CompileCost, decide, model_class
from mae_core.data import prepare_data
from mae_core.optimizer import build_optimizer
from mae_core.train import train
from mae_core.updates import batch_target, update_plan

RESULTS = Path("benchmarks") / "results"
MIN_REPS = 10  # every timed quantity is at least this many repetitions
VIT_B = dict(patch_size=16, encoder_width=768, encoder_depth=12, encoder_heads=12, decoder_width=512,
             decoder_depth=8, decoder_heads=16, mlp_ratio=4.0, mask_ratio=0.75, target="norm_eps",
             batch_size=256, precision="bf16")
# --tiny: every code path in seconds on a CPU (numbers meaningless, for checking the script only)
TINY = dict(patch_size=8, encoder_width=32, encoder_depth=1, encoder_heads=2, decoder_width=16,
            decoder_depth=1, decoder_heads=2, mlp_ratio=2.0, mask_ratio=0.75, target="norm_eps",
            batch_size=8, precision="bf16")
TINY_DIGITS = dict(patch_size=4, encoder_width=16, encoder_depth=1, encoder_heads=2, decoder_width=8,
                   decoder_depth=1, decoder_heads=2, batch_size=8)  # M=4, k=1: 4 masks per image
# --tiny's trial: the smoke trial shrunk further (its evaluators all run; its numbers mean nothing)
TINY_TRIAL = dict(TINY_DIGITS, train_limit=64, test_limit=16, steps=4, risk_exact_budget=8, risk_mc_masks=2,
                  **{"eval.finetune_steps": 2, "eval.scratch_max_steps": 4})
PARTS = ("peak", "vit_flops", "ours_eager", "peer_eager", "trainer_loop", "digits", "exact_risk", "trial",
         "compile_cost", "ours_compiled", "peer_compiled")
DEFAULT_RUN_UPDATES = 2_000  # the default digits run, which compile=auto decides for in compile_cost
# The default budget on a GPU: the device check's whole run must end within 8 minutes, and
# gpu_check.sh gives the bench 300 s of them (then stops it; every value measured stays written).
# A part that would start after this many seconds is skipped, and recorded as skipped. None of
# this is measured yet: the compiled parts are expected to be the long ones (ECOSYSTEM_NOTES: a
# ViT-B compile took about 30 s in an earlier session; the peer's is unknown), so they come last.
GPU_BUDGET_S = 240.0


class BenchInterrupted(BaseException):
    """SIGTERM/SIGINT during a part: recorded, then the run stops."""


# ----------------------------------------------------------------------------- the record


class Record:
    """The results so far, rewritten (temp file + os.replace) after every value."""

    def __init__(self, folder: Path, meta: dict[str, Any]):
        folder.mkdir(parents=True, exist_ok=True)
        stem = "bench_cuda_tiny" if meta["tiny"] else "bench_cuda"
        self.json_path, self.md_path = folder / f"{stem}.json", folder / f"{stem}.md"
        self.data: dict[str, Any] = {"meta": meta, "parts": {}, "summary": {}}
        self.write()

    def part(self, name: str) -> dict[str, Any]:
        return self.data["parts"].setdefault(name, {"status": "pending", "values": {}})

    def value(self, name: str, part: str | None = None) -> Any:
        """A measured value by key (of ``part``, or of any part), or None."""
        for key, entry in self.data["parts"].items():
            if (part is None or key == part) and name in entry["values"]:
                return entry["values"][name]
        return None

    def set_status(self, name: str, status: str, **extra: Any) -> None:
        self.part(name).update(status=status, **extra)
        self.write()

    def put(self, part: str, key: str, value: Any) -> None:
        self.part(part)["values"][key] = value
        self.write()

    def write(self) -> None:
        self.data["summary"] = summary(self)
        _atomic_write(self.json_path, json.dumps(self.data, indent=2, default=str) + "\n")
        _atomic_write(self.md_path, markdown(self.data))


def _atomic_write(path: Path, text: str) -> None:
    fd, temp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".tmp")
    try:
        with os.fdopen(fd, "w") as handle:
            handle.write(text)
            handle.flush()
            os.fsync(handle.fileno())
        os.replace(temp, path)
    except BaseException:
        with contextlib.suppress(FileNotFoundError):
            os.unlink(temp)
        raise


def summary(record: Record) -> dict[str, Any]:
    """Derived from what was measured: ours' best step against the peer's best."""
    best = {side: max((v for v in (record.value(f"{side}_eager_images_per_s"),
                                   record.value(f"{side}_compiled_images_per_s")) if v), default=None)
            for side in ("ours", "peer")}
    ratio = best["ours"] / best["peer"] if best["ours"] and best["peer"] else None
    return {"ours_best_images_per_s": best["ours"], "peer_best_images_per_s": best["peer"],
            "ours_best_vs_peer_best": ratio, **vit_compile_summary(record)}


def vit_compile_summary(record: Record) -> dict[str, Any]:
    """ViT-B/16's compile cost and gain from the bare steps (uncaptured): the compiled step's first
    call minus an eager step, and the eager step minus the compiled one; {} until both ran."""
    eager, compiled = record.value("ours_eager_step_ms"), record.value("ours_compiled_step_ms")
    first = record.value("ours_compiled_first_step_s")
    if not (eager and compiled and first):
        return {}
    cost = CompileCost(compile_s=first - eager / 1000, gain_s=(eager - compiled) / 1000)
    return {"vit_compile_s": cost.compile_s, "vit_compile_gain_ms": 1000 * cost.gain_s,
            "vit_compile_break_even_updates": cost.break_even if cost.gain_s > 0 else None}


def markdown(data: dict[str, Any]) -> str:
    meta = data["meta"]
    lines = [f"# mae-study bench on {meta['device']} ({meta['date']}, torch {meta['torch']}"
             f"{', tiny: numbers meaningless' if meta['tiny'] else ''})", "",
             "| part | measure | value |", "| --- | --- | --- |"]
    for name, entry in data["parts"].items():
        if entry["status"] != "ok":
            reason = entry.get("error") or entry.get("reason") or ""
            lines.append(f"| {name} | **{entry['status']}** | {reason.splitlines()[0] if reason else ''} |")
        for key, value in entry["values"].items():
            lines.append(f"| {name} | `{key}` | {value:.4g} |" if isinstance(value, float)
                         else f"| {name} | `{key}` | {value} |")
    for key, value in data["summary"].items():
        lines.append(f"| summary | `{key}` | {value:.4g} |" if isinstance(value, float)
                     else f"| summary | `{key}` | {value} |")
    return "\n".join(lines) + "\n"


# ----------------------------------------------------------------------------- timing


def synchronize(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def wall(fn: Callable[[], Any], device: torch.device) -> float:
    """Seconds of one call, host clock, the device drained before and after (for seconds-long
    host-driven work: a first step with its compilation, a whole training run)."""
    synchronize(device)
    start = time.perf_counter()
    fn()
    synchronize(device)
    return time.perf_counter() - start


def rep_seconds(fn: Callable[[], Any], device: torch.device, reps: int, warmup: int = 3) -> list[float]:
    """Seconds of each of ``reps`` (at least MIN_REPS) calls after ``warmup`` calls: CUDA events
    around each call on a GPU (one sync at the end), perf_counter on a CPU."""
    reps = max(reps, MIN_REPS)
    for _ in range(warmup):
        fn()
    if device.type == "cuda":
        events = [(torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True))
                  for _ in range(reps)]
        synchronize(device)
        for start, end in events:
            start.record()
            fn()
            end.record()
        synchronize(device)
        return [start.elapsed_time(end) / 1000 for start, end in events]
    times = []
    for _ in range(reps):
        start = time.perf_counter()
        fn()
        times.append(time.perf_counter() - start)
    return times


@contextlib.contextmanager
def tf32(device: torch.device) -> Iterator[bool]:
    """TF32 fp32 matmuls inside the block on a GPU (cuDNN's convolutions already default to TF32),
    the previous setting restored after it."""
    before = torch.get_float32_matmul_precision()
    try:
        if device.type == "cuda":
            torch.set_float32_matmul_precision("high")
        yield device.type == "cuda"
    finally:
        torch.set_float32_matmul_precision(before)


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


def our_step(config: Config, images: torch.Tensor, compiled: bool, backend: str = "inductor") -> Callable[[], None]:
    """One update as the peer does it: from the same device images, the target computed and the
    masks drawn (the spec's law: the first k of a uniform permutation) on the device, in the step."""
    device = images.device
    torch.manual_seed(0)
    model = build_model(config).to(device)
    optimizer = build_optimizer(model, config)
    forward = torch.compile(model, backend=backend) if compiled else model
    generator = torch.Generator(device=device).manual_seed(0)
    batch, num_patches, k = images.shape[0], config.num_patches, config.num_visible

    def step() -> None:
        patches = patchify(images, config.resolved_patch_size)
        target = batch_target(patches, config.target)
        noise = torch.rand(batch, num_patches, device=device, generator=generator)
        visible = noise.argsort(dim=1)[:, :k].sort(dim=1).values
        with autocast(config.precision, device):
            pred = forward(patches, visible)
        loss = masked_mse(pred.float(), target, visible).mean()
        optimizer.zero_grad(set_to_none=True)
        loss.backward()
        optimizer.step()

    return step


def peer_step(config: Config, images: torch.Tensor, compiled: bool, backend: str = "inductor") -> Callable[[], None]:
    from .bench import peer_model

    peer = peer_model(config).to(images.device)
    optimizer = torch.optim.AdamW(peer.parameters(), lr=1e-4, betas=(0.9, 0.95), fused=True)
    forward = torch.compile(peer, backend=backend) if compiled else peer

    def step() -> None:
        with autocast(config.precision, images.device):
            loss = forward(pixel_values=images).loss  # patchify, norm-pix target, masks: inside
        optimizer.zero_grad(set_to_none=True)
        loss.float().backward()
        optimizer.step()

    return step


def say(text: str) -> None:
    print(f"[{time.strftime('%H:%M:%S')}] {text}", flush=True)


# ----------------------------------------------------------------------------- the parts


class Bench:
    def __init__(self, device: torch.device, tiny: bool, record: Record, folder: Path, backend: str):
        self.device, self.tiny, self.record, self.backend = device, tiny, record, backend
        self.folder = folder
        self.reps = MIN_REPS if tiny else 20

    def put(self, part: str, key: str, value: Any) -> None:
        self.record.put(part, key, value)

    # made on first use, inside the first part that needs them (so their failure is that part's)
    @functools.cached_property
    def vit(self) -> Config:
        shape = (3, 32, 32) if self.tiny else (3, 224, 224)
        return Config(dataset=image_dataset(shape, 32 if self.tiny else 1024, self.folder),
                      device=self.device.type, **(TINY if self.tiny else VIT_B))

    @functools.cached_property
    def images(self) -> torch.Tensor:
        """One batch of images on the device, shared by both steps (copied before any timing)."""
        torch.manual_seed(0)
        return torch.rand(self.vit.batch_size, *self.vit.image_shape).to(self.device)

    def peak(self) -> None:
        """bf16 matmul rate (fp32 on a CPU, where bf16 matmuls are emulated); fastest repetition."""
        size = 512 if self.tiny else 8192
        dtype = torch.bfloat16 if self.device.type == "cuda" else torch.float32
        a, b = (torch.randn(size, size, device=self.device, dtype=dtype) for _ in range(2))
        times = rep_seconds(lambda: a @ b, self.device, reps=self.reps, warmup=5)
        self.put("peak", "peak_matmul_size", size)
        self.put("peak", "peak_tflops", 2 * size ** 3 / min(times) / 1e12)
        self.put("peak", "peak_median_tflops", 2 * size ** 3 / statistics.median(times) / 1e12)

    def vit_flops(self) -> None:
        with tf32(self.device):
            step = our_step(self.vit, self.images, compiled=False)
            self.put("vit_flops", "vit_step_tflop", step_flops(step) / 1e12)

    def _vit_step(self, part: str, side: str, compiled: bool) -> None:
        make = our_step if side == "ours" else peer_step
        with tf32(self.device) as on:
            self.put(part, "tf32", on)
            step = make(self.vit, self.images, compiled, self.backend)
            if self.device.type == "cuda":
                torch.cuda.reset_peak_memory_stats(self.device)
            self.put(part, f"{part}_first_step_s", wall(step, self.device))  # compilation included
            seconds = statistics.median(rep_seconds(step, self.device, self.reps))
        self.put(part, f"{part}_reps", max(self.reps, MIN_REPS))
        self.put(part, f"{part}_step_ms", 1000 * seconds)
        self.put(part, f"{part}_images_per_s", self.vit.batch_size / seconds)
        flops, peak = self.record.value("vit_step_tflop"), self.record.value("peak_tflops")
        if flops:
            self.put(part, f"{part}_tflops", flops / seconds)
            if peak:
                self.put(part, f"{part}_peak_fraction", flops / seconds / peak)
        if self.device.type == "cuda":
            self.put(part, f"{part}_peak_memory_gib", torch.cuda.max_memory_allocated(self.device) / 2 ** 30)

    def ours_eager(self) -> None:
        self._vit_step("ours_eager", "ours", compiled=False)

    def peer_eager(self) -> None:
        self._vit_step("peer_eager", "peer", compiled=False)

    def ours_compiled(self) -> None:
        self._vit_step("ours_compiled", "ours", compiled=True)

    def peer_compiled(self) -> None:
        self._vit_step("peer_compiled", "peer", compiled=True)

    def trainer_loop(self) -> None:
        """Per-update time of ``train()`` itself: (T(long) - T(short)) / (long - short), host
        clock (each run is seconds long and ends with the trainer's own sync)."""
        short, long = (1, 3) if self.tiny else (10, 40)
        data = prepare_data(self.vit)

        def run(steps: int) -> float:
            config = self.vit.with_updates(steps=steps, log_every=max(1, steps // 4))
            return wall(lambda: train(config, data), self.device)

        with tf32(self.device) as on:
            self.put("trainer_loop", "tf32", on)
            run(short)  # warm-up: cuDNN/cuBLAS heuristics, allocator
            per_update = (run(long) - run(short)) / (long - short)
        self.put("trainer_loop", "trainer_updates_short_long", [short, long])
        self.put("trainer_loop", "trainer_update_s", per_update)
        self.put("trainer_loop", "trainer_images_per_s", self.vit.batch_size / per_update)
        flops, peak = self.record.value("vit_step_tflop"), self.record.value("peak_tflops")
        if flops and peak:
            self.put("trainer_loop", "trainer_peak_fraction", flops / per_update / peak)

    def _digits_config(self, **changes: Any) -> Config:
        return Config(dataset="digits", device=self.device.type, **(TINY_DIGITS if self.tiny else {}), **changes)

    def digits(self) -> None:
        """The default digits run as ``mae-study train`` does it (2,000 updates; TF32 off, as the
        trainer leaves it), and its exact test risk (first 4 test images with --tiny)."""
        config = self._digits_config(steps=4 if self.tiny else 2000)
        data = prepare_data(config)
        self.put("digits", "digits_steps", config.steps)
        graph = update_plan(config, self.device).graph
        self.put("digits", "digits_cuda_graph", graph)
        self.put("digits", "digits_compiled", config.compile_enabled_on(self.device.type, graph=graph))
        self.put("digits", "tf32", torch.get_float32_matmul_precision() != "highest")
        result: dict[str, Any] = {}
        seconds = wall(lambda: result.update(run=train(config, data)), self.device)
        self.put("digits", "digits_train_s", seconds)
        self.put("digits", "digits_update_ms", 1000 * seconds / config.steps)
        test = data.test_patches[:4 if self.tiny else None].to(self.device)
        risk = empirical_mae_risk(result["run"].model, test, config.num_visible, config.target)
        self.put("digits", "digits_test_mae_risk", risk.value)
        self.put("digits", "digits_test_mae_risk_exact", risk.exact)

    def trial(self) -> None:
        """One mask_ratio trial as a study runs it, without MLflow: ``train`` then
        :func:`evaluation.evaluate_trial` (every evaluator of the trial's config), each timed."""
        from evaluation import evaluate_trial
        from evaluation.probes import probes_on_device
        from studies.named_studies import get_study

        study = get_study("mask_ratio")
        study = study.smoke() if self.tiny else study
        reference = study.reference_cell()
        config = next(c for c in study.configs() if c.mask_ratio == reference["mask_ratio"]
                      and c.seed == study.seeds[0]).with_updates(device=self.device.type)
        if self.tiny:  # every evaluator's code path, in seconds: the smoke trial took minutes on two cores
            config = config.with_updates(**TINY_TRIAL)
        data = prepare_data(config)
        self.put("trial", "trial_mask_ratio", config.mask_ratio)
        self.put("trial", "trial_steps", config.steps)
        self.put("trial", "trial_probes_on_device", probes_on_device("auto", self.device))
        result: dict[str, Any] = {}
        self.put("trial", "trial_pretrain_s", wall(lambda: result.update(run=train(config, data)), self.device))
        self.put("trial", "trial_eval_s", wall(
            lambda: result.update(metrics=evaluate_trial(result["run"].model, config, data)), self.device))
        self.put("trial", "trial_s", self.record.value("trial_pretrain_s") + self.record.value("trial_eval_s"))
        for name in ("probe_linear_acc", "probe_knn_acc", "finetune_acc", "test_mae_risk"):
            if name in result["metrics"]:
                self.put("trial", f"trial_{name}", result["metrics"][name])

    @contextlib.contextmanager
    def _trainer_compile_backend(self) -> Iterator[None]:
        """The trainer's ``torch.compile`` with this bench's backend (``eager`` with --tiny on a
        CPU: dynamo's capture without a C++ compile), restored after."""
        original = torch.compile
        if self.backend != "inductor":
            torch.compile = functools.partial(original, backend=self.backend)
        try:
            yield
        finally:
            torch.compile = original

    def compile_cost(self) -> None:
        """compile's cost and gain for the digits model in the trainer's loop, host clock. Per
        update: (T(long) - T(short)) / (long - short) of warm runs, eager and compiled; cost: the
        first compiled run (cold cache) minus the eager run of the same length, less the gain
        over its updates; ``warm``: the same from a second compiled run."""
        short, long = (2, 6) if self.tiny else (100, 600)
        base = self._digits_config(steps=DEFAULT_RUN_UPDATES if not self.tiny else 4, checkpoint_every=0)
        data = prepare_data(base)
        graph = update_plan(base, self.device).graph

        def run(compiled: bool, steps: int) -> float:
            config = base.with_updates(compile=compiled, steps=steps, log_every=max(1, steps // 4))
            return wall(lambda: train(config, data), self.device)

        self.put("compile_cost", "compile_updates_short_long", [short, long])
        self.put("compile_cost", "compile_cuda_graph", graph)
        with self._trainer_compile_backend():
            run(False, short)  # warm-up: cuDNN/cuBLAS heuristics, allocator
            eager_short = run(False, short)
            eager_update = (run(False, long) - eager_short) / (long - short)
            cold = run(True, short)
            warm = run(True, short)
            compiled_update = (run(True, long) - warm) / (long - short)
        gain = eager_update - compiled_update
        # cold = eager_short + compile - short·gain: the compiled run's updates were each faster
        cost = CompileCost(compile_s=cold - eager_short + short * gain, gain_s=gain,
                           source=f"bench_cuda compile_cost, {self.record.data['meta']['device']}")
        self.put("compile_cost", "compile_eager_update_ms", 1000 * eager_update)
        self.put("compile_cost", "compile_compiled_update_ms", 1000 * compiled_update)
        self.put("compile_cost", "compile_gain_ms", 1000 * gain)
        self.put("compile_cost", "compile_cold_s", cost.compile_s)
        self.put("compile_cost", "compile_warm_s", warm - eager_short + short * gain)
        self.put("compile_cost", "compile_break_even_updates", cost.break_even if gain > 0 else None)
        decision = decide(self.device.type, DEFAULT_RUN_UPDATES, encoder_width=base.encoder_width, graph=graph,
                          recorded={(self.device.type, model_class(base.encoder_width), graph): cost})
        self.put("compile_cost", "compile_auto_would_compile_default_run", decision.compile)

    def exact_risk(self, cap_s: float = 40.0) -> None:
        """Up to 500 training images (2 with --tiny), fewer when a probe on a few says the timed
        repetitions would take more than ``cap_s`` (the images used are recorded)."""
        config = self._digits_config()
        data = prepare_data(config)
        torch.manual_seed(0)
        model = build_model(config).to(self.device).eval()
        train_patches = data.train_patches.to(self.device)  # on the device before any timing
        probe = min(10, len(train_patches))
        empirical_mae_risk(model, train_patches[:probe], config.num_visible)  # warm-up
        per_image = wall(lambda: empirical_mae_risk(model, train_patches[:probe], config.num_visible),
                         self.device) / probe
        reps = max(self.reps, MIN_REPS)
        num_images = max(1, min(2 if self.tiny else 500, int(cap_s / (reps * per_image))))
        patches = train_patches[:num_images]
        seconds = statistics.median(rep_seconds(
            lambda: empirical_mae_risk(model, patches, config.num_visible), self.device, reps, warmup=1))
        self.put("exact_risk", "exact_risk_images", num_images)
        self.put("exact_risk", "exact_risk_masks", config.num_visible_sets)
        self.put("exact_risk", "exact_risk_seconds", seconds)
        self.put("exact_risk", "exact_risk_pairs_per_s", num_images * config.num_visible_sets / seconds)


def run(bench: Bench, parts: list[str], budget_s: float | None) -> int:
    """Every part in order, each guarded: returns the number of parts that did not end ``ok``
    (errors, and parts skipped past the budget)."""
    record, started = bench.record, time.perf_counter()
    failing = {p for p in os.environ.get("MAE_BENCH_FAIL", "").split(",") if p}
    stall_after = os.environ.get("MAE_BENCH_STALL_AFTER")
    for name in parts:
        record.part(name)  # every planned part is listed from the start
    record.write()
    not_ok = 0
    for name in parts:
        elapsed = time.perf_counter() - started
        if budget_s is not None and elapsed > budget_s:
            record.set_status(name, "skipped", reason=f"over the {budget_s:.0f} s budget ({elapsed:.0f} s spent)")
            not_ok += 1
            continue
        say(f"part: {name}")
        record.set_status(name, "running")
        part_start = time.perf_counter()
        try:
            if name in failing:
                raise RuntimeError(f"MAE_BENCH_FAIL={name}: failure injected by the test hook")
            getattr(bench, name)()
        except BenchInterrupted as stop:
            record.set_status(name, "interrupted", error=str(stop), seconds=time.perf_counter() - part_start)
            raise
        except Exception as error:  # recorded with its part; the next part still runs
            say(f"part {name} failed: {type(error).__name__}: {error}")
            record.set_status(name, "error", error=f"{type(error).__name__}: {error}",
                              traceback=traceback.format_exc(limit=8), seconds=time.perf_counter() - part_start)
            not_ok += 1
        else:
            record.set_status(name, "ok", seconds=time.perf_counter() - part_start)
        finally:
            gc.collect()
            if bench.device.type == "cuda":
                torch.cuda.empty_cache()
        if name == stall_after:
            say(f"MAE_BENCH_STALL_AFTER={name}: sleeping")
            time.sleep(3600)
    return not_ok


def _interrupt(signum, frame) -> None:
    raise BenchInterrupted(f"signal {signal.Signals(signum).name}")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m benchmarks.bench_cuda", description=__doc__.splitlines()[0])
    parser.add_argument("--device", default="cuda", choices=("cuda", "cpu"))
    parser.add_argument("--tiny", action="store_true", help="tiny sizes: checks every code path in seconds")
    parser.add_argument("--out", type=Path, default=RESULTS)
    parser.add_argument("--parts", default=",".join(PARTS), help=f"comma-separated, in order (default: all: {','.join(PARTS)})")
    parser.add_argument("--budget-s", type=float, default=None,
                        help=f"skip the parts that would start after this many seconds (default {GPU_BUDGET_S:.0f} "
                             "on a GPU, none with --tiny)")
    parser.add_argument("--compile-backend", default=None,
                        help="torch.compile backend (default inductor; 'eager' with --tiny on a CPU: "
                             "dynamo's capture without a C++ compile)")
    args = parser.parse_args(argv)
    if args.device == "cuda" and not torch.cuda.is_available():
        parser.error("--device cuda: no CUDA device here (use --device cpu --tiny to check the script)")
    parts = [p.strip() for p in args.parts.split(",") if p.strip()]
    unknown = sorted(set(parts) - set(PARTS))
    if unknown:
        parser.error(f"--parts: unknown {', '.join(unknown)} (known: {', '.join(PARTS)})")
    device = torch.device(args.device)
    budget = args.budget_s if args.budget_s is not None else (None if args.tiny else GPU_BUDGET_S)
    backend = args.compile_backend or ("eager" if args.tiny and device.type == "cpu" else "inductor")
    meta = {"device": torch.cuda.get_device_name(device) if device.type == "cuda" else platform.processor() or "cpu",
            "torch": torch.__version__, "date": time.strftime("%Y-%m-%d"), "started": time.strftime("%H:%M:%S"),
            "tiny": args.tiny, "budget_s": budget, "compile_backend": backend, "min_reps": MIN_REPS,
            "timer": "cuda events, median of reps" if device.type == "cuda" else "perf_counter, median of reps",
            "parts_planned": parts}
    torch.manual_seed(0)
    record = Record(args.out, meta)
    handlers = {sig: signal.signal(sig, _interrupt) for sig in (signal.SIGTERM, signal.SIGINT)}
    try:
        with tempfile.TemporaryDirectory() as folder:
            not_ok = run(Bench(device, args.tiny, record, Path(folder), backend), parts, budget)
    except BenchInterrupted as stop:
        say(f"interrupted ({stop}): what was measured is in {record.json_path}")
        return 130
    finally:
        for sig, handler in handlers.items():
            signal.signal(sig, handler)
    print(record.md_path.read_text())
    print(f"written: {record.json_path} and {record.md_path}"
          + (f"; {not_ok} part(s) not ok (see their status)" if not_ok else ""))
    return 1 if not_ok else 0


if __name__ == "__main__":
    raise SystemExit(main())
