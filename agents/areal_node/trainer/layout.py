"""The dump directory's layout: AReaL's step files, the checkpoints and metadata beside them."""

from __future__ import annotations

import contextlib
import json
import os
import re
from typing import Any

from areal_node.constants import CHECKPOINT_DIR, DUMP_FILE, META_FILE, dump_name


def dump_path(directory: str, step: int, dp_rank: int | None) -> str:
    return os.path.join(directory, dump_name(step, dp_rank))


def checkpoint_path(directory: str, step: int) -> str:
    return os.path.join(directory, CHECKPOINT_DIR, f"ckpt_{step:06d}.pt")


def scan_dumps(directory: str) -> dict[int, set[int | None]]:
    """step -> the dp ranks present (None for a file without a `_dp_` suffix)."""
    found: dict[int, set[int | None]] = {}
    try:
        names = os.listdir(directory)
    except OSError:
        return found
    for name in names:
        m = DUMP_FILE.match(name)
        if m:
            found.setdefault(int(m.group(1)), set()).add(
                int(m.group(2)) if m.group(2) is not None else None
            )
    return found


def scan_checkpoints(directory: str) -> list[int]:
    try:
        names = os.listdir(os.path.join(directory, CHECKPOINT_DIR))
    except OSError:
        return []
    return sorted(int(n[5:-3]) for n in names if re.fullmatch(r"ckpt_\d+\.pt", n))


def format_steps(steps: list[int]) -> str:
    """Compact ranges: [1, 2, 3, 5] -> "1-3,5"."""
    runs: list[list[int]] = []
    for s in sorted(set(steps)):
        if runs and s == runs[-1][1] + 1:
            runs[-1][1] = s
        else:
            runs.append([s, s])
    return ",".join(str(a) if a == b else f"{a}-{b}" for a, b in runs) or "none"


def read_meta(directory: str) -> dict[str, Any]:
    try:
        with open(os.path.join(directory, META_FILE), encoding="utf-8") as fh:
            data = json.load(fh)
    except (OSError, ValueError):
        return {}
    return data if isinstance(data, dict) else {}


def rotate_dumps(directory: str, dp_rank: int | None, max_keep: int, pin: set[int]) -> None:
    """Keep the newest `max_keep` unpinned dumps of this rank (AReaL's rotation rule)."""
    mine = sorted(
        step
        for step, ranks in scan_dumps(directory).items()
        if dp_rank in ranks and step not in pin
    )
    for step in mine[: max(0, len(mine) - max_keep)]:
        doomed = [dump_path(directory, step, dp_rank)]
        if dp_rank in (None, 0):
            doomed.append(checkpoint_path(directory, step))  # rank 0 owns checkpoints
        for path in doomed:
            with contextlib.suppress(FileNotFoundError):  # another rank rotated it first
                os.remove(path)
