"""Agents on a Slurm job's nodes, started by `srun --overlap --jobid JOB`.

Two forms, both giving every node its own `Channel` so the rest of the console can't tell
them from SSH:

- per node: one `srun -w NODE -N1 -n1` step per node, its stdio is the channel;
- one step (the default): a single `srun -w NODES --ntasks-per-node=1 --input=all --label`
  step runs the agent on every node at once. Requests go to all agents on the broadcast
  stdin, addressed by `"node"` (an agent drops requests for other nodes); replies come back
  labelled by task and are routed to their node's channel. One process and one (login)
  connection serve the whole job.

If the shared step fails to start (srun aborts the whole step when one node can't launch),
the nodes that were not at fault fall back to their own per-node step.
"""

from __future__ import annotations

import json
import os
import queue
import signal
import subprocess
import threading
from typing import Any

from areal_console.core.slurm import CommandRunner, make_runner
from areal_console.core.targets import NodeSpec, SlurmTarget
from areal_console.core.transport import BOOTSTRAP, ChannelClosed, agent_hash, source_frame

# slurmstepd cuts labelled output into chunks of this many bytes, each on its own line;
# a shorter (possibly empty) chunk ends the original line.
LABEL_CHUNK = 1024
AGENT_STEP_NAME = "areal-console-agent"


def srun_argv(
    target: SlurmTarget, nodes: list[str], python: str = "python3", srun: str = "srun"
) -> list[str]:
    """The srun command line running the agent bootstrap on `nodes` (one task per node)."""
    argv = [
        srun,
        "--overlap",
        f"--jobid={target.job_id}",
        f"--job-name={AGENT_STEP_NAME}",
        f"--nodelist={','.join(nodes)}",
        f"--nodes={len(nodes)}",
        f"--ntasks={len(nodes)}",
        "--ntasks-per-node=1",
        "--cpus-per-task=1",
        "--quiet",
        "--kill-on-bad-exit=0",
    ]
    if target.gpus:
        # Without the job's GPUs in the step, cgroup device limits would hide them from NVML.
        argv.append(f"--gres=gpu:{target.gpus}")
    if len(nodes) > 1:
        argv += ["--input=all", "--label"]
    return [*argv, python, "-c", BOOTSTRAP, agent_hash()]


class ProcessChannel:
    """A `Channel` over a local process's stdio (srun here, or ssh running srun)."""

    def __init__(self, argv: list[str], what: str, env: dict[str, str] | None = None) -> None:
        self.what = what
        try:
            self.proc = subprocess.Popen(
                argv,
                stdin=subprocess.PIPE,
                stdout=subprocess.PIPE,
                stderr=subprocess.PIPE,
                start_new_session=True,  # Ctrl-C in the console must not end the step
                env=env,
            )
        except FileNotFoundError as exc:
            raise OSError(f"{what}: {argv[0]} not found") from exc
        self._stderr: list[bytes] = []
        self._send_lock = threading.Lock()
        threading.Thread(target=self._drain_stderr, daemon=True).start()

    def _drain_stderr(self) -> None:
        assert self.proc.stderr is not None
        for line in self.proc.stderr:
            self._stderr.append(line)
            del self._stderr[:-20]

    def stderr_lines(self) -> list[str]:
        return [b.decode(errors="replace").strip() for b in self._stderr if b.strip()]

    def send(self, data: bytes) -> None:
        assert self.proc.stdin is not None
        with self._send_lock:
            try:
                self.proc.stdin.write(data)
                self.proc.stdin.flush()
            except (BrokenPipeError, ValueError, OSError) as exc:
                raise ChannelClosed(self.exit_reason()) from exc

    def recv_line(self) -> bytes:
        assert self.proc.stdout is not None
        try:
            return self.proc.stdout.readline()
        except (ValueError, OSError):
            return b""

    def close(self) -> None:
        """EOF ends the agents and so the step; srun gets SIGTERM (it ends the step) if not."""
        if self.proc.poll() is not None:
            return
        try:
            assert self.proc.stdin is not None
            self.proc.stdin.close()
        except OSError:
            pass
        for sig in (signal.SIGTERM, signal.SIGKILL):
            try:
                self.proc.wait(timeout=3)
                return
            except subprocess.TimeoutExpired:
                try:
                    os.killpg(self.proc.pid, sig)
                except ProcessLookupError:
                    return
        self.proc.wait()

    def exit_reason(self) -> str:
        code = self.proc.poll()
        if code is None:
            try:
                code = self.proc.wait(timeout=1)
            except subprocess.TimeoutExpired:
                return f"{self.what}: agent stopped answering"
        errors = [ln for ln in self.stderr_lines() if "error" in ln.lower()] or self.stderr_lines()
        why = f"killed by signal {-code}" if code < 0 else f"exited with status {code}"
        return f"{self.what} {why}" + (f": {errors[0]}" if errors else "")


