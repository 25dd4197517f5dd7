"""``encoder=timm:NAME``: a timm VisionTransformer as the MAE's encoder (the ``timm`` extra).

NAME picks timm's ViT *design*: its blocks (qkv bias, layer scale, parallel or pre-norm
variants), its norms, register tokens, whether prefix tokens get a position, and timm's own
random initialisation. The *size* is the config's, as for the built-in encoder: the dataset's
image size, channels and ``patch_size``, and ``encoder_width``, ``encoder_depth``,
``encoder_heads``, ``mlp_ratio`` and ``class_token`` are passed to ``timm.create_model`` (which
lets them override the named model's), so the logged config says what was trained and a study's
width or depth axis varies a timm encoder as it does the built-in one. ``pos_embed=sincos``
uses the built-in fixed 2-D sine-cosine table (prefix tokens at position zero, as He et al.);
``pos_embed=learned`` timm's learned table. No pretrained weights are read.

The MAE's masking semantics hold by construction (seeds/000: the encoder sees only the k
visible patches): timm's patch embedding (a Conv2d of kernel and stride P) is applied to each
gathered patch on its own, so masked patches are never embedded; positions are looked up at the
visible slots; timm's blocks and final norm then run on the k tokens and the prefix tokens.
"""

from __future__ import annotations

from functools import cache

import torch
from torch import nn

from .transformer import Positions

INSTALL_HINT = "pip install 'mae-study[timm]'"


def _import_timm():
    """timm, or a one-line ValueError saying how to get it."""
    try:
        import timm
    except ModuleNotFoundError as error:
        if error.name != "timm":
            raise ValueError(f"timm does not import: {error}; {INSTALL_HINT} with a torchvision built for "
                             f"this torch ({torch.__version__})") from None
        raise ValueError(f"timm is not installed: {INSTALL_HINT}") from None
    except Exception as error:  # noqa: BLE001  (a torchvision built for another torch fails at import)
        first = str(error).splitlines()[0] if str(error) else type(error).__name__
        raise ValueError(f"timm does not import ({type(error).__name__}: {first}); install a torchvision "
                         f"built for this torch ({torch.__version__}), then {INSTALL_HINT}") from None
    return timm


def vit_names() -> frozenset[str]:
    """The model names of timm's ``vision_transformer`` module (the VisionTransformer family)."""
    return _vit_names(_import_timm())


@cache
def _vit_names(timm) -> frozenset[str]:
    return frozenset(timm.list_models(module="vision_transformer"))


def check_timm_name(name: str) -> None:
    """Raise a one-line ``ValueError`` unless ``name`` is one of :func:`vit_names`."""
    if name not in vit_names():
        raise ValueError(f"{name!r} is not a timm VisionTransformer; for example vit_tiny_patch16_224 "
                         "(timm.list_models(module='vision_transformer') lists them)")


class PatchwiseEmbed(nn.Module):
    """timm's patch embedding applied to flattened patches: ``[B,L,q] -> [B,L,D]``.

    A patch's q values are in patchify's (row, column, channel) order; timm's Conv2d reads
    ``[C,P,P]``, so each patch is reshaped to ``[P,P,C]``, moved to ``[C,P,P]`` and convolved
    alone (one output pixel): exactly the token timm computes for that patch of the image."""

    def __init__(self, embed: nn.Module, patch_size: int, channels: int):
        super().__init__()
        self.embed = embed  # timm's PatchEmbed: its proj (Conv2d) and norm are used
        self.patch_size, self.channels = patch_size, channels

    def forward(self, values: torch.Tensor) -> torch.Tensor:
        batch, length, _ = values.shape
        p = self.patch_size
        images = values.reshape(batch * length, p, p, self.channels).permute(0, 3, 1, 2)
        tokens = self.embed.proj(images).reshape(batch, length, -1)  # [B,L,D]
        return self.embed.norm(tokens)


class LearnedPositions(nn.Module):
    """timm's learned table ``[1, P+M, D]`` (P prefix slots first, or none with no_embed_class)."""

    def __init__(self, table: nn.Parameter, prefix: int):
        super().__init__()
        self.table, self.prefix = table, prefix

    def forward(self) -> torch.Tensor:  # [M,D]
        return self.table[0, self.prefix:]

    def prefix_positions(self) -> torch.Tensor | None:  # [P,D] or None
        return self.table[0, :self.prefix] if self.prefix else None


