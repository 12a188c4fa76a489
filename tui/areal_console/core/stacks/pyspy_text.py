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
    Stack,
    StackCapture,
    Thread,
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
_INDENTED = re.compile(r"(?:[ \t][^\n]*(?:\n|\Z))+")  # a run of indented lines
# Line breaks of str.splitlines other than "\n" (a pasted dump may have any of them).
_ODD_BREAKS = "\r\x0b\x0c\x1c\x1d\x1e\x85\u2028\u2029"

# Bounds on an import (pasted or another user's text). They scale with the job: a 4,096-rank
# job's dumps (three threads of ~50 frames per rank) are ~35 MB and 600,000 frames, but few
# distinct frames. What is bounded is what costs: the bytes read, the frames of one process
# (py-spy's dump of one process is a few threads of at most ~1,000 frames, Python's
# recursion limit) and the distinct frames kept (each is parsed and stored once). Past any
# of them the import is refused with one line, not parsed for minutes.
MAX_IMPORT_BYTES = 64 << 20  # per file (or stdin)
MAX_IMPORT_TOTAL = 256 << 20  # all the files of one import
MAX_PROCESS_FRAMES = 50_000  # one process's threads together
MAX_DISTINCT_FRAMES = 500_000  # distinct frame lines in one import
MAX_BLOCKS = 100_000  # distinct threads' blocks of frame lines remembered (past it: parsed)
MAX_LINE = 64 << 10  # a longer line is cut there (a frame's regex is not run on megabytes)


class ImportTooLarge(ValueError):
    """An import past one of the bounds above."""


ParsedFrame = tuple[str, str, int]  # (function, file, line) as the text gives them


@dataclass
class DumpSection:
    """One process's dump, as found in the text."""

    source: str
    pid: int | None = None
    cmdline: str = ""
    header_rank: int | None = None
    error: str | None = None
    threads: list[tuple[str, int, list[ParsedFrame]]] = field(default_factory=list)
    frames: int = 0  # in all its threads

    @property
    def has_content(self) -> bool:
        return (
            bool(self.threads)
            or self.error is not None
            or bool(self.cmdline)
            or self.pid is not None
        )


class FrameLines:
    """Frame lines already parsed in this import, by their text: the ranks of a job print
    the same lines (and the same threads) again and again, so each distinct line is matched
    and stored once, and each distinct thread's block of frame lines split once.
    `ImportTooLarge` past `limit` distinct lines."""

    def __init__(self, limit: int = MAX_DISTINCT_FRAMES) -> None:
        self.parsed: dict[str, ParsedFrame | None] = {}
        # A thread's block of frame lines -> (indent, its frames); None: not plain frames.
        self.blocks: dict[str, tuple[int, tuple[ParsedFrame, ...]] | None] = {}
        self.limit = limit

    def parse(self, text: str, source: str) -> ParsedFrame | None:
        found = self.parsed.get(text, False)
        if found is not False:
            return found  # type: ignore[return-value]
        found = parse_frame(text)
        if len(self.parsed) >= self.limit:
            raise ImportTooLarge(
                f"{source}: more than {self.limit:,} distinct frames in this import: not "
                "imported (a job's ranks share most of theirs; import fewer ranks at a time)"
            )
        self.parsed[text] = found
        return found

    def block(self, block: str, source: str) -> tuple[int, tuple[ParsedFrame, ...]] | None:
        """A thread's indented lines as (indent, frames) when every one is a frame line at
        one indent (as py-spy prints a thread without --locals); None otherwise."""
        found = self.blocks.get(block, False)
        if found is not False:
            return found  # type: ignore[return-value]
        found = self._split(block, source)
        if len(self.blocks) < MAX_BLOCKS:
            self.blocks[block] = found
        return found

    def _split(self, block: str, source: str) -> tuple[int, tuple[ParsedFrame, ...]] | None:
        if "\u2190" in block or "\r" in block:
            return None
        rows = block.split("\n")
        if rows[-1] == "":
            rows.pop()
        if len(rows) > MAX_PROCESS_FRAMES:
            return None  # line by line, to the bound
        indent = None
        frames = []
        for row in rows:
            line = row[:MAX_LINE].rstrip()
            stripped = line.lstrip()
            if not stripped or indent not in (None, len(line) - len(stripped)):
                return None
            indent = len(line) - len(stripped)
            parsed = self.parse(stripped, source)
            if parsed is None:
                return None
            frames.append(parsed)
        return (indent or 0), tuple(frames)


def parse_text(text: str, source: str, lines: FrameLines | None = None) -> list[DumpSection]:
    """Sections (one per process) of a py-spy text dump or a loop over several;
    `ImportTooLarge` past a bound (frames of one process, distinct frames)."""
    if any(c in text for c in _ODD_BREAKS):
        text = "\n".join(text.splitlines())  # what str.splitlines breaks at, as \n
    return _DumpReader(source, lines if lines is not None else FrameLines()).run(text)


