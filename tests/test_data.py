"""Tests for mae_core.data: built-in datasets, local-file loaders and their error messages."""

from __future__ import annotations

import pickle
import warnings
from pathlib import Path

import numpy as np
import pytest
import torch
from PIL import Image

from mae_core.data import (
    BUILTIN_DATASETS,
    DEFAULT_PATCH_SIZE,
    FILE_DATASETS,
    DataError,
    Dataset,
    DuplicateSplitWarning,
    count_split_duplicates,
    dataset_image_shape,
    default_patch_size,
    load_dataset,
    validate_dataset_name,
)

# name -> (image shape, number of classes, train size, test size)
BUILTINS = {
    "digits": ((1, 8, 8), 10, 1437, 360),
    "shapes": ((1, 16, 16), 2, 400, 150),
    "photos": ((3, 32, 32), 9, 2304, 576),
}


def test_constants_agree():
    assert BUILTIN_DATASETS == ("digits", "shapes", "photos")
    assert FILE_DATASETS == ("cifar10", "folder", "npz", "cifar100", "cifar100_coarse", "stl10", "imagenet", "idx")
    assert DEFAULT_PATCH_SIZE == {"digits": 2, "shapes": 4, "photos": 4, "cifar10": 4,
                                  "cifar100": 4, "cifar100_coarse": 4, "stl10": 8}
    assert set(BUILTINS) == set(BUILTIN_DATASETS)


@pytest.mark.parametrize("name", BUILTIN_DATASETS)
def test_builtin_shapes_dtypes_ranges(name):
    shape, n_classes, n_train, n_test = BUILTINS[name]
    ds = load_dataset(name)
    assert isinstance(ds, Dataset) and ds.name == name
    assert ds.image_shape == shape == dataset_image_shape(name)
    assert ds.num_classes == n_classes
    assert tuple(ds.train_images.shape) == (n_train, *shape)
    assert tuple(ds.test_images.shape) == (n_test, *shape)
    for images, labels in ((ds.train_images, ds.train_labels), (ds.test_images, ds.test_labels)):
        assert images.dtype == torch.float32 and labels.dtype == torch.int64
        assert labels.shape == (len(images),)
        assert torch.isfinite(images).all()
        assert images.min() >= 0 and images.max() <= 1
        assert labels.min() >= 0 and labels.max() < n_classes
    # every class is present in both splits
    assert set(ds.train_labels.tolist()) == set(range(n_classes)) == set(ds.test_labels.tolist())
    # shape dimensions are divisible by the default patch size
    p = default_patch_size(name)
    assert p == DEFAULT_PATCH_SIZE[name] and shape[1] % p == 0 and shape[2] % p == 0


@pytest.mark.parametrize("name", BUILTIN_DATASETS)
def test_builtin_split_is_deterministic(name):
    a = load_dataset(name, seed=3)
    from mae_core import data

    data._load_cached.cache_clear()  # force a real reload, not the cached object
    b = load_dataset(name, seed=3)
    assert a is not b
    for field in ("train_images", "train_labels", "test_images", "test_labels"):
        assert torch.equal(getattr(a, field), getattr(b, field)), field


# sha256 (first 24 hex digits) of the float32 images as main's loaders made them at bccb641,
# before images were stored as bytes: digits / 16.0 -> float32, photo crops / np.float32(255).
FLOAT_STORAGE_SHA256 = {
    "digits": ("42529fb6a655e9c0e927267b", "53d6a8c3d406e86d40aad5ac"),
    "photos": ("243310ee77f0fe1bac0a06e3", "f1ca3369b1b4714381c1555c"),
}


@pytest.mark.parametrize("name", FLOAT_STORAGE_SHA256)
def test_stored_bytes_convert_to_the_floats_of_float_storage(name):
    import hashlib

    ds = load_dataset(name)
    assert ds.train.source.dtype == np.uint8 and ds.test.source.dtype == np.uint8  # a quarter of the memory
    digests = tuple(hashlib.sha256(t.numpy().tobytes()).hexdigest()[:24] for t in (ds.train_images, ds.test_images))
    assert digests == FLOAT_STORAGE_SHA256[name]


def test_same_seed_is_cached():
    assert load_dataset("digits", seed=1) is load_dataset("digits", seed=1)
    assert load_dataset("digits") is load_dataset("digits", seed=0)


