"""The trainer's version, the run's config and the session tracer files, read from a run's
log directory by a real agent (as the job's user's files only), and the version flags they
raise on real stand-in servers (`nodes --json`'s servers, a capture's servers)."""

from __future__ import annotations

import copy
import getpass
import os
import time
from pathlib import Path
from typing import Any

import pytest
import yaml
from areal_console.core.connection.client import AgentClient
from areal_console.core.connection.records import process_rows
from areal_console.core.connection.transport import LocalChannel
from areal_console.core.rollout.context import (
    fleet_trainer_state,
    nodes_to_ask,
    rollout_files,
    summarize,
    versioned_servers,
)
from areal_console.core.rollout.job_config import config_paths, staleness_config
from areal_console.core.rollout.jobs import fleet_runs
from areal_console.core.rollout.servers import row_runs, server_lines
from areal_console.core.rollout.trainer_version import from_log, from_trace, trainer_version
from areal_console.core.rollout.trainer_watch import TrainerWatch
from areal_node.server_flags import fleet_flags
from areal_node.server_poll import ServerPoller
from hypothesis import given
from hypothesis import strategies as st

from tests.support.areal_logfmt import write_run
from tests.support.fixtures.perf_tracer_files import (
    TranscribedPerfTracer,
    TranscribedSessionTracer,
    write_steps,
)
from tests.support.nobody import NOBODY, as_nobody, needs_nobody, shared_tmp
from tests.tui.test_servers_pane import server_process
from tests.unit.test_server_poll import Standin, target

USER = getpass.getuser()


class Node:
    """A node session over a real local agent (the capture's and `nodes`' calls)."""

    def __init__(self, client: AgentClient, name: str = "node1") -> None:
        self.client, self.name = client, name

    def call(self, op: str, args: dict[str, Any] | None = None, timeout: float = 30.0) -> Any:
        return self.client.request(op, args, timeout=timeout)


@pytest.fixture(scope="module")
def node() -> Any:
    client = AgentClient(LocalChannel())
    client.start(gpus=False)
    yield Node(client)
    client.close()


def trial(root: Path) -> Path:
    d = root / "logs" / USER / "exp" / "t1"
    d.mkdir(parents=True)
    return d


def controller(root: Path, *extra: str) -> dict[str, Any]:
    cmd = (
        f"python3 -m areal.launcher.local train.py --config {root}/grpo.yaml "
        f"cluster.fileroot={root} experiment_name=exp trial_name=t1 " + " ".join(extra)
    )
    return {"pid": 4242, "cmdline": cmd, "rank": 0, "role": "rollout"}


# --- pure parts -------------------------------------------------------------------------


def test_trainer_version_from_the_stats_line_and_the_update_span(tmp_path: Path) -> None:
    d = trial(tmp_path)
    write_run(d, 4)  # `Train step 1/4 done.` .. `Train step 4/4 done.`
    lines = (d / "main.log").read_text().split("\n")
    assert from_log(lines) is not None and from_log(lines).version == 4  # type: ignore[union-attr]
    tracer = TranscribedPerfTracer(d, 0)
    write_steps(tracer, 3)  # steps 0-2, each ending in train.update_weights
    traced = from_trace(tracer.path.read_text().split("\n"))
    assert traced is not None and traced.version == 3
    assert "train.update_weights` of step 2 finished" in traced.evidence
    tracer.span("train.rollout", 1000, global_step=3)  # step 3 begun, no update yet
    tracer.save()
    assert from_trace(tracer.path.read_text().split("\n")).version == 3  # type: ignore[union-attr]
    both = trainer_version([lines], [tracer.path.read_text().split("\n")])
    assert both is not None and both.version == 4 and "Train step 4/4" in both.evidence
    assert trainer_version([["Train step x/4 done."]], [["{}"]]) is None


