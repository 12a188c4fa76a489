"""The SSH transport against real sshd nodes: config, jump hosts, host keys, auth, errors."""

from __future__ import annotations

import contextlib
import os
import signal
import socket
import subprocess
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
from areal_console.core.connection.client import AgentClient, AgentDisconnected
from areal_console.core.connection.fleet import Fleet, NodeSession
from areal_console.core.connection.ssh import (
    JUMPS,
    ChangedHostKey,
    SshError,
    UnknownHostKey,
    describe_route,
    open_ssh_channel,
)
from areal_console.core.targets.resolve import NodeSpec

from tests.support.cluster import SSH, SSH_KEYGEN, TestCluster, free_port, wait_for

pytestmark = pytest.mark.cluster


def hello_via(spec: NodeSpec, **options: object) -> dict[str, object]:
    """Open a channel, handshake, close; the agent's `hello`."""
    client = AgentClient(open_ssh_channel(spec, **options))  # type: ignore[arg-type]
    try:
        return client.start(timeout=30)
    finally:
        client.close()


def host_block(cluster: TestCluster, alias: str, node_index: int, extra: str = "") -> str:
    node = cluster.nodes[node_index]
    return (
        f"Host {alias}\n    HostName {node.address}\n    Port {node.port}\n    User root\n"
        f"    IdentityFile {cluster.identity}\n    IdentitiesOnly yes\n"
        f"    UserKnownHostsFile {cluster.known_hosts}\n{extra}"
    )


def ssh_keygen_fingerprint(pub: Path) -> str:
    out = subprocess.run(
        [SSH_KEYGEN, "-l", "-E", "sha256", "-f", str(pub)],
        capture_output=True,
        text=True,
        check=True,
    ).stdout
    return out.split()[1]


def test_each_node_runs_its_own_agent_in_its_own_namespace(live_cluster: TestCluster) -> None:
    hellos = [hello_via(n.spec(), **live_cluster.ssh_options()) for n in live_cluster.nodes[:2]]
    assert [h["hostname"] for h in hellos] == ["node1", "node2"]
    assert all(h["user"] == "root" and h["python"] for h in hellos)
    # The agent was shipped once per node and cached there by content hash.
    for node in live_cluster.nodes[:2]:
        assert list((node.home / ".cache" / "areal-console").glob("payload-*.pyz"))


def test_proxyjump_chain_reaches_target_through_jump_hosts(
    live_cluster: TestCluster, tmp_path: Path
) -> None:
    config = tmp_path / "ssh_config"
    config.write_text(
        live_cluster.ssh_config.read_text()
        + host_block(live_cluster, "behind-one", 2, "    ProxyJump node1\n")
        + host_block(live_cluster, "behind-two", 3, "    ProxyJump node1,node2\n")
        + host_block(live_cluster, "behind-nested", 2, "    ProxyJump behind-one\n")
    )
    options = {"ssh_config": str(config), "allow_agent": False}
    for alias, expected in (
        ("behind-one", "node3"),
        ("behind-two", "node4"),
        ("behind-nested", "node3"),
    ):
        spec = NodeSpec(name=alias, transport="ssh", host=alias)
        assert hello_via(spec, **options)["hostname"] == expected
    two = describe_route(NodeSpec(name="b", transport="ssh", host="behind-two"), str(config))
    n = live_cluster.nodes
    assert two == (
        f"root@{n[3].address}:{n[3].port} via root@{n[0].address}:{n[0].port}"
        f" -> root@{n[1].address}:{n[1].port}"
    )
    nested = describe_route(NodeSpec(name="b", transport="ssh", host="behind-nested"), str(config))
    assert nested.endswith(
        f"via root@{n[0].address}:{n[0].port} -> root@{n[2].address}:{n[2].port}"
    )


def our_connections_to(address: str, port: int) -> int:
    """TCP connections this process holds open to address:port (/proc/net/tcp + our fds)."""
    inodes = set()
    for fd in os.listdir("/proc/self/fd"):
        with contextlib.suppress(OSError):
            target = os.readlink(f"/proc/self/fd/{fd}")
            if target.startswith("socket:["):
                inodes.add(target[8:-1])
    a, b, c, d = (int(x) for x in address.split("."))
    remote = f"{d:02X}{c:02X}{b:02X}{a:02X}:{port:04X}"
    rows = [line.split() for line in Path("/proc/net/tcp").read_text().splitlines()[1:]]
    return sum(1 for r in rows if r[2] == remote and r[3] == "01" and r[9] in inodes)


