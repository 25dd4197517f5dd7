"""Named datasets (``dataset=fashion_mnist``): a publisher's files, found on this machine by name.

A named dataset is a folder of files in one of the file formats (Fashion-MNIST: the IDX family,
:mod:`mae_core.idx`) looked up in two places, in this order:

1. ``$MAE_STUDY_DATA/<folder>`` (without ``MAE_STUDY_DATA``: the user's data folder,
   ``$XDG_DATA_HOME/mae-study`` or ``~/.local/share/mae-study``), where ``mae-study fetch``
   writes;
2. the system's copy, ``/usr/share/datasets/<folder>``, where Debian's package puts it
   (``apt-get install dataset-fashion-mnist``).

Absent from both, a config naming it is refused in one line that says how to get it, before
anything runs. Each file's SHA-256 is of its decompressed bytes: Debian recompresses the
publisher's gzip files (their MD5s differ from the publisher's), the bytes inside are the same.
"""

from __future__ import annotations

import os
from dataclasses import dataclass, field
from pathlib import Path

from .formats import DataError

DATA_ENV = "MAE_STUDY_DATA"  # the folder named datasets are looked up in (and fetched to)
SYSTEM_DATA = Path("/usr/share/datasets")  # Debian's dataset-* packages


@dataclass(frozen=True)
class NamedDataset:
    """A dataset known by name: its folder's name, the format that reads it, its class names,
    and where its official files are (``base_url`` + each file name) with the SHA-256 of each
    file's decompressed bytes."""

    name: str
    folder: str
    kind: str  # the file format (a registered dataset format) that reads the folder
    class_names: tuple[str, ...]
    base_url: str
    sha256: dict[str, str] = field(default_factory=dict)  # file name -> SHA-256 of its decompressed bytes
    apt_package: str | None = None
    licence: str = ""

    def get_it(self) -> str:
        """How to get it, for the line that refuses its absence."""
        ways = [f"apt-get install {self.apt_package}"] if self.apt_package else []
        return " or ".join([*ways, f"mae-study fetch {self.name}"])


FASHION_MNIST = NamedDataset(
    name="fashion_mnist", folder="fashion-mnist", kind="idx",
    class_names=("T-shirt/top", "Trouser", "Pullover", "Dress", "Coat", "Sandal", "Shirt", "Sneaker", "Bag",
                 "Ankle boot"),
    # Zalando's own copy (the project README's download links)
    base_url="http://fashion-mnist.s3-website.eu-central-1.amazonaws.com/",
    # of the decompressed files; the same four hashes come from Debian's package (whose gzip
    # files differ from Zalando's) and from other projects that pin Zalando's files
    sha256={
        "train-images-idx3-ubyte.gz": "c59f468a2f672dc815687fe0f83887768d799fd8a3f3276145d20f83aa44d888",
        "train-labels-idx1-ubyte.gz": "bad3541b69d912435c50bb6ba87bec294ff4f6a2e1246121d8633921760443d9",
        "t10k-images-idx3-ubyte.gz": "5b4141f0afbad91edebe8549f8fcffe087ea10ca49f1dbef5c9a5cd8815ce37b",
        "t10k-labels-idx1-ubyte.gz": "0402a96d92fd2663957122ceb108a494c5af83dab82d92729df917d7dec38c34",
    },
    apt_package="dataset-fashion-mnist", licence="MIT",
)

NAMED: dict[str, NamedDataset] = {FASHION_MNIST.name: FASHION_MNIST}


def data_home() -> Path:
    """Where named datasets are looked up first and fetched to: ``$MAE_STUDY_DATA``, else the
    user's data folder (``$XDG_DATA_HOME/mae-study``, ``~/.local/share/mae-study``)."""
    if os.environ.get(DATA_ENV):
        return Path(os.environ[DATA_ENV]).expanduser()
    base = os.environ.get("XDG_DATA_HOME") or Path.home() / ".local" / "share"
    return Path(base).expanduser() / "mae-study"


def candidates(dataset: NamedDataset) -> list[Path]:
    """The folders searched for ``dataset``, in order."""
    return [data_home() / dataset.folder, SYSTEM_DATA / dataset.folder]


def get_named(name: str) -> NamedDataset:
    if name not in NAMED:
        raise DataError(f"unknown named dataset {name!r}; known: {', '.join(NAMED)}")
    return NAMED[name]


def locate(name: str) -> Path:
    """The first folder of :func:`candidates` that exists and holds files (a damaged file there
    is reported when it is read, not skipped); one line saying how to get it when none does."""
    dataset = get_named(name)
    for folder in candidates(dataset):
        if folder.is_dir() and any(folder.iterdir()):
            return folder
    where = " or ".join(str(f) for f in candidates(dataset))
    raise DataError(f"dataset {name}: not found in {where} (${DATA_ENV} sets the first); get it with "
                    f"{dataset.get_it()}")
