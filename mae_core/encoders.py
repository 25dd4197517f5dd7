"""Encoders: the protocol a model's encoder implements, and the registry the ``encoder`` key reads.

Shapes as in the spec: ``B`` images, ``M`` patches, ``q`` values per patch, ``k`` visible
count, ``L`` tokens in (``k`` for the masked encoder, ``M`` when every patch is visible), ``D``
the encoder's width.

The spec's masked encoder maps ``(V, (x_j)_{j∈V})`` to one token per visible position: it
sees only the k visible patches (seeds/000, definitions: the masked encoder; training
procedure step 2). An encoder is built so that this holds by construction: its patch
embedding maps each patch on its own (so the model embeds the k gathered values, never an
image with holes), positions are looked up at the visible indices, and the blocks receive
exactly those k tokens (plus the encoder's own prefix tokens, such as a class token).

``encoder=vit`` is the built-in :class:`mae_core.transformer.ViTEncoder`; ``encoder=timm:NAME`` a
timm VisionTransformer (:mod:`mae_core.timm_encoder`, the ``timm`` extra); ``encoder=NAME``
any factory registered with :func:`encoder` (a plugin's own).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING, Any, Protocol, runtime_checkable

if TYPE_CHECKING:
    import torch
    from torch import nn

TIMM_PREFIX = "timm:"  # encoder=timm:vit_tiny_patch16_224


@runtime_checkable
class Encoder(Protocol):
    """What the MAE and the AE/DAE read of an encoder (an ``nn.Module``).

    * ``width`` (D) and ``cls_token`` (``[1,1,D]`` parameter, or None): the decoder's input
      width, and whether ``forward`` returns a class token (``features`` pools it).
    * ``init_by_model``: True if the model applies He et al.'s initialisation to the encoder
      with its own layers (the built-in ViT); False keeps the encoder's own (timm's).
    * ``patch_embed(values [B,L,q]) -> [B,L,D]``: per patch (token j reads patch j alone).
    * ``positions() -> [M,D]``: the position code of every grid slot (row-major, as patchify).
    * ``transformer``: ``blocks`` (a sequence of modules, the encoder's depth) and ``norm`` (the
      final norm): partial fine-tuning and layer-wise decay read them by these names.
    * ``forward(tokens [B,L,D], positions [B,L], blocks=None) -> (cls [B,D] | None, tokens [B,L,D])``:
      adds the positions of the given grid slots, runs the blocks (only the first ``blocks`` if
      given, then the final norm) over these L tokens and the encoder's prefix tokens, and
      returns the class token (or None) and one token per input token, in order.
    """

    width: int
    cls_token: torch.Tensor | None
    init_by_model: bool
    patch_embed: nn.Module
    positions: nn.Module
    transformer: nn.Module

    def __call__(self, tokens: torch.Tensor, positions: torch.Tensor,
                 blocks: int | None = None) -> tuple[torch.Tensor | None, torch.Tensor]: ...


# ``factory(config, num_patches, patch_dim) -> Encoder``: config a mae_core.Config (its grid,
# encoder_width, encoder_depth, encoder_heads, mlp_ratio, pos_embed, class_token), num_patches
# M, patch_dim q. Called under the trial's seed, before the rest of the model is built.
EncoderFactory = Callable[[Any, int, int], "nn.Module"]
ENCODERS: dict[str, EncoderFactory] = {}


def encoder(name: str) -> Callable[[EncoderFactory], EncoderFactory]:
    """Register ``factory(config, num_patches, patch_dim) -> Encoder`` as ``encoder=name``."""
    if not name or ":" in name:
        raise ValueError(f"encoder name {name!r} must be non-empty and hold no ':' (timm: is taken)")

    def register(factory: EncoderFactory) -> EncoderFactory:
        ENCODERS[name] = factory
        return factory
    return register


@encoder("vit")
def vit_encoder(config, num_patches: int, patch_dim: int) -> nn.Module:
    """The built-in :class:`mae_core.transformer.ViTEncoder` at the config's grid and sizes."""
    from .transformer import ViTEncoder

    return ViTEncoder(patch_dim, config.grid, config.encoder_width, config.encoder_depth,
                      config.encoder_heads, config.mlp_ratio, config.pos_embed, config.class_token)


def check_encoder(name: str) -> None:
    """Raise ``ValueError`` (one line) unless ``name`` is a registered encoder or ``timm:NAME``
    of an installed timm's VisionTransformer."""
    if name.startswith(TIMM_PREFIX):
        from .timm_encoder import check_timm_name

        check_timm_name(name.removeprefix(TIMM_PREFIX))
    elif name not in ENCODERS:
        raise ValueError(f"unknown encoder; known: {', '.join(sorted(ENCODERS))}, timm:NAME")


def build_encoder(config: Any, num_patches: int, patch_dim: int) -> nn.Module:
    """The encoder ``config.encoder`` names, random-initialised at the config's grid."""
    if config.encoder.startswith(TIMM_PREFIX):
        from .timm_encoder import timm_encoder

        return timm_encoder(config, num_patches, patch_dim, config.encoder.removeprefix(TIMM_PREFIX))
    from .plugin_checks import call_part  # a plugin factory's sys.exit: an error naming it

    return call_part(f"encoder={config.encoder}", ENCODERS[config.encoder], config, num_patches, patch_dim)
