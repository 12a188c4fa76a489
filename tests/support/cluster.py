"""A real multi-node test cluster on one machine: one `sshd` per node, each in its own
PID + UTS + mount namespace, listening on 127.0.0.2, 127.0.0.3, ...

Plain classes and functions, so pytest fixtures and bench scripts use them alike:

    with TestCluster(tmp_dir, nodes=4) as cluster:
        job = cluster.start_gloo_job(ranks_per_node=2)   # script=GLOO_RECV_SCRIPT, ...
        samples = cluster.fleet().call_all("sample")       # each node: its own ranks
        job.stop()

`GLOO_HANG_SCRIPT` (default) leaves rank 0 in plain Python while the others wait in
`dist.barrier()`; `GLOO_RECV_SCRIPT` leaves every rank in `dist.recv`. Pass any script
that prints `ready <rank>` once it has joined the process group.

Every process started over SSH on a node lives in that node's PID namespace, so each node
sees only its own ranks. The cluster writes its own ssh config, known_hosts and identity
under its directory; the real `~/.ssh` is never read or written by it. Each node gets its
own `HOME` (via sshd's `SetEnv`), so the agent cache on a node is per node, as on a real
cluster. Stopping a node kills its namespace init, which takes down everything inside.
"""

from __future__ import annotations

import atexit
import contextlib
import os
import selectors
import shlex
import shutil
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from types import TracebackType
from typing import Any

from areal_console.core.connection.fleet import Fleet
from areal_console.core.targets.resolve import NodeSpec

from tests.support.waits import wait_for

SSHD = "/usr/sbin/sshd"
SSH_KEYGEN = shutil.which("ssh-keygen") or "/usr/bin/ssh-keygen"
SSH = shutil.which("ssh") or "/usr/bin/ssh"
PRIVSEP_DIR = Path("/run/sshd")  # Debian's sshd refuses to start without it
FIRST_ADDRESS = 2  # node1 is 127.0.0.2 (127.0.0.1 stays the console's)


def skip_reason() -> str | None:
    """Why a cluster cannot run here, or None when it can."""
    if os.geteuid() != 0:
        return "the sshd test cluster needs root (namespaces, sshd)"
    for tool, path in (("sshd", SSHD), ("ssh-keygen", SSH_KEYGEN), ("ssh", SSH)):
        if not os.path.exists(path):
            return f"{tool} is missing: install openssh-server and openssh-client"
    if not shutil.which("unshare") or not shutil.which("setsid"):
        return "unshare/setsid (util-linux) are missing"
    return None


def free_port(address: str = "127.0.0.1") -> int:
    with socket.socket() as s:
        s.bind((address, 0))
        return int(s.getsockname()[1])


def _keygen(path: Path, comment: str) -> None:
    subprocess.run(
        [SSH_KEYGEN, "-q", "-t", "ed25519", "-N", "", "-C", comment, "-f", str(path)],
        check=True,
        capture_output=True,
    )


def _port_open(address: str, port: int) -> bool:
    try:
        with socket.create_connection((address, port), timeout=0.5) as s:
            s.settimeout(1.0)
            return s.recv(4).startswith(b"SSH-")  # sshd's banner, not just any listener
    except OSError:
        return False


