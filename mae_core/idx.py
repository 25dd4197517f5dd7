"""The IDX family (``dataset=idx:DIR``): MNIST's file format, also Fashion-MNIST's, KMNIST's and EMNIST's.

A folder holds four files, plain or gzip (``.gz``), named as their publishers name them:
``train-images-idx3-ubyte``, ``train-labels-idx1-ubyte``, ``t10k-images-idx3-ubyte``,
``t10k-labels-idx1-ubyte`` (some copies write ``train-images.idx3-ubyte``; EMNIST puts a prefix
before them, ``emnist-letters-train-images-idx3-ubyte``). Each file is a header and raw bytes
(LeCun's description of the format): two zero bytes, a type byte (``0x08``: unsigned bytes, the
only type these datasets use), the number of dimensions, each dimension as a big-endian uint32,
then the values in C order. Images are ``[N, H, W]``, labels ``[N]``.

The files' own test split (``t10k``) is the test split, the same for every seed: a seed never
re-splits a dataset that has one (:func:`mae_core.data.load_dataset`). A wrong magic number, a
file shorter or longer than its header says, or image and label counts that differ are one line
naming the file (:class:`~mae_core.formats.DataError`). Each file's bytes become its array with
``np.frombuffer`` (no copy; Fashion-MNIST's 70,000 images in about half a second, most of it
gunzip); a plain images file above the trial's ``data_ram_mb`` stays on disk, memory-mapped.
"""

from __future__ import annotations

import gzip
import re
import struct
import zlib
from pathlib import Path

import numpy as np

from .formats import DataError, Splits, check_labels
from .images import BYTE_VALUES, ImageStore
from .labels import numbered_class_names

UNSIGNED_BYTE = 0x08  # the header's type code for uint8 values
CHUNK_BYTES = 8 * 2**20
# (split, what, dimensions): the four files of a folder, by the names their publishers give them
ROLES = (("train", "images", 3), ("train", "labels", 1), ("t10k", "images", 3), ("t10k", "labels", 1))


def role_pattern(split: str, what: str, dims: int) -> re.Pattern:
    """A file name of one role: ``[prefix-]train-images-idx3-ubyte`` or ``…-images.idx3-ubyte``,
    optionally ``.gz`` (the prefix is EMNIST's ``emnist-letters-``)."""
    return re.compile(rf"(?:.+-)?{split}-{what}[-.]idx{dims}-ubyte(?:\.gz)?")


def find_files(folder: Path) -> dict[tuple[str, str], Path]:
    """The folder's four files by (split, what); one line naming the folder and the missing
    (or doubly present) file otherwise."""
    if not folder.is_dir():
        raise DataError(f"idx path must be a folder holding the four MNIST-format files: {folder}")
    names = sorted(p.name for p in folder.iterdir() if p.is_file())
    found = {}
    for split, what, dims in ROLES:
        matches = [n for n in names if role_pattern(split, what, dims).fullmatch(n)]
        if not matches:
            raise DataError(f"idx folder {folder} has no {split}-{what}-idx{dims}-ubyte (plain or .gz); it needs "
                            f"train-images-idx3-ubyte, train-labels-idx1-ubyte, t10k-images-idx3-ubyte, "
                            f"t10k-labels-idx1-ubyte")
        if len(matches) > 1:
            raise DataError(f"idx folder {folder} has {len(matches)} {split}-{what} files ({', '.join(matches)}); "
                            f"keep one set per folder")
        found[(split, what)] = folder / matches[0]
    return found


def _open(path: Path):
    return gzip.open(path, "rb") if path.suffix == ".gz" else open(path, "rb")


def _header(data: bytes | bytearray, path: Path, dims: int) -> tuple[tuple[int, ...], int]:
    """The header at the start of ``data`` -> (shape, the offset where the values start)."""
    if len(data) < 4:
        raise DataError(f"idx file {path} is truncated: {len(data)} bytes, not even the 4-byte magic number")
    zero, kind, ndim = data[:2], data[2], data[3]
    if zero != b"\0\0" or kind != UNSIGNED_BYTE or ndim != dims:
        raise DataError(f"idx file {path} has magic number 0x{data[:4].hex()}; expected 0x0000080{dims} "
                        f"(unsigned bytes, {dims} dimension{'s' if dims > 1 else ''})")
    end = 4 + 4 * dims
    if len(data) < end:
        raise DataError(f"idx file {path} is truncated inside its header ({len(data)} of {end} bytes)")
    return struct.unpack(f">{dims}I", data[4:end]), end


