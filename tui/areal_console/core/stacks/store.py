"""Saved captures: one JSON file per capture under the data dir, written atomically."""

from __future__ import annotations

import contextlib
import json
import os
import stat
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from areal_console.core.common import locations, private_files
from areal_console.core.common.errors import UserError
from areal_console.core.common.textfmt import clip
from areal_console.core.stacks.parsing import gc_paused
from areal_console.core.stacks.records import StackCapture


def new_capture_id() -> str:
    # os.urandom, not `secrets`: the same bytes without importing hashlib/hmac at start.
    return time.strftime("%Y%m%d-%H%M%S", time.gmtime()) + "-" + os.urandom(2).hex()


def write_atomic(path: Path, text: str) -> None:
    """Write whole, on disk, in a private folder (`private_files.replace`): never torn."""
    private_files.replace(path, text, durable=True)


def save_capture(
    capture: StackCapture, directory: Path | None = None, doc: dict[str, Any] | None = None
) -> Path:
    """Save `capture` (the `stacks --json` document) as `<id>.json`; returns the path.

    `doc` is that document when the caller has it already (made from its analysis): the
    capture is then not analysed again for the file. Its `id` is the capture's."""
    from areal_console.core.stacks.report import capture_json, compact_json

    if not capture.capture_id:
        capture.capture_id = new_capture_id()
    if doc is None:
        doc = capture_json(capture)
    else:
        doc["id"] = capture.capture_id
    directory = directory or locations.captures_dir()
    path = directory / f"{capture.capture_id}.json"
    write_atomic(path, compact_json(doc))
    with contextlib.suppress(ValueError):
        _remember(path, summary_of(doc, path))
    return path


@dataclass
class SavedCapture:
    capture_id: str
    path: Path
    captured_at: str
    ranks: int
    pattern: str
    title: str
    user: str | None = None  # who took it; None: a capture saved before users were stored
    tags: tuple[str, ...] = ()  # what took it, when not a person: "watch"
    report: str | None = None  # the report `watch` wrote beside it (its evidence folder)


@dataclass
class BadCapture:
    """A file in the captures directory that is not a readable capture, and why."""

    path: Path
    error: str


def _summary(path: Path) -> SavedCapture:
    """One saved capture's list entry; `ValueError` saying why when the file is not one."""
    if not path.is_file():  # a FIFO or a directory named *.json must not hang or crash us
        raise ValueError("not a regular file")
    try:
        with gc_paused():
            doc = json.loads(path.read_bytes())
    except OSError as exc:
        raise ValueError(f"cannot read it: {exc.strerror or exc}") from None
    except ValueError as exc:  # bad JSON or not UTF-8
        raise ValueError(f"not JSON ({exc})") from None
    return summary_of(doc, path)


def summary_of(doc: Any, path: Path) -> SavedCapture:
    """The list entry of the capture document `doc` saved at `path`; `ValueError` when it
    is not a capture."""
    ranks = doc.get("ranks") if isinstance(doc, dict) else None
    if not isinstance(ranks, list) or not all(isinstance(r, dict) for r in ranks):
        raise ValueError("not a stack capture (no list of ranks)")
    diag = doc.get("diagnosis") if isinstance(doc.get("diagnosis"), dict) else {}
    return SavedCapture(
        capture_id=str(doc.get("id") or path.stem),
        path=path,
        captured_at=str(doc.get("captured_at") or ""),
        ranks=sum(1 for r in ranks if r.get("rank") is not None),
        pattern=str(diag.get("pattern") or "?"),
        title=str(diag.get("title") or ""),
        user=doc["user"] if isinstance(doc.get("user"), str) else None,
        tags=_tags(doc.get("tags")),
        report=_watch_path(doc.get("watch"), "report"),
    )


def _watch_path(value: object, key: str) -> str | None:
    """The evidence folder or report path a watch recorded in its capture (an absolute
    path, or None)."""
    report = value.get(key) if isinstance(value, dict) else None
    if not isinstance(report, str) or not report.startswith("/") or len(report) > 4096:
        return None
    return None if "\0" in report else report


