"""Fan-out at scale, without nodes: per-node deadlines, bounded concurrency, the coverage
line, handshake pacing, and the typed target options the CLI hands the core."""

from __future__ import annotations

import threading
import time
from pathlib import Path

import paramiko
import pytest
from areal_console.cli import build_parser
from areal_console.commands.options import target_options
from areal_console.core.connection import ssh
from areal_console.core.connection.fleet import Fleet, NodeFailure, deadline_map
from areal_console.core.connection.pacing import StartupPacer
from areal_console.core.stacks.coverage import Coverage, NodeFailed, capture_coverage, short_reason
from areal_console.core.stacks.records import NodeError, RankStack, StackCapture
from areal_console.core.targets.options import TargetOptions
from areal_console.core.targets.resolve import NodeSpec

from tests.support.waits import wait_for


def test_a_node_past_its_deadline_is_overdue_and_the_rest_are_kept() -> None:
    never = threading.Event()  # the stuck node's call never ends by itself

    def work(item: str) -> str:
        if item == "stuck":
            never.wait(30)
        return item.upper()

    t0 = time.monotonic()
    results = deadline_map(work, ["a", "stuck", "b"], 8, 0.3, lambda x, s: f"late {x} {s:g}")
    elapsed = time.monotonic() - t0
    never.set()
    assert results == ["A", "late stuck 0.3", "B"]
    assert 0.3 <= elapsed < 3.0  # the deadline, not the stuck call's 30 s (10x bound)


def test_the_deadline_counts_from_a_nodes_turn_and_concurrency_is_bounded() -> None:
    running, peak, lock = [0], [0], threading.Lock()
    gate = threading.Barrier(2)  # two at a time, each waits for the other: never three

    def work(item: int) -> int:
        with lock:
            running[0] += 1
            peak[0] = max(peak[0], running[0])
        gate.wait(5)
        with lock:
            running[0] -= 1
        return item

    # Six items two at a time take three turns; each turn is well inside its own deadline.
    assert deadline_map(work, list(range(6)), 2, 5.0, lambda x, s: None) == list(range(6))
    assert peak[0] == 2


def test_fleet_fan_out_names_the_late_node_with_its_deadline() -> None:
    fleet = Fleet(
        [NodeSpec(name=n, transport="local") for n in ("n1", "n2")],
        node_timeout=0.2,
        max_parallel=2,
    )
    release = threading.Event()

    def call(session: object) -> str:
        if getattr(session, "name", "") == "n2":
            release.wait(30)
        return "ok"

    results = fleet.fan_out(call)  # type: ignore[arg-type]
    release.set()
    assert results["n1"] == "ok"
    late = results["n2"]
    assert isinstance(late, NodeFailure) and late.error.startswith("timeout 0.2 s:")
    assert short_reason(late.error) == "timeout 0.2 s"


@pytest.mark.parametrize(
    ("error", "reason"),
    [
        ("timeout 5 s: no answer within the node deadline (--node-timeout)", "timeout 5 s"),
        ("authentication failed for root@10.0.0.3:22 (tried /k)", "authentication"),
        ("ssh to root@n1:22 failed: no SSH answer within 10s (banner)", "timeout 10 s"),
        ("connection refused by 10.0.0.9:22 (is sshd running there?)", "refused"),
        ("WARNING: host key for n1 has CHANGED: ...", "host key"),
        ("agent on n3 exited with status 3", "agent on n3 exited with status 3"),
        ("agent on n3 did not start within 22.5 s under the shared srun step", "timeout 22.5 s"),
        ("agent did not start within 30s", "timeout 30 s"),
    ],
)
def test_short_reason(error: str, reason: str) -> None:
    assert short_reason(error) == reason


def _rank(node: str, rank: int, world: int, state: str = "ok") -> RankStack:
    return RankStack(node=node, pid=100 + rank, rank=rank, world_size=world, state=state)


def test_coverage_line_names_the_failed_nodes_and_counts_from_the_world_size() -> None:
    ranks = [_rank(f"n{1 + r // 8:03d}", r, 4096) for r in range(4080)]
    capture = StackCapture(
        captured_at="2026-11-29T00:00:00+00:00",
        samples=1,
        ranks=ranks,
        errors=[
            NodeError("n233", "authentication failed for root@n233:22 (tried k)"),
            NodeError("n017", "timeout 5 s: no answer within the node deadline"),
        ],
    )
    coverage = capture_coverage(capture)
    assert coverage.line() == (
        "4,080 of 4,096 ranks; 2 nodes failed: n017 (timeout 5 s), n233 (authentication)"
    )
    assert coverage.to_json() == {
        "ranks_captured": 4080,
        "ranks_expected": 4096,
        "nodes_failed": [
            {"node": "n017", "reason": "timeout 5 s"},
            {"node": "n233", "reason": "authentication"},
        ],
    }
    assert not coverage.complete


def test_coverage_without_world_size_counts_ranks_seen_and_cuts_long_lists() -> None:
    capture = StackCapture("t", 1, [_rank("a", 0, 0), _rank("a", 1, 0, state="error")])
    assert capture_coverage(capture).line() == "1 of 2 ranks"
    many = Coverage(0, 0, tuple(NodeFailed(f"n{i}", "refused") for i in range(10)))
    assert many.line().endswith("n7 (refused) and 2 more")