def test_digits_different_seed_different_split():
    a, b = load_dataset("digits", seed=0), load_dataset("digits", seed=1)
    assert not torch.equal(a.test_images, b.test_images)
    # same pool of images, just divided differently
    assert len(a.train_images) == len(b.train_images)
    total = lambda d: torch.cat([d.train_images, d.test_images]).sum()  # noqa: E731
    assert torch.allclose(total(a), total(b))


def test_digits_values_are_sixteenths():
    ds = load_dataset("digits")
    scaled = ds.train_images * 16
    assert torch.equal(scaled, scaled.round())


def _lesson_image(shape: str, cx: int, cy: int) -> np.ndarray:
    """Independent re-implementation of the lesson's (seed 001) binary plus/circle [16, 16]."""
    yy, xx = np.mgrid[0:16, 0:16]
    img = np.zeros((16, 16), dtype=np.float32)
    if shape == "plus":
        img[cy - 1:cy + 2, cx - 3:cx + 4] = 1
        img[cy - 3:cy + 4, cx - 1:cx + 2] = 1
    else:
        img[(xx - cx) ** 2 + (yy - cy) ** 2 <= 9] = 1
    return img


def test_shapes_render_the_lessons_shapes_at_integer_centres():
    # the lesson's 128 images: 2 shapes x centres 4..11; plus exactly, circle after a 0.5 threshold
    from mae_core.data import _render_shapes

    labels, cx, cy = (a.ravel() for a in np.meshgrid([0, 1], np.arange(4, 12), np.arange(4, 12),
                                                     indexing="ij"))
    rendered = _render_shapes(labels, cx.astype(float), cy.astype(float))[:, 0]
    lesson = np.stack([_lesson_image(("plus", "circle")[k], x, y) for k, x, y in zip(labels, cx, cy)])
    plus = labels == 0
    assert np.array_equal(rendered[plus], lesson[plus])
    assert np.array_equal(rendered[~plus] >= 0.5, lesson[~plus] == 1)


def test_shapes_are_continuous_draws_with_zero_background():
    ds = load_dataset("shapes", seed=0)
    assert ds.class_names == ("plus", "circle")
    pool = torch.cat([ds.train_images, ds.test_images])[:, 0]
    # sub-pixel centres: (almost) every image is distinct, unlike the lesson's 128 possible ones
    assert len({img.numpy().tobytes() for img in pool}) == len(pool)
    # whole 4x4 patches stay at 0: shapes lie outside D_norm, as before
    patch_max = pool.unfold(1, 4, 4).unfold(2, 4, 4).amax(dim=(-1, -2))  # [N, 4, 4]
    assert ((patch_max == 0).sum(dim=(1, 2)) >= 4).all()
    # the label names the shape, and no shape is cut by the border: a plus covers exactly its area
    mass = pool.sum(dim=(1, 2))
    labels = torch.cat([ds.train_labels, ds.test_labels])
    assert torch.allclose(mass[labels == 0], torch.tensor(33.0), atol=1e-3)  # 21 + 21 - 9 pixels
    assert (mass[labels == 1] > 26).all() and (mass[labels == 1] < 30).all()  # about pi * 3^2
    assert not torch.equal(load_dataset("shapes", seed=1).train_images, ds.train_images)


# ---------------------------------------------------------------------------------------------
# leak-free splits


def _direct_overlap(train: torch.Tensor, test: torch.Tensor) -> int:
    """Test images equal to a training image, by plain bytes (no hashing): the reference count."""
    seen = {img.numpy().tobytes() for img in train}
    return sum(img.numpy().tobytes() in seen for img in test)


@pytest.mark.parametrize("seed", [0, 1, 2])
@pytest.mark.parametrize("name", BUILTIN_DATASETS)
def test_builtin_splits_share_no_image(name, seed):
    ds = load_dataset(name, seed=seed)
    assert ds.train_test_duplicates == 0
    assert count_split_duplicates(ds.train_images, ds.test_images) == 0
    assert _direct_overlap(ds.train_images, ds.test_images) == 0
    # the split sizes of before
    _, _, n_train, n_test = BUILTINS[name]
    assert (len(ds.train_images), len(ds.test_images)) == (n_train, n_test)


def _pixels(corners: np.ndarray, hw: tuple[int, int]) -> np.ndarray:
    """Bool mask [H, W] of the pixels covered by the 32x32 crops at corners [n, 2] (y, x)."""
    mask = np.zeros(hw, bool)
    for y, x in corners:
        mask[y:y + 32, x:x + 32] = True
    return mask


