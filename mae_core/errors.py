"""The one base class of errors a user causes and can fix (a key, a value, a path, a file).

The command line catches :class:`UserError` once: one line naming the problem, exit status 2,
no traceback. It is a ``ValueError`` so library callers that catch ``ValueError`` keep working.
Errors that are not the user's (a bug, a crashed process, a diverging run) are not UserErrors.
"""

from __future__ import annotations

from typing import Any, NamedTuple

from pydantic import ValidationError


class Problem(NamedTuple):
    """The first thing pydantic rejected: the dotted key, pydantic's error type, its message
    (without pydantic's "Value error, " prefix) and the value given."""
    key: str
    kind: str
    message: str
    value: Any


def first_problem(error: ValidationError) -> Problem:
    """What a one-line message about ``error`` needs (config keys and study files word it)."""
    first = error.errors()[0]
    return Problem(".".join(str(part) for part in first["loc"]), first["type"],
                   first["msg"].removeprefix("Value error, "), first.get("input"))


class UserError(ValueError):
    """Bad input: printed as one line, exit status 2."""


SHOWN_CHARS = 60  # the most of a user's value a one-line message repeats


def shown(value: Any, limit: int = SHOWN_CHARS) -> str:
    """``repr(value)`` for a one-line message, cut to about ``limit`` characters: a long value
    (a huge list, a YAML alias expanded a billion times) is never spelled out. ``reprlib``
    walks only as much of a nested value as it shows, so a shared or huge one costs nothing."""
    import reprlib

    short = reprlib.Repr()
    short.maxlevel, short.maxdict, short.maxlist, short.maxtuple, short.maxset = 3, 4, 6, 6, 6
    short.maxstring = short.maxother = short.maxlong = limit
    text = short.repr(value)
    return text if len(text) <= limit else text[:limit - 1] + "…"


def clipped(text: str, limit: int = SHOWN_CHARS) -> str:
    """``text`` as typed (no quotes), cut to ``limit`` characters for a one-line message."""
    text = str(text)
    return text if len(text) <= limit else text[:limit - 1] + "…"
