"""`--ray`: a real Ray cluster (head + one node, each in its own PID namespace), the
agent as an actor on each node, and a 4-rank gloo job placed as Ray actors."""

from __future__ import annotations

import http.server
import json
import os
import signal
import subprocess
import sys
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from areal_console.core.common.errors import UserError
from areal_console.core.ray.nodes import list_nodes, parse_address
from areal_console.core.ray.ranks import join_ids
from areal_console.core.ray.versions import console_python, dashboard_ray_version

from tests.support import waits
from tests.support.ray_cluster import CPUS_PER_NODE, HEAD_IP, RayCluster
from tests.support.waits import wait_for

pytest_plugins = ["conftest_ray"]

PYTHON = console_python()
try:
    from ray import __version__ as RAY
except ImportError:  # the cluster tests skip; the version cases need Ray's own check
    RAY = "?"

REPO = Path(__file__).resolve().parents[2]
# A console whose Python has no `ray` (the [ray] extra not installed).
WITHOUT_RAY = (
    "import sys; sys.modules['ray'] = None; from areal_console.cli import main; "
    "sys.exit(main(sys.argv[1:]))"
)


def console(
    cluster: RayCluster,
    *args: str,
    without_ray: bool = False,
    timeout: float = 120,
    **env_extra: str,
) -> subprocess.CompletedProcess[str]:
    env = cluster.env(PYTHONPATH=f"{REPO / 'tui'}{os.pathsep}{REPO / 'agents'}", **env_extra)
    head = (
        [sys.executable, "-c", WITHOUT_RAY]
        if without_ray
        else [sys.executable, "-m", "areal_console"]
    )
    return subprocess.run(
        [*head, *args], capture_output=True, text=True, env=env, timeout=timeout, check=False
    )


# -- addresses and the dashboard, without a cluster -------------------------------------


def test_addresses_read_as_ray_reads_them() -> None:
    env = {"RAY_ADDRESS": "10.0.0.5:6379"}
    assert parse_address(None, env).gcs == "10.0.0.5:6379"
    assert parse_address("auto", env).dashboard == "http://10.0.0.5:8265"
    client = parse_address("ray://head:10001", {})
    assert (client.client, client.gcs, client.dashboard) == (
        "ray://head:10001",
        None,
        "http://head:8265",
    )
    dash = parse_address("http://head:9999/", {})
    assert (dash.gcs, dash.dashboard, dash.for_ray) == (
        None,
        "http://head:9999",
        "http://head:9999",
    )
    moved = parse_address("head:6379", {"RAY_DASHBOARD_ADDRESS": "head:7000"})
    assert moved.dashboard == "http://head:7000"
    with pytest.raises(UserError, match=r"no address|names no host"):
        parse_address("[x", {})


class _Dashboard(http.server.BaseHTTPRequestHandler):
    """Answers like a Ray dashboard with token authentication on (token "right")."""

    def do_GET(self) -> None:
        auth = self.headers.get("Authorization")
        if auth is None:
            self._reply(401, b"Unauthorized: Missing authentication token")
        elif auth != "Bearer right":
            self._reply(403, b"Forbidden: Invalid authentication token")
        else:
            row = {"node_id": "ab" * 28, "node_ip": "10.1.2.3", "node_name": "10.1.2.3",
                   "state": "ALIVE", "is_head_node": True,
                   "resources_total": {"CPU": 8.0, "GPU": 4.0}}  # fmt: skip
            self._reply(200, json.dumps({"data": {"result": {"result": [row]}}}).encode())

    def _reply(self, code: int, body: bytes) -> None:
        self.send_response(code)
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, *args: Any) -> None:
        pass


@pytest.fixture
def token_dashboard() -> Iterator[str]:
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), _Dashboard)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    try:
        yield f"http://127.0.0.1:{server.server_address[1]}"
    finally:
        server.shutdown()
        server.server_close()


