"""Datasets for the MAE studies: built-ins that need no download, and loaders for local files.

A dataset is named by a spec string: a built-in (``digits``, ``shapes``, ``photos``), a named
dataset found on this machine (``fashion_mnist``, :mod:`~mae_core.named_datasets`) or
``kind:PATH`` with kind in ``cifar10 | folder | npz | cifar100 | cifar100_coarse | stl10 |
imagenet | idx`` (readers in :mod:`~mae_core.formats`, :mod:`~mae_core.folders` and
:mod:`~mae_core.idx`) or a plugin's format (``@dataset_format``, :mod:`mae_core.registry`). A
dataset with a test split of its own (every format but a folder and an npz without
``test_images``) keeps it, the same for every seed; the seed splits only a pool. Everything is
loaded lazily and cached per (spec, seed, RAM ceiling). Images are kept as stored
(:class:`~mae_core.images.ImageStore`: uint8 where the data are bytes, a quarter of float32's
memory) and become float32 ``[N, C, H, W]`` a batch at a time, bitwise the values the loaders
computed before (``byte / 255``; digits ``byte / 16``); labels are int64 ``[N]``.

Split guarantee. In a built-in dataset no test image is byte-equal to a training image, at every
seed (``Dataset.train_test_duplicates == 0``, checked at load time):

* ``digits``: a seeded, stratified 80/20 split that keeps every copy of an image in one split
  (load_digits holds no exact duplicates today, so this is the plain stratified split);
* ``shapes``: plus/circle images at continuous sub-pixel centres, rendered anti-aliased, so two
  draws are distinct almost surely; a test draw equal to a training image is redrawn anyway;
* ``photos``: each photo is cut into a 5x5 grid of blocks and 5 blocks chosen by the seed hold
  its test crops; training crops never touch those blocks, so no test crop shares a pixel with a
  training crop (and a test crop byte-equal to a training crop, a flat patch of retina's dark rim,
  is redrawn).

File datasets are kept as the user made them: test images that equal a training image (or, for
STL-10, an unlabelled pretraining image) are counted (``train_test_duplicates``) and reported
with a ``DuplicateSplitWarning``, never dropped.

Memory. ``ram_mb`` (the config's ``data_ram_mb``) is the ceiling on the image bytes a trial
reads into memory: a dataset above it stays on disk, memory-mapped (STL-10's binaries, an npz
member stored uncompressed) or as files decoded per batch (folder, imagenet), and training
reads it batch by batch. CIFAR's pickles and compressed or float npz members are always read
whole.
"""

from __future__ import annotations

import dataclasses
import functools
import hashlib
import warnings
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import torch

from . import registry
from .formats import DataError, Splits
from .images import BYTE_VALUES, SIXTEENTHS, ImageStore
from .labels import require_two_classes
from .named_datasets import NAMED, locate
from .patches import patchify

BUILTIN_DATASETS: tuple[str, ...] = ("digits", "shapes", "photos")
# The file formats (``kind:PATH``) are the registry's (:mod:`mae_core.registry`, built-ins in
# :mod:`mae_core.builtin_parts`): FILE_DATASETS, DEFAULT_PATCH_SIZE and ALLOWED_FORMS are read
# from it on each access (module ``__getattr__`` below), so a plugin's format joins them.
DEFAULT_RAM_MB = 4096  # the config's data_ram_mb default

_BUILTIN_SHAPES = {"digits": (1, 8, 8), "shapes": (1, 16, 16), "photos": (3, 32, 32)}
_BUILTIN_PATCH_SIZE = {"digits": 2, "shapes": 4, "photos": 4}


def __getattr__(name: str):
    formats = registry.dataset_formats
    if name == "FILE_DATASETS":
        return formats.names()
    if name == "DEFAULT_PATCH_SIZE":  # where the image size is fixed; the others: default_patch_size
        return {**_BUILTIN_PATCH_SIZE, **{kind: formats.get(kind).patch_size for kind in formats.names()
                                          if formats.get(kind).patch_size is not None}}
    if name == "ALLOWED_FORMS":
        return " | ".join((*BUILTIN_DATASETS, *NAMED, *(f"{kind}:PATH" for kind in formats.names())))
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


