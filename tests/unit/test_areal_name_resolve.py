"""`--areal EXPERIMENT/TRIAL`: an AReaL job by its name, from records written the way
AReaL writes them (tests/support/areal_name_resolve.py) to an nfs record root and to a real etcd
(Debian's `etcd-server`, started here), with real listeners standing in for workers."""

from __future__ import annotations

import json
import os
import shutil
import socket
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
from areal_console.core.common.errors import UsageError, UserError
from areal_console.core.connection.client import AgentError
from areal_console.core.connection.fleet import NodeSession
from areal_console.core.stacks.diagnose import AREAL_TIMEOUT, GROUP_TIMEOUT, timeout_advice
from areal_console.core.stacks.merge import analyse
from areal_console.core.stacks.records import Frame, RankStack, StackCapture, Thread
from areal_console.core.targets.areal import probe_addresses, probe_via, resolve_areal_targets
from areal_console.core.targets.name_resolve import (
    EtcdRegistry,
    JobName,
    NfsRegistry,
    find_job,
    parse_job_name,
    records_from_pairs,
)
from areal_console.core.targets.specs import local_node

from tests.conftest import cli_env, run_cli
from tests.support.areal_logfmt import write_run
from tests.support.areal_name_resolve import etcd_put, gen_server_key, nfs_add, worker_key
from tests.support.cluster import free_port
from tests.support.nobody import NOBODY, shared_tmp
from tests.support.waits import wait_for

USER = "root" if os.geteuid() == 0 else os.environ.get("USER", "")


@pytest.fixture
def listener() -> Iterator[tuple[str, int]]:
    """A live worker address (something accepts connections there)."""
    sock = socket.socket()
    sock.bind(("127.0.0.1", 0))
    sock.listen(8)
    yield "127.0.0.1", sock.getsockname()[1]
    sock.close()


def dead_port() -> int:
    return free_port()  # bound and released: nothing listens there


def test_job_names_parse_with_and_without_user() -> None:
    name = parse_job_name("exp/t1", default_user="alice")
    assert (name.user, name.experiment, name.trial, name.user_given) == (
        "alice",
        "exp",
        "t1",
        False,
    )
    assert parse_job_name("bob/exp/t1").key == "bob/exp/t1"
    assert parse_job_name("exp/t1").slurm_prefix == "exp_t1:"
    for bad in ("exp", "a/b/c/d", "exp/", "../x", "a/../b"):
        with pytest.raises(UsageError):
            parse_job_name(bad)


def test_nfs_records_as_areal_writes_them_become_nodes_with_states(
    tmp_path: Path, listener: tuple[str, int]
) -> None:
    root = tmp_path / "nr"
    host, port = listener
    nfs_add(str(root), worker_key(USER, "exp", "t1", "actor", 0), f"{host}:{port}")
    nfs_add(str(root), worker_key(USER, "exp", "t1", "actor", 1), f"127.0.0.1:{dead_port()}")
    nfs_add(str(root), gen_server_key(USER, "exp", "t1"), f"{host}:{port}")
    nfs_add(str(root), worker_key(USER, "exp", "other", "actor", 0), f"{host}:{port}")
    plan = resolve_areal_targets("exp/t1", nfs_root=str(root))
    by_label = {e.entry.label: e for e in plan.entries}
    assert by_label["actor/0"].state == "ok"
    assert by_label["actor/1"].state == "stale"
    assert "the worker is gone" in (by_label["actor/1"].reason or "")
    assert [e.entry.kind for e in plan.entries] == ["worker", "worker", "gen_server"]
    assert [s.transport for s in plan.specs] == ["local"]  # 127.0.0.1 is this machine
    assert plan.warnings() == [
        f"actor/1 at {by_label['actor/1'].entry.value}: stale ({by_label['actor/1'].reason})"
    ]


