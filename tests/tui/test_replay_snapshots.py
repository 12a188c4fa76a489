"""SVG snapshot of the Runs screen from fixed job records (no clock, no host names)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
from areal_console.core.connection.fleet import Fleet
from areal_console.core.replay import runs as jobs
from areal_console.screens.runs import RunsScreen
from areal_console.styles import STYLESHEET
from textual.app import App

PLAN = {
    "steps": [3, 6],
    "gpus": [0, 1],
    "argv": ["python3", "reference_trainer.py", "--nproc", "2"],
    "metrics": "{job_dir}/out/metrics.jsonl",
}


class JobsHost(App[None]):
    CSS_PATH = STYLESHEET

    def on_mount(self) -> None:
        self.push_screen(RunsScreen(Fleet([]), poll=3600))


@pytest.fixture()
def recorded_jobs(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("AREAL_CONSOLE_DATA_DIR", str(tmp_path))
    verified = {
        "matched": False,
        "steps": [3, 4],
        "first_mismatch": {
            "step": 5,
            "metric": "actor_loss",
            "recorded": -0.187,
            "replayed": -0.179,
        },
        "summary": "replay differs from recording at step 5: actor_loss recorded -0.187, "
        "replayed -0.179",
    }
    for i, (job_id, state, code, verification) in enumerate(
        [
            ("replay-a", "finished", 0, verified),
            ("replay-b", "failed", 1, None),
            ("replay-c", "running", None, None),  # its node is not connected: shown unknown
        ]
    ):
        jobs.save_run(
            jobs.RunRecord(
                job_id=job_id,
                node="node1",
                plan=PLAN,
                launched_at=100.0 - i,
                state=state,
                exit_code=code,
                log=f"/scratch/jobs/{job_id}/train.log",
                verification=verification,
            )
        )


def test_jobs_screen_snapshot(snap_compare: Any, recorded_jobs: None) -> None:
    assert snap_compare(JobsHost(), terminal_size=(120, 32))
