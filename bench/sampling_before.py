"""The previous core/connection/sampling.py, unchanged but for this line: the baseline of
bench/bench_sampling.py (the calls the Cluster screen's monitor made before the
incremental path).

What repeated samples of the fleet show that one sample cannot: each process's RSS
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
GROWTH_WINDOW = 20  # the latest readings the live screen judges growth on
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


def memory_growth(
    series: Sequence[tuple[float, int]],
    pid: int,
    threshold_mb_per_min: float = GROWTH_MB_PER_MIN,
    min_samples: int = MIN_SAMPLES,
) -> ProcessFlag | None:
    """`memory_growth` when the RSS readings `(time, bytes)` grow steadily."""
    points = [(float(t), float(r)) for t, r in series if r is not None]
    n = len(points)
    if n < min_samples:
        return None
    span = points[-1][0] - points[0][0]
    if span <= 0:
        return None
    # One pass: the least-squares slope (bytes/s) and how many readings rose.
    st = sy = stt = sty = 0.0
    rises = 0
    prev = None
    for t, y in points:
        t -= points[0][0]
        st += t
        sy += y
        stt += t * t
        sty += t * y
        if prev is not None and y > prev:
            rises += 1
        prev = y
    sxx = stt - st * st / n
    per_min = (sty - st * sy / n) / sxx * 60 / MB if sxx > 0 else 0.0
    gained = points[-1][1] - points[0][1]
    steady = rises >= RISING_SHARE * (n - 1)
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
        # node -> (pids, (rank, command line) of each, each pid's RSS series), last sample
        self._layout: dict[str, tuple[tuple[Any, ...], tuple[Any, ...], list[Any]]] = {}
        # node -> GPU index -> [sum of utilisation, readings] over the node's samples
        self._gpu_sums: dict[str, dict[int, list[float]]] = {}
        # node -> (pid, rank, GPU indices, GPU memory) of its ranks on GPUs, last sample
        self._gpu_ranks: dict[str, list[tuple[int, int, tuple[int, ...], int | None]]] = {}
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
        """One node's sample: `(pid, cmdline, rss, rank, role)` of each process. The same
        processes (pids and command lines) with the same ranks as in the node's last sample
        (the steady state) cost one append per process; any change is looked at in full."""
        facts = list(procs)
        pids = tuple(f[0] for f in facts)
        ranks_now = tuple((f[3], f[1]) for f in facts)
        last = self._layout.get(name)
        if last is not None and last[0] == pids and last[1] == ranks_now:
            for series, f in zip(last[2], facts, strict=True):
                rss = f[2]
                if series is not None and type(rss) is int:
                    series.append((at, rss))
            self._seen_at[name] = at
            return []
        gone = self._add_node_full(name, facts, at)
        self._layout[name] = (pids, ranks_now, [self.rss.get((name, pid)) for pid in pids])
        return gone

    def _add_node_full(self, name: str, procs: list[ProcessFacts], at: float) -> list[GoneRank]:
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
            del cmdlines[pid]
        return gone

    def add_gpus(self, name: str, node: dict[str, Any], at: float) -> None:
        """The node's GPU utilisation in this sample and which ranks use which GPUs
        (nothing where NVML is absent: no GPUs)."""
        utils = [
            (g["index"], float(g["util"]))
            for g in node.get("gpus") or []
            if type(g.get("index")) is int and isinstance(g.get("util"), int | float)
        ]
        if not utils:
            return
        ranks = [
            (p["pid"], p["rank"], tuple(p["gpus"]), p.get("gpu_memory"))
            for p in node.get("processes") or []
            if type(p.get("pid")) is int and type(p.get("rank")) is int and p.get("gpus")
            and isinstance(p["gpus"], list)
        ]  # fmt: skip
        self.add_gpu_readings(name, utils, ranks)

    def add_gpu_readings(
        self,
        name: str,
        utils: Iterable[tuple[int, float]],
        ranks: list[tuple[int, int, tuple[int, ...], int | None]],
    ) -> None:
        """`(index, util %)` of each GPU, `(pid, rank, GPU indices, GPU memory)` of each
        rank on GPUs."""
        sums = self._gpu_sums.setdefault(name, {})
        for index, util in utils:
            acc = sums.get(index)
            if acc is None:
                sums[index] = [util, 1.0]
            else:
                acc[0] += util
                acc[1] += 1.0
        self._gpu_ranks[name] = ranks

    def gpu_spread(self) -> tuple[list[RankGpu], list[IdleRank]]:
        """Every rank's GPU use across the samples (the mean utilisation of the GPUs it
        uses over the node's samples), and the ranks idle while the others are busy (at
        least MIN_SAMPLES samples; at least two ranks)."""
        ranks = []
        for node, entries in self._gpu_ranks.items():
            sums = self._gpu_sums.get(node, {})
            for pid, rank, gpus, memory in entries:
                mine = [sums[i] for i in gpus if i in sums]
                if not mine:
                    continue
                util = sum(total / n for total, n in mine) / len(mine)
                samples = int(min(n for _, n in mine))
                held = memory if type(memory) is int else None
                ranks.append(RankGpu(node, pid, rank, tuple(gpus), util, samples, held))
        ranks.sort(key=lambda r: (r.rank, r.node, r.pid))
        idle = []
        if len(ranks) >= 2:
            utils = sorted(r.util for r in ranks)
            for r in ranks:
                if r.samples < MIN_SAMPLES or r.util > IDLE_UTIL:
                    continue
                others = list(utils)
                others.remove(r.util)
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
        tail = [series[i][1] for i in range(-min(width, len(series)), 0)]
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
        (t0, r0), (t1, r1) = series[max(0, len(series) - GROWTH_WINDOW)], series[-1]
        # What `memory_growth` asks at least (half the threshold's gain over the window),
        # in O(1): a steady process is ruled out without its readings being looked at.
        if t1 > t0 and r1 - r0 >= 0.5 * GROWTH_MB_PER_MIN * MB * (t1 - t0) / 60:
            growth = memory_growth(_last(series, GROWTH_WINDOW), pid)
        out[(node, pid)] = MemoryTrend(spark, growth)
    return out


def _last(series: deque[tuple[float, int]], n: int) -> list[tuple[float, int]]:
    """The last `n` readings, oldest first (without copying the whole deque)."""
    return list(itertools.islice(reversed(series), n))[::-1]
