"""Small file-system guards shared by the CLI and the report writer."""

from __future__ import annotations

import functools
from pathlib import Path

from .errors import UserError


# A study's name is a folder under --out and an MLflow tag: letters, digits, '_', '-' and '.',
# not starting with '.' (no '..', no hidden folder). One pattern for every source of a name: a
# study file's ``name:``, a file's stem, run, report (--paper too), evaluate and new-study
# (studies.study.check_study_name).
STUDY_NAME = r"[A-Za-z0-9_-][A-Za-z0-9_.-]*"
NAME_RULE = "letters, digits, '_', '-' and '.' (not first)"


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


MAX_YAML_BYTES = 1 << 20  # a config or study file is written by hand: a megabyte is far beyond one
MAX_YAML_VALUES = 100_000  # values a YAML file may stand for with every alias (*name) written out


def read_yaml_mapping(path: Path, label: str, expected: str) -> dict:
    """The mapping in the YAML file ``path`` (an empty file is ``{}``); a missing file, bad YAML
    or another shape is a :class:`UserError` of one line that starts with ``label``.

    Read within limits, before anything is allocated for it: at most :data:`MAX_YAML_BYTES`, and
    at most :data:`MAX_YAML_VALUES` values once its aliases are expanded (a "billion laughs" file
    of a few hundred bytes stands for 10⁹ values; an alias inside its own anchor, for infinitely many)."""
    import yaml

    if not path.is_file():
        raise UserError(f"{label}: no such file")
    if path.stat().st_size > MAX_YAML_BYTES:
        raise UserError(f"{label}: {path.stat().st_size} bytes; a YAML file here is at most {MAX_YAML_BYTES} bytes")
    try:
        content = yaml.load(path.read_text(), Loader=_bounded_loader())  # noqa: S506 (a SafeLoader: no code runs)
    except UnicodeDecodeError:
        raise UserError(f"{label}: not UTF-8 text (a YAML file is text)") from None
    except RecursionError:
        raise UserError(f"{label}: nested too deeply to be a config or study file") from None
    except _TooLarge as error:
        raise UserError(f"{label}: {error}") from None
    except yaml.YAMLError as error:
        mark = getattr(error, "problem_mark", None)
        raise UserError(f"{label}: not valid YAML{f' (line {mark.line + 1})' if mark else ''}") from None
    if content is None:
        return {}
    if not isinstance(content, dict):
        raise UserError(f"{label}: expected {expected}, got {type(content).__name__}")
    return content


class _TooLarge(ValueError):
    """A YAML document that stands for too many values once its aliases are expanded."""


@functools.cache
def _bounded_loader():
    import yaml

    class BoundedLoader(yaml.SafeLoader):
        """The safe loader (no code runs from a file) that refuses a document whose aliases
        expand to more than :data:`MAX_YAML_VALUES` values, before any Python object is built."""

        def get_single_node(self):
            node = super().get_single_node()
            if node is not None:
                expanded_values(node, MAX_YAML_VALUES)
            return node

    return BoundedLoader


def expanded_values(root, limit: int) -> int:
    """How many values the YAML node ``root`` stands for with every alias written out (an alias
    is the same node object as its anchor: counted once per use, computed once per node).
    Raises _TooLarge past ``limit``, or for an alias inside its own anchor (a cycle)."""
    sizes: dict[int, int] = {}
    open_nodes: set[int] = set()  # entered, not yet summed: the path from the root
    stack = [(root, False)]
    while stack:
        node, summed = stack.pop()
        children = _children(node)
        if summed:
            sizes[id(node)] = 1 + sum(sizes[id(child)] for child in children)
            open_nodes.discard(id(node))
            if sizes[id(node)] > limit:
                raise _TooLarge(f"its aliases (*name) expand to more than {limit} values; "
                                "write the values out, or use fewer aliases")
            continue
        if id(node) in sizes:
            continue
        if id(node) in open_nodes:
            raise _TooLarge("an alias (*name) inside its own anchor (&name) stands for endless values")
        open_nodes.add(id(node))
        stack.append((node, True))
        stack.extend((child, False) for child in children if id(child) not in sizes)
    return sizes[id(root)]


def _children(node) -> list:
    """A mapping node's keys and values, a sequence node's items, a scalar's nothing."""
    import yaml

    if isinstance(node, yaml.MappingNode):
        return [part for pair in node.value for part in pair]
    if isinstance(node, yaml.SequenceNode):
        return list(node.value)
    return []
