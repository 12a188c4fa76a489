"""Saved captures: one JSON file per capture under the data dir, written atomically."""

from __future__ import annotations

import contextlib
import json
import os
import secrets
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from areal_console.core import locations
from areal_console.core.errors import UserError
from areal_console.core.stacks.model import StackCapture, capture_from_json


def new_capture_id() -> str:
    return time.strftime("%Y%m%d-%H%M%S", time.gmtime()) + "-" + secrets.token_hex(2)


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


def save_capture(capture: StackCapture, directory: Path | None = None) -> Path:
    """Save `capture` (the `stacks --json` document) as `<id>.json`; returns the path."""
    from areal_console.core.stacks.report import capture_json

    if not capture.capture_id:
        capture.capture_id = new_capture_id()
    directory = directory or locations.captures_dir()
    path = directory / f"{capture.capture_id}.json"
    write_atomic(path, json.dumps(capture_json(capture), separators=(",", ":")))
    return path


@dataclass
class SavedCapture:
    capture_id: str
    path: Path
    captured_at: str
    ranks: int
    pattern: str
    title: str


def list_captures(directory: Path | None = None) -> list[SavedCapture]:
    """Saved captures, newest first; unreadable files are skipped."""
    directory = directory or locations.captures_dir()
    if not directory.is_dir():
        return []
    out = []
    for path in directory.glob("*.json"):
        try:
            doc: dict[str, Any] = json.loads(path.read_text(encoding="utf-8"))
        except (OSError, ValueError):
            continue
        diag = doc.get("diagnosis") or {}
        out.append(
            SavedCapture(
                capture_id=str(doc.get("id") or path.stem),
                path=path,
                captured_at=str(doc.get("captured_at") or ""),
                ranks=sum(1 for r in doc.get("ranks", []) if r.get("rank") is not None),
                pattern=str(diag.get("pattern") or "?"),
                title=str(diag.get("title") or ""),
            )
        )
    out.sort(key=lambda c: (c.captured_at, c.capture_id), reverse=True)
    return out


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
        doc = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError) as exc:
        raise UserError(f"cannot read capture {path}: {exc}") from None
    if not isinstance(doc, dict) or "ranks" not in doc:
        raise UserError(f"{path} is not a stack capture")
    capture = capture_from_json(doc)
    capture.capture_id = capture.capture_id or path.stem
    return capture
