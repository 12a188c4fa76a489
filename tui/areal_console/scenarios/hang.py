"""Hang scenarios: small gloo CPU jobs launched like training jobs.

    python -m areal_console.scenarios.hang --pattern cleanup_deadlock --nproc 4

runs a launcher that starts `--nproc` worker processes with the variables torchrun sets
(`RANK`, `LOCAL_RANK`, `WORLD_SIZE`, `MASTER_ADDR`, `MASTER_PORT`). Each worker runs a toy
training loop (`train` -> `train_step` -> `forward`/`backward`/`all_reduce_grads`) and then
gets stuck the way the pattern says, blocked (not spinning) so it costs no CPU:

- `cleanup_deadlock`: the last rank raises in `train_step` and waits in a barrier in its
  cleanup path (`cleanup_distributed`) while the others wait in `all_reduce_grads`.
- `collective_mismatch`: even ranks wait in `all_reduce_grads`, odd ranks in
  `broadcast_params` (a different collective at a different call site).
- `same_collective`: every rank waits in the same `all_reduce` of `all_reduce_grads`, on
  groups that never complete (as with a network or NCCL timeout).
- `missing_rank`: the last rank dies (exit 1) and the others wait for it forever.
- `slow`: nothing hangs; steps are slow, so stacks change between samples.

The process-group timeout is set to a day so hung jobs stay hung. `start_scenario()` is the
Python API: it launches the job in its own process group and `ScenarioJob.stop()` kills the
whole group.
"""

from __future__ import annotations

import argparse
import contextlib
import os
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

PATTERNS = ("cleanup_deadlock", "collective_mismatch", "same_collective", "missing_rank", "slow")

# Which step goes wrong; a couple of healthy steps first so stacks look like a real loop.
FAIL_AT_STEP = 2
HANG_TIMEOUT_S = 24 * 3600


# --------------------------------------------------------------------------------------
# The worker: a toy training loop. Function names read like a trainer's on purpose.


class StepFailed(RuntimeError):
    """A rank's training step failed (stands in for an OOM or a bad batch)."""


def _mark(state_dir: str | None, name: str) -> None:
    """Tell the launcher's caller this rank reached `name` (written atomically)."""
    if not state_dir:
        return
    path = os.path.join(state_dir, name)
    tmp = f"{path}.{os.getpid()}.tmp"
    with open(tmp, "w") as fh:
        fh.write(str(os.getpid()))
    os.replace(tmp, path)


