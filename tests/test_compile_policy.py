"""compile=auto from measurement (issue 36): a pure rule of compile cost, per-update gain and run
length, with the recorded measurements in one table and a fallback where none is recorded.
Every number here is made up for the rule's sake: none is a measurement."""

from __future__ import annotations

import math

import pytest

from mae_core import Config
from mae_core.compile_policy import (FALLBACK_MIN_UPDATES, SMALL_ENCODER_WIDTH, CompileCost, compile_pays,
                                     decide, model_class)


def test_compiling_pays_once_the_saving_over_the_run_exceeds_the_compile():
    assert compile_pays(compile_s=30.0, gain_s=0.01, updates=3_001) and not compile_pays(30.0, 0.01, 3_000)
    assert not compile_pays(1.0, 0.0, 10**9) and not compile_pays(1.0, -0.001, 10**9)  # compiling slowed it
    cost = CompileCost(compile_s=30.0, gain_s=0.01, source="test")
    assert cost.break_even == pytest.approx(3_000) and math.isinf(CompileCost(5.0, 0.0).break_even)


@pytest.mark.parametrize("graph", [True, False])
def test_a_recorded_measurement_decides_for_its_device_and_model_class(graph):
    recorded = {("cuda", "small", graph): CompileCost(compile_s=20.0, gain_s=0.002, source="bench test"),
                ("cuda", "large", graph): CompileCost(compile_s=30.0, gain_s=0.02, source="bench test")}
    small, large = dict(encoder_width=64, graph=graph, recorded=recorded), dict(encoder_width=768, graph=graph,
                                                                               recorded=recorded)
    assert not decide("cuda", 10_000, **small).compile and decide("cuda", 10_001, **small).compile
    assert not decide("cuda", 1_500, **large).compile and decide("cuda", 1_501, **large).compile
    assert "break-even 1500 updates" in decide("cuda", 2_000, **large).reason
    # the CPU has none recorded here: its fallback
    assert decide("cpu", FALLBACK_MIN_UPDATES["cpu"], **large).compile


def test_without_a_measurement_a_small_model_in_a_cuda_graph_is_not_compiled():
    assert not decide("cuda", 10**6, encoder_width=64, graph=True, recorded={}).compile
    uncaptured = decide("cuda", FALLBACK_MIN_UPDATES["cuda"], encoder_width=64, graph=False, recorded={})
    assert uncaptured.compile and "fallback" in uncaptured.reason
    assert not decide("cuda", FALLBACK_MIN_UPDATES["cuda"] - 1, encoder_width=768, graph=True, recorded={}).compile
    assert decide("cuda", FALLBACK_MIN_UPDATES["cuda"], encoder_width=768, graph=True, recorded={}).compile
    assert not decide("mps", 19_999, encoder_width=768, graph=False, recorded={}).compile  # as the CPU


def test_the_fallback_is_the_run_lengths_compile_auto_had():
    assert FALLBACK_MIN_UPDATES == {"cpu": 20_000, "cuda": 1_750}
    assert model_class(SMALL_ENCODER_WIDTH) == "small" and model_class(SMALL_ENCODER_WIDTH + 1) == "large"


def test_the_trainer_decides_with_the_update_mode_it_runs():
    config = Config(steps=2_000)  # the default digits run
    assert not config.compile_enabled_on("cuda", graph=True) and config.compile_enabled_on("cuda", graph=False)
    assert not config.compile_enabled_on("cuda")  # cuda_graph=auto: captured on CUDA
    assert config.with_updates(cuda_graph=False).compile_enabled_on("cuda")
