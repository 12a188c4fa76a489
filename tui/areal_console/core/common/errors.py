"""Errors a user can cause or fix. The CLI prints them as one line, never a traceback."""

from __future__ import annotations


class UserError(Exception):
    """Bad input or an environment problem the user can fix; exit code 1."""


class UsageError(UserError):
    """The command line itself is wrong; exit code 2."""


class ChoiceError(UsageError):
    """A choice the user has to make (several jobs, none picked): one line, then the
    `choices` to pick from, each printed on a line of its own."""

    def __init__(self, message: str, choices: list[str]) -> None:
        super().__init__(message)
        self.choices = choices


EXIT_OK = 0
EXIT_ERROR = 1
EXIT_USAGE = 2
EXIT_PARTIAL = 3