@dataclass
class ClusterNode:
    """One sshd "node" in its own namespaces."""

    index: int  # 1-based
    address: str
    port: int
    root: Path
    cluster: TestCluster
    proc: subprocess.Popen[bytes] | None = field(default=None, repr=False)

    @property
    def name(self) -> str:
        return f"node{self.index}"

    @property
    def home(self) -> Path:
        return self.root / "home"

    @property
    def config(self) -> Path:
        return self.root / "sshd_config"

    @property
    def host_key(self) -> Path:
        return self.root / "ssh_host_ed25519_key"

    def host_key_line(self, address: str | None = None) -> str:
        """This node's known_hosts line (`[addr]:port type key`)."""
        key_type, key = self.host_key.with_suffix(".pub").read_text().split()[:2]
        return f"[{address or self.address}]:{self.port} {key_type} {key}"

    def write_config(self) -> None:
        self.root.mkdir(parents=True, exist_ok=True)
        self.home.mkdir(exist_ok=True)
        if not self.host_key.exists():
            _keygen(self.host_key, self.name)
        path_dirs = [os.path.dirname(sys.executable), "/usr/local/bin", "/usr/bin", "/bin"]
        self.config.write_text(
            "\n".join(
                [
                    f"ListenAddress {self.address}",
                    f"Port {self.port}",
                    f"HostKey {self.host_key}",
                    f"AuthorizedKeysFile {self.cluster.authorized_keys}",
                    f"PidFile {self.root / 'sshd.pid'}",
                    "PasswordAuthentication no",
                    "KbdInteractiveAuthentication no",
                    "PermitRootLogin prohibit-password",
                    "UsePAM no",
                    "StrictModes no",
                    "UseDNS no",
                    "PrintMotd no",
                    "LogLevel ERROR",
                    "MaxStartups 100:30:200",
                    "MaxSessions 100",
                    # The node's own home (agent cache) and the test Python as its python3.
                    f"SetEnv HOME={self.home} PATH={':'.join(path_dirs)}",
                    "Subsystem sftp internal-sftp",
                    "",
                ]
            )
        )

    def start(self, timeout: float = 20.0) -> None:
        """Start sshd in fresh namespaces and wait until it answers with an SSH banner."""
        if self.running:
            return
        PRIVSEP_DIR.mkdir(mode=0o755, parents=True, exist_ok=True)
        inner = f"hostname {self.name}; exec {SSHD} -D -e -f {shlex.quote(str(self.config))}"
        log = open(self.root / "sshd.log", "ab")  # noqa: SIM115 - handed to the child
        try:
            self.proc = subprocess.Popen(
                [
                    "setsid",
                    "unshare",
                    "--pid",
                    "--uts",
                    "--mount",
                    "--fork",
                    "--mount-proc",
                    "--kill-child",
                    "sh",
                    "-c",
                    inner,
                ],
                stdin=subprocess.DEVNULL,
                stdout=log,
                stderr=log,
            )
        finally:
            log.close()
        proc = self.proc

        def up() -> bool:
            if proc.poll() is not None:
                tail = (self.root / "sshd.log").read_text(errors="replace").strip()[-500:]
                raise RuntimeError(f"sshd for {self.name} exited with {proc.returncode}: {tail}")
            return _port_open(self.address, self.port)

        wait_for(up, timeout, f"sshd on {self.name} ({self.address}:{self.port})")

    @property
    def running(self) -> bool:
        return self.proc is not None and self.proc.poll() is None

    @property
    def init_pid(self) -> int | None:
        """The PID (in our namespace) of this node's namespace init (its sshd)."""
        if self.proc is None:
            return None
        try:
            children = Path(f"/proc/{self.proc.pid}/task/{self.proc.pid}/children").read_text()
        except OSError:
            return None
        pids = [int(p) for p in children.split()]
        return pids[0] if pids else None

    def stop(self) -> None:
        """Kill the namespace init: the kernel then kills every process of this node."""
        if self.proc is None:
            return
        init = self.init_pid
        if init is not None:
            with contextlib.suppress(ProcessLookupError):
                os.kill(init, signal.SIGKILL)
        try:
            self.proc.wait(timeout=10)
        except subprocess.TimeoutExpired:
            self.proc.kill()  # --kill-child takes the namespace with it
            self.proc.wait(timeout=10)
        self.proc = None

    def restart(self, timeout: float = 20.0) -> None:
        self.stop()
        self.start(timeout)

    # running things on the node with the OpenSSH client (independent of the console)
    def ssh_argv(self, command: str) -> list[str]:
        return [SSH, "-F", str(self.cluster.ssh_config), self.name, command]

    def run(self, command: str, timeout: float = 30.0) -> subprocess.CompletedProcess[str]:
        return subprocess.run(
            self.ssh_argv(command), capture_output=True, text=True, timeout=timeout, check=False
        )

    def spec(self, python: str | None = None, **overrides: Any) -> NodeSpec:
        """A console node spec naming this node by its ssh-config alias."""
        fields: dict[str, Any] = {"name": self.name, "transport": "ssh", "host": self.name}
        if python:
            fields["python"] = python
        fields.update(overrides)
        return NodeSpec(**fields)


