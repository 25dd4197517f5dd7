"""Tests for mae_core.images: bytes stored, floats per batch, bitwise the loaders' old values."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from mae_core.images import BYTE_VALUES, SIXTEENTHS, DeviceImages, ImageStore


def test_byte_tables_are_the_old_divisions_bitwise():
    every = np.arange(256, dtype=np.uint8)
    # what the loaders computed before: uint8 / np.float32(255); digits: float64 / 16.0 -> float32
    assert BYTE_VALUES.dtype == np.float32 and BYTE_VALUES.tobytes() == (every / np.float32(255)).tobytes()
    digits = np.arange(17, dtype=np.float64)
    assert SIXTEENTHS[:17].tobytes() == (digits / 16.0).astype(np.float32).tobytes()
    images = np.random.default_rng(0).integers(0, 256, (50, 3, 8, 8), dtype=np.uint8)
    store = ImageStore(images, BYTE_VALUES)
    assert store.floats().numpy().tobytes() == (images / np.float32(255)).tobytes()


def _store(n: int = 20, on_disk: bool = False, tmp_path=None) -> tuple[np.ndarray, ImageStore]:
    images = np.random.default_rng(1).integers(0, 256, (n, 1, 4, 6), dtype=np.uint8)
    source = images
    if on_disk:
        path = tmp_path / "x.bin"
        images.tofile(path)
        source = np.memmap(path, np.uint8, "r", shape=images.shape)
    return images, ImageStore(source, BYTE_VALUES, on_disk=on_disk)


@pytest.mark.parametrize("on_disk", [False, True])
def test_subsets_chunks_and_device_batches_agree(tmp_path, on_disk):
    images, store = _store(on_disk=on_disk, tmp_path=tmp_path)
    expected = torch.from_numpy(images / np.float32(255))
    assert store.shape == (20, 1, 4, 6) and store.nbytes == 20 * 24 and store.in_memory is not on_disk
    part = store.take(np.array([3, 7, 11, 19]))[1:3]  # rows compose: 7, 11
    assert len(part) == 2 and torch.equal(part.floats(), expected[[7, 11]])
    assert torch.equal(store[torch.tensor([5, 2])].floats(), expected[[5, 2]])
    chunks = list(store.chunks(nbytes=24 * 3))  # three images at a time
    assert [o for o, _ in chunks] == list(range(0, 20, 3))
    assert on_disk or all(np.shares_memory(c, images) for _, c in chunks)  # in memory: views
    assert np.array_equal(np.concatenate([c for _, c in chunks]), images)
    batches = DeviceImages(store.take(np.arange(10, 20)), torch.device("cpu"))
    index = torch.tensor([0, 9, 9, 4])
    assert len(batches) == 10 and torch.equal(batches(index), expected[10 + index])


def test_float_stores_pass_through_and_tables_are_checked():
    images = np.random.default_rng(2).random((4, 1, 2, 2)).astype(np.float32)
    store = ImageStore(images)
    assert torch.equal(store.floats(), torch.from_numpy(images))
    assert torch.equal(DeviceImages(store, torch.device("cpu"))(torch.tensor([3, 1])), torch.from_numpy(images[[3, 1]]))
    with pytest.raises(TypeError):
        ImageStore(images.astype(np.float64))
    with pytest.raises(TypeError):
        ImageStore(images, BYTE_VALUES)


def test_in_memory_store_is_shared_with_the_cpu_device_not_copied():
    images, store = _store()
    batches = DeviceImages(store, torch.device("cpu"))
    assert batches.values.data_ptr() == images.ctypes.data
