"""Slurm-native fan-out on a real Slurm cluster (3 slurmd nodes in their own namespaces).

A real gloo job is submitted with sbatch (2 ranks per node, RANK etc. from Slurm's task
ids); the console finds its nodes and ranks through Slurm and reaches them with
`srun --overlap`. Faults: an unknown job, a finished job, a pending job, srun refused (a
job of another user) or missing, and a node of the job going down.
"""

from __future__ import annotations

import dataclasses
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path
from typing import TYPE_CHECKING

import pytest
from areal_console.core.connection.fleet import Fleet, NodeFailure
from areal_console.core.slurm.client import LocalRunner, SlurmClient, job_lister
from areal_console.core.slurm.targets import resolve_slurm_targets
from areal_node import launcher
from conftest import ROOT, wait_for

from tests.support.interpreters import find_python
from tests.support.nobody import as_nobody, needs_nobody, plant_modules, planted_ran
from tests.support.slurm_cluster import SlurmCluster

if TYPE_CHECKING:
    from conftest_slurm import GlooJobs, SlurmGlooJob

pytest_plugins = ["conftest_slurm"]

pytestmark = pytest.mark.timeout(240)


def console(
    cluster: SlurmCluster, *args: str, timeout: float = 90, env: dict[str, str] | None = None
) -> subprocess.CompletedProcess[str]:
    extra = env or {}
    env = cluster.env(**extra)
    env["PYTHONPATH"] = os.pathsep.join([str(ROOT / "tui"), str(ROOT / "agents")])
    return subprocess.run(
        [sys.executable, "-m", "areal_console", *args],
        capture_output=True,
        text=True,
        timeout=timeout,
        env=env,
        check=False,
    )


def agent_steps(cluster: SlurmCluster, job_id: str) -> list[str]:
    out = cluster.run(["squeue", "-h", "-s", "-j", job_id, "-o", "%i %j"], check=False).stdout
    return [line.split()[0] for line in out.splitlines() if "areal-console-agent" in line]


def ranks_by_node(report: dict) -> dict[str, list[int]]:
    return {
        n["name"]: sorted(p["rank"] for p in n["processes"] if p["rank"] is not None)
        for n in report["nodes"]
    }


@pytest.mark.slow
@pytest.mark.parametrize("mode", ["step", "node"])
def test_nodes_reports_the_jobs_nodes_and_ranks(
    slurm_cluster: SlurmCluster, slurm_gloo_job: SlurmGlooJob, mode: str
) -> None:
    result = console(
        slurm_cluster, "nodes", "--slurm-job", slurm_gloo_job.job_id, "--slurm-mode", mode, "--json"
    )
    assert result.returncode == 0, result.stderr
    report = json.loads(result.stdout)
    assert [n["state"] for n in report["nodes"]] == ["up", "up", "up"]
    # Block distribution: ranks 0-1 on node1, 2-3 on node2, 4-5 on node3, each node seeing
    # only its own ranks (its own PID namespace), as on a real cluster.
    assert ranks_by_node(report) == {"node1": [0, 1], "node2": [2, 3], "node3": [4, 5]}
    for node in report["nodes"]:
        assert node["host"] == f"slurm:{slurm_gloo_job.job_id}:{node['name']}"
        for p in node["processes"]:
            assert p["world_size"] == 6 and p["local_rank"] == p["rank"] % 2
            assert "gloo_ranks.py" in p["cmdline"]
    # The agents' steps end with the console: nothing is left running in the job.
    wait_for(
        lambda: not agent_steps(slurm_cluster, slurm_gloo_job.job_id), 30, what="agent steps to end"
    )


