"""Deterministic Cluster data for snapshots and screenshots, from a recorded agent sample."""

from __future__ import annotations

import json
import math
from collections import deque
from pathlib import Path
from typing import Any

from areal_console.app import ConsoleApp
from areal_console.core.connection.fleet import Fleet
from areal_console.core.connection.monitor import HISTORY, NodeView, RecordedMonitor
from areal_console.core.replay import runs as jobs
from areal_console.core.replay.plan import Verification
from areal_console.core.rollout.jobs import Run
from areal_console.core.rollout.trainer_watch import TrainerState, TrainerStates
from areal_console.core.stacks.codec import capture_from_json
from areal_console.core.stacks.parsing import build_capture
from areal_console.core.stacks.records import StackCapture
from areal_console.screens.batches import BatchesScreen
from areal_console.screens.runs import RunsScreen
from areal_console.screens.stacks import StacksScreen
from areal_console.widgets.rank_group_table import RankGroupTable
from areal_console.widgets.token_view import TokenView
from textual.pilot import Pilot
from textual.widgets import DataTable, Log

from tests.support.fixtures import batch_dumps as bf
from tests.support.waits import until as wait_until

DATA = Path(__file__).resolve().parents[1] / "data"


def recorded_views() -> list[NodeView]:
    sample = json.loads((DATA / "cluster_recording.json").read_text())
    history = {
        g["index"]: deque(
            [
                round(g["util"] * (0.75 + 0.25 * math.sin(i / 3 + g["index"])))
                for i in range(HISTORY)
            ],
            maxlen=HISTORY,
        )
        for g in sample["gpus"]
    }
    up = NodeView("node1", "alice@127.0.0.2:2201", "up", None, 0.004, sample, 0.0, history,
                  {"hostname": "node1", "python": "3.11.7"})  # fmt: skip
    down = NodeView("node2", "alice@127.0.0.3:2201", "down",
                    "connection refused (127.0.0.3:2201): is sshd running?")  # fmt: skip
    return [up, down]


def recorded_monitor() -> RecordedMonitor:
    return RecordedMonitor(recorded_views())


def h200_views() -> list[NodeView]:
    """A GPU node as `nodes --local --json` recorded it (one H200, real NVML values): each
    node record made into the view the monitor keeps, so the panes draw it as they draw a
    live agent sample."""
    recording = json.loads((DATA / "h200-nodes.json").read_text())
    views = []
    for node in recording["nodes"]:
        sample = {key: node[key] for key in ("gpus", "gpu_error", "processes")}
        latency = node["latency_ms"] / 1000 if node["latency_ms"] is not None else None
        views.append(NodeView(node["name"], node["host"], node["state"], node["error"],
                              latency, sample, 0.0, {},
                              {"hostname": node["name"], "python": node["python"]}))  # fmt: skip
    return views


def h200_app() -> ConsoleApp:
    """The console on the recorded GPU node."""
    return ConsoleApp(None, RecordedMonitor(h200_views()))


# --------------------------------------------------------------------------------------
# Every top-level screen in the real app shell, on recorded data (screenshots, snapshots)

PYSPY = DATA / "pyspy"
SIZE = (130, 36)


def recorded_capture(pattern: str = "cleanup_deadlock") -> StackCapture:
    raw = json.loads((PYSPY / f"{pattern}.json").read_text())
    raw["id"] = f"recorded-{pattern}"
    return build_capture(raw)


def saved_capture(name: str) -> StackCapture:
    """A capture as `areal-console stacks` saved it (`stacks --json`), reopened."""
    return capture_from_json(json.loads((PYSPY / f"{name}.json").read_text()))


def saved_stacks_app(name: str) -> ConsoleApp:
    """The console whose Stacks screen reopens a saved capture (tests/data/pyspy/NAME.json)."""
    app = ConsoleApp(None, recorded_monitor())
    capture = saved_capture(name)
    app.register_screen("stacks", lambda: StacksScreen(capture))
    return app


def stacks_app(pattern: str = "cleanup_deadlock") -> ConsoleApp:
    """The console on recorded Cluster data whose Stacks screen holds a recorded capture."""
    app = ConsoleApp(None, recorded_monitor())
    capture = recorded_capture(pattern)
    app.register_screen("stacks", lambda: StacksScreen(capture))
    return app


def scale_views(nodes: int, per_node: int) -> list[NodeView]:
    """`nodes` nodes of `per_node` ranks each, every one the recorded node1 with its rank
    processes renumbered (rank, pid): what the console watches on a large job."""
    sample = json.loads((DATA / "cluster_recording.json").read_text())
    template = next(p for p in sample["processes"] if p.get("rank") is not None)
    views = []
    for n in range(nodes):
        procs = [
            dict(template, pid=20_000 + n * per_node + i, rank=n * per_node + i, local_rank=i)
            for i in range(per_node)
        ]
        node_sample = dict(sample, processes=procs)
        views.append(NodeView(f"n{n:03d}", f"alice@10.0.{n // 250}.{n % 250}:22", "up", None,
                              0.004, node_sample, 0.0, {}, {"hostname": f"n{n:03d}"}))  # fmt: skip
    return views


