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

import bisect
import functools
import itertools
import operator
from collections import deque
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from typing import Any

from areal_console.core.common.textfmt import format_bytes
from areal_console.core.connection.records import GpuRow, ProcessRow
from areal_console.core.connection.rss_window import (
    WINDOW,
    NodeBlock,
    block_verdicts,
)

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
SPARK_WIDTH = 8  # readings in a process's RSS sparkline

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
RankOnGpu = tuple[int, int, tuple[int, ...], int | None]  # (pid, rank, GPUs, GPU memory)
# (mean util, samples, node, pid, rank, GPUs, GPU memory) of a rank on GPUs
RankUtil = tuple[float, int, str, int, int, tuple[int, ...], Any]


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
    return growth_flag(pid, n, points[0], points[-1], (st, sy, stt, sty), rises,
                       threshold_mb_per_min)  # fmt: skip


def growth_flag(
    pid: int,
    n: int,
    first: tuple[float, float],
    last: tuple[float, float],
    sums: tuple[float, float, float, float],
    rises: int,
    threshold_mb_per_min: float = GROWTH_MB_PER_MIN,
) -> ProcessFlag | None:
    """`memory_growth`'s verdict from its readings' sums: `n` readings `(time, bytes)`
    from `first` to `last` (a later time), the sums of t, y, t*t and t*y (t the time
    since the first reading, each summed in reading order) and how many readings rose."""
    st, sy, stt, sty = sums
    points = (first, last)
    span = last[0] - first[0]
    sxx = stt - st * st / n
    per_min = (sty - st * sy / n) / sxx * 60 / MB if sxx > 0 else 0.0
    gained = points[-1][1] - points[0][1]
    steady = rises >= RISING_SHARE * (n - 1)
    if per_min < threshold_mb_per_min or not steady or gained < 0.5 * per_min * MB * span / 60:
        return None
    evidence = (f"RSS grew from {format_bytes(int(points[0][1]))} to "
                f"{format_bytes(int(points[-1][1]))} in {span:.0f}s, {per_min:.0f} MB/min over "
                f"{n} samples (threshold {threshold_mb_per_min:g} MB/min)")  # fmt: skip
    return ProcessFlag("memory_growth", evidence, MEMORY_GROWTH_REMEDY.format(pid=pid))


@dataclass(slots=True)
class _Layout:
    """A node's processes as its last sample listed them."""

    pids: tuple[Any, ...]
    ranks: tuple[Any, ...]  # (rank, command line) of each
    series: list[deque[tuple[float, int]] | None]  # each one's RSS series, if it has one
    columns: list[ProcessKey]  # the processes with a series, in order: the block's columns
    block: NodeBlock  # their last readings side by side, since this layout
    all_series: bool  # every process has a series