# Colour photos shipped inside the wheels (no network): skimage first, then sklearn's two samples.
_SKIMAGE_PHOTOS = ("astronaut", "chelsea", "coffee", "rocket", "hubble_deep_field",
                   "immunohistochemistry", "retina")


class DuplicateSplitWarning(UserWarning):
    """A file dataset's test split holds images byte-equal to training images (kept, not dropped)."""


@dataclass(frozen=True, eq=False)  # eq=False: comparing stores and tensors field-wise is ambiguous
class Dataset:
    """Train/test images as stored (:class:`ImageStore`) and labels int64 ``[N]``; shared via a
    cache, so treat it as read-only. ``unlabelled`` holds images for pretraining only (STL-10)."""

    name: str
    train: ImageStore
    train_labels: torch.Tensor
    test: ImageStore
    test_labels: torch.Tensor
    class_names: tuple[str, ...]
    # Test images byte-equal to some training (or unlabelled) image; 0 for built-ins.
    train_test_duplicates: int = 0
    unlabelled: ImageStore | None = None

    @property
    def train_images(self) -> torch.Tensor:
        """The training split as float32 ``[N, C, H, W]`` (made on each read: 4x the stored bytes)."""
        return self.train.floats()

    @property
    def test_images(self) -> torch.Tensor:
        """The test split as float32 ``[N, C, H, W]`` (made on each read)."""
        return self.test.floats()

    @property
    def pretrain(self) -> ImageStore:
        """The images pretraining samples: the unlabelled set where there is one, else the training split."""
        return self.unlabelled if self.unlabelled is not None else self.train

    @property
    def image_shape(self) -> tuple[int, int, int]:
        """(C, H, W) of every image."""
        return self.train.image_shape

    @property
    def num_classes(self) -> int:
        return len(self.class_names)


def _parse(spec: str) -> tuple[str, Path | None]:
    """Split a spec into (kind, path); path is None for built-ins. Raises DataError."""
    allowed = __getattr__("ALLOWED_FORMS")
    if not isinstance(spec, str):
        raise DataError(f"dataset spec must be a string, got {type(spec).__name__}; allowed: {allowed}")
    if spec in BUILTIN_DATASETS:
        return spec, None
    if spec in NAMED:  # its folder on this machine, or one line saying how to get it
        return spec, locate(spec)
    kind, sep, path = spec.partition(":")
    if not sep or kind not in registry.dataset_formats:
        raise DataError(f"unknown dataset {spec!r}; allowed: {allowed}")
    if not path:
        raise DataError(f"dataset {spec!r} has an empty PATH; allowed: {allowed}")
    p = Path(path).expanduser()
    if not p.exists():
        raise DataError(f"dataset path does not exist: {p} (from {spec!r})")
    return kind, p


def _stamp(path: Path | None) -> tuple:
    """A fingerprint of the path and, for a folder, of its entries (mtime and size of each): part
    of cache keys, so a rewritten npz, CIFAR or STL-10 file (or a folder gaining or losing
    entries) is reloaded instead of served stale. Sizes count because a file appended to within
    the filesystem's timestamp granularity (a few ms on some) keeps its mtime."""
    if path is None:
        return ()
    entries = sorted(path.iterdir()) if path.is_dir() else []
    return tuple((str(p), stat.st_mtime_ns, stat.st_size) for p in [path, *entries] for stat in [p.stat()])


def validate_dataset_name(spec: str) -> str:
    """Cheap check before loading: returns ``spec`` unchanged if it is a built-in or ``kind:PATH``
    with a known kind and an existing PATH; otherwise raises DataError."""
    _parse(spec)
    return spec


def dataset_image_shape(spec: str) -> tuple[int, int, int]:
    """(C, H, W) of the dataset's images without loading them: fixed for built-ins, CIFAR and
    STL-10; an npz's from the ``images`` header; a folder's from the first image's header
    (grey folders have every header read, to find a colour one). Cached per (spec, mtime)."""
    kind, path = _parse(spec)
    if kind in _BUILTIN_SHAPES:
        return _BUILTIN_SHAPES[kind]
    return _file_image_shape(spec, _stamp(path))


