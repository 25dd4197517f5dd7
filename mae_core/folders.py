"""Readers of image-file datasets: a folder of class folders, and ImageNet's train/ + val/ layout.

Every image must have the size of the first one; a dataset is colour (RGB, C=3) when any image
is, else grey (C=1). Listing reads only the files' headers. A dataset whose decoded bytes
(N x C x H x W) fit under the trial's ceiling (``data_ram_mb``) is decoded once into memory;
a larger one stays as files, decoded batch by batch (:class:`ImageFiles`).
"""

from __future__ import annotations

from pathlib import Path

import numpy as np

from .formats import DataError, Splits
from .images import BYTE_VALUES, ImageStore

IMAGE_SUFFIXES = {".png", ".jpg", ".jpeg"}
_GREY_MODES = ("1", "L", "LA")


class ImageFiles:
    """Image files decoded on demand: ``files[index]`` -> uint8 [b, C, H, W] (RGB when
    ``colour``, else grey), every file ``size`` = (width, height) as its header said."""

    dtype = np.dtype(np.uint8)

    def __init__(self, files: list[Path], size: tuple[int, int], colour: bool):
        self.files, self.size, self.colour = files, size, colour
        self.shape = (len(files), 3 if colour else 1, size[1], size[0])

    def __len__(self) -> int:
        return len(self.files)

    def __getitem__(self, index: np.ndarray) -> np.ndarray:
        picked = np.arange(len(self.files))[index] if isinstance(index, slice) else np.asarray(index)
        out = np.empty((len(picked), *self.shape[1:]), np.uint8)
        for slot, i in enumerate(picked):
            out[slot] = self._decode(self.files[int(i)])
        return out

    def _decode(self, file: Path) -> np.ndarray:
        from PIL import Image

        try:
            with Image.open(file) as im:
                pixels = np.asarray(im.convert("RGB" if self.colour else "L"))
        except OSError as exc:
            raise DataError(f"cannot read image {file}: {exc}") from exc
        if pixels.shape[:2] != self.shape[2:]:
            raise DataError(f"image {file} decodes to {pixels.shape[1]}x{pixels.shape[0]}, expected "
                            f"{self.size[0]}x{self.size[1]}")
        return pixels.transpose(2, 0, 1) if self.colour else pixels[None]

    def read_all(self, chunk: int = 1024) -> np.ndarray:
        """Every image decoded into one array [N, C, H, W] (filled in place, no second copy)."""
        out = np.empty(self.shape, np.uint8)
        for start in range(0, len(self.files), chunk):
            out[start:start + chunk] = self[np.arange(start, min(start + chunk, len(self.files)))]
        return out


def _header(file: Path) -> tuple[tuple[int, int], str]:
    """(width, height) and mode of an image from its header (nothing decoded)."""
    from PIL import Image

    try:
        with Image.open(file) as im:
            return im.size, im.mode
    except OSError as exc:
        raise DataError(f"cannot read image {file}: {exc}") from exc


def _images_in(folder: Path, recursive: bool) -> list[Path]:
    found = folder.rglob("*") if recursive else folder.iterdir()
    return sorted(f for f in found if f.suffix.lower() in IMAGE_SUFFIXES and f.is_file())


def class_folders(root: Path, recursive: bool = False) -> list[tuple[str, list[Path]]]:
    """(class name, image files) for each (sorted, non-hidden) sub-folder holding images."""
    if not root.is_dir():
        raise DataError(f"folder dataset path must be a folder of class folders: {root}")
    classes = []
    for sub in sorted(p for p in root.iterdir() if p.is_dir() and not p.name.startswith(".")):
        files = _images_in(sub, recursive)
        if files:
            classes.append((sub.name, files))
    if not classes:
        raise DataError(f"empty dataset: no PNG/JPEG images in class sub-folders of {root}")
    return classes


def _checked_files(files: list[Path]) -> tuple[tuple[int, int], bool]:
    """Every header read: the common size (width, height) and whether any image is colour."""
    size, colour = None, False
    for f in files:
        this, mode = _header(f)
        size = size or this
        if this != size:
            raise DataError(f"image {f} is {this[0]}x{this[1]}, expected {size[0]}x{size[1]} "
                            f"like the first image (all images must have the same size)")
        colour = colour or mode not in _GREY_MODES
    return size, colour


def _stores(parts: list[list[Path]], ram_bytes: int) -> list[ImageStore]:
    """One store per list of files: decoded into memory when all of them fit under ram_bytes."""
    every = [f for files in parts for f in files]
    size, colour = _checked_files(every)
    decoded = len(every) * (3 if colour else 1) * size[0] * size[1]
    stores = []
    for files in parts:
        source = ImageFiles(files, size, colour)
        if decoded <= ram_bytes:
            stores.append(ImageStore(source.read_all(), BYTE_VALUES))
        else:
            stores.append(ImageStore(source, BYTE_VALUES, on_disk=True))
    return stores


