"""Datasets for the MAE studies: built-ins that need no download, and loaders for local files.

A dataset is named by a spec string: a built-in (``digits``, ``shapes``, ``photos``) or
``kind:PATH`` with kind in ``cifar10 | folder | npz``. Everything is loaded lazily and cached per
(spec, seed); images are float32 ``[N, C, H, W]``, labels int64 ``[N]``.

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

File datasets (``cifar10``, ``folder``, ``npz``) are kept as the user made them: test images that
equal a training image are counted (``train_test_duplicates``) and reported with a
``DuplicateSplitWarning``, never dropped.
"""

from __future__ import annotations

import functools
import hashlib
import io
import pickle
import warnings
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import torch

from .errors import UserError

BUILTIN_DATASETS: tuple[str, ...] = ("digits", "shapes", "photos")
FILE_DATASETS: tuple[str, ...] = ("cifar10", "folder", "npz")
# Patch sizes for datasets whose image size is fixed; folder/npz depend on the file: default_patch_size.
DEFAULT_PATCH_SIZE: dict[str, int] = {"digits": 2, "shapes": 4, "photos": 4, "cifar10": 4}
ALLOWED_FORMS = "digits | shapes | photos | cifar10:PATH | folder:PATH | npz:PATH"

_BUILTIN_SHAPES = {"digits": (1, 8, 8), "shapes": (1, 16, 16), "photos": (3, 32, 32)}
# Colour photos shipped inside the wheels (no network): skimage first, then sklearn's two samples.
_SKIMAGE_PHOTOS = ("astronaut", "chelsea", "coffee", "rocket", "hubble_deep_field",
                   "immunohistochemistry", "retina")
_CIFAR10_NAMES = ("airplane", "automobile", "bird", "cat", "deer",
                  "dog", "frog", "horse", "ship", "truck")
_IMAGE_SUFFIXES = {".png", ".jpg", ".jpeg"}


class DataError(UserError):
    """A dataset spec or file is unusable; the message is one line naming the path or key."""


class DuplicateSplitWarning(UserWarning):
    """A file dataset's test split holds images byte-equal to training images (kept, not dropped)."""


@dataclass(frozen=True, eq=False)  # eq=False: comparing tensors field-wise is ambiguous
class Dataset:
    """Train/test images float32 ``[N, C, H, W]`` and labels int64 ``[N]``; shared via a cache, so
    treat the tensors as read-only."""

    name: str
    train_images: torch.Tensor
    train_labels: torch.Tensor
    test_images: torch.Tensor
    test_labels: torch.Tensor
    class_names: tuple[str, ...]
    # Test images byte-equal to some training image (count_split_duplicates); 0 for built-ins.
    train_test_duplicates: int = 0

    @property
    def image_shape(self) -> tuple[int, int, int]:
        """(C, H, W) of every image."""
        c, h, w = self.train_images.shape[1:]
        return (int(c), int(h), int(w))

    @property
    def num_classes(self) -> int:
        return len(self.class_names)


def _parse(spec: str) -> tuple[str, Path | None]:
    """Split a spec into (kind, path); path is None for built-ins. Raises DataError."""
    if not isinstance(spec, str):
        raise DataError(f"dataset spec must be a string, got {type(spec).__name__}; allowed: {ALLOWED_FORMS}")
    if spec in BUILTIN_DATASETS:
        return spec, None
    kind, sep, path = spec.partition(":")
    if not sep or kind not in FILE_DATASETS:
        raise DataError(f"unknown dataset {spec!r}; allowed: {ALLOWED_FORMS}")
    if not path:
        raise DataError(f"dataset {spec!r} has an empty PATH; allowed: {ALLOWED_FORMS}")
    p = Path(path).expanduser()
    if not p.exists():
        raise DataError(f"dataset path does not exist: {p} (from {spec!r})")
    return kind, p


def validate_dataset_name(spec: str) -> str:
    """Cheap check before loading: returns ``spec`` unchanged if it is a built-in or ``kind:PATH``
    with a known kind and an existing PATH; otherwise raises DataError."""
    _parse(spec)
    return spec