@functools.lru_cache(maxsize=32)
def _file_image_shape(spec: str, _stamp: tuple) -> tuple[int, int, int]:
    kind, path = _parse(spec)
    entry = _format(kind)
    if entry.image_shape is not None:
        return tuple(entry.image_shape(path))
    return entry.load(path, 2**62).train.image_shape  # a format without a header probe: read once


def default_patch_size(spec: str) -> int:
    """Patch size p for the dataset: fixed for built-ins, CIFAR (4) and STL-10 (8); for
    imagenet, the smallest of 4, 8, 16 that divides H and W into at most 256 patches (16 at
    224 px, He et al.'s ViT/16; 4 at Tiny-ImageNet's 64 px); for folder/npz (and an imagenet
    folder none of those fits), 4 if H and W are divisible by 4 and at least 8, else 2 if both
    are even, else 1."""
    kind, path = _parse(spec)
    fixed = _BUILTIN_PATCH_SIZE[kind] if path is None else _format(kind).patch_size
    if fixed is not None:
        return fixed
    _, h, w = dataset_image_shape(spec)
    if kind == "imagenet":
        for p in (4, 8, 16):
            if h % p == 0 and w % p == 0 and (h // p) * (w // p) <= 256:
                return p
    if h % 4 == 0 and w % 4 == 0 and min(h, w) >= 8:
        return 4
    return 2 if h % 2 == 0 and w % 2 == 0 else 1


def load_dataset(spec: str, *, seed: int = 0, ram_mb: int = DEFAULT_RAM_MB) -> Dataset:
    """Load (cached) a dataset: images as stored, labels int64 [N]; seed fixes the split (and the
    generated images for shapes/photos); a dataset above ``ram_mb`` MB of images stays on disk."""
    _, path = _parse(spec)
    return _load_cached(spec, int(seed), _stamp(path), int(ram_mb))


@functools.lru_cache(maxsize=8)
def _load_cached(spec: str, seed: int, _stamp: tuple, ram_mb: int = DEFAULT_RAM_MB) -> Dataset:
    kind, path = _parse(spec)
    splits = _builtin(kind, seed) if path is None else _read_files(kind, path, ram_mb * 2**20)
    train, ytr, test, yte = splits.train, splits.train_labels, splits.test, splits.test_labels
    if test is None:  # a pool: the seeded 80/20 split
        tr, te = _split_indices(ytr, seed, where=path)
        train, ytr, test, yte = train.take(tr), ytr[tr], train.take(te), ytr[te]
    # on the stored bytes: the byte -> float table is one-to-one, so the count is that of the floats
    duplicates = count_split_duplicates(train, test, also=[splits.unlabelled] if splits.unlabelled is not None else [])
    if duplicates and path is None:  # a built-in must never leak: a bug, not a user error
        raise RuntimeError(f"built-in dataset {spec!r} (seed {seed}) has {duplicates} test images "
                           f"equal to training images")
    if duplicates:
        # stacklevel 3: _load_cached <- load_dataset <- the caller
        warnings.warn(f"dataset {spec!r}: {duplicates} of {len(test)} test images are byte-equal to a "
                      f"training image (kept; test scores may be optimistic)",
                      DuplicateSplitWarning, stacklevel=3)
    labels = (torch.from_numpy(np.ascontiguousarray(y)).long() for y in (ytr, yte))
    return Dataset(spec, train, next(labels), test, next(labels), tuple(splits.names), duplicates,
                   splits.unlabelled)


def _builtin(kind: str, seed: int) -> Splits:
    if kind == "digits":
        from sklearn.datasets import load_digits

        d = load_digits()
        images = d.images.astype(np.uint8)[:, None]  # 0..16, scaled by 1/16 (SIXTEENTHS)
        if not np.array_equal(images[:, 0], d.images):
            raise RuntimeError("load_digits no longer holds integers 0..16")
        xtr, ytr, xte, yte = _split(images, d.target, seed, group_duplicates=True)
        return Splits(ImageStore(xtr, SIXTEENTHS), ytr, ImageStore(xte, SIXTEENTHS), yte,
                      tuple(str(i) for i in range(10)))
    if kind == "shapes":
        xtr, ytr, xte, yte = _make_shapes(seed)
        return Splits(ImageStore(xtr), ytr, ImageStore(xte), yte, ("plus", "circle"))
    (xtr, ytr, xte, yte), names, _ = _photo_bytes(seed)
    return Splits(ImageStore(xtr, BYTE_VALUES), ytr, ImageStore(xte, BYTE_VALUES), yte, names)


def _format(kind: str) -> registry.DatasetFormat:
    """The file format that reads ``kind``: a registered one, or a named dataset's."""
    return registry.dataset_formats.get(NAMED[kind].kind if kind in NAMED else kind)


def _read_files(kind: str, path: Path, ram_bytes: int) -> Splits:
    splits = _format(kind).load(path, ram_bytes)
    if kind in NAMED:  # the publisher's class names, not the format's "0", "1", ...
        splits = dataclasses.replace(splits, names=NAMED[kind].class_names)
    return splits


# ------------------------------------------------------------------------- duplicates

Images = torch.Tensor | np.ndarray | ImageStore


def _reads_labels(config) -> bool:
    """Whether an evaluator the config runs reads the labels (``needs_labels``: the probes)."""
    from .evaluator import expand

    return any(getattr(registry.evaluators.get(name).evaluator_class, "needs_labels", False)
               for name in expand(config.eval.evaluators))


def count_split_duplicates(train_images: Images, test_images: Images, also: Sequence[Images] = ()) -> int:
    """How many test images ``[N_test, ...]`` are byte-equal to some training image
    ``[N_train, ...]`` (or to an image of one of the sets ``also``, such as STL-10's unlabelled
    pretraining set); same dtype expected; -0.0 and 0.0 differ. Hashes each image's raw bytes,
    then confirms every hash hit byte for byte, so the count is exact. Stores are read a chunk
    at a time, so a dataset on disk is never held whole."""
    test = test_images
    trains = [t for t in (train_images, *also) if _dtype(t) == _dtype(test) and _image_shape(t) == _image_shape(test)]
    seen: dict[bytes, tuple[int, int]] = {}  # digest -> (which training set, image index)
    for which, images in enumerate(trains):
        for offset, rows in _chunked_rows(images):
            for i, row in enumerate(rows):
                seen.setdefault(_digest(row), (which, offset + i))
    count = 0
    for _, rows in _chunked_rows(test):
        for row in rows:
            hit = seen.get(_digest(row))
            count += hit is not None and row.tobytes() == _one_row(trains[hit[0]], hit[1]).tobytes()
    return count


def _dtype(images: Images) -> np.dtype:
    if isinstance(images, ImageStore):
        return np.dtype(images.source.dtype)
    return images.numpy().dtype if isinstance(images, torch.Tensor) else np.asarray(images).dtype


def _image_shape(images: Images) -> tuple[int, ...]:
    return tuple(images.image_shape if isinstance(images, ImageStore) else images.shape[1:])


def _chunked_rows(images: Images) -> Iterator[tuple[int, np.ndarray]]:
    """(offset, rows [b, D]): one contiguous row of raw values per image, a chunk at a time."""
    if isinstance(images, ImageStore):
        for offset, stored in images.chunks():
            yield offset, _as_rows(stored)
    else:
        yield 0, _as_rows(images)


def _one_row(images: Images, i: int) -> np.ndarray:
    if isinstance(images, ImageStore):
        return _as_rows(images.stored(np.array([i])))[0]
    return _as_rows(images[i:i + 1])[0]


def _as_rows(images: torch.Tensor | np.ndarray) -> np.ndarray:
    """Images [N, ...] -> contiguous numpy [N, D], one row of raw values per image."""
    a = images.numpy() if isinstance(images, torch.Tensor) else np.asarray(images)
    return np.ascontiguousarray(a.reshape(len(a), int(np.prod(a.shape[1:]))))  # -1 fails when N = 0


def _digest(row: np.ndarray) -> bytes:
    # 16-byte BLAKE2b keys: a set of them stays small even for STL-10's 100,000 x 27 KB images.
    return hashlib.blake2b(row.data, digest_size=16).digest()


# ----------------------------------------------------------------------------- splits


def _split(images: np.ndarray, labels: np.ndarray, seed: int, where: object = "",
           group_duplicates: bool = False) -> tuple:
    """Seeded 80/20 split of images [N, C, H, W] and labels [N] -> (xtr, ytr, xte, yte),
    stratified when every class is large enough. With ``group_duplicates`` (built-ins only) all
    copies of an image go to the same split; without duplicates the split is the same either way."""
    tr, te = _split_indices(labels, seed, where, images if group_duplicates else None)
    return images[tr], labels[tr], images[te], labels[te]


def _split_indices(labels: np.ndarray, seed: int, where: object = "",
                   group_images: np.ndarray | None = None) -> tuple[np.ndarray, np.ndarray]:
    """The seeded 80/20 split of ``labels`` [N] as index arrays (train, test); with
    ``group_images`` [N, ...], byte-equal images are kept in one split (see _split)."""
    from sklearn.model_selection import train_test_split

    if len(labels) < 2:
        raise DataError(f"need at least 2 images to split into train/test, got {len(labels)}: {where}")
    group, first = _duplicate_groups(group_images) if group_images is not None else (np.arange(len(labels)),) * 2
    reps = np.arange(len(first))  # one representative per group, in order of first occurrence
    try:
        tr, te = train_test_split(reps, test_size=0.2, random_state=seed, stratify=labels[first])
    except ValueError:  # a class with one member, or more classes than test images
        tr, te = train_test_split(reps, test_size=0.2, random_state=seed)
    return _group_members(group, tr), _group_members(group, te)


def _duplicate_groups(images: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Images [N, ...] -> (group [N]: index of each image's group, first [G]: the image index that
    opens each group), groups numbered in order of first occurrence; byte-equal images share one."""
    rows, opened = _as_rows(images), {}
    group = np.array([opened.setdefault(row.tobytes(), len(opened)) for row in rows], np.int64)
    first = np.unique(group, return_index=True)[1]
    return group, first


def _group_members(group: np.ndarray, chosen: np.ndarray) -> np.ndarray:
    """Image indices [n] of the chosen groups [g], group by group in the order given."""
    members = [np.flatnonzero(group == g) for g in chosen]
    return np.concatenate(members) if members else np.zeros(0, np.int64)


def _make_shapes(seed: int, n_train: int = 400, n_test: int = 150) -> tuple:
    """Seed 001's plus/circle task with continuous centres -> (xtr [400, 1, 16, 16], ytr [400],
    xte [150, 1, 16, 16], yte [150]); values in [0, 1], labels 0 plus, 1 circle.

    The lesson drew integer centres, so 128 images exist and its test set repeated training images
    (140 of 150 at seed 0). Centres are drawn in [3.5, 11.5) instead and test draws equal to a
    training image are redrawn, so train and test come from one distribution and share no image.
    Not chosen: the lesson probe's clipped Gaussian noise (sigma 0.2), which would make the task
    denoising and leave the all-zero background patches that keep shapes outside D_norm to chance."""
    rng = np.random.default_rng(6 + seed)
    xtr, ytr = _draw_shapes(rng, n_train)
    seen = {_digest(row) for row in _as_rows(xtr)}
    xs, ys, kept = [], [], 0
    while kept < n_test:  # one round in practice: continuous centres almost never collide
        x, y = _draw_shapes(rng, n_test)
        new = np.array([_digest(row) not in seen for row in _as_rows(x)])
        xs.append(x[new]), ys.append(y[new])
        kept += int(new.sum())
    return xtr, ytr, np.concatenate(xs)[:n_test], np.concatenate(ys)[:n_test]


def _draw_shapes(rng: np.random.Generator, n: int) -> tuple[np.ndarray, np.ndarray]:
    """n draws -> images float32 [n, 1, 16, 16] and labels int64 [n] (0 plus, 1 circle)."""
    labels = rng.integers(0, 2, n).astype(np.int64)
    # the lesson's integer centres 4..11, each spread over its pixel: the shape stays inside 16x16
    cx, cy = rng.uniform(3.5, 11.5, (2, n))
    return _render_shapes(labels, cx, cy), labels


def _render_shapes(labels: np.ndarray, cx: np.ndarray, cy: np.ndarray) -> np.ndarray:
    """Labels [n] (0 plus, 1 circle) centred at pixel coordinates (cx, cy) [n] -> anti-aliased
    images float32 [n, 1, 16, 16] in [0, 1]; the background stays exactly 0."""
    yy, xx = np.mgrid[0:16, 0:16]  # pixel centres
    dx, dy = xx - cx[:, None, None], yy - cy[:, None, None]  # [n, 16, 16]
    plus = _plus_coverage(dx, dy)
    # ramp from 1 to 0 over one pixel around radius 3; thresholded at 0.5 it is the lesson's
    # circle (dx² + dy² <= 9) when the centre is an integer
    circle = np.clip(3.5 - np.hypot(dx, dy), 0.0, 1.0)
    images = np.where(np.asarray(labels)[:, None, None] == 1, circle, plus)
    return images[:, None].astype(np.float32)


def _plus_coverage(dx: np.ndarray, dy: np.ndarray) -> np.ndarray:
    """Exact area of each pixel covered by the lesson's plus (a 7x3 and a 3x7 bar) centred at
    offset (dx, dy) [n, 16, 16]; with integer offsets it is the lesson's binary plus."""
    def cover(half: float, d: np.ndarray) -> np.ndarray:  # 1-D overlap of a pixel and [-half, half]
        return np.clip(half + 0.5 - np.abs(d), 0.0, 1.0)

    horizontal = cover(3.5, dx) * cover(1.5, dy)
    vertical = cover(1.5, dx) * cover(3.5, dy)
    return horizontal + vertical - cover(1.5, dx) * cover(1.5, dy)  # the centre square once


def _photo_crops(seed: int, per_photo: int = 320) -> tuple[tuple, tuple[str, ...], list[dict]]:
    """The photos dataset as float32 ((xtr [9·256, 3, 32, 32], ytr, xte [9·64, 3, 32, 32], yte),
    names, layout): :func:`_photo_bytes` through the byte table, the values training sees."""
    (xtr, ytr, xte, yte), names, layout = _photo_bytes(seed, per_photo)
    return (BYTE_VALUES[xtr], ytr, BYTE_VALUES[xte], yte), names, layout


def _photo_bytes(seed: int, per_photo: int = 320) -> tuple[tuple, tuple[str, ...], list[dict]]:
    """32x32 RGB crops of the bundled photos, label = source photo -> ((xtr uint8 [9·256, 3, 32,
    32], ytr, xte uint8 [9·64, 3, 32, 32], yte), names, layout), splits shuffled by the seed;
    layout holds, per photo, the crops' top-left corners ``{"train": [n, 2], "test": [m, 2],
    "test_mask": [H, W]}`` (y, x), so tests can check the regions are disjoint.

    A fifth of each photo (5 of its 5x5 grid blocks, chosen by the seed) holds the test crops;
    training crops lie wholly outside it. Random 80/20 splitting of overlapping crops put 89% of
    test crops on pixels a training crop of the same photo had shown."""
    rng = np.random.default_rng(seed)
    photos = _load_photos()
    train: list[np.ndarray] = []  # per photo: uint8 [256, 32, 32, 3]
    test: list[np.ndarray] = []  # per photo: uint8 [64, 32, 32, 3]
    layout = []
    for name, photo in photos.items():
        xtr, xte, where = _split_photo(photo, rng, per_photo, name)
        train.append(xtr), test.append(xte), layout.append(where)
    return (*_stack_shuffled(train, rng), *_stack_shuffled(test, rng)), tuple(photos), layout


def _split_photo(photo: np.ndarray, rng: np.random.Generator, per_photo: int,
                 name: str) -> tuple[np.ndarray, np.ndarray, dict]:
    """One photo uint8 [H, W, 3] -> train crops [0.8n, 32, 32, 3], test crops [0.2n, 32, 32, 3]
    (n = per_photo, the 80/20 split of before) and their layout (see _photo_crops)."""
    n_test = per_photo // 5
    test_mask = _held_out_blocks(photo.shape[:2], rng)
    outside, inside = _window_corners(test_mask, inside=False), _window_corners(test_mask, inside=True)
    xtr, ctr = _sample_crops(photo, outside, per_photo - n_test, rng, name)
    # disjoint pixels are not quite enough: flat crops of retina's dark rim repeat byte for byte
    seen = {_digest(row) for row in _as_rows(xtr)}
    xte, cte = _sample_crops(photo, inside, n_test, rng, name, forbidden=seen)
    return xtr, xte, {"train": ctr, "test": cte, "test_mask": test_mask}


def _stack_shuffled(crops: list[np.ndarray], rng: np.random.Generator) -> tuple[np.ndarray, np.ndarray]:
    """Per-photo crops uint8 [n_k, 32, 32, 3] -> images uint8 [N, 3, 32, 32] and labels int64
    [N] (label k = photo k), shuffled so that a limit (test_limit=200) still takes every photo."""
    labels = np.concatenate([np.full(len(c), k, np.int64) for k, c in enumerate(crops)])
    order = rng.permutation(len(labels))
    return np.ascontiguousarray(np.concatenate(crops).transpose(0, 3, 1, 2)[order]), labels[order]


def _load_photos() -> dict[str, np.ndarray]:
    """Colour photos shipped inside the wheels (no network) -> name: uint8 [H, W, 3]."""
    import skimage.data
    from sklearn.datasets import load_sample_images

    photos = {name: getattr(skimage.data, name)() for name in _SKIMAGE_PHOTOS}
    photos.update(zip(("china", "flower"), load_sample_images().images))
    return photos


def _held_out_blocks(hw: tuple[int, int], rng: np.random.Generator, grid: int = 5,
                     held_out: int = 5) -> np.ndarray:
    """Bool mask [H, W], True on ``held_out`` of the ``grid x grid`` blocks chosen by rng. Blocks
    scattered over the photo, not one band, so the test crops see the same kinds of content."""
    rows = np.linspace(0, hw[0], grid + 1).astype(int)
    cols = np.linspace(0, hw[1], grid + 1).astype(int)
    mask = np.zeros(hw, bool)
    for block in rng.choice(grid * grid, held_out, replace=False):
        r, c = divmod(int(block), grid)
        mask[rows[r]:rows[r + 1], cols[c]:cols[c + 1]] = True
    return mask


def _window_corners(mask: np.ndarray, inside: bool, size: int = 32) -> np.ndarray:
    """Top-left corners [K, 2] (y, x) of the size x size windows lying wholly inside the True
    region of mask [H, W] (inside=True) or wholly outside it (inside=False)."""
    s = np.pad(mask.cumsum(0).cumsum(1), ((1, 0), (1, 0)))  # summed-area table [H+1, W+1]
    covered = s[size:, size:] - s[:-size, size:] - s[size:, :-size] + s[:-size, :-size]
    return np.argwhere(covered == (size * size if inside else 0))


def _sample_crops(photo: np.ndarray, corners: np.ndarray, n: int, rng: np.random.Generator,
                  name: str, forbidden: set[bytes] = frozenset()) -> tuple[np.ndarray, np.ndarray]:
    """n random crops uint8 [n, 32, 32, 3] at the given corners [K, 2], and their corners [n, 2].
    Only crops whose every aligned 2x2x3 block is non-constant are kept, so every even-sized patch
    has positive std (photos lie in D_norm), and none whose _digest is in ``forbidden``."""
    kept, at = [], []
    for _ in range(50):  # acceptance is >= 40% in every region tried; 50 rounds never run out
        pick = corners[rng.integers(0, len(corners), n)]
        cand = np.stack([photo[y:y + 32, x:x + 32] for y, x in pick])
        blocks = cand.reshape(-1, 16, 2, 16, 2, 3)
        ok = (blocks.max(axis=(2, 4, 5)) > blocks.min(axis=(2, 4, 5))).all(axis=(1, 2))
        ok &= np.array([_digest(row) not in forbidden for row in _as_rows(cand)])
        kept.extend(cand[ok]), at.extend(pick[ok])
        if len(kept) >= n:
            return np.stack(kept[:n]), np.stack(at[:n])
    raise DataError(f"photo {name!r} yields too few non-constant 32x32 crops")


# ------------------------------------------------------------------- a trial's data


@dataclass(frozen=True)
class PatchData:
    """A dataset on the trial's patch grid. The images stay as stored (:class:`ImageStore`:
    uint8 where the data are bytes, on disk above the RAM ceiling); pretraining converts them a
    batch at a time, and ``train_patches``/``test_patches`` (float32 ``[N,M,q]``, what the
    evaluation reads) are made on first read and kept. ``pretrain_images`` are the images the
    training loop samples when they are not the labelled training split (STL-10's unlabelled
    set)."""

    train_images: ImageStore
    train_labels: torch.Tensor
    test_images: ImageStore
    test_labels: torch.Tensor
    image_shape: tuple[int, int, int]
    patch_size: int
    # test images byte-equal to a training image, among the images used (logged every trial)
    train_test_duplicates: int = 0
    pretrain_images: ImageStore | None = None

    @functools.cached_property  # a frozen dataclass still has the __dict__ this writes to
    def train_patches(self) -> torch.Tensor:
        """The labelled training split as float32 patches [N,M,q]."""
        return patchify(self.train_images.floats(), self.patch_size)

    @functools.cached_property
    def test_patches(self) -> torch.Tensor:
        """The test split as float32 patches [N,M,q]."""
        return patchify(self.test_images.floats(), self.patch_size)

    @property
    def pretraining(self) -> ImageStore:
        """The images ``I_t`` is drawn from."""
        return self.pretrain_images if self.pretrain_images is not None else self.train_images


def prepare_data(config) -> PatchData:
    """Load and limit the dataset of ``config`` (a :class:`~mae_core.config.Config`; not imported
    here, as the config imports this module), the images as stored, nothing converted yet; refuse
    ``target=norm`` outside ``D_norm`` (checked a chunk at a time)."""
    dataset = load_dataset(config.dataset, seed=config.data_seed, ram_mb=config.data_ram_mb)
    p = config.resolved_patch_size
    limit = slice(None, config.train_limit)
    train_images, test_images = dataset.train[limit], dataset.test[: config.test_limit]
    pretrain_images = dataset.unlabelled[limit] if dataset.unlabelled is not None else None
    also = [pretrain_images] if pretrain_images is not None else []
    duplicates = dataset.train_test_duplicates
    if duplicates and (config.train_limit is not None or config.test_limit is not None):
        duplicates = count_split_duplicates(train_images, test_images, also=also)  # among the images kept
    if _reads_labels(config):  # one class: a perfect, meaningless probe accuracy
        cut = config.train_limit is not None and config.train_limit < len(dataset.train_labels)
        kept = f" (its first {config.train_limit} images, train_limit)" if cut else ""
        require_two_classes(dataset.train_labels[limit], f"the training split{kept} of dataset={config.dataset}")
    for images, split in ((train_images, "training set"), (pretrain_images, "unlabelled set"),
                          (test_images, "test set")):
        if images is not None:
            require_target_domain(images, p, config.target, what=f"the {split} of dataset={config.dataset}")
    return PatchData(
        train_images=train_images, train_labels=dataset.train_labels[: config.train_limit],
        test_images=test_images, test_labels=dataset.test_labels[: config.test_limit],
        image_shape=dataset.image_shape, patch_size=p, train_test_duplicates=duplicates,
        pretrain_images=pretrain_images,
    )


def require_target_domain(images: ImageStore, patch_size: int, kind: str, what: str) -> None:
    """The target's domain check (``norm``: every patch in ``D_norm``) over a store, read a
    chunk at a time; a target without one accepts any images."""
    check = registry.targets.get(kind).domain_check
    if check is not None:
        check((patchify(torch.from_numpy(images.to_float(stored)), patch_size) for _, stored in images.chunks()), what)

