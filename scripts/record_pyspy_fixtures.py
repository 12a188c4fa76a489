"""Re-record the py-spy fixtures in tests/data/pyspy/ from the real hang scenarios.

    PYTHONPATH=tui:agents:. python scripts/record_pyspy_fixtures.py [PATTERN ...]

Each scenario runs as a real 4-rank gloo job on this machine; the local agent captures
it exactly as `areal-console stacks` does, and the raw capture (agent `sample` records
plus py-spy dumps) is written to tests/data/pyspy/<pattern>.json, with machine paths (the
checkout, the interpreter, temporary directories) rewritten to a neutral root
(tests/support/fixtures/neutral_paths.py).
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

from areal_console.core.connection.fleet import Fleet
from areal_console.core.stacks.capture import CaptureOptions, capture_raw
from areal_console.core.targets.resolve import NodeSpec

from tests.support.fixtures.hang import PATTERNS, start_scenario
from tests.support.fixtures.neutral_paths import neutral

OUT = Path(__file__).resolve().parents[1] / "tests" / "data" / "pyspy"


def record(pattern: str, fleet: Fleet) -> Path:
    samples = 3 if pattern == "slow" else 1
    with start_scenario(pattern, nproc=4) as job:
        job.wait_ready(120)
        options = CaptureOptions(samples=samples, interval=0.5, match=str(job.state_dir))
        raw = capture_raw(fleet, options)
    raw["scenario"] = pattern
    path = OUT / f"{pattern}.json"
    path.write_text(json.dumps(neutral(raw), indent=1) + "\n")
    return path


def main(argv: list[str]) -> int:
    OUT.mkdir(parents=True, exist_ok=True)
    fleet = Fleet([NodeSpec(name="node0", transport="local")])
    try:
        for pattern in argv or PATTERNS:
            print(f"recorded {record(pattern, fleet)}")
    finally:
        fleet.close()
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