@pytest.mark.parametrize(
    ("token", "expected"),
    [
        (None, "requires a token: set RAY_AUTH_TOKEN"),
        ("wrong", "refused the token from RAY_AUTH_TOKEN"),
        ("right", None),
    ],
)
def test_dashboard_token(
    token_dashboard: str,
    token: str | None,
    expected: str | None,
    monkeypatch: pytest.MonkeyPatch,
    tmp_path: Path,
) -> None:
    monkeypatch.setenv("HOME", str(tmp_path))  # no ~/.ray/auth_token of the machine's
    monkeypatch.delenv("RAY_AUTH_TOKEN_PATH", raising=False)
    if token is None:
        monkeypatch.delenv("RAY_AUTH_TOKEN", raising=False)
    else:
        monkeypatch.setenv("RAY_AUTH_TOKEN", token)
    address = parse_address(token_dashboard, {})
    if expected is None:
        nodes, how = list_nodes(address, use_ray=False)
        assert how == "dashboard"
        assert [(n.ip, n.is_head, n.gpus) for n in nodes] == [("10.1.2.3", True, 4)]
        return
    with pytest.raises(UserError) as caught:
        list_nodes(address, use_ray=False)
    assert expected in str(caught.value)
    assert "\n" not in str(caught.value)


def test_ray_ids_join_by_node_and_pid() -> None:
    actors = [
        {"actor_id": "a1", "pid": 10, "node_id": "n1"},
        {"actor_id": "a9", "pid": 10, "node_id": "n9"},
    ]
    tasks = [
        {"task_id": "t1", "worker_pid": 10, "node_id": "n1", "actor_id": "a1"},
        {"task_id": "t2", "worker_pid": 11, "node_id": "n1", "actor_id": None},  # run_func
    ]
    assert join_ids(actors, tasks, {"n1"}) == {
        "n1": {
            10: {"actor_id": "a1", "task_id": "t1", "node_id": "n1"},
            11: {"actor_id": None, "task_id": "t2", "node_id": "n1"},
        }
    }


@pytest.mark.parametrize(
    ("cluster", "expected"),
    [
        ({"ray_version": "2.49.0", "python_version": PYTHON},
         f"which runs Ray 2.49.0 (Python {PYTHON}): install the cluster's Ray next to the "
         "console: pip install 'ray[default]==2.49.0'"),
        ({"ray_version": RAY, "python_version": "3.11.0"},
         "which runs Ray {RAY} (Python 3.11.0): run the console with Python 3.11.0 (or set "
         "RAY_DEFAULT_PYTHON_VERSION_MATCH_LEVEL=minor)"),
    ],
)  # fmt: skip
def test_version_mismatch_is_one_line(cluster: dict[str, str], expected: str) -> None:
    """Ray's own check (the one `ray.init` runs) raises its error; the console turns it
    into one line naming both versions and what to install."""
    from areal_console.core.ray.channel import _init_failure
    from ray._private.utils import check_version_info

    with pytest.raises(RuntimeError) as raised:
        check_version_info(cluster, "node 10.0.0.9")
    line = _init_failure("10.0.0.5:6379", raised.value, RAY)
    assert line.startswith(f"--ray: this console's Ray {RAY} (Python {PYTHON}) can't talk to "
                           "the cluster at 10.0.0.5:6379, ")  # fmt: skip
    assert line.endswith(expected.replace("{RAY}", RAY))
    assert "\n" not in line


def test_version_from_the_dashboard_when_ray_fails_early(token_dashboard: str) -> None:
    """A Ray too far apart fails before its version check: the dashboard names the
    cluster's version (`/api/version`, here one that has none: the plain failure stays)."""
    from areal_console.core.ray.versions import RayVersions, mismatch_line

    assert dashboard_ray_version(token_dashboard, "right") is None
    line = mismatch_line("head:6379", RayVersions("2.49.0", None, "2.60.0", "3.11.7"))
    assert line == (
        "--ray: this console's Ray 2.60.0 (Python 3.11.7) can't talk to the cluster at "
        "head:6379, which runs Ray 2.49.0: install the cluster's Ray next to the console: "
        "pip install 'ray[default]==2.49.0'"
    )


