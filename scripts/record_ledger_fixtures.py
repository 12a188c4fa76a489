"""Re-record the collective-ledger fixtures from real 4-rank gloo jobs run with the
Flight Recorder hook (tests/jobs/fr_ranks.py):

    PYTHONPATH=tui:node:. python scripts/record_ledger_fixtures.py [MODE ...]

- tests/data/fr/<mode>/rank_<N>: the dump files the ranks wrote when their 4 s
  process-group timeout failed them (mode op, size, behind, died);
- tests/data/pyspy/ledger_op.json: a raw capture (agent records, py-spy dumps and the
  `fr_traces` reply) of the hung `op` job, as `areal-console stacks` takes it;
- tests/data/pyspy/ledger_wrong_group.json: the same of the `wrong_group` job (rank 3
  passed the tp group [2, 3]: a deadlock between groups).
"""

from __future__ import annotations

import json
import shutil
import sys
import tempfile
import time
from pathlib import Path

from areal_console.core.fleet import Fleet
from areal_console.core.stacks.capture import CaptureOptions, capture_raw
from areal_console.core.targets import NodeSpec

from tests.fixtures.fr_jobs import FrJob

DATA = Path(__file__).resolve().parents[1] / "tests" / "data"


def record_dumps(mode: str) -> None:
    job = FrJob(mode, Path(tempfile.mkdtemp(prefix=f"fr-{mode}-")), timeout_s=4)
    try:
        job.wait_ready()
        job.wait_exited(60)
        out = DATA / "fr" / mode
        shutil.rmtree(out, ignore_errors=True)
        out.mkdir(parents=True)
        for f in sorted(job.dump_dir.iterdir()):
            shutil.copy(f, out / f.name)
    finally:
        job.stop()


def record_capture(mode: str = "op") -> None:
    job = FrJob(mode, Path(tempfile.mkdtemp(prefix=f"fr-{mode}-")))
    fleet = Fleet([NodeSpec(name="node0", transport="local")])
    try:
        job.wait_ready()
        time.sleep(2)  # the ready mark comes just before the last collective is enqueued
        raw = capture_raw(fleet, CaptureOptions(match=str(job.workdir)))
    finally:
        fleet.close()
        job.stop()
    raw["scenario"] = f"ledger_{mode}"
    (DATA / "pyspy" / f"ledger_{mode}.json").write_text(json.dumps(raw, indent=1) + "\n")


def main() -> None:
    only = sys.argv[1:]  # capture modes to record alone (e.g. `wrong_group`), else everything
    if only:
        for mode in only:
            record_capture(mode)
        return
    for mode in ("op", "size", "behind", "died"):
        record_dumps(mode)
    record_capture("op")
    record_capture("wrong_group")


if __name__ == "__main__":
    main()