class Trainer:
    def __init__(self, pattern: str, state_dir: str | None) -> None:
        import torch
        import torch.distributed as dist

        self.torch = torch
        self.dist = dist
        self.pattern = pattern
        self.state_dir = state_dir
        self.rank = int(os.environ["RANK"])
        self.world_size = int(os.environ["WORLD_SIZE"])
        self.grads = torch.zeros(16)
        self.params = torch.zeros(16)
        self.step = 0
        # Like a trainer's background threads: parked most of the time (idle in stacks).
        self._stop = threading.Event()
        threading.Thread(target=self.heartbeat, name="heartbeat", daemon=True).start()

    def heartbeat(self) -> None:
        while not self._stop.wait(3600):
            pass

    def init_distributed(self) -> None:
        from datetime import timedelta

        dist = self.dist
        dist.init_process_group("gloo", timeout=timedelta(seconds=HANG_TIMEOUT_S))
        ranks = list(range(self.world_size))
        # Separate groups keep the stuck collectives from exchanging messages by accident.
        # Every rank runs the same pattern, so every rank creates the same groups.
        self.param_group: Any = None
        self.cleanup_group: Any = None
        self.ring_groups: list[Any] = []
        if self.pattern == "collective_mismatch":
            self.param_group = dist.new_group(ranks)
        if self.pattern == "cleanup_deadlock":
            self.cleanup_group = dist.new_group(ranks)
        if self.pattern == "same_collective":
            # A ring of pairs {i, i+1}: each rank waiting on its own pair never completes.
            self.ring_groups = [
                dist.new_group(sorted({i, (i + 1) % self.world_size})) for i in ranks
            ]

    def forward(self, depth: int) -> Any:
        if depth > 0:
            return self.forward(depth - 1)
        if self.pattern == "slow":
            time.sleep(0.12)
        return self.params.sum()

    def die(self) -> None:
        """Exit like a killed rank: no cleanup, no exception.

        With NCCL the survivors would hang in their collective; gloo would notice the
        closed sockets and raise instead. So a stand-in (`sleep`, not Python, no rank
        variables) keeps this rank's sockets open, and the survivors hang as on GPUs.
        """
        sys.stderr.write(f"rank {self.rank}: fatal error at step {self.step}\n")
        sys.stderr.flush()
        if os.fork() == 0:
            os.execve("/bin/sleep", ["sleep", str(HANG_TIMEOUT_S)], {"PATH": "/usr/bin:/bin"})
        os._exit(1)

    def backward(self, loss: Any) -> None:
        if self.pattern == "slow":
            time.sleep(0.08)
        self.grads.add_(1.0)

    def all_reduce_grads(self) -> None:
        group = None
        if self.step == FAIL_AT_STEP and self.pattern != "slow":
            # Every rank that gets here at the failing step stays here.
            _mark(self.state_dir, f"rank{self.rank}.ready")
            if self.pattern == "same_collective":
                group = self.ring_groups[self.rank]
        self.dist.all_reduce(self.grads, group=group)

    def broadcast_params(self) -> None:
        self.dist.broadcast(self.params, src=0, group=self.param_group)

    def train_step(self) -> None:
        loss = self.forward(depth=self.step % 3)
        if self.step == FAIL_AT_STEP and self.rank == self.world_size - 1:
            if self.pattern == "cleanup_deadlock":
                raise StepFailed(f"rank {self.rank}: loss is NaN at step {self.step}")
            if self.pattern == "missing_rank":
                self.die()
        self.backward(loss)
        if (
            self.pattern == "collective_mismatch"
            and self.step == FAIL_AT_STEP
            and self.rank % 2 == 1
        ):
            _mark(self.state_dir, f"rank{self.rank}.ready")
            self.broadcast_params()  # the others are in all_reduce_grads: never matches
        self.all_reduce_grads()

    def train(self, steps: int) -> None:
        try:
            for self.step in range(steps):
                self.train_step()
                if self.pattern == "slow" and self.step == FAIL_AT_STEP:
                    _mark(self.state_dir, f"rank{self.rank}.ready")
        finally:
            self.cleanup_distributed()

    def cleanup_distributed(self) -> None:
        if self.pattern == "cleanup_deadlock" and self.rank == self.world_size - 1:
            _mark(self.state_dir, f"rank{self.rank}.ready")
        # Waits for every rank: a rank that failed waits here for ranks still training.
        self.dist.barrier(group=self.cleanup_group)
        self.dist.destroy_process_group()


def run_worker(pattern: str, steps: int, state_dir: str | None) -> int:
    trainer = Trainer(pattern, state_dir)
    trainer.init_distributed()
    trainer.train(steps)
    return 0


# Source for one rank started by someone else (an SSH session per rank, a test cluster):
# prints "ready <rank>" once the rank is hung; EOF on stdin (the session closing) ends it.
_RANK_SCRIPT = r"""
# {marker}
import os, sys, threading
sys.path.insert(0, {import_root!r})

def _exit_on_eof():
    sys.stdin.buffer.read()
    os._exit(0)

threading.Thread(target=_exit_on_eof, daemon=True).start()
import areal_console.scenarios.hang as hang

RANK = int(os.environ["RANK"])

def announce(state_dir, name):
    if name.startswith("rank"):
        print("ready", RANK, flush=True)

hang._mark = announce
trainer = hang.Trainer({pattern!r}, None)
trainer.init_distributed()
trainer.train(1000000)
"""


