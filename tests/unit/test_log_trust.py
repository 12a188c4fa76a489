"""Which log files the agent trusts: no FIFO, no other user's symlink, the job's user's
files only, no path steering by another user's `--experiment-name`. Hostile files are
planted by the real user `nobody` (setpriv); the agent runs as this test's user."""

from __future__ import annotations

import getpass
import json
import os
import posixpath
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
from areal_console.core.common.errors import UserError
from areal_console.core.connection.client import AgentClient, AgentError
from areal_console.core.connection.transport import LocalChannel
from areal_console.core.metrics.follow import LocalFiles
from areal_console.core.metrics.logdir import log_dir_of
from hypothesis import given
from hypothesis import strategies as st

from tests.conftest import run_cli, wait_for
from tests.support.areal_logfmt import write_run
from tests.support.nobody import SETPRIV, as_nobody, needs_nobody, shared_tmp


@pytest.fixture(scope="module")
def agent():  # type: ignore[no-untyped-def]
    client = AgentClient(LocalChannel())
    client.start(gpus=False)
    yield client
    client.close()


@pytest.fixture()
def shared_dir() -> Iterator[Path]:
    with shared_tmp() as d:
        yield d


@pytest.fixture()
def secret(tmp_path: Path) -> Path:
    private = tmp_path / "private"
    private.mkdir(mode=0o700)
    path = private / "main.log"
    path.write_text("ROOT-ONLY-SECRET\n")
    path.chmod(0o600)
    return path


def test_a_fifo_in_place_of_main_log_does_not_block(agent: AgentClient, tmp_path: Path) -> None:
    fifo = tmp_path / "main.log"
    os.mkfifo(fifo)
    t0 = time.monotonic()
    with pytest.raises(AgentError, match="not a regular file"):
        agent.request("file_tail", {"path": str(fifo)}, timeout=10)
    with pytest.raises(AgentError, match="not a regular file"):
        agent.request("file_read", {"path": str(fifo)}, timeout=10)
    assert time.monotonic() - t0 < 3
    with pytest.raises(UserError, match="not a regular file"):
        LocalFiles().read(str(fifo), 0, None, 1024)
    assert agent.request("ping", timeout=5)["time"] > 0


@needs_nobody
def test_another_users_symlink_to_a_private_file_is_not_followed(
    agent: AgentClient, shared_dir: Path, secret: Path
) -> None:
    planted = shared_dir / "main.log"
    as_nobody("ln", "-s", str(secret), str(planted))
    for op in ("file_tail", "file_read"):
        with pytest.raises(AgentError, match="symlink owned by nobody: not followed"):
            agent.request(op, {"path": str(planted)}, timeout=10)
    with pytest.raises(UserError, match="symlink owned by nobody"):
        LocalFiles().read(str(planted), 0, None, 1024)
    # The agent's own user's symlink is followed as before.
    own = shared_dir / "own.log"
    own.symlink_to(secret)
    assert agent.request("file_read", {"path": str(own)}, timeout=10)["text"].startswith("ROOT")


@needs_nobody
def test_another_users_symlinked_log_dir_is_not_followed(
    agent: AgentClient, shared_dir: Path, secret: Path
) -> None:
    as_nobody("ln", "-s", str(secret.parent), str(shared_dir / "trial0"))
    with pytest.raises(AgentError, match="symlink owned by nobody"):
        agent.request("log_find", {"path": str(shared_dir / "trial0")}, timeout=10)
    with pytest.raises(AgentError, match="symlink owned by nobody"):
        agent.request("file_tail", {"path": str(shared_dir / "trial0" / "main.log")}, timeout=10)


@needs_nobody
def test_with_an_owner_only_that_users_files_are_read(agent: AgentClient, shared_dir: Path) -> None:
    run = shared_dir / "run"
    run.mkdir()
    os.chmod(run, 0o1777)
    (run / "main.log").write_text("mine\n")
    as_nobody("sh", "-c", f"echo planted > {run}/trainer.log")
    me = getpass.getuser()
    found = agent.request("log_find", {"path": str(run), "owner": me}, timeout=10)
    assert [Path(p).name for p in found["logs"]] == ["main.log"]
    with pytest.raises(AgentError, match="owned by nobody, not by the job's user"):
        agent.request("file_tail", {"path": str(run / "trainer.log"), "owner": me}, timeout=10)
    # Without an owner (a path the user typed), the file is read.
    assert agent.request("file_read", {"path": str(run / "trainer.log")})["text"] == "planted\n"
    with pytest.raises(AgentError, match="no user"):
        agent.request("file_tail", {"path": str(run / "main.log"), "owner": "no-such-user-x"})


@needs_nobody
def test_another_users_experiment_name_does_not_steer_metrics(tmp_path: Path) -> None:
    """A fake rpc_server of `nobody` whose `--experiment-name ../../x` would make the log
    directory <fileroot>/logs/<me>/../../x/t: a private run elsewhere."""
    fileroot = tmp_path / "root"
    write_run(fileroot / "x" / "t", 5, finished=True)
    tag = f"steer{os.getpid()}"
    proc = subprocess.Popen([SETPRIV, "--reuid", "nobody", "--regid", "nogroup",  # type: ignore[list-item]
                             "--clear-groups", sys.executable, "-c", "import time; time.sleep(120)",
                             "-m", "areal.infra.rpc.rpc_server", "--role", tag,
                             "--experiment-name", "../../x", "--trial-name", "t",
                             "--fileroot", str(fileroot)])  # fmt: skip
    try:
        wait_for(lambda: Path(f"/proc/{proc.pid}/cmdline").read_bytes().count(b"\0") > 10,
                 what="the planted process")  # fmt: skip
        out = run_cli("metrics", "--local", "--job", tag, "--json")
        assert out.returncode == 1, out.stdout
        assert "names an AReaL log directory" in out.stderr
        assert "steps" not in out.stdout
    finally:
        proc.kill()
        proc.wait()


