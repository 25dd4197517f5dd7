"""Images as stored, ``[N, C, H, W]`` uint8 (or float32), turned into float32 one batch at a time.

A uint8 image takes a quarter of the memory of its float32 copy (CIFAR-10's 60,000 images: 184 MB
instead of 737 MB). The float value of each byte is read from a 256-entry table computed with
the very expression the loaders used before (``byte / np.float32(255)``; digits: ``byte / 16``),
so a converted batch is bitwise the float32 image of before, on any device: nothing is divided
again (CUDA divides by a scalar through its reciprocal, which is not always the correctly rounded
quotient).

Where the bytes live: an :class:`ImageStore`'s source is an array in memory, a memory-mapped one
(STL-10's binaries, an uncompressed npz member), or image files decoded on demand (a folder);
``rows`` selects a subset (a split, a limit) without copying anything.

A store on disk feeds training through :class:`BatchPrefetcher`: the loop names the next batch
while the current update runs, and one background thread reads its bytes (decoding files,
paging a memmap) into a uint8 batch, pinned when CUDA is available, so the copy to the device
does not block the host (issue 26: files were decoded one at a time in the training thread).
"""

from __future__ import annotations

from collections.abc import Iterator
from concurrent.futures import Future, ThreadPoolExecutor
from typing import Any, Protocol

import numpy as np
import torch

from .devices import pin_if_cuda, to_device

# byte -> float32 value, exactly as ``uint8_array / np.float32(255)`` gives it (CIFAR, photos,
# folders, uint8 npz); digits hold 0..16, scaled by 1/16 (exact in float32)
BYTE_VALUES = np.arange(256, dtype=np.uint8) / np.float32(255)  # [256] float32
SIXTEENTHS = (np.arange(256, dtype=np.float64) / 16.0).astype(np.float32)  # [256]
CHUNK_BYTES = 8 * 2**20  # stored bytes read at a time when a whole split is (32 MB as float32)


class ImageSource(Protocol):
    """What a store reads from: ``shape`` [N, C, H, W], ``dtype``, and ``source[index]`` for an
    int64 index array [b] -> an array [b, C, H, W] in memory (numpy arrays and memmaps qualify)."""

    shape: tuple[int, ...]
    dtype: Any

    def __getitem__(self, index: np.ndarray) -> np.ndarray: ...


