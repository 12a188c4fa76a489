"""`areal-console demo`: a real small training job on this machine that dumps a few steps
and then stops making progress in a chosen way, to practise on. No Textual here.

The job is the reference trainer (torchrun, gloo on CPU) with AReaL's trajectory-dump flags
and `debug.hang=PATTERN`. It trains `TRAIN_STEPS` steps (dumping the first few) with stale
rollouts (`rollout.max_head_offpolicyness`) and a high learning rate, so its
`behave_imp_weight` drifts away from 1; its AReaL-format log (`trainer.log`) and
tensorboard events (`tb/`) feed the Health view, and the log stops where the job hangs. Everything it starts is killed by `stop()`, which walks the
process tree (torchrun gives each worker its own session, so a process-group kill is not
enough).
"""

from __future__ import annotations

import os
import shutil
import signal
import subprocess
import tempfile
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

from areal_console.core.common.errors import UserError
from areal_console.core.replay.plan import local_trainer

PATTERNS = ("cleanup", "mismatch", "collective", "none")
TRAIN_STEPS = 30
# Rollouts up to 32 versions stale and a high learning rate: the behaviour policy falls
# behind and behave_imp_weight leaves 1 (what AReaL's guide warns about).
DRIFT = ("rollout.max_head_offpolicyness=32", "actor.optimizer.lr=0.01")

Progress = Callable[[str], None]


def _children(pid: int) -> list[int]:
    """Every descendant of `pid`, from /proc."""
    parent_of: dict[int, int] = {}
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            with open(f"/proc/{entry}/stat", "rb") as fh:
                raw = fh.read()
        except OSError:
            continue
        parent_of[int(entry)] = int(raw[raw.rindex(b")") + 2 :].split()[1])
    out: list[int] = []
    frontier = [pid]
    while frontier:
        cur = frontier.pop()
        kids = [p for p, pp in parent_of.items() if pp == cur]
        out.extend(kids)
        frontier.extend(kids)
    return out


@dataclass
class DemoJob:
    pattern: str
    nproc: int
    dump_steps: int
    workdir: Path
    owns_workdir: bool
    process: subprocess.Popen[bytes] | None = None
    log_path: Path = field(init=False)

    def __post_init__(self) -> None:
        self.log_path = self.workdir / "trainer.log"

    @property
    def dump_dir(self) -> Path:
        return self.workdir / "dump"

    @property
    def tensorboard_dir(self) -> Path:
        return self.workdir / "tb"

    @property
    def tag(self) -> str:
        """A string found in every rank's command line: filters the console to this job."""
        return self.workdir.name

    def trainer_args(self) -> list[str]:
        # Without a hang the job keeps training slowly past the dumped steps ("slow, not
        # hung": its stacks change between samples).
        steps = max(self.dump_steps, TRAIN_STEPS)
        if self.pattern == "none":
            steps += 100_000
        return [
            "--nproc", str(self.nproc),
            f"steps={steps}", "seed=1", *DRIFT,
            f"stats_logger.tensorboard.path={self.tensorboard_dir}",
            "trajectory_debug.dump_rollout_data=true",
            f"trajectory_debug.path={self.dump_dir}",
            f"trajectory_debug.dump_steps=[{','.join(str(s) for s in range(self.dump_steps))}]",
            f"debug.hang={self.pattern}",
            f"output_dir={self.workdir / 'out'}",
        ]  # fmt: skip

    def start(self) -> None:
        self.dump_dir.mkdir(parents=True, exist_ok=True)
        # TMPDIR inside the work dir: torchrun's scratch files go when the demo's files go.
        argv, env = local_trainer(*self.trainer_args(), env={
            **os.environ, "OMP_NUM_THREADS": "1", "PYTHONUNBUFFERED": "1",
            "TMPDIR": str(self.workdir),
        })  # fmt: skip
        with open(self.log_path, "wb") as log:
            self.process = subprocess.Popen(
                argv, stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
                start_new_session=True, env=env, cwd=self.workdir,
            )  # fmt: skip

    def dumped_steps(self) -> int:
        return len(list(self.dump_dir.glob("step_*_dp_0.pt")))

    def log_tail(self, lines: int = 5) -> str:
        try:
            return "\n".join(self.log_path.read_text(errors="replace").splitlines()[-lines:])
        except OSError:
            return ""

    def wait_ready(self, progress: Progress | None = None, timeout: float = 300.0) -> None:
        """Until every step is dumped and the ranks reached their hang (or keep training)."""
        assert self.process is not None
        deadline = time.monotonic() + timeout
        said = -1
        while True:
            if self.process.poll() is not None:
                raise UserError(f"the demo trainer exited with status {self.process.returncode}: "
                                f"{self.log_tail(1) or 'no output'} (log: {self.log_path})")  # fmt: skip
            done = self.dumped_steps()
            if done != said and progress is not None:
                progress(f"trainer: {done}/{self.dump_steps} steps dumped")
                said = done
            if done >= self.dump_steps and self._settled():
                return
            if time.monotonic() > deadline:
                raise UserError(f"the demo trainer did not get going within {timeout:.0f}s "
                                f"(log: {self.log_path})")  # fmt: skip
            time.sleep(0.3)

    def _settled(self) -> bool:
        if self.pattern == "none":
            return True
        hung = self.log_tail(self.nproc + 2).count("hanging on purpose")
        return hung >= self.nproc

    def stop(self) -> int:
        """Kill the launcher and every process under it; returns how many were killed."""
        if self.process is None:
            return 0
        pids = [*_children(self.process.pid), self.process.pid]
        killed = 0
        for pid in pids:
            try:
                os.kill(pid, signal.SIGKILL)
                killed += 1
            except ProcessLookupError:
                pass
        self.process.wait(timeout=30)
        self.process = None
        return killed

    def remove_files(self) -> None:
        if self.owns_workdir:
            shutil.rmtree(self.workdir, ignore_errors=True)


def new_demo(
    pattern: str, nproc: int = 2, dump_steps: int = 3, workdir: Path | None = None
) -> DemoJob:
    if pattern not in PATTERNS:
        raise UserError(f"unknown pattern {pattern!r} (choose from {', '.join(PATTERNS)})")
    if nproc < 2:
        raise UserError("the demo needs at least 2 ranks (--nproc 2 or more)")
    if dump_steps < 1:
        raise UserError("--steps must be at least 1")
    owns = workdir is None
    path = Path(tempfile.mkdtemp(prefix="areal-console-demo-")) if workdir is None else workdir
    path.mkdir(parents=True, exist_ok=True)
    return DemoJob(pattern, nproc, dump_steps, path, owns)
