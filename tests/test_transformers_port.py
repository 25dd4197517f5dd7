"""Our MAE ported into ``transformers``' ViTMAEForPreTraining computes the same function.

transformers' ViTMAE is a port of He et al.'s ``models_mae.py``; with our weights copied in
(:mod:`mae_core.transformers_port`) and our visible set forced through its ``noise`` argument,
the two must agree on the encoder's tokens, the decoder's tokens, every prediction and the loss,
for the raw target and for ``norm_eps`` (its ``norm_pix_loss``), and our fixed sine-cosine
tables must equal the ones transformers' own code builds (column code first, as He et al.).
"""

from __future__ import annotations

import pytest
import torch

from mae_core import Config, apply_target, build_model, masked_mse, patchify, sample_visible
from mae_core.masking import masked_positions
from mae_core.transformer import LAYER_NORM_EPS
from mae_core.transformers_port import to_vitmae, vitmae_config, vitmae_noise

# digits-like 8x8x1 with patch 2 (M=16, q=4) and RGB 32x32x3 with patch 4 (M=64, q=48). Depth 2
# on both sides so a swapped block or norm shows; mlp_ratio 3 so the MLP widths are mapped, not
# transformers' default 4 by luck.
SHAPES = {
    "digits_8x8x1_p2": dict(dataset="digits", patch_size=2),
    "photos_32x32x3_p4": dict(dataset="photos", patch_size=4),
}
MODEL = dict(encoder_width=32, encoder_depth=2, encoder_heads=4, decoder_width=16, decoder_depth=2,
             decoder_heads=2, mlp_ratio=3.0, class_token=True)
# 0.6 makes M(1-ρ) fractional (6.4 and 25.6): both sides must floor it to the same k.
MASK_RATIOS = (0.75, 0.6)
# Max abs difference allowed, per dtype. The two compute in a different order (fused qkv, a
# Conv2d against a Linear, another summation order in the loss), so they agree to rounding:
# measured at most 2.2e-6 in fp32 and 3.6e-15 in fp64 on predictions of size about 2. fp64 is
# the sharp check: transformers' default LayerNorm eps (1e-12 instead of 1e-6) already moves
# the predictions by 7e-6, which only the fp64 bound sees.
TOLERANCE = {torch.float32: 1e-5, torch.float64: 1e-12}
BATCH = 3


def _config(shape: str, mask_ratio: float = 0.75, target: str = "raw") -> Config:
    return Config(**SHAPES[shape], **MODEL, mask_ratio=mask_ratio, target=target)


def _our_model(config: Config, dtype: torch.dtype) -> torch.nn.Module:
    """Our MAE with every weight moved off its initial value: He et al.'s init leaves biases at 0
    and LayerNorms at 1, which would hide a bias or a norm copied to the wrong place."""
    torch.manual_seed(0)
    model = build_model(config)
    with torch.no_grad():
        for parameter in model.parameters():
            parameter.add_(0.2 * torch.randn_like(parameter))
    return model.to(dtype).eval()


def _images(config: Config, masked_slot: int, dtype: torch.dtype) -> torch.Tensor:
    """Uniform pixels ``[B,C,H,W]``, with one constant patch (at a masked slot of image 0, so it
    enters the loss) where norm_eps divides by sqrt(0 + 1e-6) on both sides."""
    generator = torch.Generator().manual_seed(1)
    images = torch.rand(BATCH, *config.image_shape, generator=generator, dtype=torch.float64)
    p, cols = config.resolved_patch_size, config.grid[1]
    row, col = divmod(masked_slot, cols)
    images[0, :, row * p:(row + 1) * p, col * p:(col + 1) * p] = 0.5
    return images.to(dtype)


def _output_of(module: torch.nn.Module, store: dict, key: str):
    return module.register_forward_hook(lambda _module, _inputs, output: store.__setitem__(key, output))


# Every shape, ratio and dtype with the fixed tables; learned tables (copied like any weight) once.
CASES = [pytest.param(shape, ratio, dtype, "sincos", id=f"{shape}-{ratio}-{name}")
         for shape in SHAPES for ratio in MASK_RATIOS
         for dtype, name in ((torch.float32, "fp32"), (torch.float64, "fp64"))]
CASES.append(pytest.param("photos_32x32x3_p4", 0.75, torch.float64, "learned", id="photos_32x32x3_p4-0.75-fp64-learned"))