def test_ray_train_ranks_from_trains_state() -> None:
    """Ray Train's run listings (Train V2: the latest attempt's workers; Train V1: the
    run's workers), as the dashboard serves them, give each worker's rank by node and pid."""
    from areal_console.core.ray.ranks import TrainRank, train_ranks_from_runs

    def worker(rank: int, pid: int, node: str = "n1") -> dict[str, Any]:
        return {"world_rank": rank, "local_rank": rank % 2, "node_rank": 0, "node_id": node,
                "pid": pid, "actor_id": f"a{rank}", "node_ip": "10.0.0.1", "gpu_ids": []}  # fmt: skip

    v2 = {"train_runs": [{"id": "r1", "name": "sft", "attempts": [
        {"workers": [worker(0, 10), worker(1, 11)]},  # an older attempt: its pids are gone
        {"workers": [worker(0, 20), worker(1, 21), worker(2, 30, "n2")]},
    ]}]}  # fmt: skip
    assert train_ranks_from_runs(v2) == {
        ("n1", 20): TrainRank("sft", 0, 0, 3),
        ("n1", 21): TrainRank("sft", 1, 1, 3),
        ("n2", 30): TrainRank("sft", 2, 0, 3),
    }
    v1 = {"train_runs": [{"name": "TorchTrainer_1", "workers": [worker(0, 5), {"pid": "x"}]}]}
    assert train_ranks_from_runs(v1) == {("n1", 5): TrainRank("TorchTrainer_1", 0, 0, 1)}
    assert train_ranks_from_runs({"train_runs": "no"}) == {}
    assert train_ranks_from_runs([]) == {}


# -- the real cluster ----------------------------------------------------------------------


@pytest.mark.slow
def test_nodes_from_both_apis(ray_cluster: RayCluster) -> None:
    ips = {n.ip for n in ray_cluster.nodes}
    by_http, how = list_nodes(parse_address(ray_cluster.dashboard, {}), use_ray=False)
    assert how == "dashboard"
    assert {n.ip for n in by_http if n.alive} == ips
    by_ray, how = list_nodes(parse_address(ray_cluster.address, {}), use_ray=True)
    assert how == "state-api"
    assert {(n.ip, n.node_id, n.is_head) for n in by_ray} == {
        (n.ip, n.node_id, n.is_head) for n in by_http
    }
    assert [n.ip for n in by_ray if n.is_head] == [HEAD_IP]
    # The cluster's version as the dashboard tells it, for the mismatch line: this Ray's.
    assert dashboard_ray_version(ray_cluster.dashboard, None) == RAY


@pytest.mark.slow
def test_nodes_and_stacks_see_every_rank(ray_cluster: RayCluster, ray_gloo_job: Any) -> None:
    # Every CPU of every node is the job's: the agent actors reserve none, so they still fit.
    from tests.jobs.ray_gloo import CPUS_PER_RANK, RANKS_PER_NODE

    assert RANKS_PER_NODE * CPUS_PER_RANK == CPUS_PER_NODE
    result = console(ray_cluster, "nodes", "--ray", "--json")
    assert result.returncode == 0, result.stderr
    nodes = json.loads(result.stdout)["nodes"]
    assert [(n["name"], n["via"], n["state"]) for n in nodes] == [
        ("127.0.0.2", "ray", "up"),
        ("127.0.0.3", "ray", "up"),
    ]
    ranks = {
        p["rank"]: (n["name"], p) for n in nodes for p in n["processes"] if p["rank"] is not None
    }
    assert {r: name for r, (name, _) in ranks.items()} == {
        0: "127.0.0.2", 1: "127.0.0.2", 2: "127.0.0.3", 3: "127.0.0.3",
    }  # fmt: skip
    from ray.util.state import list_nodes as ray_list_nodes

    listed = ray_list_nodes(address=ray_cluster.address)
    node_ids = {n.node_ip: n.node_id for n in listed if n.state == "ALIVE"}  # not a lost one
    for name, p in ranks.values():
        assert p["ray"]["node_id"] == node_ids[name]
        assert p["ray"]["actor_id"] and p["ray"]["task_id"]  # RankWorker.run, running

    stacks = console(ray_cluster, "stacks", "--ray", ray_cluster.address, "--json")
    assert stacks.returncode == 0, stacks.stderr
    doc = json.loads(stacks.stdout)
    assert doc["errors"] == []
    assert sorted((r["rank"], r["node"]) for r in doc["ranks"]) == sorted(
        (r, name) for r, (name, _) in ranks.items()
    )
    assert [g["label"] for g in doc["groups"]] == ["0-2", "3"]
    assert doc["diagnosis"]["pattern"] == "cleanup_deadlock"


