"""Tests for mae_core.images: bytes stored, floats per batch, bitwise the loaders' old values."""

from __future__ import annotations

import dataclasses
import threading

import numpy as np
import pytest
import torch

from conftest import tiny_config
from device_checks import DEVICE
from mae_core import prepare_data, train
from mae_core.images import BYTE_VALUES, SIXTEENTHS, BatchPrefetcher, DeviceImages, ImageStore


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


# ------------------------------------------------------- read ahead in a background thread (issue 26)


class _Recording:
    """A source that records which thread read which rows (and can fail on chosen rows)."""

    def __init__(self, images: np.ndarray, fail_on: int | None = None):
        self.images, self.fail_on = images, fail_on
        self.shape, self.dtype = images.shape, images.dtype
        self.reads: list[tuple[str, list[int]]] = []

    def __getitem__(self, rows):
        self.reads.append((threading.current_thread().name, list(np.asarray(rows))))
        if self.fail_on is not None and self.fail_on in np.asarray(rows):
            raise OSError(f"cannot read image {self.fail_on}")
        return self.images[rows]


def test_a_prefetched_batch_is_read_in_the_background_and_is_the_batch_asked_for():
    images, _ = _store()
    source = _Recording(images)
    batches = DeviceImages(ImageStore(source, BYTE_VALUES, on_disk=True), DEVICE)
    expected = torch.from_numpy(images / np.float32(255))
    first, second = torch.tensor([3, 1, 3]), torch.tensor([0, 19, 5])
    assert torch.equal(batches(first).cpu(), expected[first])  # nothing prefetched: read here
    batches.prefetch(second)
    got = batches(second)
    assert got.device.type == DEVICE.type and torch.equal(got.cpu(), expected[second])
    threads = [name for name, _ in source.reads]
    assert threads[0] == threading.current_thread().name and threads[1].startswith("mae-prefetch")
    assert len(source.reads) == 2  # the prefetched batch was not read twice
    batches.prefetch(torch.tensor([1, 2]))
    other = torch.tensor([2, 1])  # not what was prefetched: read as asked, same order as asked
    assert torch.equal(batches(other).cpu(), expected[other])
    batches.close()
    assert not any(t.name.startswith("mae-prefetch") and t.is_alive() for t in threading.enumerate())
    assert torch.equal(batches(first).cpu(), expected[first])  # still reads after close, in this thread


def test_an_error_in_the_reading_thread_is_raised_in_the_training_thread():
    images, _ = _store()
    batches = DeviceImages(ImageStore(_Recording(images, fail_on=7), BYTE_VALUES, on_disk=True), DEVICE)
    batches.prefetch(torch.tensor([1, 7]))
    with pytest.raises(OSError, match="image 7"):
        batches(torch.tensor([1, 7]))
    batches.prefetch(torch.tensor([7]))  # a failed read nobody asks for is dropped
    assert torch.equal(batches(torch.tensor([2])).cpu(), torch.from_numpy(images[[2]] / np.float32(255)))
    batches.close()


def test_batches_are_pinned_only_where_cuda_is():
    images, _ = _store()
    read = BatchPrefetcher(ImageStore(images, BYTE_VALUES, on_disk=True)).read(torch.tensor([0, 1]))
    assert read.dtype == torch.uint8 and read.is_pinned() == torch.cuda.is_available()


@pytest.mark.parametrize("keys", [
    dict(augment="crop_flip", objective="dae", target="norm_eps"),  # eager: crops and X̃ drawn after I_t
    dict(capturable=True),  # I_t drawn ahead: the next batch is known
])
def test_training_from_disk_reads_each_batch_ahead_in_the_drawn_order(keys, monkeypatch):
    """The loop names I_{t+1} while update t runs; the batches it trains on are the ones it draws
    (the same history as in memory), and every batch after the first was read in the background."""
    config = tiny_config(steps=6, **keys)
    data = prepare_data(config)
    in_memory = train(config, data).history
    images = data.pretraining.stored()
    source = _Recording(images)
    on_disk = dataclasses.replace(data, pretrain_images=ImageStore(source, data.pretraining.table, on_disk=True))
    reads = []
    original = BatchPrefetcher.read
    monkeypatch.setattr(BatchPrefetcher, "read", lambda self, index: reads.append(index.clone()) or original(self, index))
    assert train(config, on_disk).history == in_memory
    sampler = torch.Generator().manual_seed(config.seed + 1)
    first = torch.randint(len(images), (config.batch_size,), generator=sampler)
    assert torch.equal(reads[0], first) and len(reads) == config.steps
    threads = [name for name, _ in source.reads]
    assert len(threads) == config.steps and all(t.startswith("mae-prefetch") for t in threads[1:]), threads
    assert not any(t.name.startswith("mae-prefetch") and t.is_alive() for t in threading.enumerate())