def load_folder(root: Path, ram_bytes: int) -> Splits:
    """Class sub-folders of PNG/JPEG images (label = index of the sorted class folder among
    those holding images) -> the pool the seeded 80/20 split divides."""
    classes = class_folders(root)
    files = [f for _, fs in classes for f in fs]
    labels = np.concatenate([np.full(len(fs), k, np.int64) for k, (_, fs) in enumerate(classes)])
    (pool,) = _stores([files], ram_bytes)
    return Splits(pool, labels, None, None, tuple(name for name, _ in classes))


def load_imagenet(root: Path, ram_bytes: int) -> Splits:
    """ImageNet's layout: ``train/<class>/**`` images (class folders, searched recursively,
    so Tiny-ImageNet's ``train/<wnid>/images/`` works) and ``val/`` as the test split, either
    class folders too or Tiny-ImageNet's ``val/images/`` with ``val/val_annotations.txt``
    (file, wnid, box per line). Names come from ``words.txt`` (wnid, names) when present."""
    train_dir, val_dir = root / "train", root / "val"
    for folder in (train_dir, val_dir):
        if not folder.is_dir():
            raise DataError(f"imagenet dataset needs the folders train/ and val/: missing {folder}")
    classes = class_folders(train_dir, recursive=True)
    index = {name: k for k, (name, _) in enumerate(classes)}
    train_files = [f for _, fs in classes for f in fs]
    train_labels = np.concatenate([np.full(len(fs), k, np.int64) for k, (_, fs) in enumerate(classes)])
    val_files, val_labels = _val_split(val_dir, index)
    train, val = _stores([train_files, val_files], ram_bytes)
    return Splits(train, train_labels, val, val_labels, _class_names(root, [name for name, _ in classes]))


def _val_split(val_dir: Path, index: dict[str, int]) -> tuple[list[Path], np.ndarray]:
    """val/ -> (files, labels): from val_annotations.txt (Tiny-ImageNet) or class folders."""
    annotations = val_dir / "val_annotations.txt"
    pairs: list[tuple[Path, str]] = []
    if annotations.exists():
        for number, line in enumerate(annotations.read_text().splitlines(), 1):
            fields = line.split("\t")
            if len(fields) < 2:
                if line.strip():
                    raise DataError(f"{annotations} line {number}: expected file<TAB>wnid, got {line!r}")
                continue
            file = val_dir / "images" / fields[0]
            if not file.exists():
                raise DataError(f"{annotations} line {number} names a missing image: {file}")
            pairs.append((file, fields[1].strip()))
    else:
        pairs = [(f, name) for name, files in class_folders(val_dir, recursive=True) for f in files]
    unknown = sorted({name for _, name in pairs if name not in index})
    if unknown:
        raise DataError(f"val/ of {val_dir.parent} has classes not in train/: {', '.join(unknown[:5])}")
    if not pairs:
        raise DataError(f"empty dataset: no validation images in {val_dir}")
    return [f for f, _ in pairs], np.array([index[name] for _, name in pairs], np.int64)


def _class_names(root: Path, wnids: list[str]) -> tuple[str, ...]:
    """The first name words.txt gives each wnid (``n01443537<TAB>goldfish, Carassius auratus``),
    else the folder name."""
    words = root / "words.txt"
    if not words.exists():
        return tuple(wnids)
    names = {}
    for line in words.read_text().splitlines():
        wnid, _, text = line.partition("\t")
        names[wnid.strip()] = text.split(",")[0].strip() or wnid.strip()
    return tuple(names.get(w, w) for w in wnids)


def folder_image_shape(files: list[Path]) -> tuple[int, int, int]:
    """(C, H, W) from the first image's header; C=3 as soon as one header is a colour mode,
    so a grey folder is scanned header by header (nothing decoded), a colour one stops at once."""
    (width, height), _ = _header(files[0])
    colour = any(_header(f)[1] not in _GREY_MODES for f in files)
    return (3 if colour else 1, height, width)


def imagenet_image_shape(root: Path) -> tuple[int, int, int]:
    """(C, H, W) of an imagenet-layout dataset from headers: train/'s images, then val/'s (a
    colour image in either makes the dataset RGB, as loading does)."""
    for folder in (root / "train", root / "val"):
        if not folder.is_dir():
            raise DataError(f"imagenet dataset needs the folders train/ and val/: missing {folder}")
    train = [f for _, files in class_folders(root / "train", recursive=True) for f in files]
    return folder_image_shape(train + _images_in(root / "val", recursive=True))
