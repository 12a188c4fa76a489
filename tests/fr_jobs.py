"""Real gloo jobs with the Flight Recorder hook on, for the collective ledger tests."""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

from areal_console.fr_hook import HOOK_DIR
from areal_console.scenarios.hang import free_port

JOBS = Path(__file__).resolve().parent / "jobs"
NPROC = 4


class FrJob:
    """`NPROC` ranks of tests/jobs/fr_ranks.py in one session; dumps go under `workdir`."""

    def __init__(self, mode: str, workdir: Path, timeout_s: float | None = None) -> None:
        self.mode = mode
        self.workdir = workdir
        self.dump_dir = workdir / "fr"
        self.dump_dir.mkdir(parents=True, exist_ok=True)
        port = free_port()
        env = {
            **os.environ,
            "PYTHONPATH": os.pathsep.join(
                [str(HOOK_DIR), *filter(None, [os.environ.get("PYTHONPATH")])]
            ),
            "TORCH_FR_DUMP_TEMP_FILE": str(self.dump_dir / "rank_"),
            "MASTER_ADDR": "127.0.0.1",
            "MASTER_PORT": str(port),
            "WORLD_SIZE": str(NPROC),
            "OMP_NUM_THREADS": "1",
        }
        if timeout_s is not None:
            env["FR_TIMEOUT_S"] = str(timeout_s)
        self.log = open(workdir / "job.log", "wb")  # noqa: SIM115
        self.procs = [
            subprocess.Popen(
                [sys.executable, str(JOBS / "fr_ranks.py"), mode, str(workdir)],
                env={**env, "RANK": str(r), "LOCAL_RANK": str(r)},
                stdout=self.log,
                stderr=subprocess.STDOUT,
                start_new_session=True,
            )
            for r in range(NPROC)
        ]

    def wait_ready(self, timeout: float = 180.0) -> None:
        """Every rank passed the three good collectives (and, when hung, serves its trace)."""
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if len(list(self.workdir.glob("rank*.ready"))) == NPROC:
                return
            if all(p.poll() is not None for p in self.procs):
                break
            time.sleep(0.05)
        raise RuntimeError(f"{self.mode} job not ready: {self.log_text()[-2000:]}")

    def wait_exited(self, timeout: float = 120.0) -> None:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline and any(p.poll() is None for p in self.procs):
            time.sleep(0.05)

    def log_text(self) -> str:
        return (self.workdir / "job.log").read_text(errors="replace")

    def stop(self) -> None:
        for p in self.procs:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(p.pid, signal.SIGKILL)  # the rank and a died rank's stand-in
        for p in self.procs:
            with contextlib.suppress(subprocess.TimeoutExpired):
                p.wait(timeout=10)
        self.log.close()
