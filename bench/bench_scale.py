"""The console's own cost as nodes grow: fan-out, capture, merge and diagnosis at 8, 32, 128
and 512 nodes x 8 ranks, and SSH set-up with a 512-host ssh_config and known_hosts.

    python bench/bench_scale.py [--nodes 8,32,128,512] [--ranks 8] [--repeats 3]
    flock /tmp/areal-heavy.lock python bench/bench_scale.py --sshd 8   # plus real sshd nodes

What is real and what is stood in (printed next to every figure):
- real: the console (Fleet, NodeSession, AgentClient, the capture, merge, diagnosis), the
  node agent's code and its JSON-lines protocol on real OS pipes, one agent per node,
  each in its own thread of an agent host process (one node per host process up to 128
  nodes; 4 nodes per host process at 512: 512 agent processes would not fit this machine);
- stood in: py-spy (a shell script that waits the per-rank time of a real `py-spy dump`
  measured in the same run, then prints a real py-spy dump recorded from a rank in a gloo
  all_reduce, tests/data/pyspy/same_collective.json), and each node's /proc (a directory
  per node written from this machine's real /proc/self/stat and statm, with 8 rank
  processes' command lines and RANK/LOCAL_RANK/WORLD_SIZE/MASTER_* environments).
- with --sshd K: K real sshd nodes (tests/support/cluster.py) reached through a 512-host
  ssh_config and a 512-line known_hosts; console CPU per added node for a cold connect
  and one sample, with the config and known_hosts read once per run (now) against read
  per node (the baseline: the caches emptied before every connection and paramiko's
  own lookup of every Host block), in the same run.

Every simulated node shares this machine's cores with the others, so wall times at 128
and 512 nodes include the stand-ins' own CPU; the console's CPU (this process only,
getrusage) is the figure that grows with nodes.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import resource
import shutil
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
sys.path[:0] = [str(ROOT / "tui"), str(ROOT / "agents"), str(ROOT)]

from areal_console.core.connection import fleet as fleet_module  # noqa: E402
from areal_console.core.connection.fleet import Fleet, NodeFailure  # noqa: E402
from areal_console.core.connection.relay import plan_tree  # noqa: E402
from areal_console.core.connection.transport import ChannelClosed, bounded_readline  # noqa: E402
from areal_console.core.stacks.capture import CaptureOptions, capture_raw  # noqa: E402
from areal_console.core.stacks.coverage import capture_coverage  # noqa: E402
from areal_console.core.stacks.parsing import build_capture  # noqa: E402
from areal_console.core.stacks.report import analysed  # noqa: E402
from areal_console.core.targets.resolve import NodeSpec  # noqa: E402

RECORDING = ROOT / "tests" / "data" / "pyspy" / "same_collective.json"
SIMULATED = (
    "py-spy: stand-in (recorded dump after the measured per-rank time); /proc: a recording per node"
)

# One agent host process: serves one agent per (stdin, stdout, proc root), each in a
# thread, with the agent's /proc reader pointed at the node's recorded /proc. stdin and
# stdout are pipe fds (a node the console reaches directly) or FIFO paths (a node a relay
# reaches in the tree: the relay's bridge opens the other ends).
AGENT_HOST = r"""
import functools, json, os, sys, threading
from areal_node.agent import serve
from areal_node.agent.procfs import ProcessCollector
def run(agent, inp, out):
    agent.stdin = os.fdopen(inp, "rb") if isinstance(inp, int) else open(inp, "rb")
    agent.stdout = os.fdopen(out, "wb") if isinstance(out, int) else open(out, "wb")
    agent.serve()
threads = []
for inp, out, root in json.loads(sys.argv[1]):
    serve.ProcessCollector = functools.partial(ProcessCollector, root)
    agent = serve.Agent(stdin=sys.stdin.buffer, stdout=sys.stdout.buffer)
    t = threading.Thread(target=run, args=(agent, inp, out), daemon=True)
    t.start()
    threads.append(t)
for t in threads:
    t.join()
