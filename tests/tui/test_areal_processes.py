"""AReaL as it runs: single-controller workers, their wrappers and controller, inference
servers and their health, ranks from Slurm/MPI launchers, and the stacks of all of them.

The processes are real: `tests/jobs/areal_controller.py` starts workers exactly as AReaL's
LocalScheduler does (a `/bin/bash -c "... stdbuf -oL python -m areal.infra.rpc.rpc_server
... 2>&1 | tee -a LOG >(stdbuf -oL sed ...)"` per worker; areal/infra/scheduler/local.py:
777-831, areal/infra/utils/proc.py:26-173 at AReaL cbff54d6), the stand-in modules under
`tests/jobs/areal_stub/` run a real gloo job in a thread named `EngineWorker`
(areal/infra/rpc/guard/engine_blueprint.py:166), and py-spy reads them for real.
"""

from __future__ import annotations

import json
import os
import secrets
import shutil
import signal
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from areal_console.app import ConsoleApp
from areal_console.core.connection.client import AgentClient
from areal_console.core.connection.fleet import Fleet
from areal_console.core.connection.transport import LocalChannel
from areal_console.core.targets.resolve import local_node
from areal_console.widgets.process_table import ProcessTable
from conftest import JOBS, run_cli, wait_for

from tests.cluster.test_cluster_screen import until

STUB = JOBS / "areal_stub"


class ArealRun:
    """A controller and its workers; `mode` is `collective` or `rollout`."""

    def __init__(
        self,
        workdir: Path,
        mode: str,
        n_actors: int,
        health: str = "healthy",
        stub: Path = STUB,
        env: dict[str, str] | None = None,
        script_args: tuple[str, ...] = (),
    ) -> None:
        self.workdir = workdir
        workdir.mkdir(parents=True, exist_ok=True)
        self.log = open(workdir / "controller.log", "wb")  # noqa: SIM115
        self.trial = f"{workdir.name}-{os.getpid()}-{secrets.token_hex(3)}"
        env = {
            **os.environ,
            **(env or {}),
            "PYTHONPATH": str(stub),
            "OMP_NUM_THREADS": "1",
            "AREAL_STUB_TRIAL": self.trial,
            "STUB_TESTS_ROOT": str(JOBS.parent.parent),
        }
        # AReaL's config overrides on the controller's command line, as a launch has them.
        overrides = (
            ["rollout.consumer_batch_size=4", "rollout.max_concurrent_rollouts=4",
             "rollout.max_head_offpolicyness=0"]
            if mode == "rollout" else []
        )  # fmt: skip
        self.proc = subprocess.Popen(
            [sys.executable, str(JOBS / "areal_controller.py"), str(workdir), mode,
             str(n_actors), health, *script_args, *overrides],
            stdout=self.log, stderr=subprocess.STDOUT, start_new_session=True, env=env,
        )  # fmt: skip
        ready = (
            (lambda: len(list(workdir.glob("rank*.ready"))) == n_actors)
            if mode == "collective"
            else (lambda: (workdir / "controller.ready").exists())
        )
        try:
            wait_for(lambda: ready() or self.proc.poll() is not None, 120, what="the AReaL run")
        except TimeoutError:
            self.stop()
            raise
        if self.proc.poll() is not None:
            raise RuntimeError((workdir / "controller.log").read_text()[-3000:])

    @property
    def job(self) -> str:
        return f"gsm8k-grpo/{self.trial}"

    def stop(self) -> None:
        for sig in (signal.SIGTERM, signal.SIGKILL):
            try:
                os.killpg(self.proc.pid, sig)
            except ProcessLookupError:
                break
            try:
                self.proc.wait(5)
                break
            except subprocess.TimeoutExpired:
                continue
        self.log.close()


@pytest.fixture(scope="module")
def collective_run(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ArealRun]:
    # AReaL as pip installs it: in site-packages, where its frames are still the user's code.
    site = tmp_path_factory.mktemp("venv") / "lib" / "python3.11" / "site-packages"
    shutil.copytree(STUB / "areal", site / "areal")
    run = ArealRun(tmp_path_factory.mktemp("areal-sc"), "collective", 2, stub=site)
    try:
        yield run
    finally:
        run.stop()


