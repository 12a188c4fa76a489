"""Typed records of one stack capture: frames, threads, processes (ranks), the capture.

Frames are kept leaf first, as py-spy gives them. How a raw capture becomes these records
is `parsing`; the saved JSON (`stacks --json`) back into them is `codec`.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from typing import TYPE_CHECKING, Any, NamedTuple, TypeVar

from areal_console.core.rollout.perf_trace import RankPhase

if TYPE_CHECKING:
    from areal_console.core.ledger.analyse import Ledger
    from areal_console.core.rollout.context import RolloutSummary
    from areal_console.core.stacks.nccl_ras import RasStatus

MAIN_THREAD = "MainThread"
# Where a rank's stack came from (`source` of a rank in `stacks --json`).
STACK_SOURCES = ("py-spy", "worker_server")
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

_R = TypeVar("_R")
_PER_STACK_MAX = 1 << 16  # results remembered per function (then forgotten, and made again)


def per_stack(fn: Callable[[Stack], _R]) -> Callable[[Stack], _R]:
    """`fn` (pure, of one stack) made once per stack object: the ranks of a job share
    interned stacks, so a question asked of each of 4,096 ranks is answered a few times."""
    made: dict[int, tuple[Stack, _R]] = {}  # id(stack) -> (the stack, kept alive; result)

    def once(frames: Stack) -> _R:
        found = made.get(id(frames))
        if found is not None and found[0] is frames:
            return found[1]
        result = fn(frames)
        if len(made) >= _PER_STACK_MAX:
            made.clear()
        made[id(frames)] = (frames, result)
        return result

    once.__doc__ = fn.__doc__
    once.__name__ = fn.__name__
    return once


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
    # Where the stack came from: "py-spy", or "worker_server" (torch's per-rank server,
    # where py-spy could not attach); None: no stack, or an older capture.
    source: str | None = None
    # The file its output goes to, as the agent found it (its user's regular file): the
    # job's log where its command lines name none (`train.py > run.log`, the demo).
    stdout: str | None = None
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
            "source": self.source,
            "stdout": self.stdout,
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
    nccl_ras: RasStatus | None = None  # NCCL's RAS report; None: no rank serves one
    # An imported capture: where its ranks came from ("dump": the text itself, "file_name",
    # "argument_order"); None: a live capture.
    rank_source: str | None = None
    # What the stacks cannot show, as `nodes --json` writes it (core/stacks/slow_evidence.py):
    # the job's roles whose Slurm job ended while others run, ranks whose GPU idled.
    ended_roles: list[dict[str, Any]] = field(default_factory=list)
    idle_gpus: list[dict[str, Any]] = field(default_factory=list)
    # What took it, when not a person ("watch"), and the evidence folder and report a
    # watch wrote beside it: read back from a saved capture (the store's file) only.
    tags: tuple[str, ...] = ()
    watch_evidence: str | None = None
    watch_report: str | None = None

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


def is_distributed_frame(frame: Frame) -> bool:
    """A frame of torch.distributed (by path, whatever the install location)."""
    f = frame.file
    return "torch/distributed/" in f or "c10d" in f or "torch\\distributed\\" in f


@per_stack
def in_distributed(frames: Stack) -> bool:
    return any(is_distributed_frame(f) for f in frames)


# AReaL's training and inference engines (areal/engine/, areal/experimental/engine/).
_ENGINE_DIRS = ("areal/engine/", "areal/experimental/engine/", "areal\\engine\\")


@per_stack
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


def now_iso() -> str:
    """UTC now as ISO 8601 to the second (`2026-11-24T00:13:05+00:00`)."""
    return time.strftime("%Y-%m-%dT%H:%M:%S+00:00", time.gmtime())
