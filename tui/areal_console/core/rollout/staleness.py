"""AReaL's rollout capacity, recomputed: which term of `StalenessManager.get_capacity()`
is zero when rollout starves.

At AReaL cbff54d (areal/infra/staleness_manager.py:99-113):
    concurrency = max(1, max_concurrent_rollouts) - running
    staleness   = (max_head_offpolicyness + version + 1) * max(1, consumer_batch_size)
                  - (accepted + running)
    capacity    = min(concurrency, staleness)
with `max_concurrent_rollouts` (None or 0: the consumer batch size) and
`consumer_batch_size` divided by the data-parallel size first in SPMD mode only
(areal/infra/workflow_executor.py:786-789, 1069-1085; `scaling` says which mode and
size). The producer thread submits only while capacity > 0 (workflow_executor.py:460-473).

The counts come from the executor's rollout tracing lines (on with
`rollout.enable_rollout_tracing`; workflow_executor.py:399, :565, :1241, :1256 write
`... rollout. enqueued: E, running: R, accepted: A, rejected: J.` through `_rollout_stats`,
:543-550), or from the session tracer's records (accepted/rejected per finalized session).
"""

from __future__ import annotations

import json
import re
from collections.abc import Iterable
from dataclasses import dataclass

_STATS = re.compile(
    r"(Submit|Enqueue|Finish and accept|Finish but reject) rollout\. "
    r"enqueued: (-?\d{1,12}), running: (-?\d{1,12}), accepted: (-?\d{1,12}), "
    r"rejected: (-?\d{1,12})\."
)
MAX_LINE = 4096


@dataclass(frozen=True, slots=True)
class RolloutCounts:
    enqueued: int
    running: int
    accepted: int
    rejected: int
    source: str  # where the counts were read
    running_known: bool = True  # False: from session records (running not recorded)
    complete: bool = True  # False: accepted is a lower bound (records not all read)


@dataclass(frozen=True, slots=True)
class Capacity:
    concurrency: int
    staleness: int
    capacity: int
    zero_terms: tuple[str, ...]  # "concurrency" / "staleness": the terms at or below 0
    explanation: str


def last_counts(lines: Iterable[str]) -> RolloutCounts | None:
    """The latest counts in rollout tracing lines (None: tracing was off)."""
    found = None
    for line in lines:
        if "rollout. enqueued:" not in line or len(line) > MAX_LINE:
            continue
        m = _STATS.search(line)
        if m is not None:
            e, r, a, j = (int(x) for x in m.groups()[1:])
            found = RolloutCounts(e, r, a, j, f"rollout tracing line: {m.group(0)}")
    return found


@dataclass(slots=True)
class SessionTally:
    """Finished sessions counted from session tracer records, by status."""

    accepted: int = 0
    rejected: int = 0  # rejected, failed and dropped: each left the manager as rejected
    pending: int = 0
    records: int = 0
    skipped: int = 0  # lines that are not a record

    def add(self, lines: Iterable[str]) -> None:
        for line in lines:
            if not line.strip():
                continue
            if len(line) > MAX_RECORD:
                self.skipped += 1
                continue
            try:
                doc = json.loads(line)
            except (ValueError, RecursionError):
                self.skipped += 1
                continue
            status = doc.get("status") if isinstance(doc, dict) else None
            if not isinstance(status, str):
                self.skipped += 1
                continue
            self.records += 1
            if status == "accepted":
                self.accepted += 1
            elif status in REJECTED:
                self.rejected += 1
            elif status == "pending":
                self.pending += 1


REJECTED = ("rejected", "failed", "dropped")
MAX_RECORD = 1 << 16


def session_counts(tally: SessionTally, where: str, complete: bool = True) -> RolloutCounts | None:
    """Counts from session records (None: no record). `running` is not recorded (0)."""
    if not tally.records:
        return None
    part = "" if complete else ", the file's start not read: accepted is at least this"
    return RolloutCounts(
        0,
        0,
        tally.accepted,
        tally.rejected,
        f"session tracer records of {where} ({tally.records} records{part}; "
        "rollouts running now are not recorded)",
        running_known=False,
        complete=complete,
    )


def capacity(
    counts: RolloutCounts,
    version: int,
    max_head_offpolicyness: int,
    consumer_batch_size: int,
    max_concurrent_rollouts: int | None = None,
    dp_size: int = 1,
) -> Capacity:
    """AReaL's formula, each size divided by `dp_size` (1: single-controller mode, the
    global values); names the zero terms."""
    dp = max(1, dp_size)
    given = max_concurrent_rollouts or consumer_batch_size  # AReaL's `or`: None and 0 alike
    max_conc = max(1, given // dp)
    bs = max(1, consumer_batch_size // dp)
    per_rank = f" (per rank: {given} // dp {dp} and batch {consumer_batch_size} // dp {dp})"
    concurrency = max_conc - counts.running
    samples = counts.accepted + counts.running
    staleness = (max_head_offpolicyness + version + 1) * bs - samples
    zero = []
    if concurrency <= 0 and counts.running_known:
        zero.append("concurrency")
    if staleness <= 0:
        zero.append("staleness")
    if counts.running_known:
        parts = [
            f"concurrency = {max_conc} - {counts.running} running = {concurrency}",
            f"staleness = ({max_head_offpolicyness} + version {version} + 1) x {bs} - "
            f"({counts.accepted} accepted + {counts.running} running) = {staleness}",
        ]
    else:
        at_least = "at least " if not counts.complete else ""
        parts = [
            f"concurrency = {max_conc} - running (not recorded): not known",
            f"staleness = ({max_head_offpolicyness} + version {version} + 1) x {bs} - "
            f"({at_least}{counts.accepted} accepted + running) <= {staleness}",
        ]
    text = "; ".join(parts) + (per_rank if dp > 1 else "")
    return Capacity(concurrency, staleness, min(concurrency, staleness), tuple(zero), text)