os._exit(0)
"""
# What a relay runs to reach a simulated node's agent, in place of `ssh NODE ...`: a bridge
# of two `cat`s between its stdio and the agent's FIFOs.
BRIDGE = 'cat "$1" & exec cat > "$2"'
TREE_SIMULATED = "the relay's ssh hop to each node (two `cat`s bridging to that node's agent)"


def cpu_seconds() -> float:
    usage = resource.getrusage(resource.RUSAGE_SELF)
    return usage.ru_utime + usage.ru_stime


class PipeChannel:
    """The console's end of one simulated node's agent: a pair of real OS pipes."""

    def __init__(self, to_agent: int, from_agent: int, name: str) -> None:
        self._out = os.fdopen(to_agent, "wb")
        self._in = os.fdopen(from_agent, "rb")
        self._lock = threading.Lock()
        self.name = name

    def send(self, data: bytes) -> None:
        with self._lock:
            try:
                self._out.write(data)
                self._out.flush()
            except (OSError, ValueError) as exc:
                raise ChannelClosed(self.exit_reason()) from exc

    def recv_line(self) -> bytes:
        try:
            return bounded_readline(self._in.readline)
        except (OSError, ValueError):
            return b""

    def close(self) -> None:
        with self._lock:
            try:
                self._out.close()
            except OSError:
                pass

    def exit_reason(self) -> str:
        return f"simulated node {self.name}: agent pipe closed"


def measure_pyspy_seconds(repeats: int = 3) -> float:
    """Median seconds of one real `py-spy dump --json` of a real idle Python process."""
    pyspy = shutil.which("py-spy")
    if pyspy is None:
        raise SystemExit("py-spy is needed to measure the per-rank dump time")
    target = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(120)"])
    try:
        time.sleep(0.3)  # the interpreter must be up before py-spy can read it
        times = []
        for _ in range(repeats):
            t0 = time.perf_counter()
            subprocess.run(
                [pyspy, "dump", "--json", "--pid", str(target.pid)],
                capture_output=True,
                check=True,
            )
            times.append(time.perf_counter() - t0)
    finally:
        target.kill()
        target.wait()
    return statistics.median(times)


def write_stand_ins(base: Path, seconds: float) -> Path:
    """A `py-spy` stand-in on a PATH directory: waits `seconds`, prints a recorded dump."""
    recording = json.loads(RECORDING.read_text())
    node = recording["nodes"][0]
    rank0 = next(p["pid"] for p in node["processes"] if p["rank"] == 0)
    dump = next(d for d in node["samples"][0] if d["pid"] == rank0)  # in all_reduce
    (base / "dump.json").write_text(json.dumps(dump["threads"]))
    bindir = base / "bin"
    bindir.mkdir()
    # One bash per dump and nothing else started: `read -t` on a FIFO held open for
    # reading and writing (it never ends) waits the time, builtins print the recording.
    fifo = base / "wait.fifo"
    os.mkfifo(fifo)
    script = bindir / "py-spy"
    script.write_text(
        f"#!{shutil.which('bash') or '/bin/bash'}\n"
        f"read -t {seconds:.3f} <> {fifo}\n"
        f"IFS= read -r -d '' dump < {base / 'dump.json'}\n"
        'printf "%s" "$dump"\n'
    )
    script.chmod(0o755)
    # The agent prefers a py-spy binary beside its Python over a script on PATH: run it
    # from a Python link in a folder with no py-spy.
    pydir = base / "python"
    pydir.mkdir()
    (pydir / "python3").symlink_to(os.path.realpath(sys.executable))
    return bindir


def write_proc(root: Path, node: int, ranks: int, world: int) -> None:
    """A node's /proc as recorded: `ranks` rank processes (stat, statm from this machine's
    real files, pid and parent rewritten; command line and environment of a torchrun rank)."""
    stat = Path("/proc/self/stat").read_text()
    statm = Path("/proc/self/statm").read_text()
    tail = stat.rsplit(")", 1)[1]
    fields = tail.split()
    for local in range(ranks):
        pid = 1000 + local
        entry = root / str(pid)
        entry.mkdir(parents=True)
        rest = [fields[0], "999", *fields[2:]]  # state, ppid (the launcher, not recorded), ...
        (entry / "stat").write_text(f"{pid} (python3) {' '.join(rest)}\n")
        (entry / "statm").write_text(statm)
        (entry / "cmdline").write_bytes(b"python3\0-u\0train.py\0--config\0ppo.yaml\0")
        env = {
            "RANK": str(node * ranks + local),
            "LOCAL_RANK": str(local),
            "WORLD_SIZE": str(world),
            "MASTER_ADDR": "10.0.0.1",
            "MASTER_PORT": "29500",
            "PATH": "/usr/bin",
        }
        (entry / "environ").write_bytes(b"".join(f"{k}={v}\0".encode() for k, v in env.items()))


class SimulatedNodes:
    """N nodes: recorded /proc per node, agents on real pipes in agent host processes."""

    def __init__(
        self,
        base: Path,
        nodes: int,
        ranks: int,
        bindir: Path,
        per_host: int,
        relayed: frozenset[str] = frozenset(),
    ) -> None:
        self.nodes, self.ranks, self.per_host = nodes, ranks, per_host
        self.hosts: list[subprocess.Popen[bytes]] = []
        self.channels: dict[str, PipeChannel] = {}
        self.fifos: dict[str, tuple[str, str]] = {}  # relayed node -> (its stdin, its stdout)
        self.names = [f"n{n:03d}" for n in range(nodes)]
        for n in range(nodes):
            write_proc(base / f"proc{n}", n, ranks, nodes * ranks)
        env = dict(os.environ)
        env["PATH"] = f"{bindir}:{env.get('PATH', '')}"
        env["PYTHONPATH"] = str(ROOT / "agents")
        python = str(bindir.parent / "python" / "python3")
        for first in range(0, nodes, per_host):
            specs: list[list[Any]] = []
            mine = []
            for n in range(first, min(nodes, first + per_host)):
                if f"n{n:03d}" in relayed:
                    fifo_in, fifo_out = base / f"n{n:03d}.in", base / f"n{n:03d}.out"
                    os.mkfifo(fifo_in)
                    os.mkfifo(fifo_out)
                    self.fifos[f"n{n:03d}"] = (str(fifo_in), str(fifo_out))
                    specs.append([str(fifo_in), str(fifo_out), str(base / f"proc{n}")])
                    continue
                to_r, to_w = os.pipe()
                from_r, from_w = os.pipe()
                specs.append([to_r, from_w, str(base / f"proc{n}")])
                mine.append((to_r, from_w))
                self.channels[f"n{n:03d}"] = PipeChannel(to_w, from_r, f"n{n:03d}")
            fds = [fd for pair in mine for fd in pair]
            self.hosts.append(
                subprocess.Popen(
                    [python, "-c", AGENT_HOST, json.dumps(specs)], pass_fds=fds, env=env
                )
            )
            for fd in fds:
                os.close(fd)

    def specs(self) -> list[NodeSpec]:
        return [NodeSpec(name=name, transport="local") for name in self.names]

    def open_channel(self, spec: NodeSpec, in_process: bool = False, **_: Any) -> PipeChannel:
        return self.channels[spec.name]

    def relay_argv(self, spec: NodeSpec) -> list[str]:
        fifo_in, fifo_out = self.fifos[spec.name]
        return ["/bin/sh", "-c", BRIDGE, "bridge", fifo_out, fifo_in]

    def close(self) -> None:
        for channel in self.channels.values():
            channel.close()
        for host in self.hosts:
            try:
                host.wait(10)
            except subprocess.TimeoutExpired:
                host.kill()
                host.wait()


def tree_fanout(n: int) -> int:
    """The bench's tree: two levels, K = min(32, ceil(sqrt(n))) (512 nodes: 23 relays)."""
    return min(32, math.ceil(math.sqrt(n)))


