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
the nodes that were not at fault fall back to their own per-node step. A node whose agent
launched but never says it is ready (a frozen node, a hung file system) does not hold the
others: after the step's start deadline it alone is failed, named with that reason, and the
rest go on.
"""

from __future__ import annotations

import base64
import json
import queue
import re
import threading
import time
from typing import Any

from areal_console.core.connection.payload import node_payload
from areal_console.core.connection.transport import (
    BOOTSTRAP,
    SHARED_BOOTSTRAP,
    ChannelClosed,
    resolving_argv,
)
from areal_console.core.slurm.client import CommandRunner, StepProcess, make_runner
from areal_console.core.targets.specs import NodeSpec, SlurmTarget

# slurmstepd cuts labelled output into chunks of this many bytes, each on its own line;
# a shorter (possibly empty) chunk ends the original line.
LABEL_CHUNK = 1024
# How long the shared step's writer gathers requests before one write (see `_write_loop`).
COALESCE_S = 0.002
# Answered by the nodes a batch holds no request for (see `_write_loop`); replies dropped.
ACK_ID = "ack"
ACK_REPLY_PREFIX = b'{"id":"ack",'
AGENT_STEP_NAME = "areal-console-agent"
# How long the shared step waits for every agent's `ready` before it goes on without the
# silent ones: past srun's own launch-failure report (MessageTimeout, 10 s by default), so
# that a step srun aborts still falls back to per-node steps; within the session's start
# deadline (`START_SHARE` of it), so that the nodes that answered connect in time.
ESTABLISH_TIMEOUT = 20.0
START_SHARE = 0.75


SOURCE_NODE = "(source)"  # an address no agent has


def shared_source_line() -> bytes:
    """The payload for the shared step's bootstraps: one JSON line (base64) to no node."""
    data = base64.b64encode(node_payload().data).decode()
    return (
        json.dumps({"node": SOURCE_NODE, "payload": data}, separators=(",", ":")) + "\n"
    ).encode()


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
        "--chdir=/",  # not the console's folder, nor srun's /tmp fallback on the node
    ]
    if target.gpus:
        # Without the job's GPUs in the step, cgroup device limits would hide them from NVML.
        argv.append(f"--gres=gpu:{target.gpus}")
    # The interpreter is chosen on the node (not from the caller's PATH, which srun may
    # pass on or, with --export=NONE, not at all); /bin/sh by its absolute path.
    if len(nodes) > 1:
        argv += ["--input=all", "--label"]
        return [*argv, *resolving_argv(python, SHARED_BOOTSTRAP)]
    return [*argv, *resolving_argv(python, BOOTSTRAP)]


def open_node_step(spec: NodeSpec, runner: CommandRunner | None = None) -> StepProcess:
    """Per-node form: one `srun -w NODE` step whose stdio is the channel."""
    assert spec.slurm is not None
    node = spec.host or spec.name
    runner = runner or make_runner(spec.slurm.login)
    argv = srun_argv(spec.slurm, [node], spec.python)
    return runner.start(argv, f"srun on {node} (job {spec.slurm.job_id})")


class LabelledLines:
    """Reassembles `srun --label` output into each task's own lines.

    slurmstepd cuts a long line into `LABEL_CHUNK`-byte chunks and labels each one; a
    shorter (possibly empty) chunk ends the line. Chunks of different tasks interleave.
    """

    def __init__(self) -> None:
        self._partial: dict[int, bytearray] = {}

    def feed(self, raw: bytes) -> tuple[int, bytes] | None:
        """One labelled output line -> (task, complete line) or None (more to come / noise)."""
        label, sep, payload = raw.partition(b": ")
        if not sep or not label.strip().isdigit():
            return None
        task = int(label.strip())
        chunk = payload[:-1] if payload.endswith(b"\n") else payload
        buf = self._partial.setdefault(task, bytearray())
        buf += chunk
        if len(chunk) == LABEL_CHUNK:
            return None
        line = bytes(buf) + b"\n"
        buf.clear()
        return task, line


# srun's report of a task that ended: "srun: error: node3: task 2: Killed"
_TASK_ENDED = re.compile(r"srun: error: (\S+): tasks? [\d,\-]+: (.+)")
# "srun: error: Task launch for StepId=5.2 failed on node node3: Communication ..."
_LAUNCH_FAILED = re.compile(r"failed on node (\S+?):")
_STEP_ABORTED = ("Task launch for", "Application launch failed", "Job step aborted")