def test_slurm_client_reads_the_job(
    slurm_cluster: SlurmCluster, slurm_gloo_job: SlurmGlooJob
) -> None:
    job = SlurmClient(LocalRunner(slurm_cluster.env())).job(slurm_gloo_job.job_id)
    assert job.state == "RUNNING" and job.user == "root"
    assert job.nodes == ["node1", "node2", "node3"]
    assert job.num_tasks == 6
    assert job.gpus == {"node1": [0], "node2": [0], "node3": [0]}
    assert job.tres_per_node == "gres:gpu:1"
    steps = {s.step_id: s for s in job.steps}
    ranks_step = steps[f"{slurm_gloo_job.job_id}.0"]
    assert ranks_step.tasks == 6 and ranks_step.nodes == ["node1", "node2", "node3"]
    assert steps[f"{slurm_gloo_job.job_id}.batch"].nodes == ["node1"]
    assert set(job.node_states) == {"node1", "node2", "node3"}
    assert not job.unreachable_nodes()


@pytest.mark.slow
def test_stacks_of_every_rank_through_one_srun_step(
    slurm_cluster: SlurmCluster,
    slurm_gloo_job: SlurmGlooJob,
    monkeypatch: pytest.MonkeyPatch,
    tmp_path: Path,
) -> None:
    monkeypatch.setenv("SLURM_CONF", str(slurm_cluster.conf))
    # A fresh home: no node has the agent cached, so the step ships it (one line to all).
    home = tmp_path / "home"
    home.mkdir()
    monkeypatch.setenv("HOME", str(home))
    monkeypatch.delenv("XDG_CACHE_HOME", raising=False)  # the cache follows it when set
    plan = resolve_slurm_targets(slurm_gloo_job.job_id)
    assert plan.transport == "slurm" and not plan.notes
    fleet = Fleet(plan.specs)
    try:
        samples = fleet.call_all("sample", {})
        pids = {
            node: [p["pid"] for p in s["processes"] if p["rank"] is not None]
            for node, s in samples.items()
        }
        dumps = fleet.fan_out(lambda s: s.call("pyspy", {"pids": pids[s.name]}, timeout=60))
        hellos = {s.name: s.hello["hostname"] for s in fleet}
    finally:
        fleet.close()
    assert hellos == {"node1": "node1", "node2": "node2", "node3": "node3"}
    assert len(list((home / ".cache" / "areal-console").glob("payload-*.pyz"))) == 1
    reply_sizes = []

    def frame_names(result: dict, dump: dict) -> list[str]:
        # A node's reply sends each distinct stack's frames once, keyed by a digest.
        stacks = {t["key"]: t["frames"] for d in result["dumps"] for t in d["threads"]
                  if "frames" in t}  # fmt: skip
        return [f["name"] for t in dump["threads"] for f in stacks[t["key"]]]

    for result in dumps.values():
        assert not isinstance(result, NodeFailure), result
        assert len(result["dumps"]) == 2
        reply_sizes.append(len(json.dumps(result)))
        for dump in result["dumps"]:
            assert dump["ok"], dump
            frames = frame_names(result, dump)
            assert "main" in frames, frames
    # Replies longer than srun's 1 KiB label chunks arrive whole.
    assert min(reply_sizes) > 1024
    # Ranks 0-4 wait in the barrier; the last rank sleeps outside it.
    for node, result in dumps.items():
        for dump in result["dumps"]:
            names = set(frame_names(result, dump))
            in_barrier = "barrier" in names
            assert in_barrier == (node != "node3" or dump is not result["dumps"][-1]), names


