"""Re-record the collective-ledger fixtures from real 4-rank gloo jobs run with the
Flight Recorder hook (tests/jobs/fr_ranks.py):

    PYTHONPATH=tui:agents:. python scripts/record_ledger_fixtures.py

- tests/data/fr/<mode>/rank_<N>: the dump files the ranks wrote when their 4 s
  process-group timeout failed them (mode op, size, behind, died);
- tests/data/pyspy/ledger_op.json: a raw capture (agent records, py-spy dumps and the
  `fr_traces` reply) of the hung `op` job, as `areal-console stacks` takes it.

Machine paths (the checkout, the interpreter, temporary directories) are rewritten to a
neutral root (tests/support/fixtures/neutral_paths.py); a dump is re-pickled with the protocol
torch wrote it in.
"""

from __future__ import annotations

import json
import pickle
import shutil
import tempfile
from pathlib import Path

from areal_console.core.connection.fleet import Fleet
from areal_console.core.stacks.capture import CaptureOptions, capture_raw
from areal_console.core.targets.resolve import NodeSpec

from tests.support.fixtures.fr_jobs import FrJob
from tests.support.fixtures.neutral_paths import neutral

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
            (out / f.name).write_bytes(neutral_dump(f.read_bytes()))
    finally:
        job.stop()


def neutral_dump(data: bytes) -> bytes:
    """A Flight Recorder dump (a pickle torch wrote) with machine paths rewritten."""
    protocol = data[1] if data[:1] == b"\x80" else 0
    return pickle.dumps(neutral(pickle.loads(data)), protocol=protocol)


def record_capture() -> None:
    job = FrJob("op", Path(tempfile.mkdtemp(prefix="fr-op-")))
    fleet = Fleet([NodeSpec(name="node0", transport="local")])
    try:
        job.wait_ready()
        raw = capture_raw(fleet, CaptureOptions(match=str(job.workdir)))
    finally:
        fleet.close()
        job.stop()
    raw["scenario"] = "ledger_op"
    (DATA / "pyspy" / "ledger_op.json").write_text(json.dumps(neutral(raw), indent=1) + "\n")


def main() -> None:
    for mode in ("op", "size", "behind", "died"):
        record_dumps(mode)
    record_capture()


if __name__ == "__main__":
    main()
