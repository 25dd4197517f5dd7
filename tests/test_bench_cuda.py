"""benchmarks/bench_cuda.py keeps what it measured (issue 26): its JSON is rewritten atomically
after every value, a part that raises is recorded with its error while the others run, and a
killed run leaves every finished part in the file. All on the CPU (``--device cpu --tiny``)."""

import json
import os
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch

ROOT = Path(__file__).resolve().parents[1]
if str(ROOT) not in sys.path:  # benchmarks/ stays in the checkout (not installed)
    sys.path.insert(0, str(ROOT))

from benchmarks import bench_cuda  # noqa: E402
CPU = torch.device("cpu")


def _read(folder: Path) -> dict:
    return json.loads((folder / "bench_cuda_tiny.json").read_text())


@pytest.mark.slow  # the bench in a subprocess, killed: about 5 s on two cores
def test_a_killed_bench_keeps_the_parts_it_measured(tmp_path):
    """SIGKILL while the third part's successor waits (MAE_BENCH_STALL_AFTER): the JSON on disk
    is whole and holds the parts that had finished, with their values."""
    env = {**os.environ, "MAE_BENCH_STALL_AFTER": "ours_eager", "PYTHONPATH": str(ROOT)}
    env.pop("MAE_BENCH_FAIL", None)
    log = (tmp_path / "log.txt").open("w")
    process = subprocess.Popen([sys.executable, "-m", "benchmarks.bench_cuda", "--device", "cpu", "--tiny",
                                "--out", str(tmp_path)], cwd=ROOT, env=env, stdout=log, stderr=subprocess.STDOUT)
    try:
        deadline = time.monotonic() + 120
        while time.monotonic() < deadline and process.poll() is None:
            path = tmp_path / "bench_cuda_tiny.json"
            if path.exists() and _read(tmp_path)["parts"].get("ours_eager", {}).get("status") == "ok":
                break
            time.sleep(0.05)
        assert process.poll() is None, (tmp_path / "log.txt").read_text()
    finally:
        process.kill()
        process.wait(timeout=30)
        log.close()
    parts = _read(tmp_path)["parts"]
    assert list(parts) == list(bench_cuda.PARTS)  # every planned part is listed from the start
    assert parts["peak"]["status"] == "ok" and parts["peak"]["values"]["peak_tflops"] > 0
    assert parts["vit_flops"]["values"]["vit_step_tflop"] > 0
    assert parts["ours_eager"]["status"] == "ok"
    assert parts["ours_eager"]["values"]["ours_eager_images_per_s"] > 0
    assert parts["ours_eager"]["values"]["ours_eager_reps"] >= bench_cuda.MIN_REPS
    assert all(parts[name]["status"] == "pending" for name in bench_cuda.PARTS[4:])
    assert not list(tmp_path.glob(".*.tmp"))  # the atomic writes leave no temp file behind
    assert "ours_eager" in (tmp_path / "bench_cuda_tiny.md").read_text()


def test_a_part_that_raises_is_recorded_and_the_others_are_measured(tmp_path, monkeypatch):
    monkeypatch.setenv("MAE_BENCH_FAIL", "digits")
    monkeypatch.delenv("MAE_BENCH_STALL_AFTER", raising=False)
    rc = bench_cuda.main(["--device", "cpu", "--tiny", "--out", str(tmp_path),
                          "--parts", "peak,digits,exact_risk"])
    assert rc == 1  # a part did not end ok
    parts = _read(tmp_path)["parts"]
    assert parts["digits"]["status"] == "error"
    assert "MAE_BENCH_FAIL=digits" in parts["digits"]["error"] and "Traceback" in parts["digits"]["traceback"]
    assert parts["peak"]["status"] == "ok" and parts["peak"]["values"]["peak_tflops"] > 0
    assert parts["exact_risk"]["status"] == "ok" and parts["exact_risk"]["values"]["exact_risk_pairs_per_s"] > 0
    assert "**error**" in (tmp_path / "bench_cuda_tiny.md").read_text()


def test_parts_past_the_budget_are_skipped_and_recorded(tmp_path):
    rc = bench_cuda.main(["--device", "cpu", "--tiny", "--out", str(tmp_path), "--parts", "peak,exact_risk",
                          "--budget-s", "0"])
    parts = _read(tmp_path)["parts"]
    assert rc == 1
    for name in ("peak", "exact_risk"):
        assert parts[name]["status"] == "skipped" and "budget" in parts[name]["reason"]
        assert parts[name]["values"] == {}