@pytest.mark.parametrize("seed", [0, 1, 2])
def test_photo_test_crops_share_no_pixel_with_training_crops(seed):
    from mae_core.data import _load_photos, _photo_crops

    (xtr, ytr, xte, yte), names, layout = _photo_crops(seed)
    ds = load_dataset("photos", seed=seed)
    assert torch.equal(ds.test_images, torch.from_numpy(xte)) and torch.equal(ds.train_images, torch.from_numpy(xtr))
    for label, (name, photo) in enumerate(_load_photos().items()):
        assert names[label] == name
        where = layout[label]
        hw = photo.shape[:2]
        train_px, test_px = _pixels(where["train"], hw), _pixels(where["test"], hw)
        assert not (train_px & test_px).any(), name
        assert not (train_px & where["test_mask"]).any() and not (test_px & ~where["test_mask"]).any()
        # the recorded corners are where this photo's test images were cut
        cut = {(photo[y:y + 32, x:x + 32].transpose(2, 0, 1) / np.float32(255)).astype(np.float32).tobytes()
               for y, x in where["test"]}
        assert cut == {img.numpy().tobytes() for img in ds.test_images[ds.test_labels == label]}
        assert (len(where["train"]), len(where["test"])) == (256, 64)


def test_count_split_duplicates_counts_every_test_copy():
    rng = np.random.default_rng(0)
    train = rng.random((20, 1, 4, 4)).astype(np.float32)
    test = np.concatenate([train[[3, 3, 7]], rng.random((5, 1, 4, 4)).astype(np.float32)])
    assert count_split_duplicates(train, test) == 3
    assert count_split_duplicates(torch.from_numpy(train), torch.from_numpy(test)) == 3
    assert count_split_duplicates(train, test[3:]) == 0
    assert count_split_duplicates(train, test[:0]) == 0
    # a value one ulp away is a different image
    nudged = train[[3]].copy()
    nudged[0, 0, 0, 0] = np.nextafter(nudged[0, 0, 0, 0], np.float32(2))
    assert count_split_duplicates(train, nudged) == 0


def test_group_split_keeps_copies_together_and_equals_plain_split_without_copies():
    from mae_core.data import _split

    rng = np.random.default_rng(0)
    images = rng.random((100, 1, 4, 4)).astype(np.float32)
    labels = np.arange(100) % 2
    plain = _split(images, labels, seed=5)
    grouped = _split(images, labels, seed=5, group_duplicates=True)
    assert all(np.array_equal(a, b) for a, b in zip(plain, grouped))
    images[50:60] = images[0]  # ten more copies of image 0 ...
    labels[50:60] = labels[0]  # ... with its label
    xtr, ytr, xte, yte = _split(images, labels, seed=5, group_duplicates=True)
    assert count_split_duplicates(xtr, xte) == 0
    assert len(xtr) + len(xte) == 100 and 15 <= len(xte) <= 30  # nothing dropped, about 80/20


def test_npz_planted_duplicates_are_counted_and_warned(tmp_path):
    rng = np.random.default_rng(0)
    images = rng.integers(0, 256, (12, 8, 8), dtype=np.uint8)
    test_images = np.concatenate([images[[2, 5, 5]], rng.integers(0, 256, (3, 8, 8), dtype=np.uint8)])
    spec = _npz(tmp_path, images=images, labels=np.arange(12) % 2, test_images=test_images,
                test_labels=np.zeros(6, np.int64))
    with pytest.warns(DuplicateSplitWarning, match=r"3 of 6 test images") as record:
        ds = load_dataset(spec)
    assert str(tmp_path / "d.npz") in str(record[0].message) and "\n" not in str(record[0].message)
    assert ds.train_test_duplicates == 3 == _direct_overlap(ds.train_images, ds.test_images)
    assert len(ds.test_images) == 6  # user data is kept, not dropped


def test_npz_random_split_duplicates_are_counted(tmp_path):
    images = np.repeat(np.random.default_rng(0).integers(0, 256, (10, 6, 6), dtype=np.uint8), 4, axis=0)
    spec = _npz(tmp_path, images=images, labels=np.zeros(40, np.int64))  # every image 4 times
    with pytest.warns(DuplicateSplitWarning):
        ds = load_dataset(spec)
    assert ds.train_test_duplicates == _direct_overlap(ds.train_images, ds.test_images) > 0
    assert len(ds.train_images) + len(ds.test_images) == 40


