"""What the Health view and `metrics --json` show: per-metric summaries, warnings, stall."""

from __future__ import annotations

import math
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass
from datetime import datetime, timezone
from typing import Any

from areal_console.core.metrics.health import (
    HealthThresholds,
    HealthWarning,
    StallState,
    run_checks,
    slope,
    stall_state,
)
from areal_console.core.metrics.store import MetricStore
from areal_console.core.rollout.stragglers import Straggler

SPARKS = "▁▂▃▄▅▆▇█"


def sparkline(values: Sequence[float], width: int = 20) -> str:
    """The last `width` values scaled between their own min and max."""
    tail = [v for v in list(values)[-width:] if math.isfinite(v)]
    if not tail:
        return ""
    lo, hi = min(tail), max(tail)
    if hi == lo:
        return SPARKS[3] * len(tail)
    top = len(SPARKS) - 1
    return "".join(SPARKS[round((v - lo) / (hi - lo) * top)] for v in tail)


@dataclass(frozen=True)
class MetricSummary:
    name: str
    points: int
    latest: float | None
    minimum: float | None
    maximum: float | None
    trend: float
    """Fitted change over the last `window` steps (0 with fewer than 2 points)."""
    spark: str


def summarize(store: MetricStore, window: int = 20) -> list[MetricSummary]:
    out = []
    for name in store.names():
        _, values = store.series(name)
        finite = [v for v in values if math.isfinite(v)]
        recent = finite[-window:]
        out.append(MetricSummary(
            name, len(values), values[-1] if values else None,
            min(finite) if finite else None, max(finite) if finite else None,
            slope(recent) * (len(recent) - 1) if len(recent) > 1 else 0.0,
            sparkline(finite, window),
        ))  # fmt: skip
    return out


@dataclass(frozen=True)
class HealthReport:
    source: str
    steps: list[int]
    store: MetricStore
    warnings: list[HealthWarning]  # episodes, active first, newest first
    stall: StallState
    total_steps: int | None = None
    notes: tuple[str, ...] = ()  # what could not be read (skipped records, dropped files)
    stragglers: tuple[Straggler, ...] = ()  # from the perf tracer files, slowest first


def build_report(
    source: str,
    store: MetricStore,
    finished: bool,
    now: float,
    thresholds: HealthThresholds | None = None,
    total_steps: int | None = None,
    unread_bytes: int = 0,
    notes: Sequence[str] = (),
    stragglers: Sequence[Straggler] = (),
) -> HealthReport:
    """`unread_bytes`: the log's bytes not read yet (no stall is judged until they are)."""
    thresholds = thresholds or HealthThresholds()
    warnings = run_checks(SeriesView(store), thresholds)
    stall = stall_state(list(store.step_times), now, finished, thresholds, unread_bytes)
    if stall.stalled:
        last = store.steps[-1] if store.steps else None
        remedy = (
            "Capture every rank's stack to see where the job waits (the debugging guide's "
            "first hang symptom is logs that stop updating)"
        )
        if stall.old:
            remedy = ("Check that the job still runs: a log quiet for longer than AReaL's "
                      "2-hour process-group timeout more likely belongs to a job that ended "
                      "without its completion line. " + remedy)  # fmt: skip
        warnings.append(HealthWarning(
            "stalled", "progress", last, stall.describe(), remedy, (), last, last, True,
        ))  # fmt: skip
    steps = store.all_steps()
    return HealthReport(source, steps, store, warnings, stall, total_steps, tuple(notes),
                        tuple(stragglers))  # fmt: skip


class SeriesView(Mapping[str, tuple[list[int], list[float]]]):
    """A store's series by name, each extracted only when asked for (the checks read six)."""

    def __init__(self, store: MetricStore) -> None:
        self.store = store

    def __getitem__(self, name: str) -> tuple[list[int], list[float]]:
        if name not in self.store:
            raise KeyError(name)
        return self.store.series(name)

    def __iter__(self) -> Iterator[str]:
        return iter(self.store.names())

    def __len__(self) -> int:
        return len(self.store.names())


def iso(ts: float | None) -> str | None:
    if ts is None or not math.isfinite(ts):
        return None
    return datetime.fromtimestamp(ts, tz=timezone.utc).isoformat(timespec="milliseconds")


def _num(v: float) -> float | None:
    return v if math.isfinite(v) else None  # JSON has no NaN/inf


def report_json(report: HealthReport) -> dict[str, Any]:
    """`metrics --json` (docs/guide/cli-json.md)."""
    store = report.store
    series: dict[str, list[list[Any]]] = {}
    latest: dict[str, float | None] = {}
    for name in store.names():
        steps, values = store.series(name)
        series[name] = [[s, _num(v)] for s, v in zip(steps, values, strict=False)]
        latest[name] = _num(values[-1]) if values else None
    return {
        "source": report.source,
        "steps": report.steps,
        "series": series,
        "latest": latest,
        "warnings": [w.to_json() for w in report.warnings],
        "last_step_at": iso(report.stall.last_step_at),
        "stalled": report.stall.stalled,
        "unread_bytes": report.stall.unread_bytes,
        "notes": list(report.notes),
        "stragglers": [s.to_json() for s in report.stragglers],
    }


def episode_events(
    seen: Mapping[tuple[str, str, int | None], bool], report: HealthReport
) -> tuple[list[dict[str, Any]], dict[tuple[str, str, int | None], bool]]:
    """`--follow`'s episode lines: `{"event": "open"|"close", ...episode}` for each episode
    that opened or closed since the report that left `seen` (episode key -> active); an
    episode first seen already ended gives both. Returns the lines and the new `seen`."""
    events: list[dict[str, Any]] = []
    now: dict[tuple[str, str, int | None], bool] = {}
    for w in sorted(report.warnings, key=lambda w: (w.first_step or 0, w.last_step or 0)):
        key = w.key
        now[key] = w.active
        was = seen.get(key)
        if was is None or (was is False and w.active):  # new, or resumed within the gap
            events.append({"event": "open", **w.to_json()})
        if not w.active and was is not False:
            events.append({"event": "close", **w.to_json()})
    for key, active in seen.items():  # gone from the report (a stall that ended)
        if active and key not in now:
            check, metric, first = key
            events.append({"event": "close", "metric": metric, "step": None,
                           "first_step": first, "last_step": None, "active": False,
                           "message": f"{check} no longer holds"})  # fmt: skip
    return events, now
