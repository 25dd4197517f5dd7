"""The one base class of errors a user causes and can fix (a key, a value, a path, a file).

The command line catches :class:`UserError` once: one line naming the problem, exit status 2,
no traceback. It is a ``ValueError`` so library callers that catch ``ValueError`` keep working.
Errors that are not the user's (a bug, a crashed process, a diverging run) are not UserErrors.
"""


class UserError(ValueError):
    """Bad input: printed as one line, exit status 2."""