def _tags(value: object) -> tuple[str, ...]:
    """A capture's tags: short words only (the file may come from anywhere)."""
    if not isinstance(value, list):
        return ()
    return tuple(t for t in value[:8] if isinstance(t, str) and t.isidentifier() and len(t) <= 32)


# The list of saved captures is kept in an index beside them, so listing, `--open latest`
# and the palette read a small file instead of parsing every capture (a 4,096-rank capture
# is ~50 MB). Each entry is trusted only for the exact file it was made from (same size,
# modification time and inode); any other file is read again and the index rewritten. An
# index that is missing, stale, too large, not JSON or of the wrong shape is ignored:
# every entry is checked field by field, and a wrong one only costs that file's reading.
INDEX_NAME = ".index"
INDEX_VERSION = 2  # 2: entries carry a capture's tags and watch report
MAX_INDEX_BYTES = 16 << 20
_ENTRY_TEXT = ("id", "captured_at", "pattern", "title")


@dataclass(frozen=True)
class _Stamp:
    """What identifies one version of a file: a rewrite changes at least one."""

    size: int
    mtime_ns: int
    inode: int

    @classmethod
    def of(cls, st: os.stat_result) -> _Stamp:
        return cls(st.st_size, st.st_mtime_ns, st.st_ino)

    def to_json(self) -> list[int]:
        return [self.size, self.mtime_ns, self.inode]


def _read_index(directory: Path) -> dict[str, dict[str, Any]]:
    """The index's entries by file name ({} when there is no usable index)."""
    try:
        # Non-blocking, and only a regular file: a FIFO planted there must not hang us.
        fd = os.open(directory / INDEX_NAME, os.O_RDONLY | os.O_NONBLOCK)
        with os.fdopen(fd, "rb") as fh:
            if not stat.S_ISREG(os.fstat(fh.fileno()).st_mode):
                return {}
            data = fh.read(MAX_INDEX_BYTES + 1)
        if len(data) > MAX_INDEX_BYTES:
            return {}
        doc = json.loads(data)
    except (OSError, ValueError, RecursionError):
        return {}
    if not isinstance(doc, dict) or doc.get("version") != INDEX_VERSION:
        return {}
    entries = doc.get("files")
    if not isinstance(entries, dict):
        return {}
    return {k: v for k, v in entries.items() if isinstance(k, str) and isinstance(v, dict)}


def _entry_matches(entry: dict[str, Any], stamp: _Stamp) -> bool:
    made_from = entry.get("stamp")
    return isinstance(made_from, list) and made_from == stamp.to_json()


def _from_entry(entry: dict[str, Any], path: Path) -> SavedCapture | BadCapture | None:
    """The list entry an index entry holds; None when it is not well formed."""
    error = entry.get("error")
    if isinstance(error, str):
        return BadCapture(path, error)
    if not all(isinstance(entry.get(k), str) for k in _ENTRY_TEXT):
        return None
    ranks, user = entry.get("ranks"), entry.get("user")
    if type(ranks) is not int or ranks < 0 or not (user is None or isinstance(user, str)):
        return None
    return SavedCapture(
        capture_id=entry["id"],
        path=path,
        captured_at=entry["captured_at"],
        ranks=ranks,
        pattern=entry["pattern"],
        title=entry["title"],
        user=user,
        tags=_tags(entry.get("tags")),
        report=_watch_path({"report": entry.get("report")}, "report"),
    )


def _to_entry(found: SavedCapture | BadCapture, stamp: _Stamp) -> dict[str, Any]:
    if isinstance(found, BadCapture):
        return {"stamp": stamp.to_json(), "error": found.error}
    return {
        "stamp": stamp.to_json(),
        "id": found.capture_id,
        "captured_at": found.captured_at,
        "ranks": found.ranks,
        "pattern": found.pattern,
        "title": found.title,
        "user": found.user,
        "tags": list(found.tags),
        "report": found.report,
    }