@pytest.mark.parametrize(("shape", "mask_ratio", "dtype", "pos_embed"), CASES)
def test_ported_weights_agree_with_transformers(shape, mask_ratio, dtype, pos_embed):
    config = _config(shape, mask_ratio).with_updates(pos_embed=pos_embed)
    ours = _our_model(config, dtype)
    peer = to_vitmae(ours, config)
    m, k, p = config.num_patches, config.num_visible, config.resolved_patch_size
    # Every weight of ours lands in theirs (strict loading also says none of theirs is missing):
    # their only extra values are the class token's zero rows in the two position tables.
    ours_count = sum(t.numel() for t in (*ours.parameters(), *ours.buffers()))  # sincos tables: buffers
    assert (sum(t.numel() for t in peer.state_dict().values())
            == ours_count + config.encoder_width + config.decoder_width)
    # One LayerNorm eps on both sides, He et al.'s 1e-6: ours as built, theirs from the mapping.
    eps = [{norm.eps for norm in model.modules() if isinstance(norm, torch.nn.LayerNorm)} for model in (ours, peer)]
    assert eps[0] == eps[1] == {LAYER_NORM_EPS} == {1e-6}

    generator = torch.Generator().manual_seed(2)
    visible = sample_visible(BATCH, m, k, generator)  # [B,k]
    masked = masked_positions(visible, m)  # [B,M]
    images = _images(config, int(masked[0].nonzero()[0]), dtype)
    patches = patchify(images, p)
    # Their patchify (the order of their targets) is ours: (row, column, channel) in a patch.
    assert torch.equal(peer.patchify(images), patches)

    mine, theirs = {}, {}
    hooks = [_output_of(ours.encoder, mine, "encoder"), _output_of(ours.decoder, mine, "decoder"),
             _output_of(peer.vit, theirs, "encoder"), _output_of(peer.decoder.decoder_norm, theirs, "decoder")]
    with torch.no_grad():
        pred = ours(patches, visible)  # [B,M,q]
        out = peer(pixel_values=images, noise=vitmae_noise(visible, m))
    for hook in hooks:
        hook.remove()

    # The same visible set, in the same order: their mask is 1 exactly on our masked slots.
    assert torch.equal(out.mask.bool(), masked)
    tol = dict(rtol=0.0, atol=TOLERANCE[dtype])
    cls, tokens = mine["encoder"]  # [B,D], [B,k,D]
    encoded = theirs["encoder"].last_hidden_state  # [B,1+k,D]: class token first
    torch.testing.assert_close(encoded[:, 0], cls, **tol)
    torch.testing.assert_close(encoded[:, 1:], tokens, **tol)
    # Decoder tokens after the final norm [B,1+M,Dd]: the class token, then all M slots in grid order.
    torch.testing.assert_close(theirs["decoder"], mine["decoder"], **tol)
    torch.testing.assert_close(out.logits, pred, **tol)  # every patch's prediction, visible ones too

    # The loss, for both targets transformers has (norm_pix_loss off and on), is the same quantity.
    # Ours is the spec's per-example l_MAE = ((M-k)q)^-1 sum_{j not in V} ||x̂_j - T(x_j)||^2,
    # averaged over the batch. Theirs is the sum over the batch's masked patches of the per-patch
    # mean (1/q)||x̂_j - T(x_j)||^2, divided by the number of masked patches, B(M-k): every image
    # has exactly M-k masked patches, so both are (B(M-k)q)^-1 times the same double sum and differ
    # only in summation order. The targets agree: raw is the identity, and norm_eps is He et al.'s
    # (u - mean)/sqrt(var + 1e-6) with the unbiased variance on both sides (the constant patch of
    # image 0 checks the epsilon). Visible slots enter neither loss.
    for target in ("raw", "norm_eps"):
        peer = to_vitmae(ours, config.with_updates(target=target))
        assert peer.config.norm_pix_loss == (target == "norm_eps")
        with torch.no_grad():
            their_loss = peer(pixel_values=images, noise=vitmae_noise(visible, m)).loss
        torch.testing.assert_close(their_loss, masked_mse(pred, apply_target(patches, target), visible).mean(), **tol)


@pytest.mark.parametrize("shape", SHAPES)
def test_sincos_tables_equal_transformers_own(shape):
    # transformers' own tables, made by its own code: a ViTMAEEmbeddings and a ViTMAEDecoder built
    # alone (a whole fresh ViTMAEForPreTraining of transformers 5.24 leaves them zero; see
    # mae_core.transformers_port.to_vitmae). transformers builds each table row code first and
    # then rotates its halves so the column comes first, as He et al.'s get_2d_sincos_pos_embed;
    # ours is built column first, so no half-swapping is needed to load either way.
    # imported here: at module level every xdist worker paid 2.5 s to collect this file
    from transformers.models.vit_mae.modeling_vit_mae import ViTMAEDecoder, ViTMAEEmbeddings

    config = _config(shape)
    peer_config = vitmae_config(config)
    embeddings = ViTMAEEmbeddings(peer_config)
    embeddings.initialize_weights()
    decoder = ViTMAEDecoder(peer_config, num_patches=config.num_patches)
    ours = build_model(config)
    for their_table, our_table in ((embeddings.position_embeddings, ours.encoder.positions()),
                                   (decoder.decoder_pos_embed, ours.decoder_positions())):
        assert torch.equal(their_table[0, 0], torch.zeros_like(their_table[0, 0]))  # the class token's row
        assert torch.equal(their_table[0, 1:], our_table)  # bitwise: both compute in fp64, then round


def test_config_mapping_refuses_what_transformers_cannot_express():
    with pytest.raises(ValueError, match="norm_eps"):
        vitmae_config(_config("digits_8x8x1_p2", target="norm"))
    model = build_model(Config(**SHAPES["digits_8x8x1_p2"], **{**MODEL, "class_token": False}))
    with pytest.raises(ValueError, match="class token"):
        to_vitmae(model, _config("digits_8x8x1_p2"))