def dataset_image_shape(spec: str) -> tuple[int, int, int]:
    """(C, H, W) of the dataset's images; built-ins without loading, file datasets by loading."""
    kind, _ = _parse(spec)
    if kind in _BUILTIN_SHAPES:
        return _BUILTIN_SHAPES[kind]
    return load_dataset(spec).image_shape


def default_patch_size(spec: str) -> int:
    """Patch size p for the dataset: fixed for built-ins and cifar10; for folder/npz, 4 if H and W
    are divisible by 4 and at least 8, else 2 if both are even, else 1."""
    kind, _ = _parse(spec)
    if kind in DEFAULT_PATCH_SIZE:
        return DEFAULT_PATCH_SIZE[kind]
    _, h, w = dataset_image_shape(spec)
    if h % 4 == 0 and w % 4 == 0 and min(h, w) >= 8:
        return 4
    return 2 if h % 2 == 0 and w % 2 == 0 else 1


def load_dataset(spec: str, *, seed: int = 0) -> Dataset:
    """Load (cached) a dataset: images float32 [N, C, H, W], labels int64 [N]; seed fixes the split
    (and the generated images for shapes/photos)."""
    _, path = _parse(spec)
    # The path's mtime is part of the cache key so a rewritten npz (or a folder gaining or losing
    # entries) is reloaded instead of served stale.
    stamp = path.stat().st_mtime_ns if path is not None else 0
    return _load_cached(spec, int(seed), stamp)


@functools.lru_cache(maxsize=8)
def _load_cached(spec: str, seed: int, _stamp: int) -> Dataset:
    kind, path = _parse(spec)
    if kind == "digits":
        from sklearn.datasets import load_digits

        d = load_digits()
        images = (d.images / 16.0).astype(np.float32)[:, None]
        arrays = _split(images, d.target, seed, group_duplicates=True)
        names = tuple(str(i) for i in range(10))
    elif kind == "shapes":
        arrays = _make_shapes(seed)
        names = ("plus", "circle")
    elif kind == "photos":
        arrays, names = _make_photos(seed)
    elif kind == "cifar10":
        arrays, names = _load_cifar10(path)
    elif kind == "folder":
        images, labels, names = _load_folder(path)
        arrays = _split(images, labels, seed, where=path)
    else:
        arrays, names = _load_npz(path, seed)
    xtr, ytr, xte, yte = (torch.from_numpy(np.ascontiguousarray(a)) for a in arrays)
    xtr, xte = xtr.float(), xte.float()
    duplicates = count_split_duplicates(xtr, xte)  # on the float32 tensors the studies see
    if duplicates and path is None:  # a built-in must never leak: a bug, not a user error
        raise RuntimeError(f"built-in dataset {spec!r} (seed {seed}) has {duplicates} test images "
                           f"equal to training images")
    if duplicates:
        # stacklevel 3: _load_cached <- load_dataset <- the caller
        warnings.warn(f"dataset {spec!r}: {duplicates} of {len(xte)} test images are byte-equal to a "
                      f"training image (kept; test scores may be optimistic)",
                      DuplicateSplitWarning, stacklevel=3)
    return Dataset(spec, xtr, ytr.long(), xte, yte.long(), tuple(names), duplicates)


def count_split_duplicates(train_images: torch.Tensor | np.ndarray,
                           test_images: torch.Tensor | np.ndarray) -> int:
    """How many test images ``[N_test, ...]`` are byte-equal to some training image
    ``[N_train, ...]`` (same dtype expected; -0.0 and 0.0 differ). Hashes each image's raw bytes,
    then confirms every hash hit byte for byte, so the count is exact."""
    train, test = _as_rows(train_images), _as_rows(test_images)
    if train.shape[1:] != test.shape[1:] or train.dtype != test.dtype:
        return 0  # different shapes or dtypes: no two images can have the same bytes
    seen = {_digest(row): i for i, row in enumerate(train)}
    return sum(1 for row in test
               if (i := seen.get(_digest(row))) is not None and row.tobytes() == train[i].tobytes())