class ImageStore:
    """Images ``[N, C, H, W]`` as stored: uint8 with ``table`` (byte -> float32 value), or
    float32 with no table. ``on_disk`` says the source is read from disk on demand (a memmap,
    files) rather than held in memory; ``rows`` [N] picks the images of this store from the source."""

    def __init__(self, source: ImageSource, table: np.ndarray | None = None, *, on_disk: bool = False,
                 rows: np.ndarray | None = None):
        if table is None and source.dtype != np.float32:
            raise TypeError(f"an ImageStore without a table holds float32, got {source.dtype}")
        if table is not None and (source.dtype != np.uint8 or table.shape != (256,)):
            raise TypeError(f"a table [256] converts uint8 images, got {source.dtype} and {table.shape}")
        self.source, self.table, self.on_disk = source, table, on_disk
        self.rows = None if rows is None else np.asarray(rows, np.int64)

    # ------------------------------------------------------------------ what it holds

    def __len__(self) -> int:
        return int(self.source.shape[0]) if self.rows is None else len(self.rows)

    @property
    def image_shape(self) -> tuple[int, int, int]:
        """(C, H, W)."""
        c, h, w = self.source.shape[1:]
        return int(c), int(h), int(w)

    @property
    def shape(self) -> tuple[int, int, int, int]:
        return (len(self), *self.image_shape)

    @property
    def nbytes(self) -> int:
        """Bytes of the stored images (what holding them in memory costs)."""
        return len(self) * int(np.prod(self.image_shape)) * np.dtype(self.source.dtype).itemsize

    @property
    def in_memory(self) -> bool:
        return not self.on_disk

    # --------------------------------------------------------------------- subsets

    def take(self, index: Any) -> ImageStore:
        """The images ``index`` (int array, tensor or slice) of this store, nothing copied."""
        if isinstance(index, slice) and index.indices(len(self)) == (0, len(self), 1):
            return self  # every image, in order (an unlimited train_limit)
        if isinstance(index, torch.Tensor):
            index = index.cpu().numpy()
        picked = np.arange(len(self))[index] if isinstance(index, slice) else np.asarray(index, np.int64)
        rows = picked if self.rows is None else self.rows[picked]
        return ImageStore(self.source, self.table, on_disk=self.on_disk, rows=rows)

    __getitem__ = take

    # --------------------------------------------------------------------- reading

    def stored(self, index: np.ndarray | None = None) -> np.ndarray:
        """The stored values (uint8 or float32) of images ``index`` [b] (all when None) ->
        contiguous [b, C, H, W] in memory. The whole of an in-memory source is not copied."""
        if index is None and self.rows is None and not self.on_disk:
            return np.ascontiguousarray(self.source)
        if index is None:
            index = np.arange(len(self))
        rows = np.asarray(index, np.int64) if self.rows is None else self.rows[index]
        return np.ascontiguousarray(self.source[rows])

    def to_float(self, stored: np.ndarray) -> np.ndarray:
        """Stored values [..] -> float32 [..] through the table (float32 passes through)."""
        return stored if self.table is None else self.table[stored]

    def chunks(self, nbytes: int | None = None) -> Iterator[tuple[int, np.ndarray]]:
        """(offset, stored values [b, C, H, W]) over the whole store, about ``nbytes`` (default
        CHUNK_BYTES) at a time; slices of an in-memory source are views, not copies."""
        nbytes = CHUNK_BYTES if nbytes is None else nbytes
        per_image = max(1, int(np.prod(self.image_shape)) * np.dtype(self.source.dtype).itemsize)
        step = max(1, nbytes // per_image)
        for start in range(0, len(self), step):
            stop = min(len(self), start + step)
            if not self.on_disk and self.rows is None:
                yield start, self.source[start:stop]
            else:
                yield start, self.stored(np.arange(start, stop))

    def floats(self, index: np.ndarray | None = None) -> torch.Tensor:
        """Float32 images [b, C, H, W] (all when ``index`` is None), read chunk by chunk so the
        table lookup never holds more than one chunk's int64 indices."""
        if index is not None:
            return torch.from_numpy(np.ascontiguousarray(self.to_float(self.stored(index))))
        out = np.empty(self.shape, np.float32)
        for start, values in self.chunks():
            out[start:start + len(values)] = self.to_float(values)
        return torch.from_numpy(out)


class BatchPrefetcher:
    """Stored batches of an on-disk :class:`ImageStore`, read one batch ahead by one background
    thread. :meth:`prefetch` starts reading a batch; :meth:`read` returns the batch asked for,
    the prefetched one when it is that batch (same indices in the same order), else read there
    and then, so the images a run draws never depend on what was prefetched. An exception in the
    thread is raised by the :meth:`read` that takes its batch. Batches are pinned when CUDA is
    available (on a CPU-only machine pinning raises). :meth:`close` stops the thread; a closed
    prefetcher still reads, in the caller's thread."""

    def __init__(self, store: ImageStore):
        self.store = store
        self._pool: ThreadPoolExecutor | None = None
        self._pending: tuple[torch.Tensor, Future] | None = None
        self._closed = False

    def _read(self, index: np.ndarray) -> torch.Tensor:
        return pin_if_cuda(torch.from_numpy(self.store.stored(index)))  # [b, C, H, W] uint8 (or float32)

    def prefetch(self, index: torch.Tensor) -> None:
        """Start reading images ``index`` (int64 [b], on the CPU) in the background."""
        if self._closed:
            return
        self._discard()
        if self._pool is None:
            self._pool = ThreadPoolExecutor(max_workers=1, thread_name_prefix="mae-prefetch")
        index = index.clone()  # the caller may reuse its tensor
        self._pending = (index, self._pool.submit(self._read, index.numpy()))

    def read(self, index: torch.Tensor) -> torch.Tensor:
        """The stored values of images ``index`` (int64 [b], on the CPU): [b, C, H, W]."""
        pending, self._pending = self._pending, None
        if pending is not None and pending[0].shape == index.shape and torch.equal(pending[0], index):
            return pending[1].result()  # the thread's exception, if any, is raised here
        if pending is not None:
            self._pending = pending
            self._discard()
        return self._read(index.numpy())

    def _discard(self) -> None:
        """Drop a prefetched batch nobody asked for (its reading finishes; an error in it is moot)."""
        if self._pending is not None:
            self._pending[1].cancel()
            self._pending = None

    def close(self) -> None:
        """Stop the background thread (waiting for a read in progress) and drop what it read."""
        self._closed = True
        self._discard()
        if self._pool is not None:
            self._pool.shutdown(wait=True, cancel_futures=True)
            self._pool = None


class DeviceImages:
    """Float32 batches ``[B, C, H, W]`` on ``device`` from an :class:`ImageStore`.

    An in-memory store's source is copied to the device once, as stored (uint8: a quarter of
    its float size; on the CPU it is shared, not copied), with its table; each batch is then a
    gather and a table lookup there. A store on disk is read batch by batch on the CPU by a
    :class:`BatchPrefetcher` (:meth:`prefetch` names the next batch), copied to the device as
    stored and converted there through the same table: the same float32 values as before.
    :meth:`close` stops the prefetching thread.
    """

    def __init__(self, store: ImageStore, device: torch.device):
        self.store, self.device = store, torch.device(device)
        self.values = self.table = self.rows = None
        self.reader: BatchPrefetcher | None = None
        if store.in_memory:
            # the whole source, not a gathered copy of the rows: on the CPU this shares memory
            self.values = torch.from_numpy(np.ascontiguousarray(store.source)).to(self.device)
            if store.rows is not None:
                self.rows = torch.from_numpy(store.rows).to(self.device)
        else:
            self.reader = BatchPrefetcher(store)
        if store.table is not None:
            self.table = torch.from_numpy(store.table).to(self.device)

    def __len__(self) -> int:
        return len(self.store)

    def prefetch(self, index: torch.Tensor) -> None:
        """Start reading images ``index`` (int64 [B], on the CPU) in the background, when the
        store is on disk (in memory there is nothing to read ahead)."""
        if self.reader is not None:
            self.reader.prefetch(index)

    def __call__(self, index: torch.Tensor) -> torch.Tensor:
        """Images ``index`` (int64 [B], on the CPU) -> float32 [B, C, H, W] on the device."""
        if self.values is None:
            stored = to_device(self.reader.read(index), self.device)  # pinned already on CUDA: not blocking
            return stored if self.table is None else self.table[stored.long()]
        index = index.to(self.device, non_blocking=True)
        picked = self.values[index if self.rows is None else self.rows[index]]
        return picked if self.table is None else self.table[picked.long()]

    def close(self) -> None:
        """Stop the background reader (nothing to do for an in-memory store)."""
        if self.reader is not None:
            self.reader.close()