def test_addresses_elsewhere_are_ssh_nodes_in_record_order(tmp_path: Path) -> None:
    root = tmp_path / "nr"
    nfs_add(str(root), worker_key(USER, "e", "t", "actor", 1), "192.0.2.2:5001")
    nfs_add(str(root), worker_key(USER, "e", "t", "actor", 0), "192.0.2.1:5000")
    nfs_add(str(root), worker_key(USER, "e", "t", "rollout", 0), "[fd00::3]:5002")
    plan = resolve_areal_targets("e/t", nfs_root=str(root), probe_timeout=0.3)
    assert [(s.name, s.transport) for s in plan.specs] == [
        ("192.0.2.1", "ssh"),
        ("192.0.2.2", "ssh"),
        ("fd00::3", "ssh"),
    ]
    assert all(e.state == "stale" for e in plan.entries)  # TEST-NET, ULA: nothing there


@pytest.mark.skipif(shutil.which("ssh") is None, reason="needs OpenSSH's ssh as the ProxyCommand")
def test_a_records_host_never_adds_options_to_an_ssh_proxy_command(tmp_path: Path) -> None:
    """A record's value (any writer of etcd or Ray's KV, or the job's user) names a
    "host" with a space and `-oProxyCommand=...`: with the common `ProxyCommand ssh -W
    %h:%p bastion` in ssh_config it ran a command here. It is no address now."""
    marker = tmp_path / "ran"
    evil = f"[x:1 -oProxyCommand=touch${{IFS}}{marker}]:22"
    root = tmp_path / "nr"
    nfs_add(str(root), worker_key(USER, "e", "t", "actor", 0), evil)
    nfs_add(str(root), worker_key(USER, "e", "t", "actor", 1), "-oProxyCommand=x:22")
    config = tmp_path / "ssh_config"
    config.write_text("Host *\n  ProxyCommand ssh -F /dev/null -W %h:%p bastion.invalid\n")
    done = run_cli("nodes", "--areal", "e/t", "--name-resolve-root", str(root),
                   "--ssh-config", str(config), "--connect-timeout", "3", timeout=60)  # fmt: skip
    assert not list(tmp_path.glob("ran*")), done.stdout + done.stderr
    assert done.stderr.count("not a host:port address") == 2, done.stderr
    plan = resolve_areal_targets("e/t", nfs_root=str(root), probe_timeout=0.3)
    assert plan.specs == [] and [e.state for e in plan.entries] == ["stale", "stale"]
    # Whatever else names a host (Ray's node table with --ray-ssh), SSH refuses it too.
    import paramiko
    from areal_console.core.connection.ssh import SshError, resolve_route
    from areal_console.core.targets.specs import NodeSpec

    with pytest.raises(SshError, match="not a host name or address"):
        resolve_route(NodeSpec(name="n", transport="ssh", host="x -oA=b"), paramiko.SSHConfig())


@pytest.mark.parametrize(
    ("host", "ok"),
    [("gpu-node-07", True), ("node_1.example.com", True), ("10.0.0.1", True), ("fd00::3", True),
     ("fe80::1%eth0", True), ("-oProxyCommand=x", False), ("x:1 -oA=b", False), ("a b", False),
     ("fe80::1%-o", False), ("..", False), ("", False), ("h\x1b]2;t", False)],
)  # fmt: skip
def test_what_counts_as_a_host(host: str, ok: bool) -> None:
    from areal_console.core.targets.specs import is_host

    assert is_host(host) is ok


def test_key_value_pairs_outside_the_job_or_oversized_are_refused() -> None:
    """What etcd or Ray's KV actor answers is anyone's (no owner per key): pairs of
    another prefix, huge keys and values are refusals, the job's own pairs entries."""
    pairs = [
        ("u/e/t/workers/actor/0", "10.0.0.1:5000"),
        ("u/e/tx/workers/actor/0", "10.0.0.2:5000"),  # another job's prefix
        ("u/e/t/workers/" + "a" * 5000, "10.0.0.3:5000"),
        ("u/e/t/workers/actor/1", "1" * 5000),
    ]
    records = records_from_pairs(JobName("u", "e", "t"), "ray:x", pairs)
    assert [(e.key, e.host, e.port) for e in records.entries] == [
        ("u/e/t/workers/actor/0", "10.0.0.1", 5000)
    ]
    assert len(records.refused) == 3 and all(len(r) < 300 for r in records.refused)