class TestCluster:
    """N sshd nodes plus the client-side files (ssh config, identity, known_hosts)."""

    __test__ = False  # not a pytest test class

    def __init__(self, root: Path | str, nodes: int = 3, first_address: int = FIRST_ADDRESS):
        self.root = Path(root)
        self.root.mkdir(parents=True, exist_ok=True)
        self.identity = self.root / "id_ed25519"
        self.authorized_keys = self.root / "authorized_keys"
        self.known_hosts = self.root / "known_hosts"
        self.ssh_config = self.root / "ssh_config"
        self.nodes: list[ClusterNode] = []
        for i in range(1, nodes + 1):
            address = f"127.0.0.{first_address + i - 1}"
            self.nodes.append(
                ClusterNode(i, address, free_port(address), self.root / f"node{i}", self)
            )

    # lifecycle ---------------------------------------------------------------------------
    def start(self, timeout: float = 30.0) -> TestCluster:
        reason = skip_reason()
        if reason:
            raise RuntimeError(reason)
        if not self.identity.exists():
            _keygen(self.identity, "areal-console-test")
        self.authorized_keys.write_text(self.identity.with_suffix(".pub").read_text())
        for node in self.nodes:
            node.write_config()
        self.write_known_hosts()
        self.write_ssh_config()
        atexit.register(self.stop)  # also on an interrupted run: no orphaned sshd nodes
        try:
            for node in self.nodes:
                node.start(timeout)
        except BaseException:
            self.stop()
            raise
        return self

    def stop(self) -> None:
        for node in self.nodes:
            node.stop()
        atexit.unregister(self.stop)

    def __enter__(self) -> TestCluster:
        return self.start()

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.stop()

    # client-side files -------------------------------------------------------------------
    def write_known_hosts(self) -> None:
        self.known_hosts.write_text("".join(n.host_key_line() + "\n" for n in self.nodes))

    def write_ssh_config(self) -> None:
        blocks = []
        for node in self.nodes:
            blocks.append(
                "\n".join(
                    [
                        f"Host {node.name}",
                        f"    HostName {node.address}",
                        f"    Port {node.port}",
                        "    User root",
                        f"    IdentityFile {self.identity}",
                        "    IdentitiesOnly yes",
                        f"    UserKnownHostsFile {self.known_hosts}",
                        "    StrictHostKeyChecking yes",
                        "    BatchMode yes",
                        "    ConnectTimeout 5",
                        "",
                    ]
                )
            )
        self.ssh_config.write_text("\n".join(blocks))

    def specs(self, python: str | None = None) -> list[NodeSpec]:
        return [n.spec(python) for n in self.nodes]

    def hosts_arg(self) -> str:
        """The `--hosts` value naming every node by alias."""
        return ",".join(n.name for n in self.nodes)

    def ssh_options(self) -> dict[str, Any]:
        """Options for `Fleet`/`open_ssh_channel` that use this cluster's ssh config."""
        return {"ssh_config": str(self.ssh_config), "allow_agent": False}

    def fleet(self, python: str | None = None, **options: Any) -> Fleet:
        """A console `Fleet` over every node, using this cluster's ssh config."""
        return Fleet(self.specs(python), **{**self.ssh_options(), **options})

    def env(self, base: dict[str, str] | None = None) -> dict[str, str]:
        """Environment for a console subprocess (CLI) aimed at this cluster."""
        env = dict(os.environ if base is None else base)
        env["AREAL_CONSOLE_SSH_CONFIG"] = str(self.ssh_config)
        env.pop("SSH_AUTH_SOCK", None)
        return env

    def node(self, name: str) -> ClusterNode:
        for n in self.nodes:
            if n.name == name:
                return n
        raise KeyError(name)

    # jobs --------------------------------------------------------------------------------
    def start_gloo_job(
        self,
        ranks_per_node: int = 1,
        nodes: Sequence[ClusterNode] | None = None,
        script: str | None = None,
        timeout: float = 60.0,
    ) -> GlooJob:
        """Start a real multi-node gloo job over SSH and wait until every rank is in it."""
        job = GlooJob(list(nodes or self.nodes), ranks_per_node, script or GLOO_HANG_SCRIPT)
        job.start(timeout)
        return job


# What every rank script starts with: EOF on stdin (the SSH session closing) ends the rank;
# then it joins the process group and says "ready <rank>".
RANK_PRELUDE = r"""
import datetime, os, sys, threading

def _exit_on_eof():
    sys.stdin.buffer.read()
    os._exit(0)

threading.Thread(target=_exit_on_eof, daemon=True).start()
import torch.distributed as dist

dist.init_process_group("gloo", timeout=datetime.timedelta(hours=1))
print("ready", dist.get_rank(), flush=True)
"""