class SampleHistory:
    """Per process, its RSS readings across samples; per node, the ranks last seen."""

    def __init__(self, max_points: int = MAX_POINTS) -> None:
        self.max_points = max_points
        self.rss: dict[ProcessKey, deque[tuple[float, int]]] = {}
        self._cmdline: dict[str, dict[int, str]] = {}  # node -> pid -> command line
        self._ranks: dict[str, dict[int, tuple[int, str | None]]] = {}  # node -> pid -> rank
        self._seen_at: dict[str, float] = {}
        # node -> its processes in its last sample, their series and their last readings
        self._layout: dict[str, _Layout] = {}
        # node -> GPU index -> [sum of utilisation, readings] over the node's samples
        self._gpu_sums: dict[str, dict[int, list[float]]] = {}
        # node -> its ranks on GPUs in its last sample: (pid, rank, GPU indices, GPU memory)
        # of each, or the sample's process rows
        self._gpu_ranks: dict[str, Sequence[RankOnGpu] | Sequence[ProcessRow]] = {}
        # node -> (its GPU indices, each steady sample's readings in that order), not yet
        # added to its sums
        self._gpu_waiting: dict[str, tuple[tuple[int, ...], list[tuple[Any, ...]]]] = {}
        self.samples = 0
        # (node, pid) -> its trend as `memory_trends` last made it (kept when unchanged)
        self.trends_cache: dict[ProcessKey, MemoryTrend] = {}
        self.flat_trends: dict[str, MemoryTrend] = {}  # sparkline -> its trend without growth

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
        if last is not None and last.pids == pids and last.ranks == ranks_now:
            self._add_steady(name, last, [f[2] for f in facts], at)
            return []
        return self._add_full(name, facts, pids, ranks_now, at)

    def add_rows(self, name: str, rows: Sequence[ProcessRow], at: float) -> list[GoneRank]:
        """`add_node` from the live monitor's typed rows: in the steady state (the same
        pids, command lines and ranks as the node's last sample) one append per process,
        with no record built for any of them."""
        last = self._layout.get(name)
        if last is not None and len(last.pids) == len(rows):
            pids, ranks_before = last.pids, last.ranks
            for i, p in enumerate(rows):
                if p.pid != pids[i] or ranks_before[i] != (p.rank, p.cmdline):
                    break
            else:
                self._add_steady(name, last, [p.rss for p in rows], at)
                return []
        return self.add_node(name, ((p.pid, p.cmdline, p.rss, p.rank, p.role) for p in rows), at)

    def _add_steady(self, name: str, layout: _Layout, readings: list[Any], at: float) -> None:
        block = layout.block
        self._seen_at[name] = at
        if block.whole:
            if layout.all_series:
                taken = readings
            else:
                taken = [r for s, r in zip(layout.series, readings, strict=True) if s is not None]
            if set(map(type, taken)) <= {int} and block.add(at, taken):
                return
            block.flush()
            block.whole = False
        for series, rss in zip(layout.series, readings, strict=True):
            if series is not None and type(rss) is int:
                series.append((at, rss))

    def _add_full(
        self,
        name: str,
        facts: list[ProcessFacts],
        pids: tuple[Any, ...],
        ranks_now: tuple[Any, ...],
        at: float,
    ) -> list[GoneRank]:
        self.flush(name)
        gone = self._add_node_full(name, facts, at)
        series = [self.rss.get((name, pid)) for pid in pids]
        columns = [(name, pid) for pid, s in zip(pids, series, strict=True) if s is not None]
        block = NodeBlock([s for s in series if s is not None])
        # A pid twice in one sample shares one series: no block stands for it.
        block.whole = len(set(columns)) == len(columns) and self.max_points >= WINDOW
        all_series = len(columns) == len(series)
        self._layout[name] = _Layout(pids, ranks_now, series, columns, block, all_series)
        return gone

    def flush(self, name: str | None = None) -> None:
        """Put the readings a node's block holds (every node's: `name` None) into the
        series, before they are read one by one."""
        if name is None:
            for each in self._layout.values():
                each.block.flush()
        elif (one := self._layout.get(name)) is not None:
            one.block.flush()

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
        ranks: Sequence[RankOnGpu] | Sequence[ProcessRow],
    ) -> None:
        """`(index, util %)` of each GPU; the ranks on GPUs: `(pid, rank, GPU indices, GPU
        memory)` of each, or the sample's process rows (the live monitor's: they are read
        only when a verdict is asked for, not at every sample)."""
        self._fold(name)
        sums = self._gpu_sums.get(name)
        if sums is None:
            sums = self._gpu_sums[name] = {}
        for index, util in utils:
            acc = sums.get(index)
            if acc is None:
                sums[index] = [util, 1.0]
            else:
                acc[0] += util
                acc[1] += 1.0
        self._gpu_ranks[name] = ranks

    def add_gpu_rows(self, name: str, gpus: Sequence[GpuRow], procs: Sequence[ProcessRow]) -> None:
        """One sample of a node's GPUs and processes as the live monitor types them. The
        same GPUs as in the node's last sample, each with a reading: their readings wait
        in a row, added up when a verdict is asked for (`_fold`)."""
        if not gpus:
            return
        utils = tuple(g.util for g in gpus)
        if None in utils:
            self._fold(name)
            self.add_gpu_readings(
                name, [(g.index, float(g.util)) for g in gpus if g.util is not None], procs
            )
            return
        indices = tuple(g.index for g in gpus)
        waiting = self._gpu_waiting.get(name)
        if waiting is None or waiting[0] != indices:
            self._fold(name)
            if len(set(indices)) != len(indices):  # a GPU twice: added reading by reading
                readings = [(g.index, float(g.util or 0)) for g in gpus]  # none is None
                self.add_gpu_readings(name, readings, procs)
                return
            waiting = self._gpu_waiting[name] = (indices, [])
        waiting[1].append(utils)
        self._gpu_ranks[name] = procs

    def _fold(self, name: str) -> None:
        """Add the node's waiting GPU readings to its sums, GPU by GPU in sample order (the
        same additions, in the same order, as one sample at a time)."""
        waiting = self._gpu_waiting.pop(name, None)
        if waiting is None or not waiting[1]:
            return
        sums = self._gpu_sums.get(name)
        if sums is None:
            sums = self._gpu_sums[name] = {}
        indices, rows = waiting
        for index, column in zip(indices, zip(*rows, strict=True), strict=True):
            acc = sums.get(index)
            if acc is None:
                acc = sums[index] = [0.0, 0.0]
            acc[0] = functools.reduce(operator.add, column, acc[0])
            acc[1] += len(column)

    def _rank_utils(self) -> list[RankUtil]:
        """`(mean util, samples, node, pid, rank, GPUs, memory)` of every rank on GPUs."""
        for name in list(self._gpu_waiting):
            self._fold(name)
        out: list[RankUtil] = []
        for node, entries in self._gpu_ranks.items():
            sums = self._gpu_sums.get(node, {})
            means = {i: (total / n, n) for i, (total, n) in sums.items()}
            for entry in entries:
                if isinstance(entry, tuple):
                    pid, rank, gpus, memory = entry
                else:  # a ProcessRow of the live monitor
                    if entry.rank is None or not entry.gpus:
                        continue
                    pid, rank, gpus = entry.pid, entry.rank, entry.gpus
                    memory = None if entry.gpu_memory is None else int(entry.gpu_memory)
                if len(gpus) == 1:  # the common case: one GPU a rank
                    found = means.get(gpus[0])
                    if found is None:
                        continue
                    out.append((found[0], int(found[1]), node, pid, rank, gpus, memory))
                    continue
                mine = [means[i] for i in gpus if i in means]
                if not mine:
                    continue
                util = sum(mean for mean, _ in mine) / len(mine)
                out.append((util, int(min(n for _, n in mine)), node, pid, rank, gpus, memory))
        return out

    def gpu_spread(self) -> tuple[list[RankGpu], list[IdleRank]]:
        """Every rank's GPU use across the samples (the mean utilisation of the GPUs it
        uses over the node's samples), and the ranks idle while the others are busy (at
        least MIN_SAMPLES samples; at least two ranks)."""
        found = self._rank_utils()
        ranks = [_rank_gpu(f) for f in found]
        ranks.sort(key=lambda r: (r.rank, r.node, r.pid))
        return ranks, _idle(ranks, sorted(r.util for r in ranks))

    def idle_ranks(self) -> list[IdleRank]:
        """`gpu_spread()[1]`, with a record made only for the ranks at or below IDLE_UTIL
        (the live screen asks for the idle ones alone; 4,096 records every few seconds
        would cost more than the sampling itself)."""
        found = self._rank_utils()
        if len(found) < 2:
            return []
        low = [_rank_gpu(f) for f in found if f[0] <= IDLE_UTIL and f[1] >= MIN_SAMPLES]
        low.sort(key=lambda r: (r.rank, r.node, r.pid))
        return _idle(low, sorted(f[0] for f in found))

    def layouts(self) -> list[_Layout]:
        return list(self._layout.values())

    def series(self, node: str, pid: int) -> list[tuple[float, int]]:
        self.flush(node)
        return list(self.rss.get((node, pid), ()))

    def trend(self, node: str, pid: int, width: int = SPARK_WIDTH) -> str:
        """A sparkline of the process's last `width` RSS readings ("" with fewer than 2)."""
        self.flush(node)
        series = self.rss.get((node, pid))
        if series is None or len(series) < 2:
            return ""
        return _spark([series[i][1] for i in range(-min(width, len(series)), 0)])

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