def test_nodes_behind_one_jump_host_share_its_connection(
    live_cluster: TestCluster, tmp_path: Path
) -> None:
    config = tmp_path / "ssh_config"
    behind = [2, 3, 4]
    config.write_text(
        live_cluster.ssh_config.read_text()
        + "".join(
            host_block(live_cluster, f"behind{i}", i - 1, "    ProxyJump node1\n") for i in behind
        )
    )
    jump = live_cluster.nodes[0]
    before = our_connections_to(jump.address, jump.port)
    specs = [NodeSpec(name=f"b{i}", transport="ssh", host=f"behind{i}") for i in behind]
    fleet = Fleet(specs, ssh_config=str(config), allow_agent=False)
    try:
        hellos = fleet.connect_all()
        assert [h["hostname"] for h in hellos.values()] == [f"node{i}" for i in behind]
        assert JUMPS.connections() == 1
        assert our_connections_to(jump.address, jump.port) - before == 1
        fleet.session("b2").close()  # the others still ride on the jump connection
        assert fleet.session("b3").call("ping")["time"] > 0
    finally:
        fleet.close()
    assert JUMPS.connections() == 0
    assert our_connections_to(jump.address, jump.port) == before


def test_proxycommand_through_openssh(live_cluster: TestCluster, tmp_path: Path) -> None:
    config = tmp_path / "ssh_config"
    marker = tmp_path / "relay-used"
    relay = f"sh -c 'touch {marker}; exec {SSH} -F {live_cluster.ssh_config} -W %h:%p node1'"
    config.write_text(
        live_cluster.ssh_config.read_text()
        + host_block(live_cluster, "via-command", 1, f"    ProxyCommand {relay}\n")
    )
    spec = NodeSpec(name="v", transport="ssh", host="via-command")
    assert hello_via(spec, ssh_config=str(config), allow_agent=False)["hostname"] == "node2"
    assert marker.exists()


def test_jump_host_that_refuses_is_named(live_cluster: TestCluster, tmp_path: Path) -> None:
    dead_port = free_port("127.0.0.9")
    config = tmp_path / "ssh_config"
    config.write_text(
        live_cluster.ssh_config.read_text()
        + f"Host deadjump\n    HostName 127.0.0.9\n    Port {dead_port}\n"
        + host_block(live_cluster, "target", 0, "    ProxyJump deadjump\n")
    )
    spec = NodeSpec(name="t", transport="ssh", host="target")
    with pytest.raises(SshError, match=f"connection refused by 127.0.0.9:{dead_port}"):
        open_ssh_channel(spec, ssh_config=str(config), allow_agent=False)