def _as_rows(images: torch.Tensor | np.ndarray) -> np.ndarray:
    """Images [N, ...] -> contiguous numpy [N, D], one row of raw values per image."""
    a = images.numpy() if isinstance(images, torch.Tensor) else np.asarray(images)
    return np.ascontiguousarray(a.reshape(len(a), int(np.prod(a.shape[1:]))))  # -1 fails when N = 0


def _digest(row: np.ndarray) -> bytes:
    # 16-byte BLAKE2b keys: a set of them stays small even for CIFAR's 50,000 x 12 KB images.
    return hashlib.blake2b(row.data, digest_size=16).digest()


def _split(images: np.ndarray, labels: np.ndarray, seed: int, where: object = "",
           group_duplicates: bool = False) -> tuple:
    """Seeded 80/20 split of images [N, C, H, W] and labels [N] -> (xtr, ytr, xte, yte),
    stratified when every class is large enough. With ``group_duplicates`` (built-ins only) all
    copies of an image go to the same split; without duplicates the split is the same either way."""
    from sklearn.model_selection import train_test_split

    if len(images) < 2:
        raise DataError(f"need at least 2 images to split into train/test, got {len(images)}: {where}")
    group, first = _duplicate_groups(images) if group_duplicates else (np.arange(len(images)),) * 2
    reps = np.arange(len(first))  # one representative per group, in order of first occurrence
    try:
        tr, te = train_test_split(reps, test_size=0.2, random_state=seed, stratify=labels[first])
    except ValueError:  # a class with one member, or more classes than test images
        tr, te = train_test_split(reps, test_size=0.2, random_state=seed)
    tr, te = _group_members(group, tr), _group_members(group, te)
    return images[tr], labels[tr], images[te], labels[te]


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


def _make_photos(seed: int, per_photo: int = 320) -> tuple[tuple, tuple[str, ...]]:
    """32x32 RGB crops of the bundled photos, label = source photo -> ((xtr [9·256, 3, 32, 32],
    ytr, xte [9·64, 3, 32, 32], yte), names); splits shuffled by the seed. See _photo_crops."""
    arrays, names, _ = _photo_crops(seed, per_photo)
    return arrays, names