# The default job: every rank joins the process group, then rank 0 waits in plain Python
# while the others wait in `dist.barrier()` (cheap: blocked in C). EOF on stdin (the SSH
# session closing) ends the rank, so stopping the launcher stops the job.
GLOO_HANG_SCRIPT = (
    RANK_PRELUDE
    + r"""
import time

def wait_for_operator():
    while True:
        time.sleep(3600)

if dist.get_rank() == 0:
    wait_for_operator()
else:
    dist.barrier()
"""
)


# Every rank waits in `dist.recv` from its right neighbour, which never sends: all ranks
# sit in the same call (the "same collective everywhere" hang), blocked in C.
GLOO_RECV_SCRIPT = (
    RANK_PRELUDE
    + r"""
import torch

def wait_for_neighbour():
    buf = torch.zeros(1)
    dist.recv(buf, src=(dist.get_rank() + 1) % dist.get_world_size())

wait_for_neighbour()
"""
)


@dataclass
class RankPlacement:
    rank: int
    local_rank: int
    node: ClusterNode


class GlooJob:
    """A `torch.distributed` (gloo) job spanning cluster nodes, one SSH session per rank."""

    def __init__(self, nodes: list[ClusterNode], ranks_per_node: int, script: str) -> None:
        if not nodes:
            raise ValueError("a job needs at least one node")
        self.nodes = nodes
        self.ranks_per_node = ranks_per_node
        self.script = script
        self.world_size = len(nodes) * ranks_per_node
        self.master_addr = nodes[0].address
        self.master_port = free_port()
        self.placements = [
            RankPlacement(i * ranks_per_node + lr, lr, node)
            for i, node in enumerate(nodes)
            for lr in range(ranks_per_node)
        ]
        self.procs: list[subprocess.Popen[bytes]] = []

    def ranks_on(self, node: ClusterNode | str) -> list[int]:
        name = node if isinstance(node, str) else node.name
        return [p.rank for p in self.placements if p.node.name == name]

    def command(self, placement: RankPlacement) -> str:
        env = {
            "RANK": placement.rank,
            "LOCAL_RANK": placement.local_rank,
            "WORLD_SIZE": self.world_size,
            "LOCAL_WORLD_SIZE": self.ranks_per_node,
            "MASTER_ADDR": self.master_addr,
            "MASTER_PORT": self.master_port,
            "GLOO_SOCKET_IFNAME": "lo",
        }
        assignments = " ".join(f"{k}={v}" for k, v in env.items())
        return f"exec env {assignments} python3 -c {shlex.quote(self.script)}"

    def start(self, timeout: float = 60.0) -> None:
        for placement in self.placements:
            self.procs.append(
                subprocess.Popen(
                    placement.node.ssh_argv(self.command(placement)),
                    stdin=subprocess.PIPE,
                    stdout=subprocess.PIPE,
                    stderr=subprocess.STDOUT,
                )
            )
        deadline = time.monotonic() + timeout
        try:
            for placement, proc in zip(self.placements, self.procs, strict=True):
                self._wait_ready(placement, proc, deadline)
        except BaseException:
            self.stop()
            raise

    @staticmethod
    def _wait_ready(
        placement: RankPlacement, proc: subprocess.Popen[bytes], deadline: float
    ) -> None:
        assert proc.stdout is not None
        fd = proc.stdout.fileno()
        seen = b""
        with selectors.DefaultSelector() as sel:
            sel.register(fd, selectors.EVENT_READ)
            while b"ready " not in seen:
                left = deadline - time.monotonic()
                if left <= 0 or not sel.select(left):
                    raise TimeoutError(
                        f"rank {placement.rank} on {placement.node.name} did not join the job: "
                        + seen.decode(errors="replace")[-500:]
                    )
                chunk = os.read(fd, 65536)
                if not chunk:
                    raise RuntimeError(
                        f"rank {placement.rank} on {placement.node.name} exited: "
                        + seen.decode(errors="replace")[-800:]
                    )
                seen += chunk

    def stop(self) -> None:
        """Close every rank's SSH session (EOF ends the rank) and reap the clients."""
        for proc in self.procs:
            try:
                if proc.stdin:
                    proc.stdin.close()
            except OSError:
                pass
        for proc in self.procs:
            try:
                proc.wait(timeout=10)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()
            if proc.stdout:
                proc.stdout.close()
        self.procs = []

    def __enter__(self) -> GlooJob:
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()
