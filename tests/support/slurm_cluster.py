"""A real Slurm cluster on one machine, for tests and benchmarks.

One `munged` with a generated key, one `slurmctld`, and one `slurmd` per node. Each
`slurmd` runs in its own PID, UTS and mount namespaces (hostname `nodeN`, its own
`/proc`, an `/etc/hosts` that names every node), with its own `NodeName`, `NodeAddr`
(127.0.0.N+1) and `Port`; so every step Slurm starts on a node sees only that node's
processes, as on a real cluster. Count-only GPU GRES (`gpu:2` per node) lets jobs ask for
GPUs even though this machine has none.

Clients (`sbatch`, `srun`, `squeue`, the console) find the cluster through `SLURM_CONF`,
which `env()` sets. Every daemon is started and stopped by the PID this module started.
"""

from __future__ import annotations

import os
import shutil
import signal
import socket
import subprocess
import tempfile
from collections.abc import Callable
from pathlib import Path
from typing import Any

from tests.support.waits import wait_for

SLURM_BINARIES = ("munged", "slurmctld", "slurmd", "srun", "sbatch", "squeue", "scontrol")
SLURM_APT_PACKAGES = ("slurm-wlm", "munge")
CPUS_PER_NODE = 4
GPUS_PER_NODE = 2


class SlurmUnavailable(Exception):
    """Slurm can't run here (not installed, not root); the message says why. The only case
    in which tests skip."""


class SlurmStartError(RuntimeError):
    """Slurm is installed and we are root, yet the cluster did not come up: a failure (tests
    error with it), never a skip."""


def missing_binaries() -> list[str]:
    return [
        b for b in SLURM_BINARIES if shutil.which(b) is None and not Path(f"/usr/sbin/{b}").exists()
    ]


def skip_reason() -> str | None:
    """Why the test Slurm cluster cannot run here (missing tools, not root), or None."""
    missing = missing_binaries()
    if missing:
        return (
            f"Slurm is not installed (missing {', '.join(missing)}): "
            f"apt-get install -y {' '.join(SLURM_APT_PACKAGES)}"
        )
    if not shutil.which("unshare"):
        return "unshare (util-linux) is missing"
    if os.geteuid() != 0:
        return "the test Slurm cluster needs root (slurmd, namespaces)"
    return None


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _wait_for(
    predicate: Callable[[], Any], timeout: float, what: str, interval: float = 0.1
) -> Any:
    try:
        return wait_for(predicate, timeout, what, interval)
    except TimeoutError as exc:
        raise SlurmStartError(str(exc)) from None


class SlurmNode:
    """One `slurmd` in its own namespaces."""

    def __init__(self, index: int, port: int) -> None:
        self.index = index
        self.name = f"node{index}"
        self.addr = f"127.0.0.{index + 1}"
        self.port = port
        self.proc: subprocess.Popen[bytes] | None = None


