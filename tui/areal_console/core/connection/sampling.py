"""What repeated samples of the fleet show that one sample cannot: each process's RSS
over time and a steady growth of it, and ranks gone from a node they were on. Pure
functions over `nodes --json` entries; `SampleHistory` keeps the series between samples
(`nodes --samples N`, the Cluster screen while it is open).

Memory growth: at least MIN_SAMPLES readings of a process's RSS whose least-squares
slope is at least GROWTH_MB_PER_MIN, that rose between most consecutive readings and
gained at least half of what the slope says over the whole stretch (a single jump, a
saw-tooth that returns, or a flat line is not growth).
"""

from __future__ import annotations

import itertools
from collections import deque
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from typing import Any

from areal_console.core.common.textfmt import format_bytes

GROWTH_MB_PER_MIN = 50.0
MIN_SAMPLES = 3
RISING_SHARE = 2 / 3  # of consecutive readings that must rise
GROWTH_WINDOW = 60  # the latest readings the live screen judges growth on
MAX_POINTS = 600  # readings kept per process (10 minutes at 1 Hz)
MAX_PROCESSES = 65536  # processes followed at once
MB = 1 << 20
IDLE_UTIL = 10.0  # a rank's mean GPU utilisation (%) at or below this is idle...
BUSY_UTIL = 50.0  # ...while the median of the other ranks' is at or above this
SPARKS = "▁▂▃▄▅▆▇█"

MEMORY_GROWTH_REMEDY = (
    "Host memory that grows every step ends in the OOM killer (AReaL issue 1209: about "
    "2 GB a step, the run killed near step 113). While it grows, capture what holds it: "
    "`py-spy dump --pid {pid}` for where the worker is, then a heap snapshot of that "
    "worker: `memray attach {pid}` (or tracemalloc: `tracemalloc.start()` early and "
    "`tracemalloc.take_snapshot().statistics('lineno')` a few steps apart) and compare "
    "two snapshots; look for batches, rollouts or stats kept across steps"
)

ProcessKey = tuple[str, int]  # (node, pid)
ProcessFacts = tuple[Any, Any, Any, Any, Any]  # (pid, cmdline, rss, rank, role) as read


@dataclass(frozen=True, slots=True)
class RankGpu:
    """One rank's GPUs across the samples: its mean utilisation and latest memory."""

    node: str
    pid: int
    rank: int
    gpus: tuple[int, ...]
    util: float  # mean over the samples of the mean over its GPUs (%)
    samples: int
    memory: int | None  # bytes the rank holds on its GPUs (NVML), latest sample

    def to_json(self) -> dict[str, Any]:
        return {"node": self.node, "pid": self.pid, "rank": self.rank, "gpus": list(self.gpus),
                "util": round(self.util, 1), "samples": self.samples, "memory": self.memory}  # fmt: skip


@dataclass(frozen=True, slots=True)
class IdleRank:
    gpu: RankGpu
    others_median: float

    def to_json(self) -> dict[str, Any]:
        return {**self.gpu.to_json(), "others_median": round(self.others_median, 1),
                "evidence": self.describe()}  # fmt: skip

    def describe(self) -> str:
        g = self.gpu
        which = ",".join(map(str, g.gpus))
        return (f"{g.node}: rank {g.rank} (pid {g.pid}, GPU {which}) is idle: "
                f"{g.util:.0f}% mean utilisation over {g.samples} samples while the other "
                f"ranks' median is {self.others_median:.0f}%")  # fmt: skip


@dataclass(frozen=True, slots=True)
class ProcessFlag:
    kind: str
    evidence: str
    remedy: str

    def to_json(self) -> dict[str, str]:
        return {"kind": self.kind, "evidence": self.evidence, "remedy": self.remedy}


@dataclass(frozen=True, slots=True)
class GoneRank:
    """A rank on a node in one sample and not in the next."""

    node: str
    pid: int
    rank: int
    role: str | None
    last_seen: float

    def to_json(self) -> dict[str, Any]:
        return {"node": self.node, "pid": self.pid, "rank": self.rank, "role": self.role,
                "last_seen": self.last_seen}  # fmt: skip

    def describe(self) -> str:
        role = f" ({self.role})" if self.role else ""
        return f"{self.node}: rank {self.rank}{role}, pid {self.pid}, is gone since the last sample"


def _slope(points: Sequence[tuple[float, float]]) -> float:
    """Least-squares slope of (t, y) points (0 when the times do not spread)."""
    n = len(points)
    mt = sum(t for t, _ in points) / n
    my = sum(y for _, y in points) / n
    sxx = sum((t - mt) ** 2 for t, _ in points)
    if sxx <= 0:
        return 0.0
    return sum((t - mt) * (y - my) for t, y in points) / sxx


