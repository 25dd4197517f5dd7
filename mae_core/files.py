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


def read_yaml_mapping(path: Path, label: str, expected: str) -> dict:
    """The mapping in the YAML file ``path`` (an empty file is ``{}``); a missing file, bad YAML
    or another shape is a :class:`UserError` of one line that starts with ``label``."""
    import yaml

    if not path.is_file():
        raise UserError(f"{label}: no such file")
    try:
        content = yaml.safe_load(path.read_text())  # the safe loader: no code runs from a file
    except yaml.YAMLError as error:
        mark = getattr(error, "problem_mark", None)
        raise UserError(f"{label}: not valid YAML{f' (line {mark.line + 1})' if mark else ''}") from None
    if content is None:
        return {}
    if not isinstance(content, dict):
        raise UserError(f"{label}: expected {expected}, got {type(content).__name__}")
    return content
