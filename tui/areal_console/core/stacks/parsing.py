"""Raw captures (the agent's py-spy output) into the typed records of `records`.

Raw capture (what `capture.py` collects and what the test fixtures hold):

    {"captured_at": iso8601, "interval": float,
     "nodes": [{"node": str, "error": str | None,
                "processes": [<agent `sample` process records>],
                "samples": [[<agent `pyspy` dump records>], ...]}]}   # one list per sample
"""

from __future__ import annotations

import contextlib
import gc
import operator
from collections.abc import Iterator
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from areal_console.core.ledger.analyse import Ledger
    from areal_console.core.stacks.nccl_ras import RasStatus

from areal_console.core.common.textfmt import MAX_CMDLINE, capped, printable
from areal_console.core.stacks.records import (
    MAIN_THREAD,
    STACK_SOURCES,
    Frame,
    NodeError,
    RankStack,
    ServerInfo,
    Stack,
    StackCapture,
    Thread,
    in_distributed,
    is_idle_stack,
    now_iso,
)


def variables_of(
    table: FrameTable, key: str | None, raw_frames: list[dict[str, Any]] | None
) -> list[list[dict[str, Any]]] | None:
    """A thread's --locals: from its frames, or (a keyed stack sent once per node) from the
    first thread that had the same key."""
    found = frame_variables(raw_frames or [])
    if key is not None:
        if found is not None:
            table.variables[key] = found
        else:
            found = table.variables.get(key)
    return found


def frame_variables(raw_frames: list[dict[str, Any]]) -> list[list[dict[str, Any]]] | None:
    """py-spy --locals' variables per frame (name, repr, arg); None without --locals."""
    if not any(f.get("locals") for f in raw_frames):
        return None
    return [
        [{"name": str(v.get("name")), "repr": str(v.get("repr")), "arg": bool(v.get("arg"))}
         for v in (f.get("locals") or []) if isinstance(v, dict)]
        for f in raw_frames
    ]  # fmt: skip


_PYSPY_FRAME_KEY = operator.itemgetter("name", "filename", "line")


class FrameTable:
    """Interns frames and whole stacks, so equal stacks across ranks are one object:
    less memory, and grouping 16k ranks compares a handful of distinct tuples."""

    def __init__(self) -> None:
        self.variables: dict[str, list[list[dict[str, Any]]]] = {}  # stack key -> --locals
        self._frames: dict[tuple[str, str, int], Frame] = {}
        self._stacks: dict[tuple[Any, ...], Stack] = {}  # py-spy's frame fields -> stack
        self._interned: dict[Stack, Stack] = {}  # stacks read back from a saved capture
        self._keyed: dict[str, Stack] = {}  # the agent's stack digest -> stack
        self._idle: dict[Stack, bool] = {}
        # A keyed thread's parse, shared by every rank with the same stack, name and flags:
        # (key, thread name, is main, active, owns GIL) -> (name, frames, idle, locals).
        self._threads: dict[tuple[Any, ...], tuple[str, Stack, bool, Any, bool]] = {}
        self._text: dict[str, str] = {}  # command lines etc. as shown (`printable`)

    def stacks_held(self) -> int:
        """How many distinct stacks it holds (a long-lived table is renewed past a bound)."""
        return len(self._keyed) + len(self._stacks) + len(self._interned)

    def text(self, value: str) -> str:
        """`printable(value)`, once per distinct value (a job's ranks share command lines)."""
        found = self._text.get(value)
        if found is None:
            found = self._text[value] = printable(value)
        return found

    def keyed_stack(self, key: str, raw_frames: list[dict[str, Any]] | None) -> Stack:
        """The stack the agent named `key` (its frames come with the first thread only)."""
        found = self._keyed.get(key)
        if found is None:
            found = self._keyed[key] = self.pyspy_stack(raw_frames or [])
        return found

    def intern(self, frames: Stack) -> Stack:
        """The one tuple kept for this stack (equal stacks become the same object)."""
        return self._interned.setdefault(frames, frames)

    def is_idle(self, frames: Stack) -> bool:
        idle = self._idle.get(frames)
        if idle is None:
            idle = self._idle[frames] = is_idle_stack(frames)
        return idle

    def frame(self, function: str, file: str, line: int) -> Frame:
        key = (function, file, line)
        found = self._frames.get(key)
        if found is None:
            # Names and paths come from the node (or a saved file): never raw control
            # characters into a terminal, whichever view shows them.
            found = self._frames[key] = Frame(printable(function), printable(file), line)
        return found

    def pyspy_stack(self, raw_frames: list[dict[str, Any]]) -> Stack:
        """The interned stack of py-spy frame dicts (a C-speed key; parse on a miss only)."""
        try:
            key = tuple(map(_PYSPY_FRAME_KEY, raw_frames))
        except KeyError:
            key = tuple((f.get("name"), f.get("filename"), f.get("line")) for f in raw_frames)
        found = self._stacks.get(key)
        if found is None:
            found = self._stacks[key] = tuple(
                self.frame(
                    _frame_function(f),
                    str(f.get("filename") or f.get("short_filename") or "?"),
                    int(f.get("line") or 0),
                )
                for f in raw_frames
            )
        return found


