"""`areal-console demo`: a real small training job on this machine that dumps a few steps
and then stops making progress in a chosen way, to practise on. No Textual here.

The job is the reference trainer (torchrun, gloo on CPU) with AReaL's trajectory-dump flags
and `debug.hang=PATTERN`. It trains `TRAIN_STEPS` steps (dumping the first few) with stale
rollouts (`rollout.max_head_offpolicyness`) and a high learning rate, so its
`behave_imp_weight` drifts away from 1; its AReaL-format log (`trainer.log`) and
tensorboard events (`tb/`) feed the Health view, and the log stops where the job hangs. Everything it starts is killed by `stop()`, which walks the
process tree (torchrun gives each worker its own session, so a process-group kill is not
enough). The job's processes also die with the console (`AREAL_NODE_DIE_WITH_PARENT`: a
console killed with SIGKILL runs no `stop()`), and a new demo removes the work folders of
earlier demos whose console is gone (`remove_stale_workdirs`).
"""

from __future__ import annotations

import os
import shutil
import signal
import stat
import subprocess
import tempfile
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

from areal_node.agent.procfs import parse_stat

from areal_console.core.common import private_files
from areal_console.core.common.errors import UserError
from areal_console.core.replay.plan import local_trainer

PATTERNS = ("cleanup", "mismatch", "collective", "none")
PREFIX = "areal-console-demo-"
# In each demo's own work folder: which console owns it ("areal-console demo PID START",
# START the process's start time in clock ticks, so a reused pid is not taken for it).
OWNER_FILE = "demo-owner"
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
        parent_of[int(entry)] = parse_stat(raw)[2]
    out: list[int] = []
    frontier = [pid]
    while frontier:
        cur = frontier.pop()
        kids = [p for p, pp in parent_of.items() if pp == cur]
        out.extend(kids)
        frontier.extend(kids)
    return out


def _start_time(pid: int) -> int | None:
    """The process's start time (clock ticks after boot), None when it is gone."""
    try:
        with open(f"/proc/{pid}/stat", "rb") as fh:
            raw = fh.read()
    except OSError:
        return None
    return parse_stat(raw)[4]


def owner_line(pid: int) -> str:
    return f"areal-console demo {pid} {_start_time(pid)}\n"


def _stale(folder: Path) -> bool:
    """Whether `folder` is provably an earlier demo's work folder, of this user, whose
    console is gone: a real folder (no symlink), its owner file naming a dead process."""
    try:
        info = folder.lstat()
        if not stat.S_ISDIR(info.st_mode) or info.st_uid != os.getuid():
            return False
        fd = os.open(folder / OWNER_FILE, os.O_RDONLY | os.O_NOFOLLOW)
        with os.fdopen(fd, "rb") as fh:
            words = fh.read(200).decode("ascii").split()
    except (OSError, UnicodeDecodeError):
        return False
    if len(words) != 4 or words[:2] != ["areal-console", "demo"] or not words[2].isdigit():
        return False
    return str(_start_time(int(words[2]))) != words[3]


def remove_stale_workdirs(root: Path | None = None) -> list[Path]:
    """Remove the work folders that earlier demos, killed before their cleanup, left in
    `root` (the temp directory); returns them."""
    base = Path(tempfile.gettempdir()) if root is None else root
    removed = []
    for folder in sorted(base.glob(PREFIX + "*")):
        if _stale(folder):
            shutil.rmtree(folder, ignore_errors=True)  # never follows the links inside
            removed.append(folder)
    return removed


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
            # The trainer's default is no hang; `debug.hang=none` would read as null.
            *([f"debug.hang={self.pattern}"] if self.pattern != "none" else []),
            f"output_dir={self.workdir / 'out'}",
        ]  # fmt: skip

    def start(self) -> None:
        private_files.private_dir(self.dump_dir)
        # TMPDIR inside the work dir: torchrun's scratch files go when the demo's files go.
        argv, env = local_trainer(*self.trainer_args(), env={
            **os.environ, "OMP_NUM_THREADS": "1", "PYTHONUNBUFFERED": "1",
            "TMPDIR": str(self.workdir), "AREAL_NODE_DIE_WITH_PARENT": "1",
        })  # fmt: skip
        with private_files.create(self.log_path) as log:
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
    if owns:
        remove_stale_workdirs()
    path = private_files.temp_dir(PREFIX) if workdir is None else private_files.private_dir(workdir)
    if owns:
        with private_files.create(path / OWNER_FILE, "w") as owner:
            owner.write(owner_line(os.getpid()))
    return DemoJob(pattern, nproc, dump_steps, path, owns)