def _write_index(directory: Path, entries: dict[str, dict[str, Any]]) -> None:
    """Best effort: a directory we cannot write (another user's) is read in full next time."""
    with contextlib.suppress(OSError):
        write_atomic(
            directory / INDEX_NAME,
            json.dumps({"version": INDEX_VERSION, "files": entries}, separators=(",", ":")),
        )


def _remember(path: Path, summary: SavedCapture) -> None:
    """Put a capture just written into the index (so the next list need not read it)."""
    try:
        stamp = _Stamp.of(path.stat())
    except OSError:
        return
    entries = _read_index(path.parent)
    entries[path.name] = _to_entry(summary, stamp)
    _write_index(path.parent, entries)


def scan_captures(directory: Path | None = None) -> tuple[list[SavedCapture], list[BadCapture]]:
    """Saved captures, newest first, and the files that are not captures (with why)."""
    directory = directory or locations.captures_dir()
    if not directory.is_dir():
        return [], []
    index = _read_index(directory)
    entries: dict[str, dict[str, Any]] = {}
    written: dict[Path, int] = {}
    out: list[SavedCapture] = []
    bad: list[BadCapture] = []
    for path in sorted(directory.glob("*.json")):
        try:
            st = path.stat()
        except OSError as exc:
            bad.append(BadCapture(path, f"cannot read it: {exc.strerror or exc}"))
            continue
        stamp = _Stamp.of(st)
        entry = index.get(path.name)
        found = _from_entry(entry, path) if entry and _entry_matches(entry, stamp) else None
        if found is None:
            try:
                found = _summary(path)
            except ValueError as exc:
                found = BadCapture(path, str(exc))
        if stat.S_ISREG(st.st_mode):  # a FIFO is said again each time, never remembered
            entries[path.name] = _to_entry(found, stamp)
        if isinstance(found, BadCapture):
            bad.append(found)
        else:
            out.append(found)
            written[path] = st.st_mtime_ns
    if entries != index:
        _write_index(directory, entries)
    out.sort(key=lambda c: (c.captured_at, written.get(c.path, 0), c.capture_id), reverse=True)
    return out, bad


def list_captures(directory: Path | None = None) -> list[SavedCapture]:
    """Saved captures, newest first; files that are not captures are left out."""
    return scan_captures(directory)[0]


def resolve_capture(ref: str, directory: Path | None = None) -> Path:
    """A saved capture by path, id, or unique id prefix ("latest" for the newest)."""
    as_path = Path(ref)
    if as_path.suffix == ".json" and as_path.is_file():
        return as_path
    saved = list_captures(directory)
    if ref == "latest":
        if not saved:
            raise UserError("no saved captures yet: run `areal-console stacks` first")
        return saved[0].path
    exact = [c for c in saved if c.capture_id == ref]
    if exact:
        return exact[0].path
    prefixed = [c for c in saved if c.capture_id.startswith(ref)]
    if len(prefixed) == 1:
        return prefixed[0].path
    if prefixed:
        raise UserError(f"capture id {ref!r} is ambiguous: {len(prefixed)} captures match")
    raise UserError(f"no saved capture {ref!r} (see `areal-console stacks --list`)")


def load_capture(ref: str, directory: Path | None = None) -> StackCapture:
    path = resolve_capture(ref, directory)
    try:
        with gc_paused():  # a 4,096-rank capture is ~600,000 small dicts and no cycle
            doc = json.loads(path.read_bytes())
    except (OSError, ValueError) as exc:
        raise UserError(f"cannot read capture {path}: {exc}") from None
    if not isinstance(doc, dict) or not isinstance(doc.get("ranks"), list):
        raise UserError(f"{path} is not a stack capture")
    from areal_console.core.stacks.codec import capture_from_json  # reading back only

    try:
        capture = capture_from_json(doc)
    except (KeyError, TypeError, ValueError, AttributeError) as exc:
        raise UserError(f"{path} is not a valid stack capture ({clip(exc)})") from None
    capture.capture_id = capture.capture_id or path.stem
    capture.tags = _tags(doc.get("tags"))
    watch = doc.get("watch")
    capture.watch_evidence = _watch_path(watch, "evidence")
    capture.watch_report = _watch_path(watch, "report")
    return capture
