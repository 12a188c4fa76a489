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
