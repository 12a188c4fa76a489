"""Typed records for one stack capture, built from the agent's raw py-spy output.

Raw capture (what `capture.py` collects and what the test fixtures hold):

    {"captured_at": iso8601, "interval": float,
     "nodes": [{"node": str, "error": str | None,
                "processes": [<agent `sample` process records>],
                "samples": [[<agent `pyspy` dump records>], ...]}]}   # one list per sample

Frames are kept leaf first, as py-spy gives them.
"""

from __future__ import annotations

import contextlib
import gc
import operator
import time
from collections.abc import Iterator
from dataclasses import asdict, dataclass, field
from typing import TYPE_CHECKING, Any, NamedTuple

if TYPE_CHECKING:
    from areal_console.core.ledger.analyse import Ledger
    from areal_console.core.rollout.context import RolloutSummary

from areal_console.core.records import MAX_CMDLINE
from areal_console.core.rollout.perf_trace import RankPhase
from areal_console.core.textfmt import capped, printable

MAIN_THREAD = "MainThread"
# AReaL's single-controller workers run all engine work, and so every collective, in this
# thread (areal/infra/rpc/guard/engine_blueprint.py:166 at AReaL cbff54d6).
ENGINE_THREADS = frozenset({"EngineWorker"})

# Leaf functions of threads that are parked waiting for work: hidden unless asked for.
IDLE_LEAVES = frozenset(
    {
        "wait",
        "_wait_for_tstate_lock",
        "join",
        "select",
        "poll",
        "epoll",
        "sleep",
        "get",
        "_worker",
        "accept",
        "recv",
        "recv_into",
        "readline",
        "read",
        "_recv",
        "_poll",
        "_wait",
        "run_forever",
        "_run_once",
        "serve_forever",
        "do_wait",
        "wait_for",
    }
)


class Frame(NamedTuple):
    """One stack frame. A tuple on purpose: hashing and comparing millions is cheap."""

    function: str
    file: str
    line: int

    @property
    def location(self) -> str:
        return f"{self.file}:{self.line}"

    def to_json(self) -> dict[str, Any]:
        return {"function": self.function, "file": self.file, "line": self.line}


Stack = tuple[Frame, ...]  # leaf first


class Variable(NamedTuple):
    """A frame's local variable or argument, as py-spy --locals shows it."""

    name: str
    repr: str
    arg: bool


@dataclass(slots=True)
class Thread:
    name: str
    tid: int
    frames: Stack
    idle: bool = False
    active: bool | None = None
    owns_gil: bool | None = None
    is_main: bool = False
    # With py-spy --locals: per frame (aligned with `frames`), its variables as
    # {"name", "repr", "arg"}; None when the capture did not ask for them.
    locals: list[list[dict[str, Any]]] | None = None
    # Whether `frames` pass through torch.distributed (see `distributed`), once known.
    _dist: bool | None = field(default=None, init=False, repr=False, compare=False)

    @property
    def distributed(self) -> bool:
        """The thread is inside torch.distributed (`in_distributed` of its frames)."""
        found = self._dist
        if found is None:
            found = self._dist = in_distributed(self.frames)
        return found

    def variables(self, index: int) -> tuple[Variable, ...]:
        """The --locals of frame `index` of `frames` (none without --locals)."""
        per_frame = self.locals or []
        if not 0 <= index < len(per_frame):
            return ()
        return tuple(
            Variable(str(v.get("name")), str(v.get("repr")), bool(v.get("arg")))
            for v in per_frame[index] or []
            if isinstance(v, dict)
        )

    def to_json(self) -> dict[str, Any]:
        doc = {
            "name": self.name,
            "tid": self.tid,
            "idle": self.idle,
            "frames": [f.to_json() for f in self.frames],
        }
        if self.locals is not None:
            doc["locals"] = self.locals
        return doc


