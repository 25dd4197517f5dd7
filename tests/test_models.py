"""Models: the visible-only encoder, the shared-mask-token decoder, and the AE/DAE bottleneck."""

import pytest
import torch
from conftest import timm_missing, tiny_config

from mae_core import BottleneckAutoencoder, MaskedAutoencoder, build_model, masked_mse, sample_visible
from mae_core.transformer import gather_positions

# Both encoders pass the spec's property tests: the built-in ViT and a timm VisionTransformer
# (tiny: the config's width/depth/heads; the timm variants skip where timm is not installed).
TIMM = "timm:vit_tiny_patch16_224"
TIMM_REGISTERS = "timm:vit_medium_patch16_reg4_gap_256"  # 4 register tokens, no class token, no_embed_class
MAE_VARIANTS = {
    "mae": {},
    "mae_timm": dict(encoder=TIMM),
    "mae_timm_class_token": dict(encoder=TIMM, class_token=True),
    "mae_timm_learned_positions": dict(encoder=TIMM, class_token=True, pos_embed="learned"),
    "mae_timm_registers": dict(encoder=TIMM_REGISTERS, pos_embed="learned"),
    "mae_timm_photos_rgb": dict(encoder=TIMM, dataset="photos", decoder_width=16),
    "mae_timm_mask_token_in_encoder": dict(encoder=TIMM, mask_token_in_encoder=True),
    "mae_class_token": dict(class_token=True),
    "mae_learned_positions": dict(pos_embed="learned"),
    "mae_mask_token_in_encoder": dict(mask_token_in_encoder=True),
    "mae_shapes": dict(dataset="shapes"),  # M=16, q=16
    "mae_photos_rgb": dict(dataset="photos", decoder_width=16),  # M=64, q=48
}
ALL_VARIANTS = {**MAE_VARIANTS, "ae": dict(objective="ae"), "dae": dict(objective="dae"),
                "ae_class_token": dict(objective="ae", class_token=True),
                "ae_timm": dict(objective="ae", encoder=TIMM, class_token=True)}
VISIBLE_ONLY = ["mae", "mae_class_token", "mae_learned_positions", "mae_timm", "mae_timm_class_token",
                "mae_timm_learned_positions", "mae_timm_registers"]


def _model(**overrides) -> tuple[torch.nn.Module, object]:
    if str(overrides.get("encoder", "")).startswith("timm:") and timm_missing():
        pytest.skip(timm_missing())
    config = tiny_config(**overrides)
    torch.manual_seed(0)
    return build_model(config), config


def _inputs(config, batch: int = 4, seed: int = 0) -> tuple[torch.Tensor, torch.Tensor]:
    gen = torch.Generator().manual_seed(seed)
    patches = torch.rand(batch, config.num_patches, config.patch_dim, generator=gen)
    k = config.num_visible if config.objective == "mae" else 4  # AE/DAE: a mask it must refuse
    return patches, sample_visible(batch, config.num_patches, k, gen)


def _masked(visible: torch.Tensor, num_patches: int) -> torch.Tensor:
    masked = torch.ones(visible.shape[0], num_patches, dtype=torch.bool)
    return masked.scatter(1, visible, False)


@pytest.mark.parametrize("variant", ALL_VARIANTS)
def test_build_model_shapes_and_attributes(variant):
    model, config = _model(**ALL_VARIANTS[variant])
    assert isinstance(model, MaskedAutoencoder if config.objective == "mae" else BottleneckAutoencoder)
    assert model.num_patches == config.num_patches and model.patch_dim == config.patch_dim
    patches, visible = _inputs(config)
    pred = model(patches, visible) if config.objective == "mae" else model(patches)
    assert pred.shape == (4, config.num_patches, config.patch_dim)
    width = config.encoder_width * (2 if config.class_token else 1)
    assert model.features(patches).shape == (4, width)


@pytest.mark.parametrize("variant", MAE_VARIANTS)
def test_masked_values_never_reach_the_model(variant):
    model, config = _model(**MAE_VARIANTS[variant])
    patches, visible = _inputs(config)
    other = patches.clone()
    masked = _masked(visible, config.num_patches)
    other[masked] = torch.randn(int(masked.sum()), config.patch_dim) * 100  # only masked slots differ
    assert not torch.equal(patches, other)
    assert torch.equal(model(patches, visible), model(other, visible))  # bitwise
    values, other_values = gather_positions(patches, visible), gather_positions(other, visible)
    assert torch.equal(model.encode(values, visible), model.encode(other_values, visible))
    # ... while a change at one visible slot does change the output
    changed = patches.clone()
    changed[0, visible[0, 0]] += 1.0
    assert not torch.equal(model(patches, visible)[0], model(changed, visible)[0])