def _rank_gpu(found: RankUtil) -> RankGpu:
    util, samples, node, pid, rank, gpus, memory = found
    held = memory if type(memory) is int else None
    return RankGpu(node, pid, rank, tuple(gpus), util, samples, held)


def _idle(candidates: list[RankGpu], utils: list[float]) -> list[IdleRank]:
    """The candidates idle while the median of the other ranks' utilisation (`utils`: every
    rank's, sorted, the candidate's own among them) is busy."""
    if len(utils) < 2:
        return []
    idle = []
    for r in candidates:
        if r.samples < MIN_SAMPLES or r.util > IDLE_UTIL:
            continue
        median = _median_without(utils, r.util)
        if median >= BUSY_UTIL:
            idle.append(IdleRank(r, median))
    return idle


def _median_without(ordered: list[float], value: float) -> float:
    """The median of the sorted `ordered` with one `value` taken out (no copy)."""
    at = bisect.bisect_left(ordered, value)
    n = len(ordered) - 1

    def nth(i: int) -> float:  # the i-th of the others
        return ordered[i if i < at else i + 1]

    mid = n // 2
    return nth(mid) if n % 2 else (nth(mid - 1) + nth(mid)) / 2


@dataclass(frozen=True, slots=True)
class MemoryTrend:
    spark: str  # the last readings' sparkline ("" with fewer than 2)
    growth: ProcessFlag | None


