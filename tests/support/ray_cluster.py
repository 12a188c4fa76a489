"""A real Ray cluster on one machine, for tests and benchmarks.

A head on 127.0.0.2 and one more node on 127.0.0.3 (Ray turns 127.0.0.1 into the
machine's outward address, so test nodes start at .2). Each `ray start --block` runs in
its own PID and mount namespaces with its own `/proc`, `--temp-dir` and ports, so every
actor or task Ray places on a node sees only that node's processes, as on a real cluster.

`ray start --block` does not finish on SIGTERM (it waits for its children), so a node is
stopped by SIGKILL to its `unshare`, which takes the namespace's init and with it every
process of the node (`--kill-child`). Every process is started and stopped by the PID
this module started.
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
import types
import urllib.request
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from tests.support.waits import wait_for

HEAD_IP = "127.0.0.2"
# Fixed ports below the kernel's ephemeral range (32768 and up, where other tests' free
# ports come from): GCS, dashboard, and per node a block of ten plus a worker port range.
GCS_PORT = 24379
DASHBOARD_PORT = 24265
CLIENT_PORT = 24001
NODE_PORT_BASE = 24400  # node i: NODE_PORT_BASE + 10*i ... + 9
WORKER_PORT_BASE = 25000  # node i: WORKER_PORT_BASE + 200*i ... + 199
CPUS_PER_NODE = 4
OBJECT_STORE_BYTES = 80 * 1024 * 1024


class RayUnavailable(Exception):
    """Ray can't run here (not installed, not root); the message says why (tests skip)."""


class RayStartError(RuntimeError):
    """Ray is here but the cluster did not come up: an error of every test that needs it."""


@dataclass
class RayNodeProc:
    index: int
    ip: str
    temp_dir: Path
    log: Path
    proc: subprocess.Popen[bytes] | None = None

    @property
    def running(self) -> bool:
        return self.proc is not None and self.proc.poll() is None