def test_clean_file_dataset_gives_no_warning(tmp_path):
    images = np.random.default_rng(0).integers(0, 256, (10, 8, 8), dtype=np.uint8)
    spec = _npz(tmp_path, images=images, labels=np.arange(10) % 2)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        assert load_dataset(spec).train_test_duplicates == 0


def test_photos_blocks_non_constant_and_all_photos_labelled():
    ds = load_dataset("photos")
    assert len(set(ds.class_names)) == ds.num_classes == 9
    for images in (ds.train_images, ds.test_images):
        blocks = images.reshape(len(images), 3, 16, 2, 16, 2)
        spread = blocks.amax(dim=(1, 3, 5)) - blocks.amin(dim=(1, 3, 5))
        assert (spread > 0).all()
        # hence every 4x4 patch has positive standard deviation
        patches = images.unfold(2, 4, 4).unfold(3, 4, 4)  # [N, 3, 8, 8, 4, 4]
        std = patches.permute(0, 2, 3, 1, 4, 5).reshape(len(images), 64, 48).std(dim=-1)
        assert (std > 0).all()
    counts = torch.bincount(torch.cat([ds.train_labels, ds.test_labels]), minlength=9)
    assert (counts == 320).all()
    # multiples of 1/255
    assert torch.allclose(ds.test_images * 255, (ds.test_images * 255).round(), atol=1e-3)


# ---------------------------------------------------------------------------------------------
# file loaders


def _write_cifar(root: Path, n_train_batches: int = 2, n: int = 20, meta: bool = True) -> dict:
    rng = np.random.default_rng(0)
    root.mkdir(parents=True, exist_ok=True)
    written = {}
    names = [f"data_batch_{i}" for i in range(1, n_train_batches + 1)] + ["test_batch"]
    for name in names:
        data = rng.integers(0, 256, (n, 3072), dtype=np.uint8)
        labels = [int(v) for v in rng.integers(0, 10, n)]
        batch = {b"batch_label": name.encode(), b"labels": labels, b"data": data,
                 b"filenames": [f"{i}.png".encode() for i in range(n)]}
        (root / name).write_bytes(pickle.dumps(batch, protocol=2))
        written[name] = (data, labels)
    if meta:
        label_names = [f"class{i}".encode() for i in range(10)]
        (root / "batches.meta").write_bytes(pickle.dumps({b"label_names": label_names}, protocol=2))
    return written


def test_cifar10_roundtrip(tmp_path):
    written = _write_cifar(tmp_path / "cifar")
    spec = f"cifar10:{tmp_path / 'cifar'}"
    assert validate_dataset_name(spec) == spec
    ds = load_dataset(spec)
    assert tuple(ds.train_images.shape) == (40, 3, 32, 32)
    assert tuple(ds.test_images.shape) == (20, 3, 32, 32)
    assert ds.class_names == tuple(f"class{i}" for i in range(10))
    data, labels = written["data_batch_2"]
    expected = torch.from_numpy(data.reshape(-1, 3, 32, 32)).float() / 255
    assert torch.allclose(ds.train_images[20:], expected)
    assert ds.train_labels[20:].tolist() == labels
    assert ds.test_labels.tolist() == written["test_batch"][1]
    assert dataset_image_shape(spec) == (3, 32, 32) and default_patch_size(spec) == 4


def test_cifar10_without_meta_uses_standard_names(tmp_path):
    _write_cifar(tmp_path / "c", n_train_batches=1, meta=False)
    ds = load_dataset(f"cifar10:{tmp_path / 'c'}")
    assert ds.class_names[0] == "airplane" and ds.num_classes == 10


def test_cifar10_missing_test_batch(tmp_path):
    _write_cifar(tmp_path / "c")
    (tmp_path / "c" / "test_batch").unlink()
    with pytest.raises(DataError, match="test_batch"):
        load_dataset(f"cifar10:{tmp_path / 'c'}")


def test_cifar10_refuses_arbitrary_pickle_globals(tmp_path):
    _write_cifar(tmp_path / "c", n_train_batches=1)
    (tmp_path / "c" / "data_batch_1").write_bytes(pickle.dumps({b"data": Path("x")}))
    with pytest.raises(DataError, match="data_batch_1"):
        load_dataset(f"cifar10:{tmp_path / 'c'}")