def test_pacer_holds_at_most_the_limit_and_says_once_that_nodes_wait() -> None:
    pacer = StartupPacer()
    heard: list[str] = []
    pacer.listen(heard.append)
    inside, peak, lock = [0], [0], threading.Lock()
    go = threading.Event()

    def handshake() -> None:
        with pacer.slot("login:22", 3):
            with lock:
                inside[0] += 1
                peak[0] = max(peak[0], inside[0])
            go.wait(5)
            with lock:
                inside[0] -= 1

    threads = [threading.Thread(target=handshake) for _ in range(10)]
    for t in threads:
        t.start()
    wait_for(lambda: bool(heard), timeout=10)  # the 4th waits: it says so first
    go.set()
    for t in threads:
        t.join(10)
    assert peak[0] == 3 and pacer.peak("login:22") == 3
    assert len(heard) == 1 and "login:22" in heard[0] and "MaxStartups" in heard[0]


def test_cli_options_become_one_typed_record_with_fleet_options() -> None:
    args = build_parser("stacks").parse_args(
        ["stacks", "--hosts", "n[1-4]", "--node-timeout", "5", "--fanout-concurrency", "16",
         "--max-startups", "4", "--ssh-config", "/tmp/cfg", "--accept-new-hosts"]
    )  # fmt: skip
    options = target_options(args)
    assert options is target_options(args)  # one record per command line
    assert options == TargetOptions(
        hosts="n[1-4]",
        node_timeout=5.0,
        fanout_concurrency=16,
        max_startups=4,
        ssh_config="/tmp/cfg",
        accept_new_hosts=True,
    )
    assert options.fleet_options() == {
        "accept_new_hosts": True,
        "connect_timeout": 10.0,
        "node_timeout": 5.0,
        "max_parallel": 16,
        "max_startups": 4,
        "ssh_config": "/tmp/cfg",
    }
    defaults = TargetOptions().fleet_options()
    assert (defaults["node_timeout"], defaults["max_parallel"], defaults["max_startups"]) == (
        60.0,
        64,
        8,
    )
    assert "fanout_tree" not in defaults  # flat unless asked


def test_the_tree_flags_reach_the_fleet_options() -> None:
    args = build_parser("stacks").parse_args(
        ["stacks", "--hosts", "n[1-64]", "--fanout-tree", "8", "--tree-ssh-config", "/n/cfg"]
    )
    options = target_options(args)
    assert (options.fanout_tree, options.tree_ssh_config) == (8, "/n/cfg")
    fleet = options.fleet_options()
    assert (fleet["fanout_tree"], fleet["tree_ssh_config"]) == (8, "/n/cfg")


def _big_config(tmp_path: Path, hosts: int) -> Path:
    blocks = [
        f"Host pad{i}\n    HostName 10.0.{i // 250}.{i % 250}\n    User u{i % 3}\n"
        for i in range(hosts)
    ]
    blocks += [
        "Host *.example\n    User bob\n    Port 2200\n",
        "Host pad7 !pad8 pad9\n    Port 2222\n",
        "Host gpu[12]\n    User brackets\n",
        "Host *\n    ConnectTimeout 5\n    IdentityFile ~/.ssh/k_%h\n",
    ]
    path = tmp_path / "ssh_config"
    path.write_text("".join(blocks))
    return path


def test_host_lookup_answers_as_paramiko_without_visiting_every_block(tmp_path: Path) -> None:
    config = ssh.load_ssh_config(_big_config(tmp_path, 512))
    for alias in ("pad7", "pad8", "pad9", "x.example", "pad511", "unknown", "pad0", "gpu1"):
        assert ssh.lookup_host(config, alias) == config.lookup(alias), alias


def test_ssh_config_and_known_hosts_are_read_once_per_version(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    path = _big_config(tmp_path, 64)
    parses: list[str] = []
    real = paramiko.SSHConfig.from_path
    monkeypatch.setattr(
        paramiko.SSHConfig, "from_path", lambda p: parses.append(p) or real(p), raising=True
    )
    configs: list[object] = []
    threads = [
        threading.Thread(target=lambda: configs.append(ssh.load_ssh_config(path)))
        for _ in range(16)
    ]
    for t in threads:
        t.start()
    for t in threads:
        t.join(30)
    assert len(parses) == 1 and all(c is configs[0] for c in configs)  # 16 nodes, one parse
    key = paramiko.Ed25519Key(filename=str(_keygen(tmp_path)))
    known = tmp_path / "known_hosts"
    known.write_text("".join(f"10.0.0.{i} ssh-ed25519 {key.get_base64()}\n" for i in range(200)))
    first = ssh.known_hosts_for([known, tmp_path / "absent"])
    assert ssh.known_hosts_for([known, tmp_path / "absent"]) is first  # shared, not re-read
    assert first.keys.lookup("10.0.0.7") is not None
    ssh.remember_host_key("new.example", key, known)  # the file changed: read again
    again = ssh.known_hosts_for([known, tmp_path / "absent"])
    assert again is not first and again.keys.lookup("new.example") is not None
    path.write_text(path.read_text() + "Host late\n    Port 2022\n")
    assert ssh.lookup_host(ssh.load_ssh_config(path), "late")["port"] == "2022"
    assert len(parses) == 2


def _keygen(tmp_path: Path) -> Path:
    import subprocess

    from tests.support.cluster import SSH_KEYGEN

    path = tmp_path / "key"
    subprocess.run(
        [SSH_KEYGEN, "-q", "-t", "ed25519", "-N", "", "-f", str(path)], check=True,
        capture_output=True,
    )  # fmt: skip
    return path