@pytest.mark.slow
@pytest.mark.parametrize(("mode", "export"), [("step", "NONE"), ("node", "NONE"), ("step", "ALL")])
def test_the_agents_python_is_chosen_on_the_node(
    slurm_cluster: SlurmCluster,
    slurm_gloo_job: SlurmGlooJob,
    tmp_path: Path,
    mode: str,
    export: str,
) -> None:
    """A site with `--export=NONE` (srun passes no PATH), or a caller whose `python3` is too
    old: the node resolves its own interpreter, and the report says which one it used."""
    old = find_python("3.8")  # older than the agent's 3.9 (.ci/run installs it with uv)
    if old is None:
        pytest.skip("no Python 3.8 on this machine")
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    (bin_dir / "python3").symlink_to(old)
    env_path = f"{bin_dir}{os.pathsep}{os.environ['PATH']}"
    result = console(
        slurm_cluster, "nodes", "--slurm-job", slurm_gloo_job.job_id, "--slurm-mode", mode,
        "--json", env={"SLURM_EXPORT_ENV": export, "PATH": env_path},
    )  # fmt: skip
    assert result.returncode == 0, result.stderr
    report = json.loads(result.stdout)
    assert [n["state"] for n in report["nodes"]] == ["up", "up", "up"]
    for node in report["nodes"]:
        major, minor = map(int, node["python"].split(".")[:2])
        assert (major, minor) >= (3, 9)
        assert node["python_executable"] and str(bin_dir) not in node["python_executable"]


def test_unknown_job_is_a_clear_error(slurm_cluster: SlurmCluster) -> None:
    result = console(slurm_cluster, "nodes", "--slurm-job", "987654")
    assert result.returncode == 1
    assert result.stderr.strip() == (
        "error: Slurm job 987654 not found on this machine"
        " (it may have ended long ago: Slurm forgets jobs after MinJobAge)"
    )
    # Not an id: a job name (as AReaL's scheduler gives them), looked up, never a shell word.
    named = console(slurm_cluster, "nodes", "--slurm-job", "12;rm")
    assert named.returncode == 1
    assert named.stderr == "error: no Slurm job named '12;rm' in the queue on this machine\n"
    bad = console(slurm_cluster, "nodes", "--slurm-job", "a,b")
    assert bad.returncode == 2 and bad.stderr == "error: 'a,b' is not a Slurm job id or name\n"


def test_finished_and_pending_jobs_are_clear_errors(slurm_cluster: SlurmCluster) -> None:
    done = slurm_cluster.sbatch("#!/bin/sh\ntrue\n", "--output=/dev/null")
    slurm_cluster.wait_job_state(done, ("COMPLETED",), timeout=60)
    result = console(slurm_cluster, "nodes", "--slurm-job", str(done))
    assert result.returncode == 1
    assert f"Slurm job {done} is COMPLETED: it has ended" in result.stderr
    pending = slurm_cluster.sbatch("#!/bin/sh\ntrue\n", "--begin=now+1hour", "--output=/dev/null")
    try:
        result = console(slurm_cluster, "nodes", "--slurm-job", str(pending))
        assert result.returncode == 1
        assert f"Slurm job {pending} is PENDING (BeginTime)" in result.stderr
    finally:
        slurm_cluster.run(["scancel", str(pending)], check=False)


def test_without_srun_the_nodes_are_reached_over_ssh(
    slurm_cluster: SlurmCluster, slurm_gloo_job: SlurmGlooJob, tmp_path: Path
) -> None:
    # A login node where Slurm's query commands exist but srun doesn't.
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    for tool in ("scontrol", "squeue", "id"):
        (bin_dir / tool).symlink_to(shutil.which(tool) or tool)
    runner = LocalRunner(slurm_cluster.env(PATH=str(bin_dir)))
    plan = resolve_slurm_targets(slurm_gloo_job.job_id, login=None, runner=runner)
    assert plan.transport == "ssh"
    assert [(s.name, s.transport, s.host) for s in plan.specs] == [
        ("node1", "ssh", "node1"),
        ("node2", "ssh", "node2"),
        ("node3", "ssh", "node3"),
    ]
    assert plan.notes == [
        "srun is not available on this machine; reaching the job's 3 nodes over SSH instead"
    ]