def _write_png_folder(root: Path, sizes: dict[str, list[tuple[int, int]]], mode: str = "L") -> None:
    rng = np.random.default_rng(0)
    for cls, dims in sizes.items():
        (root / cls).mkdir(parents=True)
        for i, (w, h) in enumerate(dims):
            shape = (h, w) if mode == "L" else (h, w, 3)
            Image.fromarray(rng.integers(0, 256, shape, dtype=np.uint8), mode).save(root / cls / f"{i}.png")


@pytest.mark.parametrize("mode, channels", [("L", 1), ("RGB", 3)])
def test_folder_roundtrip(tmp_path, mode, channels):
    root = tmp_path / "imgs"
    _write_png_folder(root, {"cats": [(12, 8)] * 5, "dogs": [(12, 8)] * 5}, mode)
    spec = f"folder:{root}"
    ds = load_dataset(spec, seed=0)
    assert ds.class_names == ("cats", "dogs")
    assert ds.image_shape == (channels, 8, 12)
    assert len(ds.train_images) == 8 and len(ds.test_images) == 2
    assert sorted(ds.test_labels.tolist()) == [0, 1]  # stratified
    # every pixel comes from a file on disk
    first = np.asarray(Image.open(root / "cats" / "0.png"), dtype=np.float32) / 255
    first = first[None] if mode == "L" else first.transpose(2, 0, 1)
    pool = torch.cat([ds.train_images, ds.test_images])
    assert any(torch.allclose(img, torch.from_numpy(first)) for img in pool)
    assert default_patch_size(spec) == 4


def test_folder_mixed_colour_becomes_rgb(tmp_path):
    root = tmp_path / "imgs"
    _write_png_folder(root, {"a": [(8, 8)] * 3}, "L")
    _write_png_folder(root, {"b": [(8, 8)] * 3}, "RGB")
    assert load_dataset(f"folder:{root}").image_shape == (3, 8, 8)


def _npz(tmp_path: Path, name: str = "d.npz", **arrays) -> str:
    path = tmp_path / name
    np.savez(path, **arrays)
    return f"npz:{path}"


NPZ_LAYOUTS = {
    "NHW": ((10, 8, 8), (1, 8, 8)),
    "NCHW": ((10, 3, 8, 8), (3, 8, 8)),
    "NHWC": ((10, 8, 8, 3), (3, 8, 8)),
    "NHW1": ((10, 6, 6, 1), (1, 6, 6)),
}


@pytest.mark.parametrize("layout", NPZ_LAYOUTS)
def test_npz_layouts(tmp_path, layout):
    in_shape, out_shape = NPZ_LAYOUTS[layout]
    images = np.random.default_rng(0).integers(0, 256, in_shape, dtype=np.uint8)
    labels = np.arange(10) % 2
    spec = _npz(tmp_path, images=images, labels=labels)
    ds = load_dataset(spec)
    assert ds.image_shape == out_shape == dataset_image_shape(spec)
    assert len(ds.train_images) == 8 and len(ds.test_images) == 2
    assert ds.class_names == ("0", "1")
    # the loaded pixels are the file's pixels, channel-first, /255
    chw = images[:, None] if images.ndim == 3 else images
    if layout in ("NHWC", "NHW1"):
        chw = images.transpose(0, 3, 1, 2)
    pool = {tuple(np.round(img.numpy().ravel() * 255).astype(int)) for img in
            torch.cat([ds.train_images, ds.test_images])}
    assert pool == {tuple(img.ravel().astype(int)) for img in chw}
    assert default_patch_size(spec) == (4 if out_shape[1] == 8 else 2)


def test_npz_explicit_test_split_and_floats(tmp_path):
    rng = np.random.default_rng(0)
    x, xt = rng.normal(size=(6, 1, 5, 5)), rng.normal(size=(3, 1, 5, 5))
    spec = _npz(tmp_path, images=x, labels=np.array([0, 1, 2] * 2), test_images=xt,
                test_labels=np.array([2, 1, 0]), class_names=np.array(["a", "b", "c"]))
    ds = load_dataset(spec)
    assert torch.allclose(ds.train_images, torch.from_numpy(x).float())  # floats kept as-is
    assert ds.test_labels.tolist() == [2, 1, 0] and ds.class_names == ("a", "b", "c")
    assert default_patch_size(spec) == 1


# ---------------------------------------------------------------------------------------------
# errors: each names the offending path or key