def test_probe_of_unanswering_addresses_is_bounded() -> None:
    # An unrouted ULA address never answers: the probe gives up on all at once.
    addresses = [("fd00::3", 5000 + i) for i in range(300)]
    start = time.monotonic()
    verdicts = probe_addresses(addresses, timeout=0.5)
    elapsed = time.monotonic() - start
    assert len(verdicts) == 300 and all(verdicts.values())
    # Two batches of 256, each bounded by 0.5 s (about 1 s); one address at a time would
    # take 150 s: a 10x bound both ways.
    assert elapsed < 15.0
    # Records anyone may write (etcd, Ray's KV) can name 100,000 addresses: at most
    # MAX_PROBED are tried, the rest say so.
    from areal_node.tcp_probe import MAX_PROBED

    many = [("fd00::3", 1 + i) for i in range(MAX_PROBED + 500)]
    start = time.monotonic()
    verdicts = probe_addresses(many, timeout=0.1)
    assert time.monotonic() - start < 10.0  # 8 batches of 0.1 s, with a 10x margin
    skipped = [why for why in verdicts.values() if why and "not probed" in why]
    assert len(verdicts) == len(many) and len(skipped) == 500


def test_unknown_job_lists_what_exists_and_other_users(tmp_path: Path) -> None:
    root = tmp_path / "nr"
    nfs_add(str(root), worker_key(USER, "exp", "t1", "actor", 0), "127.0.0.1:1")
    nfs_add(str(root), worker_key(USER, "exp2", "t9", "actor", 0), "127.0.0.1:1")
    nfs_add(str(root), worker_key("bob", "shared", "t0", "actor", 0), "127.0.0.1:1")
    result = run_cli("nodes", "--areal", "exp/nope", "--name-resolve-root", str(root))
    assert result.returncode == 1
    assert result.stderr == (
        f"error: no AReaL job exp/nope under {root} (found: exp/t1, exp2/t9)\n"
    )
    result = run_cli("nodes", "--areal", "shared/t0", "--name-resolve-root", str(root))
    assert result.returncode == 1
    assert "users with that name: bob (give USER/shared/t0)" in result.stderr
    assert result.stderr.count("\n") == 1
    missing = run_cli("nodes", "--areal", "e/t", "--name-resolve-root", str(tmp_path / "none"))
    assert missing.returncode == 1
    assert missing.stderr == f"error: no AReaL job e/t under {tmp_path / 'none'} (found: none)\n"


WITHOUT_DAC = ["setpriv", "--bounding-set=-dac_override,-dac_read_search"]
needs_root = pytest.mark.skipif(
    os.geteuid() != 0 or not shutil.which("setpriv"), reason="needs root and setpriv"
)


@pytest.fixture
def public_tmp() -> Iterator[Path]:
    """A directory under /tmp that other users can reach, as AReaL's default root is."""
    with shared_tmp("areal-nr-", mode=0o755) as path:
        yield path


def plant_as_nobody(root: Path, name: str, value: str) -> subprocess.CompletedProcess[str]:
    """Another user writes an ENTRY the way AReaL does (a temporary file, then a rename)."""
    entry = root / name / "ENTRY"
    script = 'mkdir -p "$1" && printf %s "$3" > "$2.tmp.x" && mv "$2.tmp.x" "$2"'
    return subprocess.run(
        [*NOBODY, "sh", "-c", script, "sh", str(entry.parent), str(entry), value],
        capture_output=True, text=True, timeout=30, check=False,
    )  # fmt: skip