def test_job_of_another_user_falls_back_to_ssh(
    slurm_cluster: SlurmCluster, slurm_gloo_job: SlurmGlooJob
) -> None:
    """Slurm refuses srun into root's job for `nobody`: the console says so and uses SSH."""
    python = "/usr/bin/python3"
    if not Path(python).exists() or not shutil.which("setpriv"):
        pytest.skip("needs the system python3 and setpriv to act as another user")
    # `nobody` may not reach this checkout (e.g. under a 0700 home): it runs a copy of the
    # console's source in the cluster's world-readable directory, so any failure is real.
    source = Path(tempfile.mkdtemp(prefix="console-src-", dir=slurm_cluster.base))
    source.chmod(0o755)
    for package in (ROOT / "tui" / "areal_console", ROOT / "agents" / "areal_node"):
        shutil.copytree(package, source / package.name,
                        ignore=shutil.ignore_patterns("__pycache__"))  # fmt: skip
    for path in source.rglob("*"):
        path.chmod(0o755 if path.is_dir() else 0o644)
    env = slurm_cluster.env(HOME="/tmp")
    env["PYTHONPATH"] = str(source)
    argv = ["setpriv", "--reuid=nobody", "--regid=nogroup", "--clear-groups", python]
    result = subprocess.run(
        [*argv, "-m", "areal_console", "slurm", slurm_gloo_job.job_id, "--json"],
        capture_output=True,
        text=True,
        timeout=60,
        env=env,
        cwd="/tmp",
        check=False,
    )
    assert result.returncode == 0, result.stderr
    shown = json.loads(result.stdout)
    assert shown["job"]["user"] == "root"
    assert shown["transport"] == "ssh"
    assert shown["notes"] == [
        f"srun can't join job {slurm_gloo_job.job_id}: srun: error: Unable to create step for"
        f" job {slurm_gloo_job.job_id}: Access/permission denied; reaching the job's 3 nodes"
        " over SSH instead"
    ]
    assert [n["transport"] for n in shown["nodes"]] == ["ssh", "ssh", "ssh"]


@pytest.fixture(scope="module")
def login_host(slurm_cluster: SlurmCluster, tmp_path_factory: pytest.TempPathFactory):  # type: ignore[no-untyped-def]
    """sshd on 127.0.0.1; skips only where OpenSSH is missing, a failed start is an error."""
    from tests.support.login_sshd import LoginHost, skip_reason

    reason = skip_reason()
    if reason:
        pytest.skip(reason)
    host = LoginHost(tmp_path_factory.mktemp("login"), slurm_cluster.conf)
    host.start()
    try:
        yield host
    finally:
        host.stop()


@pytest.mark.slow
def test_through_one_ssh_connection_to_a_login_host(
    slurm_cluster: SlurmCluster,
    slurm_gloo_job: SlurmGlooJob,
    login_host,
    monkeypatch: pytest.MonkeyPatch,  # type: ignore[no-untyped-def]
) -> None:
    """Slurm queried and the shared srun step run on a login host over SSH (no local Slurm)."""
    from areal_console.core.slurm.client import SshLoginRunner

    monkeypatch.delenv("SLURM_CONF", raising=False)  # only the login host knows the cluster
    runner = SshLoginRunner(login_host.login, options=login_host.client_options())
    plan = resolve_slurm_targets(slurm_gloo_job.job_id, login=login_host.login, runner=runner)
    assert plan.transport == "slurm" and plan.job.nodes == ["node1", "node2", "node3"]
    fleet = Fleet(plan.specs, slurm_runner=runner)
    try:
        samples = fleet.call_all("sample", {})
    finally:
        fleet.close()
        runner.close()
    ranks = {
        node: sorted(p["rank"] for p in s["processes"] if p["rank"] is not None)
        for node, s in samples.items()
    }
    assert ranks == {"node1": [0, 1], "node2": [2, 3], "node3": [4, 5]}


async def test_slurm_view_lists_the_job_and_opens_it(
    slurm_cluster: SlurmCluster, slurm_gloo_job: SlurmGlooJob
) -> None:
    from areal_console.screens.slurm_jobs import SlurmJobsScreen

    from tests.tui.test_slurm_screen import SlurmApp, rows

    app = SlurmApp(job_lister(LocalRunner(slurm_cluster.env())))
    async with app.run_test(size=(120, 30)) as pilot:
        screen = app.screen
        assert isinstance(screen, SlurmJobsScreen)
        while not screen.loaded:
            await pilot.pause(0.05)
        assert screen.error is None
        assert ["gloo-ranks", "root", "RUNNING", "node[1-3]", "gpu:1"] in [
            r[1:] for r in rows(screen)
        ]
        await pilot.press("slash", *"gloo-ranks", "enter", "enter")
        await pilot.pause()
        assert app.chosen == [slurm_gloo_job.job_id]


