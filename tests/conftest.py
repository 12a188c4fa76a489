"""Shared fixtures: an isolated home for the console's files, one real gloo job on this
machine, and the real sshd test cluster."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest
from hypothesis import HealthCheck, settings

from tests.support import areal_source
from tests.support.cluster import TestCluster, free_port, skip_reason
from tests.support.waits import wait_for

# Property-based tests run the same examples on every run and every machine: derandomized
# (examples follow from the test's source), a fixed count, no example database carried
# between runs, and a deadline per example. `HYPOTHESIS_PROFILE=explore` searches more
# and at random, for a developer hunting a bug (not for CI).
settings.register_profile(
    "ci",
    derandomize=True,
    database=None,
    max_examples=60,
    deadline=2000,  # ms per example; each test also asserts its own time and memory bounds
    print_blob=True,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large],
)
settings.register_profile("explore", settings.get_profile("ci"), derandomize=False,
                          max_examples=2000)  # fmt: skip
settings.load_profile(os.environ.get("HYPOTHESIS_PROFILE", "ci"))

ROOT = Path(__file__).resolve().parent.parent
JOBS = Path(__file__).resolve().parent / "jobs"


def cli_env(**extra: str) -> dict[str, str]:
    """The environment for running `python -m areal_console` from this checkout."""
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join([str(ROOT / "tui"), str(ROOT / "agents")])
    env.update(extra)
    return env


def run_cli(*args: str, timeout: float = 120, **extra: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "areal_console", *args],
        capture_output=True,
        text=True,
        timeout=timeout,
        env=cli_env(**extra),
        check=False,
    )


def tmux_screen(session: str) -> str:
    """What a tmux session's terminal shows now."""
    return subprocess.run(["tmux", "capture-pane", "-p", "-t", session], capture_output=True,
                          text=True, check=True).stdout  # fmt: skip


def tmux_showing(session: str, *needles: str) -> str | None:
    """The screen, once it shows every needle; None until then (for `wait_for`)."""
    text = tmux_screen(session)
    return text if all(n in text for n in needles) else None


@pytest.fixture(autouse=True, scope="session")
def _isolated_console_home(tmp_path_factory: pytest.TempPathFactory) -> Iterator[None]:
    """Keep every file the console writes out of the real home directory."""
    base = tmp_path_factory.mktemp("console-home")
    saved = {
        k: os.environ.get(k)
        for k in ("AREAL_CONSOLE_DATA_DIR", "XDG_CONFIG_HOME", "XDG_CACHE_HOME", "XDG_DATA_HOME")
    }
    os.environ["AREAL_CONSOLE_DATA_DIR"] = str(base / "data")
    os.environ["XDG_CONFIG_HOME"] = str(base / "config")
    os.environ["XDG_CACHE_HOME"] = str(base / "cache")
    os.environ["XDG_DATA_HOME"] = str(base / "share")
    yield
    for key, value in saved.items():
        if value is None:
            os.environ.pop(key, None)
        else:
            os.environ[key] = value