def read_shape(path: Path, dims: int) -> tuple[int, ...]:
    """The shape a file's header declares, reading the header alone (config validation)."""
    try:
        with _open(path) as handle:
            head = handle.read(4 + 4 * dims)
    except (OSError, EOFError, zlib.error) as error:
        raise DataError(f"cannot read idx file {path}: {error}") from None
    return _header(head, path, dims)[0]


def read_array(path: Path, dims: int, ram_bytes: int | None = None) -> np.ndarray:
    """A file's values as uint8 of the shape its header declares. A plain file whose values
    exceed ``ram_bytes`` is memory-mapped (read-only) instead of read."""
    if path.suffix != ".gz" and ram_bytes is not None and path.stat().st_size > ram_bytes:
        shape = read_shape(path, dims)
        offset = 4 + 4 * dims
        _check_length(path, shape, path.stat().st_size - offset)
        return np.memmap(path, np.uint8, "r", offset=offset, shape=shape)
    try:
        with _open(path) as handle:
            data = bytearray()  # grown as read, never sized from the header (a damaged one may say anything)
            while chunk := handle.read(CHUNK_BYTES):
                data += chunk
    except (OSError, EOFError, zlib.error) as error:  # a damaged or cut-off gzip stream
        raise DataError(f"cannot read idx file {path}: {error}") from None
    shape, offset = _header(data, path, dims)
    _check_length(path, shape, len(data) - offset)
    return np.frombuffer(data, np.uint8, offset=offset).reshape(shape)  # a writable view of the bytearray


def _check_length(path: Path, shape: tuple[int, ...], length: int) -> None:
    expected = int(np.prod(shape))
    if length < expected:
        raise DataError(f"idx file {path} is truncated: its header says {'x'.join(map(str, shape))} "
                        f"({expected} bytes of values), it holds {length}")
    if length > expected:
        raise DataError(f"idx file {path} holds {length - expected} bytes after the "
                        f"{'x'.join(map(str, shape))} values its header declares")


def image_shape(folder: Path) -> tuple[int, int, int]:
    """(1, H, W) of the training images, from the header alone."""
    _, h, w = read_shape(find_files(folder)[("train", "images")], 3)
    return 1, int(h), int(w)


def load_idx(folder: Path, ram_bytes: int, names: tuple[str, ...] | None = None) -> Splits:
    """The folder's training and test splits: images uint8 ``[N, 1, H, W]`` (``byte / 255``),
    labels int64 ``[N]``; ``names`` the class names (default ``"0"``, ``"1"``, ...)."""
    files = find_files(folder)
    images, labels = {}, {}
    for split in ("train", "t10k"):
        x = read_array(files[(split, "images")], 3, ram_bytes)
        y = read_array(files[(split, "labels")], 1).astype(np.int64)
        if len(x) != len(y):
            raise DataError(f"idx file {files[(split, 'labels')]} holds {len(y)} labels but "
                            f"{files[(split, 'images')].name} holds {len(x)} images")
        if not len(x):
            raise DataError(f"empty dataset: idx file {files[(split, 'images')]} holds no images")
        images[split], labels[split] = x, y
    if images["train"].shape[1:] != images["t10k"].shape[1:]:
        raise DataError(f"idx folder {folder}: test images are {images['t10k'].shape[1:]} but training images "
                        f"are {images['train'].shape[1:]} (H, W)")
    all_labels = np.concatenate([labels["train"], labels["t10k"]])
    names = names or numbered_class_names(all_labels, f"idx folder {folder}")
    check_labels(all_labels, len(names), folder)
    train, test = (_store(images[s]) for s in ("train", "t10k"))
    return Splits(train, labels["train"], test, labels["t10k"], tuple(names))


def _store(images: np.ndarray) -> ImageStore:
    """uint8 [N, H, W] (in memory or memory-mapped) -> a store of [N, 1, H, W], nothing copied."""
    return ImageStore(images[:, None], BYTE_VALUES, on_disk=isinstance(images, np.memmap))
