"""The built-in objectives, targets, corruptions, mask samplers and file formats, registered with
the same decorators a plugin uses (:mod:`mae_core.registry`); the objectives are classes, in
:mod:`mae_core.objective_classes`.

Each entry is a thin wrapper over the module that does the work (targets, corruptions, masking,
formats, folders), imported when the part is first used: the registry's names stay readable
without torch (``mae-study config``). Registration order is the order users see.
"""

from __future__ import annotations

from pathlib import Path

from . import objective_classes  # noqa: F401  (registers the objectives mae, ae and dae, in that order)
from .registry import DatasetFormat, corruption, dataset_formats, mask_sampler, target

# ------------------------------------------------------------------------------ targets


def _normalised(patches, kind: str):
    from .targets import target_moments

    mean, scale = target_moments(patches, kind)
    return (patches - mean) / scale


def _unnormalised(kind: str):
    def inverse(pred, patches):
        """A normalised prediction shown with each patch's own mean and scale (He et al.'s pictures)."""
        from .targets import target_moments

        mean, scale = target_moments(patches, kind)
        return pred * scale + mean
    return inverse


def _norm_domain(chunks, what: str) -> None:
    from .targets import require_norm_domain_chunks

    require_norm_domain_chunks(chunks, what)


@target("raw", inverse=lambda pred, patches: pred, label="pixel (w/o norm)")
def raw(patches):
    """``T_raw(u) = u`` (spec)."""
    return patches


@target("norm", inverse=_unnormalised("norm"), domain_check=_norm_domain, min_patch_dim=2, label="pixel (w/ norm)")
def norm(patches):
    """The spec's strict ``T_norm``: population std, no epsilon (defined on ``D_norm`` only)."""
    return _normalised(patches, "norm")


@target("norm_eps", inverse=_unnormalised("norm_eps"), min_patch_dim=2, label="pixel (w/ norm+ε)")
def norm_eps(patches):
    """He et al.'s per-patch normalisation: unbiased variance + 1e-6."""
    return _normalised(patches, "norm_eps")


# -------------------------------------------------------------------------- corruptions


def _builtin_corruption(kind: str, level_at_most: float | None = None, label: str = "") -> None:
    def draw(patches, level, generator):
        from .corruptions import corrupt

        return corrupt(patches, kind, level, generator)
    draw.__qualname__ = f"corruption_{kind}"
    corruption(kind, level_at_most=level_at_most, label=label)(draw)


_builtin_corruption("none")
_builtin_corruption("gaussian")
_builtin_corruption("masking", level_at_most=1.0)
_builtin_corruption("salt_pepper", level_at_most=1.0, label="salt & pepper")


# ----------------------------------------------------------------------- mask samplers


@mask_sampler("random")
def uniform_sets(batch_size, num_patches, num_visible, grid, generator):
    """The spec's ``Uniform(V_k)``."""
    from .masking import _random

    return _random(batch_size, num_patches, num_visible, grid, generator)


@mask_sampler("block")
def block_sets(batch_size, num_patches, num_visible, grid, generator):
    """BEiT-style block-wise masking (He et al., Table 1f)."""
    from .masking import _block

    return _block(batch_size, num_patches, num_visible, grid, generator)


@mask_sampler("grid")
def lattice_sets(batch_size, num_patches, num_visible, grid, generator):
    """A regular lattice at a random phase (He et al., Table 1f)."""
    from .masking import _grid

    return _grid(batch_size, num_patches, num_visible, grid, generator)


# ------------------------------------------------------------------------ file formats

_CIFAR_SHAPE = (3, 32, 32)  # mae_core.formats.CIFAR_SHAPE, written here to stay torch-free
_STL10_SHAPE = (3, 96, 96)


def _cifar10(path: Path, ram_bytes: int):
    from .formats import load_cifar10

    return load_cifar10(path)


def _cifar100(coarse: bool):
    def load(path: Path, ram_bytes: int):
        from .formats import load_cifar100

        return load_cifar100(path, coarse=coarse)
    return load


def _stl10(path: Path, ram_bytes: int):
    from .formats import load_stl10

    return load_stl10(path, ram_bytes)


def _npz(path: Path, ram_bytes: int):
    from .formats import load_npz

    return load_npz(path, ram_bytes)


def _npz_shape(path: Path) -> tuple[int, int, int]:
    from .formats import npz_header, npz_layout

    shape, _ = npz_header(path, "images")
    return tuple(int(v) for v in npz_layout(shape, path, "images")[1])


def _idx(path: Path, ram_bytes: int):
    from .idx import load_idx

    return load_idx(path, ram_bytes)


def _idx_shape(path: Path) -> tuple[int, int, int]:
    from .idx import image_shape

    return image_shape(path)


def _folder(path: Path, ram_bytes: int):
    from .folders import load_folder

    return load_folder(path, ram_bytes)


def _folder_shape(path: Path) -> tuple[int, int, int]:
    from .folders import class_folders, folder_image_shape

    return folder_image_shape([f for _, files in class_folders(path) for f in files])


def _imagenet(path: Path, ram_bytes: int):
    from .folders import load_imagenet

    return load_imagenet(path, ram_bytes)


def _imagenet_shape(path: Path) -> tuple[int, int, int]:
    from .folders import imagenet_image_shape

    return imagenet_image_shape(path)


def _fixed(shape: tuple[int, int, int]):
    return lambda path: shape


for _format in (
    DatasetFormat("cifar10", _cifar10, _fixed(_CIFAR_SHAPE), patch_size=4),
    DatasetFormat("folder", _folder, _folder_shape),
    DatasetFormat("npz", _npz, _npz_shape),
    DatasetFormat("cifar100", _cifar100(coarse=False), _fixed(_CIFAR_SHAPE), patch_size=4),
    DatasetFormat("cifar100_coarse", _cifar100(coarse=True), _fixed(_CIFAR_SHAPE), patch_size=4),
    DatasetFormat("stl10", _stl10, _fixed(_STL10_SHAPE), patch_size=8),
    DatasetFormat("imagenet", _imagenet, _imagenet_shape),
    # no fixed patch: the image-size rule gives 4 at 28x28 (49 patches), as for a folder or npz
    DatasetFormat("idx", _idx, _idx_shape),
):
    dataset_formats.register(_format.kind, _format)
