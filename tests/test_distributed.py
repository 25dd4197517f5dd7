"""One run across processes (issue 26 part 5): each rank's slice of the spec's global batch,
gradients averaged by DDP; two gloo workers on the CPU equal one process."""

import pytest
import torch

from conftest import tiny_config
from mae_core import build_model, masked_mse, prepare_data, sample_visible, train
from mae_core.checkpoint import load_checkpoint
from mae_core.distributed import Shard, local_batch_size
from mae_core.local_ddp import train_on_processes


def test_ranks_take_contiguous_equal_slices_whose_union_is_the_batch():
    rows = [Shard(rank, 4).rows(12) for rank in range(4)]
    assert rows == [slice(0, 3), slice(3, 6), slice(6, 9), slice(9, 12)]
    assert Shard().rows(12) == slice(0, 12)


@pytest.mark.parametrize("batch, workers", [(10, 3), (8, 0)])
def test_a_batch_that_does_not_split_is_refused_naming_both_keys(batch, workers):
    with pytest.raises(ValueError, match="workers_per_trial"):
        local_batch_size(batch, workers)


class SecondOfTwo(Shard):
    """Rank 1 of 2 inside a one-process group: its slice and DDP, nothing averaged across ranks."""

    def mean(self, value):
        return value

    def any(self, flag, device):
        return flag

    def barrier(self):
        pass


@pytest.fixture
def one_process_group():
    import torch.distributed as dist

    from mae_core.local_ddp import free_port

    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{free_port()}", rank=0, world_size=1)
    yield
    dist.destroy_process_group()


def test_a_rank_computes_its_own_rows_of_the_global_draws(one_process_group):
    # Rank 1 of 2 on a global batch of 8: the sampler draws I_0 and V_0 for all 8 images, in the
    # single-process order, and the rank's loss and gradient are those of images 4..7 alone.
    config = tiny_config(optimizer="sgd", lr=1.0, steps=1, batch_size=8, warmup_fraction=0.0)
    data = prepare_data(config)
    torch.manual_seed(config.seed)
    model = build_model(config)
    sampler = torch.Generator().manual_seed(config.seed + 1)
    index = torch.randint(data.train_patches.shape[0], (8,), generator=sampler)
    visible = sample_visible(8, config.num_patches, config.num_visible, sampler, "random", config.grid)
    x = data.train_patches[index[4:]]
    loss = masked_mse(model(x, visible[4:]), x, visible[4:]).mean()
    loss.backward()
    result = train(config, data, shard=SecondOfTwo(1, 2))
    assert result.history == [(1, pytest.approx(loss.item(), abs=1e-6))]
    trained = dict(result.model.named_parameters())
    for name, parameter in model.named_parameters():
        assert torch.allclose(trained[name], parameter - parameter.grad, atol=1e-6), name


@pytest.mark.slow
def test_two_gloo_workers_equal_one_process_on_the_same_global_batch(tmp_path):
    # Plain SGD with η = 1 (constant): θ_1 = θ_0 - g_0, so the checkpoint after the first update
    # (kept as ``.prev`` once the second is written) carries that update's gradient; the second
    # update checks the ranks keep drawing in step with one process.
    config = tiny_config(optimizer="sgd", lr=1.0, steps=2, batch_size=8, warmup_fraction=0.0,
                         schedule="constant", log_every=1, checkpoint_every=1)
    single = train(config, prepare_data(config), checkpoint_path=tmp_path / "single.pt")
    ranks = train_on_processes(config, 2, checkpoint_path=tmp_path / "two.pt", all_ranks=True)
    first_single = load_checkpoint(tmp_path / "single.pt.prev")
    first_two = load_checkpoint(tmp_path / "two.pt.prev")
    assert first_two["step"] == 1 and not (tmp_path / "two.pt.tmp").exists()
    for name, value in first_single["model"].items():  # g_0 = θ_0 - θ_1, the same θ_0
        assert torch.allclose(first_two["model"][name], value, atol=1e-5), name
    for result in ranks:
        assert [s for s, _ in result.history] == [1, 2]
        assert result.history[0][1] == pytest.approx(single.history[0][1], abs=1e-5)  # L_0 of the global batch
        assert result.history[1][1] == pytest.approx(single.history[1][1], abs=1e-5)
    expected = dict(single.model.named_parameters())
    for result in ranks:
        for name, parameter in result.model.named_parameters():
            assert torch.allclose(parameter, expected[name], atol=1e-5), name
