"""py-spy beside the job's interpreter, for a node with none on the agent's PATH.

Users `pip install py-spy` where torch is: the job's venv. Its `bin/` is found from the
rank's own `argv[0]` (torchrun starts workers with `sys.executable`, the venv's
`bin/python`), its `VIRTUAL_ENV`, and the directory of `/proc/PID/exe` (the interpreter
after symlinks; unreadable for another user's process without CAP_SYS_PTRACE, so never
the only place looked). A program found there is run only when it and every directory
above it belong to root or the agent's user and no one else may write them (a sticky
directory such as /tmp excepted: no one may replace what others own in it). Otherwise
it is named with the reason, never run: the agent may be root, the venv anyone's.
"""

from __future__ import annotations

import os
import stat

PROGRAM = "py-spy"


def untrusted_reason(path: str) -> str | None:
    """Why the program at `path` must not be run (None: it may). Checks the file the
    path resolves to and every directory above it, and every step of the path as given
    (a link in a directory someone else may write could be swapped)."""
    given = os.path.normpath(path)
    real = os.path.realpath(path)
    owners = {0, os.getuid()}
    for item in dict.fromkeys([given, *_parents(given), real, *_parents(real)]):
        try:
            st = os.lstat(item)
        except OSError as exc:
            return f"{item}: {exc.strerror or exc}"
        if item == real and not stat.S_ISREG(st.st_mode):
            return f"{item} is not a regular file"
        if st.st_uid not in owners:
            return f"{item} is owned by uid {st.st_uid}, not root or this agent's user"
        if stat.S_ISLNK(st.st_mode):
            continue  # a link's own mode means nothing; its directory is checked
        sticky_dir = stat.S_ISDIR(st.st_mode) and st.st_mode & stat.S_ISVTX
        if st.st_mode & 0o022 and not sticky_dir:
            return f"{item} is writable by others (mode {stat.S_IMODE(st.st_mode):o})"
    if not os.access(real, os.X_OK):
        return f"{real} is not executable"
    return None


def _parents(path: str) -> list[str]:
    out: list[str] = []
    while True:
        parent = os.path.dirname(path)
        if parent == path:
            return out
        out.append(parent)
        path = parent


def job_bin_dirs(pid: int) -> list[str]:
    """Where the rank's own Python lives: its argv[0]'s directory (when a path), its
    VIRTUAL_ENV's bin/, the directory of /proc/PID/exe; each readable part only."""
    from areal_node.agent.procfs import parse_environ, read_all

    dirs = []
    try:
        argv0 = read_all(f"/proc/{pid}/cmdline").split(b"\0", 1)[0].decode("utf-8", "replace")
        if argv0.startswith("/"):
            dirs.append(os.path.dirname(argv0))
    except OSError:
        pass
    try:
        venv = parse_environ(read_all(f"/proc/{pid}/environ"), ("VIRTUAL_ENV",))
        if venv.get("VIRTUAL_ENV", "").startswith("/"):
            dirs.append(os.path.join(venv["VIRTUAL_ENV"], "bin"))
    except OSError:
        pass
    try:
        dirs.append(os.path.dirname(os.readlink(f"/proc/{pid}/exe")))
    except OSError:
        pass
    return list(dict.fromkeys(os.path.normpath(d) for d in dirs if len(d) < 4096))


def pyspy_beside(pid: int) -> tuple[str | None, str]:
    """(the py-spy in the job's own bin/ to run, "") or (None, why none was run: the
    files found and why each was refused; "" when there is none)."""
    refused = []
    for directory in job_bin_dirs(pid):
        path = os.path.join(directory, PROGRAM)
        if not os.path.lexists(path):
            continue
        why = untrusted_reason(path)
        if why is None:
            return os.path.realpath(path), ""
        refused.append(f"{path} not run: {why}")
    return None, "; ".join(refused)