@pytest.fixture(scope="module")
def rollout_run(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ArealRun]:
    run = ArealRun(tmp_path_factory.mktemp("areal-rollout"), "rollout", 2, health="unhealthy")
    try:
        yield run
    finally:
        run.stop()


@pytest.fixture(scope="module")
def weight_update_run(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ArealRun]:
    run = ArealRun(tmp_path_factory.mktemp("areal-update"), "weight_update", 2)
    try:
        yield run
    finally:
        run.stop()


@pytest.fixture(scope="module")
def second_update_run(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ArealRun]:
    """A second run alive beside `weight_update_run`: its trainer on version 2 (rank 0
    finished 2 steps), its paused proxy on version 2: within its own run nothing lags."""
    env = {"STUB_STEPS": "2", "STUB_SERVER_VERSION": "2"}
    run = ArealRun(tmp_path_factory.mktemp("areal-update-b"), "weight_update", 2, env=env)
    try:
        yield run
    finally:
        run.stop()


def job_processes(run: ArealRun) -> list[dict[str, Any]]:
    out = run_cli("nodes", "--local", "--json")
    assert out.returncode == 0, out.stderr
    procs = json.loads(out.stdout)["nodes"][0]["processes"]
    return [p for p in procs if p.get("job") == run.job]


def environ_names(pid: int) -> set[str]:
    raw = Path(f"/proc/{pid}/environ").read_bytes()
    return {entry.split(b"=", 1)[0].decode() for entry in raw.split(b"\0") if entry}


def test_nodes_lists_single_controller_workers_with_role_rank_and_job(
    collective_run: ArealRun,
) -> None:
    procs = job_processes(collective_run)
    workers = sorted((p for p in procs if p["role"] == "actor"), key=lambda p: p["rank"])
    assert [p["rank"] for p in workers] == [0, 1]
    for p in workers:
        # rank = --worker-index, world size = the actors of this experiment/trial, and
        # LOCAL_RANK is 0 as AReaL's TrainController sets it (train_controller.py:342).
        assert p["worker_index"] == p["rank"] and p["world_size"] == 2 and p["local_rank"] == 0
        assert "-m areal.infra.rpc.rpc_server" in p["cmdline"] and "--role actor" in p["cmdline"]
        # RANK reached the worker over POST /set_env: it is not in its /proc environment.
        assert not {"RANK", "WORLD_SIZE", "MASTER_ADDR"} & environ_names(p["pid"])
    controller = [p for p in procs if p["role"] == "controller"]
    assert [p["pid"] for p in controller] == [collective_run.proc.pid]
    assert controller[0]["rank"] is None
    wrappers = [p for p in procs if p["role"] == "wrapper"]
    kinds = sorted(p["cmdline"].split()[0].rsplit("/", 1)[-1] for p in wrappers)
    assert kinds == ["bash", "bash", "sed", "sed", "tee", "tee"]
    assert all(p["rank"] is None for p in wrappers)
    bash = [p for p in wrappers if p["cmdline"].startswith("/bin/bash -c")]
    assert {p["ppid"] for p in bash} == {collective_run.proc.pid}
    assert {p["ppid"] for p in workers} == {p["pid"] for p in bash}
    # Nothing else of this job claims a rank (the wrappers used to be listed as workers).
    assert sorted(p["rank"] for p in procs if p["rank"] is not None) == [0, 1]


def test_stacks_diagnose_the_collective_hang_in_the_engineworker_thread(
    collective_run: ArealRun,
) -> None:
    out = run_cli("stacks", "--local", "--json", "--match", str(collective_run.workdir))
    assert out.returncode == 0, out.stderr
    doc = json.loads(out.stdout)
    ranks = {r["rank"]: r for r in doc["ranks"] if r["rank"] is not None}
    assert sorted(ranks) == [0, 1]
    # The hang is in EngineWorker; MainThread serves HTTP and is not where the work is.
    for r in ranks.values():
        names = {t["name"] for t in r["threads"]}
        assert {"MainThread", "EngineWorker"} <= names
    engine0 = next(t for t in ranks[0]["threads"] if t["name"] == "EngineWorker")
    group0 = next(g for g in doc["groups"] if g["ranks"] == [0])
    assert group0["frames"] == engine0["frames"]
    assert engine0["frames"][0]["function"] == "barrier"
    diagnosis = doc["diagnosis"]
    assert diagnosis["pattern"] == "same_collective", diagnosis
    assert diagnosis["title"] == "Ranks wait in one collective for a straggler"
    # AReaL's own frames are the call site (user code), not library code, though installed
    # in site-packages beside torch: the evidence names train_batch, not torch's wrapper.
    evidence0 = next(e for e in diagnosis["evidence"] if e.startswith("rank 0 (1): "))
    assert evidence0.startswith("rank 0 (1): train_batch (") and "-> barrier (" in evidence0
    assert "/site-packages/areal/infra/rpc/rpc_server.py:" in evidence0
    assert any(e.startswith("rank 1 (1): slow_step (") for e in diagnosis["evidence"])
    others = {r["role"] for r in doc["ranks"] if r["rank"] is None}
    assert others == {"controller"}  # wrappers are not dumped (they would repeat the ranks)


