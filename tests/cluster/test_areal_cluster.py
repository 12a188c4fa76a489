"""`--areal` on the sshd test cluster: an AReaL job whose workers run on two nodes, each
`bash -c "stdbuf -oL python3 -m areal.infra.rpc.rpc_server ... 2>&1 | tee -a LOG"` as
AReaL's schedulers start them (areal/infra/scheduler/local.py:777-831 at cbff54d6),
registering `host:port` in an nfs record root the way run_server does."""

from __future__ import annotations

import json
import os
import shlex
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path

import pytest
from conftest import JOBS, run_cli, wait_for

from tests.support.areal_logfmt import write_run
from tests.support.cluster import ClusterNode, TestCluster

pytestmark = [pytest.mark.timeout(240), pytest.mark.slow]

USER = "root" if os.geteuid() == 0 else os.environ.get("USER", "")
EXPERIMENT, TRIAL = "exp", "ssh1"


@dataclass
class ClusterJob:
    root: Path
    fileroot: Path
    ssh_config: Path
    groups: dict[str, int] = field(default_factory=dict)  # node -> the worker's process group


def start_worker(node: ClusterNode, job: ClusterJob, index: int) -> int:
    """One worker and its wrappers on `node`, detached; the id of its process group."""
    worker = (
        f"PYTHONPATH={JOBS / 'areal_stub'} AREAL_STUB_REGISTER=1 stdbuf -oL python3 -m "
        f"areal.infra.rpc.rpc_server --host {node.address} --port 0 "
        f"--experiment-name {EXPERIMENT} --trial-name {TRIAL} --role actor "
        f"--worker-index {index} --name-resolve-type nfs --nfs-record-root {job.root} "
        f"--etcd3-addr localhost:2379 --fileroot {job.fileroot} "
        f"2>&1 | tee -a {job.fileroot}/actor-{index}.log"
    )
    command = f"setsid bash -c {shlex.quote(worker)} >/dev/null 2>&1 < /dev/null & echo $!"
    result = node.run(command)
    assert result.returncode == 0, result.stderr
    return int(result.stdout.strip())