def test_config_layers_as_areal_loads_them() -> None:
    given = (
        "train_dataset:\n  batch_size: 16\n"
        "rollout:\n  max_concurrent_rollouts: 64\n"
        "  consumer_batch_size: ${train_dataset.batch_size}\n  max_head_offpolicyness: 4\n"
    )
    saved = "rollout:\n  max_concurrent_rollouts: null\n  max_head_offpolicyness: 3\n"
    config, notes = staleness_config(
        ["train.py --config g.yaml rollout.max_head_offpolicyness=2 +rollout.x=1"],
        [("g.yaml", given), ("config.yaml", saved)],
    )
    assert notes == []
    assert config["rollout.consumer_batch_size"] == {"value": 16, "from": "g.yaml"}
    assert config["rollout.max_concurrent_rollouts"] == {"value": None, "from": "config.yaml"}
    assert config["rollout.max_head_offpolicyness"] == {"value": 2, "from": "command line"}
    # Bad documents and values are named, never raised; the defaults stay.
    laughs = "a: &a [x, x, x, x, x, x, x, x, x]\n" + "".join(
        f"{c}: &{c} [*{p}, *{p}, *{p}, *{p}, *{p}, *{p}, *{p}, *{p}, *{p}]\n"
        for p, c in zip("abcdefgh", "bcdefghi", strict=True)
    )
    config, notes = staleness_config(
        [], [("bad.yaml", "rollout: [1"), ("big.yaml", laughs), ("s.yaml", "rollout:\n  max_head_offpolicyness: ${nope}\n")]
    )  # fmt: skip
    assert config["rollout.max_head_offpolicyness"] == {"value": 0, "from": "AReaL's default"}
    assert [n.split(":")[0] for n in notes] == ["bad.yaml", "big.yaml", "s.yaml"]
    assert config_paths("x --config=/a.yaml --config /b.yaml --config") == ["/a.yaml", "/b.yaml"]
    # A digit that is not ASCII is no count (int() would refuse "²").
    odd, _ = staleness_config(["rollout.max_head_offpolicyness=²", "rollout.consumer_batch_size=٣"])
    assert {k: v["from"] for k, v in odd.items() if k != "actor.backend"} == dict.fromkeys(
        (k for k in odd if k != "actor.backend"), "AReaL's default"
    )
    assert odd["actor.backend"] == {"value": None, "from": "not set"}


def test_fleet_flags_with_the_trainers_version() -> None:
    flags = fleet_flags({"a": 6, "b": 3, "c": 6}, 6, 2, {"a": False, "b": False, "c": True})
    assert [f.kind for f in flags["b"]] == ["version_skew", "version_lag"]
    assert "serves version 3, the trainer is on 6 (3 behind, allowed 2)" in flags["b"][1].evidence
    assert "c" not in flags  # paused, but on the trainer's version: not yet flagged
    moved_on = fleet_flags({"a": 5}, 6, 2, {"a": True})["a"]
    assert [f.kind for f in moved_on] == ["paused_after_update"]
    assert moved_on[0].evidence == "paused at version 5; the trainer is on version 6"
    assert fleet_flags({"a": 5}, None, None, {"a": True}) == {}  # trainer not known


# --- a real agent reading the run's files ------------------------------------------------


def write_job(root: Path, sessions: int = 10) -> Path:
    d = trial(root)
    write_run(d, 6)  # the trainer is on version 6
    write_steps(TranscribedPerfTracer(d, 0), 5)
    (root / "grpo.yaml").write_text(
        "rollout:\n  consumer_batch_size: 4\n  max_concurrent_rollouts: 8\n"
        "  max_head_offpolicyness: 5\n"
    )
    # AReaL's saved config: asdict(cfg) dumped by yaml (cli_args.py:3568-3577).
    saved = {"experiment_name": "exp", "trial_name": "t1",
             "rollout": {"max_concurrent_rollouts": 8, "queue_size": None,
                         "consumer_batch_size": 4, "max_head_offpolicyness": 1}}  # fmt: skip
    (d / "config.yaml").write_text(yaml.dump(saved, default_flow_style=False, sort_keys=False))
    sessions_tracer = TranscribedSessionTracer(d, 0, role="rollout", flush_threshold=4)
    for i in range(sessions):
        sessions_tracer.finish("accepted" if i % 5 else "rejected", task_id=i)
    sessions_tracer.flush()
    return d


def test_capture_counts_sessions_and_reads_the_trainer_and_config(
    node: Any, tmp_path: Path
) -> None:
    write_job(tmp_path, sessions=40)  # 32 accepted, 8 rejected
    procs = [controller(tmp_path)]
    raw = rollout_files(node, procs, USER)
    assert [s["accepted"] for s in raw["sessions"]] == [32]
    assert raw["sessions"][0]["complete"] and raw["sessions"][0]["rejected"] == 8
    assert [c["kind"] for c in raw["configs"]] == ["config", "saved"]
    summary = summarize([{"node": "node1", "rollout": raw}], [procs[0]["cmdline"]], None)
    assert summary.trainer is not None and summary.trainer.version == 6
    assert summary.config["rollout.max_head_offpolicyness"]["from"].endswith("config.yaml")
    cap = summary.capacity
    # (1 + 6 + 1) x 4 = 32 allowed, 32 accepted: the staleness term is zero.
    assert cap is not None and cap.staleness == 0 and cap.zero_terms == ("staleness",)
    assert "session tracer records" in summary.to_json()["counts"]["source"]
    # An override on the command line wins over both files: (3 + 6 + 1) x 4 - 32.
    over = controller(tmp_path, "rollout.max_head_offpolicyness=3")["cmdline"]
    assert summarize([{"node": "n", "rollout": raw}], [over], None).capacity.staleness == 8  # type: ignore[union-attr]


