"""How we start Python (`areal_node/launcher.py`): no interpreter we start imports a module
another user planted in the folder it starts from.

`nobody` plants `hashlib.py`, `sitecustomize.py` and `torch/__init__.py` (each leaves a
marker file when it runs) in a shared folder; root starts, from that folder, the local
agent's bootstrap, the bootstrap the way a Slurm step runs it (`/bin/sh` choosing the
interpreter, started where srun's fallback would start it), the reference trainer with
its `torch.distributed.run` relaunch and ranks (PYTHONPATH with an empty entry, which
means the working directory), and the replay's torch check. No marker may appear.
Over SSH the bootstrap is the same command (`bootstrap_argv`), started in the login
user's home; the Slurm path on the real cluster is in tests/cluster/test_slurm.py.
"""

from __future__ import annotations

import os
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest
from areal_node import launcher

from tests.support.nobody import as_nobody, needs_nobody, plant_modules, planted_ran, shared_tmp


@pytest.fixture
def planted() -> Iterator[tuple[Path, Path]]:
    """(the planted folder, where markers land)."""
    with shared_tmp() as shared:
        markers = shared / "markers"
        markers.mkdir(mode=0o777)
        os.chmod(markers, 0o1777)
        folder = shared / "work"
        as_nobody("mkdir", str(folder))
        plant_modules(folder, markers)
        yield folder, markers


@needs_nobody
def test_the_agent_bootstrap_imports_nothing_from_where_it_starts(
    planted: tuple[Path, Path], tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from areal_console.core.connection.client import AgentClient
    from areal_console.core.connection.transport import (
        BOOTSTRAP,
        ProcessChannel,
        bootstrap_argv,
        resolving_argv,
    )

    folder, markers = planted
    monkeypatch.chdir(folder)  # the console started from a shared folder
    env = dict(os.environ, HOME=str(tmp_path), XDG_CACHE_HOME=str(tmp_path / "cache"))
    env["PYTHONPATH"] = ""
    for argv, what in (
        (bootstrap_argv(sys.executable), "agent"),  # the local node, as over SSH
        (resolving_argv(sys.executable, BOOTSTRAP), "srun"),  # a Slurm step's /bin/sh
    ):
        client = AgentClient(ProcessChannel(argv, what, env=env, python=sys.executable))
        try:
            hello = client.start(timeout=30)
            assert hello["pid"] > 0
            assert client.round_trip(timeout=10) >= 0
        finally:
            client.close()
    assert planted_ran(markers) == []


@needs_nobody
def test_the_trainer_torchrun_and_ranks_import_nothing_from_where_they_start(
    planted: tuple[Path, Path], tmp_path: Path
) -> None:
    from areal_console.core.replay.plan import local_trainer

    folder, markers = planted
    out = tmp_path / "out"
    env = dict(os.environ, OMP_NUM_THREADS="1", PYTHONPATH=":" + str(tmp_path / "none"))
    argv, env = local_trainer("--nproc", "2", "steps=1", f"output_dir={out}", env=env)
    done = subprocess.run(argv, cwd=folder, env=env, capture_output=True, text=True, timeout=180)
    assert planted_ran(markers) == [], done.stderr[-2000:]
    assert done.returncode == 0, done.stderr[-2000:]
    assert (out / "metrics.jsonl").read_text().count("\n") == 1  # the real torch trained


@needs_nobody
def test_user_code_drops_the_working_directory_first(planted: tuple[Path, Path]) -> None:
    """The replay's torch check runs this way (`launcher.user_code`)."""
    folder, markers = planted
    argv = launcher.user_code(sys.executable, "import hashlib")
    env = launcher.clean_env(dict(os.environ, PYTHONPATH="::."))
    assert "PYTHONPATH" not in env
    done = subprocess.run(argv, cwd=folder, env=env, capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    assert planted_ran(markers) == []


def test_an_interpreter_without_isolated_mode_is_named_too_old() -> None:
    """Python 2 (or 3.0-3.3) refuses `-I` before running anything: said as too old."""
    from areal_console.core.connection.transport import bootstrap_problem

    said = ["Unknown option: -I", "usage: /usr/bin/python2 [option] ... [-c cmd | -m mod | file]"]
    problem = bootstrap_problem(said, "/usr/bin/python2", "n07")
    assert problem is not None
    assert problem.startswith("/usr/bin/python2 on n07 does not know `-I`")
    assert ">= 3.9" in problem


def test_python_2_is_named_too_old_for_the_agent(tmp_path: Path) -> None:
    """The real Python 2.7 (this machine has 3.6-3.13 and 2.7 under pyenv)."""
    from areal_console.core.connection.client import AgentClient, AgentDisconnected
    from areal_console.core.connection.transport import ProcessChannel, bootstrap_argv

    pyenv = Path(os.environ.get("PYENV_ROOT", "/root/.pyenv")) / "versions"
    found = sorted(pyenv.glob("2.7.*/bin/python2.7"))
    if not found:
        pytest.skip("no Python 2.7 on this machine")
    python = str(found[-1])
    env = dict(os.environ, HOME=str(tmp_path))
    channel = ProcessChannel(bootstrap_argv(python), "agent", env=env, python=python, node="n07")
    client = AgentClient(channel)
    with pytest.raises(AgentDisconnected) as err:
        client.start(timeout=20)
    client.close()
    assert str(err.value).startswith(f"{python} on n07 does not know `-I`")


def test_pythonpath_keeps_only_absolute_entries() -> None:
    value = os.pathsep.join(["", "/opt/torch", ".", "rel/dir", "/x"])
    assert launcher.clean_pythonpath(value) == os.pathsep.join(["/opt/torch", "/x"])


@needs_nobody
def test_the_watch_evidence_child_imports_nothing_from_where_the_watch_started(
    planted: tuple[Path, Path], tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A root `watch` started in nobody's folder (or with an empty PYTHONPATH entry): the
    child that writes a stall's evidence runs our code, not the planted modules."""
    from areal_console.commands.watch_evidence import ChildEvidence
    from areal_console.core.targets.specs import local_node
    from areal_console.core.watch.evidence import EvidenceRequest
    from areal_console.core.watch.files import private_root

    folder, markers = planted
    monkeypatch.chdir(folder)
    monkeypatch.setenv("PYTHONPATH", os.pathsep + os.environ.get("PYTHONPATH", ""))
    request = EvidenceRequest(job="no-such-job", match="no-such-job-xyz", stall="a test stall")
    fleet = {"probe_gpus": False, "in_process": True}
    evidence = ChildEvidence([local_node()], fleet)(request, private_root(tmp_path / "ev"), 1.0)
    assert "evidence" not in evidence.missing, evidence.missing  # the child did its work
    assert planted_ran(markers) == []