def variables_at(
    capture: StackCapture, frame: Frame, limit: int = 4
) -> list[tuple[str, tuple[Variable, ...]]]:
    """(rank label, variables) of up to `limit` processes stopped in `frame` (--locals)."""
    found: list[tuple[str, tuple[Variable, ...]]] = []
    for r in capture.ranks:
        for t in r.threads:
            for i, f in enumerate(t.frames):
                if f == frame and (variables := t.variables(i)):
                    found.append((r.label if t.is_main else f"{r.label} {t.name}", variables))
                    break
            if len(found) >= limit:
                return found
    return found


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


def _polled_state(raw: Any) -> dict[str, Any]:
    """The typed parts of the agent's server poll (`metrics`, `weight_version`, `paused`,
    `flags`, `throughput` under a process's `server` in `nodes --json`)."""
    if not isinstance(raw, dict):
        return {}
    metrics = raw.get("metrics")
    version = raw.get("weight_version")
    paused = raw.get("paused")
    flags = raw.get("flags")
    rates = raw.get("throughput")
    return {
        "metrics": {
            str(k)[:100]: float(v)
            for k, v in (metrics.items() if isinstance(metrics, dict) else ())
            if isinstance(v, int | float) and not isinstance(v, bool)
        },
        "weight_version": version
        if isinstance(version, int | str) and not isinstance(version, bool)
        else None,
        "paused": paused if isinstance(paused, bool) else None,
        "flags": [
            {k: str(f.get(k, ""))[:500] for k in ("kind", "evidence", "remedy", "config_key")}
            for f in (flags if isinstance(flags, list) else ())[:16]
            if isinstance(f, dict)
        ],
        "throughput": [
            float(x)
            for x in (rates if isinstance(rates, list) else ())[-60:]
            if isinstance(x, int | float) and not isinstance(x, bool)
        ],
    }


@dataclass(slots=True)
class ServerInfo:
    """An inference server's address and its last `GET /health` answer (from the agent)."""

    kind: str  # sglang | vllm
    url: str
    host: str | None = None
    port: int | None = None
    ok: bool | None = None  # None: not polled
    status: int | None = None
    latency_ms: float | None = None
    error: str | None = None
    # From the agent's poll of the server's own listening port (absent from older agents).
    metrics: dict[str, float] = field(default_factory=dict)
    weight_version: int | str | None = None
    paused: bool | None = None
    flags: list[dict[str, str]] = field(default_factory=list)
    throughput: list[float] = field(default_factory=list)

    @property
    def address(self) -> str:
        return self.url.removeprefix("http://").split("/", 1)[0]

    @property
    def health_text(self) -> str:
        if self.ok is None:
            return "health not known"
        took = f" in {self.latency_ms:g} ms" if self.latency_ms is not None else ""
        return f"healthy{took}" if self.ok else f"unhealthy: {self.error or 'no answer'}{took}"

    @classmethod
    def from_json(cls, raw: Any) -> ServerInfo | None:
        if not isinstance(raw, dict) or not raw.get("url"):
            return None
        polled = raw.get("health")
        health: dict[str, Any] = polled if isinstance(polled, dict) else {}
        return cls(
            kind=str(raw.get("kind") or "server"),
            url=str(raw["url"]),
            host=raw.get("host"),
            port=raw.get("port"),
            ok=health.get("ok", raw.get("ok")),
            status=health.get("status", raw.get("status")),
            latency_ms=health.get("latency_ms", raw.get("latency_ms")),
            error=health.get("error", raw.get("error")),
            **_polled_state(raw),
        )

    def to_json(self) -> dict[str, Any]:
        return asdict(self)