class _DumpReader:
    def __init__(self, source: str, lines: FrameLines) -> None:
        self.source = source
        self.lines = lines
        self.sections: list[DumpSection] = []
        self.cur = DumpSection(source)
        self.frame_indent: int | None = None
        self.frames: list[ParsedFrame] | None = None  # the current thread's

    def run(self, text: str) -> list[DumpSection]:
        """Line by line, except a thread's frames: a block of indented lines right after
        its `Thread` line is looked up whole (the ranks of a job repeat theirs)."""
        pos, end = 0, len(text)
        block_of = self.lines.block
        while pos < end:
            frames = self.frames
            if text[pos] in " \t" and frames is not None and not frames:
                m = _INDENTED.match(text, pos)
                assert m is not None  # it starts with a blank
                found = block_of(m.group(), self.source)
                if found is not None:
                    self.frame_indent = found[0]
                    frames.extend(found[1])
                    self.cur.frames += len(found[1])
                    if self.cur.frames > MAX_PROCESS_FRAMES:
                        raise _too_deep(self.source, self.cur)
                else:
                    for raw in m.group().split("\n"):
                        self.step(raw)
                pos = m.end()
                continue
            nl = text.find("\n", pos)
            if nl < 0:
                nl = end
            self.step(text[pos:nl])
            pos = nl + 1
        self.close()
        return self.sections

    def close(self) -> DumpSection:
        if self.cur.has_content:
            self.sections.append(self.cur)
        self.frame_indent, self.frames = None, None
        self.cur = DumpSection(self.source)
        return self.cur

    def add_frame(self, parsed: ParsedFrame, frames: list[ParsedFrame]) -> None:
        frames.append(parsed)
        self.cur.frames += 1
        if self.cur.frames > MAX_PROCESS_FRAMES:
            raise _too_deep(self.source, self.cur)

    def step(self, raw: str) -> None:
        if len(raw) > MAX_LINE:
            raw = raw[:MAX_LINE]
        if "\u2190" in raw:
            raw = raw.split("\u2190", 1)[0]  # the guide's "← note" annotations
        line = raw.rstrip()
        if not line:
            return
        cur = self.cur
        if line[0] in " \t":  # indented: a frame, --locals, or a stray header
            stripped = line.lstrip()
            indent = len(line) - len(stripped)
            frames = self.frames
            if frames is not None and self.frame_indent in (None, indent):
                parsed = self.lines.parse(stripped, self.source)
                if parsed is not None:  # the next frame of a thread
                    self.frame_indent = indent
                    self.add_frame(parsed, frames)
                    return
            if stripped[0] == "=" and (m := _PID_HEADER.match(line)):
                self.close().pid = int(m.group(1))
                return
            if cur.error is not None and not cur.threads:
                return  # py-spy's backtrace under an error
            if stripped in ("Arguments:", "Locals:") or (
                self.frame_indent is not None and indent > self.frame_indent
            ):
                return  # --locals: variables below their frame
            parsed = self.lines.parse(stripped, self.source)
            if parsed is not None:  # frames with no Thread line (the guide's text)
                if self.frame_indent is None:
                    self.frame_indent = indent
                if not cur.threads:
                    cur.threads.append(("MainThread", 0, []))
                self.frames = cur.threads[-1][2]
                self.add_frame(parsed, self.frames)
            return
        if m := _PID_HEADER.match(line):
            self.close().pid = int(m.group(1))
            return
        if m := _COMMENT.match(line):
            if cur.threads or cur.error is not None:
                cur = self.close()
            if (r := _RANK_WORD.search(m.group(1))) is not None:
                cur.header_rank = int(r.group(1))
            return
        if m := _PROCESS.match(line):
            other = cur.pid is not None and cur.pid != int(m.group(1))
            if (cur.threads or cur.cmdline or other) and cur.has_content:
                cur = self.close()
            cur.pid, cur.cmdline = int(m.group(1)), m.group(2).strip()
            return
        if _PYTHON.match(line):
            return
        if m := _ERROR.match(line):
            if cur.error is None:
                cur.error = m.group(1).strip()
            return
        if cur.error is not None and not cur.threads:
            return  # py-spy's backtrace under an error
        if m := _THREAD.match(line):
            tid = int(m.group(1), 0) if m.group(1) else 0
            self.frames = []
            cur.threads.append((m.group(3), tid, self.frames))
            self.frame_indent = None


def _too_deep(source: str, section: DumpSection) -> ImportTooLarge:
    who = f"process {section.pid}" if section.pid is not None else "one process"
    return ImportTooLarge(
        f"{source}: {who} has more than {MAX_PROCESS_FRAMES:,} frames: not a py-spy dump "
        "(one process's threads are at most a few thousand frames)"
    )


def split_cmdline(cmdline: str) -> list[str]:
    """A command line's words as a shell splits them (`str.split` when nothing is quoted:
    the same words, without shlex's character-by-character scan)."""
    if not any(c in cmdline for c in "\"'\\"):
        return cmdline.split()
    try:
        return shlex.split(cmdline)
    except ValueError:
        return cmdline.split()