def test_names_with_path_steps_give_no_log_dir() -> None:
    for bad in ("../../x", "..", ".", "a/b", "x\0y", ""):
        assert log_dir_of({"experiment": bad, "trial": "t"}, "me") is None
        assert log_dir_of({"experiment": "e", "trial": bad}, "me") is None
    assert log_dir_of({"experiment": "e", "trial": "t", "fileroot": "/a/../b"}, "me") is None
    assert log_dir_of({"experiment": "e", "trial": "t", "fileroot": "rel"}, "me") is None
    assert log_dir_of({"experiment": "e", "trial": "t", "fileroot": "/f/"}, "me") == (
        "/f/logs/me/e/t"
    )


@given(
    experiment=st.text(max_size=12),
    trial=st.text(max_size=12),
    fileroot=st.one_of(st.none(), st.text(max_size=16)),
)
def test_property_the_log_dir_stays_under_its_users_tree(
    experiment: str, trial: str, fileroot: str | None
) -> None:
    identity = {"experiment": experiment, "trial": trial}
    if fileroot is not None:
        identity["fileroot"] = fileroot
    found = log_dir_of(identity, "me")
    if found is None:
        return
    root = posixpath.normpath(fileroot or "/tmp/areal")
    assert "\0" not in found
    assert posixpath.normpath(found) == posixpath.join(root, "logs", "me", experiment, trial)
    assert posixpath.dirname(posixpath.dirname(posixpath.normpath(found))) == posixpath.join(
        root, "logs", "me"
    )


def test_the_agents_log_reads_report_json_errors_not_hangs(tmp_path: Path) -> None:
    """The CLI on a FIFO: one error line, exit 1, at once."""
    os.mkfifo(tmp_path / "main.log")
    t0 = time.monotonic()
    out = run_cli("metrics", str(tmp_path / "main.log"), "--json")
    assert out.returncode == 1 and "not a regular file" in out.stderr, out.stderr
    assert "Traceback" not in out.stderr
    assert time.monotonic() - t0 < 20
    json.dumps(out.stderr)


@needs_nobody
def test_another_users_job_names_only_its_own_users_files(tmp_path: Path) -> None:
    """`nobody`'s process names a run under <fileroot>/logs/nobody/...: the console looks
    there (not under its own user's tree) and reads only nobody's files; a run planted
    there by another user (here this test's) is not read as nobody's."""
    fileroot = tmp_path / "root"
    write_run(fileroot / "logs" / "nobody" / "e" / "t", 5, finished=True)
    tag = f"other{os.getpid()}"
    proc = subprocess.Popen([SETPRIV, "--reuid", "nobody", "--regid", "nogroup",  # type: ignore[list-item]
                             "--clear-groups", sys.executable, "-c", "import time; time.sleep(120)",
                             "-m", "areal.infra.rpc.rpc_server", "--role", tag,
                             "--experiment-name", "e", "--trial-name", "t",
                             "--fileroot", str(fileroot)])  # fmt: skip
    try:
        wait_for(lambda: Path(f"/proc/{proc.pid}/cmdline").read_bytes().count(b"\0") > 10,
                 what="the planted process")  # fmt: skip
        out = run_cli("metrics", "--local", "--job", tag, "--json")
        assert f"{fileroot}/logs/nobody/e/t" in out.stderr, out.stderr
        assert out.returncode == 1 and "steps" not in out.stdout, out.stdout
    finally:
        proc.kill()
        proc.wait()


@needs_nobody
def test_the_report_reads_only_the_jobs_users_files_in_its_log_dir(shared_dir: Path) -> None:
    """`report` on a job gone (its saved capture): the log directory its command lines
    name is a shared one where `nobody` planted a config.yaml and a log."""
    from areal_console.core.report.collect import ReportRequest, collect

    me = getpass.getuser()
    run = shared_dir / "logs" / me / "e" / "t"
    write_run(run, 3)
    os.chmod(run, 0o1777)
    as_nobody("sh", "-c", f"echo 'wandb: {{api_key: PLANTED}}' > {run}/config.yaml; "
                          f"echo planted > {run}/zz-planted.log")  # fmt: skip
    cmd = f"python -m areal.launcher.local t.py cluster.fileroot={shared_dir} experiment_name=e trial_name=t"
    capture = {"job": "e/t", "ranks": [{"node": "local", "pid": 1, "rank": 0, "cmdline": cmd}]}
    inputs = collect(None, ReportRequest(capture=capture, capture_note="saved"))
    assert inputs.log_dir == str(run)
    assert "zz-planted.log" not in [Path(t.path).name for t in inputs.logs]
    assert inputs.logs and all(Path(t.path).stat().st_uid == os.getuid() for t in inputs.logs)
    assert inputs.config_text is None and "config" in inputs.missing
    assert inputs.metrics is not None