def test_missing_path(tmp_path):
    missing = tmp_path / "nope.npz"
    for fn in (validate_dataset_name, load_dataset, dataset_image_shape):
        with pytest.raises(DataError, match="nope.npz"):
            fn(f"npz:{missing}")


@pytest.mark.parametrize("spec", ["mnist", "mnist:/tmp", "", "npz:", "Digits"])
def test_unknown_or_malformed_spec(spec):
    with pytest.raises(DataError) as err:
        validate_dataset_name(spec)
    msg = str(err.value)
    assert "\n" not in msg
    assert "digits | shapes | photos | fashion_mnist | cifar10:PATH | folder:PATH | npz:PATH" in msg
    if spec.startswith("mnist"):
        assert "mnist" in msg


BAD_NPZ = {
    "rank": (dict(images=np.zeros((4, 8), np.uint8), labels=np.zeros(4, np.int64)), "images"),
    "nan": (dict(images=np.full((4, 8, 8), np.nan, np.float32), labels=np.zeros(4, np.int64)), "256"),
    "empty": (dict(images=np.zeros((0, 8, 8), np.uint8), labels=np.zeros(0, np.int64)), "empty"),
    "mismatch": (dict(images=np.zeros((4, 8, 8), np.uint8), labels=np.zeros(3, np.int64)), "labels"),
    "no_labels": (dict(images=np.zeros((4, 8, 8), np.uint8)), "labels"),
    "no_test_labels": (dict(images=np.zeros((4, 8, 8), np.uint8), labels=np.zeros(4, np.int64),
                            test_images=np.zeros((2, 8, 8), np.uint8)), "test_labels"),
    "channels": (dict(images=np.zeros((4, 5, 8, 8), np.uint8), labels=np.zeros(4, np.int64)), "channels"),
    "int_pixels": (dict(images=np.zeros((4, 8, 8), np.int32), labels=np.zeros(4, np.int64)), "int32"),
    "float_labels": (dict(images=np.zeros((4, 8, 8), np.uint8), labels=np.zeros(4)), "labels"),
}


@pytest.mark.parametrize("case", BAD_NPZ)
def test_bad_npz(tmp_path, case):
    arrays, fragment = BAD_NPZ[case]
    spec = _npz(tmp_path, f"{case}.npz", **arrays)
    with pytest.raises(DataError) as err:
        load_dataset(spec)
    msg = str(err.value)
    assert f"{case}.npz" in msg and fragment in msg and "\n" not in msg


def test_npz_nan_count_is_reported(tmp_path):
    images = np.zeros((4, 8, 8), np.float32)
    images[0, 0, :3] = np.nan
    images[1, 1, 1] = np.inf
    with pytest.raises(DataError, match="4 non-finite"):
        load_dataset(_npz(tmp_path, images=images, labels=np.zeros(4, np.int64)))


def test_npz_not_a_zip(tmp_path):
    path = tmp_path / "junk.npz"
    path.write_text("not a zip")
    with pytest.raises(DataError, match="junk.npz"):
        load_dataset(f"npz:{path}")


def test_folder_mixed_sizes_names_file(tmp_path):
    root = tmp_path / "imgs"
    _write_png_folder(root, {"a": [(8, 8), (8, 8)], "b": [(8, 8), (10, 8)]})
    with pytest.raises(DataError, match=r"b[/\\]1\.png"):
        load_dataset(f"folder:{root}")


def test_folder_without_images(tmp_path):
    (tmp_path / "imgs" / "a").mkdir(parents=True)
    with pytest.raises(DataError, match="imgs"):
        load_dataset(f"folder:{tmp_path / 'imgs'}")


@pytest.mark.filterwarnings("ignore::mae_core.data.DuplicateSplitWarning")  # all-zero images
def test_rewritten_npz_is_reloaded(tmp_path):
    import os

    spec = _npz(tmp_path, images=np.zeros((5, 4, 4), np.uint8), labels=np.zeros(5, np.int64))
    assert len(load_dataset(spec).train_images) == 4
    path = tmp_path / "d.npz"
    np.savez(path, images=np.zeros((10, 4, 4), np.uint8), labels=np.zeros(10, np.int64))
    st = path.stat()
    os.utime(path, ns=(st.st_atime_ns, st.st_mtime_ns + 10**9))  # mtime granularity on some FSes
    assert len(load_dataset(spec).train_images) == 8
