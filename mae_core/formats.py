"""Readers of array-file datasets: CIFAR-10/100 (python pickles), STL-10 (binaries), npz.

Each reader returns :class:`Splits` of :class:`~mae_core.images.ImageStore` s, uint8 where the
file holds bytes. ``ram_bytes`` is the trial's ceiling (``data_ram_mb``): a dataset whose images
fit under it is read into memory; a larger one stays on disk as memory-mapped arrays (STL-10's
binaries, an npz member stored uncompressed) and is read batch by batch. CIFAR's pickles are
always read whole (CIFAR-100: 184 MB). :func:`image_shape` reads only headers (config validation).
"""

from __future__ import annotations

import io
import pickle
import struct
import zipfile
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from .errors import UserError
from .images import BYTE_VALUES, ImageStore
from .labels import numbered_class_names, require_label_range

_CIFAR10_NAMES = ("airplane", "automobile", "bird", "cat", "deer",
                  "dog", "frog", "horse", "ship", "truck")
_STL10_NAMES = ("airplane", "bird", "car", "cat", "deer", "dog", "horse", "monkey", "ship", "truck")
STL10_SHAPE = (3, 96, 96)
CIFAR_SHAPE = (3, 32, 32)


class DataError(UserError):
    """A dataset spec or file is unusable; the message is one line naming the path or key."""


@dataclass(frozen=True)
class Splits:
    """What a reader found: a training split (or, with ``test`` None, the pool that the seeded
    80/20 split divides), a test split, labels int64, class names, and images for pretraining
    only (STL-10's unlabelled set; None elsewhere)."""

    train: ImageStore
    train_labels: np.ndarray
    test: ImageStore | None
    test_labels: np.ndarray | None
    names: tuple[str, ...]
    unlabelled: ImageStore | None = None


def check_labels(labels: np.ndarray, num_classes: int, where: Path) -> None:
    if len(labels) and (labels.min() < 0 or labels.max() >= num_classes):
        raise DataError(f"labels in {where} must lie in [0, {num_classes}), got "
                        f"[{labels.min()}, {labels.max()}]")


# ------------------------------------------------------------------------ CIFAR (pickles)


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


def _cifar_batch(file: Path, label_key: bytes = b"labels") -> tuple[np.ndarray, np.ndarray]:
    """One batch file -> images uint8 [n, 3, 32, 32], labels [n] (under ``label_key``)."""
    batch = _unpickle(file)
    for key in (b"data", label_key):
        if key not in batch:
            raise DataError(f"CIFAR batch {file} has no key {key!r}")
    data, labels = batch[b"data"], np.asarray(batch[label_key])
    if not isinstance(data, np.ndarray) or data.dtype != np.uint8 or data.ndim != 2 \
            or data.shape[1] != 3072:
        raise DataError(f"CIFAR batch {file}: b'data' must be uint8 [n, 3072], got "
                        f"{getattr(data, 'dtype', type(data).__name__)} {getattr(data, 'shape', '')}")
    if labels.ndim != 1 or len(labels) != len(data) or not np.issubdtype(labels.dtype, np.integer):
        raise DataError(f"CIFAR batch {file}: {label_key!r} must be {len(data)} integers, got "
                        f"{labels.dtype} {labels.shape}")
    return data.reshape(-1, *CIFAR_SHAPE), labels.astype(np.int64)


def _cifar_batches(files: list[Path]) -> tuple[np.ndarray, np.ndarray]:
    """Several batch files -> images uint8 [n, 3, 32, 32], labels [n]. Each batch is released
    once copied into the result, whose pages become resident only as they are written, so the
    images are held about once, not twice (a list of batches plus their concatenation)."""
    batches = [_cifar_batch(f) for f in files]
    images = np.empty((sum(len(x) for x, _ in batches), *CIFAR_SHAPE), np.uint8)
    labels, start = [], 0
    for i, (x, y) in enumerate(batches):
        images[start:start + len(x)] = x
        start += len(x)
        labels.append(y)
        batches[i] = None  # the batch's own array goes now
    return images, np.concatenate(labels)