def test_nodes_json_raises_version_lag_on_real_standin_servers(node: Any, tmp_path: Path) -> None:
    write_job(tmp_path)
    lagging = Standin(tmp_path / "a", "--kind", "sglang", "--version", "4")
    paused = Standin(tmp_path / "b", "--kind", "data_proxy", "--paused", "--version", "5")
    poller = ServerPoller(workers=2, interval=0.1)
    try:
        targets = [target(lagging, "sglang"), target(paused, "data_proxy")]
        poller.state(targets)  # schedules the first polls
        poller.wait_first(targets, 10)
        state = poller.state(targets)
    finally:
        poller.close()
        lagging.stop()
        paused.stop()
    procs = [
        controller(tmp_path),
        server_process(lagging.proc.pid, "sglang", lagging.port, state[f"sglang|{targets[0][1]}|{targets[0][2]}"]),
        server_process(paused.proc.pid, "data_proxy", paused.port, state[f"data_proxy|{targets[1][1]}|{targets[1][2]}"]),
    ]  # fmt: skip
    nodes = [{"name": "node1", "state": "up", "processes": procs}]
    # The live Cluster screen's reader: the same files, read on its own thread.
    watch = TrainerWatch(lambda: [node], lambda: copy.deepcopy(nodes), USER, interval=0.05)
    watch.start()
    try:
        deadline = time.monotonic() + 15
        while watch.state() is None:
            assert time.monotonic() < deadline, "the trainer's version was never read"
            time.sleep(0.02)
    finally:
        watch.stop()
    states = watch.state()
    assert states is not None and len(states.states) == 1 and not states.skipped
    (live,) = states.states
    assert (live.version, live.max_head_offpolicyness) == (6, 1)
    assert "Train step 6/6 done." in live.evidence
    assert live.run is not None and live.run.label == "exp/t1"
    rows = [("node1", process_rows(copy.deepcopy(procs)))]
    lines = server_lines(rows, row_runs(rows, USER), states.trainers())
    by_pid = {line.pid: [f.kind for f in line.flags] for line in lines}
    assert by_pid == {
        lagging.proc.pid: ["version_skew", "version_lag"],
        paused.proc.pid: ["paused_after_update"],  # paused on 5, the trainer moved on to 6
    }
    from areal_console.commands.nodes import add_rollout_flags

    doc = add_rollout_flags([node], nodes)
    assert doc["trainer_version"]["version"] == 6
    assert doc["max_head_offpolicyness"]["value"] == 1  # the saved config.yaml
    kinds = {p["pid"]: [f["kind"] for f in p["server"]["flags"]] for p in procs[1:]}
    assert kinds[lagging.proc.pid] == ["version_skew", "version_lag"]  # 4 beside 5 (a tie: 5)
    lag = next(f for f in procs[1]["server"]["flags"] if f["kind"] == "version_lag")
    assert lag["evidence"] == "serves version 4, the trainer is on 6 (2 behind, allowed 1)"
    assert lag["config_key"] == "rollout.max_head_offpolicyness"
    assert kinds[paused.proc.pid] == ["paused_after_update"]
    assert "the trainer is on version 6" in procs[2]["server"]["flags"][0]["evidence"]
    # Without a polled version nothing is read, and the state says nothing.
    assert fleet_trainer_state([node], [], USER).read == {}
    quiet = [{"name": "node1", "state": "up", "processes": procs[:1]}]
    idle = TrainerWatch(lambda: [node], lambda: quiet, USER)
    assert idle.read_now() is None and idle.reads == 0