def run_scale(
    n: int, ranks: int, pyspy_s: float, bindir: Path, repeats: int, tree: int | None = None
) -> dict[str, Any]:
    per_host = 1 if n <= 128 else 4
    with tempfile.TemporaryDirectory(prefix="bench-scale-") as tmp:
        names = [f"n{i:03d}" for i in range(n)]
        relayed = frozenset(k for k, v in plan_tree(names, tree).items() if v) if tree else None
        sim = SimulatedNodes(Path(tmp), n, ranks, bindir, per_host, relayed or frozenset())
        original = fleet_module.open_channel
        fleet_module.open_channel = sim.open_channel
        fleet = Fleet(
            sim.specs(), probe_gpus=False, max_parallel=64, node_timeout=120,
            fanout_tree=tree, relay_argv=sim.relay_argv if tree else None,
        )  # fmt: skip
        try:
            c0, t0 = cpu_seconds(), time.perf_counter()
            hellos = fleet.connect_all()
            connect_wall, connect_cpu = time.perf_counter() - t0, cpu_seconds() - c0
            failed = [r for r in hellos.values() if isinstance(r, NodeFailure)]
            if failed:
                raise RuntimeError(f"{len(failed)} simulated nodes failed: {failed[:3]}")
            options = CaptureOptions(ledger=False, rollout=False, all_jobs=True, timeout=60)
            walls, cpus, analyse_s, coverage = [], [], [], ""
            for _ in range(repeats):
                c0, t0 = cpu_seconds(), time.perf_counter()
                raw = capture_raw(fleet, options)
                raw["id"] = "bench"
                a0 = time.perf_counter()
                result = analysed(build_capture(raw))
                result.diagnosis  # noqa: B018  # the diagnosis on screen is part of the figure
                end = time.perf_counter()
                walls.append(end - t0)
                cpus.append(cpu_seconds() - c0)
                analyse_s.append(end - a0)
                coverage = capture_coverage(result.capture).line()
            reply = reply_bytes(fleet.sessions[0], ranks)
            # Idle: the connected fleet doing nothing, as the TUI between keys (pipes only;
            # an SSH session's transport threads are not part of this figure).
            c0 = cpu_seconds()
            time.sleep(2.0)
            idle_cpu = cpu_seconds() - c0
        finally:
            fleet.close()
            fleet_module.open_channel = original
            sim.close()
    rounds = math.ceil(ranks / max(1, os.cpu_count() or 1))
    floor = rounds * pyspy_s
    wall, cpu = statistics.median(walls), statistics.median(cpus)
    return {
        "nodes": n,
        "tree": tree,
        "connections": n - len(relayed or ()),
        "ranks": n * ranks,
        "agent_processes": math.ceil(n / per_host),
        "connect_wall_s": connect_wall,
        "connect_cpu_ms_per_node": 1000 * connect_cpu / n,
        "capture_wall_s": wall,
        "pyspy_floor_s": floor,
        "capture_cpu_s": cpu,
        "capture_cpu_ms_per_node": 1000 * cpu / n,
        "analyse_s": statistics.median(analyse_s),
        "idle_cpu_ms_per_node_per_s": 1000 * idle_cpu / 2.0 / n,
        "coverage": coverage,
        "reply_bytes": reply,
    }


