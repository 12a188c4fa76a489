"""Who is using the console: the login identity stored with each capture and replay.

On a shared account (everyone is root on the node, or works through sudo) the cache
holds everyone's captures and runs; the screens show the user's own first. The login
identity is `SUDO_USER` when sudo set it (the person behind `sudo -i`), else the login
name of the terminal, else the account's name.
"""

from __future__ import annotations

import os
import pwd


def login_user() -> str:
    """The person at the keyboard, as best the process can tell."""
    sudo = os.environ.get("SUDO_USER", "").strip()
    if sudo:
        return sudo
    try:
        return os.getlogin()
    except OSError:  # no controlling terminal (a cron job, a pipe, a test runner)
        pass
    for var in ("LOGNAME", "USER"):
        name = os.environ.get(var, "").strip()
        if name:
            return name
    try:
        return pwd.getpwuid(os.getuid()).pw_name
    except KeyError:
        return str(os.getuid())


def is_mine(user: str | None, me: str) -> bool:
    """Whether a record made by `user` belongs to `me` (records made before users were
    stored carry none: they stay visible to everyone)."""
    return user is None or user == me


class UserScope:
    """Whose captures and runs the screens list: the user's own (the default) or all."""

    def __init__(self, me: str | None = None, everyone: bool = False) -> None:
        self.me = me if me is not None else login_user()
        self.everyone = everyone

    def shows(self, user: str | None) -> bool:
        return self.everyone or is_mine(user, self.me)

    def toggle(self) -> str:
        """Switch, and say what is shown now."""
        self.everyone = not self.everyone
        return self.describe()

    def describe(self) -> str:
        return "every user's" if self.everyone else f"yours ({self.me})"