@pytest.fixture(scope="module")
def cluster_job(
    cluster: TestCluster, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[ClusterJob]:
    base = tmp_path_factory.mktemp("areal-cluster")
    job = ClusterJob(base / "name_resolve", base / "fileroot", base / "ssh_config")
    job.fileroot.mkdir()
    # The user's ssh_config, as a cluster user has one: the workers' addresses as hosts.
    text = cluster.ssh_config.read_text()
    for n in cluster.nodes:
        text = text.replace(f"Host {n.name}\n", f"Host {n.name} {n.address}\n")
    job.ssh_config.write_text(text)
    write_run(job.fileroot / "logs" / USER / EXPERIMENT / TRIAL, steps=4)
    nodes = cluster.nodes[:2]
    for node in nodes:
        if not node.running:
            node.start()
    for index, node in enumerate(nodes):
        job.groups[node.name] = start_worker(node, job, index)
    workers = job.root / USER / EXPERIMENT / TRIAL / "workers" / "actor"
    try:
        wait_for(lambda: len(list(workers.glob("*/ENTRY"))) == 2, 60, "both workers' records")
        yield job
    finally:
        for name, group in job.groups.items():
            cluster.node(name).run(f"kill -- -{group}")


def areal(job: ClusterJob, *args: str) -> list[str]:
    return [*args, "--areal", f"{EXPERIMENT}/{TRIAL}", "--name-resolve-root", str(job.root),
            "--ssh-config", str(job.ssh_config)]  # fmt: skip


def test_areal_job_on_two_nodes(cluster: TestCluster, cluster_job: ClusterJob) -> None:
    result = run_cli(*areal(cluster_job, "nodes", "--json"))
    assert result.returncode == 0, result.stderr
    doc = json.loads(result.stdout)
    addresses = [n.address for n in cluster.nodes[:2]]
    assert [n["name"] for n in doc["nodes"]] == addresses
    assert [n["state"] for n in doc["nodes"]] == ["up", "up"]
    for index, node in enumerate(doc["nodes"]):
        roles = sorted(p["role"] for p in node["processes"])
        assert roles[0] == "actor" and roles.count("actor") == 1, node["processes"]
        assert set(roles[1:]) == {"wrapper"}  # bash -c and tee around the worker
        worker = next(p for p in node["processes"] if p["role"] == "actor")
        # The world size counts the role's workers over every node (2), not per node.
        assert (worker["worker_index"], worker["rank"], worker["world_size"]) == (index, index, 2)
        assert all(p["job"] == f"{EXPERIMENT}/{TRIAL}" for p in node["processes"])
    entries = doc["areal"]["entries"]
    assert [(e["role"], e["index"], e["state"]) for e in entries] == [
        ("actor", 0, "ok"),
        ("actor", 1, "ok"),
    ]


def test_metrics_find_the_log_dir_on_the_nodes(cluster_job: ClusterJob) -> None:
    result = run_cli(*areal(cluster_job, "metrics", "--json"))
    assert result.returncode == 0, result.stderr
    assert json.loads(result.stdout)["steps"] == [0, 1, 2, 3]
    assert f"{cluster_job.fileroot}/logs/{USER}/{EXPERIMENT}/{TRIAL}" in result.stderr


REPO = Path(__file__).resolve().parents[2]


def copy_records_on(node: ClusterNode, source: Path, root: str) -> None:
    """On `node`: each record under `source` written under `root` as AReaL's nfs writer
    writes it (tests/support/areal_name_resolve.py), plus a record planted by `nobody`."""
    script = (
        "import os, sys, pathlib\n"
        f"sys.path.insert(0, {str(REPO)!r})\n"
        "from tests.support.areal_name_resolve import nfs_add, worker_key\n"
        f"src, root = pathlib.Path({str(source)!r}), {root!r}\n"
        "for entry in src.rglob('ENTRY'):\n"
        "    nfs_add(root, str(entry.parent.relative_to(src)), entry.read_text())\n"
        f"path = nfs_add(root, worker_key({USER!r}, {EXPERIMENT!r}, {TRIAL!r}, 'actor', 2),\n"
        "               '127.0.0.9:1')\n"
        "os.chown(path, 65534, 65534)\n"
    )
    result = node.run(f"python3 -c {shlex.quote(script)}")
    assert result.returncode == 0, result.stderr


def test_a_root_only_a_node_sees(
    cluster: TestCluster, cluster_job: ClusterJob, tmp_path: Path
) -> None:
    """The record root is a tmpfs mounted in node2's mount namespace only: the console
    reads it through node2's agent (`--name-resolve-via node2`)."""
    node2 = cluster.nodes[1]
    mount = tmp_path / "cluster-nfs"  # an empty directory here; a tmpfs on node2
    mount.mkdir()
    result = node2.run(f"mount -t tmpfs areal-nfs {mount}")
    assert result.returncode == 0, result.stderr
    try:
        root = f"{mount}/name_resolve"
        copy_records_on(node2, cluster_job.root, root)
        assert not os.path.exists(root)  # not visible here
        base = ["nodes", "--json", "--areal", f"{EXPERIMENT}/{TRIAL}", "--ssh-config",
                str(cluster_job.ssh_config), "--name-resolve-root", root]  # fmt: skip
        here = run_cli(*base)
        assert here.returncode == 1
        assert (
            here.stderr == f"error: no AReaL job {EXPERIMENT}/{TRIAL} under {root} (found: none)\n"
        )

        result = run_cli(*base, "--name-resolve-via", "node2")
        assert result.returncode == 3, result.stderr  # partial: the planted entry is refused
        doc = json.loads(result.stdout)
        assert doc["areal"]["source"] == f"nfs:node2:{root}"
        entries = doc["areal"]["entries"]
        assert [(e["role"], e["index"], e["state"]) for e in entries] == [
            ("actor", 0, "ok"),
            ("actor", 1, "ok"),
        ]
        key = f"{USER}/{EXPERIMENT}/{TRIAL}/workers/actor/2"
        assert doc["areal"]["refused"] == [f"{key}: ENTRY owned by nobody, not {USER}"]
        assert f"warning: entry refused: {key}: ENTRY owned by nobody, not {USER}" in result.stderr
        assert [n["name"] for n in doc["nodes"]] == [n.address for n in cluster.nodes[:2]]
        assert [n["state"] for n in doc["nodes"]] == ["up", "up"]
        roles = [p["role"] for n in doc["nodes"] for p in n["processes"] if p["role"] != "wrapper"]
        assert roles == ["actor", "actor"]

        # Bad input: one line, exit 1.
        unknown = run_cli(*base, "--name-resolve-via", "node9", "--connect-timeout", "5")
        assert unknown.returncode == 1
        assert unknown.stderr.startswith("error: --name-resolve-via node9: cannot reach it (")
        assert unknown.stderr.count("\n") == 1
        missing = run_cli(*base[:-1], f"{mount}/nothing", "--name-resolve-via", "node2")
        assert missing.returncode == 1
        assert missing.stderr == (
            f"error: name-resolve root {mount}/nothing does not exist on node2\n"
        )
    finally:
        node2.run(f"umount {mount}")


def test_a_worker_gone_is_stale_exit_3(cluster: TestCluster, cluster_job: ClusterJob) -> None:
    node2 = cluster.nodes[1]
    node2.run(f"kill -- -{cluster_job.groups.pop(node2.name)}")
    entry = cluster_job.root / USER / EXPERIMENT / TRIAL / "workers" / "actor" / "1" / "ENTRY"
    value = entry.read_text()  # the dead worker's record stays, as AReaL leaves it
    result = run_cli(*areal(cluster_job, "nodes", "--json"))
    assert result.returncode == 3, result.stderr
    assert (
        f"warning: actor/1 at {value}: stale (nothing listens on {value}: the worker is gone)"
        in result.stderr
    )
    doc = json.loads(result.stdout)
    assert [n["state"] for n in doc["nodes"]] == ["up", "up"]  # the node answers; the worker not
    states = {f"{e['role']}/{e['index']}": e["state"] for e in doc["areal"]["entries"]}
    assert states == {"actor/0": "ok", "actor/1": "stale"}
