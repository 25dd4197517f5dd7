"""Datasets for the MAE studies: built-ins that need no download, and loaders for local files.

A dataset is named by a spec string: a built-in (``digits``, ``shapes``, ``photos``) or
``kind:PATH`` with kind in ``cifar10 | folder | npz``. Everything is loaded lazily and cached per
(spec, seed); images are float32 ``[N, C, H, W]``, labels int64 ``[N]``.
"""

from __future__ import annotations

import functools
import io
import pickle
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import torch

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


class DataError(ValueError):
    """A dataset spec or file is unusable; the message is one line naming the path or key."""


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
        arrays = _split(images, d.target, seed)
        names = tuple(str(i) for i in range(10))
    elif kind == "shapes":
        rng = np.random.default_rng(6 + seed)
        arrays = (*_make_shapes(rng, 400), *_make_shapes(rng, 150))  # same rng: the lesson's recipe
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
    return Dataset(spec, xtr.float(), ytr.long(), xte.float(), yte.long(), tuple(names))


def _split(images: np.ndarray, labels: np.ndarray, seed: int, where: object = "") -> tuple:
    """Seeded 80/20 split, stratified when every class is large enough."""
    from sklearn.model_selection import train_test_split

    if len(images) < 2:
        raise DataError(f"need at least 2 images to split into train/test, got {len(images)}: {where}")
    try:
        xtr, xte, ytr, yte = train_test_split(images, labels, test_size=0.2, random_state=seed,
                                              stratify=labels)
    except ValueError:  # a class with one member, or more classes than test images
        xtr, xte, ytr, yte = train_test_split(images, labels, test_size=0.2, random_state=seed)
    return xtr, ytr, xte, yte


def _make_shapes(rng: np.random.Generator, n: int) -> tuple[np.ndarray, np.ndarray]:
    """n plus/circle images [n, 1, 16, 16] in {0, 1} and labels (0 plus, 1 circle)."""
    yy, xx = np.mgrid[0:16, 0:16]
    images = np.zeros((n, 1, 16, 16), np.float32)
    labels = np.zeros(n, np.int64)
    for i in range(n):
        shape = rng.choice(["plus", "circle"])
        cx, cy = rng.integers(4, 12), rng.integers(4, 12)
        img = images[i, 0]
        if shape == "plus":
            img[cy - 1:cy + 2, cx - 3:cx + 4] = 1
            img[cy - 3:cy + 4, cx - 1:cx + 2] = 1
        else:
            img[(xx - cx) ** 2 + (yy - cy) ** 2 <= 9] = 1
            labels[i] = 1
    return images, labels


def _make_photos(seed: int, per_photo: int = 320) -> tuple[tuple, tuple[str, ...]]:
    """Random 32x32 RGB crops of the bundled photos, label = source photo. Only crops whose every
    aligned 2x2x3 block is non-constant are kept, so every even-sized patch has positive std."""
    import skimage.data
    from numpy.lib.stride_tricks import sliding_window_view
    from sklearn.datasets import load_sample_images

    photos = {name: getattr(skimage.data, name)() for name in _SKIMAGE_PHOTOS}
    photos.update(zip(("china", "flower"), load_sample_images().images))
    rng = np.random.default_rng(seed)
    crops, labels = [], []
    for label, (name, photo) in enumerate(photos.items()):
        windows = sliding_window_view(photo, (32, 32, 3))[:, :, 0]  # view [H-31, W-31, 32, 32, 3]
        kept: list[np.ndarray] = []
        for _ in range(50):  # acceptance is >= 75% for every photo; 50 rounds never run out
            ys = rng.integers(0, windows.shape[0], per_photo)
            xs = rng.integers(0, windows.shape[1], per_photo)
            cand = windows[ys, xs]
            blocks = cand.reshape(-1, 16, 2, 16, 2, 3)
            ok = (blocks.max(axis=(2, 4, 5)) > blocks.min(axis=(2, 4, 5))).all(axis=(1, 2))
            kept.extend(cand[ok])
            if len(kept) >= per_photo:
                break
        else:
            raise DataError(f"photo {name!r} yields too few non-constant 32x32 crops")
        crops.append(np.stack(kept[:per_photo]))
        labels.append(np.full(per_photo, label, np.int64))
    images = (np.concatenate(crops).transpose(0, 3, 1, 2) / 255.0).astype(np.float32)
    return _split(images, np.concatenate(labels), seed), tuple(photos)


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