def scale_fleet_views(nodes: int = 512, per_node: int = 8) -> list[NodeView]:
    """A simulated fleet of `nodes` nodes: the recorded 8-GPU node1 (its sample and GPU
    history) `nodes` times, `per_node` ranks each of one job of `nodes * per_node` ranks,
    renumbered (rank, pid 20000 + rank, GPU), with each rank's CPU% and RSS varied; nodes
    n017 and n233 down (a timeout, a refused key), so their ranks are missing."""
    base = recorded_views()[0]
    assert base.sample is not None
    template = next(p for p in base.sample["processes"] if p.get("rank") is not None)
    world = nodes * per_node
    views = []
    for n in range(nodes):
        name = f"n{n:03d}"
        address = f"alice@10.0.{n // 250}.{n % 250}:22"
        if n in (17, 233):
            why = "timeout 5 s: no SSH answer" if n == 17 else "authentication failed"
            views.append(NodeView(name, address, "down", why))
            continue
        procs = []
        for i in range(per_node):
            rank = n * per_node + i
            procs.append(
                dict(template, pid=20_000 + rank, rank=rank, local_rank=i, world_size=world,
                     master_addr="10.0.0.0", master_port=29500, gpus=[i],
                     cpu_percent=float(90 + (n * 7 + i * 3) % 11),
                     rss=float((3_000 + (n * 13 + i * 29) % 900) * 2**20))
            )  # fmt: skip
        sample = dict(base.sample, processes=procs)
        views.append(NodeView(name, address, "up", None, 0.004, sample, 0.0,
                              dict(base.gpu_history), {"hostname": name}))  # fmt: skip
    return views


def scale_fleet_app(nodes: int = 512, per_node: int = 8) -> ConsoleApp:
    """The console watching `scale_fleet_views`."""
    return ConsoleApp(None, RecordedMonitor(scale_fleet_views(nodes, per_node)))


def scale_capture(ranks: int = 4096) -> StackCapture:
    """A hung job of `ranks` AReaL workers (three threads of ~50 recorded frames each;
    tests/support/fixtures/pyspy_scale.py) read as `stacks --import` reads it, with a
    fixed id, time and user (the snapshot shows no clock and no login name)."""
    import tempfile

    from areal_console.core.stacks.pyspy_text import import_text_dumps

    from tests.support.fixtures.pyspy_scale import write_job

    with tempfile.TemporaryDirectory(prefix="scale-stacks-") as tmp:
        capture = import_text_dumps(write_job(Path(tmp), ranks), "20260101-000000-4096")
    capture.captured_at = "2026-01-01T00:00:00+00:00"
    capture.user = "alice"
    return capture


def scale_stacks_app(ranks: int = 4096) -> ConsoleApp:
    """The console whose Stacks screen holds a `scale_capture` of `ranks` ranks."""
    app = ConsoleApp(None, recorded_monitor())
    capture = scale_capture(ranks)
    app.register_screen("stacks", lambda: StacksScreen(capture))
    return app


async def open_stacks(pilot: Pilot[None], diff: bool = False) -> None:
    """`2`, wait for the diagnosis; with `diff`, mark the first two groups and diff them."""
    await pilot.press("2")
    app = pilot.app
    await wait_until(pilot, lambda: isinstance(app.screen, StacksScreen))
    screen = app.screen
    assert isinstance(screen, StacksScreen)
    await wait_until(pilot, lambda: screen.analysis and screen.query_one(RankGroupTable).shown)
    if diff:
        screen.query_one(RankGroupTable).focus()
        await pilot.press("space", "j", "space", "d")
        await wait_until(pilot, lambda: screen.diffing is not None)
    await pilot.pause()


def write_batches_dump(directory: str | Path) -> None:
    """A small AReaL-layout rollout dump (torch.save, seeded): three steps on two dp ranks."""
    bf.write_trajectory_dump(directory, steps=[10, 11, 12], dp_size=2, n_groups=3,
                             group_size=4, with_prox_logp=True, no_eos_fraction=0.2,
                             max_new_tokens=48, seed=0)  # fmt: skip
    bf.write_model_config(directory)


def batches_app(path: str = "dumps") -> ConsoleApp:
    """The console browsing the dump at `path` (relative: the screen shows it as given)."""
    return ConsoleApp(None, recorded_monitor(), batches_path=path)


