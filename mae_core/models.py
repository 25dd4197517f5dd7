"""Encoders and decoders: the visible-only MAE and the bottleneck AE/DAE.

Shapes: ``B`` batch, ``M`` patches, ``q`` values per patch, ``k`` visible count, ``D`` encoder
width, ``Dd`` decoder width, ``Z`` latent width.

* :class:`MaskedAutoencoder` realises the spec's masked maps (He et al. §3): the encoder maps
  ``(V, (x_j)_{j∈V})`` to one token per visible position and never receives mask tokens or
  masked values; the decoder receives those tokens in their original order, one shared learned
  mask token ``m`` at every position of ``[M] \\ V``, position information for all M slots,
  and predicts ``x̂_j ∈ R^q`` for every j (spec, training procedure step 2).
* ``mask_token_in_encoder=True`` is MAE Table 1c's "w/ [M]" ablation: the encoder processes
  all M slots with mask tokens in place. It is *outside* the specification.
* :class:`BottleneckAutoencoder` is the spec's unmasked pair ``E: X -> Z``, ``D: Z -> X`` for
  the plain and denoising autoencoders: the encoder sees all M patches and pools them into one
  ``Z``-dimensional latent; the decoder expands the latent with positions back to M patches.

With ``class_token=True`` the MAE computes what He et al.'s ``models_mae.py`` computes:
``tests/test_transformers_port.py`` copies its weights into ``transformers``' port of that code
(:mod:`mae_core.transformers_port`) and finds the same tokens, predictions and loss to rounding.
"""

from __future__ import annotations


import torch
import torch.nn.functional as F
from torch import nn

# ----------------------------------------------------------------------------- helpers