def _frame_function(raw: dict[str, Any]) -> str:
    return str(raw.get("name") or "<unknown>")


@dataclass(slots=True)
class ProcessDump:
    """A node's `pyspy` answer for one process: its threads, or why there are none."""

    pid: int
    threads: list[Thread]
    error: str | None = None  # set: no stack

    @classmethod
    def from_agent(cls, reply: Any, pid: int) -> ProcessDump:
        """The first dump of a `pyspy` reply asked about `pid`."""
        dumps = reply.get("dumps") if isinstance(reply, dict) else None
        first = dumps[0] if isinstance(dumps, list) and dumps else None
        if not isinstance(first, dict):
            return cls(pid, [], "no answer")
        if not first.get("ok"):
            return cls(pid, [], str(first.get("error")))
        raw = first.get("threads")
        got = first.get("pid")
        pid = got if isinstance(got, int) and not isinstance(got, bool) and got else pid
        threads = [t for t in raw if isinstance(t, dict)] if isinstance(raw, list) else []
        return cls(pid, parse_pyspy_threads(threads, pid))


def parse_pyspy_threads(
    raw_threads: list[dict[str, Any]], pid: int | None = None, table: FrameTable | None = None
) -> list[Thread]:
    """py-spy `dump --json` threads -> `Thread`s (frames leaf first, idle marked)."""
    table = table or FrameTable()
    memo = table._threads
    threads: list[Thread] = []
    has_main = False
    for raw in raw_threads:
        key = raw.get("key")
        tid = int(raw.get("os_thread_id") or raw.get("thread_id") or 0)
        raw_name = raw.get("thread_name")
        is_main = raw_name == MAIN_THREAD or (pid is not None and tid == pid)
        active, owns_gil = raw.get("active"), raw.get("owns_gil")
        raw_frames = raw.get("frames")
        # Most ranks' threads repeat a stack the node sent once (keyed, no frames, no
        # locals): the whole parse is shared, only the thread id is the rank's own.
        shared = key is not None and not raw_frames
        parsed = memo.get((key, raw_name, is_main, active, owns_gil)) if shared else None
        if parsed is None:
            if key is not None:
                frames = table.keyed_stack(key, raw_frames)
            else:  # recorded before the agent keyed its stacks
                frames = table.pyspy_stack(raw_frames or [])
            parsed = (
                str(raw_name or ""),
                frames,
                (not is_main) and table.is_idle(frames),
                variables_of(table, key, raw_frames),
                in_distributed(frames),
            )
            if key is not None and parsed[3] is None:
                memo[(key, raw_name, is_main, active, owns_gil)] = parsed
        name, frames, idle, variables, dist = parsed
        has_main = has_main or is_main
        thread = Thread(
            name or f"thread {tid}", tid, frames, idle, active, owns_gil, is_main, variables
        )
        thread._dist = dist
        threads.append(thread)
    if threads and not has_main:
        threads[0].is_main = True
        threads[0].idle = False
    if len(threads) > 1:
        threads.sort(key=_thread_order)
    return threads


def _thread_order(t: Thread) -> tuple[bool, bool, str]:
    return (not t.is_main, t.idle, t.name)


def _stack_signature(threads: list[Thread]) -> tuple[Stack, ...]:
    return tuple(t.frames for t in threads if not t.idle)


@contextlib.contextmanager
def gc_paused() -> Iterator[None]:
    """No cyclic garbage collection while a capture's records are built: they hold no
    cycles, and at 100,000 ranks the collector's passes over the new objects cost more
    than building them (measured: 5.8 s with it, 2.2 s without).

    On the way out the new objects join the oldest generation directly (`freeze` then
    `unfreeze`): they are long-lived, and the first young collection after the pause
    would otherwise walk all of them at once (0.1 s at 100,000 ranks). They stay
    collectable: the next full collection sees them as it sees every old object."""
    enabled = gc.isenabled()
    gc.disable()
    try:
        yield
    finally:
        if enabled:
            gc.freeze()
            gc.unfreeze()
            gc.enable()


def build_capture(raw: dict[str, Any], table: FrameTable | None = None) -> StackCapture:
    """A `StackCapture` from a raw capture (see the module docstring)."""
    with gc_paused():
        return _build_capture(raw, table)