def _names_from_meta(file: Path, key: bytes, default: tuple[str, ...]) -> tuple[str, ...]:
    if not file.exists():
        return default
    meta = _unpickle(file)
    if key not in meta:
        raise DataError(f"CIFAR meta {file} has no key {key!r}")
    return tuple(n.decode() if isinstance(n, bytes) else str(n) for n in meta[key])


def _folder(root: Path, what: str) -> Path:
    if not root.is_dir():
        raise DataError(f"{what} path must be a folder: {root}")
    return root


def load_cifar10(root: Path) -> Splits:
    """CIFAR-10 python batches: data_batch_1..5 (any, at least one) and test_batch (required);
    names from batches.meta when present."""
    _folder(root, "cifar10 (python batches)")
    train_files = [root / f"data_batch_{i}" for i in range(1, 6) if (root / f"data_batch_{i}").exists()]
    if not train_files:
        raise DataError(f"no CIFAR training batch (data_batch_1..5) in {root}")
    if not (root / "test_batch").exists():
        raise DataError(f"missing CIFAR test batch: {root / 'test_batch'}")
    xtr, ytr = _cifar_batches(train_files)
    xte, yte = _cifar_batch(root / "test_batch")
    names = _names_from_meta(root / "batches.meta", b"label_names", _CIFAR10_NAMES)
    check_labels(np.concatenate([ytr, yte]), len(names), root)
    return Splits(ImageStore(xtr, BYTE_VALUES), ytr, ImageStore(xte, BYTE_VALUES), yte, names)


def load_cifar100(root: Path, coarse: bool = False) -> Splits:
    """CIFAR-100 python files ``train`` and ``test`` (and ``meta`` for the names): the 100 fine
    labels, or with ``coarse`` the 20 superclasses."""
    _folder(root, "cifar100 (python files train, test, meta)")
    for name in ("train", "test"):
        if not (root / name).exists():
            raise DataError(f"missing CIFAR-100 file: {root / name}")
    key = b"coarse_labels" if coarse else b"fine_labels"
    (xtr, ytr), (xte, yte) = _cifar_batch(root / "train", key), _cifar_batch(root / "test", key)
    count = 20 if coarse else 100
    default = tuple(str(i) for i in range(count))
    names = _names_from_meta(root / "meta", b"coarse_label_names" if coarse else b"fine_label_names", default)
    check_labels(np.concatenate([ytr, yte]), len(names), root)
    return Splits(ImageStore(xtr, BYTE_VALUES), ytr, ImageStore(xte, BYTE_VALUES), yte, names)


# --------------------------------------------------------------------- STL-10 (binaries)


