"""Plain `py-spy dump` text (pasted, or written by a shell loop) into a `StackCapture`.

Accepted, in any mix:
- one `py-spy dump --pid P` per file (`Process P: CMDLINE`, `Python v...`, then `Thread T
  (idle): "Name"` and one indented `function (file:line)` per frame, leaf first; `--locals`
  blocks are skipped);
- the loop from AReaL's debugging guide, `echo "========== PID $pid =========="; py-spy
  dump --pid $pid` for every process, in one file (errors such as a shell wrapper's
  "Failed to find python version" become that process's error);
- stacks as the guide prints them: `# Rank 0` comment headers, `Thread: "MainThread"`,
  frames without line numbers, `← note` annotations.

Rank of each process, first that applies: a `# Rank N` header; an AReaL training worker's
`--worker-index` on its `Process` line; `rankN` in the file name (one process per file);
else the order of the Python processes (when nothing else names a rank).
"""

from __future__ import annotations

import re
import shlex
from dataclasses import dataclass, field
from pathlib import Path
from typing import TextIO

from areal_node.agent.processes import detect_role, rpc_worker
from areal_node.constants import TRAINING_ROLES

from areal_console.core.common.identity import login_user
from areal_console.core.stacks.parsing import FrameTable
from areal_console.core.stacks.records import (
    RankStack,
    StackCapture,
    Thread,
    is_idle_stack,
    now_iso,
)

# Numbers have bounded lengths (a pid, a rank, a line: at most 18 digits); longer is not
# py-spy's output, and int() of thousands of digits raises.
_PID_HEADER = re.compile(r"^\s*=+\s*PID\s+(\d{1,18})\s*=+\s*$", re.IGNORECASE)
_PROCESS = re.compile(r"^Process\s+(\d{1,18}):\s*(.*)$")
_PYTHON = re.compile(r"^Python v\S+")
_THREAD = re.compile(
    r'^Thread(?:\s+(0x[0-9A-Fa-f]{1,16}|\d{1,18}))?\s*(?:\(([^)]*)\))?\s*:\s*"(.*)"\s*$'
)
_LINE_NUMBER = re.compile(r"\d{1,18}")
_COMMENT = re.compile(r"^\s*#\s?(.*)$")
_RANK_WORD = re.compile(r"\brank\s*[_#-]?\s*(\d{1,9})\b", re.IGNORECASE)
_ERROR = re.compile(r"^Error:\s*(.*)$")
_FILE_RANK = re.compile(r"rank[_-]?(\d{1,9})", re.IGNORECASE)

# Bounds on an import (pasted or another user's text): a 1,000-rank job's dumps are a few
# MB and ~100,000 frames. Past these it is refused with one line, not parsed for minutes.
MAX_IMPORT_BYTES = 64 << 20  # per file (or stdin)
MAX_FRAMES = 200_000  # in all the files of one import
MAX_LINE = 64 << 10  # a longer line is cut there (a frame's regex is not run on megabytes)


class ImportTooLarge(ValueError):
    """An import past one of the bounds above."""


@dataclass
class DumpSection:
    """One process's dump, as found in the text."""

    source: str
    pid: int | None = None
    cmdline: str = ""
    header_rank: int | None = None
    error: str | None = None
    threads: list[tuple[str, int, list[tuple[str, str, int]]]] = field(default_factory=list)

    @property
    def has_content(self) -> bool:
        return (
            bool(self.threads)
            or self.error is not None
            or bool(self.cmdline)
            or self.pid is not None
        )


