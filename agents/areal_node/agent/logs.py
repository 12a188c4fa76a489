"""Following a training log (AReaL's main.log / trainer.log), finding a run's log files,
reading a text file."""

from __future__ import annotations

import errno
import os
import re
import stat
import time
from typing import TYPE_CHECKING, Any

from areal_node.agent.protocol import OpError, arg, op
from areal_node.guarded_read import OWNER, Refused, open_regular, resolve_links, user_name

if TYPE_CHECKING:
    from areal_node.agent.serve import Agent


TAIL_MAX_BYTES = 4 << 20
LOG_NAMES = ("main.log", "trainer.log", "merged.log")  # preferred first
EVENT_PREFIX = "events.out.tfevents."
# AReaL's perf tracer files: <log dir>/perf_tracer[/<role>]/traces-r{rank}.jsonl
# (areal/utils/perf_tracer.py:200-244, :143-145 at cbff54d).
PERF_TRACER_DIR = "perf_tracer"
PERF_TRACE_FILE = r"^traces-r(\d{1,6})\.jsonl$"
MAX_TRACE_FILES = 4096


def owner_uid(args: dict[str, Any]) -> int | None:
    """The `owner` argument (a user name or uid): the job's user, whose files alone are
    trusted; None when the console named none."""
    owner = args.get("owner")
    if owner is None:
        return None
    if isinstance(owner, int) and not isinstance(owner, bool) and owner >= 0:
        return owner
    if not isinstance(owner, str) or not owner:
        raise OpError("argument 'owner' must be a user name or uid")
    import pwd

    try:
        return pwd.getpwnam(owner).pw_uid
    except KeyError:
        raise OpError(f"no user {owner!r} on this node") from None


def trusted_path(path: str, owner: int | None) -> str:
    """`path` with its symlinks resolved, each one followed only when its owner is
    root, the agent's user or `owner` (a link planted by another user is not followed)."""
    try:
        return resolve_links(path, () if owner is None else (owner,))
    except Refused as exc:
        raise OpError(str(exc)) from None


def open_log(path: str, owner: int | None = None) -> int:
    """A descriptor of the regular file at `path`, opened without blocking (a FIFO in
    place of a log) and without following a final symlink; with `owner`, only a file
    that user owns. FileNotFoundError, IsADirectoryError, or OpError for the rest.
    Opened by `open_regular`, the node's guarded reader."""
    links_of = () if owner is None else (owner,)
    owners = None if owner is None else (owner,)
    try:
        return open_regular(path, owners, links_of=links_of).detach()
    except OSError as exc:
        if exc.errno == errno.ELOOP:  # swapped for a symlink since the links were resolved
            raise OpError(f"{path} is a symlink: not followed") from None
        raise
    except Refused as exc:
        if exc.st is not None and stat.S_ISDIR(exc.st.st_mode):
            raise IsADirectoryError(errno.EISDIR, "is a directory", path) from None
        if exc.reason == OWNER and owner is not None and exc.st is not None:
            raise OpError(f"{path} is owned by {user_name(exc.st.st_uid)}, not by the job's "
                          f"user {user_name(owner)}: not trusted") from None  # fmt: skip
        raise OpError(str(exc)) from None


def read_chunk(
    path: str, offset: int, ident: str | None, max_bytes: int, owner: int | None = None
) -> dict[str, Any]:
    """Bytes of `path` from `offset`, at most `max_bytes`; never the whole file again.

    `ident` ("dev:inode" from the previous call) detects rotation: a different file under
    the same name is read from its start, as is a file that shrank (truncated). The caller
    keeps `ident` and `next` for its next call. The file is opened as `open_log` does.
    """
    try:
        fh = os.fdopen(open_log(path, owner), "rb")
    except FileNotFoundError:
        return {"exists": False, "now": time.time()}
    with fh:
        st = os.fstat(fh.fileno())
        current = f"{st.st_dev}:{st.st_ino}"
        rotated = ident is not None and ident != current
        truncated = not rotated and st.st_size < offset
        if rotated or truncated or offset < 0:
            offset = 0
        fh.seek(offset)
        data = fh.read(max(0, min(max_bytes, st.st_size - offset)))
    return {
        "exists": True,
        "ident": current,
        "offset": offset,
        "next": offset + len(data),
        "size": st.st_size,
        "mtime": st.st_mtime,
        "rotated": rotated,
        "truncated": truncated,
        "eof": offset + len(data) >= st.st_size,
        "now": time.time(),
        "utc_offset": int(time.localtime().tm_gmtoff),
        "data": data,
    }


@op("file_tail")
def op_file_tail(agent: Agent, args: dict[str, Any]) -> dict[str, Any]:
    """Follow a file: the bytes after `offset` (zlib + base64 in `data`), bounded by `max_bytes`."""
    import base64
    import zlib

    path = os.path.expanduser(arg(args, "path", str, ""))
    ident = args.get("ident")
    if ident is not None and not isinstance(ident, str):
        raise OpError("argument 'ident' must be a string or null")
    limit = max(1, min(arg(args, "max_bytes", int, TAIL_MAX_BYTES), 64 << 20))
    try:
        result = read_chunk(path, arg(args, "offset", int, 0), ident, limit, owner_uid(args))
    except IsADirectoryError:
        raise OpError(f"{path} is a directory on this node, not a log file") from None
    except OSError as exc:
        raise OpError(f"cannot read {path}: {exc.strerror}") from None
    if not result["exists"]:
        raise OpError(f"no such file on this node: {path}")
    result["data"] = base64.b64encode(zlib.compress(result["data"], 1)).decode()
    result["path"] = path
    return result