@pytest.mark.parametrize("variant", VISIBLE_ONLY)
def test_encoder_receives_only_the_k_visible_tokens(variant):
    model, config = _model(**MAE_VARIANTS[variant])
    patches, visible = _inputs(config)
    seen = []
    model.encoder.transformer.register_forward_pre_hook(lambda _, args: seen.append(args[0].shape))
    model(patches, visible)
    extra = getattr(model.encoder, "num_prefix", 1 if config.class_token else 0)  # class token, registers
    assert seen == [(4, config.num_visible + extra, config.encoder_width)]


@pytest.mark.parametrize("variant", VISIBLE_ONLY)
def test_encode_is_what_forward_decodes(variant):
    model, config = _model(**MAE_VARIANTS[variant])
    patches, visible = _inputs(config)
    tokens = model.encode(gather_positions(patches, visible), visible)
    assert tokens.shape == (4, config.num_visible, config.encoder_width)
    if not config.class_token:  # with a class token, forward also passes it to the decoder
        assert torch.allclose(model.decode(tokens, visible), model(patches, visible), atol=1e-6)


@pytest.mark.parametrize("variant", VISIBLE_ONLY)
def test_decoder_gets_one_shared_mask_token_at_every_masked_slot(variant):
    model, config = _model(**MAE_VARIANTS[variant])
    patches, visible = _inputs(config)
    seen = []
    model.decoder.register_forward_pre_hook(lambda _, args: seen.append(args[0]))
    model(patches, visible)
    slots = seen[0][:, 1:] if config.class_token else seen[0]  # [B,M,Dd]
    assert slots.shape == (4, config.num_patches, config.decoder_width)
    without_positions = slots - model.decoder_positions()
    masked = _masked(visible, config.num_patches)
    tokens = without_positions[masked]  # every masked slot of every image
    assert torch.allclose(tokens, model.mask_token.expand_as(tokens), atol=1e-6)
    # the visible slots hold the encoded tokens in their original order
    encoded = model.decoder_embed(model.encode(gather_positions(patches, visible), visible))
    assert torch.allclose(gather_positions(without_positions, visible), encoded, atol=1e-5)


def test_same_visible_values_give_identical_predictions_in_one_batch():
    # Two images that agree on V but not elsewhere: one mask token per masked slot means the
    # decoder cannot tell them apart, so all M predictions agree.
    model, config = _model()
    patches, visible = _inputs(config, batch=1)
    twin = torch.rand(1, config.num_patches, config.patch_dim)
    twin[0, visible[0]] = patches[0, visible[0]]
    pred = model(torch.cat([patches, twin]), visible.expand(2, -1))
    assert torch.allclose(pred[0], pred[1], atol=1e-6, rtol=0)


def test_positions_matter():
    model, config = _model()
    patches, visible = _inputs(config, batch=1)
    shifted = (visible + 1) % config.num_patches
    shifted = shifted.sort(dim=1).values
    values = gather_positions(patches, visible)
    assert not torch.allclose(model.encode(values, visible), model.encode(values, shifted))


def _loss(model, config, patches, visible):
    if config.objective == "mae":
        return masked_mse(model(patches, visible), patches, visible).mean()
    noisy = patches + 0.1 * torch.randn_like(patches) if config.objective == "dae" else patches
    return ((model(noisy) - patches) ** 2).mean()


@pytest.mark.parametrize("variant", ALL_VARIANTS)
def test_every_parameter_gets_a_finite_gradient(variant):
    model, config = _model(**ALL_VARIANTS[variant])
    patches, visible = _inputs(config)
    _loss(model, config, patches, visible).backward()
    for name, parameter in model.named_parameters():
        assert parameter.grad is not None, f"{name} got no gradient"
        assert bool(torch.isfinite(parameter.grad).all()), name
    # parameters the method depends on get a non-zero gradient
    named = dict(model.named_parameters())
    for name in ("encoder.patch_embed.weight", "encoder.patch_embed.embed.proj.weight", "decoder_pred.weight", "mask_token",
                 "encoder_mask_token", "encoder.cls_token", "encoder.reg_token", "encoder.positions.table",
                 "decoder_positions.table", "to_latent.weight", "from_latent.weight"):
        if name in named:
            assert float(named[name].grad.abs().sum()) > 0, name


def test_autoencoder_sees_every_patch():
    model, config = _model(objective="ae")
    patches, visible = _inputs(config)
    with pytest.raises(ValueError, match="every patch"):
        model(patches, visible)
    everything = torch.arange(config.num_patches).expand(4, -1)
    assert torch.equal(model(patches, everything), model(patches))
    assert model.latent(patches).shape == (4, config.latent_dim)


def test_sincos_positions_code_the_column_first_as_he_et_al():
    # He et al.'s get_2d_sincos_pos_embed: meshgrid(grid_w, grid_h) puts the column index in the
    # first half of the width, the row in the second; weights trained by their code (or
    # transformers' ViTMAE) only see the right positions in this order. Grid 3 rows x 4 columns.
    from mae_core.transformer import sincos_1d, sincos_2d
    table = sincos_2d(8, (3, 4))
    for slot in range(12):
        row, col = divmod(slot, 4)
        assert torch.equal(table[slot, :4], sincos_1d(4, torch.tensor([col]))[0])
        assert torch.equal(table[slot, 4:], sincos_1d(4, torch.tensor([row]))[0])