class TimmBlocks(nn.Module):
    """timm's ``blocks`` then its final ``norm``: ``[B,L,D] -> [B,L,D]`` (as transformer.Transformer)."""

    def __init__(self, blocks: nn.Sequential, norm: nn.Module):
        super().__init__()
        self.blocks, self.norm = blocks, norm

    def forward(self, x: torch.Tensor, blocks: int | None = None) -> torch.Tensor:
        if blocks is not None and not 1 <= blocks <= len(self.blocks):
            raise ValueError(f"blocks={blocks} must lie in [1, {len(self.blocks)}] (the depth)")
        for block in self.blocks if blocks is None else self.blocks[:blocks]:
            x = block(x)
        return self.norm(x)


class TimmEncoder(nn.Module):
    """A timm VisionTransformer's parts run on the visible tokens only (:class:`~mae_core.encoders.Encoder`).

    Its patch embedding, prefix tokens (class, registers), positions, pre-norm, blocks and final
    norm, in timm's ``forward_features`` order; its pooling and head are not used (the probes pool)."""

    init_by_model = False  # timm's own initialisation is kept

    def __init__(self, vit: nn.Module, grid: tuple[int, int], patch_size: int, channels: int, pos_embed: str):
        super().__init__()
        self.width = vit.embed_dim
        self.patch_embed = PatchwiseEmbed(vit.patch_embed, patch_size, channels)
        self.cls_token = vit.cls_token  # [1,1,D] or None
        self.reg_token = vit.reg_token  # [1,R,D] or None
        self.num_prefix = vit.num_prefix_tokens
        if pos_embed == "sincos":
            self.positions = Positions(self.width, grid, "sincos")
        else:
            self.positions = LearnedPositions(vit.pos_embed, 0 if vit.no_embed_class else self.num_prefix)
        self.pos_drop, self.norm_pre = vit.pos_drop, vit.norm_pre
        self.transformer = TimmBlocks(vit.blocks, vit.norm)

    def _prefix(self, batch: int) -> torch.Tensor | None:  # [B,P,D] or None
        tokens = [t for t in (self.cls_token, self.reg_token) if t is not None]
        if not tokens:
            return None
        prefix = torch.cat(tokens, dim=1).expand(batch, -1, -1)
        at = getattr(self.positions, "prefix_positions", lambda: None)()
        return prefix if at is None else prefix + at

    def forward(self, tokens: torch.Tensor, positions: torch.Tensor,
                blocks: int | None = None) -> tuple[torch.Tensor | None, torch.Tensor]:
        """Embedded tokens ``[B,L,D]`` at grid ``positions [B,L]`` -> (class token ``[B,D]`` or None,
        tokens ``[B,L,D]``); ``blocks``: after the first ``blocks`` blocks, final norm applied."""
        x = tokens + self.positions()[positions]
        prefix = self._prefix(x.shape[0])
        if prefix is not None:
            x = torch.cat([prefix.to(x.dtype), x], dim=1)
        x = self.transformer(self.norm_pre(self.pos_drop(x)), blocks=blocks)
        cls = x[:, 0] if self.cls_token is not None else None
        return cls, x[:, self.num_prefix:]


def timm_encoder(config, num_patches: int, patch_dim: int, name: str) -> TimmEncoder:
    """``timm.create_model(name)`` random-initialised at the config's image, patch and size."""
    timm = _import_timm()
    check_timm_name(name)
    channels, height, width = config.image_shape
    vit = timm.create_model(
        name, pretrained=False, img_size=(height, width), patch_size=config.resolved_patch_size,
        in_chans=channels, num_classes=0, global_pool="", class_token=config.class_token,
        embed_dim=config.encoder_width, depth=config.encoder_depth, num_heads=config.encoder_heads,
        mlp_ratio=config.mlp_ratio, pos_embed="none" if config.pos_embed == "sincos" else "learn",
    )
    if vit.patch_embed.num_patches != num_patches:
        raise ValueError(f"timm:{name} built {vit.patch_embed.num_patches} patches, the config {num_patches}")
    return TimmEncoder(vit, config.grid, config.resolved_patch_size, channels, config.pos_embed)
