"""A sample stream's short form: only the readings, while nothing else changed.

At 1 Hz almost every field of a node's sample is what it was a second ago (command lines,
ranks, roles, environments, GPU names); what changes are the readings: each process's CPU,
RSS, state and GPU memory, each GPU's utilisation, memory, temperature and power. A stream
asked for with `delta` sends its first sample whole, then, while the rest (the *layout*:
the same processes in the same order with the same other fields, the same GPUs, host name
and GPU error) stays the same, only the readings, as lists in the order of the last whole
sample:

    {"event": "sample", "stream": 1,
     "readings": {"time": T, "processes": [[cpu, rss, state, gpu_memory], ...],
                  "gpus": [[util, mem_used, temp, power], ...]}}

Any change of layout, and every `WHOLE_EVERY`-th sample, is sent whole again. The console
applies readings only to the whole sample of the same stream they follow (docs/design/
agent-protocol.md). What the console decodes per node per second shrinks from every field
of every record to four numbers a process.
"""

from __future__ import annotations

from typing import Any

PROCESS_READINGS = ("cpu_percent", "rss", "state", "gpu_memory")
GPU_READINGS = ("util", "mem_used", "temp", "power")
WHOLE_EVERY = 60  # a whole sample at least this often, whatever the layout


def layout(sample: dict[str, Any]) -> list[Any]:
    """Everything of `sample` but the time and the readings, to compare with `==` (plain
    data: nothing is serialised for it)."""
    procs = [_without(p, PROCESS_READINGS) for p in sample.get("processes") or ()]
    gpus = [_without(g, GPU_READINGS) for g in sample.get("gpus") or ()]
    rest = {k: v for k, v in sample.items() if k not in ("time", "processes", "gpus")}
    return [rest, procs, gpus]


def readings(sample: dict[str, Any]) -> dict[str, Any]:
    """The readings of `sample`, in the order of its records."""
    return {
        "time": sample.get("time"),
        "processes": [[p.get(k) for k in PROCESS_READINGS] for p in sample.get("processes") or ()],
        "gpus": [[g.get(k) for k in GPU_READINGS] for g in sample.get("gpus") or ()],
    }


class DeltaStream:
    """What one stream sent last: decides, per sample, whole or readings only."""

    def __init__(self) -> None:
        self._layout: list[Any] | None = None
        self._since_whole = 0

    def event(self, sample: dict[str, Any]) -> dict[str, Any]:
        """The `sample` event's fields for `sample`: `{"data": sample}` or
        `{"readings": ...}`."""
        now = layout(sample)
        self._since_whole += 1
        if now == self._layout and self._since_whole < WHOLE_EVERY:
            return {"readings": readings(sample)}
        self._layout, self._since_whole = now, 0
        return {"data": sample}


def _without(record: Any, keys: tuple[str, ...]) -> Any:
    if not isinstance(record, dict):
        return record
    return {k: v for k, v in record.items() if k not in keys}
