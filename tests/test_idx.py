"""dataset=idx:DIR and dataset=fashion_mnist: MNIST-format files the tests write (plain and gzip),
the one-line refusals of damaged ones, the named dataset's lookup, and its test split that no seed
changes. The real Fashion-MNIST (Debian's dataset-fashion-mnist) is read where it is installed."""

from __future__ import annotations

import gzip
import struct
from pathlib import Path

import numpy as np
import pytest
import torch

from mae_core import named_datasets
from mae_core.config import Config
from mae_core.data import DataError, dataset_image_shape, default_patch_size, load_dataset
from studies.cli import main

FILES = {("train", "images"): "train-images-idx3-ubyte", ("train", "labels"): "train-labels-idx1-ubyte",
         ("t10k", "images"): "t10k-images-idx3-ubyte", ("t10k", "labels"): "t10k-labels-idx1-ubyte"}


def idx_bytes(values: np.ndarray) -> bytes:
    """LeCun's format: 0, 0, type 0x08 (unsigned byte), the number of dimensions, each dimension
    as a big-endian uint32, the values in C order."""
    return bytes([0, 0, 0x08, values.ndim]) + struct.pack(f">{values.ndim}I", *values.shape) + values.tobytes()


def write_idx(folder: Path, n_train: int = 40, n_test: int = 12, size: int = 28, gz: bool = False,
              dotted: bool = False, seed: int = 0) -> dict:
    """The four files of a small MNIST-format dataset in ``folder``; returns the arrays written."""
    rng = np.random.default_rng(seed)
    folder.mkdir(parents=True, exist_ok=True)
    arrays = {("train", "images"): rng.integers(0, 256, (n_train, size, size), dtype=np.uint8),
              ("train", "labels"): rng.integers(0, 10, n_train, dtype=np.uint8),
              ("t10k", "images"): rng.integers(0, 256, (n_test, size, size), dtype=np.uint8),
              ("t10k", "labels"): rng.integers(0, 10, n_test, dtype=np.uint8)}
    arrays[("train", "labels")][:10] = np.arange(10)  # every class present
    for role, values in arrays.items():
        name = FILES[role].replace("s-idx", "s.idx") if dotted else FILES[role]
        data = idx_bytes(values)
        if gz:
            (folder / f"{name}.gz").write_bytes(gzip.compress(data))
        else:
            (folder / name).write_bytes(data)
    return arrays


@pytest.mark.parametrize("gz, dotted", [(False, False), (True, False), (False, True), (True, True)])
def test_idx_folder_reads_as_written(tmp_path, gz, dotted):
    written = write_idx(tmp_path / "d", gz=gz, dotted=dotted)
    spec = f"idx:{tmp_path / 'd'}"
    data = load_dataset(spec)
    assert data.train.source.dtype == np.uint8 and data.image_shape == (1, 28, 28)
    assert np.array_equal(data.train.stored()[:, 0], written[("train", "images")])
    assert np.array_equal(data.test.stored()[:, 0], written[("t10k", "images")])
    assert data.train_labels.tolist() == written[("train", "labels")].tolist()
    assert data.test_labels.tolist() == written[("t10k", "labels")].tolist()
    assert torch.equal(data.test_images, torch.from_numpy(written[("t10k", "images")][:, None] / np.float32(255)))
    assert data.class_names == tuple(str(i) for i in range(10))
    # the header alone gives the shape; 28x28 gets patch 4: 49 patches
    assert dataset_image_shape(spec) == (1, 28, 28) and default_patch_size(spec) == 4
    assert Config(dataset=spec).num_patches == 49


def test_plain_files_above_the_memory_ceiling_stay_on_disk(tmp_path):
    written = write_idx(tmp_path / "d")
    data = load_dataset(f"idx:{tmp_path / 'd'}", ram_mb=0)
    assert data.train.on_disk and data.test.on_disk
    assert np.array_equal(data.train.stored(np.array([3, 1]))[:, 0], written[("train", "images")][[3, 1]])


def test_the_files_test_split_is_the_same_for_every_seed(tmp_path):
    written = write_idx(tmp_path / "d")
    spec = f"idx:{tmp_path / 'd'}"
    splits = [load_dataset(spec, seed=seed) for seed in (0, 1, 7)]
    for data in splits:
        assert np.array_equal(data.test.stored()[:, 0], written[("t10k", "images")])
        assert data.test_labels.tolist() == written[("t10k", "labels")].tolist()
        assert np.array_equal(data.train.stored()[:, 0], written[("train", "images")])