def open_node_step(spec: NodeSpec, runner: CommandRunner | None = None) -> ProcessChannel:
    """Per-node form: one `srun -w NODE` step whose stdio is the channel."""
    assert spec.slurm is not None
    node = spec.host or spec.name
    runner = runner or make_runner(spec.slurm.login)
    argv = runner.process_argv(srun_argv(spec.slurm, [node], spec.python))
    return ProcessChannel(argv, f"srun on {node} (job {spec.slurm.job_id})")


class SharedStep:
    """One srun step running the agent on many nodes; hands out a channel per node."""

    def __init__(
        self, target: SlurmTarget, nodes: list[str], python: str, runner: CommandRunner
    ) -> None:
        self.target = target
        self.nodes = list(nodes)
        self.python = python
        self.runner = runner
        self.channels: dict[str, NodeStepChannel] = {n: NodeStepChannel(self, n) for n in nodes}
        self._task_node: dict[int, str] = {}
        self._partial: dict[int, bytearray] = {}
        self._source_sent = False
        self._users = 0
        self._lock = threading.Lock()
        self.process = ProcessChannel(
            runner.process_argv(srun_argv(target, nodes, python)),
            f"srun step on {len(nodes)} nodes (job {target.job_id})",
        )
        self.ended = threading.Event()
        threading.Thread(target=self._read_loop, name="srun-step-reader", daemon=True).start()

    # output routing -------------------------------------------------------------------
    def _read_loop(self) -> None:
        while True:
            raw = self.process.recv_line()
            if not raw:
                break
            label, sep, payload = raw.partition(b": ")
            if not sep or not label.strip().isdigit():
                continue  # not a task's output
            task = int(label.strip())
            chunk = payload[:-1] if payload.endswith(b"\n") else payload
            buf = self._partial.setdefault(task, bytearray())
            buf += chunk
            if len(chunk) == LABEL_CHUNK:
                continue  # the line goes on in the next chunk
            line = bytes(buf) + b"\n"
            buf.clear()
            self._route(task, line)
        self._end()

    def _route(self, task: int, line: bytes) -> None:
        node = self._task_node.get(task)
        if node is None:
            try:
                message = json.loads(line)
            except ValueError:
                return
            if not isinstance(message, dict):
                return
            if message.get("event") == "need_source":
                # Every node's bootstrap reads the same frame from the shared stdin: send once.
                with self._lock:
                    if self._source_sent:
                        return
                    self._source_sent = True
                try:
                    self.process.send(source_frame())
                except ChannelClosed:
                    pass
                return
            if message.get("event") != "ready":
                return
            named = message.get("node")
            if isinstance(named, str) and named in self.channels:
                node = named
            elif task < len(self.nodes):
                # An agent that doesn't know its node: Slurm places task i on the i-th node.
                node = self.nodes[task]
            else:
                return
            self._task_node[task] = node
        self.channels[node].deliver(line)

    def _end(self) -> None:
        self.ended.set()
        failed = self._failed_nodes()
        for node, channel in self.channels.items():
            channel.step_ended(node in failed)

    def _failed_nodes(self) -> set[str]:
        """Nodes srun blames for the step's failure (launch errors name them)."""
        text = "\n".join(self.process.stderr_lines())
        return {n for n in self.nodes if f"node {n}:" in text or f"on node {n}" in text}

    # lifecycle ------------------------------------------------------------------------
    def send(self, node: str, data: bytes) -> None:
        if data[:1] == b"{":
            # Address the request: every agent reads it, only `node`'s answers.
            data = b'{"node":' + json.dumps(node).encode() + b"," + data[1:]
        self.process.send(data)

    def acquire(self) -> None:
        with self._lock:
            self._users += 1

    def release(self) -> None:
        with self._lock:
            self._users -= 1
            last = self._users <= 0
        if last:
            self.close()

    def close(self) -> None:
        self.process.close()
        with _STEPS_LOCK:
            for key, step in list(_STEPS.items()):
                if step is self:
                    del _STEPS[key]


