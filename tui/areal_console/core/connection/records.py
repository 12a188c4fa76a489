"""Typed rows of a node's live sample: its GPUs and its processes, as the screens read them.

The agent speaks JSON (docs/design/agent-protocol.md); a sample's records are checked and
converted here once, when the sample arrives, so the screens use attributes and never
look up keys. A value of the wrong type becomes None (the screens show `-`), so a newer or
odd agent cannot crash a view. Numbers keep their own type (an int stays an int): the
screens print them as they came.
"""

from __future__ import annotations

import dataclasses
from collections import Counter
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from areal_console.core.common.textfmt import MAX_CMDLINE, capped
from areal_console.core.targets.areal_world import areal_world_key


def _int(value: Any) -> int | None:
    if type(value) is int:  # the common case, without the subclass checks
        return value
    return value if isinstance(value, int) and not isinstance(value, bool) else None


def _number(value: Any) -> float | None:
    """An int or a float as it came (an int prints without a decimal point), else None."""
    kind = type(value)
    if kind is int or kind is float:  # the common case, without the subclass checks
        return value
    return value if isinstance(value, int | float) and not isinstance(value, bool) else None


def _as_float(value: Any) -> float | None:
    """A number as a float (None: not a number, or too large for one)."""
    number = _number(value)
    try:
        return None if number is None else float(number)
    except OverflowError:
        return None


def _text(value: Any) -> str | None:
    return None if value is None else str(value)


@dataclass(frozen=True, slots=True)
class GpuRow:
    """One GPU of a node (the agent's NVML record)."""

    index: int
    name: str | None = None
    uuid: str | None = None
    util: float | None = None  # percent
    mem_used: float | None = None  # bytes (an agent may send a float)
    mem_total: float | None = None
    temp: float | None = None  # °C
    power: float | None = None  # W

    @classmethod
    def from_agent(cls, raw: Mapping[str, Any]) -> GpuRow | None:
        """The row of one agent GPU record; None for a record without a GPU index."""
        index = _int(raw.get("index"))
        if index is None:
            return None
        return cls(
            index=index,
            name=_text(raw.get("name")),
            uuid=_text(raw.get("uuid")),
            util=_number(raw.get("util")),
            mem_used=_number(raw.get("mem_used")),
            mem_total=_number(raw.get("mem_total")),
            temp=_number(raw.get("temp")),
            power=_number(raw.get("power")),
        )

    def with_readings(self, values: Any) -> GpuRow | None:
        """This GPU with a readings-only sample's `[util, mem_used, temp, power]`; None
        when `values` is not such a list."""
        if type(values) is not list or len(values) != 4:
            return None
        util, mem_used, temp, power = values
        return GpuRow(self.index, self.name, self.uuid, _number(util), _number(mem_used),
                      self.mem_total, _number(temp), _number(power))  # fmt: skip


@dataclass(frozen=True, slots=True)
class ServerHealth:
    """The agent's last `GET /health` answer of an inference server."""

    ok: bool
    latency_ms: float | None = None
    error: str | None = None


@dataclass(frozen=True, slots=True)
class ServerFlagRow:
    kind: str
    evidence: str
    remedy: str
    config_key: str


@dataclass(frozen=True, slots=True)
class ServerRow:
    """An inference server a process runs: its kind, URL and last health answer, and
    (when the agent polled its own listening port) its metrics, served weight version,
    pause state, flags and recent throughput."""

    kind: str | None
    url: str
    health: ServerHealth | None  # None: not polled yet
    metrics: tuple[tuple[str, float], ...] = ()
    weight_version: int | str | None = None
    paused: bool | None = None
    flags: tuple[ServerFlagRow, ...] = ()
    throughput: tuple[float, ...] = ()

    def metric(self, *names: str) -> float | None:
        """The first of `names` the server reported."""
        found = dict(self.metrics)
        for name in names:
            if name in found:
                return found[name]
        return None

    @property
    def address(self) -> str:
        return self.url.removeprefix("http://").split("/", 1)[0]

    @property
    def down(self) -> bool:
        """Polled, and it did not answer healthy."""
        return self.health is not None and not self.health.ok

    @classmethod
    def from_agent(cls, raw: Any) -> ServerRow | None:
        if not isinstance(raw, Mapping) or not raw:
            return None
        polled = raw.get("health")
        health = (
            ServerHealth(
                ok=bool(polled.get("ok")),
                latency_ms=_number(polled.get("latency_ms")),
                error=_text(polled.get("error")),
            )
            if isinstance(polled, Mapping)
            else None
        )
        metrics = raw.get("metrics")
        version = raw.get("weight_version")
        flags = raw.get("flags")
        rates = raw.get("throughput")
        return cls(
            kind=_text(raw.get("kind")),
            url=str(raw.get("url") or ""),
            health=health,
            metrics=tuple(
                (str(k)[:100], x)
                for k, v in (list(metrics.items())[:64] if isinstance(metrics, Mapping) else ())
                if (x := _as_float(v)) is not None
            ),
            weight_version=(
                version
                if isinstance(version, int | str) and not isinstance(version, bool)
                else None
            ),
            paused=raw.get("paused") if isinstance(raw.get("paused"), bool) else None,
            flags=tuple(
                ServerFlagRow(
                    *(
                        str(f.get(k) or "")[:500]
                        for k in ("kind", "evidence", "remedy", "config_key")
                    )
                )
                for f in (flags[:16] if isinstance(flags, list) else ())
                if isinstance(f, Mapping)
            ),
            throughput=tuple(
                y
                for x in (rates[-60:] if isinstance(rates, list) else ())
                if (y := _as_float(x)) is not None
            ),
        )


