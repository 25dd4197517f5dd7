"""The transformer parts every model here is built from, and the built-in ViT encoder.

Shapes: ``B`` batch, ``M`` patches, ``q`` values per patch, ``L`` tokens, ``D`` width. Kept apart
from :mod:`mae_core.models` (which assembles encoders and decoders into the autoencoders) so
an encoder (:mod:`mae_core.encoders`, :mod:`mae_core.timm_encoder`) can use them without
importing the models that use it.
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


def init_weights(module: nn.Module, keep: nn.Module | None = None) -> None:
    """He et al.'s initialisation: xavier-uniform linears, zero biases, unit LayerNorms; the
    layers of ``keep`` (an encoder that brings its own initialisation) are left as they are."""
    kept = set(keep.modules()) if keep is not None else set()
    for m in module.modules():
        if m in kept:
            continue
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
    """Patch embedding + positions + transformer; optionally a class token in front (the
    built-in :class:`~mae_core.encoders.Encoder`, ``encoder=vit``)."""

    init_by_model = True  # the model applies He et al.'s initialisation to these layers

    def __init__(self, patch_dim: int, grid: tuple[int, int], width: int, depth: int,
                 heads: int, mlp_ratio: float, pos_embed: str, class_token: bool):
        super().__init__()
        self.width = width
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