class NodeStepChannel:
    """One node's view of a `SharedStep` (a `Channel`)."""

    def __init__(self, step: SharedStep, node: str) -> None:
        self.step = step
        self.node = node
        self._lines: queue.Queue[bytes] = queue.Queue()
        self._ready = False
        self._fallback: ProcessChannel | None = None
        self._closed = False
        self._reason: str | None = None

    def deliver(self, line: bytes) -> None:
        if not self._ready and b'"event":"ready"' in line:
            self._ready = True
        self._lines.put(line)

    def step_ended(self, blamed: bool) -> None:
        if not self._ready and not blamed and not self._closed:
            # The shared step failed before this node came up, through no fault of its own:
            # give it a step of its own so one bad node can't take down the rest.
            spec = NodeSpec(
                name=self.node,
                transport="slurm",
                host=self.node,
                python=self.step.python,
                slurm=self.step.target,
            )
            try:
                self._fallback = open_node_step(spec, self.step.runner)
            except OSError as exc:
                self._reason = str(exc)
        self._lines.put(b"")

    def send(self, data: bytes) -> None:
        if self._fallback is not None:
            self._fallback.send(data)
            return
        if self.step.ended.is_set():
            raise ChannelClosed(self.exit_reason())
        self.step.send(self.node, data)

    def recv_line(self) -> bytes:
        if self._fallback is not None:
            return self._fallback.recv_line()
        line = self._lines.get()
        if not line and self._fallback is not None:
            return self._fallback.recv_line()
        return line

    def close(self) -> None:
        if self._closed:
            return
        self._closed = True
        if self._fallback is not None:
            self._fallback.close()
        self.step.release()

    def exit_reason(self) -> str:
        if self._fallback is not None:
            return self._fallback.exit_reason()
        return self._reason or self.step.process.exit_reason()


_STEPS: dict[tuple[Any, ...], SharedStep] = {}
_STEPS_LOCK = threading.Lock()


def open_slurm_channel(spec: NodeSpec, **options: Any) -> Any:
    """The `Channel` for a "slurm" node spec (called by `fleet.open_channel`)."""
    target = spec.slurm
    if target is None:
        raise ValueError(f"node {spec.name}: a slurm node spec needs its job")
    if target.unreachable:
        raise OSError(target.unreachable)
    node = spec.host or spec.name
    runner: CommandRunner = options.get("slurm_runner") or make_runner(target.login)
    if target.mode == "node" or len(target.nodes) <= 1:
        return open_node_step(spec, runner)
    key = (target.job_id, target.login, target.nodes, target.gpus, spec.python)
    with _STEPS_LOCK:
        step = _STEPS.get(key)
        if step is None or step.ended.is_set() or step.channels[node]._closed:
            step = SharedStep(target, list(target.nodes), spec.python, runner)
            _STEPS[key] = step
        step.acquire()
    return step.channels[node]