@pytest.mark.slow
def test_ray_client_address(ray_cluster: RayCluster, ray_gloo_job: Any) -> None:
    """`--ray ray://HOST:PORT` (Ray Client, e.g. through a KubeRay port-forward): the same
    nodes, ranks and Ray ids, and nothing of Ray Client's own logging on stderr."""
    from tests.support.ray_cluster import CLIENT_PORT

    client = f"ray://{HEAD_IP}:{CLIENT_PORT}"
    result = console(ray_cluster, "nodes", "--ray", client, "--json",
                     RAY_DASHBOARD_ADDRESS=ray_cluster.dashboard)  # fmt: skip
    assert result.returncode == 0, result.stderr
    assert [line for line in result.stderr.splitlines() if not line.startswith("note: ")] == []
    nodes = json.loads(result.stdout)["nodes"]
    assert [(n["name"], n["via"], n["state"]) for n in nodes] == [
        ("127.0.0.2", "ray", "up"),
        ("127.0.0.3", "ray", "up"),
    ]
    ranks = {p["rank"]: p for n in nodes for p in n["processes"] if p["rank"] is not None}
    assert sorted(ranks) == [0, 1, 2, 3]
    assert all(p["ray"] and p["ray"]["actor_id"] for p in ranks.values())


# A worker as Ray Train runs one: an actor of class `RayTrainWorker`, its rank variables set
# inside the running process (as ray/train/torch/config.py `_set_torch_distributed_env_vars`
# does), never in its /proc environment.
TRAIN_WORKER = """
import os, sys, time, ray
from ray.util.scheduling_strategies import NodeAffinitySchedulingStrategy
ray.init(address=sys.argv[1], namespace="areal-test-train", log_to_driver=False,
         logging_level="ERROR")

@ray.remote(num_cpus=0)
class RayTrainWorker:
    def setup(self):
        os.environ.update(RANK="1", LOCAL_RANK="1", WORLD_SIZE="2")
        return os.getpid()
    def run_train_fn(self):
        while True:
            time.sleep(1)

node = next(n for n in ray.nodes() if n["Alive"] and n["NodeManagerAddress"] == sys.argv[2])
w = RayTrainWorker.options(
    scheduling_strategy=NodeAffinitySchedulingStrategy(node["NodeID"], soft=False)).remote()
pid = ray.get(w.setup.remote())
w.run_train_fn.remote()
print(pid, flush=True)
sys.stdin.readline()
"""


@pytest.mark.slow
def test_ray_train_worker_without_its_rank(ray_cluster: RayCluster) -> None:
    """A Ray Train worker is listed as one (role ray_train, its actor id), its rank
    unknown where Ray Train's state can't tell it (this cluster has no ray[train]): never a
    rank guessed, never the process left out."""
    driver = subprocess.Popen(
        [sys.executable, "-c", TRAIN_WORKER, ray_cluster.address, "127.0.0.3"],
        stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True, env=ray_cluster.env(),
    )  # fmt: skip
    try:
        assert driver.stdout is not None
        pid = int(driver.stdout.readline())
        result = console(ray_cluster, "nodes", "--ray", "--json",
                         RAY_DASHBOARD_ADDRESS=ray_cluster.dashboard)  # fmt: skip
        assert result.returncode == 0, result.stderr
        nodes = {n["name"]: n for n in json.loads(result.stdout)["nodes"]}
        worker = next(p for p in nodes["127.0.0.3"]["processes"] if p["pid"] == pid)
        assert (worker["role"], worker["rank"], worker["world_size"]) == ("ray_train", None, None)
        assert worker["ray"]["actor_id"] and "train_run" not in worker["ray"]
        text = console(ray_cluster, "nodes", "--ray", RAY_DASHBOARD_ADDRESS=ray_cluster.dashboard)
        row = next(line for line in text.stdout.splitlines() if f" {pid} " in line)
        assert row.split()[:4] == ["?", "-", "-", "ray_train"]
    finally:
        driver.kill()
        driver.wait(timeout=30)