def test_rollout_stall_names_the_unhealthy_server(rollout_run: ArealRun) -> None:
    server = json.loads((rollout_run.workdir / "server.json").read_text())
    procs = job_processes(rollout_run)
    sglang = [p for p in procs if p["role"] == "sglang"]
    assert [p["pid"] for p in sglang] == [server["pid"]]
    record = sglang[0]["server"]
    assert record["url"] == f"http://127.0.0.1:{server['port']}/health"
    assert record["health"]["ok"] is False and record["health"]["status"] == 503
    assert {p["role"] for p in procs} >= {"controller", "actor", "rollout", "wrapper"}

    out = run_cli("stacks", "--local", "--json", "--match", str(rollout_run.workdir))
    assert out.returncode == 0, out.stderr
    doc = json.loads(out.stdout)
    diagnosis = doc["diagnosis"]
    # A single-controller job (its rpc_server workers): the global values, not divided.
    config = doc["rollout"]["config"]
    assert config["mode"]["value"] == "single-controller", config
    assert config["dp_size"]["value"] == 1
    assert diagnosis["pattern"] == "rollout_stall", diagnosis
    detail = diagnosis["detail"]
    assert f"The controller (pid {rollout_run.proc.pid} " in detail
    assert "waits for rollout results in wait_results (" in detail
    assert "called from prepare_batch (" in detail and "ranks 0-1 sit idle" in detail
    evidence = "\n".join(diagnosis["evidence"])
    assert "prepare_batch" in evidence and "_get_next_task_for_submission" in evidence
    assert f"sglang server 127.0.0.1:{server['port']}" in evidence
    assert "unhealthy: HTTP 503" in evidence
    suggestions = diagnosis["suggestions"]
    assert f"sglang 127.0.0.1:{server['port']}" in suggestions[0]
    keys = "\n".join(suggestions)
    # Both keys exist in AReaL's InferenceEngineConfig (areal/api/cli_args.py:2487, 2502),
    # the `rollout:` section of the experiment config (cli_args.py:3409).
    assert (
        "`rollout.max_head_offpolicyness`" in keys and "`rollout.max_concurrent_rollouts`" in keys
    )
    # The controller logged its accepted rollouts (rollout tracing): AReaL's capacity,
    # recomputed with the command line's overrides, has its staleness term at zero.
    assert "the staleness term is at or below zero" in detail
    assert (
        "AReaL's rollout capacity recomputed: concurrency = 4 - 0 running = 4; staleness = "
        "(0 + version 0 + 1) x 4 - (4 accepted + 0 running) = 0; capacity 0" in evidence
    )
    assert "consumer_batch_size 4 (command line)" in evidence
    assert suggestions[1].startswith("The staleness term is spent")
    assert any(s.startswith("No perf tracer files") for s in suggestions)


