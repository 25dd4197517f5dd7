"""``mae-study fetch NAME``: a named dataset's official files, downloaded and checked.

Every file is downloaded into a temporary file beside its destination, its decompressed bytes
checked against the SHA-256 the catalogue pins (:mod:`mae_core.named_datasets`), and only when
every file of the dataset passes are they renamed into place (a rename within one folder is
atomic): a failed download or a wrong hash leaves nothing behind, not even the folder if this
command made it. A file already there whose hash is right is kept and not downloaded again.

The files come from the dataset's ``base_url`` (Fashion-MNIST: Zalando's), or from the
``MAE_STUDY_FETCH_URL`` environment variable where a mirror (or a test's local server) serves
the same files.
"""

from __future__ import annotations

import gzip
import hashlib
import http.client
import os
import shutil
import tempfile
import urllib.error
import urllib.request
import zlib
from collections.abc import Mapping
from pathlib import Path

from mae_core.errors import UserError
from mae_core.named_datasets import NamedDataset

URL_ENV = "MAE_STUDY_FETCH_URL"  # a mirror's base URL, in place of the dataset's own
TIMEOUT_S = 60  # per connection attempt and read; a dead network fails in a minute, not hangs
CHUNK = 1 << 20


class FetchError(UserError):
    """A download failed or a file's hash is wrong: one line naming the file."""


def decompressed_sha256(path: Path, name: str | None = None) -> str:
    """SHA-256 of the file's bytes, of its decompressed bytes when it is (or ``name``, the name it
    will have, is) a ``.gz``; read in chunks."""
    digest = hashlib.sha256()
    try:
        with (gzip.open(path, "rb") if (name or path.name).endswith(".gz") else open(path, "rb")) as handle:
            while chunk := handle.read(CHUNK):
                digest.update(chunk)
    except (OSError, EOFError, zlib.error) as error:  # not gzip, cut off
        return f"unreadable ({error})"
    return digest.hexdigest()


def _download(url: str, to: Path) -> None:
    try:
        with urllib.request.urlopen(url, timeout=TIMEOUT_S) as response, open(to, "wb") as out:
            shutil.copyfileobj(response, out, CHUNK)
    except (urllib.error.URLError, http.client.HTTPException, OSError, ValueError) as error:  # ValueError: a malformed URL
        reason = getattr(error, "reason", None) or error
        raise FetchError(f"cannot download {url}: {reason}") from None


def fetch_files(files: Mapping[str, str], base_url: str, folder: Path) -> list[Path]:
    """Download each of ``files`` (name -> SHA-256 of its decompressed bytes) from ``base_url``
    into ``folder``; returns the files' paths. All or nothing: see the module."""
    made = [p for p in (folder, *folder.parents) if not p.exists()]  # deepest first: removed on a failure
    try:
        folder.mkdir(parents=True, exist_ok=True)
    except OSError as error:
        raise FetchError(f"{folder}: cannot be written ({error.strerror or error})") from None
    pending: dict[Path, Path] = {}  # destination -> its checked temporary file
    try:
        for name, expected in files.items():
            destination = folder / name
            if destination.is_file() and decompressed_sha256(destination) == expected:
                continue  # fetched before: kept
            handle, temporary = tempfile.mkstemp(prefix=f".{name}.", suffix=".part", dir=folder)
            os.close(handle)
            pending[destination] = Path(temporary)
            url = base_url.rstrip("/") + "/" + name
            _download(url, pending[destination])
            found = decompressed_sha256(pending[destination], name)
            if found != expected:
                raise FetchError(f"{url}: SHA-256 of its decompressed bytes is {found}, expected {expected}; "
                                 f"nothing was kept")
        umask = os.umask(0)
        os.umask(umask)
        for destination, temporary in pending.items():
            os.chmod(temporary, 0o666 & ~umask)  # mkstemp's 0600 -> what a plain download would have
            os.replace(temporary, destination)
        pending.clear()
    finally:
        for temporary in pending.values():
            temporary.unlink(missing_ok=True)
        if pending:  # a failure: the folders this call made go too, where nothing else is in them
            for made_folder in made:
                if made_folder.is_dir() and not any(made_folder.iterdir()):
                    made_folder.rmdir()
    return [folder / name for name in files]


def fetch(dataset: NamedDataset, to: Path, base_url: str | None = None) -> Path:
    """``dataset``'s files into ``to/<its folder>``, from ``base_url`` (default
    ``$MAE_STUDY_FETCH_URL``, else the dataset's own); returns that folder."""
    url = base_url or os.environ.get(URL_ENV) or dataset.base_url
    folder = to / dataset.folder
    fetch_files(dataset.sha256, url, folder)
    return folder