async def test_console_slurm_view_opens_the_job_in_the_cluster_screen(
    slurm_cluster: SlurmCluster, slurm_gloo_job: SlurmGlooJob, monkeypatch: pytest.MonkeyPatch
) -> None:
    """`:slurm` in the console, enter on the job: the Cluster screen now shows its nodes
    and each node's ranks, reached through srun. (Runs before the node-down test below,
    which stops node3 of the shared cluster.)"""
    from areal_console.app import ConsoleApp
    from areal_console.core.targets.resolve import local_node
    from areal_console.screens.cluster import ClusterScreen
    from areal_console.screens.slurm_jobs import SlurmJobsScreen
    from areal_console.widgets.node_table import NodeTable
    from areal_console.widgets.process_table import ProcessTable

    for key, value in slurm_cluster.env().items():
        if os.environ.get(key) != value:
            monkeypatch.setenv(key, value)
    app = ConsoleApp(Fleet([local_node()]), refresh_interval=0.3)
    async with app.run_test(size=(140, 40)) as pilot:
        await pilot.press("colon", *"slurm", "enter")
        screen = app.screen
        assert isinstance(screen, SlurmJobsScreen)
        while not screen.loaded:
            await pilot.pause(0.05)
        await pilot.press("slash", *"gloo-ranks", "enter", "enter")
        deadline = time.monotonic() + 120

        def ranks_by_node() -> dict[str, list[int]]:
            cluster = app.screen
            if not isinstance(cluster, ClusterScreen):
                return {}
            table = cluster.query_one(ProcessTable)
            out: dict[str, list[int]] = {}
            for key in table.rows:
                node, rank = str(table.get_cell(key, "node")), str(table.get_cell(key, "rank"))
                if rank != "-":
                    out.setdefault(node, []).append(int(rank.split("/")[0]))
            return {n: sorted(r) for n, r in out.items()}

        while ranks_by_node() != {"node1": [0, 1], "node2": [2, 3], "node3": [4, 5]}:
            assert time.monotonic() < deadline, (
                ranks_by_node(),
                type(app.screen).__name__,
                [n.message for n in app._notifications],
            )
            await pilot.pause(0.2)
        nodes = app.screen.query_one(NodeTable)
        assert sorted(k.value or "" for k in nodes.rows) == ["node1", "node2", "node3"]


def test_replay_style_launches_sbatch_and_overlap_step(
    slurm_cluster: SlurmCluster, slurm_gloo_job: SlurmGlooJob, tmp_path: Path
) -> None:
    from areal_console.core.slurm.launch import (
        BatchRequest,
        job_state,
        overlap_step_argv,
        submit_batch,
    )

    runner = LocalRunner(slurm_cluster.env())
    out = slurm_cluster.base / "replay-out"
    out.mkdir()
    script = "import os, sys; open(sys.argv[1], 'w').write(os.environ['SLURMD_NODENAME'])"
    target = out / "ran on (node).txt"  # a path with spaces and parentheses stays one word
    job = submit_batch(
        runner,
        BatchRequest(
            command=[sys.executable, "-c", script, str(target)],
            gpus_per_node=1,
            chdir=str(out),
            output=str(out / "slurm-%j.out"),
        ),
    )
    slurm_cluster.wait_job_state(job, ("COMPLETED", "FAILED"), timeout=60)
    assert job_state(SlurmClient(runner), job) == ("COMPLETED", "0:0")
    assert target.read_text().startswith("node")

    # Into the running job's allocation on a chosen node, next to its ranks.
    argv = overlap_step_argv(
        slurm_gloo_job.job_id,
        "node2",
        [
            sys.executable,
            "-c",
            "import os; print(os.environ['SLURMD_NODENAME'], os.environ['SLURM_JOB_ID'])",
        ],
    )
    result = runner.run(argv, timeout=60)
    assert result.returncode == 0, result.stderr
    assert result.stdout.split() == ["node2", slurm_gloo_job.job_id]