def test_weight_update_stuck_with_each_ranks_phase(weight_update_run: ArealRun) -> None:
    # The agent asked the data proxy at the port its process listens on: paused, version 3.
    proxy = json.loads((weight_update_run.workdir / "server.json").read_text())
    (record,) = [p for p in job_processes(weight_update_run) if p["pid"] == proxy["pid"]]
    server = record["server"]
    assert server["kind"] == "data_proxy" and server["health"]["ok"] is True
    assert server["polled"] is True and server["paused"] is True and server["weight_version"] == 3
    out = run_cli("stacks", "--local", "--json", "--match", str(weight_update_run.workdir))
    assert out.returncode == 0, out.stderr
    doc = json.loads(out.stdout)
    diagnosis = doc["diagnosis"]
    assert diagnosis["pattern"] == "weight_update_stuck", diagnosis
    assert (
        diagnosis["title"]
        == "Weight update stuck: ranks 0-1 in the weight-update path, servers paused"
    )
    assert "1 of 1 server(s) paused" in diagnosis["detail"]
    evidence = "\n".join(diagnosis["evidence"])
    assert "rank 0: update_weights (" in evidence and "-> broadcast (" in evidence
    assert "rank 1: update_weights (" in evidence
    assert "_update_bucket_weights_from_distributed (" in evidence
    assert f"data_proxy server 127.0.0.1:{proxy['port']} (pid {proxy['pid']} " in evidence
    assert "paused, version 3, healthy" in evidence
    # The perf tracer files (as AReaL writes them, under perf_tracer/actor/): rank 1
    # finished one step fewer than rank 0, so it is the straggler.
    phases = {r["rank"]: r["phase"] for r in doc["ranks"] if r["rank"] is not None}
    assert phases[0]["span"] == "train.rollout" and phases[0]["step"] == 4
    assert phases[0]["after"] == "train.update_weights" and phases[0]["role"] == "actor"
    assert phases[1]["step"] == 3 and phases[1]["straggler"] is True
    assert phases[0]["straggler"] is False
    assert 0 <= phases[0]["age_s"] < 600
    # The trainer's version from rank 0's perf tracer file (train.update_weights of step 3
    # finished: version 4) and the run's saved config.yaml (max_head_offpolicyness 0):
    # the paused server on version 3 lags, and stays paused while the trainer moved on.
    rollout = doc["rollout"]
    assert rollout["trainer_version"]["version"] == 4
    assert "train.update_weights` of step 3 finished" in rollout["trainer_version"]["evidence"]
    head = rollout["config"]["rollout.max_head_offpolicyness"]
    assert head["value"] == 0 and head["from"].endswith("/config.yaml")
    (proxy_rank,) = [r for r in doc["ranks"] if r["pid"] == proxy["pid"]]
    flags = {f["kind"]: f for f in proxy_rank["server"]["flags"]}
    assert flags["version_lag"]["evidence"] == (
        "serves version 3, the trainer is on 4 (1 behind, allowed 0)"
    )
    assert flags["version_lag"]["config_key"] == "rollout.max_head_offpolicyness"
    assert flags["paused_after_update"]["evidence"].endswith("the trainer is on version 4")


async def test_cluster_servers_pane_flags_with_the_trainers_version(
    weight_update_run: ArealRun,
) -> None:
    """The live Cluster screen reads the trainer's version from the job's files on its
    own thread: the paused data proxy on version 3 lags the trainer's 4 (allowed 0)."""
    from areal_console.widgets.servers_pane import ServersPane
    from textual.widgets import Label

    proxy = json.loads((weight_update_run.workdir / "server.json").read_text())
    key = f"{local_node().name}:{proxy['pid']}"
    app = ConsoleApp(Fleet([local_node()]), refresh_interval=0.2)
    async with app.run_test(size=(200, 50)):
        pane = app.screen.query_one(ServersPane)

        def flags() -> str:
            return str(pane.get_cell(key, "flags")) if key in {k.value for k in pane.rows} else ""

        await until(lambda: "version_lag" in flags(), timeout=30, what="version_lag on the proxy")
        assert "paused_after_update" in flags()
        title = str(app.screen.query_one("#servers-title", Label).render())
        assert "trainer on version 4 (max_head_offpolicyness 0)" in title
        states = app.monitor.trainer_state()
        assert states is not None
        (state,) = [s for s in states.states if s.run and s.run.label == weight_update_run.job]
        assert "train.update_weights` of step 3 finished" in state.evidence


def proxy_flags(doc: dict[str, Any], run: ArealRun) -> dict[str, str]:
    pid = json.loads((run.workdir / "server.json").read_text())["pid"]
    (proc,) = [p for p in doc["nodes"][0]["processes"] if p["pid"] == pid]
    assert proc["server"]["polled"] is True
    return {f["kind"]: f["evidence"] for f in proc["server"]["flags"]}