@pytest.mark.parametrize("variant", sorted(ALL_VARIANTS))
def test_layer_norms_use_he_et_al_eps(variant):
    from mae_core.transformer import LAYER_NORM_EPS
    model, _ = _model(**ALL_VARIANTS[variant])
    norms = [m for m in model.modules() if isinstance(m, torch.nn.LayerNorm)]
    assert norms and all(m.eps == LAYER_NORM_EPS == 1e-6 for m in norms)


@pytest.mark.parametrize("variant", ALL_VARIANTS)
def test_the_logged_feature_encoder_gives_the_models_features_and_holds_only_the_encoder(variant):
    from mae_core.models import feature_encoder

    model, config = _model(**ALL_VARIANTS[variant])
    patches, _ = _inputs(config)
    encoder = feature_encoder(model)
    with torch.no_grad():
        torch.testing.assert_close(encoder(patches), model.features(patches))
    names = {name for name, _ in encoder.named_parameters()}
    assert names and all(name.startswith("encoder.") for name in names)
    assert not any("decoder" in name or "mask_token" in name for name in names)
    assert next(encoder.parameters()).data_ptr() != next(model.encoder.parameters()).data_ptr(), "a copy"


# ------------------------------------------------------------------------------ encoder=timm:NAME


@pytest.mark.parametrize("name, keys", [(TIMM, dict(class_token=True)), (TIMM, dict(dataset="photos")),
                                        (TIMM_REGISTERS, dict(dataset="photos"))])
def test_timm_encoder_with_every_patch_visible_computes_timms_forward_features(name, keys):
    # The parts the encoder runs are timm's own (shared, not copied): with every patch visible,
    # patchify + PatchwiseEmbed + positions + blocks + norm is timm's forward_features on the image,
    # so the flattened (row, column, channel) patch order meets timm's Conv2d (C, P, P) exactly.
    if timm_missing():
        pytest.skip(timm_missing())
    from mae_core import patchify
    from mae_core.timm_encoder import TimmEncoder

    config = tiny_config(encoder=name, pos_embed="learned", **keys)
    torch.manual_seed(0)
    encoder = build_model(config).encoder
    assert isinstance(encoder, TimmEncoder)
    vit = _timm_vit_of(encoder, config, name)
    images = torch.rand(3, *config.image_shape)
    patches = patchify(images, config.resolved_patch_size)
    everything = torch.arange(config.num_patches).expand(3, -1)
    with torch.no_grad():
        theirs = vit.forward_features(images)  # [B, prefix + M, D]
        cls, tokens = encoder(encoder.patch_embed(patches), everything)
        torch.testing.assert_close(encoder.patch_embed(patches), vit.patch_embed(images))
    torch.testing.assert_close(tokens, theirs[:, vit.num_prefix_tokens:])
    if config.class_token:
        torch.testing.assert_close(cls, theirs[:, 0])


def _timm_vit_of(encoder, config, name):
    """timm's VisionTransformer holding the encoder's very modules (for the comparison above)."""
    import timm

    channels, height, width = config.image_shape
    vit = timm.create_model(name.removeprefix("timm:"), img_size=(height, width), in_chans=channels,
                            patch_size=config.resolved_patch_size, num_classes=0, global_pool="",
                            class_token=config.class_token, embed_dim=config.encoder_width,
                            depth=config.encoder_depth, num_heads=config.encoder_heads, fc_norm=False)
    vit.patch_embed, vit.blocks, vit.norm = encoder.patch_embed.embed, encoder.transformer.blocks, encoder.transformer.norm
    vit.pos_embed, vit.cls_token, vit.reg_token = encoder.positions.table, encoder.cls_token, encoder.reg_token
    vit.norm_pre = encoder.norm_pre
    return vit.eval()


def test_timm_encoder_takes_its_size_from_the_config_and_keeps_timms_initialisation():
    if timm_missing():
        pytest.skip(timm_missing())
    model, config = _model(encoder=TIMM, encoder_width=24, encoder_depth=2, encoder_heads=3, class_token=True)
    encoder = model.encoder
    assert encoder.width == 24 and len(encoder.transformer.blocks) == 2
    assert encoder.transformer.blocks[0].attn.num_heads == 3
    assert float(encoder.cls_token.abs().max()) < 1e-4  # timm draws the class token with std 1e-6
    assert float(model.mask_token.std()) > 1e-3  # the decoder's parts are He et al.'s (std 0.02)
    from mae_core.models import config_variant_name

    assert config_variant_name(config).startswith("mae_timm-vit_tiny_patch16_224_w24d2_")  # run names