def test_the_live_reader_asks_the_controllers_node_first_and_few_nodes() -> None:
    root = Path("/data")
    ctl = controller(root)
    rank = lambda r: {**ctl, "pid": 100 + r, "rank": r, "role": "trainer"}  # noqa: E731
    nodes = [
        {"name": "n3", "state": "up", "processes": [rank(9)]},
        {"name": "n2", "state": "up", "processes": [rank(8)]},
        {"name": "n1", "state": "up", "processes": [rank(0)]},
        {"name": "n0", "state": "down", "processes": [{**ctl, "role": "controller"}]},
        {"name": "c", "state": "up", "processes": [{**ctl, "rank": None, "role": "controller"}]},
        {"name": "x", "state": "up", "processes": [{"pid": 1, "cmdline": "python3 other.py"}]},
    ]
    up = [(str(n["name"]), n["processes"]) for n in nodes if n["state"] == "up"]
    runs = fleet_runs(up, USER)
    (log_dir,) = runs.runs
    placed = runs.processes(up, log_dir)
    assert nodes_to_ask(placed, 2) == ["c", "n1"]
    assert nodes_to_ask(placed, 4) == ["c", "n1", "n2", "n3"]
    assert not versioned_servers(nodes)


# --- hostile files in place of tracer files ----------------------------------------------


def test_a_role_with_path_steps_reads_no_tracer_file_elsewhere(node: Any, tmp_path: Path) -> None:
    """A process's `--role ../../other` (its argv) would put its tracer file outside the
    run's directory: the file there is not read."""
    d = trial(tmp_path)
    write_steps(TranscribedPerfTracer(d, 0, role="../../other"), 3)
    assert (d.parent / "other" / "traces-r0.jsonl").is_file()
    procs = [controller(tmp_path)]
    procs[0]["role"] = "../../other"
    assert rollout_files(node, procs, USER)["traces"] == []
    write_steps(TranscribedPerfTracer(d, 0, role="rollout"), 3)
    procs[0]["role"] = "rollout"
    assert [t["role"] for t in rollout_files(node, procs, USER)["traces"]] == ["rollout"]


def test_fifo_and_sparse_tracer_files_are_bounded(node: Any, tmp_path: Path) -> None:
    d = trial(tmp_path)
    (d / "perf_tracer").mkdir()
    (d / "session_tracer").mkdir()
    os.mkfifo(d / "perf_tracer" / "traces-r0.jsonl")
    os.mkfifo(d / "session_tracer" / "sessions-r0.jsonl")
    for name in ("perf_tracer/traces-r1.jsonl", "session_tracer/sessions-r1.jsonl"):
        with open(d / name, "wb") as fh:
            fh.truncate(1 << 30)  # 1 GiB of holes
    procs = [controller(tmp_path), {"pid": 7, "cmdline": "", "rank": 1, "role": None}]
    t0 = time.monotonic()
    raw = rollout_files(node, procs, USER)
    took = time.monotonic() - t0
    assert took < 20, took
    assert [t["rank"] for t in raw["traces"]] == [1] and len(raw["traces"][0]["text"]) <= 1 << 20
    # Only the file's last 32 MiB is counted, and the count says it is not the whole file.
    assert [(s["rank"], s["records"], s["complete"]) for s in raw["sessions"]] == [(1, 0, False)]
    assert node.call("ping", timeout=5)["time"] > 0  # the agent never blocked


@needs_nobody
def test_another_users_tracer_symlinks_are_not_followed(node: Any, tmp_path: Path) -> None:
    with shared_tmp("areal-tracer-") as shared:
        d = trial(shared)
        os.chmod(d, 0o1777)
        for sub in ("perf_tracer", "session_tracer"):
            (d / sub).mkdir()
            os.chmod(d / sub, 0o1777)
        secret = tmp_path / "shadow"
        secret.write_text('{"status": "accepted"}\n' * 3)
        secret.chmod(0o600)
        as_nobody("ln", "-s", str(secret), str(d / "perf_tracer" / "traces-r0.jsonl"))
        as_nobody("ln", "-s", str(secret), str(d / "session_tracer" / "sessions-r0.jsonl"))
        as_nobody("sh", "-c", f'echo \'{{"status": "accepted"}}\' > {d}/config.yaml')
        raw = rollout_files(node, [controller(shared)], USER)
        assert raw["traces"] == [] and raw["sessions"] == []
        assert [c["kind"] for c in raw["configs"]] == [
            "config"
        ]  # the planted config.yaml: not read