@pytest.fixture(scope="module")
def slurm_recording(slurm_cluster: SlurmCluster) -> tuple[Path, dict[str, str]]:
    """Two steps recorded by the reference trainer, where every node can read them."""
    home = slurm_cluster.base / "replay-home"
    env = slurm_cluster.env()
    env["PYTHONPATH"] = os.pathsep.join([str(ROOT / "tui"), str(ROOT / "agents")])
    env["AREAL_CONSOLE_DATA_DIR"] = str(home / "data")
    env["AREAL_CONSOLE_CONFIG_DIR"] = str(home / "config")
    dump = slurm_cluster.base / "replay dump"  # a space stays inside one argv word
    proc = subprocess.run(
        [
            *(sys.executable, "-m", "areal_console", "trainer", "steps=2", "seed=3"),
            *("trajectory_debug.dump_rollout_data=true", f"trajectory_debug.path={dump}"),
            f"output_dir={home / 'run'}",
        ],
        capture_output=True,
        text=True,
        timeout=120,
        env=env,
        check=False,
    )
    assert proc.returncode == 0, proc.stderr
    return dump, env


@pytest.fixture
def nobodys_dump(
    slurm_cluster: SlurmCluster, slurm_recording: tuple[Path, dict[str, str]], tmp_path: Path
) -> Iterator[tuple[Path, Path, Path]]:
    """The recording as another user's dump, whose owner planted `replays` as a link to a
    root-only folder (where a run folder made in the dump would land) and modules an
    interpreter started there would import; (dump, root-only folder, markers)."""
    recorded, _ = slurm_recording
    dump = slurm_cluster.base / f"nobody's dump {tmp_path.name}"
    shutil.copytree(recorded, dump)
    subprocess.run(["chown", "-R", "nobody:nogroup", str(dump)], check=True)
    root_only = Path(tempfile.mkdtemp(prefix="root-only-"))
    as_nobody("ln", "-s", str(root_only), str(dump / "replays"))
    markers = tmp_path / "markers"
    markers.mkdir()
    plant_modules(dump, markers)
    try:
        yield dump, root_only, markers
    finally:
        shutil.rmtree(dump, ignore_errors=True)
        shutil.rmtree(root_only, ignore_errors=True)


def _tree(folder: Path) -> dict[str, tuple[int, int]]:
    return {
        str(p.relative_to(folder)): (p.lstat().st_size, p.lstat().st_mtime_ns)
        for p in folder.rglob("*")
    }


