"""Following a training log (AReaL's main.log / trainer.log), finding a run's log files,
reading a text file."""

from __future__ import annotations

import os
import time
from typing import TYPE_CHECKING, Any

from areal_node.agent.protocol import OpError, arg, op

if TYPE_CHECKING:
    from areal_node.agent.serve import Agent


TAIL_MAX_BYTES = 4 << 20
LOG_NAMES = ("main.log", "trainer.log", "merged.log")  # preferred first
EVENT_PREFIX = "events.out.tfevents."


def read_chunk(path: str, offset: int, ident: str | None, max_bytes: int) -> dict[str, Any]:
    """Bytes of `path` from `offset`, at most `max_bytes`; never the whole file again.

    `ident` ("dev:inode" from the previous call) detects rotation: a different file under
    the same name is read from its start, as is a file that shrank (truncated). The caller
    keeps `ident` and `next` for its next call.
    """
    try:
        fh = open(path, "rb")  # noqa: SIM115 (closed by the with below)
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
        result = read_chunk(path, arg(args, "offset", int, 0), ident, limit)
    except IsADirectoryError:
        raise OpError(f"{path} is a directory on this node, not a log file") from None
    except OSError as exc:
        raise OpError(f"cannot read {path}: {exc.strerror}") from None
    if not result["exists"]:
        raise OpError(f"no such file on this node: {path}")
    result["data"] = base64.b64encode(zlib.compress(result["data"], 1)).decode()
    result["path"] = path
    return result


def find_logs(path: str, max_depth: int = 3, limit: int = 64) -> dict[str, Any]:
    """A run's log files and tensorboard event files at `path` (a file or a directory)."""
    path = os.path.normpath(os.path.expanduser(path))
    if os.path.isfile(path):
        is_events = os.path.basename(path).startswith(EVENT_PREFIX)
        return {"path": path, "kind": "file", "logs": [] if is_events else [path],
                "events": [path] if is_events else []}  # fmt: skip
    if not os.path.isdir(path):
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
            if name.startswith(EVENT_PREFIX) and len(events) < limit:
                events.append(full)
            elif root == path and name.endswith(".log"):
                logs.append(full)
    rank = {name: i for i, name in enumerate(LOG_NAMES)}
    logs.sort(key=lambda p: (rank.get(os.path.basename(p), len(LOG_NAMES)), p))
    return {"path": path, "kind": "dir", "logs": logs, "events": events}


@op("log_find")
def op_log_find(agent: Agent, args: dict[str, Any]) -> dict[str, Any]:
    """Where a run logs: `main.log`, `trainer.log`, `merged.log`, other `*.log`, event files."""
    return find_logs(arg(args, "path", str, ""))


@op("file_read")
def op_file_read(agent: Agent, args: dict[str, Any]) -> dict[str, Any]:
    """A text file (metrics JSONL and the like), at most `max_bytes` from its start."""
    path = os.path.expanduser(arg(args, "path", str, ""))
    limit = arg(args, "max_bytes", int, 4 << 20)
    try:
        with open(path, "rb") as fh:
            data = fh.read(limit + 1)
    except FileNotFoundError:
        raise OpError(f"no such file on this node: {path}") from None
    except OSError as exc:
        raise OpError(f"cannot read {path}: {exc.strerror}") from None
    return {
        "path": path,
        "text": data[:limit].decode(errors="replace"),
        "truncated": len(data) > limit,
    }