def memory_growth(
    series: Sequence[tuple[float, int]],
    pid: int,
    threshold_mb_per_min: float = GROWTH_MB_PER_MIN,
    min_samples: int = MIN_SAMPLES,
) -> ProcessFlag | None:
    """`memory_growth` when the RSS readings `(time, bytes)` grow steadily."""
    points = [(float(t), float(r)) for t, r in series if r is not None]
    if len(points) < min_samples:
        return None
    span = points[-1][0] - points[0][0]
    if span <= 0:
        return None
    per_min = _slope(points) * 60 / MB
    gained = points[-1][1] - points[0][1]
    rises = sum(1 for (_, a), (_, b) in itertools.pairwise(points) if b > a)
    steady = rises >= RISING_SHARE * (len(points) - 1)
    if per_min < threshold_mb_per_min or not steady or gained < 0.5 * per_min * MB * span / 60:
        return None
    evidence = (f"RSS grew from {format_bytes(int(points[0][1]))} to "
                f"{format_bytes(int(points[-1][1]))} in {span:.0f}s, {per_min:.0f} MB/min over "
                f"{len(points)} samples (threshold {threshold_mb_per_min:g} MB/min)")  # fmt: skip
    return ProcessFlag("memory_growth", evidence, MEMORY_GROWTH_REMEDY.format(pid=pid))


