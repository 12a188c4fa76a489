"""The trainer's weight version, from what a running AReaL job writes.

At AReaL cbff54d the trainer's step `global_step` ends with (areal/trainer/rl_trainer.py):
- `train.update_weights` (:879-897): the weights are pushed with version
  `global_step + 1` and the actor's and the rollout's `set_version(global_step + 1)` are
  called inside that perf tracer span, so a finished `train.update_weights` span whose
  `args.global_step` is s means the trainer is on version s + 1;
- `train.log_stats` (:954-961, :1453-1459): `StatsLogger.commit` logs
  `Epoch e/E Step s/S Train step N/T done.` with N = global_step + 1
  (areal/utils/stats_logger.py:135-142), after that step's update: version N.
A span of step s that is not the update means at least version s (the versions before).

Both reach disk while the job runs: the perf tracer file at each step's `save`, the
log line at once. The highest version either says is the trainer's.
"""

from __future__ import annotations

import re
from collections.abc import Iterable
from dataclasses import dataclass

from areal_console.core.rollout.perf_trace import parse_spans

UPDATE_SPAN = "train.update_weights"
_TRAIN_STEP = re.compile(
    r"Step [0-9]{1,12}/[0-9]{1,12} Train step ([0-9]{1,12})/[0-9]{1,12} done\."
)
MAX_LINE = 4096


@dataclass(frozen=True, slots=True)
class TrainerVersion:
    version: int
    evidence: str  # what said so


def from_log(lines: Iterable[str]) -> TrainerVersion | None:
    """The version after the last `Train step N/T done.` line (N)."""
    found = None
    for line in lines:
        if "Train step" not in line or len(line) > MAX_LINE:
            continue
        m = _TRAIN_STEP.search(line)
        if m is not None and (found is None or int(m.group(1)) >= found.version):
            found = TrainerVersion(int(m.group(1)), f"log line `{m.group(0)}`")
    return found


def from_trace(lines: Iterable[str]) -> TrainerVersion | None:
    """The version a perf tracer file of a trainer rank says: s + 1 after a finished
    `train.update_weights` of step s, else s for the latest step seen."""
    best = None
    for span in parse_spans(lines):
        if span.step is None or span.step < 0:
            continue
        if span.name == UPDATE_SPAN:
            got = TrainerVersion(span.step + 1, f"`{UPDATE_SPAN}` of step {span.step} finished")
        else:
            got = TrainerVersion(span.step, f"`{span.name}` of step {span.step}")
        if best is None or got.version > best.version:
            best = got
    return best


def trainer_version(
    logs: Iterable[Iterable[str]], traces: Iterable[Iterable[str]]
) -> TrainerVersion | None:
    """The highest version the logs and the trainer ranks' trace files say."""
    found = [from_log(lines) for lines in logs] + [from_trace(lines) for lines in traces]
    known = [f for f in found if f is not None]
    return max(known, key=lambda f: f.version) if known else None