async def open_sample(pilot: Pilot[None], row: int = 2) -> None:
    """`3`, wait for the samples of the first step, open sample `row`."""
    await pilot.press("3")
    app = pilot.app
    await wait_until(pilot, lambda: isinstance(app.screen, BatchesScreen))
    screen = app.screen
    samples = screen.query_one("#samples", DataTable)
    await wait_until(pilot, lambda: samples.row_count == 12)
    samples.focus()
    samples.move_cursor(row=row)
    await pilot.press("enter")
    await wait_until(pilot, lambda: screen.query_one(TokenView).view is not None)
    await pilot.pause()


REPLAY_PLAN = {
    "steps": [11, 12],
    "gpus": [0, 1],
    "argv": ["python3", "reference_trainer.py", "--nproc", "2", "start_step=11", "steps=13"],
    "metrics": "{job_dir}/out/metrics.jsonl",
}
REPLAY_LOG = [  # what the reference trainer prints while it replays steps 11-12
    "Epoch 1/1 Step 12/13 Train step 12/13 done.",
    "step 11: task_reward=0.416667 seq_len=37.4167 no_eos_ratio=0.166667 importance_weight=1"
    " behave_imp_weight=1 actor_loss=-0.0183627 grad_norm=0.842131 (replayed)",
    "Epoch 1/1 Step 13/13 Train step 13/13 done.",
    "step 12: task_reward=0.5 seq_len=38.25 no_eos_ratio=0.25 importance_weight=0.998125"
    " behave_imp_weight=1.00412 actor_loss=-0.0211984 grad_norm=0.790513 (replayed)",
]


def recorded_jobs() -> list[jobs.RunRecord]:
    """Three replays as the console remembers them: one verified, one failed, one running."""
    verified = Verification(matched=True, steps=[11, 12])
    failed_plan = {**REPLAY_PLAN, "steps": [10, 10], "gpus": [2]}
    return [
        jobs.RunRecord("replay-0011", "node1", REPLAY_PLAN, 300.0, "finished", 0,
                       "/scratch/jobs/replay-0011/train.log", verification=verified),
        jobs.RunRecord("replay-0010", "node1", failed_plan, 200.0, "failed", 1,
                       "/scratch/jobs/replay-0010/train.log",
                       error="exit 1: CUDA error: out of memory"),
        jobs.RunRecord("replay-0012", "node1", {**REPLAY_PLAN, "steps": [12, 12], "gpus": [3]},
                       100.0, "running", None, "/scratch/jobs/replay-0012/train.log"),
    ]  # fmt: skip


class RecordedSession:
    """A node that answers the Runs screen's questions from the recording."""

    name = "node1"

    def call(self, op: str, args: dict[str, Any] | None = None, timeout: float = 30.0) -> Any:
        if op == "jobs":
            return {"jobs": [{"job": r.job_id, "state": r.state, "exit_code": r.exit_code,
                              "log": r.log, "error": r.error, "argv": r.plan["argv"],
                              "meta": {"plan": r.plan}} for r in recorded_jobs()]}  # fmt: skip
        if op == "job_tail":
            return {
                "lines": REPLAY_LOG if (args or {}).get("job") == recorded_jobs()[0].job_id else []
            }
        raise ValueError(f"no recorded answer to {op!r}")


class RecordedFleet(Fleet):
    """One recorded node for the Runs screen (nothing is connected, nothing runs)."""

    def __init__(self) -> None:
        super().__init__([])
        self.recorded = RecordedSession()

    def call_all(
        self, op: str, args: dict[str, Any] | None = None, timeout: float = 30.0
    ) -> dict[str, Any]:
        return {"node1": self.recorded.call(op, args, timeout)}

    def session(self, name: str) -> Any:
        if name != "node1":
            raise KeyError(name)
        return self.recorded


def jobs_app() -> ConsoleApp:
    """The console with the recorded replays saved as its own (in AREAL_CONSOLE_DATA_DIR)."""
    for record in recorded_jobs():
        jobs.save_run(record)
    return ConsoleApp(RecordedFleet(), recorded_monitor())


async def open_jobs(pilot: Pilot[None]) -> None:
    """`4`, wait for the rows, the verdict and the log tail of the finished replay."""
    await pilot.press("4")
    app = pilot.app
    await wait_until(pilot, lambda: isinstance(app.screen, RunsScreen))
    screen = app.screen
    table = screen.query_one("#jobs-table", DataTable)
    log = screen.query_one("#jobs-log", Log)
    await wait_until(pilot, lambda: table.row_count == 3 and log.line_count == len(REPLAY_LOG))
    await pilot.pause()


# --------------------------------------------------------------------------------------
# Health: a finished run whose behave_imp_weight drifted, written by AReaL's logging code