def rank_script(
    pattern: str, marker: str = "areal-console scenario", import_root: str | None = None
) -> str:
    """`python3 -c` source running one rank of `pattern` (rank variables already set).

    `marker` lands in the command line (to pick the job with `--match`); `import_root` is
    where `areal_console` can be imported from (default: this checkout).
    """
    if pattern not in PATTERNS or pattern == "missing_rank":
        raise ValueError(f"pattern {pattern!r} cannot run as single ranks")
    root = import_root or str(Path(__file__).resolve().parents[2])
    return _RANK_SCRIPT.format(marker=marker, import_root=root, pattern=pattern)


# --------------------------------------------------------------------------------------
# The launcher: what torchrun does, minus the elastic agent (which would kill every rank
# as soon as one dies, and a dead rank is one of the patterns).


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def worker_argv(pattern: str, steps: int, state_dir: str | None) -> list[str]:
    argv = [
        sys.executable,
        "-m",
        "areal_console.scenarios.hang",
        "--worker",
        "--pattern",
        pattern,
        "--steps",
        str(steps),
    ]
    if state_dir:
        argv += ["--state-dir", state_dir]
    return argv


def run_launcher(
    pattern: str,
    nproc: int,
    steps: int,
    state_dir: str | None,
    port: int | None,
    rank_offset: int = 0,
    world_size: int | None = None,
    master_addr: str = "127.0.0.1",
) -> int:
    world = world_size or nproc
    port = port or free_port()
    children: list[subprocess.Popen[bytes]] = []
    for local_rank in range(nproc):
        env = dict(os.environ)
        env.update(
            RANK=str(rank_offset + local_rank),
            LOCAL_RANK=str(local_rank),
            WORLD_SIZE=str(world),
            LOCAL_WORLD_SIZE=str(nproc),
            MASTER_ADDR=master_addr,
            MASTER_PORT=str(port),
            OMP_NUM_THREADS="1",
        )
        children.append(subprocess.Popen(worker_argv(pattern, steps, state_dir), env=env))
    if state_dir:
        _mark(state_dir, "launcher.ready")
    codes = [child.wait() for child in children]
    return max(codes, default=0)


# --------------------------------------------------------------------------------------
# Python API


@dataclass
class ScenarioJob:
    """A running scenario: its launcher process (own process group) and state directory."""

    pattern: str
    nproc: int
    process: subprocess.Popen[bytes]
    state_dir: Path
    _owned_dir: tempfile.TemporaryDirectory[str] | None = field(default=None, repr=False)

    @property
    def pid(self) -> int:
        return self.process.pid

    def expected_ready(self) -> int:
        """How many ranks signal they reached their final state."""
        return self.nproc - 1 if self.pattern == "missing_rank" else self.nproc

    def ready_count(self) -> int:
        return len(list(self.state_dir.glob("rank*.ready")))

    def wait_ready(self, timeout: float = 60.0) -> None:
        """Block until every (live) rank reached its hung (or slow) state."""
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            settled = self.pattern != "missing_rank" or len(self.rank_pids()) < self.nproc
            if self.ready_count() >= self.expected_ready() and settled:
                # The mark is written just before the blocking call: give it a moment.
                time.sleep(0.3)
                return
            if self.process.poll() is not None:
                raise RuntimeError(
                    f"scenario {self.pattern} exited with status {self.process.returncode}"
                )
            time.sleep(0.05)
        raise TimeoutError(
            f"scenario {self.pattern}: {self.ready_count()}/{self.expected_ready()} ranks "
            f"ready after {timeout:g}s"
        )

    def rank_pids(self) -> list[int]:
        """The PIDs of the launcher's live child processes (the ranks)."""
        pids = []
        for entry in os.listdir("/proc"):
            if not entry.isdigit():
                continue
            try:
                stat = Path(f"/proc/{entry}/stat").read_bytes()
            except OSError:
                continue
            fields = stat[stat.rindex(b")") + 2 :].split()
            if int(fields[1]) == self.pid and fields[0] != b"Z":
                pids.append(int(entry))
        return sorted(pids)

    def stop(self) -> None:
        """Kill the launcher and every rank (the whole process group)."""
        with contextlib.suppress(ProcessLookupError):
            os.killpg(self.process.pid, signal.SIGKILL)
        with contextlib.suppress(subprocess.TimeoutExpired):
            self.process.wait(timeout=10)
        if self._owned_dir is not None:
            self._owned_dir.cleanup()
            self._owned_dir = None

    def __enter__(self) -> ScenarioJob:
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()


