"""AReaL's nfs name-resolve records of one job, read where the record root is visible.

Every rpc_server registers `{user}/{experiment}/{trial}/workers/{role}/{index}` ->
`host:port` as one directory per name under the record root, the value in its `ENTRY`
file, written to `ENTRY.tmp.<id>` and renamed (areal/utils/name_resolve.py:286-326 at
AReaL cbff54d6). The default root is `/tmp/areal/name_resolve` (guard/app.py:523-526),
where anyone can plant a tree: an entry counts only when its `ENTRY` file is a regular
file owned by the job's user, opened without following links or blocking, read with a
size bound; the walk is bounded in entries and directories.

The console reads a root visible on its own machine with these functions, and a root
visible only on a cluster node through that node's agent (op `name_resolve`), which calls
the same ones. Standard library only (the node side runs on Python 3.9).
"""

from __future__ import annotations

import os
import pwd
import stat
from typing import Any

from areal_node.guarded_read import OWNER, TOO_LARGE, Refused, open_regular

DEFAULT_NFS_ROOT = "/tmp/areal/name_resolve"
ENTRY_FILE = "ENTRY"
MAX_VALUE_BYTES = 4096  # a value is `host:port`; anything longer is not AReaL's
MAX_ENTRIES = 100_000  # bound on one job's records (and on a listing)
MAX_DIRS = 4 * MAX_ENTRIES  # bound on the directories walked (a planted maze ends here)


class RootError(Exception):
    """The record root (or a directory under it) cannot be read: one line, why."""


def check_part(text: str, what: str) -> str:
    """One component of a job's name: never empty, `.`, `..`, a path or a NUL."""
    if not text or text in (".", "..") or "/" in text or "\0" in text:
        raise ValueError(f"bad {what} {text!r}")
    return text


def uid_of(user: str) -> int | None:
    try:
        return pwd.getpwnam(user).pw_uid
    except KeyError:
        return int(user) if user.isdigit() else None


def user_of(uid: int) -> str:
    try:
        return pwd.getpwuid(uid).pw_name
    except KeyError:
        return str(uid)


def check_root(root: str) -> bool:
    """True when `root` is a readable directory, False when it does not exist; a
    `RootError` when it is something else or cannot be read."""
    try:
        st = os.stat(root)
    except FileNotFoundError:
        return False
    except OSError as exc:
        raise RootError(f"cannot read name-resolve root {root}: {exc.strerror}") from None
    if not stat.S_ISDIR(st.st_mode):
        raise RootError(f"name-resolve root {root} is not a directory")
    if not os.access(root, os.R_OK | os.X_OK):
        raise RootError(f"cannot read name-resolve root {root}: permission denied")
    return True


def _list(path: str) -> list[os.DirEntry[str]]:
    try:
        with os.scandir(path) as it:
            return list(it)
    except (FileNotFoundError, NotADirectoryError):
        return []
    except OSError as exc:
        raise RootError(f"cannot read {path}: {exc.strerror}") from None


def read_job(root: str, user: str, experiment: str, trial: str) -> dict[str, Any]:
    """`{"entries": [{"key", "value", "owner"}], "refused": [why]}` of one job; the keys
    are the names (paths under `root`), the values stripped text."""
    entries: list[dict[str, Any]] = []
    refused: list[str] = []
    uid = uid_of(user)
    stack = [os.path.join(root, user, experiment, trial)]
    seen = dirs = 0
    while stack and seen < MAX_ENTRIES and dirs < MAX_DIRS:
        dirs += 1
        for item in _list(stack.pop()):
            if item.is_dir(follow_symlinks=False):  # never a link out of the root
                stack.append(item.path)
            elif item.name == ENTRY_FILE:
                seen += 1
                key = os.path.dirname(item.path)[len(root) + 1 :]
                value, why = _read_entry(item.path, uid, user)
                if why is not None:
                    refused.append(f"{key}: {why}")
                else:
                    entries.append({"key": key, "value": value, "owner": user})
    return {"entries": entries, "refused": refused}


def _read_entry(path: str, uid: int | None, user: str) -> tuple[str, str | None]:
    """(value, None) for a trusted ENTRY, ("", why) for one refused. Opened by the node's
    guarded reader: `user`'s regular file only (no one's where the user is unknown)."""
    try:
        with open_regular(path, () if uid is None else (uid,), MAX_VALUE_BYTES) as entry:
            data = entry.read()
    except OSError as exc:
        return "", f"cannot open ENTRY ({exc.strerror})"
    except Refused as exc:
        if exc.reason == OWNER and exc.st is not None:
            return "", f"ENTRY owned by {user_of(exc.st.st_uid)}, not {user}"
        if exc.reason == TOO_LARGE:
            return "", f"ENTRY larger than {MAX_VALUE_BYTES} bytes"
        return "", "ENTRY is not a regular file"
    return data.decode("utf-8", "replace").strip(), None


def trials(root: str, user: str) -> list[str]:
    """`experiment/trial` of every job of `user` under `root`."""
    out = []
    for exp in _list(os.path.join(root, user)):
        if exp.is_dir(follow_symlinks=False):
            out += [f"{exp.name}/{t.name}" for t in _list(exp.path) if t.is_dir()]
    return sorted(out)[:MAX_ENTRIES]


def users_with(root: str, experiment: str, trial: str) -> list[str]:
    """The users that have a job `experiment/trial` under `root`."""
    return sorted(
        u.name
        for u in _list(root)
        if u.is_dir(follow_symlinks=False)
        and os.path.isdir(os.path.join(u.path, experiment, trial))
    )


def lookup(root: str, user: str, experiment: str, trial: str) -> dict[str, Any]:
    """Everything the console needs about one job in one answer: its entries and
    refusals, and where it has none, the user's jobs and the users with that name."""
    for text, what in ((user, "user"), (experiment, "experiment"), (trial, "trial")):
        check_part(text, what)
    root = os.path.normpath(root)
    found: dict[str, Any] = {"root": root, "exists": check_root(root)}
    found.update(read_job(root, user, experiment, trial))
    if not found["entries"] and found["exists"]:
        found["trials"] = trials(root, user)
        found["users"] = users_with(root, experiment, trial)
    return found