def _cli_error(capsys, spec: str, out: Path) -> str:
    """``mae-study train`` refuses ``spec`` before anything runs: one line, exit status 2."""
    with pytest.raises(SystemExit) as stop:
        main(["train", "--out", str(out), f"dataset={spec}", "steps=1"])
    assert stop.value.code == 2
    err = capsys.readouterr().err.strip()
    assert "\n" not in err and "Traceback" not in err
    return err


def _cut(path: Path, keep: int) -> None:
    path.write_bytes(path.read_bytes()[:keep])


@pytest.mark.parametrize("damage, message", [
    ("magic", "has magic number 0x00000903; expected 0x00000803"),
    ("truncated", "is truncated: its header says 40x28x28 (31360 bytes of values), it holds 31000"),
    ("truncated_gz", "cannot read idx file"),
    ("counts", "holds 39 labels but train-images-idx3-ubyte holds 40 images"),
    ("missing", "has no t10k-labels-idx1-ubyte (plain or .gz)"),
])
def test_a_damaged_file_is_one_line_naming_it_and_exit_2(tmp_path, capsys, damage, message):
    folder = tmp_path / "d"
    write_idx(folder, gz=damage == "truncated_gz")
    images = folder / FILES[("train", "images")]
    if damage == "magic":
        data = bytearray(images.read_bytes())
        data[2] = 0x09  # signed bytes: not what these datasets hold
        images.write_bytes(bytes(data))
    elif damage == "truncated":
        _cut(images, 16 + 31000)
    elif damage == "truncated_gz":
        images = folder / (FILES[("train", "images")] + ".gz")
        _cut(images, images.stat().st_size // 2)
    elif damage == "counts":
        labels = write_idx(tmp_path / "other", n_train=39)[("train", "labels")]
        (folder / FILES[("train", "labels")]).write_bytes(idx_bytes(labels))
    else:
        (folder / FILES[("t10k", "labels")]).unlink()
    err = _cli_error(capsys, f"idx:{folder}", tmp_path / "out")
    assert message in err
    named = folder if damage == "missing" else folder / (FILES[("train", "labels")] if damage == "counts" else images.name)
    assert str(named) in err


def test_fashion_mnist_is_found_in_mae_study_data_with_its_class_names(tmp_path, monkeypatch):
    written = write_idx(tmp_path / "data" / "fashion-mnist", gz=True)
    monkeypatch.setenv("MAE_STUDY_DATA", str(tmp_path / "data"))
    monkeypatch.setattr(named_datasets, "SYSTEM_DATA", tmp_path / "system")  # not this machine's copy
    data = load_dataset("fashion_mnist")
    assert data.class_names[0] == "T-shirt/top" and data.class_names[9] == "Ankle boot"
    assert data.train_labels.tolist() == written[("train", "labels")].tolist()
    assert Config(dataset="fashion_mnist").resolved_patch_size == 4
    assert named_datasets.locate("fashion_mnist") == tmp_path / "data" / "fashion-mnist"


def test_fashion_mnist_falls_back_to_the_system_copy(tmp_path, monkeypatch):
    write_idx(tmp_path / "system" / "fashion-mnist")
    monkeypatch.setenv("MAE_STUDY_DATA", str(tmp_path / "empty"))
    monkeypatch.setattr(named_datasets, "SYSTEM_DATA", tmp_path / "system")
    assert named_datasets.locate("fashion_mnist") == tmp_path / "system" / "fashion-mnist"


def test_fashion_mnist_absent_is_refused_in_one_line_saying_how_to_get_it(tmp_path, monkeypatch, capsys):
    monkeypatch.setenv("MAE_STUDY_DATA", str(tmp_path / "empty"))
    monkeypatch.setattr(named_datasets, "SYSTEM_DATA", tmp_path / "system")
    err = _cli_error(capsys, "fashion_mnist", tmp_path / "out")
    assert "apt-get install dataset-fashion-mnist" in err and "mae-study fetch fashion_mnist" in err
    assert str(tmp_path / "empty" / "fashion-mnist") in err
    assert not (tmp_path / "out" / "mlflow.db").exists()  # refused before any run existed
    with pytest.raises(DataError, match="not found"):
        load_dataset("fashion_mnist")


SYSTEM_COPY = Path("/usr/share/datasets/fashion-mnist")


@pytest.mark.skipif(not SYSTEM_COPY.is_dir(), reason="Debian's dataset-fashion-mnist is not installed")
def test_the_real_fashion_mnist(monkeypatch, tmp_path):
    monkeypatch.setenv("MAE_STUDY_DATA", str(tmp_path))  # nothing there: the system copy
    data = load_dataset("fashion_mnist")
    assert (len(data.train), len(data.test), data.image_shape) == (60000, 10000, (1, 28, 28))
    assert np.bincount(data.test_labels.numpy()).tolist() == [1000] * 10  # balanced classes
    assert data.train_test_duplicates == 0