@pytest.mark.slow
def test_without_the_extra(ray_cluster: RayCluster) -> None:
    listed = console(ray_cluster, "nodes", "--ray", ray_cluster.dashboard, without_ray=True)
    assert listed.returncode == 1
    assert "127.0.0.2" in listed.stdout and "127.0.0.3" in listed.stdout
    assert "areal-console[ray]" in listed.stderr
    stacks = console(ray_cluster, "stacks", "--ray", ray_cluster.dashboard, without_ray=True)
    assert stacks.returncode == 1
    assert "areal-console[ray]" in stacks.stderr
    assert "Traceback" not in stacks.stderr


@pytest.mark.slow
async def test_cluster_screen_and_capture_on_ray(
    ray_cluster: RayCluster, ray_gloo_job: Any
) -> None:
    """The TUI on `--ray`: both nodes up through their agent actors, the four ranks listed
    on their nodes, and `s` captures and diagnoses them."""
    import ray
    from areal_console.app import ConsoleApp
    from areal_console.core.connection.fleet import Fleet
    from areal_console.core.ray.targets import resolve_ray_targets
    from areal_console.screens.stacks import StacksScreen
    from areal_console.widgets.node_table import NodeTable
    from areal_console.widgets.process_table import ProcessTable

    app = ConsoleApp(Fleet(resolve_ray_targets(ray_cluster.address).specs), refresh_interval=0.2)
    try:
        async with app.run_test(size=(160, 40)) as pilot:
            table = app.screen.query_one(ProcessTable)
            nodes = app.screen.query_one(NodeTable)

            def ranks() -> dict[str, str]:
                return {
                    str(table.get_cell(k, "rank")): (k.value or "").split(":")[0]
                    for k in table.rows
                    if str(table.get_cell(k, "rank")).endswith("/4")
                }

            await waits.until(None, lambda: len(ranks()) == 4, 60, "four rank rows")
            assert ranks() == {
                "0/4": "127.0.0.2", "1/4": "127.0.0.2", "2/4": "127.0.0.3", "3/4": "127.0.0.3",
            }  # fmt: skip
            assert [str(nodes.get_cell(n, "state")) for n in ("127.0.0.2", "127.0.0.3")] == [
                "up",
                "up",
            ]
            await pilot.press("s")
            await waits.until(None, lambda: isinstance(app.screen, StacksScreen), 30, "Stacks")
            stacks = app.screen
            assert isinstance(stacks, StacksScreen)
            await waits.until(None, lambda: stacks.diagnosis is not None, 60, "a diagnosis")
            assert stacks.diagnosis is not None
            assert stacks.diagnosis.pattern == "cleanup_deadlock"
    finally:
        ray.shutdown()  # this test process was the console's Ray driver


@pytest.mark.slow
def test_ssh_fallback_says_which_way(
    ray_cluster: RayCluster, ray_gloo_job: Any, tmp_path: Path
) -> None:
    """--ray-ssh: where the agent can't run as an actor (here: no [ray] extra), the node is
    reached over SSH at the IP Ray reports; nodes[].via says which way each node went."""
    from tests.support.cluster import TestCluster

    ssh = TestCluster(tmp_path / "ssh", nodes=2)
    ray_cluster.start_sshd(ssh)  # an sshd inside each Ray node's namespaces
    try:
        config = str(ssh.ssh_config)
        args = ("nodes", "--ray", ray_cluster.dashboard, "--ray-ssh", "--json")
        fallback = console(ray_cluster, *args, without_ray=True, AREAL_CONSOLE_SSH_CONFIG=config)
        assert fallback.returncode == 0, fallback.stderr
        assert "reached over SSH to each node's IP" in fallback.stderr
        nodes = json.loads(fallback.stdout)["nodes"]
        assert [(n["name"], n["via"], n["state"]) for n in nodes] == [
            ("127.0.0.2", "ssh", "up"),
            ("127.0.0.3", "ssh", "up"),
        ]
        seen = sorted(p["rank"] for n in nodes for p in n["processes"] if p["rank"] is not None)
        assert seen == [0, 1, 2, 3]
        placed = console(
            ray_cluster, "nodes", "--ray", "--ray-ssh", "--json", AREAL_CONSOLE_SSH_CONFIG=config
        )
        assert placed.returncode == 0, placed.stderr
        assert [n["via"] for n in json.loads(placed.stdout)["nodes"]] == ["ray", "ray"]
    finally:
        ssh.stop()


