"""Tests for mae_core.folders: ImageNet's train/ + val/ layout (Tiny-ImageNet's too) and the
folder reader on disk, on small PNG/JPEG trees written here."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
import torch
from PIL import Image

from conftest import tiny_config
from mae_core import prepare_data, train
from mae_core.data import DataError, dataset_image_shape, default_patch_size, load_dataset
from mae_core.folders import ImageFiles

WNIDS = ("n01443537", "n01629819", "n01641577")


def _save(path: Path, rng: np.random.Generator, size: int, grey: bool = False) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    shape = (size, size) if grey else (size, size, 3)
    Image.fromarray(rng.integers(0, 256, shape, dtype=np.uint8), "L" if grey else "RGB").save(path)


def _write_tiny_imagenet(root: Path, per_class: int = 4, size: int = 16) -> None:
    """Tiny-ImageNet's layout: train/<wnid>/images/<wnid>_<i>.JPEG (plus a boxes file),
    val/images/val_<i>.JPEG with val/val_annotations.txt, wnids.txt and words.txt; one train
    image is grey, as some of Tiny-ImageNet's are."""
    rng = np.random.default_rng(0)
    for k, wnid in enumerate(WNIDS):
        for i in range(per_class):
            _save(root / "train" / wnid / "images" / f"{wnid}_{i}.JPEG", rng, size, grey=(k, i) == (1, 2))
        (root / "train" / wnid / f"{wnid}_boxes.txt").write_text("")
    lines = []
    for i in range(6):
        _save(root / "val" / "images" / f"val_{i}.JPEG", rng, size)
        lines.append(f"val_{i}.JPEG\t{WNIDS[i % 3]}\t0\t0\t{size - 1}\t{size - 1}")
    (root / "val" / "val_annotations.txt").write_text("\n".join(lines) + "\n")
    (root / "wnids.txt").write_text("\n".join(WNIDS) + "\n")
    (root / "words.txt").write_text("n01443537\tgoldfish, Carassius auratus\n"
                                    "n01629819\tEuropean fire salamander, Salamandra salamandra\n")


def _decoded(path: Path) -> np.ndarray:
    with Image.open(path) as im:
        return np.asarray(im.convert("RGB")).transpose(2, 0, 1)


@pytest.mark.parametrize("ram_mb", [4096, 0])  # decoded once into memory, or per batch from the files
def test_tiny_imagenet_layout(tmp_path, ram_mb):
    _write_tiny_imagenet(tmp_path / "tiny")
    spec = f"imagenet:{tmp_path / 'tiny'}"
    ds = load_dataset(spec, ram_mb=ram_mb)
    assert ds.train.in_memory is (ram_mb > 0)
    assert ds.image_shape == (3, 16, 16) == dataset_image_shape(spec)  # the grey image became RGB
    assert (len(ds.train), len(ds.test)) == (12, 6)
    assert ds.class_names == ("goldfish", "European fire salamander", "n01641577")  # words.txt, else the wnid
    assert ds.train_labels.tolist() == [0] * 4 + [1] * 4 + [2] * 4
    assert ds.test_labels.tolist() == [0, 1, 2, 0, 1, 2]  # from val_annotations.txt
    first = tmp_path / "tiny" / "train" / WNIDS[1] / "images" / f"{WNIDS[1]}_2.JPEG"
    assert np.array_equal(ds.train.stored(np.array([6])), _decoded(first)[None])
    assert np.array_equal(ds.test.stored(np.array([4])), _decoded(tmp_path / "tiny" / "val" / "images" / "val_4.JPEG")[None])
    assert default_patch_size(spec) == 4  # 16 px: 16 patches of 4 x 4


def test_imagenet_val_class_folders_and_patch_sizes(tmp_path):
    rng = np.random.default_rng(1)
    for split, count in (("train", 3), ("val", 1)):
        for wnid in WNIDS[:2]:
            for i in range(count):
                _save(tmp_path / "inet" / split / wnid / f"{i}.png", rng, 224)
    spec = f"imagenet:{tmp_path / 'inet'}"
    ds = load_dataset(spec)
    assert ds.test_labels.tolist() == [0, 1] and ds.class_names == WNIDS[:2]
    assert default_patch_size(spec) == 16  # 224 px: He et al.'s ViT/16, 196 patches
    _save(tmp_path / "inet" / "val" / "n09999999" / "0.png", rng, 224)
    with pytest.raises(DataError, match="n09999999"):
        load_dataset(spec, seed=1)  # another seed: the cache is keyed on the top folder's mtime


def test_imagenet_needs_train_and_val(tmp_path):
    (tmp_path / "x" / "train" / "a").mkdir(parents=True)
    with pytest.raises(DataError, match="val"):
        load_dataset(f"imagenet:{tmp_path / 'x'}")


def test_config_validation_reads_one_header_not_every_image(tmp_path, monkeypatch):
    _write_tiny_imagenet(tmp_path / "tiny")

    def no_decoding(*args, **kwargs):
        raise AssertionError("an image was decoded")

    monkeypatch.setattr(ImageFiles, "_decode", no_decoding)
    monkeypatch.setattr(Image.Image, "load", no_decoding)
    config = tiny_config(dataset=f"imagenet:{tmp_path / 'tiny'}")
    assert config.image_shape == (3, 16, 16) and config.num_patches == 16


def test_folder_on_disk_trains_as_in_memory(tmp_path):
    rng = np.random.default_rng(2)
    for cls in ("a", "b"):
        for i in range(6):
            _save(tmp_path / "f" / cls / f"{i}.png", rng, 8, grey=True)
    config = tiny_config(dataset=f"folder:{tmp_path / 'f'}", train_limit=None, test_limit=None, steps=3)
    on_disk = config.with_updates(data_ram_mb=0)
    assert not prepare_data(on_disk).pretraining.in_memory and prepare_data(config).pretraining.in_memory
    assert torch.equal(prepare_data(on_disk).test_patches, prepare_data(config).test_patches)
    assert train(on_disk, prepare_data(on_disk)).history == train(config, prepare_data(config)).history


def test_a_file_that_changes_size_after_listing_is_named(tmp_path):
    rng = np.random.default_rng(3)
    for i in range(4):
        _save(tmp_path / "f" / "a" / f"{i}.png", rng, 8)
    ds = load_dataset(f"folder:{tmp_path / 'f'}", ram_mb=0)
    _save(tmp_path / "f" / "a" / "2.png", rng, 10)  # rewritten after the headers were read
    with pytest.raises(DataError, match=r"2\.png decodes to 10x10, expected 8x8"):
        ds.train.floats()
        ds.test.floats()


def test_a_colour_validation_image_makes_the_dataset_rgb_for_config_and_loading_alike(tmp_path):
    rng = np.random.default_rng(4)
    for i in range(3):
        _save(tmp_path / "g" / "train" / "a" / f"{i}.png", rng, 8, grey=True)
    _save(tmp_path / "g" / "val" / "a" / "0.png", rng, 8)  # the one colour image
    spec = f"imagenet:{tmp_path / 'g'}"
    assert dataset_image_shape(spec) == (3, 8, 8) == load_dataset(spec).image_shape