@needs_nobody
def test_another_users_config_argument_is_read_as_that_users_file(node: Any) -> None:
    """A process of `nobody` names a root-only `--config` and a run under root's name:
    neither is read as root's (by the capture's reader or the live `nodes` one)."""
    import subprocess

    with shared_tmp() as shared:
        private = shared / "private"
        private.mkdir(mode=0o700)
        secret = private / "secret.yaml"
        secret.write_text("rollout:\n  max_head_offpolicyness: 7\n")
        secret.chmod(0o600)
        write_job(shared)  # root's own run, under logs/<root>/exp/t1
        argv = ["/usr/bin/python3", "-c", "import time; time.sleep(60)", "--config", str(secret),
                f"cluster.fileroot={shared}", "experiment_name=exp", "trial_name=t1"]  # fmt: skip
        proc = subprocess.Popen([*NOBODY, *argv])
        try:
            deadline = time.monotonic() + 10
            mine: list[dict[str, Any]] = []
            while not mine and time.monotonic() < deadline:
                sample = node.call("sample", {"all": True})
                mine = [p for p in sample["processes"] if p["pid"] == proc.pid
                        and "--config" in str(p.get("cmdline"))]  # fmt: skip
            assert mine and mine[0]["user"] == "nobody"
            raw = rollout_files(node, mine, USER)
            (named,) = [c for c in raw["configs"] if c["kind"] == "config"]
            assert "text" not in named and "not by the job's user nobody" in named["error"]
            # A polled server the process started, so that its run is read.
            server = {"pid": proc.pid + 1, "ppid": proc.pid, "cmdline": "python3 -m sglang.launch_server",
                      "server": {"polled": True, "weight_version": 1}}  # fmt: skip
            nodes = [{"name": "node1", "state": "up", "processes": [*mine, server]}]
            found = fleet_trainer_state([node], nodes, USER)
            (run,) = found.runs.runs.values()
            assert run.owner == "nobody" and found.runs.of[f"node1:{proc.pid + 1}"] == run.log_dir
            state = found.read[run.log_dir]
            assert state.config["rollout.max_head_offpolicyness"]["from"] != str(secret)
            assert state.trainer is None  # root's run is not read for nobody's process
        finally:
            proc.kill()
            proc.wait()


def test_session_counts_stream_across_chunks(
    node: Any, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    import areal_console.core.rollout.context as context

    d = write_job(tmp_path, sessions=200)  # 160 accepted, 40 rejected
    path = d / "session_tracer" / "rollout" / "sessions-r0.jsonl"
    monkeypatch.setattr(context, "SESSION_CHUNK", 1000)  # records cross chunk boundaries
    whole = context._count_sessions(node, str(path), USER)
    assert whole is not None and (whole["accepted"], whole["rejected"], whole["complete"]) == (
        160,
        40,
        True,
    )
    monkeypatch.setattr(context, "SESSION_MAX", 20_000)  # the end of the file only
    part = context._count_sessions(node, str(path), USER)
    tail = path.read_bytes()[-20_000:].split(b"\n")[1:]
    expected = sum(b'"status": "accepted"' in line for line in tail)
    assert part is not None and part["accepted"] == expected and not part["complete"]
    assert part["records"] == sum(1 for line in tail if line.strip())


@given(st.text(max_size=400), st.lists(st.text(max_size=200), max_size=20))
def test_config_and_version_readers_take_any_text(text: str, lines: list[str]) -> None:
    t0 = time.perf_counter()
    config, notes = staleness_config(lines, [("x.yaml", text)])
    assert set(config) == {
        "rollout.max_head_offpolicyness",
        "rollout.consumer_batch_size",
        "rollout.max_concurrent_rollouts",
        "actor.backend",
    }
    backend = config["actor.backend"]["value"]
    assert backend is None or (isinstance(backend, str) and len(backend) <= 200)
    assert all(isinstance(n, str) for n in notes)
    found = trainer_version([lines, text.split("\n")], [lines])
    assert found is None or found.version >= 0
    assert time.perf_counter() - t0 < 5  # a wide bound (10x); speed is bench/'s


def test_a_config_file_one_node_read_is_used_and_the_others_failure_is_not_noted() -> None:
    from areal_console.core.rollout.context import job_config

    missing = {"path": "/cfg/grpo.yaml", "kind": "config", "error": "no such file on this node"}
    found = {"path": "/cfg/grpo.yaml", "kind": "config",
             "text": "rollout:\n  max_head_offpolicyness: 3\n"}  # fmt: skip
    nodes = [{"rollout": {"configs": [missing]}}, {"rollout": {"configs": [found]}}]
    config, notes = job_config(nodes, [])
    assert config["rollout.max_head_offpolicyness"] == {"value": 3, "from": "/cfg/grpo.yaml"}
    assert notes == []
    _, notes = job_config(nodes[:1], [])
    assert notes == ["config /cfg/grpo.yaml not read: no such file on this node"]