class GlooJob:
    """A real `torchrun --nproc-per-node N` gloo job, blocked after its first all_reduce."""

    def __init__(self, nproc: int, workdir: Path, port: int) -> None:
        self.nproc = nproc
        self.workdir = workdir
        self.port = port  # MASTER_PORT: with 127.0.0.1 the job's key (`stacks --job`)
        workdir.mkdir(parents=True, exist_ok=True)
        self.log = open(workdir / "job.log", "wb")  # noqa: SIM115
        self.proc = subprocess.Popen(
            [
                sys.executable,
                "-m",
                "torch.distributed.run",
                "--nproc-per-node",
                str(nproc),
                "--master-port",
                str(port),
                str(JOBS / "gloo_ranks.py"),
                str(workdir),
            ],
            stdout=self.log,
            stderr=subprocess.STDOUT,
            start_new_session=True,
            env={**os.environ, "OMP_NUM_THREADS": "1"},
        )
        wait_for(
            lambda: len(list(workdir.glob("rank*.ready"))) == nproc or self.proc.poll() is not None,
            timeout=120,
            what=f"{nproc} ranks to start",
        )
        if self.proc.poll() is not None:
            raise RuntimeError(f"job exited early: {(workdir / 'job.log').read_text()[-2000:]}")

    @property
    def launcher_pid(self) -> int:
        return self.proc.pid

    def rank_pids(self) -> dict[int, int]:
        """rank -> pid, read from /proc (children of the launcher)."""
        out: dict[int, int] = {}
        for entry in Path("/proc").iterdir():
            if not entry.name.isdigit():
                continue
            try:
                env = (entry / "environ").read_bytes().split(b"\0")
                stat = (entry / "stat").read_text()
            except OSError:
                continue
            ppid = int(stat.rsplit(")", 1)[1].split()[1])
            if ppid != self.proc.pid:
                continue
            for item in env:
                if item.startswith(b"RANK="):
                    out[int(item[5:])] = int(entry.name)
        return out

    def stop(self) -> None:
        """Kill the ranks and the launcher: torchrun puts each worker in its own session,
        so killing the launcher's process group alone would orphan them."""
        ranks = list(self.rank_pids().values())
        for pid in ranks:
            try:
                os.kill(pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
        try:
            os.killpg(self.proc.pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
        self.proc.wait(timeout=30)
        self.log.close()


@pytest.fixture(scope="session")
def gloo_job(tmp_path_factory: pytest.TempPathFactory) -> Iterator[GlooJob]:
    """One 4-rank job shared by every test that needs live ranks on this node."""
    job = GlooJob(4, tmp_path_factory.mktemp("gloo-job"), port=free_port())
    try:
        yield job
    finally:
        job.stop()


CLUSTER_NODES = 4


@pytest.fixture(autouse=True)
def _isolated_console_dirs(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """The console never writes to the real $HOME in tests."""
    monkeypatch.setenv("AREAL_CONSOLE_DATA_DIR", str(tmp_path / "data"))
    monkeypatch.setenv("AREAL_CONSOLE_CONFIG_DIR", str(tmp_path / "config"))
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "cache"))
    monkeypatch.setenv("XDG_DATA_HOME", str(tmp_path / "xdg-data"))
    monkeypatch.setenv("XDG_CONFIG_HOME", str(tmp_path / "xdg-config"))
    monkeypatch.delenv("AREAL_CONSOLE_SSH_CONFIG", raising=False)
    monkeypatch.delenv("SSH_AUTH_SOCK", raising=False)


@pytest.fixture(scope="session")
def areal_release(
    request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory
) -> areal_source.ReleaseSource:
    """AReaL's newest release (1.0.4) from the package index, unpacked, never installed.
    Kept in pytest's cache folder between runs; a failed download is an error."""
    cache = getattr(request.config, "cache", None)  # None under -p no:cacheprovider
    folder = (
        Path(cache.mkdir("areal-release"))
        if cache is not None
        else tmp_path_factory.mktemp("areal-release")
    )
    return areal_source.ReleaseSource(areal_source.fetch_release(folder))


def areal_checkout(commit: str) -> areal_source.CheckoutSource:
    """The `$AREAL_REPO` checkout at `commit`; skips, naming the variable, where it is unset."""
    source = areal_source.checkout(commit)
    if source is None:
        pytest.skip(
            f"${areal_source.AREAL_REPO_ENV} is not set (an AReaL git checkout with {commit[:7]})"
        )
    return source


@pytest.fixture(scope="module", params=["areal-1.0.4", "cbff54d"])
def areal(request: pytest.FixtureRequest) -> areal_source.AReaLSource:
    """AReaL's source in two versions, for checks both can answer: the 1.0.4 release
    (always) and the commit the transcriptions cite (where `$AREAL_REPO` is set)."""
    if request.param == "areal-1.0.4":
        source: areal_source.AReaLSource = request.getfixturevalue("areal_release")
        return source
    return areal_checkout(areal_source.CITED_COMMIT)


@pytest.fixture(scope="session")
def cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[TestCluster]:
    """Four real sshd nodes (127.0.0.2-5), each in its own PID/UTS/mount namespace."""
    reason = skip_reason()
    if reason:
        pytest.skip(reason)
    root = tmp_path_factory.mktemp("cluster")
    test_cluster = TestCluster(root, nodes=CLUSTER_NODES)
    try:
        test_cluster.start()
        yield test_cluster
    finally:
        test_cluster.stop()


@pytest.fixture
def live_cluster(cluster: TestCluster) -> TestCluster:
    """The session cluster with every node running (a test before may have stopped one)."""
    for node in cluster.nodes:
        if not node.running:
            node.start()
    return cluster


def pytest_report_header() -> str:
    return f"sshd test cluster: {skip_reason() or 'available'} (pid {os.getpid()})"


# Fixtures that bind fixed 127.0.0.x addresses (the sshd, Slurm and Ray clusters): under
# pytest-xdist (`-n 2 --dist loadgroup`) every test using them runs on one worker, in turn.
SHARED_ADDRESS_FIXTURES = {
    "cluster",
    "live_cluster",
    "slurm_cluster",
    "slurm_gloo_job",
    "slurm_gloo_jobs",
    "ray_cluster",
    "ray_gloo_job",
    "ray_gloo_jobs",
}


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    for item in items:
        fixtures = set(getattr(item, "fixturenames", ()))
        if item.get_closest_marker("cluster") or fixtures & SHARED_ADDRESS_FIXTURES:
            item.add_marker(pytest.mark.xdist_group("shared-addresses"))