# The fields of an agent process record that change from one sample to the next.
_READINGS = ("cpu_percent", "rss", "state", "gpu_memory")


@dataclass(frozen=True, slots=True)
class ProcessRow:
    """One process of a node's sample: a rank, an AReaL worker, a server or a launcher."""

    pid: int
    ppid: int | None = None
    cmdline: str = ""
    rank: int | None = None
    local_rank: int | None = None
    world_size: int | None = None
    role: str | None = None
    job: str | None = None
    worker_index: int | None = None
    server: ServerRow | None = None
    cpu_percent: float | None = None
    rss: float | None = None  # bytes
    state: str | None = None  # the kernel's one-letter state (`Z` zombie)
    gpus: tuple[int, ...] = ()
    gpu_memory: float | None = None  # bytes, from NVML; None where not reported
    env: Mapping[str, str] = field(default_factory=dict, compare=False)  # rank variables
    env_error: str | None = None
    stdout: str | None = None  # the file its output goes to (a `> run.log`), its user's
    user: str | None = None  # the process's user on its node
    # The agent's record as it came, for core code that takes agent records (captures).
    raw: Mapping[str, Any] = field(default_factory=dict, compare=False, repr=False)

    @classmethod
    def from_agent(cls, raw: Mapping[str, Any]) -> ProcessRow | None:
        """The row of one agent process record; None for a record without a pid."""
        pid = _int(raw.get("pid"))
        if pid is None:
            return None
        gpus = raw.get("gpus")
        env = raw.get("env")
        cmdline = str(raw.get("cmdline") or "")
        if len(cmdline) > MAX_CMDLINE:  # another user's: up to 2 MB (ARG_MAX) each
            cmdline = capped(cmdline, MAX_CMDLINE)
            raw = {**raw, "cmdline": cmdline}
        return cls(
            pid=pid,
            ppid=_int(raw.get("ppid")),
            cmdline=cmdline,
            rank=_int(raw.get("rank")),
            local_rank=_int(raw.get("local_rank")),
            world_size=_int(raw.get("world_size")),
            role=_text(raw.get("role")),
            job=_text(raw.get("job")),
            worker_index=_int(raw.get("worker_index")),
            server=ServerRow.from_agent(raw.get("server")),
            cpu_percent=_number(raw.get("cpu_percent")),
            rss=_number(raw.get("rss")),
            state=_text(raw.get("state")),
            gpus=tuple(g for g in gpus if _int(g) is not None) if isinstance(gpus, list) else (),
            gpu_memory=_number(raw.get("gpu_memory")),
            env={str(k): str(v) for k, v in env.items()} if isinstance(env, Mapping) else {},
            env_error=_text(raw.get("env_error")),
            stdout=_text(raw.get("stdout")),
            user=_text(raw.get("user")),
            raw=raw,
        )

    def refreshed(self, raw: Mapping[str, Any]) -> ProcessRow | None:
        """This row with the readings of a newer record of the same process (`raw`: the
        same fields but for CPU, RSS, state and GPU memory, which change every sample);
        None when anything else differs (the record is typed in full then). What did not
        change is not checked and converted again."""
        old = self.raw
        if len(raw) != len(old):
            return None
        probe = dict(raw)
        for key in _READINGS:
            if key in old:
                probe[key] = old[key]
        if probe != old:
            return None
        return self._readings(raw.get("cpu_percent"), raw.get("rss"), raw.get("state"),
                              raw.get("gpu_memory"), raw)  # fmt: skip

    def with_readings(self, values: Any) -> ProcessRow | None:
        """This row with a readings-only sample's `[cpu_percent, rss, state, gpu_memory]`
        (agent/readings.py); None when `values` is not such a list."""
        if type(values) is not list or len(values) != len(_READINGS):
            return None
        cpu, rss, state, gpu_memory = values
        return self._readings(cpu, rss, state, gpu_memory, self.raw)

    def _readings(
        self, cpu: Any, rss: Any, state: Any, gpu_memory: Any, raw: Mapping[str, Any]
    ) -> ProcessRow:
        """This row with new readings (typed here) and `raw` as its record; every other
        field kept as typed."""
        return ProcessRow(self.pid, self.ppid, self.cmdline, self.rank, self.local_rank,
                          self.world_size, self.role, self.job, self.worker_index, self.server,
                          _number(cpu), _number(rss), _text(state), self.gpus,
                          _number(gpu_memory), self.env, self.env_error, self.stdout, self.user,
                          raw)  # fmt: skip

    @property
    def areal_key(self) -> tuple[str, str | None] | None:
        """(job, role) of an AReaL single-controller worker with a rank, else None."""
        return areal_world_key(self.job, self.role, self.worker_index, self.rank)

    def agent_record(self) -> dict[str, Any]:
        """A copy of the agent's record, with the world size counted over every node and
        the row's readings (newer than the record after a readings-only sample)."""
        return {**self.raw, "cpu_percent": self.cpu_percent, "rss": self.rss,
                "state": self.state, "gpu_memory": self.gpu_memory,
                "world_size": self.world_size}  # fmt: skip


