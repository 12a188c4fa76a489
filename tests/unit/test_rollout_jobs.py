"""Which run each process and server belongs to, and the version flags kept within a run."""

from __future__ import annotations

from typing import Any

from areal_console.core.rollout.jobs import Run, fleet_runs, unassigned_note
from areal_console.core.rollout.servers import add_fleet_flags, run_flags


def worker(pid: int, root: str, trial: str, ppid: int = 1) -> dict[str, Any]:
    """An AReaL rpc_server worker as AReaL's LocalScheduler starts it (guard/app.py:518-528)."""
    return {
        "pid": pid, "ppid": ppid, "user": "alice", "role": "rollout",
        "cmdline": f"python3 -m areal.infra.rpc.rpc_server --port 1 --experiment-name exp "
        f"--trial-name {trial} --role rollout --worker-index 0 --fileroot {root}",
    }  # fmt: skip


def server(pid: int, ppid: int, version: int, **extra: Any) -> dict[str, Any]:
    return {"pid": pid, "ppid": ppid, "user": "alice", "cmdline": "python3 -m sglang.launch_server",
            "server": {"polled": True, "weight_version": version, "paused": False}, **extra}  # fmt: skip


A = "/data/logs/alice/exp/a"
B = "/data/logs/alice/exp/b"


def test_a_server_takes_its_nearest_ancestors_run_across_wrappers() -> None:
    procs = [
        worker(10, "/data", "a"),
        {"pid": 11, "ppid": 10, "cmdline": "/bin/bash -c python3 -m sglang.launch_server"},
        server(12, 11, 3),
        worker(20, "/data", "b"),
        server(21, 20, 2),
        server(30, 1, 5),  # nothing above it names a run, and there are two
    ]
    runs = fleet_runs([("n1", procs)], "alice")
    assert set(runs.runs) == {A, B}
    assert runs.runs[A] == Run(A, "alice", "exp/a")
    assert runs.of["n1:12"] == A and runs.of["n1:21"] == B and runs.of["n1:30"] is None
    assert runs.processes([("n1", procs)], B) == {"n1": [procs[3], procs[4]]}
    note = unassigned_note(["n1:12", "n1:21", "n1:30"], runs)
    assert note is not None and "server n1:30 belongs to" in note and note.startswith("2 runs")


def test_the_agents_job_link_then_the_only_run() -> None:
    # A server on another node than its worker: the agent's experiment/trial link says.
    n1 = [worker(10, "/data", "a"), worker(20, "/data", "b")]
    n2 = [server(5, 1, 3, job="exp/b"), server(6, 1, 3, job="exp/zzz")]
    runs = fleet_runs([("n1", n1), ("n2", n2)], "alice")
    assert runs.of["n2:5"] == B and runs.of["n2:6"] is None
    # One run on the fleet: a server nothing links is that run's.
    only = fleet_runs([("n1", n1[:1]), ("n2", [server(7, 1, 3)])], "alice")
    assert only.of["n2:7"] == A and unassigned_note(["n2:7"], only) is None
    # A known run (a recorded trainer state) counts as the fleet's only run.
    known = fleet_runs([("n2", [server(7, 1, 3)])], "alice", [Run(B, "alice", "exp/b")])
    assert known.of["n2:7"] == B


def test_flags_compare_and_hold_servers_within_their_run_only() -> None:
    procs = [worker(10, "/data", "a"), server(12, 10, 3), server(13, 10, 4),
             worker(20, "/data", "b"), server(21, 20, 2), server(30, 1, 1)]  # fmt: skip
    runs = fleet_runs([("n1", procs)], "alice")
    versions: dict[str, int | str | None] = {"n1:12": 3, "n1:13": 4, "n1:21": 2, "n1:30": 1}
    flags = run_flags(versions, {}, runs, {A: (4, 0), B: (2, 0)})
    kinds = {k: [f.kind for f in v] for k, v in flags.items()}
    # A: 3 beside 4 is a skew, and 3 lags A's trainer on 4; B's server on 2 is level with
    # B's trainer (A's 4 would have made it lag); the unassigned server gets nothing.
    assert kinds == {"n1:12": ["version_skew", "version_lag"]}
    assert "the trainer is on 4" in flags["n1:12"][1].evidence
    # No run named anywhere (servers without AReaL): one group, the skew only.
    bare = fleet_runs([("n1", [server(1, 0, 3), server(2, 0, 4)])], "alice")
    assert [f.kind for f in run_flags({"n1:1": 3, "n1:2": 4}, {}, bare)["n1:1"]] == ["version_skew"]
    # `nodes --json`'s entries the same way.
    nodes = [{"name": "n1", "processes": procs}]
    add_fleet_flags(nodes, runs, {A: (4, 0), B: (2, 0)})
    assert [f["kind"] for f in procs[1]["server"]["flags"]] == ["version_skew", "version_lag"]
    assert "flags" not in procs[4]["server"] and "flags" not in procs[5]["server"]


def test_a_capture_of_several_runs_holds_no_server_to_one_runs_trainer() -> None:
    from areal_console.core.rollout.context import RolloutSummary, add_server_flags
    from areal_console.core.rollout.trainer_version import TrainerVersion
    from areal_console.core.stacks.records import RankStack, ServerInfo, StackCapture

    def capture(*trials: str) -> StackCapture:
        ranks = [RankStack(node="n1", pid=10 + i, cmdline=worker(0, "/data", t)["cmdline"])
                 for i, t in enumerate(trials)]  # fmt: skip
        for pid, version in ((30, 3), (31, 2)):
            ranks.append(
                RankStack(
                    node="n1", pid=pid, server=ServerInfo("sglang", "u", weight_version=version)
                )
            )
        head = {"rollout.max_head_offpolicyness": {"value": 0, "from": "config.yaml"}}
        summary = RolloutSummary(config=head, trainer=TrainerVersion(4, "perf tracer"))
        return StackCapture("now", 1, ranks, rollout=summary)

    one = capture("a")  # one job's capture: its servers held to its trainer
    add_server_flags(one)
    assert [f["kind"] for f in one.ranks[-1].server.flags] == ["version_skew", "version_lag"]  # type: ignore[union-attr]
    both = capture("a", "b")  # --all-jobs: two runs, one trainer read
    add_server_flags(both)
    assert all(not r.server.flags for r in both.ranks if r.server is not None)
    assert both.rollout is not None and both.rollout.notes[0].startswith("2 runs in this capture")