@needs_nobody
@pytest.mark.parametrize("how", ["overlap", "sbatch"])
def test_replay_through_slurm_verifies(
    slurm_cluster: SlurmCluster,
    slurm_gloo_job: SlurmGlooJob,
    slurm_recording: tuple[Path, dict[str, str]],
    nobodys_dump: tuple[Path, Path, Path],
    how: str,
) -> None:
    """`replay --slurm-job J --node node2`: srun --overlap into J's allocation, or sbatch.

    Run as root on another user's dump, from inside it: the dump is read, never written
    (its planted `replays` link leads nowhere); the run's folder, log and output are in
    our data dir; no interpreter (the agent's srun step, the trainer, torchrun, its
    rank) imports the modules planted there."""
    from areal_console.core.replay.runs import load_runs
    from areal_console.core.slurm.runs import refresh_slurm

    _, env = slurm_recording
    dump, root_only, markers = nobodys_dump
    before = _tree(dump)
    args = ["replay", str(dump), "--slurm-job", slurm_gloo_job.job_id, "--node", "node2"]
    args += ["--gpus", "cpu", "--wait", "--json"] + (["--sbatch"] if how == "sbatch" else [])
    # The console as its installed script starts (the script's folder, not the working
    # directory, first on sys.path): what it starts is what is tested.
    proc = subprocess.run(
        launcher.user_module(sys.executable, "areal_console", *args),
        capture_output=True,
        text=True,
        timeout=90,
        env=env,
        cwd=dump,
        check=False,
    )
    assert planted_ran(markers) == [], proc.stderr
    assert proc.returncode == 0, proc.stderr
    out = json.loads(proc.stdout)
    assert out["state"] == "finished" and out["exit_code"] == 0, out
    assert out["verification"]["matched"] is True and out["verification"]["steps"] == [
        0,
        1,
    ]  # global steps from 0
    assert out["slurm_state"] == "COMPLETED"
    if how == "overlap":
        assert out["slurm_job"] == slurm_gloo_job.job_id
        assert out["slurm_step"].startswith(f"{slurm_gloo_job.job_id}.")
        assert out["command"][:2] == ["env", "CUDA_VISIBLE_DEVICES="]
    else:
        assert out["slurm_job"].isdigit() and out["slurm_job"] != slurm_gloo_job.job_id
        assert out["slurm_step"] is None
    assert Path(out["log"]).is_file()
    data = Path(env["AREAL_CONSOLE_DATA_DIR"])
    assert Path(out["log"]).parent.parent == data / "runs"
    assert _tree(dump) == before and not list(root_only.iterdir())
    assert (data.stat().st_mode & 0o777, Path(out["log"]).parent.stat().st_mode & 0o777) == (
        0o700,
        0o700,
    )
    records = load_runs(data / "jobs")
    saved = {r.job_id: r for r in records}[out["job_id"]]
    assert saved.extra["dump"] == str(dump) and saved.job_dir == str(Path(out["log"]).parent)
    assert (saved.slurm_job, saved.slurm_step) == (out["slurm_job"], out["slurm_step"])
    assert saved.slurm_label.endswith("COMPLETED")
    if how == "sbatch":  # what the Runs screen does for a record it finds running
        saved.state, saved.extra["slurm_state"] = "running", "RUNNING"
        refresh_slurm(saved, LocalRunner(env))
        assert (saved.state, saved.exit_code, saved.slurm_label) == (
            "finished",
            0,
            f"slurm job {saved.slurm_job} COMPLETED",
        )


@pytest.mark.slow
def test_a_node_whose_agent_never_answers_is_named_and_the_rest_captured(
    slurm_cluster: SlurmCluster,
    slurm_gloo_job: SlurmGlooJob,
    monkeypatch: pytest.MonkeyPatch,
    tmp_path: Path,
) -> None:
    """One shared srun step for the job's 3 nodes; on node3 the agent's interpreter stops
    itself (SIGSTOP) as it starts: srun launched it, it never says ready. node1 and node2
    are captured at the step's start deadline, and node3 is named with its reason."""
    from areal_console.core.stacks.capture import CaptureOptions, take_capture
    from areal_console.core.stacks.coverage import capture_coverage

    monkeypatch.setenv("SLURM_CONF", str(slurm_cluster.conf))
    python = tmp_path / "python3"
    python.write_text(
        f'#!/bin/sh\n[ "$(hostname)" = node3 ] && kill -STOP $$\nexec {sys.executable} "$@"\n'
    )
    python.chmod(0o755)
    plan = resolve_slurm_targets(slurm_gloo_job.job_id)
    specs = [dataclasses.replace(s, python=str(python)) for s in plan.specs]
    # A start deadline of 16 s: the shared step waits 12 s (0.75 of it) for every `ready`.
    fleet = Fleet(specs, start_timeout=16.0)
    t0 = time.monotonic()
    try:
        capture = take_capture(fleet, CaptureOptions(), save=False)
        took = time.monotonic() - t0
        steps = agent_steps(slurm_cluster, slurm_gloo_job.job_id)
    finally:
        fleet.close()
    assert len(steps) == 1, steps  # one step served all three nodes
    coverage = capture_coverage(capture)
    assert coverage.line() == "4 of 6 ranks; 1 node failed: node3 (timeout 12 s)"
    [error] = capture.errors
    assert error.node == "node3"
    assert "did not start within 12 s under the shared srun step" in error.error
    assert {r.node for r in capture.rank_stacks if r.state == "ok"} == {"node1", "node2"}
    assert took < 120  # 12 s and the dumps; not the 30 s x nodes of a step that waits for all