def reply_bytes(session: Any, ranks: int) -> tuple[int, int]:
    """One node's `pyspy` reply for its ranks as sent (each distinct stack once, by key)
    and as it would be with every thread's frames inline (the baseline), in bytes."""
    pids = [1000 + local for local in range(ranks)]
    reply = session.call("pyspy", {"pids": pids, "timeout": 60}, timeout=90)
    sent = len(json.dumps(reply, separators=(",", ":")))
    frames = {
        t["key"]: t["frames"] for d in reply["dumps"] for t in d.get("threads", []) if "frames" in t
    }
    for d in reply["dumps"]:
        for t in d.get("threads", []):
            t["frames"] = frames.get(t.get("key"), t.get("frames"))
    return sent, len(json.dumps(reply, separators=(",", ":")))


def run_frozen(n: int, ranks: int, bindir: Path, deadline: float) -> str:
    """A warm capture of `n` simulated nodes with one node's agent process frozen
    (SIGSTOP): the capture's wall time and its coverage line."""
    import signal

    with tempfile.TemporaryDirectory(prefix="bench-scale-frozen-") as tmp:
        sim = SimulatedNodes(Path(tmp), n, ranks, bindir, 1)
        original = fleet_module.open_channel
        fleet_module.open_channel = sim.open_channel
        fleet = Fleet(sim.specs(), probe_gpus=False, node_timeout=deadline)
        frozen = sim.hosts[n // 2]
        try:
            fleet.connect_all()
            os.kill(frozen.pid, signal.SIGSTOP)
            t0 = time.perf_counter()
            raw = capture_raw(fleet, CaptureOptions(ledger=False, rollout=False, all_jobs=True))
            wall = time.perf_counter() - t0
            raw["id"] = "bench"
            line = capture_coverage(build_capture(raw)).line()
        finally:
            os.kill(frozen.pid, signal.SIGCONT)
            fleet.close()
            fleet_module.open_channel = original
            sim.close()
    return (
        f"{n} nodes, one agent frozen (SIGSTOP), --node-timeout {deadline:g}: capture "
        f"{wall:.2f} s wall; {line} [real: console, agents, pipes; simulated: {SIMULATED}]"
    )


# -- real sshd nodes, 512-host ssh_config and known_hosts ---------------------------------


def big_ssh_files(cluster: Any, hosts: int) -> tuple[Path, Path]:
    """The cluster's ssh config and known_hosts, padded to `hosts` entries each."""
    from tests.support.cluster import SSH_KEYGEN

    config = cluster.root / "ssh_config.512"
    known = cluster.root / "known_hosts.512"
    key = cluster.root / "pad_key"
    if not key.exists():
        subprocess.run(
            [SSH_KEYGEN, "-q", "-t", "ed25519", "-N", "", "-f", str(key)],
            check=True,
            capture_output=True,
        )
    pub = " ".join(key.with_suffix(".pub").read_text().split()[:2])
    pad = hosts - len(cluster.nodes)
    blocks = [
        f"Host pad{i}\n    HostName 10.{i // 250}.{i % 250}.1\n    User root\n"
        f"    IdentityFile {cluster.identity}\n    UserKnownHostsFile {known}\n"
        for i in range(pad)
    ]
    own = cluster.ssh_config.read_text().replace(str(cluster.known_hosts), str(known))
    config.write_text("\n".join(blocks) + "\n" + own)
    lines = [f"10.{i // 250}.{i % 250}.1 {pub}" for i in range(pad)]
    known.write_text("\n".join(lines) + "\n" + cluster.known_hosts.read_text())
    return config, known


def cold_cpu(
    cluster: Any, count: int, config: Path, per_node_parse: bool, tree: int | None = None
) -> float:
    """Console CPU seconds for a new fleet's connect and one sample on `count` nodes
    (`tree`: through a fan-out tree of that K, the nodes' own OpenSSH for the relayed hop,
    with the same ssh config; its wall seconds go to COLD_WALL)."""
    from areal_console.core.connection import ssh, ssh_config

    if per_node_parse:  # the baseline: every connection parses the config and known_hosts
        load, known, lookup = ssh.load_ssh_config, ssh.known_hosts_for, ssh.lookup_host
        ssh.lookup_host = lambda config, alias: config.lookup(alias)

        def load_again(path: Any) -> Any:
            ssh_config._CONFIGS.clear()
            return load(path)

        def known_again(paths: Any) -> Any:
            ssh._KNOWN.clear()
            return known(paths)

        ssh.load_ssh_config, ssh.known_hosts_for = load_again, known_again
    ssh_config._CONFIGS.clear()
    ssh._KNOWN.clear()
    try:
        c0, t0 = cpu_seconds(), time.perf_counter()
        fleet = Fleet(
            cluster.specs()[:count], ssh_config=str(config), allow_agent=False,
            fanout_tree=tree, tree_ssh_config=str(config),
        )  # fmt: skip
        try:
            results = fleet.call_all("sample")
            COLD_WALL.append(time.perf_counter() - t0)
        finally:
            fleet.close()
        cpu = cpu_seconds() - c0
    finally:
        if per_node_parse:
            ssh.load_ssh_config, ssh.known_hosts_for = load, known
            ssh.lookup_host = lookup
    failed = [r for r in results.values() if isinstance(r, NodeFailure)]
    if failed:
        raise RuntimeError(f"nodes failed: {failed}")
    return cpu


IDLE_SECONDS = 6.0
COLD_WALL: list[float] = []  # wall seconds to the samples of each cold_cpu call


def ssh_idle_wakeup() -> float:
    from areal_console.core.connection import ssh

    return ssh.IDLE_WAKEUP_SECONDS


def idle_cpu(cluster: Any, config: Path, wakeup: float) -> float:
    """Console CPU ms per node per second with every node connected and nothing asked."""
    from areal_console.core.connection import ssh

    saved = ssh.IDLE_WAKEUP_SECONDS
    ssh.IDLE_WAKEUP_SECONDS = wakeup
    fleet = Fleet(cluster.specs(), ssh_config=str(config), allow_agent=False)
    try:
        fleet.connect_all()
        time.sleep(1.0)  # the connects' own work settles first
        c0 = cpu_seconds()
        time.sleep(IDLE_SECONDS)
        cpu = cpu_seconds() - c0
    finally:
        fleet.close()
        ssh.IDLE_WAKEUP_SECONDS = saved
    return 1000 * cpu / IDLE_SECONDS / len(fleet)


def monitored_cpu(cluster: Any, config: Path, wakeup: float) -> float:
    """Console CPU ms per node per second with the TUI's monitor running (the Cluster
    screen's data: agents stream a sample a second, pings every 5 s), nothing drawn."""
    from areal_console.core.connection import ssh
    from areal_console.core.connection.monitor import FleetMonitor

    saved = ssh.IDLE_WAKEUP_SECONDS
    ssh.IDLE_WAKEUP_SECONDS = wakeup
    fleet = Fleet(cluster.specs(), ssh_config=str(config), allow_agent=False)
    monitor = FleetMonitor(fleet, interval=1.0)
    try:
        monitor.start()
        fleet_up = lambda: all(s.state == "up" for s in fleet.sessions)  # noqa: E731
        deadline = time.monotonic() + 60
        while not fleet_up() and time.monotonic() < deadline:
            time.sleep(0.2)
        time.sleep(2.0)  # the streams' first samples settle first
        c0 = cpu_seconds()
        time.sleep(IDLE_SECONDS)
        cpu = cpu_seconds() - c0
    finally:
        monitor.stop()
        fleet.close()
        ssh.IDLE_WAKEUP_SECONDS = saved
    return 1000 * cpu / IDLE_SECONDS / len(fleet)


def run_sshd(nodes: int, hosts: int, repeats: int) -> list[str]:
    from tests.support.cluster import TestCluster, skip_reason

    reason = skip_reason()
    if reason:
        return [f"sshd part skipped: {reason}"]
    lines = []
    with (
        tempfile.TemporaryDirectory(prefix="bench-scale-sshd-") as tmp,
        TestCluster(Path(tmp), nodes=nodes) as cluster,
    ):
        config, _known = big_ssh_files(cluster, hosts)
        cold_cpu(cluster, nodes, config, False)  # agents cached on every node first
        few = 2
        medians: list[float] = []
        for label, per_node in (("per-node parse (baseline)", True), ("read once (now)", False)):
            added = []
            for _ in range(repeats):
                small = cold_cpu(cluster, few, config, per_node)
                large = cold_cpu(cluster, nodes, config, per_node)
                added.append((large - small) / (nodes - few))
                whole = large / nodes
            medians.append(1000 * statistics.median(added))
            lines.append(
                f"  {label:<26} {medians[-1]:6.1f} ms per added node "
                f"(median of {repeats}; last run {1000 * whole:.1f} ms per node over {nodes})"
            )
        lines.append(f"  ratio now / baseline: {medians[1] / medians[0]:.2f}")
        # The same cold connect through a fan-out tree of K=2 (2 nodes: both direct; more:
        # 2 direct, the rest started by their agents over the nodes' own OpenSSH).
        cold_cpu(cluster, nodes, config, False, tree=2)  # warm the tree path once
        added: list[float] = []
        for mode in ("flat", "tree"):
            k = 2 if mode == "tree" else None
            added_mode: list[float] = []
            walls: dict[int, list[float]] = {few: [], nodes: []}
            for _ in range(repeats):
                small = cold_cpu(cluster, few, config, False, k)
                walls[few].append(COLD_WALL[-1])
                large = cold_cpu(cluster, nodes, config, False, k)
                walls[nodes].append(COLD_WALL[-1])
                added_mode.append((large - small) / (nodes - few))
            added.append(1000 * statistics.median(added_mode))
            lines.append(
                f"  {mode + (' K=2' if k else ''):<26} {added[-1]:6.1f} ms per added node "
                f"(median of {repeats}); connect + sample wall {statistics.median(walls[few]):.2f} s "
                f"at {few} nodes, {statistics.median(walls[nodes]):.2f} s at {nodes}"
            )
        lines.append(f"  ratio tree / flat: {added[1] / added[0]:.2f}")
        idle = [idle_cpu(cluster, config, wakeup) for wakeup in (0.1, ssh_idle_wakeup())]
        lines.append(
            f"Idle connected fleet ({nodes} real sshd nodes, no requests, {IDLE_SECONDS:g} s): "
            "console CPU per node per second [real: sshd, paramiko, agent; nothing simulated]"
        )
        lines.append(f"  transport wakeup 0.1 s (paramiko's, baseline)  {idle[0]:.3f} ms")
        lines.append(
            f"  transport wakeup {ssh_idle_wakeup():g} s (now)              {idle[1]:.3f} ms"
        )
        lines.append(f"  ratio now / baseline: {idle[1] / idle[0]:.2f}" if idle[0] else "")
        watched = [monitored_cpu(cluster, config, wakeup) for wakeup in (0.1, ssh_idle_wakeup())]
        lines.append(
            f"TUI monitor running ({nodes} real sshd nodes, 1 Hz samples streamed, "
            f"{IDLE_SECONDS:g} s): console CPU per node per second [real; nothing simulated]"
        )
        lines.append(f"  transport wakeup 0.1 s (baseline)  {watched[0]:.3f} ms")
        lines.append(f"  transport wakeup {ssh_idle_wakeup():g} s (now)       {watched[1]:.3f} ms")
    header = (
        f"Cold connect + one sample, {nodes} real sshd nodes (namespaces), {hosts}-host "
        f"ssh_config and {hosts}-line known_hosts; console CPU [real: sshd, paramiko, agent, "
        "files; nothing simulated]"
    )
    return [header, *lines]


def print_row(mode: str, r: dict[str, Any]) -> None:
    print(
        f"{r['nodes']:>4} nodes, {mode} ({r['connections']} console connections, {r['ranks']} "
        f"ranks, {r['agent_processes']} agent processes): capture {r['capture_wall_s']:.2f} s "
        f"wall (py-spy floor {r['pyspy_floor_s']:.2f} s), console CPU {r['capture_cpu_s']:.3f} s "
        f"= {r['capture_cpu_ms_per_node']:.2f} ms/node; merge+diagnosis {r['analyse_s']:.3f} s; "
        f"connect {r['connect_cpu_ms_per_node']:.2f} ms CPU/node ({r['connect_wall_s']:.2f} s "
        f"wall); idle {r['idle_cpu_ms_per_node_per_s']:.3f} ms CPU/node/s; {r['coverage']}; one "
        f"node's py-spy reply {r['reply_bytes'][0]:,} bytes (frames inline: "
        f"{r['reply_bytes'][1]:,})",
        flush=True,
    )


def per_added(rows: list[dict[str, Any]], key: str) -> list[float | None]:
    """Console CPU ms per node added since the first size: (CPU(n) - CPU(first)) / (n - first)."""
    first = rows[0]
    out: list[float | None] = [None]
    for r in rows[1:]:
        out.append(1000 * (r[key] - first[key]) / (r["nodes"] - first["nodes"]))
    return out


def print_tree_table(flat: list[dict[str, Any]], tree: list[dict[str, Any]]) -> None:
    """Flat against tree, same sizes, same run: the console's CPU to connect and to capture."""
    for rows in (flat, tree):
        for r in rows:
            r["connect_cpu_s"] = r["connect_cpu_ms_per_node"] * r["nodes"] / 1000
    flat_added = per_added(flat, "capture_cpu_s")
    tree_added = per_added(tree, "capture_cpu_s")
    flat_conn = per_added(flat, "connect_cpu_s")
    tree_conn = per_added(tree, "connect_cpu_s")
    print(
        "| nodes | K | console connections (flat / tree) | connect CPU ms/node flat | tree "
        "| tree / flat | capture CPU ms/node flat | tree | tree / flat | per added node: "
        "connect flat / tree ms | capture flat / tree ms | capture wall s flat / tree "
        "| real / simulated |"
    )
    print("|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---|")

    def ms(v: float | None) -> str:
        return "" if v is None else f"{v:.2f}"

    for i, (f, t) in enumerate(zip(flat, tree, strict=True)):
        print(
            f"| {f['nodes']} | {t['tree']} | {f['connections']} / {t['connections']} "
            f"| {f['connect_cpu_ms_per_node']:.2f} | {t['connect_cpu_ms_per_node']:.2f} "
            f"| {t['connect_cpu_ms_per_node'] / f['connect_cpu_ms_per_node']:.2f} "
            f"| {f['capture_cpu_ms_per_node']:.2f} | {t['capture_cpu_ms_per_node']:.2f} "
            f"| {t['capture_cpu_ms_per_node'] / f['capture_cpu_ms_per_node']:.2f} "
            f"| {ms(flat_conn[i])} / {ms(tree_conn[i])} | {ms(flat_added[i])} / {ms(tree_added[i])} "
            f"| {f['capture_wall_s']:.2f} / {t['capture_wall_s']:.2f} "
            f"| real: console, agents, relays, pipes, protocol, merge, diagnosis; simulated: "
            f"{SIMULATED}; {TREE_SIMULATED} |"
        )


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--nodes", default="8,32,128,512")
    parser.add_argument("--ranks", type=int, default=8)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--sshd", type=int, default=0, metavar="K", help="also K real sshd nodes")
    parser.add_argument("--hosts", type=int, default=512, help="ssh_config/known_hosts entries")
    parser.add_argument("--no-tree", action="store_true", help="flat fan-out only")
    args = parser.parse_args()
    sizes = [int(x) for x in args.nodes.split(",")]

    pyspy_s = measure_pyspy_seconds()
    print(f"machine: {os.cpu_count()} CPUs, Python {sys.version.split()[0]}")
    print(f"per-rank py-spy dump (real py-spy on a real idle Python, median of 3): {pyspy_s:.3f} s")
    print(f"simulated: {SIMULATED}")
    print()
    rows, trees = [], []
    with tempfile.TemporaryDirectory(prefix="bench-scale-bin-") as tmp:
        bindir = write_stand_ins(Path(tmp), pyspy_s)
        for n in sizes:
            rows.append(run_scale(n, args.ranks, pyspy_s, bindir, args.repeats))
            print_row("flat", rows[-1])
            if not args.no_tree:
                trees.append(
                    run_scale(n, args.ranks, pyspy_s, bindir, args.repeats, tree_fanout(n))
                )
                print_row(f"tree K={trees[-1]['tree']}", trees[-1])
        print()
        print(run_frozen(32, args.ranks, bindir, 5.0), flush=True)
    base = rows[0]
    print()
    print(
        "| nodes | ranks | agent processes | capture wall s | py-spy floor s | console CPU s "
        "| CPU ms/node | vs first | merge+diagnosis s | connect CPU ms/node | idle CPU ms/node/s "
        "| real / simulated |"
    )
    print("|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---|")
    for r in rows:
        ratio = r["capture_cpu_ms_per_node"] / base["capture_cpu_ms_per_node"]
        print(
            f"| {r['nodes']} | {r['ranks']} | {r['agent_processes']} | {r['capture_wall_s']:.2f} "
            f"| {r['pyspy_floor_s']:.2f} | {r['capture_cpu_s']:.3f} "
            f"| {r['capture_cpu_ms_per_node']:.2f} | {ratio:.2f}x | {r['analyse_s']:.3f} "
            f"| {r['connect_cpu_ms_per_node']:.2f} | {r['idle_cpu_ms_per_node_per_s']:.3f} "
            f"| real: console, agents, pipes, protocol, merge, diagnosis; simulated: {SIMULATED} |"
        )
    if trees:
        print()
        print_tree_table(rows, trees)
    if args.sshd:
        print()
        for line in run_sshd(args.sshd, args.hosts, args.repeats):
            print(line)
    return 0


if __name__ == "__main__":
    sys.exit(main())