def sincos_1d(width: int, positions: torch.Tensor) -> torch.Tensor:
    """Fixed sine-cosine code of integer positions ``[L] -> [L, width]``."""
    omega = 1.0 / 10000 ** (torch.arange(width // 2, dtype=torch.float64) / (width / 2))
    angles = positions.to(torch.float64)[:, None] * omega[None, :]
    return torch.cat([angles.sin(), angles.cos()], dim=1).float()


def sincos_2d(width: int, grid: tuple[int, int]) -> torch.Tensor:
    """2-D sine-cosine positions of a row-major grid ``-> [M, width]``: the first half of the width
    codes the column, the second the row, in that order as He et al.'s ``get_2d_sincos_pos_embed``
    (its ``meshgrid(grid_w, grid_h)`` puts the column first), so weights trained by their code or
    by ``transformers``' ViTMAE see the positions they were trained with."""
    rows, cols = grid
    r = torch.arange(rows).repeat_interleave(cols)
    c = torch.arange(cols).repeat(rows)
    return torch.cat([sincos_1d(width // 2, c), sincos_1d(width // 2, r)], dim=1)


class Positions(nn.Module):
    """Position information for the M slots: fixed sine-cosine (default) or learned."""

    def __init__(self, width: int, grid: tuple[int, int], kind: str):
        super().__init__()
        table = sincos_2d(width, grid)
        if kind == "sincos":
            self.register_buffer("table", table, persistent=False)
        elif kind == "learned":
            self.table = nn.Parameter(0.02 * torch.randn_like(table))
        else:
            raise ValueError(f"pos_embed={kind!r} is not one of sincos, learned")

    def forward(self) -> torch.Tensor:  # [M, width]
        return self.table


# ------------------------------------------------------------------------------ blocks


class Attention(nn.Module):
    def __init__(self, width: int, heads: int):
        super().__init__()
        self.heads = heads
        self.qkv = nn.Linear(width, 3 * width)
        self.proj = nn.Linear(width, width)

    def forward(self, x: torch.Tensor) -> torch.Tensor:  # [B,L,D] -> [B,L,D]
        batch, length, width = x.shape
        qkv = self.qkv(x).view(batch, length, 3, self.heads, width // self.heads)
        q, k, v = qkv.permute(2, 0, 3, 1, 4).unbind(0)  # each [B,heads,L,D/heads]
        out = F.scaled_dot_product_attention(q, k, v)
        return self.proj(out.transpose(1, 2).reshape(batch, length, width))


# He et al. build every block with ``partial(nn.LayerNorm, eps=1e-6)`` (torch's default is 1e-5;
# transformers' ViTMAEConfig's is 1e-12, so a port must name 1e-6: transformers_port does).
LAYER_NORM_EPS = 1e-6


class Block(nn.Module):
    """Pre-norm transformer block (ViT)."""

    def __init__(self, width: int, heads: int, mlp_ratio: float):
        super().__init__()
        hidden = int(width * mlp_ratio)
        self.norm1 = nn.LayerNorm(width, eps=LAYER_NORM_EPS)
        self.attn = Attention(width, heads)
        self.norm2 = nn.LayerNorm(width, eps=LAYER_NORM_EPS)
        self.mlp = nn.Sequential(nn.Linear(width, hidden), nn.GELU(), nn.Linear(hidden, width))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = x + self.attn(self.norm1(x))
        return x + self.mlp(self.norm2(x))


class Transformer(nn.Module):
    """``depth`` blocks then a final LayerNorm: ``[B,L,D] -> [B,L,D]``."""

    def __init__(self, width: int, depth: int, heads: int, mlp_ratio: float):
        super().__init__()
        self.blocks = nn.ModuleList(Block(width, heads, mlp_ratio) for _ in range(depth))
        self.norm = nn.LayerNorm(width, eps=LAYER_NORM_EPS)

    def forward(self, x: torch.Tensor, blocks: int | None = None) -> torch.Tensor:
        """``blocks``: apply only the first ``blocks`` blocks (1-based count, in [1, depth]), then
        the final norm; None = all (the layer-wise probes' features, ``eval.probe_blocks``)."""
        if blocks is not None and not 1 <= blocks <= len(self.blocks):
            raise ValueError(f"blocks={blocks} must lie in [1, {len(self.blocks)}] (the depth)")
        for block in self.blocks if blocks is None else self.blocks[:blocks]:
            x = block(x)
        return self.norm(x)


def init_weights(module: nn.Module) -> None:
    """He et al.'s initialisation: xavier-uniform linears, zero biases, unit LayerNorms."""
    for m in module.modules():
        if isinstance(m, nn.Linear):
            nn.init.xavier_uniform_(m.weight)
            nn.init.zeros_(m.bias)
        elif isinstance(m, nn.LayerNorm):
            nn.init.ones_(m.weight)
            nn.init.zeros_(m.bias)


def gather_positions(x: torch.Tensor, index: torch.Tensor) -> torch.Tensor:
    """``x[b, index[b, i]]``: ``[B,M,*]`` with ``[B,k]`` -> ``[B,k,*]``."""
    return torch.gather(x, 1, index[..., None].expand(-1, -1, x.shape[-1]))


# ----------------------------------------------------------------------------- encoder


class ViTEncoder(nn.Module):
    """Patch embedding + positions + transformer; optionally a class token in front."""

    def __init__(self, patch_dim: int, grid: tuple[int, int], width: int, depth: int,
                 heads: int, mlp_ratio: float, pos_embed: str, class_token: bool):
        super().__init__()
        self.patch_embed = nn.Linear(patch_dim, width)
        self.positions = Positions(width, grid, pos_embed)
        self.cls_token = nn.Parameter(torch.zeros(1, 1, width)) if class_token else None
        self.transformer = Transformer(width, depth, heads, mlp_ratio)

    def forward(self, tokens: torch.Tensor, positions: torch.Tensor,
                blocks: int | None = None) -> tuple[torch.Tensor | None, torch.Tensor]:
        """Embedded tokens ``[B,L,D]`` at grid ``positions [B,L]`` -> (class token ``[B,D]`` or None, tokens ``[B,L,D]``);
        ``blocks``: after the first ``blocks`` blocks (final norm applied; see :class:`Transformer`)."""
        x = tokens + self.positions()[positions]
        if self.cls_token is None:
            return None, self.transformer(x, blocks=blocks)
        x = self.transformer(torch.cat([self.cls_token.expand(x.shape[0], -1, -1), x], dim=1), blocks=blocks)
        return x[:, 0], x[:, 1:]


# What ``features`` hands a probe: ``mean`` the mean-pooled tokens ``[B,D]``, ``cls`` the class
# token ``[B,D]`` (what MAE's linear probe reads), ``both`` the two side by side ``[B,2D]``
# (class token first); ``auto`` is ``both`` with a class token and ``mean`` without.
FEATURE_POOLS = ("auto", "mean", "cls", "both")


def pooled_features(cls: torch.Tensor | None, tokens: torch.Tensor, pool: str = "auto") -> torch.Tensor:
    """The probe's representation of the class token ``[B,D]`` (or None) and tokens ``[B,L,D]``:
    ``[B,D]`` for ``mean`` and ``cls``, ``[B,2D]`` for ``both`` (see :data:`FEATURE_POOLS`)."""
    if pool == "auto":
        pool = "mean" if cls is None else "both"
    if pool not in FEATURE_POOLS:
        raise ValueError(f"pool={pool!r} is not one of {', '.join(FEATURE_POOLS)}")
    if pool != "mean" and cls is None:
        raise ValueError(f"pool={pool} reads the class token; this model has none (class_token=False)")
    if pool == "cls":
        return cls
    pooled = tokens.mean(dim=1)
    return pooled if pool == "mean" else torch.cat([cls, pooled], dim=1)


# ------------------------------------------------------------------------------ models


class MaskedAutoencoder(nn.Module):
    """Visible-only ViT encoder + mask-token decoder (spec; He et al. §3.1-3.3)."""

    def __init__(self, *, patch_dim: int, grid: tuple[int, int], encoder_width: int,
                 encoder_depth: int, encoder_heads: int, decoder_width: int, decoder_depth: int,
                 decoder_heads: int, mlp_ratio: float = 4.0, pos_embed: str = "sincos",
                 class_token: bool = False, mask_token_in_encoder: bool = False, out_dim: int | None = None):
        super().__init__()
        self.num_patches = grid[0] * grid[1]
        self.patch_dim = patch_dim
        self.mask_token_in_encoder = mask_token_in_encoder
        self.encoder = ViTEncoder(patch_dim, grid, encoder_width, encoder_depth, encoder_heads,
                                  mlp_ratio, pos_embed, class_token)
        # Table 1c ablation only: a mask token in the encoder's width, outside the spec.
        self.encoder_mask_token = (nn.Parameter(torch.zeros(encoder_width))
                                   if mask_token_in_encoder else None)
        self.decoder_embed = nn.Linear(encoder_width, decoder_width)
        if mask_token_in_encoder:  # the decoder then gets M encoded slots: a decoder m would be dead
            self.register_parameter("mask_token", None)
        else:
            self.mask_token = nn.Parameter(torch.zeros(decoder_width))  # the spec's shared m
        self.decoder_positions = Positions(decoder_width, grid, pos_embed)
        self.decoder = Transformer(decoder_width, decoder_depth, decoder_heads, mlp_ratio)
        self.decoder_pred = nn.Linear(decoder_width, out_dim or patch_dim)  # the target's width
        init_weights(self)
        for token in (self.mask_token, self.encoder_mask_token, self.encoder.cls_token):
            if token is not None:
                nn.init.normal_(token, std=0.02)

    def _encode(self, values: torch.Tensor, visible: torch.Tensor,
                blocks: int | None = None) -> tuple[torch.Tensor | None, torch.Tensor]:
        """values ``[B,k,q]``, visible ``[B,k]`` -> (cls ``[B,D]`` | None, tokens ``[B,k,D]``,
        or ``[B,M,D]`` for the mask-token-in-encoder ablation); ``blocks``: see :class:`Transformer`."""
        embedded = self.encoder.patch_embed(values)  # [B,k,D]
        if self.encoder_mask_token is None:
            return self.encoder(embedded, visible, blocks=blocks)
        batch, width = values.shape[0], embedded.shape[-1]
        # Under autocast the embedding is bf16/fp16 while the token parameter stays fp32.
        full = self.encoder_mask_token.to(embedded.dtype).expand(batch, self.num_patches, width)
        full = full.scatter(1, visible[..., None].expand(-1, -1, width), embedded)
        all_positions = torch.arange(self.num_patches, device=values.device).expand(batch, -1)
        return self.encoder(full, all_positions, blocks=blocks)

    def encode(self, values: torch.Tensor, visible: torch.Tensor) -> torch.Tensor:
        """The spec's masked encoder: visible values ``[B,k,q]`` at positions ``[B,k]`` -> ``[B,k,D]``."""
        _, tokens = self._encode(values, visible)
        if self.encoder_mask_token is not None:
            tokens = gather_positions(tokens, visible)
        return tokens

    def decode(self, tokens: torch.Tensor, visible: torch.Tensor,
               cls: torch.Tensor | None = None) -> torch.Tensor:
        """Encoded tokens ``[B,k,D]`` (``[B,M,D]`` for the ablation) -> predictions ``[B,M,q]``."""
        y = self.decoder_embed(tokens)
        if self.encoder_mask_token is None:
            # Restore the original order: m at every slot, then the visible tokens put back.
            batch, width = y.shape[0], y.shape[-1]
            # Under autocast y is bf16/fp16 while the token parameter stays fp32.
            full = self.mask_token.to(y.dtype).expand(batch, self.num_patches, width)
            y = full.scatter(1, visible[..., None].expand(-1, -1, width), y)
        y = y + self.decoder_positions()  # position information for all M slots
        if cls is not None:
            y = torch.cat([self.decoder_embed(cls)[:, None], y], dim=1)
        y = self.decoder(y)
        if cls is not None:
            y = y[:, 1:]
        return self.decoder_pred(y)

    def forward(self, patches: torch.Tensor, visible: torch.Tensor) -> torch.Tensor:
        """patches ``[B,M,q]``, visible ``[B,k]`` -> predictions ``[B,M,q]``.

        Only ``patches`` at ``visible`` reach the encoder (the values are gathered here).
        """
        cls, tokens = self._encode(gather_positions(patches, visible), visible)
        return self.decode(tokens, visible, cls)

    def features(self, patches: torch.Tensor, pool: str = "auto", blocks: int | None = None) -> torch.Tensor:
        """All patches visible -> the probe's representation ``[B,F]`` (``pool``: :data:`FEATURE_POOLS`);
        ``blocks=b``: of the tokens after the first b encoder blocks, final norm applied (b = depth
        is the default, bitwise)."""
        everything = torch.arange(self.num_patches, device=patches.device).expand(patches.shape[0], -1)
        cls, tokens = self._encode(patches, everything, blocks=blocks)
        return pooled_features(cls, tokens, pool)


class BottleneckAutoencoder(nn.Module):
    """The spec's unmasked ``E: X -> Z`` and ``D: Z -> X`` (plain and denoising autoencoders)."""

    def __init__(self, *, patch_dim: int, grid: tuple[int, int], encoder_width: int,
                 encoder_depth: int, encoder_heads: int, decoder_width: int, decoder_depth: int,
                 decoder_heads: int, latent_dim: int, mlp_ratio: float = 4.0,
                 pos_embed: str = "sincos", class_token: bool = False, out_dim: int | None = None):
        super().__init__()
        self.num_patches = grid[0] * grid[1]
        self.patch_dim = patch_dim
        self.encoder = ViTEncoder(patch_dim, grid, encoder_width, encoder_depth, encoder_heads,
                                  mlp_ratio, pos_embed, class_token)
        self.to_latent = nn.Linear(encoder_width, latent_dim)
        self.from_latent = nn.Linear(latent_dim, decoder_width)
        self.decoder_positions = Positions(decoder_width, grid, pos_embed)
        self.decoder = Transformer(decoder_width, decoder_depth, decoder_heads, mlp_ratio)
        self.decoder_pred = nn.Linear(decoder_width, out_dim or patch_dim)  # the target's width
        init_weights(self)
        if self.encoder.cls_token is not None:
            nn.init.normal_(self.encoder.cls_token, std=0.02)

    def _encode(self, patches: torch.Tensor, blocks: int | None = None) -> tuple[torch.Tensor | None, torch.Tensor]:
        everything = torch.arange(self.num_patches, device=patches.device).expand(patches.shape[0], -1)
        return self.encoder(self.encoder.patch_embed(patches), everything, blocks=blocks)

    def encode(self, values: torch.Tensor, visible: torch.Tensor | None = None) -> torch.Tensor:
        """All M patch values ``[B,M,q]`` -> tokens ``[B,M,D]`` (the encoder sees every patch)."""
        self._require_all_visible(visible)
        return self._encode(values)[1]

    def latent(self, patches: torch.Tensor) -> torch.Tensor:
        """The spec's ``E(x)``: ``[B,M,q] -> [B,Z]`` (mean-pooled tokens, projected)."""
        return self.to_latent(self._encode(patches)[1].mean(dim=1))

    def decode(self, z: torch.Tensor) -> torch.Tensor:
        """The spec's ``D(z)``: ``[B,Z] -> [B,M,q]``."""
        y = self.from_latent(z)[:, None, :] + self.decoder_positions()  # [B,M,Dd]
        return self.decoder_pred(self.decoder(y))

    def forward(self, patches: torch.Tensor, visible: torch.Tensor | None = None) -> torch.Tensor:
        """``D(E(x))``: ``[B,M,q] -> [B,M,q]``."""
        self._require_all_visible(visible)
        return self.decode(self.latent(patches))

    def features(self, patches: torch.Tensor, pool: str = "auto", blocks: int | None = None) -> torch.Tensor:
        """The probe's representation ``[B,F]``: pooled encoder tokens (``pool``: :data:`FEATURE_POOLS`;
        the latent is a linear map of the mean, so a linear probe on these is at least as strong);
        ``blocks``: after the first b encoder blocks, as :meth:`MaskedAutoencoder.features`."""
        return pooled_features(*self._encode(patches, blocks=blocks), pool)

    def _require_all_visible(self, visible: torch.Tensor | None) -> None:
        if visible is not None and visible.shape[1] != self.num_patches:
            raise ValueError("an autoencoder's encoder sees every patch; pass visible=None")


class FeatureEncoder(nn.Module):
    """A trained model's encoder alone, as the probes read it: patches ``[B,M,q]`` -> features
    ``[B,F]`` with every patch visible (what ``features`` of either model returns).

    One tensor in, one out, so MLflow's pytorch flavour can serve it; it holds only the encoder
    (the decoder, and an MAE's mask tokens, take no part when every patch is visible).
    """

    def __init__(self, encoder: ViTEncoder, num_patches: int):
        super().__init__()
        self.encoder = encoder
        self.num_patches = num_patches

    def forward(self, patches: torch.Tensor) -> torch.Tensor:
        everything = torch.arange(self.num_patches, device=patches.device).expand(patches.shape[0], -1)
        return pooled_features(*self.encoder(self.encoder.patch_embed(patches), everything))


def feature_encoder(model: nn.Module) -> FeatureEncoder:
    """The encoder of a trained :class:`MaskedAutoencoder` or :class:`BottleneckAutoencoder`,
    copied to the CPU in eval mode (the trained model itself is left as it was)."""
    import copy

    return FeatureEncoder(copy.deepcopy(model.encoder).float().cpu(), model.num_patches).eval()


def variant_name(objective: str, encoder_width: int, encoder_depth: int, decoder_width: int,
                 decoder_depth: int, latent_dim: int | None = None,
                 mask_token_in_encoder: bool = False) -> str:
    """A name that says what the model is, e.g. ``mae_vit_w64d4_dec32d2`` (used in run names)."""
    name = f"{objective}_vit_w{encoder_width}d{encoder_depth}_dec{decoder_width}d{decoder_depth}"
    if objective in ("ae", "dae"):
        name += f"_z{latent_dim}"
    if mask_token_in_encoder:
        name += "_enc_mask_token"
    return name




def build_model(config) -> nn.Module:
    """The model a :class:`~mae_core.config.Config` describes (MAE, or the AE/DAE bottleneck pair)."""
    common = dict(
        patch_dim=config.patch_dim, grid=config.grid,
        encoder_width=config.encoder_width, encoder_depth=config.encoder_depth,
        encoder_heads=config.encoder_heads, decoder_width=config.decoder_width,
        decoder_depth=config.decoder_depth, decoder_heads=config.decoder_heads,
        mlp_ratio=config.mlp_ratio, pos_embed=config.pos_embed, class_token=config.class_token,
        out_dim=config.target_dim,
    )
    if config.objective == "mae":
        return MaskedAutoencoder(**common, mask_token_in_encoder=config.mask_token_in_encoder)
    return BottleneckAutoencoder(**common, latent_dim=config.latent_dim)


def config_variant_name(config) -> str:
    return variant_name(config.objective, config.encoder_width, config.encoder_depth,
                        config.decoder_width, config.decoder_depth, config.latent_dim,
                        config.mask_token_in_encoder)
