"""`--hosts` parsing and cluster.yaml inventories, including errors that name file and line."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest
from areal_console.core.common.errors import UserError
from areal_console.core.targets.inventory import expand_hostlist, load_inventory, parse_hosts

REPO = Path(__file__).resolve().parents[2]


def test_parse_hosts_users_ports_and_ranges() -> None:
    specs = parse_hosts("alice@gpu[01-03]:2222, login,[::1]:2200,bob@10.0.0.7")
    assert [s.name for s in specs] == ["gpu01", "gpu02", "gpu03", "login", "::1", "10.0.0.7"]
    assert {(s.user, s.port) for s in specs[:3]} == {("alice", 2222)}
    assert specs[3].user is None and specs[3].port is None
    assert specs[4].host == "::1" and specs[4].port == 2200
    assert specs[5].user == "bob"
    assert all(s.transport == "ssh" for s in specs)
    assert specs[0].address == "alice@gpu01:2222"


def test_same_host_on_two_ports_gets_distinct_names() -> None:
    specs = parse_hosts("127.0.0.1:2201,127.0.0.1:2202")
    assert [s.name for s in specs] == ["127.0.0.1:2201", "127.0.0.1:2202"]


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ("node:99999", "must be 1-65535"),
        ("node:ssh", "bad port"),
        ("@node", "empty user"),
        ("a,a", "listed twice"),
        (" , ", "names no host"),
        ("gpu[5-2]", "runs backwards"),
        ("node:22.7", "bad port"),
        ("n[1-", "without a matching"),
        ("n[a-b]", "not a number"),
    ],
)
def test_bad_hosts_are_user_errors(text: str, message: str) -> None:
    with pytest.raises(UserError, match=message):
        parse_hosts(text)


def test_expand_hostlist_keeps_zero_padding_and_plain_names() -> None:
    assert expand_hostlist("n[8-11]") == ["n8", "n9", "n10", "n11"]
    assert expand_hostlist("n[008-010].dc") == ["n008.dc", "n009.dc", "n010.dc"]
    assert expand_hostlist("plain") == ["plain"]


INVENTORY = """\
defaults:
  user: alice
  jump: login.example.org
  python: /opt/py/bin/python3
nodes:
  - gpu-[001-002]
  - name: gpu-003
    host: 10.0.0.3
    port: 2222
    identity_file: ~/.ssh/cluster
    groups: [rollout]
  - name: direct
    host: 10.0.0.9
    jump: none
    user: bob
groups:
  train: [gpu-001, gpu-002]
  everything: ["gpu-00[1-3]", direct]
"""


def write(tmp_path: Path, text: str) -> Path:
    path = tmp_path / "cluster.yaml"
    path.write_text(text)
    return path


def test_inventory_defaults_fields_and_groups(tmp_path: Path) -> None:
    specs = {s.name: s for s in load_inventory(write(tmp_path, INVENTORY))}
    assert list(specs) == ["gpu-001", "gpu-002", "gpu-003", "direct"]
    g1, g3, direct = specs["gpu-001"], specs["gpu-003"], specs["direct"]
    assert (g1.host, g1.user, g1.proxy_jump, g1.python) == (
        "gpu-001",
        "alice",
        "login.example.org",
        "/opt/py/bin/python3",
    )
    assert (g3.host, g3.port, g3.identity_file) == ("10.0.0.3", 2222, "~/.ssh/cluster")
    assert set(g3.groups) == {"rollout", "everything"}
    assert set(g1.groups) == {"train", "everything"}
    assert (direct.user, direct.proxy_jump) == ("bob", "none")


def test_inventory_group_selection(tmp_path: Path) -> None:
    path = write(tmp_path, INVENTORY)
    assert [s.name for s in load_inventory(path, groups=["train"])] == ["gpu-001", "gpu-002"]
    assert [s.name for s in load_inventory(path, groups=["rollout", "train"])] == [
        "gpu-001",
        "gpu-002",
        "gpu-003",
    ]
    with pytest.raises(UserError, match="no group nope"):
        load_inventory(path, groups=["nope"])


def test_inventory_nodes_as_mapping(tmp_path: Path) -> None:
    path = write(tmp_path, "nodes:\n  a:\n  b: {host: 10.1.1.1, port: 22}\n")
    specs = load_inventory(path)
    assert [(s.name, s.host, s.port) for s in specs] == [("a", "a", None), ("b", "10.1.1.1", 22)]


@pytest.mark.parametrize(
    ("text", "line", "message"),
    [
        ("nodes:\n  - a\n  - name: b\n    host: x: y\n", 4, "invalid YAML: mapping values"),
        ("nodes:\n  - a\n  - name: b\n    host: [oops\n", 5, "flow sequence on line 4"),
        ("nodes:\n  - name: b\n    hots: 10.0.0.1\n", 3, "unknown node field 'hots'"),
        ("nodes:\n  - a\n  - name: b\n    port: 70000\n", 4, "must be 1-65535"),
        ("defaults:\n  user: x\n  colour: red\nnodes: [a]\n", 3, "unknown defaults field"),
        ("nodes:\n  - a\ngroups:\n  train: [a, ghost]\n", 4, "unknown node 'ghost'"),
        ("nodes:\n  - a\n  - 17.5\n", 3, "host string or a mapping"),
        ("- a\n- b\n", 1, "expected a mapping"),
        ("defaults: {}\n", 1, "no 'nodes' section"),
        ("nodes:\n  - a\n  - a\n", 2, "listed twice"),
    ],
)
def test_malformed_inventory_names_file_and_line(
    tmp_path: Path, text: str, line: int, message: str
) -> None:
    path = write(tmp_path, text)
    with pytest.raises(UserError) as info:
        load_inventory(path)
    assert str(info.value).startswith(f"{path}:{line}: ")
    assert message in str(info.value)


def test_missing_inventory_file(tmp_path: Path) -> None:
    with pytest.raises(UserError, match="does not exist"):
        load_inventory(tmp_path / "nope.yaml")


def test_cli_reports_malformed_inventory_in_one_line(tmp_path: Path) -> None:
    path = write(tmp_path, "nodes:\n  - name: a\n    port: twenty\n")
    env = dict(os.environ, PYTHONPATH=f"{REPO / 'tui'}{os.pathsep}{REPO / 'agents'}")
    proc = subprocess.run(
        [sys.executable, "-m", "areal_console", "nodes", "--inventory", str(path), "--json"],
        capture_output=True,
        text=True,
        env=env,
        timeout=60,
        check=False,
    )
    assert proc.returncode == 1, proc.stderr
    assert (
        proc.stderr.strip()
        == f"error: {path}:3: bad port 'twenty' in 'node': must be a whole number"
    )
    assert proc.stdout == ""