def gpu_rows(raw: Any) -> tuple[GpuRow, ...]:
    """A sample's `gpus` list as rows (records that are no GPU are left out)."""
    if not isinstance(raw, list):
        return ()
    rows = (GpuRow.from_agent(g) for g in raw if isinstance(g, Mapping))
    return tuple(r for r in rows if r is not None)


def with_readings(
    processes: Sequence[ProcessRow], gpus: Sequence[GpuRow], readings: Any
) -> tuple[tuple[ProcessRow, ...], tuple[GpuRow, ...]] | None:
    """The rows of a node's last whole sample with the values of a readings-only sample
    that follows it (agent/readings.py: one list per process and per GPU, in the whole
    sample's order); None when the readings do not fit those rows (another count, not
    lists): the caller keeps what it has and waits for the next whole sample."""
    if not isinstance(readings, Mapping):
        return None
    procs, cards = readings.get("processes"), readings.get("gpus")
    if type(procs) is not list or type(cards) is not list:
        return None
    if len(procs) != len(processes) or len(cards) != len(gpus):
        return None
    rows = [row.with_readings(values) for row, values in zip(processes, procs, strict=True)]
    cards_now = [gpu.with_readings(values) for gpu, values in zip(gpus, cards, strict=True)]
    if None in rows or None in cards_now:
        return None
    return tuple(rows), tuple(cards_now)  # type: ignore[arg-type]


def process_rows(raw: Any, previous: Sequence[ProcessRow] = ()) -> tuple[ProcessRow, ...]:
    """A sample's `processes` list as rows (records without a pid are left out).
    `previous`: the node's rows of its last sample; a process whose record changed only in
    its readings keeps its row's other fields (`ProcessRow.refreshed`)."""
    if not isinstance(raw, list):
        return ()
    before = {r.pid: r for r in previous}
    rows = []
    for p in raw:
        if not isinstance(p, Mapping):
            continue
        pid = p.get("pid")
        old = before.get(pid) if before and type(pid) is int else None
        row = old.refreshed(p) if old is not None else None
        if row is None:
            row = ProcessRow.from_agent(p)
        if row is not None:
            rows.append(row)
    return tuple(rows)


def with_areal_world_sizes(
    nodes: Sequence[tuple[ProcessRow, ...]],
) -> list[tuple[ProcessRow, ...]]:
    """Each node's rows with AReaL workers' world sizes counted over every node (each
    node's agent can count only its own), never below what one node counted alone."""
    counts = Counter(k for rows in nodes for p in rows if (k := p.areal_key) is not None)
    if not counts:
        return list(nodes)
    out = []
    for rows in nodes:
        new = []
        for p in rows:
            key = p.areal_key
            world = p.world_size if key is None else max(counts[key], p.world_size or 0)
            new.append(p if world == p.world_size else dataclasses.replace(p, world_size=world))
        out.append(tuple(new))
    return out