def find_logs(
    path: str, max_depth: int = 3, limit: int = 64, owner: int | None = None
) -> dict[str, Any]:
    """A run's log files and tensorboard event files at `path` (a file or a directory).

    Symlinks are followed only when `trusted_path` trusts them; with `owner`, only files
    that user owns are listed (another user's file planted in a run's directory is not)."""
    path = os.path.normpath(os.path.expanduser(path))
    trusted_path(path, owner)
    if os.path.isfile(path):
        is_events = os.path.basename(path).startswith(EVENT_PREFIX)
        traces = [] if is_events else find_traces(os.path.dirname(path), owner)
        return {"path": path, "kind": "file", "logs": [] if is_events else [path],
                "events": [path] if is_events else [], "traces": traces}  # fmt: skip
    if not os.path.isdir(path):
        if os.path.exists(path):
            raise OpError(f"{path} is not a regular file or directory")
        raise OpError(f"no such file or directory on this node: {path}")
    logs: list[str] = []
    events: list[str] = []
    base_depth = path.rstrip(os.sep).count(os.sep)
    for root, dirs, files in os.walk(path):
        if root.count(os.sep) - base_depth >= max_depth:
            dirs[:] = []
        dirs.sort()
        for name in sorted(files):
            full = os.path.join(root, name)
            if not _owned_file(full, owner):
                continue
            if name.startswith(EVENT_PREFIX) and len(events) < limit:
                events.append(full)
            elif root == path and name.endswith(".log"):
                logs.append(full)
    rank = {name: i for i, name in enumerate(LOG_NAMES)}
    logs.sort(key=lambda p: (rank.get(os.path.basename(p), len(LOG_NAMES)), p))
    return {"path": path, "kind": "dir", "logs": logs, "events": events,
            "traces": find_traces(path, owner)}  # fmt: skip


def find_traces(log_dir: str, owner: int | None = None) -> list[dict[str, Any]]:
    """The run's perf tracer files, `{"path", "role", "rank"}` (role None: no role folder);
    at most MAX_TRACE_FILES, only regular files (with `owner`: that user's)."""
    pattern = re.compile(PERF_TRACE_FILE)
    out: list[dict[str, Any]] = []
    top = os.path.join(log_dir, PERF_TRACER_DIR)
    try:
        entries = sorted(os.scandir(top), key=lambda e: e.name)[:MAX_TRACE_FILES]
    except OSError:
        return out
    for entry in entries:
        m = pattern.match(entry.name)
        if m:
            if _owned_file(entry.path, owner):
                out.append({"path": entry.path, "role": None, "rank": int(m.group(1))})
        elif entry.is_dir(follow_symlinks=False):
            try:
                inner = sorted(os.scandir(entry.path), key=lambda e: e.name)[:MAX_TRACE_FILES]
            except OSError:
                continue
            for sub in inner:
                m = pattern.match(sub.name)
                if m and _owned_file(sub.path, owner):
                    out.append({"path": sub.path, "role": entry.name[:200],
                                "rank": int(m.group(1))})  # fmt: skip
        if len(out) >= MAX_TRACE_FILES:
            break
    return out[:MAX_TRACE_FILES]


def _owned_file(path: str, owner: int | None) -> bool:
    """A regular file (not a symlink, FIFO...) and, with `owner`, that user's."""
    try:
        st = os.lstat(path)
    except OSError:
        return False
    return stat.S_ISREG(st.st_mode) and (owner is None or st.st_uid == owner)


@op("log_find")
def op_log_find(agent: Agent, args: dict[str, Any]) -> dict[str, Any]:
    """Where a run logs: `main.log`, `trainer.log`, `merged.log`, other `*.log`, event files."""
    return find_logs(arg(args, "path", str, ""), owner=owner_uid(args))


@op("file_read")
def op_file_read(agent: Agent, args: dict[str, Any]) -> dict[str, Any]:
    """A text file (metrics JSONL and the like), at most `max_bytes` from its start."""
    path = os.path.expanduser(arg(args, "path", str, ""))
    limit = max(0, min(arg(args, "max_bytes", int, 4 << 20), 64 << 20))
    try:
        with os.fdopen(open_log(path, owner_uid(args)), "rb") as fh:
            data = fh.read(limit + 1)
    except IsADirectoryError:
        raise OpError(f"{path} is a directory on this node, not a file") from None
    except FileNotFoundError:
        raise OpError(f"no such file on this node: {path}") from None
    except OSError as exc:
        raise OpError(f"cannot read {path}: {exc.strerror}") from None
    return {
        "path": path,
        "text": data[:limit].decode(errors="replace"),
        "truncated": len(data) > limit,
    }
