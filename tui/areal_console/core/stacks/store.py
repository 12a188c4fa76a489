"""Saved captures: one JSON file per capture under the data dir, written atomically."""

from __future__ import annotations

import contextlib
import json
import os
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from areal_console.core.common import locations
from areal_console.core.common.errors import UserError
from areal_console.core.common.textfmt import clip
from areal_console.core.stacks.codec import capture_from_json
from areal_console.core.stacks.parsing import gc_paused
from areal_console.core.stacks.records import StackCapture


def new_capture_id() -> str:
    # os.urandom, not `secrets`: the same bytes without importing hashlib/hmac at start.
    return time.strftime("%Y%m%d-%H%M%S", time.gmtime()) + "-" + os.urandom(2).hex()


def write_atomic(path: Path, text: str) -> None:
    """Write via a temp file in the same directory and `os.replace`: never a torn file."""
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".tmp", dir=path.parent)
    try:
        with os.fdopen(fd, "w", encoding="utf-8") as fh:
            fh.write(text)
            fh.flush()
            os.fsync(fh.fileno())
        os.replace(tmp, path)
    except BaseException:
        with contextlib.suppress(FileNotFoundError):
            os.unlink(tmp)
        raise


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
        doc = json.loads(path.read_text(encoding="utf-8"))
    except OSError as exc:
        raise ValueError(f"cannot read it: {exc.strerror or exc}") from None
    except ValueError as exc:  # bad JSON or not UTF-8
        raise ValueError(f"not JSON ({exc})") from None
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
    )


def scan_captures(directory: Path | None = None) -> tuple[list[SavedCapture], list[BadCapture]]:
    """Saved captures, newest first, and the files that are not captures (with why)."""
    directory = directory or locations.captures_dir()
    if not directory.is_dir():
        return [], []
    out: list[SavedCapture] = []
    bad: list[BadCapture] = []
    for path in sorted(directory.glob("*.json")):
        try:
            out.append(_summary(path))
        except ValueError as exc:
            bad.append(BadCapture(path, str(exc)))
    out.sort(key=lambda c: (c.captured_at, _written_ns(c.path), c.capture_id), reverse=True)
    return out, bad


def _written_ns(path: Path) -> int:
    """When the file was saved: orders captures taken within the same second."""
    try:
        return path.stat().st_mtime_ns
    except OSError:
        return 0


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
    try:
        capture = capture_from_json(doc)
    except (KeyError, TypeError, ValueError, AttributeError) as exc:
        raise UserError(f"{path} is not a valid stack capture ({clip(exc)})") from None
    capture.capture_id = capture.capture_id or path.stem
    return capture