@needs_root
def test_an_entry_planted_by_another_user_is_refused(
    public_tmp: Path, listener: tuple[str, int]
) -> None:
    root = public_tmp / "name_resolve"
    host, port = listener
    nfs_add(str(root), worker_key(USER, "exp", "t1", "actor", 0), f"{host}:{port}")
    for d in [root, *root.rglob("*")]:
        if d.is_dir():
            d.chmod(0o1777)  # like /tmp: anyone may create names in it
    planted = worker_key(USER, "exp", "t1", "actor", 1)
    made = plant_as_nobody(root, planted, "10.9.9.9:22")
    assert made.returncode == 0, made.stderr
    assert (root / planted / "ENTRY").stat().st_uid != 0
    records = NfsRegistry(str(root)).job(parse_job_name(f"{USER}/exp/t1"))
    assert [e.label for e in records.entries] == ["actor/0"]
    assert records.refused == [f"{planted}: ENTRY owned by nobody, not {USER}"]
    result = run_cli("nodes", "--areal", "exp/t1", "--name-resolve-root", str(root), "--json")
    assert result.returncode == 3  # partial: the planted entry is reported, never used
    assert f"warning: entry refused: {planted}: ENTRY owned by nobody" in result.stderr
    doc = json.loads(result.stdout)
    assert [e["key"] for e in doc["areal"]["entries"]] == [
        worker_key(USER, "exp", "t1", "actor", 0)
    ]
    # A job whose only entries are planted has nothing to trust: an error, no node list.
    assert (
        plant_as_nobody(root, worker_key(USER, "exp", "t2", "actor", 0), "10.9.9.9:22").returncode
        == 0
    )
    result = run_cli("nodes", "--areal", "exp/t2", "--name-resolve-root", str(root))
    assert result.returncode == 1
    assert result.stderr.startswith(f"error: AReaL job {USER}/exp/t2 under {root}: no entry")
    with pytest.raises(UserError, match="no entry to trust"):
        find_job(NfsRegistry(str(root)), parse_job_name(f"{USER}/exp/t2"))


def test_links_and_special_files_are_never_followed(tmp_path: Path) -> None:
    root = tmp_path / "nr"
    nfs_add(str(root), worker_key(USER, "exp", "t1", "actor", 0), "127.0.0.1:1")
    secret = tmp_path / "secret"
    secret.write_text("10.0.0.1:22")
    linked = root / worker_key(USER, "exp", "t1", "actor", 1)
    linked.mkdir(parents=True)
    (linked / "ENTRY").symlink_to(secret)
    fifo = root / worker_key(USER, "exp", "t1", "actor", 2)
    fifo.mkdir(parents=True)
    os.mkfifo(fifo / "ENTRY")  # opening it must not block
    outside = tmp_path / "elsewhere" / "workers" / "actor" / "3"
    outside.mkdir(parents=True)
    (outside / "ENTRY").write_text("10.0.0.3:22")
    (root / USER / "exp" / "t1" / "more").symlink_to(tmp_path / "elsewhere")
    records = NfsRegistry(str(root)).job(parse_job_name(f"{USER}/exp/t1"))
    assert [e.label for e in records.entries] == ["actor/0"]
    why = dict(r.split(": ", 1) for r in records.refused)
    assert why == {
        worker_key(USER, "exp", "t1", "actor", 1): "cannot open ENTRY (Too many levels of "
        "symbolic links)",
        worker_key(USER, "exp", "t1", "actor", 2): "ENTRY is not a regular file",
    }


@needs_root
def test_an_unreadable_root_is_one_line(tmp_path: Path) -> None:
    if subprocess.run([*WITHOUT_DAC, "true"], capture_output=True).returncode != 0:
        pytest.skip("setpriv cannot drop capabilities here")
    root = tmp_path / "nr"
    nfs_add(str(root), worker_key(USER, "exp", "t1", "actor", 0), "127.0.0.1:1")
    os.chown(root, 65534, 65534)
    root.chmod(0o700)  # nobody's, closed: root without DAC override can't read it
    result = subprocess.run(
        [*WITHOUT_DAC, sys.executable, "-m", "areal_console", "nodes", "--areal", "exp/t1",
         "--name-resolve-root", str(root)],
        capture_output=True, text=True, timeout=60, env=cli_env(), check=False,
    )  # fmt: skip
    assert result.returncode == 1
    assert result.stderr == f"error: cannot read name-resolve root {root}: permission denied\n"


def test_stale_records_warn_exit_3_and_do_not_hang(
    tmp_path: Path, listener: tuple[str, int]
) -> None:
    root = tmp_path / "nr"
    host, port = listener
    nfs_add(str(root), worker_key(USER, "exp", "t1", "actor", 0), f"{host}:{port}")
    gone = dead_port()
    nfs_add(str(root), worker_key(USER, "exp", "t1", "actor", 1), f"127.0.0.1:{gone}")
    start = time.monotonic()
    result = run_cli("nodes", "--areal", "exp/t1", "--name-resolve-root", str(root), "--json")
    assert time.monotonic() - start < 30
    assert result.returncode == 3, result.stderr
    assert (
        f"warning: actor/1 at 127.0.0.1:{gone}: stale (nothing listens on 127.0.0.1:{gone}: "
        "the worker is gone)"
    ) in result.stderr
    entries = json.loads(result.stdout)["areal"]["entries"]
    assert [(e["role"], e["index"], e["state"]) for e in entries] == [
        ("actor", 0, "ok"),
        ("actor", 1, "stale"),
    ]