async def test_two_runs_alive_each_server_is_held_to_its_own_runs_trainer(
    weight_update_run: ArealRun, second_update_run: ArealRun
) -> None:
    """Two runs' processes at once (and the module's other runs): each paused proxy is
    compared with its own run's trainer only (run A's on 4, run B's on 2), and never with
    the other run's proxy. The proxies carry no run of their own: each is the child of
    its run's `rpc_server` rollout worker, whose `--fileroot/--experiment-name/
    --trial-name` name the run."""
    from areal_console.widgets.servers_pane import ServersPane
    from textual.widgets import Label

    out = run_cli("nodes", "--local", "--json")
    assert out.returncode == 0, out.stderr
    doc = json.loads(out.stdout)
    runs = {r["run"]: r for r in doc["rollout"]["runs"]}
    assert runs[weight_update_run.job]["trainer_version"]["version"] == 4
    assert runs[second_update_run.job]["trainer_version"]["version"] == 2
    assert runs[weight_update_run.job]["log_dir"].startswith(str(weight_update_run.workdir))
    assert runs[second_update_run.job]["max_head_offpolicyness"]["value"] == 0
    a, b = proxy_flags(doc, weight_update_run), proxy_flags(doc, second_update_run)
    assert a["version_lag"] == "serves version 3, the trainer is on 4 (1 behind, allowed 0)"
    assert a["paused_after_update"].endswith("the trainer is on version 4")
    # Run B's proxy on 2 is level with its trainer; 3 beside 2 is no skew across runs.
    assert not {"version_lag", "version_skew", "paused_after_update"} & set(b), b
    assert "version_skew" not in a
    pid_b = json.loads((second_update_run.workdir / "server.json").read_text())["pid"]
    node = doc["nodes"][0]["name"]
    assert f"{node}:{pid_b}" in runs[second_update_run.job]["servers"]
    # The live Cluster screen reads both runs' trainers and flags the same way.
    key_a = f"{local_node().name}:{json.loads((weight_update_run.workdir / 'server.json').read_text())['pid']}"
    key_b = f"{local_node().name}:{pid_b}"
    app = ConsoleApp(Fleet([local_node()]), refresh_interval=0.2)
    async with app.run_test(size=(200, 50)):
        pane = app.screen.query_one(ServersPane)

        def flags(key: str) -> str:
            return str(pane.get_cell(key, "flags")) if key in {k.value for k in pane.rows} else ""

        await until(lambda: "version_lag" in flags(key_a), timeout=30, what="version_lag on A")
        await until(lambda: key_b in {k.value for k in pane.rows}, what="B's proxy")
        assert "version_lag" not in flags(key_b) and "version_skew" not in flags(key_b)
        title = str(app.screen.query_one("#servers-title", Label).render())
        assert f"{weight_update_run.job} on 4 (max_head_offpolicyness 0)" in title, title
        assert f"{second_update_run.job} on 2 (max_head_offpolicyness 0)" in title, title


async def test_cluster_screen_shows_workers_controller_and_wrappers(
    collective_run: ArealRun,
) -> None:
    from areal_console.screens.stacks import StacksScreen

    node = local_node().name
    procs = {p["pid"]: p for p in job_processes(collective_run)}
    app = ConsoleApp(Fleet([local_node()]), refresh_interval=0.2)
    async with app.run_test(size=(160, 40)) as pilot:
        table = app.screen.query_one(ProcessTable)
        keys = {f"{node}:{pid}" for pid in procs}
        await until(lambda: keys <= {k.value for k in table.rows}, what="the job's rows")
        for pid, p in procs.items():
            key = f"{node}:{pid}"
            assert str(table.get_cell(key, "role")) == p["role"]
            expected = f"{p['rank']}/2" if p["role"] == "actor" else "-"
            assert str(table.get_cell(key, "rank")) == expected
        # `/` filters by the job (experiment/trial); `s` captures it and reads EngineWorker.
        await pilot.press("slash", *collective_run.trial, "enter")
        await pilot.press("s")
        await until(lambda: isinstance(app.screen, StacksScreen), what="the Stacks screen")
        stacks = app.screen
        assert isinstance(stacks, StacksScreen)
        await until(lambda: stacks.diagnosis is not None, timeout=60, what="a diagnosis")
        assert stacks.diagnosis is not None and stacks.diagnosis.pattern == "same_collective"