class SlurmCluster:
    """`SlurmCluster(n).start()`; `env()` for clients; `stop()` kills what it started."""

    def __init__(self, nodes: int = 3, base: Path | None = None) -> None:
        if nodes < 1 or nodes > 200:
            raise ValueError("nodes must be 1..200")
        # Not under pytest's 0700 tmp dirs: another user (the "job of another user" case)
        # must reach the munge socket and slurm.conf.
        self.base = Path(base) if base else Path(tempfile.mkdtemp(prefix="areal-slurm-"))
        self.base.chmod(0o755)
        self.conf = self.base / "slurm.conf"
        self.munge_socket = self.base / "munge" / "munge.socket"
        self.ctld_port = free_port()
        self.nodes = [SlurmNode(i, free_port()) for i in range(1, nodes + 1)]
        self.munged: subprocess.Popen[bytes] | None = None
        self.ctld: subprocess.Popen[bytes] | None = None

    # configuration --------------------------------------------------------------------
    def env(self, **extra: str) -> dict[str, str]:
        env = dict(os.environ)
        env["SLURM_CONF"] = str(self.conf)
        for key in [
            k for k in env if k.startswith(("SLURM_JOB", "SLURM_STEP", "SBATCH_", "SRUN_"))
        ]:
            del env[key]
        env.update(extra)
        return env

    def _write_files(self) -> None:
        for sub in ("munge", "state", "spool", "log", "hosts"):
            (self.base / sub).mkdir(exist_ok=True)
            (self.base / sub).chmod(0o755)
        key = self.base / "munge" / "munge.key"
        key.write_bytes(os.urandom(1024))
        key.chmod(0o400)
        node_lines = "\n".join(
            f"NodeName={n.name} NodeAddr={n.addr} NodeHostname={n.name} Port={n.port} "
            f"CPUs={CPUS_PER_NODE} RealMemory=1000 Gres=gpu:{GPUS_PER_NODE} State=UNKNOWN"
            for n in self.nodes
        )
        names = ",".join(n.name for n in self.nodes)
        b = self.base
        self.conf.write_text(
            f"""# generated for areal-console tests
ClusterName=areal-test
SlurmctldHost=localhost
SlurmctldPort={self.ctld_port}
SlurmUser=root
SlurmdUser=root
AuthType=auth/munge
AuthInfo=socket={self.munge_socket}
CredType=cred/munge
StateSaveLocation={b}/state
SlurmdSpoolDir={b}/spool/%n
SlurmctldPidFile={b}/slurmctld.pid
SlurmdPidFile={b}/spool/slurmd-%n.pid
SlurmctldLogFile={b}/log/slurmctld.log
SlurmdLogFile={b}/log/slurmd-%n.log
ProctrackType=proctrack/linuxproc
TaskPlugin=task/none
SelectType=select/cons_tres
SelectTypeParameters=CR_CPU
SchedulerType=sched/builtin
JobAcctGatherType=jobacct_gather/none
AccountingStorageType=accounting_storage/none
JobCompType=jobcomp/none
MpiDefault=none
MailProg=/bin/true
SwitchType=switch/none
GresTypes=gpu
ReturnToService=2
SlurmdParameters=config_overrides
SlurmdTimeout=30
MessageTimeout=10
KillWait=2
MinJobAge=300
InactiveLimit=0
{node_lines}
PartitionName=debug Nodes={names} Default=YES MaxTime=INFINITE State=UP
"""
        )
        # gres/gpu wants device files; plain files stand in for /dev/nvidiaN.
        devices = self.base / "dev"
        devices.mkdir(exist_ok=True)
        for i in range(GPUS_PER_NODE):
            (devices / f"nvidia{i}").touch()
        (self.base / "gres.conf").write_text(
            "".join(
                f"NodeName={n.name} Name=gpu File={devices}/nvidia[0-{GPUS_PER_NODE - 1}]\n"
                for n in self.nodes
            )
        )
        hosts = Path("/etc/hosts").read_text() if Path("/etc/hosts").exists() else ""
        hosts += "".join(f"{n.addr} {n.name}\n" for n in self.nodes)
        (self.base / "hosts" / "hosts").write_text(hosts)

    # lifecycle ------------------------------------------------------------------------
    def start(self, timeout: float = 60.0) -> SlurmCluster:
        reason = skip_reason()
        if reason:
            raise SlurmUnavailable(reason)
        self._write_files()
        try:
            self._start_munged(timeout)
            self._start_slurmctld(timeout)
            for node in self.nodes:
                self.start_node(node)
            self.wait_nodes_idle(timeout)
        except BaseException:
            self.stop()
            raise
        return self

    def _log(self, name: str) -> Any:
        return open(self.base / "log" / name, "ab")

    def _start_munged(self, timeout: float) -> None:
        m = self.base / "munge"
        self.munged = subprocess.Popen(
            [
                "munged",
                "-F",
                "-f",
                f"--key-file={m / 'munge.key'}",
                f"--socket={self.munge_socket}",
                f"--pid-file={m / 'munged.pid'}",
                f"--seed-file={m / 'munged.seed'}",
                f"--log-file={self.base / 'log' / 'munged.log'}",
                "--num-threads=2",
            ],
            stdout=subprocess.DEVNULL,
            stderr=self._log("munged.out"),
            start_new_session=True,
        )
        _wait_for(
            lambda: self.munge_socket.exists() or self.munged.poll() is not None,  # type: ignore[union-attr]
            timeout,
            "munged",
        )
        if self.munged.poll() is not None:
            raise SlurmStartError(f"munged exited: {self._tail('munged.out')}")
        # The socket must be usable by other users' clients too.
        self.munge_socket.chmod(0o777)

    def _start_slurmctld(self, timeout: float) -> None:
        self.ctld = subprocess.Popen(
            ["slurmctld", "-D", "-i", "-f", str(self.conf)],
            stdout=subprocess.DEVNULL,
            stderr=self._log("slurmctld.out"),
            start_new_session=True,
            env=self.env(),
        )

        def up() -> bool:
            if self.ctld is not None and self.ctld.poll() is not None:
                raise SlurmStartError(f"slurmctld exited: {self._tail('slurmctld.log')}")
            r = self.run(["scontrol", "ping"], check=False, timeout=10)
            return "UP" in r.stdout

        _wait_for(up, timeout, "slurmctld", interval=0.2)

    def start_node(self, node: SlurmNode) -> None:
        """(Re)start one node's slurmd in fresh namespaces."""
        hosts = self.base / "hosts" / "hosts"
        # sh stays PID 1 of the namespace: it reaps the slurmstepds slurmd leaves behind.
        script = (
            f"hostname {node.name} && mount --bind {hosts} /etc/hosts || exit 1; "
            f"slurmd -D -N {node.name} -f {self.conf} & wait $!"
        )
        node.proc = subprocess.Popen(
            ["unshare", "--pid", "--uts", "--mount", "--fork", "--mount-proc", "sh", "-c", script],
            stdout=subprocess.DEVNULL,
            stderr=self._log(f"slurmd-{node.name}.out"),
            start_new_session=True,
            env=self.env(),
        )

    def kill_node(self, name: str) -> None:
        """Take a node away like a crash: its slurmd and everything in its namespace die."""
        node = self.node(name)
        if node.proc is not None and node.proc.poll() is None:
            os.killpg(node.proc.pid, signal.SIGKILL)
            node.proc.wait(timeout=30)

    def node(self, name: str) -> SlurmNode:
        for n in self.nodes:
            if n.name == name:
                return n
        raise KeyError(name)

    def wait_nodes_idle(self, timeout: float = 60.0, names: list[str] | None = None) -> None:
        wanted = set(names or [n.name for n in self.nodes])

        def idle() -> bool:
            for n in self.nodes:
                if n.proc is not None and n.proc.poll() is not None:
                    raise SlurmStartError(
                        f"slurmd on {n.name} exited: {self._tail(f'slurmd-{n.name}.out')}"
                    )
            r = self.run(["sinfo", "-h", "-N", "-o", "%N %t"], check=False, timeout=10)
            states = dict(line.split() for line in r.stdout.splitlines() if line.strip())
            return all(states.get(name, "").startswith(("idle", "mix", "alloc")) for name in wanted)

        _wait_for(idle, timeout, f"nodes {sorted(wanted)} to be idle", interval=0.2)

    def stop(self) -> None:
        """Stop what we started. Test state is thrown away: nodes are simply killed, while
        slurmctld gets a moment to reap its own helper (slurmscriptd)."""
        for proc, sig in [
            *((n.proc, signal.SIGKILL) for n in self.nodes),
            (self.ctld, signal.SIGTERM),
            (self.munged, signal.SIGTERM),
        ]:
            if proc is None or proc.poll() is not None:
                continue
            try:
                os.killpg(proc.pid, sig)
                proc.wait(timeout=5)
            except ProcessLookupError:
                pass
            except subprocess.TimeoutExpired:
                os.killpg(proc.pid, signal.SIGKILL)
                proc.wait(timeout=30)

    def cleanup(self) -> None:
        self.stop()
        shutil.rmtree(self.base, ignore_errors=True)

    # helpers --------------------------------------------------------------------------
    def run(
        self, argv: list[str], check: bool = True, timeout: float = 60.0, **extra_env: str
    ) -> subprocess.CompletedProcess[str]:
        result = subprocess.run(
            argv,
            capture_output=True,
            text=True,
            timeout=timeout,
            env=self.env(**extra_env),
            check=False,
        )
        if check and result.returncode != 0:
            raise RuntimeError(f"{' '.join(argv)} failed: {result.stderr.strip()}")
        return result

    def sbatch(self, script: str, *options: str, args: tuple[str, ...] = ()) -> int:
        """Submit a batch script (its text) with sbatch options and script args; the job id."""
        fd, name = tempfile.mkstemp(prefix="job-", suffix=".sh", dir=self.base)
        os.close(fd)
        path = Path(name)
        path.write_text(script)
        path.chmod(0o755)
        # Jobs write relative paths into the cluster dir unless told otherwise.
        argv = ["sbatch", "--parsable", f"--chdir={self.base}", *options, str(path), *args]
        out = self.run(argv).stdout
        return int(out.strip().split(";")[0])

    def sbatch_env(self, script: str, env: dict[str, str], *options: str) -> int:
        """`sbatch` of a script (its text) as written, from an environment with `env` in it
        (the job inherits it, as a user's shell gives it)."""
        fd, name = tempfile.mkstemp(prefix="job-", suffix=".sh", dir=self.base)
        os.close(fd)
        path = Path(name)
        path.write_text(script)
        path.chmod(0o755)
        argv = ["sbatch", "--parsable", f"--chdir={self.base}", *options, str(path)]
        return int(self.run(argv, **env).stdout.strip().split(";")[0])

    def job_state(self, job_id: int | str) -> str:
        r = self.run(["squeue", "-h", "-t", "all", "-j", str(job_id), "-o", "%T"], check=False)
        return r.stdout.strip() or "GONE"

    def wait_job_state(
        self, job_id: int | str, states: tuple[str, ...], timeout: float = 60.0
    ) -> str:
        return str(
            wait_for(
                lambda: (s := self.job_state(job_id)) in states and s,
                timeout,
                f"job {job_id} to reach {'/'.join(states)}",
                interval=0.2,
            )
        )

    def _tail(self, log: str) -> str:
        path = self.base / "log" / log
        try:
            lines = path.read_text(errors="replace").strip().splitlines()
        except OSError:
            return "(no log)"
        return " | ".join(lines[-5:])


def start_cluster(nodes: int = 3) -> SlurmCluster:
    """Start a cluster; `SlurmUnavailable` where Slurm can't run here (not installed, not
    root), `SlurmStartError` (with the daemons' log lines) where it should but did not."""
    reason = skip_reason()
    if reason:
        raise SlurmUnavailable(reason)
    cluster = SlurmCluster(nodes)
    try:
        return cluster.start()
    except SlurmStartError:
        cluster.cleanup()
        raise
    except (OSError, RuntimeError, subprocess.SubprocessError) as exc:
        cluster.cleanup()
        raise SlurmStartError(f"could not start Slurm: {exc}") from exc


if __name__ == "__main__":  # manual use: start, print the environment, wait for Ctrl-C
    import sys

    c = start_cluster(int(sys.argv[1]) if len(sys.argv) > 1 else 3)
    print(f"export SLURM_CONF={c.conf}", flush=True)
    try:
        signal.pause()
    except KeyboardInterrupt:
        pass
    finally:
        c.cleanup()