def _worker_rank(cmdline: str) -> tuple[int | None, str | None, bool]:
    """(rank, role, an AReaL worker?) from a command line (an AReaL rpc_server's names
    its worker)."""
    argv = split_cmdline(cmdline)
    worker = rpc_worker(argv)
    if worker is None:
        return None, detect_role(argv, {}), False
    role = worker["role"]
    index = worker["worker_index"]
    return (index if role in TRAINING_ROLES else None), role, role is not None


def _explain(error: str) -> str:
    low = error.lower()
    if "failed to find python version" in low or "failed to get python version" in low:
        return f"not a Python process (a shell wrapper?): {error}"
    if "permission denied" in low or "operation not permitted" in low:
        return f"py-spy was not allowed to attach: {error}"
    return error


def sections_to_capture(sections: list[DumpSection], capture_id: str | None = None) -> StackCapture:
    table = FrameTable()
    stacks: dict[tuple[ParsedFrame, ...], Stack] = {}  # a thread's parsed frames -> stack
    names: dict[str, str] = {}  # source -> file name (the rank's node)
    ranks: list[RankStack] = []
    areal_workers = False
    assigned: list[tuple[DumpSection, int | None, str | None]] = []
    per_source: dict[str, int] = {}
    for s in sections:
        per_source[s.source] = per_source.get(s.source, 0) + 1
    for s in sections:
        rank, role, worker = _worker_rank(s.cmdline) if s.cmdline else (None, None, False)
        areal_workers = areal_workers or worker
        if s.header_rank is not None:
            rank = s.header_rank
        assigned.append((s, rank, role))
    # A file holding one process that nothing in it ranks: its rank comes from a number in
    # its name, but only when every such file has one (a.txt..d.txt would otherwise be
    # numbered by argument order, and the report says so).
    by_file = [i for i, (s, rank, role) in enumerate(assigned)
               if rank is None and role is None and per_source[s.source] == 1]  # fmt: skip
    from_names = [file_rank(assigned[i][0].source) for i in by_file]
    rank_source = "dump"
    if by_file and None not in from_names and len(set(from_names)) == len(from_names):
        for i, rank in zip(by_file, from_names, strict=True):
            assigned[i] = (assigned[i][0], rank, None)
        rank_source = "file_name"
    elif len(by_file) > 1:
        rank_source = "argument_order"
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
            parsed = tuple(frames)
            stack = stacks.get(parsed)
            if stack is None:  # once per distinct stack: the ranks of a job share theirs
                stack = stacks[parsed] = table.intern(
                    tuple(table.frame(fn, file, line) for fn, file, line in parsed)
                )
            is_main = name == "MainThread"
            threads.append(
                Thread(
                    name=name or f"thread {tid}",
                    tid=tid,
                    frames=stack,
                    is_main=is_main,
                    idle=(not is_main) and table.is_idle(stack),
                )
            )
        if threads and not any(t.is_main for t in threads):
            threads[0].is_main, threads[0].idle = True, False
        ranks.append(
            RankStack(
                node=names.get(s.source) or names.setdefault(s.source, Path(s.source).name),
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
        captured_at=now_iso(),
        samples=1,
        ranks=ranks,
        capture_id=capture_id,
        user=login_user(),
        rank_source=rank_source,
    )


def file_rank(source: str) -> int | None:
    """The rank a dump's file name gives: `rank3`, `rank_3`, `rank-3`, else its last number
    (`dump_3.txt`); None without one."""
    name = Path(source).name
    m = _FILE_RANK.search(name)
    if m:
        return int(m.group(1))
    return _last_number(Path(name).stem)


def _last_number(text: str) -> int | None:
    """The last run of digits in `text` (its last nine digits), None without one. Not a
    regex: `(\\d+)(?!.*\\d)` looks ahead to the end from every digit (quadratic)."""
    end = len(text)
    while end and not text[end - 1].isdecimal():
        end -= 1
    start = end
    while start and text[start - 1].isdecimal() and end - start < 9:
        start -= 1
    return int(text[start:end]) if end else None


def import_text_dumps(
    paths: list[Path], capture_id: str | None = None, stdin: TextIO | None = None
) -> StackCapture:
    """A capture from py-spy text files (`-`: `stdin`). Raises ValueError when a file
    holds no stack, `ImportTooLarge` past the import's bounds."""
    sections: list[DumpSection] = []
    lines = FrameLines()
    total = 0
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
        total += len(data)
        if total > MAX_IMPORT_TOTAL:
            raise ImportTooLarge(
                f"{source}: the files of this import are larger than "
                f"{MAX_IMPORT_TOTAL >> 20} MB together: not imported (import fewer ranks at a time)"
            )
        if b"\0" in data:
            raise ValueError(f"{source}: binary data (NUL bytes): not py-spy text")
        text = data.decode("utf-8", errors="replace")
        del data
        found = parse_text(text, source, lines)
        if not any(s.threads for s in found):
            raise ValueError(f"{source}: no py-spy stack found (expected `py-spy dump` output)")
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