@dataclass(slots=True)
class RankStack:
    """One process of the job (a rank, or a launcher/server with `rank` None)."""

    node: str
    pid: int
    rank: int | None = None
    local_rank: int | None = None
    world_size: int | None = None
    role: str | None = None
    cmdline: str = ""
    state: str = "ok"  # ok | error | gone
    error: str | None = None
    progressing: bool | None = None
    threads: list[Thread] = field(default_factory=list)
    job: str | None = None  # AReaL experiment/trial, when the command line says
    server: ServerInfo | None = None
    phase: RankPhase | None = None  # where it is in its step (AReaL's perf tracer files)
    # `work_thread`, once picked: (the thread, or None; the `threads` list it was picked from)
    _work: tuple[Thread | None, list[Thread]] | None = field(
        default=None, init=False, repr=False, compare=False
    )

    @property
    def main_thread(self) -> Thread | None:
        for t in self.threads:
            if t.is_main:
                return t
        return self.threads[0] if self.threads else None

    @property
    def work_thread(self) -> Thread | None:
        """The thread doing the job's work: the one inside torch.distributed (the main
        thread first), else an engine thread (AReaL's `EngineWorker`), else a busy thread in
        AReaL's engine code, else the main thread."""
        work = self._work
        if work is not None and work[1] is self.threads:
            picked = work[0]
            if (picked in self.threads) if picked is not None else not self.threads:
                return picked
        picked = self._pick_work_thread()
        self._work = (picked, self.threads)
        return picked

    def _pick_work_thread(self) -> Thread | None:
        main = self.main_thread
        if main is not None and main.distributed:
            return main
        for t in self.threads:
            if t.distributed:
                return t
        for t in self.threads:
            if t.name in ENGINE_THREADS:
                return t
        if main is not None and main.idle is False and in_engine(main.frames):
            return main
        for t in self.threads:
            if not t.idle and in_engine(t.frames):
                return t  # a busy thread in AReaL's engine code, whatever its name
        return main

    @property
    def work_frames(self) -> Stack:
        """Frames of `work_thread`: what groups, diffs and the diagnosis compare."""
        work = self.work_thread
        return work.frames if work is not None else ()

    main_frames = work_frames  # the name older callers use

    @property
    def label(self) -> str:
        if self.rank is not None:
            return f"rank {self.rank}"
        return f"{self.role or 'process'} {self.pid}@{self.node}"

    def to_json(self, with_threads: bool = True) -> dict[str, Any]:
        doc = {
            "node": self.node,
            "pid": self.pid,
            "rank": self.rank,
            "local_rank": self.local_rank,
            "world_size": self.world_size,
            "role": self.role,
            "cmdline": self.cmdline,
            "state": self.state,
            "error": self.error,
            "progressing": self.progressing,
            "job": self.job,
            "server": self.server.to_json() if self.server else None,
            "phase": self.phase.to_json() if self.phase else None,
        }
        if with_threads:
            doc["threads"] = [t.to_json() for t in self.threads]
        return doc


@dataclass(slots=True)
class NodeError:
    node: str
    error: str

    def to_json(self) -> dict[str, Any]:
        return {"node": self.node, "error": self.error}


@dataclass(slots=True)
class StackCapture:
    captured_at: str
    samples: int
    ranks: list[RankStack]
    errors: list[NodeError] = field(default_factory=list)
    interval: float = 0.0
    capture_id: str | None = None
    save_error: str | None = None  # why it could not be saved (shown, never silent)
    job: str | None = None  # the job key(s) the capture was scoped to (see scope.py)
    ledger: Ledger | None = None  # Flight Recorder's view; None: not read
    user: str | None = None  # who took it (login identity); None: an older capture
    rollout: RolloutSummary | None = None  # rollout capacity and tracer notes; None: not read

    @property
    def rank_stacks(self) -> list[RankStack]:
        """Processes that are ranks, sorted by rank."""
        ranked = [r for r in self.ranks if r.rank is not None]
        ranked.sort(key=lambda r: (r.rank, r.node, r.pid))
        return ranked

    def find_rank(self, rank: int) -> RankStack | None:
        for r in self.ranks:
            if r.rank == rank:
                return r
        return None


# --------------------------------------------------------------------------------------
# Parsing


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


def is_distributed_frame(frame: Frame) -> bool:
    """A frame of torch.distributed (by path, whatever the install location)."""
    f = frame.file
    return "torch/distributed/" in f or "c10d" in f or "torch\\distributed\\" in f


def in_distributed(frames: Stack) -> bool:
    return any(is_distributed_frame(f) for f in frames)


# AReaL's training and inference engines (areal/engine/, areal/experimental/engine/).
_ENGINE_DIRS = ("areal/engine/", "areal/experimental/engine/", "areal\\engine\\")