def test_server_health_healthy_unhealthy_hung_and_dead(tmp_path: Path) -> None:
    from tests.support.cluster import free_port

    env = {**os.environ, "PYTHONPATH": str(STUB)}
    servers: dict[str, tuple[subprocess.Popen[bytes], int]] = {}
    try:
        for mode in ("healthy", "unhealthy", "hang", "dead"):
            port = free_port()
            proc = subprocess.Popen(
                [sys.executable, "-m", "areal.v2.inference_service.sglang.launch_server",
                 "--model-path", "stub-model", "--host", "127.0.0.1", "--port", str(port)],
                env={**env, "STUB_HEALTH": mode}, start_new_session=True,
            )  # fmt: skip
            servers[mode] = (proc, port)
        client = AgentClient(LocalChannel())
        client.start()
        try:

            def listening() -> bool:
                sample = client.request("sample")
                by_pid = {p["pid"]: p for p in sample["processes"]}
                return all(
                    by_pid.get(proc.pid, {}).get("server", {}).get("health", {}).get("ok")
                    for mode, (proc, _) in servers.items()
                    if mode == "healthy"
                )

            wait_for(listening, 30, what="the healthy server to listen")
            sample = client.request("sample")
        finally:
            client.close()
        by_pid = {p["pid"]: p for p in sample["processes"]}
        seen = {mode: by_pid[proc.pid] for mode, (proc, _) in servers.items()}
        for mode, p in seen.items():
            assert p["role"] == "sglang"
            assert p["server"]["url"] == f"http://127.0.0.1:{servers[mode][1]}/health"
        healthy = seen["healthy"]["server"]["health"]
        assert healthy["ok"] is True and healthy["status"] == 200 and healthy["latency_ms"] < 1000
        bad = seen["unhealthy"]["server"]["health"]
        assert bad["ok"] is False and bad["status"] == 503 and bad["error"].startswith("HTTP 503")
        hung = seen["hang"]["server"]["health"]
        assert hung["ok"] is False and hung["error"] == "no answer within 1s"
        dead = seen["dead"]["server"]["health"]
        # It listens on no port: not asked at all (only a port the process listens on is).
        assert dead["ok"] is False
        assert dead["error"].startswith(f"the process does not listen on port {servers['dead'][1]}")
    finally:
        for proc, _ in servers.values():
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()


def test_ranks_from_slurm_open_mpi_and_pmi_environments() -> None:
    sleeper = [sys.executable, "-c", "import time; time.sleep(600)"]
    base = {k: v for k, v in os.environ.items() if not k.startswith(("SLURM_", "OMPI_", "PMI_"))}
    for key in ("RANK", "LOCAL_RANK", "WORLD_SIZE"):
        base.pop(key, None)
    cases = {
        "slurm": ({"SLURM_PROCID": "5", "SLURM_LOCALID": "1", "SLURM_NTASKS": "8"}, (5, 1, 8)),
        "ompi": (
            {
                "OMPI_COMM_WORLD_RANK": "3",
                "OMPI_COMM_WORLD_LOCAL_RANK": "3",
                "OMPI_COMM_WORLD_SIZE": "4",
            },
            (3, 3, 4),
        ),
        "pmi": ({"PMI_RANK": "2", "PMI_SIZE": "6"}, (2, None, 6)),
    }
    procs = {
        name: subprocess.Popen(sleeper, env={**base, **env}) for name, (env, _) in cases.items()
    }
    # A shell inside an srun step carries SLURM_PROCID too: it is no rank.
    shell = subprocess.Popen(["/bin/sh", "-c", "sleep 600"], env={**base, "SLURM_PROCID": "0"})
    client = AgentClient(LocalChannel())
    client.start()
    try:
        wanted = {p.pid for p in procs.values()}
        sample = wait_for(
            lambda: (
                (s := client.request("sample"))
                and wanted <= {p["pid"] for p in s["processes"]}
                and s
            ),
            30,
            what="the three ranks",
        )
        by_pid = {p["pid"]: p for p in sample["processes"]}
        for name, (_, expected) in cases.items():
            p = by_pid[procs[name].pid]
            assert (p["rank"], p["local_rank"], p["world_size"]) == expected, name
        assert by_pid.get(shell.pid, {}).get("rank") is None
    finally:
        client.close()
        for proc in [*procs.values(), shell]:
            proc.kill()
            proc.wait()