def test_timing_takes_at_least_ten_repetitions_and_tf32_is_scoped():
    calls = []
    times = bench_cuda.rep_seconds(lambda: calls.append(1), CPU, reps=3, warmup=2)
    assert len(times) == bench_cuda.MIN_REPS and len(calls) == 2 + bench_cuda.MIN_REPS
    before = torch.get_float32_matmul_precision()
    with pytest.raises(RuntimeError):
        with bench_cuda.tf32(torch.device("cuda")):  # switches it on without touching a GPU
            assert torch.get_float32_matmul_precision() == "high"
            raise RuntimeError("a part fails")
    assert torch.get_float32_matmul_precision() == before


def test_the_timed_step_copies_nothing_between_devices(monkeypatch, tmp_path):
    """Our step gets its images on the device and computes the target and masks itself, as the
    peer does: no move to a device (``.to(device)``, ``.cpu()``, ``.cuda()``) and no host read
    inside the step (a ``.to(dtype)`` cast, as the model's mask token under autocast, is fine)."""
    config = bench_cuda.Config(dataset=bench_cuda.image_dataset((3, 32, 32), 8, tmp_path), device="cpu",
                               **bench_cuda.TINY)
    images = torch.rand(config.batch_size, *config.image_shape)
    step = bench_cuda.our_step(config, images, compiled=False)
    step()
    moves = []

    def watch(name, original):
        def call(self, *args, **kwargs):
            to_device = name != "to" or "device" in kwargs or any(
                isinstance(a, (torch.device, str, torch.Tensor)) for a in args)
            if to_device:
                moves.append((name, args, kwargs))
            return original(self, *args, **kwargs)
        return call

    for name in ("to", "cpu", "cuda", "item", "tolist", "__float__"):
        monkeypatch.setattr(torch.Tensor, name, watch(name, getattr(torch.Tensor, name)))
    step()
    assert moves == []


@pytest.mark.slow
def test_the_tiny_bench_runs_every_part_on_the_cpu(tmp_path, monkeypatch):
    monkeypatch.delenv("MAE_BENCH_FAIL", raising=False)
    monkeypatch.delenv("MAE_BENCH_STALL_AFTER", raising=False)
    assert bench_cuda.main(["--device", "cpu", "--tiny", "--out", str(tmp_path)]) == 0
    data = _read(tmp_path)
    assert {name: entry["status"] for name, entry in data["parts"].items()} == dict.fromkeys(bench_cuda.PARTS, "ok")
    assert data["summary"]["ours_best_vs_peer_best"] > 0
    assert data["parts"]["digits"]["values"]["tf32"] is False  # the reported risk ran without TF32
    trial = data["parts"]["trial"]["values"]  # issue 36: one mask_ratio trial, pretraining and evaluation
    assert trial["trial_pretrain_s"] > 0 and trial["trial_eval_s"] > 0 and trial["trial_probes_on_device"] is False
    assert 0 <= trial["trial_probe_linear_acc"] <= 1 and "trial_finetune_acc" in trial
    compiled = data["parts"]["compile_cost"]["values"]
    assert {"compile_cold_s", "compile_gain_ms", "compile_auto_would_compile_default_run"} <= compiled.keys()
    assert {"vit_compile_s", "vit_compile_gain_ms"} <= data["summary"].keys()


def test_vits_compile_cost_and_gain_come_from_its_eager_and_compiled_steps(tmp_path):
    record = bench_cuda.Record(tmp_path, {"tiny": True, "device": "cpu", "date": "-", "torch": "-"})
    assert bench_cuda.vit_compile_summary(record) == {}  # nothing measured: nothing derived
    record.put("ours_eager", "ours_eager_step_ms", 60.0)
    record.put("ours_compiled", "ours_compiled_step_ms", 40.0)
    record.put("ours_compiled", "ours_compiled_first_step_s", 30.06)
    derived = bench_cuda.vit_compile_summary(record)  # made-up values: the arithmetic, not a measurement
    assert derived["vit_compile_s"] == pytest.approx(30.0) and derived["vit_compile_gain_ms"] == pytest.approx(20.0)
    assert derived["vit_compile_break_even_updates"] == pytest.approx(1_500)
    assert _read(tmp_path)["summary"]["vit_compile_gain_ms"] == pytest.approx(20.0)  # written with the record