def parse_text(text: str, source: str, max_frames: int = MAX_FRAMES) -> list[DumpSection]:
    """Sections (one per process) of a py-spy text dump or a loop over several;
    `ImportTooLarge` past `max_frames` frames."""
    sections: list[DumpSection] = []
    frames = 0
    cur = DumpSection(source)
    frame_indent: int | None = None

    def close() -> DumpSection:
        nonlocal frame_indent
        if cur.has_content:
            sections.append(cur)
        frame_indent = None
        return DumpSection(source)

    for raw in text.splitlines():
        line = raw[:MAX_LINE].split("\u2190", 1)[0].rstrip()  # the guide's "← note" annotations
        if not line.strip():
            continue
        stripped = line.strip()
        indent = len(line) - len(line.lstrip())
        if m := _PID_HEADER.match(line):
            cur = close()
            cur.pid = int(m.group(1))
            continue
        if indent == 0 and (m := _COMMENT.match(line)):
            if cur.threads or cur.error is not None:
                cur = close()
            if (r := _RANK_WORD.search(m.group(1))) is not None:
                cur.header_rank = int(r.group(1))
            continue
        if indent == 0 and (m := _PROCESS.match(line)):
            other = cur.pid is not None and cur.pid != int(m.group(1))
            if (cur.threads or cur.cmdline or other) and cur.has_content:
                cur = close()
            cur.pid, cur.cmdline = int(m.group(1)), m.group(2).strip()
            continue
        if indent == 0 and _PYTHON.match(line):
            continue
        if indent == 0 and (m := _ERROR.match(line)):
            if cur.error is None:
                cur.error = m.group(1).strip()
            continue
        if cur.error is not None and not cur.threads:
            continue  # py-spy's backtrace under an error
        if indent == 0 and (m := _THREAD.match(stripped)):
            tid = int(m.group(1), 0) if m.group(1) else 0
            cur.threads.append((m.group(3), tid, []))
            frame_indent = None
            continue
        if stripped in ("Arguments:", "Locals:") or (
            frame_indent is not None and indent > frame_indent
        ):
            continue  # --locals: variables below their frame
        if indent > 0 and (frame := parse_frame(stripped)) is not None:
            if frame_indent is None:
                frame_indent = indent
            if not cur.threads:
                cur.threads.append(("MainThread", 0, []))
            cur.threads[-1][2].append(frame)
            frames += 1
            if frames > max_frames:
                raise ImportTooLarge(
                    f"{source}: more than {MAX_FRAMES:,} frames in this import: not imported "
                    "(a dump of 1,000 ranks has ~100,000; import fewer ranks at a time)"
                )
    close()
    return sections


def _worker_rank(cmdline: str) -> tuple[int | None, str | None]:
    """(rank, role) from an AReaL rpc_server command line."""
    try:
        argv = shlex.split(cmdline)
    except ValueError:
        argv = cmdline.split()
    worker = rpc_worker(argv)
    if worker is None:
        return None, detect_role(argv, {})
    role = worker["role"]
    index = worker["worker_index"]
    return (index if role in TRAINING_ROLES else None), role


def _explain(error: str) -> str:
    low = error.lower()
    if "failed to find python version" in low or "failed to get python version" in low:
        return f"not a Python process (a shell wrapper?): {error}"
    if "permission denied" in low or "operation not permitted" in low:
        return f"py-spy was not allowed to attach: {error}"
    return error