class SampleHistory:
    """Per process, its RSS readings across samples; per node, the ranks last seen."""

    def __init__(self, max_points: int = MAX_POINTS) -> None:
        self.max_points = max_points
        self.rss: dict[ProcessKey, deque[tuple[float, int]]] = {}
        self._cmdline: dict[str, dict[int, str]] = {}  # node -> pid -> command line
        self._ranks: dict[str, dict[int, tuple[int, str | None]]] = {}  # node -> pid -> rank
        self._seen_at: dict[str, float] = {}
        # (node, pid) -> (time, mean util %, GPU memory, rank, GPU indices) per sample
        self.gpu: dict[
            ProcessKey, deque[tuple[float, float, int | None, int, tuple[int, ...]]]
        ] = {}
        self.samples = 0

    def add(self, nodes: Iterable[dict[str, Any]], at: float) -> list[GoneRank]:
        """One sample of every node (`nodes --json` entries); returns the ranks gone from a
        node that answered both this sample and the one before (a node that did not answer
        says nothing about its ranks)."""
        self.samples += 1
        gone: list[GoneRank] = []
        for node in nodes:
            if node.get("state") != "up":
                continue
            procs = (
                (p.get("pid"), p.get("cmdline"), p.get("rss"), p.get("rank"), p.get("role"))
                for p in node.get("processes") or []
            )
            gone += self.add_node(str(node.get("name")), procs, at)
            self.add_gpus(str(node.get("name")), node, at)
        return gone

    def add_node(self, name: str, procs: Iterable[ProcessFacts], at: float) -> list[GoneRank]:
        """One node's sample: `(pid, cmdline, rss, rank, role)` of each process."""
        ranks: dict[int, tuple[int, str | None]] = {}
        present: set[int] = set()
        cmdlines = self._cmdline.setdefault(name, {})
        for pid, cmdline, rss, rank, role in procs:
            if type(pid) is not int:
                continue
            present.add(pid)
            key = (name, pid)
            cmd = str(cmdline or "")
            if cmdlines.get(pid) != cmd:  # a new process (or a reused pid)
                cmdlines[pid] = cmd
                self.rss.pop(key, None)
                self.gpu.pop(key, None)
            if type(rss) is int or (isinstance(rss, float) and rss == rss):
                series = self.rss.get(key)
                if series is None and len(self.rss) < MAX_PROCESSES:
                    series = self.rss[key] = deque(maxlen=self.max_points)
                if series is not None:
                    series.append((at, int(rss)))
            if type(rank) is int:
                ranks[pid] = (rank, role if isinstance(role, str) else None)
        gone = []
        before = self._ranks.get(name)
        if before is not None:
            for pid, (rank, role) in sorted(before.items(), key=lambda kv: kv[1][0]):
                if pid not in ranks:
                    gone.append(GoneRank(name, pid, rank, role, self._seen_at[name]))
        self._ranks[name] = ranks
        self._seen_at[name] = at
        for pid in [p for p in cmdlines if p not in present]:
            self.rss.pop((name, pid), None)  # the process ended: its series goes with it
            self.gpu.pop((name, pid), None)
            del cmdlines[pid]
        return gone

    def add_gpus(self, name: str, node: dict[str, Any], at: float) -> None:
        """Each rank's GPU utilisation in this sample: the mean over the GPUs NVML says it
        uses (none where NVML is absent: no GPUs, nothing recorded)."""
        utils = {}
        for g in node.get("gpus") or []:
            util = g.get("util")
            if type(g.get("index")) is int and isinstance(util, int | float):
                utils[g["index"]] = float(util)
        if not utils:
            return
        for p in node.get("processes") or []:
            pid, rank, gpus = p.get("pid"), p.get("rank"), p.get("gpus")
            if type(pid) is not int or type(rank) is not int or not isinstance(gpus, list):
                continue
            mine = tuple(i for i in gpus if i in utils)
            if not mine:
                continue
            mean = sum(utils[i] for i in mine) / len(mine)
            memory = p.get("gpu_memory") if type(p.get("gpu_memory")) is int else None
            key = (name, pid)
            if key not in self.gpu and len(self.gpu) >= MAX_PROCESSES:
                continue
            self.gpu.setdefault(key, deque(maxlen=self.max_points)).append(
                (at, mean, memory, rank, mine)
            )

    def gpu_spread(self) -> tuple[list[RankGpu], list[IdleRank]]:
        """Every rank's GPU use across the samples, and the ranks idle while the others are
        busy (at least MIN_SAMPLES samples of the rank; at least two ranks)."""
        ranks = []
        for (node, pid), points in self.gpu.items():
            if not points:
                continue
            _, _, memory, rank, gpus = points[-1]
            util = sum(u for _, u, _, _, _ in points) / len(points)
            ranks.append(RankGpu(node, pid, rank, gpus, util, len(points), memory))
        ranks.sort(key=lambda r: (r.rank, r.node, r.pid))
        idle = []
        if len(ranks) >= 2:
            for r in ranks:
                if r.samples < MIN_SAMPLES or r.util > IDLE_UTIL:
                    continue
                others = sorted(o.util for o in ranks if o is not r)
                mid = len(others) // 2
                median = others[mid] if len(others) % 2 else (others[mid - 1] + others[mid]) / 2
                if median >= BUSY_UTIL:
                    idle.append(IdleRank(r, median))
        return ranks, idle

    def series(self, node: str, pid: int) -> list[tuple[float, int]]:
        return list(self.rss.get((node, pid), ()))

    def trend(self, node: str, pid: int, width: int = 8) -> str:
        """A sparkline of the process's last `width` RSS readings ("" with fewer than 2)."""
        series = self.rss.get((node, pid))
        if series is None or len(series) < 2:
            return ""
        tail = [r for _, r in list(series)[-width:]]
        lo, hi = min(tail), max(tail)
        if hi == lo:
            return SPARKS[0] * len(tail)
        top = len(SPARKS) - 1
        return "".join(SPARKS[round((r - lo) / (hi - lo) * top)] for r in tail)

    def flags(self, node: str, pid: int) -> list[ProcessFlag]:
        found = memory_growth(self.series(node, pid), pid)
        return [found] if found is not None else []

    def annotate(self, nodes: Iterable[dict[str, Any]]) -> None:
        """Each process gains `rss_series` ([[time, bytes], ...]) and `flags`."""
        for node in nodes:
            name = str(node.get("name"))
            for p in node.get("processes") or []:
                pid = p.get("pid")
                if type(pid) is not int:
                    continue
                p["rss_series"] = [[round(t, 3), r] for t, r in self.series(name, pid)]
                p["flags"] = [f.to_json() for f in self.flags(name, pid)]


@dataclass(frozen=True, slots=True)
class MemoryTrend:
    spark: str  # the last readings' sparkline ("" with fewer than 2)
    growth: ProcessFlag | None


def memory_trends(
    history: SampleHistory, keys: Iterable[ProcessKey]
) -> dict[ProcessKey, MemoryTrend]:
    """The trend of each (node, pid) that has a series of two readings or more."""
    out = {}
    for node, pid in keys:
        spark = history.trend(node, pid)
        if not spark:
            continue
        series = history.rss[(node, pid)]
        growth = None
        if series[-1][1] > series[max(0, len(series) - GROWTH_WINDOW)][1]:  # rose at all
            growth = memory_growth(list(series)[-GROWTH_WINDOW:], pid)
        out[(node, pid)] = MemoryTrend(spark, growth)
    return out