def in_engine(frames: Stack) -> bool:
    return any(d in f.file for f in frames for d in _ENGINE_DIRS)


def is_idle_stack(frames: Stack) -> bool:
    """A thread parked in a wait (pool workers, queues, selectors) and not doing work;
    a wait inside torch.distributed (`recv`, `wait` of a collective) is work."""
    if not frames:
        return True
    if is_distributed_frame(frames[0]):
        return False
    return frames[0].function.rsplit(".", 1)[-1] in IDLE_LEAVES


def _stack_signature(threads: list[Thread]) -> tuple[Stack, ...]:
    return tuple(t.frames for t in threads if not t.idle)


def now_iso() -> str:
    """UTC now as ISO 8601 to the second (`2026-11-24T00:13:05+00:00`)."""
    return time.strftime("%Y-%m-%dT%H:%M:%S+00:00", time.gmtime())


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
    capture = StackCapture(
        captured_at=str(raw.get("captured_at") or now_iso()),
        samples=max(1, n_samples),
        ranks=ranks,
        errors=errors,
        interval=float(raw.get("interval") or 0.0),
        capture_id=raw.get("id"),
        job=raw.get("job"),
        ledger=_ledger_from_raw(raw),
        user=raw["user"] if isinstance(raw.get("user"), str) else None,
    )
    from areal_console.core.rollout.context import apply_rollout

    apply_rollout(capture, raw)
    return capture


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
    rank = _rank_from_process(node, proc, table, threads=threads)
    rank.pid = pid
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


# --------------------------------------------------------------------------------------
# The saved / exported JSON (`stacks --json`, docs/cli-json.md) back into records


def capture_from_json(data: dict[str, Any]) -> StackCapture:
    table = FrameTable()
    ranks = []
    for r in data.get("ranks", []):
        threads = [
            Thread(
                name=str(t.get("name", "")),
                tid=int(t.get("tid") or 0),
                frames=table.intern(
                    tuple(
                        table.frame(str(f["function"]), str(f["file"]), int(f["line"]))
                        for f in t.get("frames", [])
                    )
                ),
                idle=bool(t.get("idle")),
                is_main=False,
                locals=t.get("locals"),
            )
            for t in r.get("threads", [])
        ]
        main = next((t for t in threads if t.name == MAIN_THREAD or t.tid == r.get("pid")), None)
        if main is None and threads:
            main = threads[0]
        if main is not None:
            main.is_main = True
        ranks.append(
            RankStack(
                node=str(r.get("node")),
                pid=int(r.get("pid") or 0),
                rank=r.get("rank"),
                local_rank=r.get("local_rank"),
                world_size=r.get("world_size"),
                role=r.get("role"),
                cmdline=capped(str(r.get("cmdline") or ""), MAX_CMDLINE),
                state=str(r.get("state") or "ok"),
                error=r.get("error"),
                progressing=r.get("progressing"),
                threads=threads,
                job=r.get("job"),
                server=ServerInfo.from_json(r.get("server")),
                phase=RankPhase.from_json(r.get("phase"), r.get("rank")),
            )
        )
    return StackCapture(
        captured_at=str(data.get("captured_at") or ""),
        samples=int(data.get("samples") or 1),
        ranks=ranks,
        errors=[NodeError(str(e.get("node")), str(e.get("error"))) for e in data.get("errors", [])],
        interval=float(data.get("interval") or 0.0),
        capture_id=data.get("id"),
        job=data.get("job"),
        ledger=_ledger_from_json(data.get("ledger")),
        user=data["user"] if isinstance(data.get("user"), str) else None,
        rollout=_rollout_from_json(data.get("rollout")),
    )


def _rollout_from_json(doc: Any) -> RolloutSummary | None:
    from areal_console.core.rollout.context import RolloutSummary

    return RolloutSummary.from_json(doc)


def _ledger_from_json(doc: Any) -> Ledger | None:
    from areal_console.core.ledger.analyse import ledger_from_json

    return ledger_from_json(doc) if isinstance(doc, dict) else None