def test_metrics_open_the_log_dir_from_fileroot(tmp_path: Path, listener: tuple[str, int]) -> None:
    root = tmp_path / "nr"
    host, port = listener
    nfs_add(str(root), worker_key(USER, "exp", "t1", "actor", 0), f"{host}:{port}")
    fileroot = tmp_path / "fileroot"
    write_run(fileroot / "logs" / USER / "exp" / "t1", steps=3)
    result = run_cli(
        "metrics", "--areal", "exp/t1", "--name-resolve-root", str(root),
        "--fileroot", str(fileroot), "--json",
    )  # fmt: skip
    assert result.returncode == 0, result.stderr
    assert f"log directory {fileroot}/logs/{USER}/exp/t1" in result.stderr
    assert json.loads(result.stdout)["steps"] == [0, 1, 2]


@pytest.mark.skipif(os.geteuid() != 0, reason="needs root to give a file to nobody")
def test_metrics_from_fileroot_read_only_the_jobs_users_files(
    tmp_path: Path, listener: tuple[str, int]
) -> None:
    """A log another user planted in the job's log directory is not read as the job's."""
    import pwd

    root = tmp_path / "nr"
    host, port = listener
    nfs_add(str(root), worker_key(USER, "exp", "t2", "actor", 0), f"{host}:{port}")
    fileroot = tmp_path / "fileroot"
    run = fileroot / "logs" / USER / "exp" / "t2"
    write_run(run, steps=3)
    nobody = pwd.getpwnam("nobody").pw_uid
    for log in run.glob("*.log"):
        os.chown(log, nobody, -1)
    result = run_cli(
        "metrics", "--areal", "exp/t2", "--name-resolve-root", str(root),
        "--fileroot", str(fileroot), "--json",
    )  # fmt: skip
    assert result.returncode == 1, (result.returncode, result.stdout[:200])
    assert result.stderr.count("\n") <= 2 and "Traceback" not in result.stderr


def test_metrics_find_the_log_dir_from_the_workers_fileroot(tmp_path: Path) -> None:
    """Without --fileroot: the job's rpc_server carries `--fileroot` on its command line."""
    root = tmp_path / "nr"
    fileroot = tmp_path / "fr"
    write_run(fileroot / "logs" / USER / "exp" / "t7", steps=2)
    stub = Path(__file__).parents[1] / "jobs" / "areal_stub"
    port = free_port()
    worker = subprocess.Popen(
        [sys.executable, "-m", "areal.infra.rpc.rpc_server", "--port", str(port),
         "--experiment-name", "exp", "--trial-name", "t7", "--role", "actor",
         "--worker-index", "0", "--nfs-record-root", str(root), "--fileroot", str(fileroot)],
        env={**os.environ, "PYTHONPATH": str(stub), "AREAL_STUB_REGISTER": "1"},
        stdout=subprocess.DEVNULL,
    )  # fmt: skip
    try:
        wait_for(lambda: (root / USER / "exp" / "t7").exists(), 30, "the worker's record")
        result = run_cli("metrics", "--areal", "exp/t7", "--name-resolve-root", str(root), "--json")
        assert result.returncode == 0, result.stderr
        assert json.loads(result.stdout)["steps"] == [0, 1]
        assert f"{fileroot}/logs/{USER}/exp/t7" in result.stderr
    finally:
        worker.terminate()
        worker.wait(10)


# --------------------------------------------------------------------------------------
# etcd3