class SharedStep:
    """One srun step running the agent on many nodes; hands out a channel per node.

    Channels see nothing until every node's agent is up (or has failed): if srun aborts the
    step because one node can't launch, the other nodes haven't started talking yet and
    switch cleanly to steps of their own.
    """

    def __init__(
        self,
        target: SlurmTarget,
        nodes: list[str],
        python: str,
        runner: CommandRunner,
        establish_timeout: float = ESTABLISH_TIMEOUT,
    ) -> None:
        self.target = target
        self.nodes = list(nodes)
        self.python = python
        self.runner = runner
        self.channels: dict[str, NodeStepChannel] = {n: NodeStepChannel(self, n) for n in nodes}
        self._task_node: dict[int, str] = {}
        self._lines = LabelledLines()
        self._source_sent = False
        self._ready: set[str] = set()
        self._failed: dict[str, str] = {}
        self._aborting = False
        self._users = 0
        self._lock = threading.Lock()
        self._outbox: list[tuple[str, bytes]] = []
        self._outbox_ready = threading.Condition()
        self.establish_timeout = establish_timeout
        self.established = threading.Event()  # every node ready or failed (or the step ended)
        self.ended = threading.Event()
        self.process = runner.start(
            srun_argv(target, nodes, python),
            f"srun step on {len(nodes)} nodes (job {target.job_id})",
            on_stderr=self._stderr_line,
        )
        threading.Thread(target=self._read_loop, name="srun-step-reader", daemon=True).start()
        threading.Thread(target=self._write_loop, name="srun-step-writer", daemon=True).start()
        threading.Thread(
            target=self._establish_deadline, name="srun-step-start", daemon=True
        ).start()

    def _establish_deadline(self) -> None:
        """Fail, each by name, the nodes whose agent has not said `ready` in time."""
        if self.established.wait(self.establish_timeout) or self.ended.is_set():
            return
        with self._lock:
            silent = [n for n in self.nodes if n not in self._ready and n not in self._failed]
            for node in silent:
                self._failed[node] = (
                    f"agent on {node} did not start within {self.establish_timeout:g} s "
                    f"under the shared srun step (job {self.target.job_id}): the node "
                    "launched it but it never answered (node frozen or overloaded, a hung "
                    "file system?)"
                )
        for node in silent:
            self.channels[node].end(self._failed[node])
        self.established.set()

    # output routing -------------------------------------------------------------------
    def _read_loop(self) -> None:
        while True:
            raw = self.process.recv_line()
            if not raw:
                break
            got = self._lines.feed(raw)
            if got is not None:
                self._route(*got)
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
                # Every node's bootstrap reads the same line from the shared stdin: send once.
                with self._lock:
                    if self._source_sent:
                        return
                    self._source_sent = True
                try:
                    self.process.send(shared_source_line())
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
            if node in self._failed:
                return  # too late: given up on at the start deadline
            self._task_node[task] = node
            self.channels[node].deliver(line)
            with self._lock:
                self._ready.add(node)
            self._check_established()
            return
        if line.startswith(ACK_REPLY_PREFIX) or node in self._failed:
            return  # a node given up on at the start deadline stays failed
        self.channels[node].deliver(line)

    def _stderr_line(self, text: str) -> None:
        if any(sign in text for sign in _STEP_ABORTED):
            # The whole step is going down; its tasks' deaths are not theirs to explain.
            self._aborting = True
        if self._aborting:
            return
        m = _TASK_ENDED.search(text)
        if m is None or m.group(1) not in self.channels:
            return
        node, why = m.group(1), m.group(2).strip()
        with self._lock:
            self._failed.setdefault(node, f"agent on {node} ended under srun: {why}")
        self.channels[node].end(self._failed[node])
        self._check_established()

    def _check_established(self) -> None:
        with self._lock:
            done = len(self._ready | set(self._failed)) >= len(self.nodes)
        if done:
            self.established.set()

    def _end(self) -> None:
        with self._outbox_ready:
            self.ended.set()
            self._outbox_ready.notify_all()
        if not self.established.is_set():
            self.process.wait_stderr()
            blamed = self._blamed_nodes()
            if blamed:
                # srun aborted the whole step for these nodes: the rest get steps of their own.
                for node, channel in self.channels.items():
                    if node not in blamed:
                        channel.use_own_step()
        for channel in self.channels.values():
            channel.end(None)
        self.established.set()

    def _blamed_nodes(self) -> set[str]:
        """Nodes srun names in its launch errors."""
        text = "\n".join(self.process.stderr_lines())
        return {n for n in _LAUNCH_FAILED.findall(text) if n in self.channels}

    # lifecycle ------------------------------------------------------------------------
    def send(self, node: str, data: bytes) -> None:
        if data[:1] == b"{":
            # Address the request: every agent reads it, only `node`'s answers.
            data = b'{"node":' + json.dumps(node).encode() + b"," + data[1:]
        with self._outbox_ready:
            if self.ended.is_set():
                raise ChannelClosed(self.process.exit_reason())
            self._outbox.append((node, data))
            self._outbox_ready.notify()

    def _ack_request(self, addressed: set[str]) -> bytes:
        """A ping for every node the batch holds nothing for, so each node answers once."""
        others = [n for n in self.nodes if n not in addressed and n not in self._failed]
        if not others:
            return b""
        line = {"node": others, "id": ACK_ID, "op": "ping", "args": {}}
        return (json.dumps(line, separators=(",", ":")) + "\n").encode()

    def _write_loop(self) -> None:
        """Write queued requests in batches.

        srun forwards the broadcast stdin to each node over TCP. A node that receives only
        requests for other nodes sends nothing back, so its ACK is delayed (~40 ms), and
        srun's next small write to it waits for that ACK (Nagle). So: what arrives within
        COALESCE_S goes out as one write (a fan-out is one segment), and each batch asks the
        nodes it holds no request for to answer a ping: every node answers every batch once.
        """
        while True:
            with self._outbox_ready:
                while not self._outbox and not self.ended.is_set():
                    self._outbox_ready.wait()
                if self.ended.is_set():
                    return
            time.sleep(COALESCE_S)
            with self._outbox_ready:
                queued, self._outbox = self._outbox, []
            addressed = {node for node, _ in queued}
            batch = b"".join(data for _, data in queued) + self._ack_request(addressed)
            try:
                self.process.send(batch)
            except ChannelClosed:
                return

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
        self._own_step: StepProcess | None = None
        self._reason: str | None = None
        self.used = False  # handed to a session once; a reconnect gets a step of its own
        self.closed = False

    def deliver(self, line: bytes) -> None:
        self._lines.put(line)

    def end(self, reason: str | None) -> None:
        if reason and self._reason is None:
            self._reason = reason
        self._lines.put(b"")

    def use_own_step(self) -> None:
        if self.closed:
            return
        spec = NodeSpec(
            name=self.node,
            transport="slurm",
            host=self.node,
            python=self.step.python,
            slurm=self.step.target,
        )
        try:
            self._own_step = open_node_step(spec, self.step.runner)
        except OSError as exc:
            self._reason = str(exc)

    def send(self, data: bytes) -> None:
        if self._own_step is not None:
            self._own_step.send(data)
            return
        if self.step.ended.is_set() or self._reason:
            raise ChannelClosed(self.exit_reason())
        self.step.send(self.node, data)

    def recv_line(self) -> bytes:
        self.step.established.wait()
        if self._own_step is not None:
            return self._own_step.recv_line()
        return self._lines.get()

    def close(self) -> None:
        if self.closed:
            return
        self.closed = True
        if self._own_step is not None:
            self._own_step.close()
        self.step.release()

    def exit_reason(self) -> str:
        if self._own_step is not None:
            return self._own_step.exit_reason()
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
    if node not in target.nodes:
        return open_node_step(spec, runner)
    key = (target.job_id, target.login, target.nodes, target.gpus, spec.python)
    with _STEPS_LOCK:
        step = _STEPS.get(key)
        if step is not None and not step.ended.is_set() and step.channels[node].used:
            # A reconnect of one node while the shared step serves the others.
            return open_node_step(spec, runner)
        if step is None or step.ended.is_set():
            start = options.get("start_timeout")
            establish = ESTABLISH_TIMEOUT if start is None else START_SHARE * float(start)
            step = SharedStep(target, list(target.nodes), spec.python, runner, establish)
            _STEPS[key] = step
        step.acquire()
        channel = step.channels[node]
        channel.used = True
    return channel