def _build_capture(raw: dict[str, Any], table: FrameTable | None) -> StackCapture:
    table = table or FrameTable()
    ranks: list[RankStack] = []
    errors: list[NodeError] = []
    n_samples = 0
    for node_raw in raw.get("nodes", []):
        node = str(node_raw.get("node"))
        if node_raw.get("error"):
            errors.append(NodeError(node, str(node_raw["error"])))
            continue
        samples: list[list[dict[str, Any]]] = node_raw.get("samples") or []
        n_samples = max(n_samples, len(samples))
        procs = {p["pid"]: p for p in node_raw.get("processes", [])}
        # requested pid -> dumps of each sample (a wrapper PID may have several children)
        per_pid: dict[int, list[list[dict[str, Any]]]] = {}
        for i, dumps in enumerate(samples):
            for d in dumps:
                slots = per_pid.setdefault(int(d.get("requested_pid", d["pid"])), [])
                while len(slots) <= i:
                    slots.append([])
                slots[i].append(d)
        for pid, proc in procs.items():
            slots = per_pid.get(pid, [])
            first = slots[0] if slots else []
            if not first:
                ranks.append(
                    _rank_from_process(
                        node, proc, state="error", error="no stack dump for this process"
                    )
                )
                continue
            for d in first:
                ranks.append(_rank_from_dump(node, proc, d, slots, table))
    ranks.sort(key=lambda r: (r.rank is None, r.rank if r.rank is not None else 0, r.node, r.pid))
    align_worker_frames(ranks)
    capture = StackCapture(
        captured_at=str(raw.get("captured_at") or now_iso()),
        samples=max(1, n_samples),
        ranks=ranks,
        errors=errors,
        interval=float(raw.get("interval") or 0.0),
        capture_id=raw.get("id"),
        job=raw.get("job"),
        ledger=_ledger_from_raw(raw),
        nccl_ras=_ras_from_raw(raw),
        user=raw["user"] if isinstance(raw.get("user"), str) else None,
        ended_roles=[d for d in raw.get("ended_roles") or () if isinstance(d, dict)],
        idle_gpus=[d for d in raw.get("idle_gpus") or () if isinstance(d, dict)],
    )
    from areal_console.core.rollout.context import apply_rollout

    apply_rollout(capture, raw)
    return capture


def align_worker_frames(ranks: list[RankStack]) -> None:
    """In a capture that mixes sources, name the worker server's frames as py-spy does.
    `faulthandler` writes a function's bare name (`wrapper`), py-spy its qualified name
    (`_exception_logger.<locals>.wrapper`, Python 3.11+): the same frame at the same
    file and line must compare equal, or ranks stopped at one place would split."""
    if not any(r.source == "worker_server" for r in ranks):
        return
    named: dict[tuple[str, int, str], Frame] = {}
    for r in ranks:
        if r.source == "py-spy":
            for t in r.threads:
                for f in t.frames:
                    named.setdefault((f.file, f.line, f.function.rsplit(".", 1)[-1]), f)
    if not named:
        return
    for r in ranks:
        if r.source != "worker_server":
            continue
        for t in r.threads:
            t.frames = tuple(named.get((f.file, f.line, f.function), f) for f in t.frames)


def _ras_from_raw(raw: dict[str, Any]) -> RasStatus | None:
    reply = raw.get("nccl_ras")
    if reply is None:
        return None
    from areal_console.core.stacks.nccl_ras import ras_from_agent

    return ras_from_agent(reply)


def _ledger_from_raw(raw: dict[str, Any]) -> Ledger | None:
    from areal_console.core.ledger.collect import ledger_from_raw  # it imports this module

    return ledger_from_raw(raw)


def _rank_from_process(
    node: str, proc: dict[str, Any], table: FrameTable | None = None, **extra: Any
) -> RankStack:
    cmdline = capped(str(proc.get("cmdline") or ""), MAX_CMDLINE)
    server = proc.get("server")
    return RankStack(
        node=node,
        pid=int(proc["pid"]),
        rank=proc.get("rank"),
        local_rank=proc.get("local_rank"),
        world_size=proc.get("world_size"),
        role=proc.get("role"),
        cmdline=table.text(cmdline) if table is not None else printable(cmdline),
        job=proc.get("job"),
        server=ServerInfo.from_json(server) if server is not None else None,
        stdout=proc["stdout"] if isinstance(proc.get("stdout"), str) else None,
        **extra,
    )


def _rank_from_dump(
    node: str,
    proc: dict[str, Any],
    dump: dict[str, Any],
    slots: list[list[dict[str, Any]]],
    table: FrameTable,
) -> RankStack:
    pid = int(dump["pid"])
    if not dump.get("ok"):
        state = "gone" if dump.get("reason") == "gone" else "error"
        rank = _rank_from_process(node, proc, state=state, error=dump.get("error"))
        rank.pid = pid
        return rank
    threads = parse_pyspy_threads(dump.get("threads") or [], pid, table)
    source = dump.get("source")
    rank = _rank_from_process(node, proc, table, threads=threads)
    rank.pid = pid
    # An agent older than the worker-server source answered with py-spy only.
    rank.source = source if source in STACK_SOURCES else "py-spy"
    if len(slots) > 1:
        first = _stack_signature(threads)
        later = []
        for number, dumps in enumerate(slots[1:], start=2):
            mine = [d for d in dumps if int(d["pid"]) == pid]
            if mine and mine[0].get("ok"):
                later.append(_stack_signature(parse_pyspy_threads(mine[0]["threads"], pid, table)))
            elif mine and mine[0].get("reason") == "gone" and rank.state == "ok":
                # Keep the stack it had, but say it is no longer there.
                rank.state = "gone"
                rank.error = f"process {pid} exited during capture (before sample {number})"
        rank.progressing = any(sig != first for sig in later) if later else None
    return rank