@pytest.fixture(scope="session")
def etcd(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    """A real etcd on free loopback ports; its client address."""
    binary = shutil.which("etcd")
    if binary is None:
        pytest.skip("etcd is missing: install Debian's etcd-server")
    data = tmp_path_factory.mktemp("etcd")
    client, peer = free_port(), free_port()
    address = f"127.0.0.1:{client}"
    with open(data / "etcd.log", "wb") as log:
        proc = subprocess.Popen(
            [binary, "--name", "test", "--data-dir", str(data / "data"),
             "--listen-client-urls", f"http://{address}",
             "--advertise-client-urls", f"http://{address}",
             "--listen-peer-urls", f"http://127.0.0.1:{peer}",
             "--initial-advertise-peer-urls", f"http://127.0.0.1:{peer}",
             "--initial-cluster", f"test=http://127.0.0.1:{peer}"],
            stdout=log, stderr=subprocess.STDOUT,
        )  # fmt: skip
    try:

        def up() -> bool:
            try:
                EtcdRegistry(address, timeout=1).trials("nobody-here")
                return True
            except UserError:
                return proc.poll() is not None

        wait_for(up, 30, "etcd to answer")
        if proc.poll() is not None:
            pytest.fail(f"etcd did not start: {(data / 'etcd.log').read_text()[-2000:]}")
        yield address
    finally:
        proc.terminate()
        proc.wait(10)


def test_etcd3_records_through_the_json_gateway(etcd: str, listener: tuple[str, int]) -> None:
    host, port = listener
    etcd_put(etcd, worker_key(USER, "exp", "e1", "actor", 0), f"{host}:{port}")
    etcd_put(etcd, worker_key(USER, "exp", "e1", "actor", 1), f"127.0.0.1:{dead_port()}")
    etcd_put(etcd, worker_key(USER, "exp", "e10", "actor", 0), f"{host}:{port}")  # a prefix twin
    etcd_put(etcd, worker_key("carol", "exp", "e2", "ref", 0), f"{host}:{port}")
    plan = resolve_areal_targets("exp/e1", etcd3=etcd)
    assert plan.source == f"etcd3:{etcd}"
    assert [(e.entry.label, e.state) for e in plan.entries] == [
        ("actor/0", "ok"),
        ("actor/1", "stale"),
    ]
    registry = EtcdRegistry(etcd)
    assert registry.users_with("exp", "e2") == ["carol"]
    assert set(registry.trials(USER)) >= {"exp/e1", "exp/e10"}
    result = run_cli("nodes", "--areal", "exp/e2", "--etcd3", etcd)
    assert result.returncode == 1
    assert "users with that name: carol (give USER/exp/e2)" in result.stderr
    result = run_cli("nodes", "--areal", "exp/e1", "--etcd3", etcd, "--json")
    assert result.returncode == 3
    assert json.loads(result.stdout)["areal"]["source"] == f"etcd3:{etcd}"


def test_etcd_records_another_writer_made_are_refusals_in_one_short_line(etcd: str) -> None:
    """Anyone who may write to the job's etcd: a record whose host is an SSH option, a
    trial named with 20,000 characters, a value of 1 MB. One short line, no node."""
    etcd_put(etcd, worker_key("dave", "exp", "h1", "actor", 0), "[x:1 -oProxyCommand=id]:22")
    etcd_put(etcd, worker_key("dave", "exp", "h1", "actor", 1), "1" * (1 << 20))
    etcd_put(etcd, worker_key("dave", "exp", "t" * 20000, "actor", 0), "127.0.0.1:1")
    plan = resolve_areal_targets("dave/exp/h1", etcd3=etcd, probe_timeout=0.3)
    assert plan.specs == [] and [e.state for e in plan.entries] == ["stale"]
    assert plan.refused == ["dave/exp/h1/workers/actor/1: value larger than 4096 bytes"]
    result = run_cli("nodes", "--areal", "dave/exp/nope", "--etcd3", etcd)
    assert result.returncode == 1 and len(result.stderr) < 1000, len(result.stderr)


def test_etcd_down_is_one_line() -> None:
    result = run_cli("nodes", "--areal", "exp/t1", "--etcd3", f"127.0.0.1:{dead_port()}")
    assert result.returncode == 1
    assert result.stderr.startswith("error: etcd3 at 127.0.0.1:")
    assert "cannot connect" in result.stderr and result.stderr.count("\n") == 1


def test_options_that_need_areal_are_usage_errors() -> None:
    result = run_cli("nodes", "--etcd3", "127.0.0.1:1")
    assert result.returncode == 2 and result.stderr == "error: --etcd3 goes with --areal\n"


# --------------------------------------------------------------------------------------
# Timeouts as they are


def _capture(job: str | None, file: str) -> StackCapture:
    frames = (Frame("all_reduce", "torch/distributed/distributed_c10d.py", 10),
              Frame("train_step", file, 5))  # fmt: skip
    ranks = [
        RankStack("n1", 100 + r, rank=r, world_size=2, job=job,
                  threads=[Thread(name="MainThread", tid=1, is_main=True, frames=frames)])
        for r in range(2)
    ]  # fmt: skip
    return StackCapture(captured_at="2026-01-01T00:00:00", samples=1, ranks=ranks)


def test_timeout_advice_says_areals_7200_s_and_never_nccl_timeout() -> None:
    areal_worker = analyse(_capture("exp/t1", "/app/train.py"))
    areal_frames = analyse(_capture(None, "/site-packages/areal/engine/fsdp_engine.py"))
    plain = analyse(_capture(None, "/app/train.py"))
    assert timeout_advice(areal_worker) == AREAL_TIMEOUT
    assert timeout_advice(areal_frames) == AREAL_TIMEOUT
    assert timeout_advice(plain) == GROUP_TIMEOUT
    assert "7200 s" in AREAL_TIMEOUT and "DIST_GROUP_DEFAULT_TIMEOUT" in AREAL_TIMEOUT
    assert "init_process_group" in GROUP_TIMEOUT
    from areal_console.core.stacks.diagnose import diagnose

    for analysis in (areal_worker, plain):
        for line in diagnose(analysis).suggestions:
            assert "NCCL_TIMEOUT" not in line or "not read" in line or "changes nothing" in line


@pytest.fixture
def local_agent() -> Iterator[NodeSession]:
    """A real agent as a thread of this process, as `--name-resolve-via` asks one."""
    session = NodeSession(local_node(), in_process=True, probe_gpus=False)
    yield session
    session.close()


def test_an_address_unreachable_here_is_probed_from_the_via_node(
    local_agent: NodeSession, listener: tuple[str, int]
) -> None:
    dead = ("127.0.0.1", dead_port())
    gone = f"nothing listens on 127.0.0.1:{dead[1]}: the worker is gone"
    # As this machine saw them: the live worker behind a network it cannot reach.
    mine = {listener: "no route to host", dead: gone, ("127.0.0.1", 1): None}
    out = probe_via(local_agent, mine, 1.0)
    assert out == {listener: None, dead: gone}  # the node reaches one; both miss the other


def test_the_name_resolve_op_refuses_bad_arguments(local_agent: NodeSession) -> None:
    bad = [
        ("name_resolve", {"root": "rel/dir", "user": "u", "experiment": "e", "trial": "t"}),
        ("name_resolve", {"root": "/tmp", "user": "..", "experiment": "e", "trial": "t"}),
        ("name_resolve", {"root": "/tmp", "user": "u", "experiment": "a/b", "trial": "t"}),
        ("tcp_probe", {"addresses": [["127.0.0.1", 0]]}),
        ("tcp_probe", {"addresses": [["127.0.0.1", 1]], "timeout": 60}),
    ]
    for op, args in bad:
        with pytest.raises(AgentError):
            local_agent.call(op, args)


@needs_root
def test_the_name_resolve_op_reads_as_the_console_does(
    local_agent: NodeSession, public_tmp: Path, listener: tuple[str, int]
) -> None:
    root = public_tmp / "nr-op"
    nfs_add(str(root), worker_key(USER, "exp", "t1", "actor", 0), f"{listener[0]}:{listener[1]}")
    planted = nfs_add(str(root), worker_key(USER, "exp", "t1", "actor", 1), "127.0.0.9:1")
    os.chown(planted, 65534, 65534)
    args = {"root": str(root), "user": USER, "experiment": "exp", "trial": "t1"}
    answer = local_agent.call("name_resolve", args)
    here = NfsRegistry(str(root)).job(parse_job_name(f"{USER}/exp/t1"))
    assert answer["exists"] is True
    assert [(e["key"], e["value"]) for e in answer["entries"]] == [
        (e.key, e.value) for e in here.entries
    ]
    assert answer["refused"] == here.refused and len(here.refused) == 1
    missing = local_agent.call("name_resolve", {**args, "trial": "t9"})
    assert missing["entries"] == [] and missing["trials"] == ["exp/t1"]