def _photo_crops(seed: int, per_photo: int = 320) -> tuple[tuple, tuple[str, ...], list[dict]]:
    """The photos dataset plus, per photo, the crops' top-left corners ``{"train": [n, 2],
    "test": [m, 2], "test_mask": [H, W]}`` (y, x), so tests can check the regions are disjoint.

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
    """Per-photo crops uint8 [n_k, 32, 32, 3] -> images float32 [N, 3, 32, 32] and labels int64
    [N] (label k = photo k), shuffled so that a limit (test_limit=200) still takes every photo."""
    labels = np.concatenate([np.full(len(c), k, np.int64) for k, c in enumerate(crops)])
    order = rng.permutation(len(labels))
    images = np.concatenate(crops).transpose(0, 3, 1, 2)[order] / np.float32(255)
    return images.astype(np.float32), labels[order]


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


class _NumpyOnlyUnpickler(pickle.Unpickler):
    """CIFAR batches are pickles: allow only the globals needed to rebuild numpy arrays."""

    _ALLOWED = {("numpy.core.multiarray", "_reconstruct"), ("numpy._core.multiarray", "_reconstruct"),
                ("numpy", "ndarray"), ("numpy", "dtype"), ("_codecs", "encode")}

    def find_class(self, module: str, name: str):  # noqa: ANN201 - pickle's own signature
        if (module, name) not in self._ALLOWED:
            raise pickle.UnpicklingError(f"global {module}.{name} is not allowed")
        return super().find_class(module, name)


def _unpickle(file: Path) -> dict:
    try:
        obj = _NumpyOnlyUnpickler(io.BytesIO(file.read_bytes()), encoding="bytes").load()
    except Exception as exc:  # any corruption is reported the same way, naming the file
        raise DataError(f"cannot unpickle CIFAR batch {file}: {exc}") from exc
    if not isinstance(obj, dict):
        raise DataError(f"CIFAR batch {file} is a {type(obj).__name__}, expected a dict")
    return obj


def _cifar_batch(file: Path) -> tuple[np.ndarray, np.ndarray]:
    """One batch file -> images uint8 [n, 3, 32, 32], labels [n]."""
    batch = _unpickle(file)
    for key in (b"data", b"labels"):
        if key not in batch:
            raise DataError(f"CIFAR batch {file} has no key {key!r}")
    data, labels = batch[b"data"], np.asarray(batch[b"labels"])
    if not isinstance(data, np.ndarray) or data.dtype != np.uint8 or data.ndim != 2 \
            or data.shape[1] != 3072:
        raise DataError(f"CIFAR batch {file}: b'data' must be uint8 [n, 3072], got "
                        f"{getattr(data, 'dtype', type(data).__name__)} {getattr(data, 'shape', '')}")
    if labels.ndim != 1 or len(labels) != len(data) or not np.issubdtype(labels.dtype, np.integer):
        raise DataError(f"CIFAR batch {file}: b'labels' must be {len(data)} integers, got "
                        f"{labels.dtype} {labels.shape}")
    return data.reshape(-1, 3, 32, 32), labels


def _load_cifar10(root: Path) -> tuple[tuple, tuple[str, ...]]:
    """CIFAR-10 python batches: data_batch_1..5 (any, at least one) and test_batch (required)."""
    if not root.is_dir():
        raise DataError(f"cifar10 path must be a folder of python batches: {root}")
    train_files = [root / f"data_batch_{i}" for i in range(1, 6) if (root / f"data_batch_{i}").exists()]
    if not train_files:
        raise DataError(f"no CIFAR training batch (data_batch_1..5) in {root}")
    if not (root / "test_batch").exists():
        raise DataError(f"missing CIFAR test batch: {root / 'test_batch'}")
    train = [_cifar_batch(f) for f in train_files]
    xte, yte = _cifar_batch(root / "test_batch")
    xtr, ytr = np.concatenate([b[0] for b in train]), np.concatenate([b[1] for b in train])
    names = _CIFAR10_NAMES
    if (root / "batches.meta").exists():
        meta = _unpickle(root / "batches.meta")
        if b"label_names" not in meta:
            raise DataError(f"CIFAR meta {root / 'batches.meta'} has no key b'label_names'")
        names = tuple(n.decode() if isinstance(n, bytes) else str(n) for n in meta[b"label_names"])
    _check_labels(np.concatenate([ytr, yte]), len(names), root)
    return (xtr / np.float32(255), ytr, xte / np.float32(255), yte), names


def _load_folder(root: Path) -> tuple[np.ndarray, np.ndarray, tuple[str, ...]]:
    """Class sub-folders of PNG/JPEG images -> images float32 [N, C, H, W] (C=3 if any image is
    colour, else 1), labels = index of the (sorted) class folder among those holding images."""
    from PIL import Image

    if not root.is_dir():
        raise DataError(f"folder dataset path must be a folder of class folders: {root}")
    classes: list[tuple[str, list[Path]]] = []
    for sub in sorted(p for p in root.iterdir() if p.is_dir() and not p.name.startswith(".")):
        files = sorted(f for f in sub.iterdir() if f.suffix.lower() in _IMAGE_SUFFIXES)
        if files:
            classes.append((sub.name, files))
    if not classes:
        raise DataError(f"empty dataset: no PNG/JPEG images in class sub-folders of {root}")
    images, labels, size = [], [], None
    for label, (_, files) in enumerate(classes):
        for f in files:
            try:
                with Image.open(f) as im:
                    im.load()
                    img = im.copy()
            except OSError as exc:
                raise DataError(f"cannot read image {f}: {exc}") from exc
            size = size or img.size
            if img.size != size:
                raise DataError(f"image {f} is {img.size[0]}x{img.size[1]}, expected {size[0]}x{size[1]} "
                                f"like the first image (all images must have the same size)")
            images.append(img)
            labels.append(label)
    colour = any(img.mode not in ("1", "L", "LA") for img in images)
    arrays = [np.asarray(img.convert("RGB" if colour else "L")) for img in images]
    x = np.stack(arrays)
    x = x.transpose(0, 3, 1, 2) if colour else x[:, None]
    return (x / np.float32(255)), np.asarray(labels, np.int64), tuple(name for name, _ in classes)


def _load_npz(path: Path, seed: int) -> tuple[tuple, tuple[str, ...]]:
    """``images`` + ``labels`` (+ optional ``test_images``/``test_labels``, ``class_names``)."""
    try:
        with np.load(path, allow_pickle=False) as z:
            arrays = {k: z[k] for k in z.files}
    except Exception as exc:  # not a zip, pickled objects, truncated file ...
        raise DataError(f"cannot read npz {path}: {exc}") from exc
    for key in ("images", "labels"):
        if key not in arrays:
            raise DataError(f"npz {path} has no key {key!r} (keys: {sorted(arrays)})")
    if ("test_images" in arrays) != ("test_labels" in arrays):
        missing = "test_labels" if "test_images" in arrays else "test_images"
        raise DataError(f"npz {path} has no key {missing!r}: test_images and test_labels go together")
    x, y = _npz_images(arrays["images"], path, "images"), _npz_labels(arrays["labels"], path, "labels")
    if len(x) != len(y):
        raise DataError(f"npz {path}: 'labels' has {len(y)} entries but 'images' has {len(x)}")
    if "test_images" in arrays:
        xte = _npz_images(arrays["test_images"], path, "test_images")
        yte = _npz_labels(arrays["test_labels"], path, "test_labels")
        if len(xte) != len(yte):
            raise DataError(f"npz {path}: 'test_labels' has {len(yte)} entries but 'test_images' has {len(xte)}")
        if xte.shape[1:] != x.shape[1:]:
            raise DataError(f"npz {path}: 'test_images' are {xte.shape[1:]} but 'images' are {x.shape[1:]}")
        split = (x, y, xte, yte)
    else:
        split = _split(x, y, seed, where=path)
    all_labels = np.concatenate([split[1], split[3]])
    if "class_names" in arrays:
        names = tuple(str(n) for n in np.atleast_1d(arrays["class_names"]))
    else:
        names = tuple(str(i) for i in range(int(all_labels.max()) + 1))
    _check_labels(all_labels, len(names), path)
    return split, names


def _npz_images(a: np.ndarray, path: Path, key: str) -> np.ndarray:
    """[N,H,W] | [N,C,H,W] | [N,H,W,C] (C in {1,3}) of uint8 or float -> float32 [N, C, H, W]."""
    if a.ndim == 3:
        a = a[:, None]
    elif a.ndim == 4:
        if a.shape[-1] in (1, 3) and a.shape[1] not in (1, 3):
            a = a.transpose(0, 3, 1, 2)  # channel-last
        elif a.shape[1] not in (1, 3):
            raise DataError(f"npz {path}: {key!r} has shape {a.shape}; channels (dim 1 or last) must be 1 or 3")
    else:
        raise DataError(f"npz {path}: {key!r} has shape {a.shape}; allowed [N,H,W], [N,C,H,W], [N,H,W,C]")
    if a.shape[0] == 0:
        raise DataError(f"empty dataset: npz {path} key {key!r} holds no images")
    if a.dtype == np.uint8:
        return a / np.float32(255)
    if not np.issubdtype(a.dtype, np.floating):
        raise DataError(f"npz {path}: {key!r} has dtype {a.dtype}; allowed uint8 (scaled by 1/255) or float")
    bad = int((~np.isfinite(a)).sum())
    if bad:
        raise DataError(f"npz {path}: {key!r} has {bad} non-finite pixel values (NaN/inf)")
    return a.astype(np.float32)


def _npz_labels(a: np.ndarray, path: Path, key: str) -> np.ndarray:
    if a.ndim != 1 or not np.issubdtype(a.dtype, np.integer):
        raise DataError(f"npz {path}: {key!r} must be 1-D integers, got {a.dtype} {a.shape}")
    return a.astype(np.int64)


def _check_labels(labels: np.ndarray, num_classes: int, where: Path) -> None:
    if len(labels) and (labels.min() < 0 or labels.max() >= num_classes):
        raise DataError(f"labels in {where} must lie in [0, {num_classes}), got "
                        f"[{labels.min()}, {labels.max()}]")