def test_ssh_agent_keys(
    live_cluster: TestCluster, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    node = live_cluster.nodes[0]
    # No IdentityFile anywhere: the key comes from a real ssh-agent.
    spec = NodeSpec(name="n", transport="ssh", host=node.address, port=node.port, user="root")
    known = tmp_path / "known_hosts"
    known.write_text(node.host_key_line() + "\n")
    options = {"ssh_config": os.devnull, "known_hosts_file": str(known), "look_for_keys": False}
    sock = tmp_path / "agent.sock"
    agent = subprocess.Popen(["ssh-agent", "-D", "-a", str(sock)], stdout=subprocess.DEVNULL)
    try:
        wait_for(sock.exists, 10, "ssh-agent socket")
        monkeypatch.setenv("SSH_AUTH_SOCK", str(sock))
        subprocess.run(["ssh-add", str(live_cluster.identity)], check=True, capture_output=True)
        assert hello_via(spec, **options)["hostname"] == "node1"
        subprocess.run(["ssh-add", "-D"], check=True, capture_output=True)
        no_key = r"authentication failed for root@127\.0\.0\.2:\d+: no key to offer"
        with pytest.raises(SshError, match=no_key):
            hello_via(spec, **options)
    finally:
        agent.send_signal(signal.SIGTERM)
        agent.wait(timeout=10)


def test_wrong_key_is_an_auth_failure(live_cluster: TestCluster, tmp_path: Path) -> None:
    other = tmp_path / "other_key"
    subprocess.run([SSH_KEYGEN, "-q", "-t", "ed25519", "-N", "", "-f", str(other)], check=True)
    spec = live_cluster.nodes[0].spec(identity_file=str(other))
    with pytest.raises(SshError) as info:
        open_ssh_channel(spec, **live_cluster.ssh_options())
    message = str(info.value)
    assert message.startswith(
        f"authentication failed for root@127.0.0.2:{live_cluster.nodes[0].port}"
    )
    assert str(other) in message and "\n" not in message


def test_refused_port(live_cluster: TestCluster) -> None:
    port = free_port("127.0.0.9")
    spec = NodeSpec(name="x", transport="ssh", host="127.0.0.9", port=port)
    with pytest.raises(SshError, match=rf"^connection refused by 127.0.0.9:{port} \(is sshd"):
        open_ssh_channel(spec, ssh_config=os.devnull)


@pytest.fixture
def silent_listener() -> Iterator[int]:
    """A TCP port that accepts connections but never speaks SSH."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        s.listen(8)
        yield int(s.getsockname()[1])


def test_no_ssh_answer_times_out(silent_listener: int) -> None:
    spec = NodeSpec(name="x", transport="ssh", host="127.0.0.1", port=silent_listener)
    t0 = time.monotonic()
    with pytest.raises(SshError, match=r"no SSH answer within 0\.5s"):
        open_ssh_channel(spec, ssh_config=os.devnull, connect_timeout=0.5)
    assert time.monotonic() - t0 < 5  # 10x the timeout; paramiko's own banner wait is 15 s


@pytest.fixture
def unanswered_port() -> Iterator[int]:
    """A port whose accept queue is full: the kernel drops new SYNs, so connects hang."""
    with socket.socket() as server, socket.socket() as filler:
        server.bind(("127.0.0.1", 0))
        server.listen(0)
        port = int(server.getsockname()[1])
        filler.connect(("127.0.0.1", port))
        yield port


def test_tcp_connect_times_out(unanswered_port: int) -> None:
    spec = NodeSpec(name="x", transport="ssh", host="127.0.0.1", port=unanswered_port)
    t0 = time.monotonic()
    with pytest.raises(SshError) as info:
        open_ssh_channel(spec, ssh_config=os.devnull, connect_timeout=1.0)
    assert str(info.value) == f"connection to 127.0.0.1:{unanswered_port} timed out after 1s"
    assert 0.9 < time.monotonic() - t0 < 10  # 10x; the kernel's SYN retries take 127 s


def test_missing_python_is_explained(live_cluster: TestCluster) -> None:
    session = NodeSession(
        live_cluster.nodes[0].spec(python="python3.99"), **live_cluster.ssh_options()
    )
    with pytest.raises(AgentDisconnected):
        session.connect(timeout=15)
    assert session.state == "down"
    assert session.error is not None
    assert session.error.startswith("python3.99 not found on node1")
    assert "python3.99: command not found" in session.error


def test_unknown_host_key_refused_then_trusted(live_cluster: TestCluster, tmp_path: Path) -> None:
    node = live_cluster.nodes[1]
    config = tmp_path / "ssh_config"
    config.write_text(  # no UserKnownHostsFile: the node is unknown
        f"Host {node.name}\n    HostName {node.address}\n    Port {node.port}\n    User root\n"
        f"    IdentityFile {live_cluster.identity}\n"
    )
    console_known = Path(os.environ["AREAL_CONSOLE_DATA_DIR"]) / "known_hosts"
    expected = ssh_keygen_fingerprint(node.host_key.with_suffix(".pub"))
    session = NodeSession(node.spec(), ssh_config=str(config), allow_agent=False)
    with pytest.raises(AgentDisconnected):
        session.connect()
    key = session.unknown_host_key
    assert isinstance(key, UnknownHostKey)
    assert (key.host, key.key_type, key.fingerprint) == (
        f"[{node.address}]:{node.port}",
        "ssh-ed25519",
        expected,
    )
    assert session.error is not None and expected in session.error
    assert "--accept-new-hosts" in session.error
    assert session.status().unknown_host_key == expected
    assert not console_known.exists()

    session.trust_host_key()  # what the TUI does after the user confirms
    assert session.connect()["hostname"] == node.name
    assert console_known.read_text().startswith(f"[{node.address}]:{node.port} ssh-ed25519 ")
    session.close()
    # Remembered: a fresh session connects without being asked.
    again = NodeSession(node.spec(), ssh_config=str(config), allow_agent=False)
    assert again.connect()["hostname"] == node.name
    again.close()


def test_accept_new_hosts_remembers_key(live_cluster: TestCluster, tmp_path: Path) -> None:
    node = live_cluster.nodes[2]
    spec = NodeSpec(
        name="n",
        transport="ssh",
        host=node.address,
        port=node.port,
        user="root",
        identity_file=str(live_cluster.identity),
    )
    console_known = tmp_path / "console_known_hosts"
    options = {
        "ssh_config": os.devnull,
        "allow_agent": False,
        "known_hosts_file": str(console_known),
    }
    with pytest.raises(UnknownHostKey):
        open_ssh_channel(spec, **options)
    assert hello_via(spec, accept_new_hosts=True, **options)["hostname"] == node.name
    assert hello_via(spec, **options)["hostname"] == node.name
    assert len(console_known.read_text().splitlines()) == 1


def test_ssh_config_accept_new_is_honoured(live_cluster: TestCluster, tmp_path: Path) -> None:
    node = live_cluster.nodes[3]
    config = tmp_path / "ssh_config"
    config.write_text(
        f"Host {node.name}\n    HostName {node.address}\n    Port {node.port}\n    User root\n"
        f"    IdentityFile {live_cluster.identity}\n    StrictHostKeyChecking accept-new\n"
    )
    console_known = tmp_path / "console_known_hosts"
    spec = node.spec()
    options = {"ssh_config": str(config), "allow_agent": False}
    assert hello_via(spec, known_hosts_file=str(console_known), **options)["hostname"] == node.name
    assert console_known.read_text().startswith(f"[{node.address}]:{node.port} ssh-ed25519 ")


def test_changed_host_key_is_always_refused(live_cluster: TestCluster, tmp_path: Path) -> None:
    node = live_cluster.nodes[0]
    impostor = tmp_path / "impostor"
    subprocess.run([SSH_KEYGEN, "-q", "-t", "ed25519", "-N", "", "-f", str(impostor)], check=True)
    key_type, key = impostor.with_suffix(".pub").read_text().split()[:2]
    known = tmp_path / "known_hosts"
    known.write_text(f"[{node.address}]:{node.port} {key_type} {key}\n")
    spec = NodeSpec(
        name="n",
        transport="ssh",
        host=node.address,
        port=node.port,
        user="root",
        identity_file=str(live_cluster.identity),
    )
    offered = ssh_keygen_fingerprint(node.host_key.with_suffix(".pub"))
    for accept in (False, True):
        with pytest.raises(ChangedHostKey) as info:
            open_ssh_channel(
                spec,
                ssh_config=os.devnull,
                allow_agent=False,
                known_hosts_file=str(known),
                accept_new_hosts=accept,
            )
        message = str(info.value)
        assert "has CHANGED" in message and offered in message
        assert ssh_keygen_fingerprint(impostor.with_suffix(".pub")) in message
        assert "\n" not in message
    assert known.read_text().count("\n") == 1  # nothing was added


def test_known_hosts_markers_revoke_one_host_and_fail_no_other(
    live_cluster: TestCluster, tmp_path: Path
) -> None:
    """`@revoked` refuses that host, clearly; `@cert-authority` is skipped with one warning;
    the other nodes connect (paramiko alone rejects the whole file). Listed in
    test_hostile_inputs.py (item 4)."""
    import json

    from conftest import run_cli

    revoked = live_cluster.nodes[1]
    ca_key = revoked.host_key.with_suffix(".pub").read_text().split()[:2]
    known = tmp_path / "known_hosts"
    known.write_text(
        f"@cert-authority *.example.org {ca_key[0]} {ca_key[1]}\n"
        + "".join(n.host_key_line() + "\n" for n in live_cluster.nodes)
        + f"@revoked {revoked.host_key_line()}\n"
        + f"@cert-authority *.other.org {ca_key[0]} {ca_key[1]}\n"
    )
    config = tmp_path / "ssh_config"
    config.write_text(
        live_cluster.ssh_config.read_text().replace(str(live_cluster.known_hosts), str(known))
    )
    result = run_cli(
        "nodes", "--hosts", live_cluster.hosts_arg(), "--ssh-config", str(config), "--json"
    )
    assert result.returncode == 3, result.stderr
    states = {n["name"]: (n["state"], n["error"]) for n in json.loads(result.stdout)["nodes"]}
    assert {name: s for name, (s, _) in states.items()} == {
        n.name: ("down" if n is revoked else "up") for n in live_cluster.nodes
    }
    error = states[revoked.name][1]
    assert f"host key for [{revoked.address}]:{revoked.port}" in error
    line = len(live_cluster.nodes) + 2  # after the first CA line and one line per node
    assert f"is REVOKED in {known}:{line}: refusing to connect" in error
    warnings = [ln for ln in result.stderr.splitlines() if "@cert-authority" in ln]
    assert warnings == [
        f"warning: {known}: 2 @cert-authority line(s) skipped: host certificates are not "
        "checked, so hosts known only through a CA are treated as unknown"
    ]
    # A revoked key is never learnt either, even with --accept-new-hosts.
    known.write_text(f"@revoked {revoked.host_key_line()}\n")
    again = run_cli(
        "nodes", "--hosts", revoked.name, "--ssh-config", str(config), "--accept-new-hosts"
    )
    assert again.returncode == 1 and "is REVOKED" in again.stderr


async def test_known_hosts_warning_is_shown_once_in_the_console(
    live_cluster: TestCluster, tmp_path: Path
) -> None:
    """The console shows a skipped `@cert-authority` line as a warning, once (reconnects read
    the file again), and the nodes still come up. Listed in test_hostile_inputs.py (item 4)."""
    from areal_console.app import ConsoleApp
    from areal_console.widgets.node_table import NodeTable

    from tests.support.waits import until

    node = live_cluster.nodes[0]
    ca_key = node.host_key.with_suffix(".pub").read_text().split()[:2]
    known = tmp_path / "known_hosts"
    known.write_text(
        f"@cert-authority *.example.org {ca_key[0]} {ca_key[1]}\n" + node.host_key_line() + "\n"
    )
    config = tmp_path / "ssh_config"
    config.write_text(
        live_cluster.ssh_config.read_text().replace(str(live_cluster.known_hosts), str(known))
    )
    app = ConsoleApp(Fleet([node.spec()], ssh_config=str(config), allow_agent=False),
                     refresh_interval=0.3)  # fmt: skip

    def warnings() -> list[str]:
        return [str(n.message) for n in app._notifications if "@cert-authority" in str(n.message)]

    async with app.run_test(size=(150, 40)) as pilot:
        await until(pilot, lambda: warnings(), what="the known_hosts warning")
        table = app.screen.query_one(NodeTable)
        await until(pilot, lambda: str(table.get_cell(node.name, "state")) == "up", what="up")
        await pilot.pause(1.5)  # two more ticks of the notes timer: nothing is said twice
        assert warnings() == [
            f"{known}: 1 @cert-authority line(s) skipped: host certificates are not checked, "
            "so hosts known only through a CA are treated as unknown"
        ]


def test_connect_timeout_bounds_the_agent_start(live_cluster: TestCluster, tmp_path: Path) -> None:
    """A node whose python never answers (here a stand-in that sleeps): --connect-timeout
    bounds the wait for the agent, not a fixed 30 s. Listed in test_hostile_inputs.py (12)."""
    from conftest import run_cli

    slow = tmp_path / "slow-python"
    slow.write_text("#!/bin/sh\nexec sleep 120\n")
    slow.chmod(0o755)
    node = live_cluster.nodes[0]
    inventory = tmp_path / "cluster.yaml"
    inventory.write_text(f"nodes:\n  - name: {node.name}\n    python: {slow}\n")
    t0 = time.monotonic()
    result = run_cli(
        "nodes", "--inventory", str(inventory), "--ssh-config", str(live_cluster.ssh_config),
        "--connect-timeout", "2",
    )  # fmt: skip
    elapsed = time.monotonic() - t0
    assert result.returncode == 1, result.stderr
    assert result.stderr.strip() == f"error: {node.name}: agent did not start within 2s"
    assert elapsed < 20, elapsed  # 2 s plus start-up, not the fixed 30 s it was


def test_handshakes_through_a_strict_login_host_are_paced(
    live_cluster: TestCluster, tmp_path: Path
) -> None:
    """A login host whose sshd drops every unauthenticated connection beyond two
    (`MaxStartups 2:100:2`), in front of four nodes reached with `ProxyCommand ssh -W`
    (a new connection to the login host per node): paced at two handshakes in flight, every
    node connects, and the wait is said once."""
    from areal_console.core.connection.pacing import PACER
    from areal_console.core.connection.ssh import gateway, load_ssh_config, resolve_route

    login = TestCluster(tmp_path / "login", nodes=1, first_address=40)
    login.start()
    try:
        node = login.nodes[0]
        node.config.write_text(
            node.config.read_text().replace("MaxStartups 100:30:200", "MaxStartups 2:100:2")
        )
        node.restart()
        relay = f"{SSH} -F {login.ssh_config} -W %h:%p {node.name}"
        config = tmp_path / "ssh_config"
        config.write_text(
            "".join(
                host_block(live_cluster, f"paced{i}", i, f"    ProxyCommand {relay}\n")
                for i in range(len(live_cluster.nodes))
            )
        )
        specs = [
            NodeSpec(name=f"p{i}", transport="ssh", host=f"paced{i}")
            for i in range(len(live_cluster.nodes))
        ]
        gate = gateway(resolve_route(specs[0], load_ssh_config(config)))
        assert gate == f"ProxyCommand {relay}"  # one gateway for every node
        PACER.reset(gate)
        heard: list[str] = []
        stop = PACER.listen(heard.append)
        fleet = Fleet(specs, ssh_config=str(config), allow_agent=False, max_startups=2)
        try:
            hellos = fleet.connect_all()
        finally:
            fleet.close()
            stop()
        assert [h["hostname"] for h in hellos.values()] == [n.name for n in live_cluster.nodes]
        assert PACER.peak(gate) == 2
        assert len(heard) == 1 and "2 in flight" in heard[0]
    finally:
        login.stop()


def test_nodes_sharing_a_home_get_the_payload_once(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Three nodes with one home (an NFS home, as on most clusters) and one with its own,
    none with the agent cached: the first node to ask gets the payload, the two others
    sharing its home find it in their cache on a second look; the fourth, whose home
    lacks it, gets it too. Sent compressed, and found whole."""
    from areal_console.core.connection import client as client_module
    from areal_console.core.connection.payload import node_payload, payload_name

    from tests.support.cluster import skip_reason

    if skip_reason():  # as the shared cluster fixture does
        pytest.skip(skip_reason())
    uploads = client_module.PayloadUploads()
    monkeypatch.setattr(client_module, "UPLOADS", uploads)
    shared = tmp_path / "shared-home"
    shared.mkdir()
    cluster = TestCluster(tmp_path / "homes", nodes=4, first_address=44)
    cluster.start()
    try:
        for node in cluster.nodes[:3]:
            node.config.write_text(
                node.config.read_text().replace(f"HOME={node.home}", f"HOME={shared}")
            )
            node.restart()
        fleet = Fleet(cluster.specs()[:3], **cluster.ssh_options())
        try:
            hellos = fleet.connect_all()
            assert [h["hostname"] for h in hellos.values()] == ["node1", "node2", "node3"]
        finally:
            fleet.close()
        assert uploads.sent == 1
        cached = shared / ".cache" / "areal-console" / payload_name(node_payload().sha256)
        assert cached.read_bytes() == node_payload().data
        alone = Fleet(cluster.specs()[3:], **cluster.ssh_options())
        try:
            assert alone.connect_all()["node4"]["hostname"] == "node4"
        finally:
            alone.close()
        assert uploads.sent == 2  # looked again, still missing: sent
        own = cluster.nodes[3].home / ".cache" / "areal-console"
        assert (own / payload_name(node_payload().sha256)).read_bytes() == node_payload().data
    finally:
        cluster.stop()