@dataclass
class RayCluster:
    base: Path
    nodes: list[RayNodeProc] = field(default_factory=list)

    @property
    def address(self) -> str:
        """The GCS address, as `ray start --address` and `RAY_ADDRESS` take it."""
        return f"{HEAD_IP}:{GCS_PORT}"

    @property
    def dashboard(self) -> str:
        return f"http://{HEAD_IP}:{DASHBOARD_PORT}"

    def node(self, ip: str) -> RayNodeProc:
        for n in self.nodes:
            if n.ip == ip:
                return n
        raise KeyError(ip)

    def start_node(self, node: RayNodeProc) -> None:
        ports = NODE_PORT_BASE + 10 * node.index
        workers = WORKER_PORT_BASE + 200 * node.index
        argv = [
            shutil.which("ray") or "ray",
            "start",
            "--block",
            f"--node-ip-address={node.ip}",
            f"--node-manager-port={ports}",
            f"--object-manager-port={ports + 1}",
            f"--dashboard-agent-listen-port={ports + 2}",
            f"--dashboard-agent-grpc-port={ports + 3}",
            f"--runtime-env-agent-port={ports + 4}",
            f"--metrics-export-port={ports + 5}",
            f"--min-worker-port={workers}",
            f"--max-worker-port={workers + 199}",
            f"--temp-dir={node.temp_dir}",
            f"--num-cpus={CPUS_PER_NODE}",
            "--num-gpus=0",
            f"--object-store-memory={OBJECT_STORE_BYTES}",
            "--disable-usage-stats",
            "--include-log-monitor=false",
        ]
        if node.index == 0:
            argv += [
                "--head",
                f"--port={GCS_PORT}",
                f"--dashboard-host={HEAD_IP}",
                f"--dashboard-port={DASHBOARD_PORT}",
                f"--ray-client-server-port={CLIENT_PORT}",
            ]
        else:
            argv.append(f"--address={self.address}")
        # No RAY_ settings of the caller's, and no PYTHONPATH: a worker on a node must not
        # import this checkout (the agent reaches nodes as its payload only).
        env = {
            k: v for k, v in os.environ.items() if not k.startswith("RAY_") and k != "PYTHONPATH"
        }
        env["RAY_USAGE_STATS_ENABLED"] = "0"
        with node.log.open("ab") as log:
            node.proc = subprocess.Popen(
                ["unshare", "--pid", "--mount", "--fork", "--mount-proc", "--kill-child", *argv],
                stdin=subprocess.DEVNULL,
                stdout=log,
                stderr=subprocess.STDOUT,
                start_new_session=True,
                env=env,
            )

    def alive_ips(self) -> set[str]:
        """The node IPs the dashboard reports alive."""
        return {ip for ip, _ in self.alive_nodes()}

    def alive_nodes(self) -> set[tuple[str, str]]:
        """(IP, node id) of each node the dashboard reports alive."""
        url = f"{self.dashboard}/api/v0/nodes?limit=100"
        with urllib.request.urlopen(url, timeout=5) as reply:
            body = json.load(reply)
        rows = body["data"]["result"]["result"]
        return {(r["node_ip"], r["node_id"]) for r in rows if r.get("state") == "ALIVE"}

    def restart_node(self, ip: str, timeout: float = 90.0) -> None:
        """Start a killed node again: a new raylet (a new node id) at the same address, up
        once Ray reports it alive (the old id may still read alive for a while)."""
        node = self.node(ip)
        if node.running:
            raise RuntimeError(f"Ray node {ip} is still running")
        old = {nid for nip, nid in self.alive_nodes() if nip == ip}
        self.start_node(node)

        def up() -> bool:
            if node.proc is not None and node.proc.poll() is not None:
                raise RayStartError(f"ray start on {ip} exited: {self.tail(node)}")
            try:
                return any(nip == ip and nid not in old for nip, nid in self.alive_nodes())
            except OSError:
                return False

        wait_for(up, timeout, f"Ray node {ip} to be alive again", interval=0.3)

    def wait_alive(self, ips: set[str], timeout: float = 90.0) -> None:
        def up() -> bool:
            for n in self.nodes:
                if n.proc is not None and n.proc.poll() is not None and n.ip in ips:
                    raise RayStartError(f"ray start on {n.ip} exited: {self.tail(n)}")
            try:
                return ips <= self.alive_ips()
            except OSError:
                return False

        try:
            wait_for(up, timeout, f"Ray nodes {sorted(ips)} to be alive", interval=0.3)
        except TimeoutError as exc:
            tails = "; ".join(f"{n.ip}: {self.tail(n, 300)}" for n in self.nodes)
            raise RayStartError(f"{exc} ({tails})") from None

    def kill_node(self, ip: str) -> None:
        """Take a node away like a crash: its raylet and everything in its namespace die."""
        node = self.node(ip)
        if node.proc is not None and node.proc.poll() is None:
            try:
                init: int | None = self.ns_init(ip)
            except (OSError, IndexError, ValueError):
                init = None
            os.killpg(node.proc.pid, signal.SIGKILL)
            node.proc.wait(timeout=30)
            # The namespace's init kills the rest (raylet, actors, ranks) as it exits, after
            # `unshare` is gone: the node is down only once its init is a zombie or reaped.
            deadline = time.monotonic() + 30
            while init is not None and time.monotonic() < deadline:
                try:
                    state = Path(f"/proc/{init}/stat").read_text().rsplit(")", 1)[1].split()[0]
                except (OSError, IndexError):
                    break
                if state in ("Z", "X"):
                    break
                time.sleep(0.05)

    def stop(self) -> None:
        for node in reversed(self.nodes):
            self.kill_node(node.ip)

    def tail(self, node: RayNodeProc, chars: int = 2000) -> str:
        try:
            return node.log.read_text(errors="replace")[-chars:]
        except OSError:
            return ""

    def ns_init(self, ip: str) -> int:
        """The PID (in our namespace) of a node's namespace init (the child of `unshare`)."""
        proc = self.node(ip).proc
        assert proc is not None
        return int(Path(f"/proc/{proc.pid}/task/{proc.pid}/children").read_text().split()[0])

    def node_only_dir(self, ip: str, path: Path, *sources: Path) -> None:
        """A tmpfs at `path` mounted in node `ip`'s mount namespace only (`unshare --mount`
        makes its mounts private), filled with copies of `sources`: a file there is read by
        something on that node, never by the console's own process."""
        path.mkdir(parents=True, exist_ok=True)
        enter = ["nsenter", f"--target={self.ns_init(ip)}", "--mount", "--"]
        subprocess.run([*enter, "mount", "-t", "tmpfs", "-o", "size=32m", "areal-test", str(path)],
                       check=True, capture_output=True)  # fmt: skip
        for source in sources:
            subprocess.run([*enter, "cp", "-a", str(source), str(path)],
                           check=True, capture_output=True)  # fmt: skip

    def start_sshd(self, ssh: Any) -> None:
        """Start `ssh` (a `tests.support.cluster.TestCluster` on the same addresses) with each sshd
        inside the namespaces of the Ray node at its address, so SSH sees exactly what the
        node's Ray actors see; its ssh config also names each node by its IP, as Ray does."""
        from tests.support.cluster import PRIVSEP_DIR, SSHD, _port_open

        def start_inside(node: Any, timeout: float = 20.0) -> None:
            PRIVSEP_DIR.mkdir(mode=0o755, parents=True, exist_ok=True)
            enter = ["nsenter", f"--target={self.ns_init(node.address)}", "--pid", "--mount"]
            node.proc = subprocess.Popen(
                [*enter, "--", SSHD, "-D", "-e", "-f", str(node.config)],
                stdin=subprocess.DEVNULL,
                stdout=subprocess.DEVNULL,
                stderr=subprocess.DEVNULL,
                start_new_session=True,
            )
            up = lambda: _port_open(node.address, node.port)  # noqa: E731
            wait_for(up, timeout, f"sshd in the Ray node {node.address}")

        for node in ssh.nodes:
            node.start = types.MethodType(start_inside, node)
        ssh.start()
        config = ssh.ssh_config.read_text()
        for node in ssh.nodes:
            config = config.replace(f"Host {node.name}\n", f"Host {node.name} {node.address}\n")
        ssh.ssh_config.write_text(config)

    def env(self, **extra: str) -> dict[str, str]:
        """An environment for a console or driver that talks to this cluster."""
        env = {k: v for k, v in os.environ.items() if not k.startswith("RAY_")}
        env.update(RAY_ADDRESS=self.address, RAY_USAGE_STATS_ENABLED="0", **extra)
        return env