def health_app(path: str = "run", steps: int = 40) -> ConsoleApp:
    """The app with the Health screen on a run at `path` (relative: shown as given): its
    behave_imp_weight drifts, its importance_weight spiked at steps 30-32 and recovered."""
    from areal_console.core.metrics.health import BEHAVE_IMP_WEIGHT, IMPORTANCE_WEIGHT
    from areal_console.core.metrics.locate import HealthTarget

    from tests.support.areal_logfmt import actor_stats, write_run

    def drifting(step: int) -> dict[str, float]:
        over = {BEHAVE_IMP_WEIGHT: 1.0 + 0.01 * step}
        if 30 <= step <= 32:
            over[IMPORTANCE_WEIGHT] = 1.4
        return actor_stats(step, **over)

    write_run(Path(path), steps, stats=drifting, finished=True)
    return ConsoleApp(None, recorded_monitor(), health_target=HealthTarget(path))


async def open_health(pilot: Pilot[None]) -> None:
    from areal_console.screens.health import HealthScreen

    app = pilot.app
    await pilot.press("5")
    await wait_until(pilot, lambda: isinstance(app.screen, HealthScreen)
                     and app.screen.report is not None)  # fmt: skip
    await until_drawn(pilot)


async def until_drawn(pilot: Pilot[None], timeout: float = 10.0) -> None:
    """Until two frames 50 ms apart show the same text: tables and the plot that fill on
    the next idle are drawn (a snapshot taken earlier catches them half done)."""
    import time

    app = pilot.app
    deadline = time.monotonic() + timeout
    before = None
    while time.monotonic() < deadline:
        await pilot.pause(0.05)
        now = "\n".join(strip.text for strip in app.screen._compositor.render_strips())
        if now == before:
            return
        before = now


def servers_monitor() -> RecordedMonitor:
    """The servers' node with the trainer's state as the live screen reads it from the job's
    files: on version 12, `rollout.max_head_offpolicyness` 0."""
    run = Run("/tmp/areal/logs/alice/gsm8k-grpo/trial0", "alice", "gsm8k-grpo/trial0")
    state = TrainerState(12, "`Train step 12/40 done.` in main.log", 0, 0.0, run)
    trainer = TrainerStates((state,))
    return RecordedMonitor(servers_views(), trainer=trainer)


def servers_views() -> list[NodeView]:
    """The recorded node with three inference servers as the agent reports them after
    polling their own ports: one healthy, one paused after a weight update on an older
    version (flagged), one vLLM with its KV cache full and its queue growing."""
    views = recorded_views()
    sample = dict(views[0].sample or {})

    def server(pid: int, kind: str, port: int, **state: Any) -> dict[str, Any]:
        role = "vllm" if kind == "vllm" else "sglang"
        return {
            "pid": pid, "ppid": 1, "cmdline": f"python3 -m {kind}.launch_server --port {port}",
            "rank": None, "local_rank": None, "world_size": None, "role": role, "cpu_percent": 12.0,
            "rss": 6 << 30, "state": "S", "gpus": [pid % 4], "gpu_memory": 60 << 30, "env_error": None,
            "server": {"kind": kind, "url": f"http://127.0.0.1:{port}/health", "host": "127.0.0.1",
                       "port": port, "health": {"ok": True, "status": 200, "latency_ms": 2.0}, **state},
        }  # fmt: skip

    rising = [1800.0 + 40 * math.sin(i / 2) for i in range(30)]
    sample["processes"] = [
        *sample["processes"],
        server(5101, "sglang", 30000, weight_version=12, paused=False, throughput=rising,
               metrics={"sglang:num_running_reqs": 24, "sglang:num_queue_reqs": 0,
                        "sglang:token_usage": 0.41, "sglang:gen_throughput": rising[-1]}),
        server(5102, "data_proxy", 8082, weight_version=11, paused=True, throughput=[0.0] * 12,
               metrics={}, flags=[{"kind": "paused_after_update",
                                   "evidence": "paused for 340s at version 11",
                                   "remedy": "resume with POST /continue_generation",
                                   "config_key": "actor.weight_update_mode"}]),
        server(5103, "vllm", 8000, throughput=[900.0] * 20 + [150.0] * 5,
               metrics={"vllm:num_requests_running": 64, "vllm:num_requests_waiting": 41,
                        "vllm:kv_cache_usage_perc": 0.98},
               flags=[{"kind": "kv_saturated", "evidence": "KV cache 98% full, queue grew 12 -> 41 over 3 polls",
                       "remedy": "lower the rollouts in flight", "config_key": "rollout.max_concurrent_rollouts"}]),
    ]  # fmt: skip
    views[0] = NodeView(views[0].name, views[0].address, "up", None, 0.004, sample, 0.0,
                        views[0].gpu_history, views[0].hello)  # fmt: skip
    return views