def memory_trends(
    history: SampleHistory, keys: Iterable[ProcessKey] | None = None
) -> dict[ProcessKey, MemoryTrend]:
    """The trend of each (node, pid) in `keys` (None: every process) that has a series of
    two readings or more, from its last readings only: a steady process is ruled out of the
    growth check without its readings being looked at one by one. The processes of a node
    whose block stands for their series (the same processes for GROWTH_WINDOW samples or
    more) are worked out together, in array operations (`block_verdicts`); the others one
    by one."""
    least = 0.5 * GROWTH_MB_PER_MIN * MB  # a minute's gain `memory_growth` asks at least
    together, alone = [], []
    for lay in history.layouts():
        if lay.block.whole and lay.block.count >= GROWTH_WINDOW:
            together.append(lay)
        else:
            lay.block.flush()  # its series are read one by one
            alone.append(lay)
    verdicts = block_verdicts([lay.block for lay in together], SPARK_WIDTH, GROWTH_WINDOW,
                              least, SPARKS)  # fmt: skip
    before = history.trends_cache
    flat = history.flat_trends  # a steady process's trend: one record per sparkline
    found: dict[ProcessKey, MemoryTrend] = {}
    for lay, verdict in zip(together, verdicts, strict=True):
        for key, spark, sums in zip(lay.columns, verdict.sparks, verdict.candidates, strict=True):
            growth = None if sums is None else growth_flag(key[1], GROWTH_WINDOW, *sums)
            if growth is None:
                trend = flat.get(spark)
                if trend is None:
                    trend = flat[spark] = MemoryTrend(spark, None)
            else:
                trend = MemoryTrend(spark, growth)
            found[key] = trend
    for lay in alone:
        for key in lay.columns:
            one = _trend_alone(history.rss.get(key), key[1], least)
            if one is not None:
                hit = before.get(key)
                found[key] = hit if hit == one else one
    history.trends_cache = found
    if len(flat) > MAX_PROCESSES:
        flat.clear()
    # In the order of the keys (None: of the series, oldest first).
    return {key: found[key] for key in (history.rss if keys is None else keys) if key in found}


def _trend_alone(
    series: deque[tuple[float, int]] | None, pid: int, least: float
) -> MemoryTrend | None:
    """One process's trend from its series (None with fewer than two readings)."""
    if series is None or len(series) < 2:
        return None
    n = len(series)
    tail = [series[i][1] for i in range(-SPARK_WIDTH if n > SPARK_WIDTH else -n, 0)]
    growth = None
    t0, r0 = series[n - GROWTH_WINDOW if n > GROWTH_WINDOW else 0]
    t1, r1 = series[-1]
    # What `memory_growth` asks at least (half the threshold's gain over the window), in
    # O(1).
    if t1 > t0 and r1 - r0 >= least * (t1 - t0) / 60:
        growth = memory_growth(_last(series, GROWTH_WINDOW), pid)
    return MemoryTrend(_spark(tail), growth)


def _spark(tail: list[int]) -> str:
    lo, hi = min(tail), max(tail)
    if hi == lo:
        return SPARKS[0] * len(tail)
    top = len(SPARKS) - 1
    return "".join(SPARKS[round((r - lo) / (hi - lo) * top)] for r in tail)


def _last(series: deque[tuple[float, int]], n: int) -> list[tuple[float, int]]:
    """The last `n` readings, oldest first (without copying the whole deque)."""
    return list(itertools.islice(reversed(series), n))[::-1]