def test_the_guides_pyspy_loop_on_the_live_run_imports_to_the_same_diagnosis(
    collective_run: ArealRun, tmp_path: Path
) -> None:
    # AReaL's debugging guide, Step 2 (docs/en/best_practices/debugging.md:277-281), kept
    # to this run's processes.
    loop = (
        "for pid in $(ps aux | grep 'python.*areal' | grep -v grep | grep -F \"$1\" "
        "| awk '{print $2}'); do\n"
        '    echo "========== PID $pid =========="\n'
        "    py-spy dump --pid $pid\n"
        "done"
    )
    # Output as a terminal shows it (py-spy's errors too); a COLUMNS inherited from the test
    # runner would cut `ps aux` lines. The loop's `py-spy` is the one the agent runs (beside
    # this interpreter, e.g. an unactivated venv's), not whatever is first on PATH.
    from areal_node.agent.pyspy import find_pyspy

    pyspy = find_pyspy()
    assert pyspy is not None, "py-spy is a dependency of the console: pip install py-spy"
    env = {k: v for k, v in os.environ.items() if k not in ("COLUMNS", "LINES")}
    env["PATH"] = os.pathsep.join([os.path.dirname(pyspy), env.get("PATH", "")])
    text = subprocess.run(
        ["/bin/bash", "-c", loop, "loop", str(collective_run.workdir)],
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        timeout=120,
        check=False,
        env=env,
    ).stdout
    (tmp_path / "pyspy.txt").write_text(text)
    assert text.count("========== PID ") >= 5  # controller, two workers, two bash wrappers
    out = run_cli("stacks", "--import", str(tmp_path / "pyspy.txt"), "--json")
    assert out.returncode == 0, out.stderr
    doc = json.loads(out.stdout)
    assert sorted(r["rank"] for r in doc["ranks"] if r["rank"] is not None) == [0, 1]
    assert doc["diagnosis"]["pattern"] == "same_collective"
    assert doc["diagnosis"]["title"] == "Ranks wait in one collective for a straggler"
    assert {r["role"] for r in doc["ranks"] if r["rank"] is None} == {"controller", "wrapper"}


def test_world_size_counts_a_roles_workers_over_every_node() -> None:
    from areal_console.core.connection.records import process_rows, with_areal_world_sizes
    from areal_console.core.targets.areal_world import count_areal_world_sizes

    def worker(role: str, index: int, job: str = "exp/t1") -> dict[str, Any]:
        rank = index if role == "actor" else None
        return {"role": role, "worker_index": index, "rank": rank, "job": job, "world_size": 1}

    node1 = [worker("actor", 0), worker("actor", 1), worker("rollout", 0)]
    node2 = [worker("actor", 2), worker("actor", 3), worker("actor", 0, job="exp/t2")]
    # The typed rows the Cluster screen shows are counted the same way.
    rows = [process_rows([dict(p, pid=i) for i, p in enumerate(n)]) for n in (node1, node2)]
    counted = with_areal_world_sizes(rows)
    count_areal_world_sizes([node1, node2])
    assert [p["world_size"] for p in node1 + node2] == [4, 4, 1, 4, 4, 1]
    assert [p.world_size for n in counted for p in n] == [4, 4, 1, 4, 4, 1]


async def test_cluster_screen_shows_the_servers_address_and_health(rollout_run: ArealRun) -> None:
    server = json.loads((rollout_run.workdir / "server.json").read_text())
    key = f"{local_node().name}:{server['pid']}"
    app = ConsoleApp(Fleet([local_node()]), refresh_interval=0.2)
    async with app.run_test(size=(160, 40)):
        table = app.screen.query_one(ProcessTable)
        await until(lambda: key in {k.value for k in table.rows}, what="the server's row")
        await until(lambda: "health ?" not in str(table.get_cell(key, "cmd")), what="health")
        role = table.get_cell(key, "role")
        assert str(role) == "sglang" and "red" in str(getattr(role, "style", ""))
        assert str(table.get_cell(key, "cmd")).startswith(
            f"[127.0.0.1:{server['port']} down: HTTP 503"
        )
