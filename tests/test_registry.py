"""The registries are the one place each choice is defined: unknown names are one line with the
choices, the config's choice keys and the engine's name tuples read them, duplicates are refused."""

from __future__ import annotations

import re

import pytest
import torch

from mae_core import registry
from mae_core.config import Config, ConfigError, allowed_values
from mae_core.errors import UserError

REGISTRIES = [registry.targets, registry.corruptions, registry.mask_samplers, registry.dataset_formats]


@pytest.fixture
def restored():
    """Registrations made by a test are undone after it."""
    saved = [r.snapshot() for r in REGISTRIES]
    yield
    for r, entries in zip(REGISTRIES, saved):
        r.restore(entries)


def test_the_builtins_register_through_the_decorators_in_order():
    assert registry.targets.names() == ("raw", "norm", "norm_eps")
    assert registry.corruptions.names() == ("none", "gaussian", "masking", "salt_pepper")
    assert registry.mask_samplers.names() == ("random", "block", "grid")
    assert registry.dataset_formats.names() == ("cifar10", "folder", "npz", "cifar100", "cifar100_coarse",
                                                "stl10", "imagenet", "idx")


def test_every_choice_list_is_the_registrys():
    """Config's allowed values, the engine's tuples and the data module's kinds are the registry's names."""
    from mae_core import CORRUPTIONS, MASK_SAMPLINGS, TARGETS, data

    fields = Config.model_fields
    for key, names in (("target", TARGETS), ("mask_sampling", MASK_SAMPLINGS), ("corruption", CORRUPTIONS)):
        own = getattr(registry, {"target": "targets", "mask_sampling": "mask_samplers",
                                 "corruption": "corruptions"}[key]).names()
        assert names == own
        assert allowed_values(fields[key]).split(" | ")[:len(own)] == list(own)
    assert data.FILE_DATASETS == registry.dataset_formats.names()
    assert all(f"{kind}:PATH" in data.ALLOWED_FORMS and f"{kind}:PATH" in fields["dataset"].description
               for kind in registry.dataset_formats.names())


@pytest.mark.parametrize("keys, line", [
    (dict(target="blur"), "target='blur': not one of raw, norm, norm_eps"),
    (dict(mask_sampling="checkerboard"), "mask_sampling='checkerboard': not one of random, block, grid"),
    (dict(objective="dae", corruption="blur"), "corruption='blur': not one of none, gaussian, masking, salt_pepper"),
])
def test_an_unknown_name_is_one_line_naming_the_key_and_the_choices(keys, line):
    with pytest.raises(ConfigError) as caught:
        Config(**keys)
    assert str(caught.value) == line


def test_a_registry_lookup_names_its_key_and_choices():
    with pytest.raises(registry.UnknownName, match=r"^corruption='blur' is not one of none, gaussian, "
                                                   r"masking, salt_pepper$"):
        registry.corruptions.get("blur")
    from mae_core import apply_target

    with pytest.raises(ValueError, match="target='blur'"):
        apply_target(torch.zeros(1, 2, 4), "blur")


def test_a_registered_name_is_accepted_and_a_second_part_under_it_refused(restored):
    @registry.target("halves", out_dim=2)
    def halves(patches):
        return torch.stack([patches[..., ::2].mean(-1), patches[..., 1::2].mean(-1)], dim=-1)

    config = Config(target="halves")
    assert config.target_dim == 2 and "halves" in allowed_values(Config.model_fields["target"])
    registry.target("halves", out_dim=2)(halves)  # the same function again: fine
    with pytest.raises(registry.DuplicateName, match="target='halves' is registered twice"):
        registry.target("halves")(lambda patches: patches)
    with pytest.raises(UserError):
        registry.target("norm")(lambda patches: patches)


def test_a_target_of_another_width_sets_the_decoders_and_the_risk_works(restored):
    from mae_core import build_model, empirical_mae_risk, patchify

    registry.target("mean_only", out_dim=1)(lambda patches: patches.mean(dim=-1, keepdim=True))
    config = Config(dataset="digits", target="mean_only", encoder_width=16, encoder_depth=1, encoder_heads=2,
                    decoder_width=8, decoder_depth=1, decoder_heads=2)
    model = build_model(config)
    patches = patchify(torch.rand(3, 1, 8, 8), config.resolved_patch_size)
    visible = torch.tensor([[0, 1, 2, 3]] * 3)
    assert model(patches, visible).shape == (3, config.num_patches, 1)
    risk = empirical_mae_risk(model, patches, config.num_visible, target="mean_only", masks=2,
                              generator=torch.Generator().manual_seed(0))
    assert risk.value > 0


def test_a_plugin_mask_sampler_and_corruption_are_used(restored):
    from mae_core import corrupt, sample_visible

    @registry.mask_sampler("first_k")
    def first_k(batch_size, num_patches, num_visible, grid, generator):
        return torch.arange(num_visible).expand(batch_size, -1)

    @registry.corruption("flip")
    def flip(patches, level, generator):
        return 1.0 - patches

    assert sample_visible(2, 16, 4, scheme="first_k").tolist() == [[0, 1, 2, 3]] * 2
    assert torch.equal(corrupt(torch.zeros(2, 3), "flip", 0.5), torch.ones(2, 3))
    assert Config(mask_sampling="first_k").mask_sampling == "first_k"


def test_an_objective_is_declared_by_what_it_draws_and_everything_reads_those_answers():
    from mae_core import build_model
    from mae_core.models import BottleneckAutoencoder, MaskedAutoencoder
    from conftest import tiny_config
    from mae_core.registry import objective, objectives

    saved = objectives.snapshot()
    try:
        assert [(o.name, o.masked, o.corrupted) for o in map(objectives.get, objectives.names())] == [
            ("mae", True, False), ("ae", False, False), ("dae", False, True)]
        objective("noisy_ae", masked=False, corrupted=True, doc="a second denoising objective")
        config = tiny_config(objective="noisy_ae", corruption="masking", corruption_level=0.5)
        assert config.num_visible == config.num_patches and config.resolved_corruption == "masking"
        assert isinstance(build_model(config), BottleneckAutoencoder)
        assert isinstance(build_model(tiny_config(objective="mae")), MaskedAutoencoder)
        assert objectives.get("noisy_ae").risk_names() == ("test_rec_risk", "test_den_risk")
        from evaluation.risks import reconstruction_metrics
        from mae_core import prepare_data, train

        data = prepare_data(config)
        result = train(config, data)  # the trainer draws X̃ for it as for dae
        assert {"test_rec_risk", "test_den_risk"} <= set(reconstruction_metrics(result.model, config, data))
        with pytest.raises(ConfigError, match=re.escape("corruption=gaussian applies only to objective=dae | noisy_ae")):
            tiny_config(objective="ae", corruption="gaussian")
        with pytest.raises(UserError, match="not both"):
            objective("masked_dae", masked=True, corrupted=True)
        with pytest.raises(ConfigError, match="objective"):
            tiny_config(objective="nope")
    finally:
        objectives.restore(saved)