# Killing node3 also ends the gloo job's ranks there (and so the job's barrier everywhere):
# the test cancels that job at its end, and a test after it gets a new one.
@pytest.mark.slow
def test_a_node_of_the_job_going_down(
    slurm_cluster: SlurmCluster, slurm_gloo_jobs: GlooJobs
) -> None:
    """A job's node dies (slurmd and everything on it, like a crash); then comes back.

    First Slurm doesn't know yet: the shared step fails to launch on node3, the other nodes
    get steps of their own, and node3 is down with srun's reason. Then Slurm has marked
    node3 not responding, and the console reports it down without trying it.
    """
    job = str(
        slurm_cluster.sbatch(
            "#!/bin/sh\nexec sleep 600\n",
            "--nodes=3",
            "--no-kill",  # the job outlives a node
            "--output=/dev/null",
        )
    )
    slurm_cluster.wait_job_state(job, ("RUNNING",))
    slurm_cluster.kill_node("node3")
    try:
        first = console(slurm_cluster, "nodes", "--slurm-job", job, "--json")
        assert first.returncode == 3, first.stderr
        report = json.loads(first.stdout)
        states = {n["name"]: n["state"] for n in report["nodes"]}
        assert states == {"node1": "up", "node2": "up", "node3": "down"}, first.stderr
        node3 = report["nodes"][2]
        assert "failed on node node3: Communication connection failure" in node3["error"]
        # srun gave up on the dead slurmd (MessageTimeout, 10 s here): console's 90 s
        # timeout is the bound on a hang.

        wait_for(
            lambda: (
                "NOT_RESPONDING" in slurm_cluster.run(["scontrol", "show", "node", "node3"]).stdout
            ),
            60,
            what="Slurm to notice node3 is gone",
        )
        second = console(slurm_cluster, "nodes", "--slurm-job", job, "--json")
        assert second.returncode == 3, second.stderr
        assert "note: Slurm reports node node3 " in second.stderr
        assert "NOT_RESPONDING: not contacting it" in second.stderr
        report = json.loads(second.stdout)
        assert [n["state"] for n in report["nodes"]] == ["up", "up", "down"]
        assert report["nodes"][2]["error"].startswith("Slurm reports node node3 ")
    finally:
        slurm_cluster.run(["scancel", job], check=False)
        slurm_cluster.start_node(slurm_cluster.node("node3"))
        # Cancelled only now: a job completing on node3 as it dies lets Slurm mark it not
        # responding at once, before the first look above.
        slurm_gloo_jobs.spoil()


def test_a_slurm_that_does_not_start_is_an_error_not_a_skip(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Slurm installed and root, but munged dies at once: `SlurmStartError` with its log
    line (the fixture lets it through, so every Slurm test errors), never `SlurmUnavailable`."""
    from tests.support.slurm_cluster import SlurmStartError, skip_reason, start_cluster

    reason = skip_reason()
    if reason:
        pytest.skip(f"no test Slurm cluster: {reason}")
    fake = tmp_path / "munged"
    fake.write_text("#!/bin/sh\necho 'munged: Error: no key here' >&2\nexit 1\n")
    fake.chmod(0o755)
    monkeypatch.setenv("PATH", f"{tmp_path}{os.pathsep}{os.environ['PATH']}")
    with pytest.raises(SlurmStartError, match="munged exited: munged: Error: no key here"):
        start_cluster(1)