def sections_to_capture(sections: list[DumpSection], capture_id: str | None = None) -> StackCapture:
    table = FrameTable()
    ranks: list[RankStack] = []
    areal_workers = False
    assigned: list[tuple[DumpSection, int | None, str | None]] = []
    per_source: dict[str, int] = {}
    for s in sections:
        per_source[s.source] = per_source.get(s.source, 0) + 1
    for s in sections:
        rank, role = _worker_rank(s.cmdline) if s.cmdline else (None, None)
        if role is not None and s.cmdline and rpc_worker(shlex.split(s.cmdline)) is not None:
            areal_workers = True
        if s.header_rank is not None:
            rank = s.header_rank
        elif rank is None and per_source[s.source] == 1 and role is None:
            m = _FILE_RANK.search(Path(s.source).name)
            rank = int(m.group(1)) if m else None
        assigned.append((s, rank, role))
    named = any(rank is not None for _, rank, _ in assigned)
    next_rank = 0
    for s, rank, role in assigned:
        if s.error is not None and not s.threads:
            state, error = "error", _explain(s.error)
            if "python version" in s.error.lower():
                role = role or "wrapper"
        elif not s.threads:
            state, error = "error", "no py-spy output for this process (its error went elsewhere?)"
        else:
            state, error = "ok", None
        if rank is None and not named and state == "ok" and role is None:
            rank = next_rank  # nothing names ranks: number the Python processes in order
            next_rank += 1
        if rank is None and state == "ok" and role is None and areal_workers:
            role = "controller"  # a Python process beside AReaL workers, not one of them
        threads = []
        for name, tid, frames in s.threads:
            stack = tuple(table.frame(fn, file, line) for fn, file, line in frames)
            is_main = name == "MainThread"
            threads.append(
                Thread(
                    name=name or f"thread {tid}",
                    tid=tid,
                    frames=stack,
                    is_main=is_main,
                    idle=(not is_main) and is_idle_stack(stack),
                )
            )
        if threads and not any(t.is_main for t in threads):
            threads[0].is_main, threads[0].idle = True, False
        ranks.append(
            RankStack(
                node=Path(s.source).name,
                pid=s.pid or 0,
                rank=rank,
                local_rank=None,
                world_size=None,
                role=role,
                cmdline=s.cmdline,
                state=state,
                error=error,
                threads=threads,
            )
        )
    ranks.sort(key=lambda r: (r.rank is None, r.rank if r.rank is not None else 0, r.node, r.pid))
    return StackCapture(
        captured_at=now_iso(), samples=1, ranks=ranks, capture_id=capture_id, user=login_user()
    )


def import_text_dumps(
    paths: list[Path], capture_id: str | None = None, stdin: TextIO | None = None
) -> StackCapture:
    """A capture from py-spy text files (`-`: `stdin`). Raises ValueError when a file
    holds no stack, `ImportTooLarge` past the import's bounds."""
    sections: list[DumpSection] = []
    frames = 0
    for path in paths:
        if str(path) == "-" and stdin is not None:
            source = "stdin"
            data = stdin.buffer.read(MAX_IMPORT_BYTES + 1) if hasattr(stdin, "buffer") else None
            if data is None:
                data = stdin.read(MAX_IMPORT_BYTES + 1).encode("utf-8", "replace")
        else:
            source = str(path)
            with open(path, "rb") as fh:
                data = fh.read(MAX_IMPORT_BYTES + 1)
        if len(data) > MAX_IMPORT_BYTES:
            raise ImportTooLarge(
                f"{source}: larger than {MAX_IMPORT_BYTES >> 20} MB: not a py-spy dump "
                "(import fewer ranks at a time)"
            )
        if b"\0" in data:
            raise ValueError(f"{source}: binary data (NUL bytes): not py-spy text")
        text = data.decode("utf-8", errors="replace")
        found = parse_text(text, source, MAX_FRAMES - frames)
        if not any(s.threads for s in found):
            raise ValueError(f"{source}: no py-spy stack found (expected `py-spy dump` output)")
        frames += sum(len(stack) for s in found for _, _, stack in s.threads)
        sections.extend(found)
    return sections_to_capture(sections, capture_id)


def parse_frame(line: str) -> tuple[str, str, int] | None:
    r"""`function (file:line)` -> (function, file, line; 0 when none), else None. The
    function runs to the first ` (`. Not a regex: `^(\S.*?) \((.+?)(?::(\d+))?\)$` took
    minutes on one 64 KB line of ` (` repeated (each ` (` restarted the scan to the end)."""
    cut = line.find(" (", 1)
    if not line.endswith(")") or line[:1].isspace() or cut < 0 or cut + 3 >= len(line):
        return None
    inner = line[cut + 2 : -1]
    file, colon, number = inner.rpartition(":")
    if colon and file and _LINE_NUMBER.fullmatch(number):
        return line[:cut], file, int(number)
    return line[:cut], inner, 0
