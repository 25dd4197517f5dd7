"""The empirical risks stay on the device of the model and the patches: no per-batch host copy,
one host read per result. ``MAE_TEST_DEVICE=cuda`` runs the device checks on a GPU
(benchmarks/gpu_check.sh); here they run on the CPU and on PyTorch's ``meta`` device, which
refuses to mix devices and to copy to the host, so a risk that moves predictions to the CPU
fails on the CPU too (issue 26: ``_predict`` returned ``.cpu()`` tensors against device targets).
"""

import warnings

import pytest
import torch

import mae_core.objectives as objectives
from conftest import tiny_config
from device_checks import DEVICE, HostReads, synchronizing_calls
from mae_core import (
    build_model,
    empirical_den_risk,
    empirical_mae_risk,
    empirical_rec_risk,
    finite_corruption_law,
    prepare_data,
)

CPU = torch.device("cpu")


def _setup(objective="mae", n=6):
    """digits 8x8 at patch 4: M=4, q=16, k=2 (6 masks) for the MAE."""
    config = tiny_config(objective=objective, patch_size=4, mask_ratio=0.5, test_limit=n)
    torch.manual_seed(0)
    return build_model(config).eval(), config, prepare_data(config).test_patches


def _risks(model, patches, config, host_patches):
    """Every model risk on ``patches``, by name: name -> () -> float | RiskEstimate. The
    corruption law is drawn on the host (its seeded CPU generator), as evaluation/risks.py does."""
    law = finite_corruption_law(host_patches, "gaussian", 0.1, 3, seed=0)
    k = config.num_visible
    return {
        "exact": lambda: empirical_mae_risk(model, patches, k, "norm_eps", masks="exact", pairs_per_batch=5),
        "monte_carlo": lambda: empirical_mae_risk(model, patches, k, masks=8, pairs_per_batch=5,
                                                  generator=torch.Generator().manual_seed(0)),
        "rec": lambda: empirical_rec_risk(model, patches, "norm_eps"),
        "den": lambda: empirical_den_risk(model, patches, law),
    }


@pytest.mark.parametrize("risk", ["exact", "monte_carlo", "rec", "den"])
def test_each_risk_reads_the_host_once_at_the_end(risk, monkeypatch):
    model, config, patches = _setup("dae" if risk == "den" else "mae")
    run = _risks(model, patches, config, patches)[risk]
    expected = run()
    reads = HostReads(monkeypatch)
    assert run() == expected
    assert len(reads.calls) == 1, f"{risk}: host reads {reads.calls} (one final read expected)"


@pytest.mark.parametrize("risk", ["exact", "monte_carlo", "rec", "den"])
def test_each_risk_runs_on_a_device_that_is_not_the_host(risk, monkeypatch):
    """On ``meta`` a CPU tensor in the computation raises ("not on the expected device meta") and
    so does any copy to the host: the risk must get to its one final read, on a meta tensor."""
    model, config, patches = _setup("dae" if risk == "den" else "mae")
    run = _risks(model.to("meta"), patches.to("meta"), config, patches)[risk]
    reads = HostReads(monkeypatch, fake_meta=True)
    run()
    assert reads.calls in ([("__float__", "meta")], [("tolist", "meta")]), reads.calls


def test_predictions_come_back_on_the_inputs_device(monkeypatch):
    """The regression of issue 26 itself: ``_predict`` must answer on the device it was given."""
    model, config, patches = _setup()
    seen = []
    original = objectives._predict

    def checked(model_, inputs, visible):
        pred = original(model_, inputs, visible)
        seen.append((inputs.device, visible.device, pred.device))
        assert pred.device == inputs.device == visible.device
        return pred

    monkeypatch.setattr(objectives, "_predict", checked)
    for run in _risks(model.to(DEVICE), patches.to(DEVICE), config, patches).values():
        run()
    assert len(seen) > 4 and all(device.type == DEVICE.type for triple in seen for device in triple)


def _as_tuple(result):
    return (result.value, result.stderr) if isinstance(result, objectives.RiskEstimate) else (result,)


@pytest.mark.parametrize("objective", ["mae", "dae"])
def test_risks_on_the_test_device_match_the_cpu(objective):
    """MAE_TEST_DEVICE (default cpu): patches on the device, and host patches with the model on
    the device (they are moved once), give the CPU's values."""
    model, config, patches = _setup(objective, n=8)
    names = ["exact", "monte_carlo", "rec"] if objective == "mae" else ["rec", "den"]
    on_cpu = {name: _as_tuple(run()) for name, run in _risks(model, patches, config, patches).items()
              if name in names}
    model = model.to(DEVICE)
    for where in (DEVICE, CPU):
        risks = _risks(model, patches.to(where), config, patches)
        for name in names:
            got = _as_tuple(risks[name]())
            assert got == pytest.approx(on_cpu[name], rel=1e-4, abs=1e-7), (name, where)


def test_the_sync_count_is_of_synchronizing_calls_not_torchs_notice():
    """The first GPU run (issue 36) counted torch's one-time notice as a sync."""
    def caught(message: str, line: int) -> warnings.WarningMessage:
        return warnings.WarningMessage(UserWarning(message), UserWarning, "probes.py", line)

    notice = ("Synchronization debug mode is a prototype feature and does not yet detect all "
              "synchronizing operations (Triggered internally at Module.cpp:1)")
    calls = [caught(notice, 1), caught("called a synchronizing CUDA operation (Triggered internally)", 7),
             caught("an unrelated warning", 8)]
    assert synchronizing_calls(calls) == ["probes.py:7"]


@pytest.mark.skipif(DEVICE.type != "cuda", reason="CUDA's sync debug mode (MAE_TEST_DEVICE=cuda)")
@pytest.mark.parametrize("risk", ["exact", "monte_carlo", "rec", "den"])
def test_each_risk_synchronizes_cuda_once(risk):
    model, config, patches = _setup("dae" if risk == "den" else "mae")
    run = _risks(model.to(DEVICE), patches.to(DEVICE), config, patches)[risk]
    run()  # warm-up: library handles, allocator
    torch.cuda.synchronize()
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        torch.cuda.set_sync_debug_mode("warn")
        try:
            run()
        finally:
            torch.cuda.set_sync_debug_mode("default")
    syncs = synchronizing_calls(caught)
    assert len(syncs) == 1, syncs
