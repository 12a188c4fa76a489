"""Errors a user can cause or fix. The CLI prints them as one line, never a traceback."""

from __future__ import annotations


class UserError(Exception):
    """Bad input or an environment problem the user can fix; exit code 1."""


class UsageError(UserError):
    """The command line itself is wrong; exit code 2."""


EXIT_OK = 0
EXIT_ERROR = 1
EXIT_USAGE = 2
EXIT_PARTIAL = 3