# AReaL's Ray name-resolve actor as AReaL declares it (areal/utils/name_resolve.py:781-882
# at cbff54d6: a detached `DistributedKVStore` named `distributed_kv_store` in namespace
# `areal_name_resolve`), holding a job's worker records as rpc_servers register them.
KV_ACTOR = """
import os, sys, ray
ray.init(address=sys.argv[1], log_to_driver=False, logging_level="ERROR")

@ray.remote
class DistributedKVStore:
    def __init__(self):
        self.store = {}
    def put(self, key, value, lease_id=None):
        self.store[key] = value
        return True
    def get_prefix(self, prefix):
        prefix = os.path.normpath(prefix)
        return [(k, v) for k, v in self.store.items()
                if os.path.normpath(k) == prefix or os.path.normpath(k).startswith(prefix + "/")]
    def get_all_keys(self):
        return list(self.store)

kv = DistributedKVStore.options(
    name="distributed_kv_store", namespace="areal_name_resolve", lifetime="detached",
    get_if_exists=True,
).remote()
for key, value in zip(sys.argv[2::2], sys.argv[3::2]):
    ray.get(kv.put.remote(key, value))
"""


@pytest.mark.slow
def test_areal_job_from_rays_kv(ray_cluster: RayCluster, ray_gloo_job: Any) -> None:
    """`--areal E/T --ray`: the job's records from AReaL's Ray KV actor, its nodes reached
    through the agent actors."""
    from tests.support.ray_cluster import NODE_PORT_BASE

    job = "root/ray-exp/trial0"
    records = [
        f"{job}/workers/actor/0", f"127.0.0.2:{NODE_PORT_BASE}",  # the raylets: listening
        f"{job}/workers/actor/1", f"127.0.0.3:{NODE_PORT_BASE + 10}",
    ]  # fmt: skip
    put = subprocess.run(
        [sys.executable, "-c", KV_ACTOR, ray_cluster.address, *records],
        env=ray_cluster.env(),
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert put.returncode == 0, put.stderr
    result = console(ray_cluster, "nodes", "--areal", job, "--ray", "--json")
    assert result.returncode == 0, result.stderr
    doc = json.loads(result.stdout)
    assert doc["areal"]["source"] == f"ray:{ray_cluster.address}"
    assert [(n["name"], n["via"], n["state"]) for n in doc["nodes"]] == [
        ("127.0.0.2", "ray", "up"),
        ("127.0.0.3", "ray", "up"),
    ]
    missing = console(ray_cluster, "nodes", "--areal", "root/nope/t", "--ray")
    assert missing.returncode == 1
    assert "no AReaL job nope/t" in missing.stderr
    assert "found: ray-exp/trial0" in missing.stderr


@pytest.fixture(scope="module")
def recorded_run(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Path, dict[str, str]]:
    """A dump of two steps recorded by the reference trainer (real torch.save files) and an
    AReaL log directory, and the console's environment for them."""
    from tests.support.areal_logfmt import write_run

    base = tmp_path_factory.mktemp("ray-run")
    env = {"AREAL_CONSOLE_DATA_DIR": str(base / "data"),
           "AREAL_CONSOLE_CONFIG_DIR": str(base / "config")}  # fmt: skip
    dump = base / "dump"
    trainer = subprocess.run(
        [sys.executable, "-m", "areal_console", "trainer", "steps=2", "seed=3",
         "trajectory_debug.dump_rollout_data=true", f"trajectory_debug.path={dump}",
         f"output_dir={base / 'out'}"],
        capture_output=True, text=True, timeout=120, check=False,
        env={**os.environ, **env, "PYTHONPATH": f"{REPO / 'tui'}{os.pathsep}{REPO / 'agents'}"},
    )  # fmt: skip
    assert trainer.returncode == 0, trainer.stderr
    write_run(base / "logs", 5, finished=True)
    return dump, base / "logs", env


@pytest.mark.slow
def test_batch_metrics_and_replay_on_a_ray_node(
    ray_cluster: RayCluster, recorded_run: tuple[Path, Path, dict[str, str]]
) -> None:
    """`batch`, `metrics` and `replay` with --ray read and run on the chosen node, through
    its agent actor: the dump and the logs are on a tmpfs only that node mounts."""
    dump, logs, env = recorded_run
    there = ray_cluster.base / f"node3-only-{os.getpid()}"
    ray_cluster.node_only_dir("127.0.0.3", there, dump, logs)
    assert not (there / "dump").exists()  # not here: only the node can read it
    at = ("--ray", "--node", "127.0.0.3")

    batch = console(ray_cluster, "batch", str(there / "dump"), *at, "--json", **env)
    assert batch.returncode == 0, batch.stderr
    summary = json.loads(batch.stdout)
    assert (summary["format"], summary["steps"], summary["samples"]) == (
        "trajectory_dir", [0, 1], 32,
    )  # fmt: skip
    which = console(ray_cluster, "batch", str(there / "dump"), "--ray", **env)
    assert which.returncode == 2  # two nodes: never the console's own disk
    assert "pick one with --node" in which.stderr

    metrics = console(ray_cluster, "metrics", str(there / "logs"), *at, "--json", **env)
    assert metrics.returncode == 0, metrics.stderr
    report = json.loads(metrics.stdout)
    assert report["source"] == f"127.0.0.3:{there / 'logs' / 'main.log'}"
    assert report["steps"] == [0, 1, 2, 3, 4]

    # Without --wait the console exits (its actor ends) while the run goes on: the run is
    # a process of its own on the node, not the actor's child (which Ray would kill).
    replay = console(ray_cluster, "replay", str(there / "dump"), *at, "--gpus", "cpu",
                     "--json", **env)  # fmt: skip
    assert replay.returncode == 0, replay.stderr
    run = json.loads(replay.stdout)
    assert (run["node"], run["via"], run["device"]) == ("127.0.0.3", "ray", "cpu")
    ended = Path(run["log"]).parent / "exit.json"
    wait_for(ended.is_file, 60, "the replay to end on the node", interval=0.2)
    assert json.loads(ended.read_text())["exit_code"] == 0, Path(run["log"]).read_text()[-2000:]
    text = console(ray_cluster, "replay", str(there / "dump"), *at, "--gpus", "cpu", "--wait",
                   **env)  # fmt: skip
    assert text.returncode == 0, text.stderr
    assert "launched: by the node's agent, a Ray actor pinned to the node" in text.stdout
    assert "replay matches recording (steps 0-1, bit for bit)" in text.stdout


HOLDER = """
import sys, time
from areal_console.core.connection.fleet import Fleet
from areal_console.core.ray.targets import resolve_ray_targets
fleet = Fleet(resolve_ray_targets(sys.argv[1]).specs)
fleet.connect_all()
print(' '.join(s.state for s in fleet), flush=True)
time.sleep(3600)
"""


def _agent_actors(address: str) -> int:
    from ray.util.state import list_actors

    alive = list_actors(
        address=address,
        filters=[("state", "=", "ALIVE"), ("class_name", "=", "AgentHost")],
        raise_on_missing_output=False,
    )
    return len(alive)


@pytest.mark.slow
def test_agent_exits_when_its_console_stops(ray_cluster: RayCluster) -> None:
    env = ray_cluster.env(PYTHONPATH=f"{REPO / 'tui'}{os.pathsep}{REPO / 'agents'}")
    holder = subprocess.Popen(
        [sys.executable, "-c", HOLDER, ray_cluster.address],
        stdout=subprocess.PIPE,
        text=True,
        env=env,
    )
    try:
        assert holder.stdout is not None
        assert holder.stdout.readline().split() == ["up", "up"]
        assert _agent_actors(ray_cluster.address) == 2
        os.kill(holder.pid, signal.SIGSTOP)  # connected, but calling no more
        # They exit LEASE_SECONDS (3 s) after the console's last call: waited for 10x that.
        wait_for(lambda: _agent_actors(ray_cluster.address) == 0, 30, "the agent actors to exit")
    finally:
        holder.kill()
        holder.wait(timeout=30)


LOSER = """
import json, sys
from areal_console.core.connection.fleet import Fleet, NodeFailure
from areal_console.core.ray.targets import resolve_ray_targets
fleet = Fleet(resolve_ray_targets(sys.argv[1]).specs)
while True:  # one sample per line on stdin
    results = fleet.call_all("sample", {}, timeout=60)
    print(json.dumps({name: ({"error": r.error} if isinstance(r, NodeFailure) else
        {"ranks": sorted(p["rank"] for p in r["processes"] if p.get("rank") is not None)})
        for name, r in results.items()}), flush=True)
    if not sys.stdin.readline():
        break
fleet.close()
"""


@pytest.mark.slow
def test_node_lost_mid_session(
    ray_cluster: RayCluster, ray_gloo_job: Any, ray_gloo_jobs: Any
) -> None:
    """A node dies under a session: the session reports it down, with a reason naming it,
    and keeps the other node's ranks in every sample. The node is started again at the
    end, and the gloo job (which lost two ranks) is marked for a restart, so tests after
    this one, in any module, find the whole cluster (see `RayGlooJobs`)."""
    env = ray_cluster.env(PYTHONPATH=f"{REPO / 'tui'}{os.pathsep}{REPO / 'agents'}")
    session = subprocess.Popen(
        [sys.executable, "-c", LOSER, ray_cluster.address],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        text=True,
        env=env,
    )
    assert session.stdin is not None and session.stdout is not None
    stdin, stdout = session.stdin, session.stdout

    def sample() -> dict[str, Any]:
        stdin.write("\n")
        stdin.flush()
        return json.loads(stdout.readline())

    try:
        first = json.loads(stdout.readline())
        assert first == {"127.0.0.2": {"ranks": [0, 1]}, "127.0.0.3": {"ranks": [2, 3]}}
        ray_cluster.kill_node("127.0.0.3")
        ray_gloo_jobs.spoil()
        after: list[dict[str, Any]] = []

        def kept(result: dict[str, Any]) -> None:
            # The other node answers every sample through its agent. Its ranks may end on
            # their own meanwhile: gloo ends ranks 0-1 once it finds their peers gone.
            assert set(result) == {"127.0.0.2", "127.0.0.3"}
            assert "error" not in result["127.0.0.2"]
            assert set(result["127.0.0.2"]["ranks"]) <= {0, 1}

        def reported_down() -> bool:
            after.append(sample())
            kept(after[-1])
            return "error" in after[-1]["127.0.0.3"]

        # Ray notices a dead actor within its call timeout: sample until the session says so.
        wait_for(reported_down, 60, "the session to report the lost node", interval=0.1)
        assert "127.0.0.3" in after[-1]["127.0.0.3"]["error"]
        again = sample()  # down for good: no ranks of a dead node come back
        kept(again)
        assert "127.0.0.3" in again["127.0.0.3"]["error"]

        def told_dead() -> str | None:  # the session's next reconnect: Ray has it dead
            result = sample()
            kept(result)
            error = result["127.0.0.3"]["error"]
            return error if error.startswith("Ray reports node 127.0.0.3 dead") else None

        wait_for(told_dead, 30, "a reconnect to fail as Ray reports", interval=0.2)
    finally:
        session.kill()
        session.wait(timeout=30)
        if not ray_cluster.node("127.0.0.3").running:
            ray_cluster.restart_node("127.0.0.3")