def start_scenario(
    pattern: str,
    nproc: int = 4,
    steps: int = 1_000_000,
    state_dir: str | os.PathLike[str] | None = None,
    env: dict[str, str] | None = None,
) -> ScenarioJob:
    """Launch `pattern` with `nproc` ranks in a new process group; returns at once.

    Call `wait_ready()` to wait until the ranks are hung; `stop()` kills them all.
    """
    if pattern not in PATTERNS:
        raise ValueError(f"unknown pattern {pattern!r} (known: {', '.join(PATTERNS)})")
    if nproc < 2:
        raise ValueError("a scenario needs at least 2 ranks")
    owned = None
    if state_dir is None:
        owned = tempfile.TemporaryDirectory(prefix=f"areal-hang-{pattern}-")
        state_dir = owned.name
    argv = [
        sys.executable,
        "-m",
        "areal_console.scenarios.hang",
        "--pattern",
        pattern,
        "--nproc",
        str(nproc),
        "--steps",
        str(steps),
        "--state-dir",
        str(state_dir),
    ]
    child_env = dict(os.environ if env is None else env)
    # The worker imports this package: make sure it is importable from wherever we run.
    pkg_root = str(Path(__file__).resolve().parents[2])
    paths = child_env.get("PYTHONPATH", "").split(os.pathsep) if child_env.get("PYTHONPATH") else []
    if pkg_root not in paths:
        child_env["PYTHONPATH"] = os.pathsep.join([pkg_root, *paths])
    process = subprocess.Popen(
        argv,
        env=child_env,
        start_new_session=True,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    return ScenarioJob(pattern, nproc, process, Path(state_dir), owned)


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m areal_console.scenarios.hang",
        description="Run a small gloo CPU job that hangs (or crawls) like a training job.",
    )
    parser.add_argument("--pattern", choices=PATTERNS, required=True)
    parser.add_argument("--nproc", type=int, default=4, help="ranks to start (default 4)")
    parser.add_argument("--steps", type=int, default=1_000_000)
    parser.add_argument("--state-dir", help="write rankN.ready files here when hung")
    parser.add_argument("--port", type=int, help="MASTER_PORT (default: a free port)")
    parser.add_argument(
        "--nnodes", type=int, default=1, help="nodes the job spans (start one launcher per node)"
    )
    parser.add_argument("--node-rank", type=int, default=0, help="this node's index")
    parser.add_argument("--master-addr", default="127.0.0.1", help="MASTER_ADDR")
    parser.add_argument("--worker", action="store_true", help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.worker:
        return run_worker(args.pattern, args.steps, args.state_dir)
    if args.nnodes > 1 and not args.port:
        parser.error("--nnodes needs --port (the same MASTER_PORT on every node)")
    return run_launcher(
        args.pattern,
        args.nproc,
        args.steps,
        args.state_dir,
        args.port,
        rank_offset=args.node_rank * args.nproc,
        world_size=args.nnodes * args.nproc,
        master_addr=args.master_addr,
    )


if __name__ == "__main__":
    sys.exit(main())
