"""The objectives as classes (mae_core/objective_classes.py) against the spec: the MAE's loss is
blind to the visible positions, the AE sees every patch, the DAE feeds its encoder a corrupted
copy and scores it against the clean target; a plugin's class registers and trains."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from conftest import tiny_config
from mae_core import plugins, registry
from mae_core.objective_classes import AE, DAE, MAE, Draw
from mae_core.train import train
from mae_core.data import prepare_data

ROOT = Path(__file__).resolve().parents[1]
B, M, Q, K = 3, 16, 4, 4


def _sampler(seed: int = 0) -> torch.Generator:
    return torch.Generator().manual_seed(seed)


def test_the_builtins_are_the_three_classes_in_order():
    assert [type(registry.objectives.get(n)) for n in registry.objectives.names()][:3] == [MAE, AE, DAE]
    assert [registry.objectives.get(n).label for n in ("mae", "ae", "dae")] == ["MAE", "AE", "DAE"]
    assert registry.objectives.get("dae").risk_names() == ("test_rec_risk", "test_den_risk")


@pytest.mark.parametrize("name, visible, corrupted", [("mae", True, False), ("ae", False, False), ("dae", False, True)])
def test_each_draw_is_what_its_update_needs(name, visible, corrupted):
    config = tiny_config(objective=name, mask_ratio=0.75)
    clean = torch.rand(B, M, Q)
    draw = config.objective_spec.draw(clean, config, _sampler(), _sampler(1))
    assert (draw.visible is not None) == visible and (draw.inputs is not None) == corrupted
    if visible:  # k distinct positions of [M] per image (V_t in V_k)
        assert draw.visible.shape == (B, config.num_visible)
        assert all(len(set(row.tolist())) == config.num_visible for row in draw.visible)
    if corrupted:  # X̃ differs from the clean images; the clean ones are untouched
        assert draw.inputs.shape == clean.shape and not torch.equal(draw.inputs, clean)


def test_the_mae_loss_is_blind_to_the_visible_positions():
    config = tiny_config(objective="mae", mask_ratio=0.75)
    mae, clean = config.objective_spec, torch.rand(B, M, Q)
    draw = mae.draw(clean, config, _sampler(), None)
    visible_mask = torch.zeros(B, M, dtype=torch.bool).scatter_(1, draw.visible, True)
    pred = torch.rand(B, M, Q, requires_grad=True)
    garbage = torch.where(visible_mask[..., None], torch.full_like(clean, 1e6), pred)
    assert torch.equal(mae.loss(lambda *_: pred, clean, clean, draw), mae.loss(lambda *_: garbage, clean, clean, draw))
    mae.loss(lambda *_: pred, clean, clean, draw).backward()
    assert torch.all(pred.grad[visible_mask] == 0) and torch.all(pred.grad[~visible_mask] != 0)
    # ((M-k)q)⁻¹ Σ_{j∉V} ||x̂_j - T(x_j)||², averaged over the batch
    expected = (((pred - clean) ** 2).sum(-1) * ~visible_mask).sum(1) / ((M - config.num_visible) * Q)
    assert torch.allclose(mae.loss(lambda *_: pred, clean, clean, draw), expected.mean())


def test_the_ae_sees_and_scores_every_patch():
    config = tiny_config(objective="ae")
    ae, clean = config.objective_spec, torch.rand(B, M, Q)
    seen = []

    def predict(*inputs):
        seen.append(inputs)
        return inputs[0] * 0.5

    loss = ae.loss(predict, clean, clean, ae.draw(clean, config, _sampler(), None))
    assert len(seen[0]) == 1 and torch.equal(seen[0][0], clean)  # no V_t: all M patches
    assert torch.allclose(loss, ((0.5 * clean - clean) ** 2).mean())  # (Mq)⁻¹ Σ_j over all positions


def test_the_dae_encodes_the_corrupted_copy_against_the_clean_target():
    config = tiny_config(objective="dae", corruption="gaussian", corruption_level=0.3)
    dae, clean = config.objective_spec, torch.rand(B, M, Q)
    draw = dae.draw(clean, config, _sampler(), _sampler(1))
    seen = []
    loss = dae.loss(lambda x: seen.append(x) or x, clean, clean, draw)
    assert torch.equal(seen[0], draw.inputs)  # the encoder reads X̃ ...
    assert torch.allclose(loss, ((draw.inputs - clean) ** 2).mean())  # ... scored against the clean T(x)
    assert dae.capture_blocker and dae.reads_images
    assert dae.noise_generator(config, torch.device("cpu"), sampler := _sampler()) is sampler


def test_a_draw_splits_by_rows():
    draw = Draw(visible=torch.arange(12).view(4, 3), inputs=torch.zeros(4, 2))
    assert draw.rows(slice(2, 4)).visible.tolist() == [[6, 7, 8], [9, 10, 11]]
    assert draw.rows(slice(2, 4)).inputs.shape == (2, 2)


def test_the_flag_form_still_declares_a_builtin_kind(fresh_plugins):
    registry.objective("noisy", masked=False, corrupted=True, label="noisy")
    registry.objective("masked2", masked=True)
    assert type(registry.objectives.get("noisy")) is DAE and type(registry.objectives.get("masked2")) is MAE
    with pytest.raises(registry.UserError, match="subclass"):
        registry.objective("bad")(lambda: None)


def test_a_plugin_objective_registers_and_trains(fresh_plugins):
    plugins.load_plugins([str(ROOT / "examples" / "plugin" / "objective_l1.py")])
    l1 = registry.objectives.get("mae_l1")
    assert isinstance(l1, MAE) and l1.label == "MAE (L1)" and l1.masked
    config = tiny_config(objective="mae_l1", steps=4)
    clean = torch.rand(B, M, Q)
    draw = l1.draw(clean, config, _sampler(), None)
    masked = ~torch.zeros(B, M, dtype=torch.bool).scatter_(1, draw.visible, True)
    expected = ((clean.abs().sum(-1)) * masked).sum(1) / ((M - config.num_visible) * Q)
    assert torch.allclose(l1.loss(lambda *_: torch.zeros_like(clean), clean, clean, draw), expected.mean())
    result = train(config, prepare_data(config))
    assert result.steps == 4 and all(torch.isfinite(torch.tensor(v)) for _, v in result.history)
    mse = train(tiny_config(objective="mae", steps=4), prepare_data(config))
    assert [v for _, v in result.history] != [v for _, v in mse.history]  # another loss, another trajectory
