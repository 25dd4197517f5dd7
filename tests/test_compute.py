"""Compute per trial (issue 25 part 6): parameters, FLOPs per update, updates/s, pretrain/eval seconds."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F
from conftest import tiny_config
from mlflow.tracking import MlflowClient
from torch.utils.flop_counter import FlopCounterMode

from evaluation.metrics import COMPUTE_METRICS, METRICS
from mae_core import build_model, prepare_data
from mae_core.compute import flop_counter, representative_batch, trainable_parameters, update_flops
from mae_core.objectives import masked_mse
from mae_core.train import train
from studies.trial import run_trial

# the smallest probe settings: the trial's probes run, in seconds
QUICK_EVAL = {"eval.fewshot": 2, "eval.fewshot_draws": 1, "eval.linear_cs": "1", "eval.knn_ks": "5"}


def test_a_trial_logs_its_compute_and_layer_probes_and_trains_as_without_them(tmp_path):
    config = tiny_config(steps=4, encoder_depth=2, log_model=False, **QUICK_EVAL, **{"eval.probe_blocks": "[1,2]"})
    data = prepare_data(config)
    uri = f"sqlite:///{tmp_path}/mlflow.db"
    outcome = run_trial(config, data, tracking_uri=uri)
    client = MlflowClient(uri)
    metrics = client.get_run(outcome.run_id).data.metrics

    for name in COMPUTE_METRICS:
        assert metrics[name] > 0, name
        assert METRICS[name].kind == "bookkeeping" and METRICS[name].unit
    assert metrics["pretrain_seconds"] == metrics["train_seconds"]
    assert metrics["updates_per_second"] == pytest.approx(config.steps / metrics["pretrain_seconds"])
    fresh = build_model(config)  # same shapes as the trained model
    assert metrics["model_parameters"] == sum(p.numel() for p in fresh.parameters()) == trainable_parameters(fresh)

    # the same update counted here: forward, loss, backward of the representative batch
    inputs, visible = representative_batch(config, data, torch.device("cpu"))
    with flop_counter() as counter:
        masked_mse(fresh(inputs, visible), inputs, visible).mean().backward()
    assert metrics["flops_per_update"] == counter.get_total_flops()

    # the training losses are bitwise those of train() alone, where nothing is counted
    logged = sorted((m.step, m.value) for m in client.get_metric_history(outcome.run_id, "train_loss"))
    assert logged == train(config, data).history

    # eval.probe_blocks=[1,2] on a 2-block encoder: block 2 (final norm applied) is the final layer
    for probe in ("linear", "knn", "fewshot"):
        for block in (1, 2):
            assert 0.0 <= metrics[f"probe_{probe}_acc_block{block}"] <= 1.0
        assert metrics[f"probe_{probe}_acc_block2"] == metrics[f"probe_{probe}_acc"]
    assert metrics["probe_linear_c_block1"] == 1.0 and metrics["probe_knn_k_block1"] == 5.0


@pytest.mark.parametrize("keys", [dict(), dict(objective="dae", corruption="gaussian"),
                                  dict(class_token=True, encoder_depth=2, mask_sampling="block")])
def test_flops_per_update_is_the_count_of_one_whole_training_update(keys):
    """Counting all of train() for one update (sampling, optimiser, divergence watch included)
    gives the number update_flops measures outside the loop."""
    config = tiny_config(steps=1, **keys)
    data = prepare_data(config)
    with flop_counter() as counter:
        result = train(config, data)
    assert update_flops(result.model, config, data) == counter.get_total_flops() > 0


def test_counting_leaves_the_model_and_every_rng_alone():
    config = tiny_config()
    data = prepare_data(config)
    model = build_model(config)
    before = {k: v.clone() for k, v in model.state_dict().items()}
    state = torch.get_rng_state()
    update_flops(model, config, data)
    assert torch.equal(torch.get_rng_state(), state)
    assert all(p.grad is None for p in model.parameters())
    assert all(torch.equal(before[k], v) for k, v in model.state_dict().items())


def test_cpu_attention_counts_as_torch_counts_fused_attention_on_cuda():
    """torch's counter misses the CPU fused attention kernel; the added formulas are torch's own
    for the CUDA fused kernels: the forward is the math kernel's two matrix products, the
    backward five (the fused backward recomputes the scores)."""
    from torch.nn.attention import SDPBackend, sdpa_kernel
    from torch.utils.flop_counter import sdpa_backward_flop_count, sdpa_flop_count

    q = torch.randn(2, 3, 5, 8, requires_grad=True)

    def count(counter, backend, backward=True):
        with sdpa_kernel(backend), counter:
            out = F.scaled_dot_product_attention(q, q, q)
            if backward:
                out.sum().backward()
        return counter.get_total_flops()

    assert count(FlopCounterMode(display=False), SDPBackend.FLASH_ATTENTION) == 0
    forward = count(flop_counter(), SDPBackend.FLASH_ATTENTION, backward=False)
    assert forward == count(FlopCounterMode(display=False), SDPBackend.MATH, backward=False) > 0
    assert count(flop_counter(), SDPBackend.FLASH_ATTENTION) == (
        sdpa_flop_count(q.shape, q.shape, q.shape) + sdpa_backward_flop_count(q.shape, q.shape, q.shape, q.shape))
