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
from torch import nn

from .encoders import build_encoder
from .registry import objectives
from .transformer import Positions, Transformer, ViTEncoder, gather_positions, init_weights


def _own_init(encoder: nn.Module) -> nn.Module | None:
    """The encoder if it keeps its own initialisation (``init_by_model`` False), else None."""
    return None if getattr(encoder, "init_by_model", True) else encoder


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
                 class_token: bool = False, mask_token_in_encoder: bool = False,
                 encoder: nn.Module | None = None, out_dim: int | None = None):
        """``encoder``: an :class:`~mae_core.encoders.Encoder` built for this grid (its width is
        the decoder's input); None builds the built-in ViT from the ``encoder_*`` arguments.
        ``out_dim``: the target's width per patch (None: ``patch_dim``)."""
        super().__init__()
        self.num_patches = grid[0] * grid[1]
        self.patch_dim = patch_dim
        self.mask_token_in_encoder = mask_token_in_encoder
        self.encoder = encoder if encoder is not None else ViTEncoder(
            patch_dim, grid, encoder_width, encoder_depth, encoder_heads, mlp_ratio, pos_embed, class_token)
        encoder_width = self.encoder.width
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
        init_weights(self, keep=_own_init(self.encoder))
        encoder_cls = self.encoder.cls_token if _own_init(self.encoder) is None else None
        for token in (self.mask_token, self.encoder_mask_token, encoder_cls):
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
                 pos_embed: str = "sincos", class_token: bool = False, encoder: nn.Module | None = None,
                 out_dim: int | None = None):
        super().__init__()
        self.num_patches = grid[0] * grid[1]
        self.patch_dim = patch_dim
        self.encoder = encoder if encoder is not None else ViTEncoder(
            patch_dim, grid, encoder_width, encoder_depth, encoder_heads, mlp_ratio, pos_embed, class_token)
        encoder_width = self.encoder.width
        self.to_latent = nn.Linear(encoder_width, latent_dim)
        self.from_latent = nn.Linear(latent_dim, decoder_width)
        self.decoder_positions = Positions(decoder_width, grid, pos_embed)
        self.decoder = Transformer(decoder_width, decoder_depth, decoder_heads, mlp_ratio)
        self.decoder_pred = nn.Linear(decoder_width, out_dim or patch_dim)  # the target's width
        init_weights(self, keep=_own_init(self.encoder))
        if self.encoder.cls_token is not None and _own_init(self.encoder) is None:
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

    def __init__(self, encoder: nn.Module, num_patches: int):
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
                 mask_token_in_encoder: bool = False, encoder: str = "vit") -> str:
    """A name that says what the model is, e.g. ``mae_vit_w64d4_dec32d2`` (used in run names;
    ``mae_timm-vit_tiny_patch16_224_w64d4_dec32d2`` for ``encoder=timm:vit_tiny_patch16_224``)."""
    kind = encoder.replace(":", "-")
    name = f"{objective}_{kind}_w{encoder_width}d{encoder_depth}_dec{decoder_width}d{decoder_depth}"
    if not objectives.get(objective).masked:  # the bottleneck pair: its latent width
        name += f"_z{latent_dim}"
    if mask_token_in_encoder:
        name += "_enc_mask_token"
    return name




def build_model(config) -> nn.Module:
    """The model a :class:`~mae_core.config.Config` describes (MAE, or the AE/DAE bottleneck pair)
    around the encoder its ``encoder`` key names (:func:`mae_core.encoders.build_encoder`)."""
    common = dict(
        encoder=build_encoder(config, config.num_patches, config.patch_dim),
        patch_dim=config.patch_dim, grid=config.grid,
        encoder_width=config.encoder_width, encoder_depth=config.encoder_depth,
        encoder_heads=config.encoder_heads, decoder_width=config.decoder_width,
        decoder_depth=config.decoder_depth, decoder_heads=config.decoder_heads,
        mlp_ratio=config.mlp_ratio, pos_embed=config.pos_embed, class_token=config.class_token,
        out_dim=config.target_dim,
    )
    if config.objective_spec.masked:
        return MaskedAutoencoder(**common, mask_token_in_encoder=config.mask_token_in_encoder)
    return BottleneckAutoencoder(**common, latent_dim=config.latent_dim)


def config_variant_name(config) -> str:
    return variant_name(config.objective, config.encoder_width, config.encoder_depth,
                        config.decoder_width, config.decoder_depth, config.latent_dim,
                        config.mask_token_in_encoder, config.encoder)