def _stl10_images(file: Path, in_memory: bool) -> ImageStore:
    """``*_X.bin``: n images of 3 x 96 x 96 bytes, each channel column-major (the format's
    README) -> a store of [n, 3, 96, 96]: a transposed view of the memory-mapped file, or read
    into a row-major array in memory."""
    size = np.prod(STL10_SHAPE)
    length = file.stat().st_size
    if length == 0 or length % size:
        raise DataError(f"STL-10 file {file} has {length} bytes, not a positive multiple of {size} "
                        f"(3 x 96 x 96 per image)")
    shape = (length // size, 3, 96, 96)
    columns = np.memmap(file, np.uint8, "r", shape=shape).transpose(0, 1, 3, 2)  # [n, C, W, H] -> [n, C, H, W]
    if not in_memory:
        return ImageStore(columns, BYTE_VALUES, on_disk=True)
    images = np.empty(columns.shape, np.uint8)  # row-major in memory, filled a slice at a time
    for start in range(0, len(images), 4096):
        images[start:start + 4096] = columns[start:start + 4096]
    return ImageStore(images, BYTE_VALUES)


def _stl10_labels(file: Path, count: int) -> np.ndarray:
    """``*_y.bin``: one byte per image, 1..10 -> int64 0..9."""
    labels = np.fromfile(file, np.uint8).astype(np.int64) - 1
    if len(labels) != count:
        raise DataError(f"STL-10 labels {file} hold {len(labels)} entries for {count} images")
    check_labels(labels, len(_STL10_NAMES), file)
    return labels


def load_stl10(root: Path, ram_bytes: int) -> Splits:
    """STL-10's binary folder: ``train_X.bin``/``train_y.bin`` (5,000 labelled), ``test_X.bin``/
    ``test_y.bin`` (8,000) and, when present, ``unlabeled_X.bin`` (100,000), which pretraining
    samples instead of the labelled training split; probes read the labelled splits."""
    _folder(root, "stl10 (binary files)")
    needed = ("train_X.bin", "train_y.bin", "test_X.bin", "test_y.bin")
    for name in needed:
        if not (root / name).exists():
            raise DataError(f"missing STL-10 file: {root / name}")
    unlabelled_file = root / "unlabeled_X.bin"
    image_files = [root / "train_X.bin", root / "test_X.bin"] + ([unlabelled_file] if unlabelled_file.exists() else [])
    in_memory = sum(f.stat().st_size for f in image_files) <= ram_bytes
    train, test = _stl10_images(root / "train_X.bin", in_memory), _stl10_images(root / "test_X.bin", in_memory)
    unlabelled = _stl10_images(unlabelled_file, in_memory) if unlabelled_file.exists() else None
    names = _STL10_NAMES
    if (root / "class_names.txt").exists():
        names = tuple(line.strip() for line in (root / "class_names.txt").read_text().splitlines() if line.strip())
    return Splits(train, _stl10_labels(root / "train_y.bin", len(train)), test,
                  _stl10_labels(root / "test_y.bin", len(test)), names, unlabelled)


# -------------------------------------------------------------------------------- npz


def npz_layout(shape: tuple[int, ...], path: Path, key: str) -> tuple[tuple[int, ...], tuple[int, int, int]]:
    """An npz image array's shape -> (axes that make it [N, C, H, W], (C, H, W)); accepts
    [N,H,W], [N,C,H,W] and [N,H,W,C] with C in {1, 3}. Raises DataError."""
    if len(shape) == 3:
        axes, chw = (0, 1, 2), (1, *shape[1:])
    elif len(shape) == 4 and shape[-1] in (1, 3) and shape[1] not in (1, 3):
        axes, chw = (0, 3, 1, 2), (shape[3], shape[1], shape[2])  # channel-last
    elif len(shape) == 4 and shape[1] in (1, 3):
        axes, chw = (0, 1, 2, 3), tuple(shape[1:])
    elif len(shape) == 4:
        raise DataError(f"npz {path}: {key!r} has shape {shape}; channels (dim 1 or last) must be 1 or 3")
    else:
        raise DataError(f"npz {path}: {key!r} has shape {shape}; allowed [N,H,W], [N,C,H,W], [N,H,W,C]")
    if shape[0] == 0:
        raise DataError(f"empty dataset: npz {path} key {key!r} holds no images")
    return axes, chw


def _read_npy_header(handle) -> tuple[tuple[int, ...], bool, np.dtype]:
    version = np.lib.format.read_magic(handle)
    if version == (1, 0):
        return np.lib.format.read_array_header_1_0(handle)
    return np.lib.format.read_array_header_2_0(handle)


def npz_header(path: Path, key: str) -> tuple[tuple[int, ...], np.dtype]:
    """(shape, dtype) of member ``key`` from its .npy header alone (a few hundred bytes, also
    of a compressed member): what config validation reads instead of the whole file."""
    try:
        with zipfile.ZipFile(path) as archive, archive.open(f"{key}.npy") as member:
            shape, _, dtype = _read_npy_header(member)
    except KeyError:
        raise DataError(f"npz {path} has no key {key!r}") from None
    except Exception as exc:  # not a zip, a damaged header ...
        raise DataError(f"cannot read npz {path}: {exc}") from exc
    return shape, dtype


def _memmap_member(path: Path, info: zipfile.ZipInfo) -> np.ndarray:
    """An uncompressed npz member as a read-only memmap: its bytes start after the zip's local
    header (30 bytes + name + extra field, read from that header) and the .npy header."""
    with open(path, "rb") as handle:
        handle.seek(info.header_offset)
        local = handle.read(30)
        if local[:4] != b"PK\x03\x04":
            raise DataError(f"cannot read npz {path}: damaged zip entry {info.filename}")
        name_length, extra_length = struct.unpack("<HH", local[26:30])
        handle.seek(info.header_offset + 30 + name_length + extra_length)
        shape, fortran, dtype = _read_npy_header(handle)
        offset = handle.tell()
    if dtype.hasobject:
        raise DataError(f"cannot read npz {path}: {info.filename} holds Python objects")
    return np.memmap(path, dtype, "r", offset=offset, shape=shape, order="F" if fortran else "C")


def _npz_arrays(path: Path, ram_bytes: int) -> tuple[dict[str, np.ndarray], bool]:
    """Every member, read into memory when their sizes add up to at most ``ram_bytes``; else
    the uncompressed ones memory-mapped (a compressed member is read whole). Also says whether
    anything is memory-mapped."""
    try:
        with zipfile.ZipFile(path) as archive:
            infos = {i.filename.removesuffix(".npy"): i for i in archive.infolist() if i.filename.endswith(".npy")}
        if sum(i.file_size for i in infos.values()) <= ram_bytes:
            with np.load(path, allow_pickle=False) as z:
                return {k: z[k] for k in z.files}, False
        with np.load(path, allow_pickle=False) as z:
            arrays = {k: (_memmap_member(path, i) if i.compress_type == zipfile.ZIP_STORED else z[k])
                      for k, i in infos.items()}
        return arrays, any(isinstance(a, np.memmap) for a in arrays.values())
    except DataError:
        raise
    except Exception as exc:  # not a zip, pickled objects, truncated file ...
        raise DataError(f"cannot read npz {path}: {exc}") from exc


def load_npz(path: Path, ram_bytes: int) -> Splits:
    """``images`` + ``labels`` (+ optional ``test_images``/``test_labels``, ``class_names``);
    without a test split the caller splits the pool."""
    arrays, on_disk = _npz_arrays(path, ram_bytes)
    for key in ("images", "labels"):
        if key not in arrays:
            raise DataError(f"npz {path} has no key {key!r} (keys: {sorted(arrays)})")
    if ("test_images" in arrays) != ("test_labels" in arrays):
        missing = "test_labels" if "test_images" in arrays else "test_images"
        raise DataError(f"npz {path} has no key {missing!r}: test_images and test_labels go together")
    x = _npz_images(arrays["images"], path, "images", on_disk)
    y = _npz_labels(arrays["labels"], path, "labels")
    if len(x) != len(y):
        raise DataError(f"npz {path}: 'labels' has {len(y)} entries but 'images' has {len(x)}")
    xte = yte = None
    if "test_images" in arrays:
        xte = _npz_images(arrays["test_images"], path, "test_images", on_disk)
        yte = _npz_labels(arrays["test_labels"], path, "test_labels")
        if len(xte) != len(yte):
            raise DataError(f"npz {path}: 'test_labels' has {len(yte)} entries but 'test_images' has {len(xte)}")
        if xte.image_shape != x.image_shape:
            raise DataError(f"npz {path}: 'test_images' are {xte.image_shape} but 'images' are {x.image_shape}")
    all_labels = y if yte is None else np.concatenate([y, yte])
    if "class_names" in arrays:
        require_label_range(all_labels, f"npz {path}")
        names = tuple(str(n) for n in np.atleast_1d(np.asarray(arrays["class_names"])))
    else:
        names = numbered_class_names(all_labels, f"npz {path}")  # the range checked before range()
    check_labels(all_labels, len(names), path)
    return Splits(x, y, xte, yte, names)


def _npz_images(a: np.ndarray, path: Path, key: str, on_disk: bool) -> ImageStore:
    """[N,H,W] | [N,C,H,W] | [N,H,W,C] of uint8 (kept as bytes; memory-mapped stays so) or
    float (checked finite, read as float32) -> a store of [N, C, H, W]."""
    axes, chw = npz_layout(a.shape, path, key)
    if a.dtype == np.uint8:
        return ImageStore(a.reshape(len(a), *a.shape[1:]).transpose(axes).reshape(len(a), *chw),
                          BYTE_VALUES, on_disk=on_disk and isinstance(a, np.memmap))
    if not np.issubdtype(a.dtype, np.floating):
        raise DataError(f"npz {path}: {key!r} has dtype {a.dtype}; allowed uint8 (scaled by 1/255) or float")
    a = np.asarray(a)
    bad = int((~np.isfinite(a)).sum())
    if bad:
        raise DataError(f"npz {path}: {key!r} has {bad} non-finite pixel values (NaN/inf)")
    return ImageStore(np.ascontiguousarray(a.transpose(axes).reshape(len(a), *chw), np.float32))


def _npz_labels(a: np.ndarray, path: Path, key: str) -> np.ndarray:
    a = np.asarray(a)
    if a.ndim != 1 or not np.issubdtype(a.dtype, np.integer):
        raise DataError(f"npz {path}: {key!r} must be 1-D integers, got {a.dtype} {a.shape}")
    return a.astype(np.int64)


# ------------------------------------------------------------------ a plugin's arrays


def array_splits(arrays: object, where: str) -> Splits:
    """A ``@dataset_format`` function's ``(train_images, train_labels, test_images,
    test_labels)``, images uint8 ``[N,H,W,C]`` and labels int ``[N]`` -> :class:`Splits` of
    ``[N,C,H,W]`` stores (``byte/255``). Anything else is one line naming ``where``."""
    if not isinstance(arrays, (tuple, list)) or len(arrays) != 4:
        raise DataError(f"{where}: the format must return (train_images, train_labels, test_images, "
                        f"test_labels), got {type(arrays).__name__}")
    stores, labels = [], []
    for split, (images, y) in (("train", arrays[:2]), ("test", arrays[2:])):
        images, y = np.asarray(images), np.asarray(y)
        if images.dtype != np.uint8 or images.ndim != 4 or images.shape[-1] not in (1, 3) or not len(images):
            raise DataError(f"{where}: {split} images must be uint8 [N,H,W,C] with N >= 1 and C in (1, 3), "
                            f"got {images.dtype} {images.shape}")
        if y.shape != (len(images),) or not np.issubdtype(y.dtype, np.integer):
            raise DataError(f"{where}: {split} labels must be {len(images)} integers, got {y.dtype} {y.shape}")
        stores.append(ImageStore(np.ascontiguousarray(images.transpose(0, 3, 1, 2)), BYTE_VALUES))
        labels.append(y.astype(np.int64))
    if stores[0].image_shape != stores[1].image_shape:
        raise DataError(f"{where}: test images are {stores[1].image_shape} but training images are "
                        f"{stores[0].image_shape} (C, H, W)")
    all_labels = np.concatenate(labels)
    names = numbered_class_names(all_labels, where)  # the range checked before range()
    check_labels(all_labels, len(names), Path(where))
    return Splits(stores[0], labels[0], stores[1], labels[1], names)
