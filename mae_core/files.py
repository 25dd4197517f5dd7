"""Small file-system guards shared by the CLI and the report writer."""

from __future__ import annotations

from pathlib import Path

from .errors import UserError


class FolderNotWritable(UserError):
    """A folder cannot be created or written (one line: the path and the reason)."""


def writable_folder(path: Path | str) -> Path:
    """Create ``path`` if needed, prove a file can be written there, return it absolute."""
    folder = Path(path)
    try:
        folder.mkdir(parents=True, exist_ok=True)
        probe = folder / ".mae-study-write-test"
        probe.write_text("")
        probe.unlink()
    except OSError as error:
        raise FolderNotWritable(f"{folder}: cannot be written ({error.strerror or error})") from None
    return folder.resolve()