def skip_reason() -> str | None:
    """Why a Ray cluster can't run here, or None."""
    try:
        import ray  # noqa: F401
    except ImportError:
        return "ray is not installed (pip install 'areal-console[ray]')"
    if shutil.which("ray") is None:
        return "the ray command is not on PATH"
    if shutil.which("unshare") is None:
        return "unshare is missing"
    if os.geteuid() != 0:
        return "needs root (PID namespaces)"
    return None


def ports_taken() -> str | None:
    """Which of the head's fixed ports is taken (another cluster still running?), or None."""
    for port in (GCS_PORT, DASHBOARD_PORT, CLIENT_PORT):
        with socket.socket() as s:
            # As servers bind: a port in TIME-WAIT (a cluster just stopped) is free.
            s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
            try:
                s.bind((HEAD_IP, port))
            except OSError as exc:
                return f"port {HEAD_IP}:{port} is taken: {exc.strerror}"
    return None


def start_cluster(nodes: int = 2, base: Path | None = None) -> RayCluster:
    """Start a head and `nodes - 1` more nodes and wait until all are alive."""
    why = skip_reason()
    if why:
        raise RayUnavailable(why)
    taken = ports_taken()
    if taken:
        raise RayStartError(taken)
    base = base or Path(tempfile.mkdtemp(prefix="areal-ray-"))
    cluster = RayCluster(base)
    for i in range(nodes):
        ip = f"127.0.0.{2 + i}"
        tmp = base / f"node{i}"
        tmp.mkdir(parents=True, exist_ok=True)
        cluster.nodes.append(RayNodeProc(i, ip, tmp, base / f"node{i}.log"))
    try:
        cluster.start_node(cluster.nodes[0])
        cluster.wait_alive({HEAD_IP})
        for node in cluster.nodes[1:]:
            cluster.start_node(node)
        cluster.wait_alive({n.ip for n in cluster.nodes})
    except BaseException:
        cluster.stop()
        raise
    return cluster


if __name__ == "__main__":  # a cluster to try things by hand: Ctrl-C stops it
    c = start_cluster()
    # A background job ignores SIGINT: let SIGTERM stop the cluster too.
    signal.signal(signal.SIGTERM, signal.default_int_handler)
    print(f"RAY_ADDRESS={c.address} dashboard {c.dashboard} logs {c.base}", flush=True)
    try:
        signal.pause()
    except KeyboardInterrupt:
        pass
    finally:
        c.stop()
        sys.exit(0)
