"""Tests for mae_core.formats: CIFAR-100 pickles, STL-10 binaries and npz, on small files written
in the real formats (nothing is downloaded)."""

from __future__ import annotations

import pickle
import warnings
from pathlib import Path

import numpy as np
import pytest
import torch

from conftest import tiny_config
from mae_core import prepare_data, train
from mae_core.data import (
    DataError,
    DuplicateSplitWarning,
    count_split_duplicates,
    dataset_image_shape,
    default_patch_size,
    load_dataset,
)

# ------------------------------------------------------------------------------- CIFAR-100


def _write_cifar100(root: Path, n_train: int = 30, n_test: int = 10, meta: bool = True) -> dict:
    """The python version's three pickles: ``train``, ``test`` (data uint8 [n, 3072], row-major
    channel planes; fine_labels 0..99, coarse_labels 0..19) and ``meta``."""
    rng = np.random.default_rng(0)
    root.mkdir(parents=True)
    written = {}
    for name, n in (("train", n_train), ("test", n_test)):
        data = rng.integers(0, 256, (n, 3072), dtype=np.uint8)
        fine = [int(v) for v in rng.integers(0, 100, n)]
        coarse = [f // 5 for f in fine]
        (root / name).write_bytes(pickle.dumps(
            {b"filenames": [b"x.png"] * n, b"batch_label": name.encode(), b"fine_labels": fine,
             b"coarse_labels": coarse, b"data": data}, protocol=2))
        written[name] = (data, fine, coarse)
    if meta:
        (root / "meta").write_bytes(pickle.dumps(
            {b"fine_label_names": [f"fine{i}".encode() for i in range(100)],
             b"coarse_label_names": [f"coarse{i}".encode() for i in range(20)]}, protocol=2))
    return written


def test_cifar100_fine_labels_by_default_and_coarse_on_request(tmp_path):
    written = _write_cifar100(tmp_path / "c100")
    fine = load_dataset(f"cifar100:{tmp_path / 'c100'}")
    data, fine_labels, coarse_labels = written["train"]
    assert fine.train.source.dtype == np.uint8  # stored as bytes, converted per batch
    assert torch.equal(fine.train_images, torch.from_numpy(data.reshape(-1, 3, 32, 32) / np.float32(255)))
    assert fine.train_labels.tolist() == fine_labels and fine.test_labels.tolist() == written["test"][1]
    assert fine.num_classes == 100 and fine.class_names[7] == "fine7"
    coarse = load_dataset(f"cifar100_coarse:{tmp_path / 'c100'}")
    assert coarse.train_labels.tolist() == coarse_labels and coarse.class_names[3] == "coarse3"
    assert torch.equal(coarse.train_images, fine.train_images)
    for spec in (f"cifar100:{tmp_path / 'c100'}", f"cifar100_coarse:{tmp_path / 'c100'}"):
        assert dataset_image_shape(spec) == (3, 32, 32) and default_patch_size(spec) == 4


def test_cifar100_without_meta_numbers_the_classes_and_counts_duplicates(tmp_path):
    written = _write_cifar100(tmp_path / "c", meta=False)
    test = pickle.loads((tmp_path / "c" / "test").read_bytes())
    test[b"data"][:2] = written["train"][0][[4, 9]]  # two test images copied from training
    (tmp_path / "c" / "test").write_bytes(pickle.dumps(test, protocol=2))
    with pytest.warns(DuplicateSplitWarning, match="2 of 10"):
        ds = load_dataset(f"cifar100:{tmp_path / 'c'}")
    assert ds.class_names == tuple(str(i) for i in range(100)) and ds.train_test_duplicates == 2


def test_cifar100_missing_file_and_bad_labels(tmp_path):
    _write_cifar100(tmp_path / "c")
    (tmp_path / "c" / "test").unlink()
    with pytest.raises(DataError, match=r"missing CIFAR-100 file: .*test"):
        load_dataset(f"cifar100:{tmp_path / 'c'}")
    _write_cifar100(tmp_path / "d")
    batch = pickle.loads((tmp_path / "d" / "train").read_bytes())
    del batch[b"fine_labels"]
    (tmp_path / "d" / "train").write_bytes(pickle.dumps(batch, protocol=2))
    with pytest.raises(DataError, match="fine_labels"):
        load_dataset(f"cifar100:{tmp_path / 'd'}")


# ---------------------------------------------------------------------------------- STL-10


def _stl_bytes(images: np.ndarray) -> bytes:
    """Images uint8 [n, 3, 96, 96] (C, H, W) in STL-10's order: per image, per channel, column-major."""
    return np.ascontiguousarray(images.transpose(0, 1, 3, 2)).tobytes()


def _write_stl10(root: Path, n_train: int = 10, n_test: int = 6, n_unlabelled: int = 12,
                 planted: bool = False) -> dict:
    rng = np.random.default_rng(0)
    root.mkdir(parents=True)
    arrays = {name: rng.integers(0, 256, (n, 3, 96, 96), dtype=np.uint8)
              for name, n in (("train", n_train), ("test", n_test), ("unlabeled", n_unlabelled)) if n}
    if planted:  # a test image that is also in the unlabelled set
        arrays["test"][0] = arrays["unlabeled"][5]
    for name, images in arrays.items():
        (root / f"{name}_X.bin").write_bytes(_stl_bytes(images))
    for name in ("train", "test"):  # labels 1..10 on disk
        labels = np.arange(len(arrays[name])) % 10 + 1
        (root / f"{name}_y.bin").write_bytes(labels.astype(np.uint8).tobytes())
    return arrays


@pytest.mark.parametrize("ram_mb", [4096, 0])  # read into memory, or memory-mapped
def test_stl10_reads_column_major_binaries(tmp_path, ram_mb):
    arrays = _write_stl10(tmp_path / "stl")
    ds = load_dataset(f"stl10:{tmp_path / 'stl'}", ram_mb=ram_mb)
    assert ds.train.in_memory is (ram_mb > 0) and ds.unlabelled.in_memory is (ram_mb > 0)
    assert torch.equal(ds.train_images, torch.from_numpy(arrays["train"] / np.float32(255)))
    assert torch.equal(ds.unlabelled.floats(), torch.from_numpy(arrays["unlabeled"] / np.float32(255)))
    # the format's own reader (its README): reshape (-1, 3, 96, 96), transpose (0, 3, 2, 1) -> [n, H, W, C]
    official = np.frombuffer((tmp_path / "stl" / "test_X.bin").read_bytes(), np.uint8)
    official = np.transpose(official.reshape(-1, 3, 96, 96), (0, 3, 2, 1))
    assert np.array_equal(ds.test.stored(), official.transpose(0, 3, 1, 2))
    assert ds.train_labels.tolist() == [i % 10 for i in range(10)] and ds.class_names[2] == "car"
    assert ds.pretrain is ds.unlabelled and ds.train_test_duplicates == 0


def test_stl10_pretrains_on_the_unlabelled_images_and_probes_on_the_labelled(tmp_path):
    _write_stl10(tmp_path / "stl")
    spec = f"stl10:{tmp_path / 'stl'}"
    assert dataset_image_shape(spec) == (3, 96, 96) and default_patch_size(spec) == 8
    config = tiny_config(dataset=spec, patch_size=16, train_limit=None, test_limit=None, steps=3)
    data = prepare_data(config)
    assert len(data.pretraining) == 12 and data.pretraining is data.pretrain_images
    assert data.train_patches.shape == (10, 36, 768) and data.test_patches.shape == (6, 36, 768)
    # where the images are read from never changes a number: memory and disk train alike
    in_memory = train(config, data).history
    on_disk = train(config.with_updates(data_ram_mb=0), prepare_data(config.with_updates(data_ram_mb=0)))
    assert not prepare_data(config.with_updates(data_ram_mb=0)).pretraining.in_memory
    assert on_disk.history == in_memory


def test_stl10_counts_test_images_found_in_the_unlabelled_set(tmp_path):
    _write_stl10(tmp_path / "stl", planted=True)
    with pytest.warns(DuplicateSplitWarning, match="1 of 6"):
        ds = load_dataset(f"stl10:{tmp_path / 'stl'}", ram_mb=0)
    assert ds.train_test_duplicates == 1
    assert count_split_duplicates(ds.train, ds.test) == 0  # not in the labelled split ...
    assert count_split_duplicates(ds.train, ds.test, also=[ds.unlabelled]) == 1  # ... in the unlabelled


def test_stl10_without_unlabelled_pretrains_on_train_and_checks_sizes(tmp_path):
    _write_stl10(tmp_path / "stl", n_unlabelled=0)
    ds = load_dataset(f"stl10:{tmp_path / 'stl'}")
    assert ds.unlabelled is None and ds.pretrain is ds.train
    with (tmp_path / "stl" / "test_X.bin").open("ab") as handle:
        handle.write(b"\0" * 10)  # a torn file
    with pytest.raises(DataError, match=r"test_X\.bin has \d+ bytes"):
        load_dataset(f"stl10:{tmp_path / 'stl'}")
    (tmp_path / "stl" / "train_y.bin").unlink()
    with pytest.raises(DataError, match="missing STL-10 file"):
        load_dataset(f"stl10:{tmp_path / 'stl'}")


# ------------------------------------------------------------------------------------ npz


def test_npz_above_the_ceiling_is_memory_mapped_and_the_same(tmp_path):
    rng = np.random.default_rng(0)
    images = rng.integers(0, 256, (30, 8, 8, 3), dtype=np.uint8)  # channel-last
    np.savez(tmp_path / "d.npz", images=images, labels=np.arange(30) % 3)
    spec = f"npz:{tmp_path / 'd.npz'}"
    in_memory, on_disk = load_dataset(spec, ram_mb=4096), load_dataset(spec, ram_mb=0)
    assert in_memory.train.in_memory and not on_disk.train.in_memory
    assert isinstance(on_disk.train.source, np.memmap)
    assert torch.equal(in_memory.train_images, on_disk.train_images)
    assert torch.equal(in_memory.test_images, on_disk.test_images)
    # a compressed member cannot be mapped: it is read whole, whatever the ceiling
    np.savez_compressed(tmp_path / "z.npz", images=images, labels=np.arange(30) % 3)
    compressed = load_dataset(f"npz:{tmp_path / 'z.npz'}", ram_mb=0)
    assert compressed.train.in_memory and torch.equal(compressed.train_images, in_memory.train_images)


def test_config_validation_reads_the_npz_header_not_the_arrays(tmp_path, monkeypatch):
    images = np.zeros((20, 6, 10), np.uint8)
    np.savez_compressed(tmp_path / "d.npz", images=images, labels=np.zeros(20, np.int64))
    spec = f"npz:{tmp_path / 'd.npz'}"

    def no_full_read(*args, **kwargs):
        raise AssertionError("the whole npz was read")

    monkeypatch.setattr(np, "load", no_full_read)
    assert dataset_image_shape(spec) == (1, 6, 10) and default_patch_size(spec) == 2
    config = tiny_config(dataset=spec)
    assert config.image_shape == (1, 6, 10) and config.num_patches == 15


@pytest.mark.parametrize("arrays, fragment", [
    (dict(images=np.zeros((4, 8), np.uint8), labels=np.zeros(4, np.int64)), "allowed"),
    (dict(images=np.zeros((0, 8, 8), np.uint8), labels=np.zeros(0, np.int64)), "empty"),
    (dict(labels=np.zeros(4, np.int64)), "no key 'images'"),
])
def test_bad_npz_headers_are_refused_at_config_time(tmp_path, arrays, fragment):
    np.savez(tmp_path / "bad.npz", **arrays)
    with pytest.raises(DataError, match=fragment):
        dataset_image_shape(f"npz:{tmp_path / 'bad.npz'}")


def test_float_npz_is_checked_and_kept_as_float32(tmp_path):
    x = np.random.default_rng(0).normal(size=(10, 1, 4, 4))
    np.savez(tmp_path / "f.npz", images=x, labels=np.arange(10) % 2)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        ds = load_dataset(f"npz:{tmp_path / 'f.npz'}", ram_mb=0)
    assert ds.train.table is None and ds.train.source.dtype == np.float32
    pool = {img.numpy().tobytes() for img in torch.cat([ds.train_images, ds.test_images])}
    assert pool == {img.astype(np.float32).tobytes() for img in x}
