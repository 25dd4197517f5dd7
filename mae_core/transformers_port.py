"""Our MAE as ``transformers``' ``ViTMAEForPreTraining``: its config, our weights, our mask.

``transformers``' ViTMAE is a port of He et al.'s ``models_mae.py``, so a
:class:`~mae_core.models.MaskedAutoencoder` with ``class_token=True`` (transformers always has
one) computes the same function once its weights are copied over and the same visible set is
forced through ``noise``; ``tests/test_transformers_port.py`` checks that on encoder tokens,
decoder tokens, predictions, the loss and the fixed position tables. The copy needs no
rearranging of the sine-cosine tables (both put the column code first) and no LayerNorm change
on our side; the one setting that must be named is ``layer_norm_eps``: ``ViTMAEConfig``'s
default is 1e-12, He et al.'s (and ours, :data:`~mae_core.transformer.LAYER_NORM_EPS`) 1e-6.

Weights go one way only, ours -> theirs. ``transformers`` is imported inside the functions, so
the engine runs without it (it is in the ``test`` and ``bench`` extras).

Shapes: ``B`` batch, ``M`` patches, ``k`` visible count, ``D``/``Dd`` encoder/decoder width,
``C`` channels, ``P`` patch side, ``q = P²C``.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import torch

from .models import MaskedAutoencoder
from .transformer import LAYER_NORM_EPS, Transformer

if TYPE_CHECKING:
    from transformers import ViTMAEConfig, ViTMAEForPreTraining

    from .config import Config


def vitmae_config(config: Config, attn_implementation: str = "sdpa") -> ViTMAEConfig:
    """The ``ViTMAEConfig`` of the MAE ``config`` describes: sizes, depths, heads, MLP width,
    patch grid, ρ and the target (``norm_eps`` is ``norm_pix_loss``), no dropout, eps 1e-6.

    Raises ``ValueError`` for what transformers cannot express: a non-square image (its
    patchify and its sine-cosine grid are square only) or the strict ``norm`` target
    (population std, no epsilon; transformers has only He et al.'s ``norm_eps``).
    """
    from transformers import ViTMAEConfig

    channels, height, width = config.image_shape
    if height != width:
        raise ValueError(f"transformers' ViTMAE takes square images only, not {height}x{width}")
    if config.target == "norm":
        raise ValueError("transformers' ViTMAE has no strict target=norm (it computes norm_eps)")
    return ViTMAEConfig(
        image_size=height, patch_size=config.resolved_patch_size, num_channels=channels,
        hidden_size=config.encoder_width, num_hidden_layers=config.encoder_depth,
        num_attention_heads=config.encoder_heads,
        intermediate_size=int(config.encoder_width * config.mlp_ratio),  # as transformer.Block
        decoder_hidden_size=config.decoder_width, decoder_num_hidden_layers=config.decoder_depth,
        decoder_num_attention_heads=config.decoder_heads,
        decoder_intermediate_size=int(config.decoder_width * config.mlp_ratio),
        mask_ratio=config.mask_ratio, norm_pix_loss=config.target == "norm_eps",
        layer_norm_eps=LAYER_NORM_EPS,  # ViTMAEConfig's default is 1e-12; He et al. use 1e-6
        hidden_dropout_prob=0.0, attention_probs_dropout_prob=0.0, attn_implementation=attn_implementation,
    )


def _transformer_state(ours: Transformer, layers: str, final_norm: str) -> dict[str, torch.Tensor]:
    """Our blocks under transformers' ``ViTMAELayer`` names: fused ``qkv [3D,D]`` -> q, k, v."""
    state: dict[str, torch.Tensor] = {}
    for i, block in enumerate(ours.blocks):
        at = f"{layers}.{i}"
        # Attention views qkv's output as (3, heads, D/heads): rows [0,D) are q, [D,2D) k, [2D,3D) v,
        # each with its heads contiguous, as q_proj/k_proj/v_proj's outputs are viewed.
        for name, weight, bias in zip(("q", "k", "v"), block.attn.qkv.weight.chunk(3), block.attn.qkv.bias.chunk(3)):
            state[f"{at}.attention.{name}_proj.weight"] = weight
            state[f"{at}.attention.{name}_proj.bias"] = bias
        for theirs, mine in (("attention.o_proj", block.attn.proj), ("layernorm_before", block.norm1),
                             ("layernorm_after", block.norm2), ("mlp.fc1", block.mlp[0]), ("mlp.fc2", block.mlp[2])):
            state[f"{at}.{theirs}.weight"] = mine.weight
            state[f"{at}.{theirs}.bias"] = mine.bias
    state[f"{final_norm}.weight"] = ours.norm.weight
    state[f"{final_norm}.bias"] = ours.norm.bias
    return state


def _with_class_row(table: torch.Tensor) -> torch.Tensor:
    """Our position table ``[M,W]`` -> theirs ``[1,1+M,W]``: a zero row for the class token (as
    He et al.'s ``get_2d_sincos_pos_embed(..., cls_token=True)``; we add nothing to it either)."""
    return torch.cat([table.new_zeros(1, table.shape[1]), table])[None]


def vitmae_state_dict(model: MaskedAutoencoder, patch_size: int) -> dict[str, torch.Tensor]:
    """Every tensor of ``model`` under ``ViTMAEForPreTraining``'s names and layouts.

    The patch embedding is our ``Linear(q -> D)`` on patches flattened (row, column, channel)
    (:func:`~mae_core.patches.patchify`); theirs is a ``Conv2d`` with kernel = stride = P, whose
    weight ``[D,C,P,P]`` is the same map with the channel axis moved first; its output flattened
    row-major is our patch order. The position tables are copied too (they are buffers for
    ``sincos``, equal to transformers' own, and parameters for ``learned``).
    """
    if model.encoder.cls_token is None:
        raise ValueError("transformers' ViTMAE always has a class token: build ours with class_token=True")
    if model.mask_token is None:
        raise ValueError("mask_token_in_encoder (MAE Table 1c) has no ViTMAE counterpart")
    encoder, channels = model.encoder, model.patch_dim // patch_size ** 2
    embed = encoder.patch_embed.weight  # [D, q], q ordered (row, column, channel)
    state = {
        "vit.embeddings.cls_token": encoder.cls_token,
        "vit.embeddings.position_embeddings": _with_class_row(encoder.positions()),
        "vit.embeddings.patch_embeddings.projection.weight":
            embed.reshape(-1, patch_size, patch_size, channels).permute(0, 3, 1, 2),
        "vit.embeddings.patch_embeddings.projection.bias": encoder.patch_embed.bias,
        **_transformer_state(encoder.transformer, "vit.layers", "vit.layernorm"),
        "decoder.mask_token": model.mask_token.reshape(1, 1, -1),
        "decoder.decoder_pos_embed": _with_class_row(model.decoder_positions()),
        "decoder.decoder_embed.weight": model.decoder_embed.weight,
        "decoder.decoder_embed.bias": model.decoder_embed.bias,
        **_transformer_state(model.decoder, "decoder.decoder_layers", "decoder.decoder_norm"),
        "decoder.decoder_pred.weight": model.decoder_pred.weight,
        "decoder.decoder_pred.bias": model.decoder_pred.bias,
    }
    return {name: tensor.detach().clone() for name, tensor in state.items()}


def to_vitmae(model: MaskedAutoencoder, config: Config) -> ViTMAEForPreTraining:
    """A ``ViTMAEForPreTraining`` holding ``model``'s weights, in its dtype, device and mode.

    Every tensor is written (``strict`` loading: none missing, none left over), the position
    tables included: a freshly built ``ViTMAEForPreTraining`` of transformers 5.24 holds zero
    position tables, class and mask tokens (its generic initialisation marks the patch
    projection initialised before ``ViTMAEEmbeddings.initialize_weights`` runs, which then
    returns early, and zeroes the decoder's table after the decoder wrote it), so nothing of
    theirs may be relied on.
    """
    from transformers import ViTMAEForPreTraining

    peer = ViTMAEForPreTraining(vitmae_config(config))
    parameter = next(model.parameters())
    peer.load_state_dict(vitmae_state_dict(model, config.resolved_patch_size), strict=True)
    return peer.to(dtype=parameter.dtype, device=parameter.device).train(model.training)


def vitmae_noise(visible: torch.Tensor, num_patches: int) -> torch.Tensor:
    """``noise [B,M]`` for which transformers' ``random_masking`` keeps exactly ``visible [B,k]``,
    in that order: its kept set is the first k of ``argsort(noise)``, so the visible positions get
    0..k-1 and the masked ones distinct values from k up (no ties for argsort to break)."""
    batch, k = visible.shape
    noise = torch.arange(k, k + num_patches, dtype=torch.float64, device=visible.device).repeat(batch, 1)
    return noise.scatter(1, visible, torch.arange(k, dtype=torch.float64, device=visible.device).repeat(batch, 1))
