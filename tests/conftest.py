"""Shared tiny-config helpers for the engine's property tests (two CPU cores, seconds per test)."""

from __future__ import annotations

import torch

from mae_core import Config

torch.set_num_threads(2)

# A model small enough that one forward/backward on a handful of images takes milliseconds.
TINY_MODEL = dict(encoder_width=16, encoder_depth=1, encoder_heads=2,
                  decoder_width=8, decoder_depth=1, decoder_heads=2, latent_dim=4)


def tiny_config(**overrides) -> Config:
    """digits (8x8, patch 2: M=16, q=4), a one-block model, a few images and steps."""
    keys = dict(dataset="digits", train_limit=64, test_limit=16, batch_size=8, steps=5,
                log_every=1, device="cpu", **TINY_MODEL)
    keys.update(overrides)
    return Config(**keys)
