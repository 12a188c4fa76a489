"""`areal-console watch` on real jobs: the demo's hung job (stall, evidence, --exec, the
capture in `stacks --list`, a restarted watch, and `gone` when the job is killed), a
healthy run of the reference trainer (no event), and bad input."""

from __future__ import annotations

import json
import signal
import stat
import subprocess
import tarfile
from collections.abc import Iterator
from contextlib import AbstractContextManager
from pathlib import Path

import pytest
from areal_console.core.replay.demo import DemoJob, new_demo
from conftest import GlooJob, cli_env, run_cli, wait_for

from tests.support import watch_cli
from tests.support.cluster import free_port
from tests.support.watch_cli import Watch

pytestmark = pytest.mark.slow

FAST = ("--stall-after", "2", "--interval", "0.5")


@pytest.fixture(scope="module")
def hung() -> Iterator[DemoJob]:
    """The demo's job hung in its cleanup (two ranks), shared by this module's tests; the
    last test kills it."""
    job = new_demo("cleanup", nproc=2, dump_steps=1)
    try:
        job.start()
        job.wait_ready(timeout=300)
        yield job
    finally:
        job.stop()
        job.remove_files()


def watching(*args: str) -> AbstractContextManager[Watch]:
    return watch_cli.watching(*args, env=cli_env())


def test_a_hung_job_leaves_its_evidence_and_runs_exec(hung: DemoJob, tmp_path: Path) -> None:
    evidence_root = tmp_path / "evidence"
    env_file = tmp_path / "exec.env"
    args = ("--local", "--match", hung.tag, "--logs", str(hung.log_path), *FAST,
            "--evidence", str(evidence_root), "--json",
            "--exec", f"env | grep ^AREAL_CONSOLE_ > {env_file}.tmp && mv {env_file}.tmp {env_file}")  # fmt: skip
    with watching(*args) as watch:
        stall = watch.event("stall")
        evidence = watch.event("evidence")
        assert stall["job"] == evidence["job"] and str(stall["job"]).startswith("localhost:")
        assert stall["evidence"] is None and "no new step" in str(stall["detail"])
        folder = Path(str(evidence["evidence"]))
        assert folder.parent == evidence_root
        assert stat.S_IMODE(folder.stat().st_mode) == 0o700
        names = {p.name for p in folder.iterdir()}
        assert {"stacks.json", "stacks.txt", "ledger.json", "servers.json", "report.md",
                "report.tar.gz", "watch.json"} <= names  # fmt: skip
        stacks = json.loads((folder / "stacks.json").read_text())
        assert stacks["samples"] == 3 and stacks["tags"] == ["watch"]
        assert stacks["diagnosis"]["pattern"] == "cleanup_deadlock"
        assert len([r for r in stacks["ranks"] if r.get("rank") is not None]) == 2
        ledger = json.loads((folder / "ledger.json").read_text())
        assert ledger == stacks["ledger"] and ledger
        servers = json.loads((folder / "servers.json").read_text())
        assert [n["name"] for n in servers["nodes"]] == ["localhost"] or servers["nodes"]
        report = (folder / "report.md").read_text()
        assert "(`cleanup_deadlock`)" in report and "Training health (steps 0-" in report
        with tarfile.open(folder / "report.tar.gz") as tar:
            bundled = {m.name.split("/", 1)[1] for m in tar.getmembers()}
        assert {"stacks.json", "ledger.json", "report.md", "MANIFEST.txt"} <= bundled
        record = json.loads((folder / "watch.json").read_text())
        assert record["report"] == str(folder / "report.md")
        # The capture is in the store too, listed with its tag.
        listed = run_cli("stacks", "--list", "--json")
        assert listed.returncode == 0, listed.stderr
        rows = {c["id"]: c for c in json.loads(listed.stdout)["captures"]}
        assert rows[record["capture_id"]]["tags"] == ["watch"]
        assert rows[record["capture_id"]]["report"] == str(folder / "report.md")
        text = run_cli("stacks", "--list").stdout
        assert "[watch] cleanup_deadlock" in text
        # The user's command ran with the evidence in its environment, and only there.
        written = wait_for(lambda: env_file.exists() and env_file.read_text(), timeout=60,
                           what="--exec's output")  # fmt: skip
        env = dict(line.split("=", 1) for line in written.splitlines())
        assert env["AREAL_CONSOLE_EVENT"] == "stall"
        assert env["AREAL_CONSOLE_EVIDENCE"] == str(folder)
        assert env["AREAL_CONSOLE_REPORT"] == str(folder / "report.md")
        # Once per stall: the job stays hung, no second stall.
        assert watch.stop(signal.SIGTERM) == 0
        assert [e["event"] for e in watch.events()] == ["stall", "evidence"]
        assert not any("Traceback" in line for line in watch.err)
    # Nothing outside --evidence but the capture in the store (the data dir is tmp_path/data).
    assert {p.name for p in tmp_path.iterdir()} == {"evidence", "exec.env", "data"}
    assert [p.name for p in (tmp_path / "data").iterdir()] == ["captures"]
    # A restarted watch knows the episode: the same stall is not captured again.
    with watching(*args) as again:
        with pytest.raises(subprocess.TimeoutExpired):  # a window of several looks
            again.proc.wait(timeout=6)
        assert again.stop(signal.SIGINT) == 130
        assert again.events() == [], again.out
    assert len([p for p in evidence_root.iterdir() if not p.name.startswith(".")]) == 1


def test_a_healthy_run_raises_no_event(tmp_path: Path) -> None:
    """The reference trainer training (the demo without a hang: 2 ranks, a step every
    fraction of a second) for well past --stall-after: no event, no evidence."""
    job = new_demo("none", nproc=2, dump_steps=1)
    log = job.log_path
    try:
        job.start()
        job.wait_ready(timeout=300)
        with watching("--local", "--match", job.tag, "--logs", str(log), *FAST,
                      "--evidence", str(tmp_path / "ev"), "--json") as watch:  # fmt: skip
            watch.said("following")
            steps = log.read_bytes().count(b" done.")
            # Training goes on for well past --stall-after: 60 more steps (several seconds).
            wait_for(lambda: log.read_bytes().count(b" done.") > steps + 60, timeout=300,
                     what="60 more steps")  # fmt: skip
            assert job.process is not None and job.process.poll() is None
            assert watch.stop(signal.SIGINT) == 130
            assert watch.events() == [], watch.out
    finally:
        job.stop()
        job.remove_files()
    assert [p.name for p in (tmp_path / "ev").iterdir() if not p.name.startswith(".")] == []


def test_a_job_without_a_log_stalls_by_its_stacks_and_its_restart_is_a_new_episode(
    tmp_path: Path,
) -> None:
    """A gloo job that names no log: its stacks, unchanged across samples, are the stall.
    Killed: `gone`. Started again (new PIDs): a new episode, with its own evidence."""
    port = free_port()
    job = GlooJob(2, tmp_path / "first", port=port)
    try:
        with watching("--local", "--match", str(tmp_path), *FAST, "--evidence",
                      str(tmp_path / "ev"), "--json") as watch:  # fmt: skip
            assert "stacks unchanged" in str(watch.event("stall")["detail"])
            first = watch.event("evidence")["evidence"]
            job.stop()
            assert watch.event("gone")["evidence"] == first
            job = GlooJob(2, tmp_path / "second", port=port)
            wait_for(lambda: [e["event"] for e in watch.events()].count("evidence") == 2,
                     timeout=120, what=f"the second episode's evidence: {watch.out}")  # fmt: skip
            assert watch.stop(signal.SIGTERM) == 0
            kinds = [e["event"] for e in watch.events()]
            assert kinds == ["stall", "evidence", "gone", "stall", "evidence"]
            second = watch.events()[-1]["evidence"]
            assert second != first and Path(str(second)).is_dir() and Path(str(first)).is_dir()
    finally:
        job.stop()


def test_an_areal_job_is_followed_by_the_log_its_command_lines_name(tmp_path: Path) -> None:
    """AReaL's single-controller test job (workers hung in a gloo barrier, registered in
    name-resolve): the log directory comes from the workers' --fileroot/--experiment-name/
    --trial-name; then the same job named by `--areal E/T`."""
    import getpass

    from tests.tui.test_areal_processes import ArealRun

    run = ArealRun(tmp_path / "run", "collective", 2, env={"AREAL_STUB_REGISTER": "1"})
    try:
        with watching("--local", "--match", str(run.workdir), *FAST, "--evidence",
                      str(tmp_path / "ev"), "--json") as watch:  # fmt: skip
            log_dir = run.workdir / "logs" / getpass.getuser() / "gsm8k-grpo" / run.trial
            assert watch.said("following") == f"watch: following {log_dir}"
            stall = watch.event("stall")
            assert stall["job"] == f"areal:{run.job}"
            folder = Path(str(watch.event("evidence")["evidence"]))
            report = (folder / "report.md").read_text()
            assert "## Detailed Information" in report and str(run.trial) in report
            stacks = json.loads((folder / "stacks.json").read_text())
            assert stacks["job"] == f"areal:{run.job}" and stacks["tags"] == ["watch"]
            assert watch.stop(signal.SIGTERM) == 0
        # The same job by its AReaL name: its nodes from name-resolve, its log from --fileroot.
        with watching("--areal", run.job, "--name-resolve-root", str(run.workdir / "name_resolve"),
                      "--fileroot", str(run.workdir), *FAST, "--evidence", str(tmp_path / "ev2"),
                      "--json") as watch:  # fmt: skip
            assert watch.said("following") == f"watch: following {log_dir}"
            assert watch.event("stall")["job"] == f"areal:{run.job}"
            assert (Path(str(watch.event("evidence")["evidence"])) / "report.md").is_file()
            assert watch.stop(signal.SIGTERM) == 0
    finally:
        run.stop()


@pytest.mark.parametrize(
    ("args", "code", "message"),
    [
        (("--stall-after", "0"), 2, "argument --stall-after: '0': must be a number of seconds > 0"),
        (("--interval", "nan"), 2, "argument --interval: 'nan': must be a number of seconds > 0"),
        (("--keep", "0"), 2, "argument --keep: '0': must be a whole number >= 1"),
        (("--match", "("), 2, "bad --match regex '('"),
    ],
)
def test_bad_input_is_one_line(
    args: tuple[str, ...], code: int, message: str, tmp_path: Path
) -> None:
    result = run_cli("watch", "--local", "--evidence", str(tmp_path / "ev"), *args)
    assert result.returncode == code
    assert result.stdout == "" and len(result.stderr.splitlines()) == 1, result.stderr
    assert message in result.stderr
    assert not (tmp_path / "ev").exists()  # nothing started, nothing made


def test_an_unwritable_evidence_folder_is_one_line(tmp_path: Path) -> None:
    plain = tmp_path / "a-file"
    plain.write_text("")
    result = run_cli("watch", "--local", "--evidence", str(plain / "ev"))
    assert result.returncode == 1 and result.stdout == ""
    assert result.stderr.startswith(f"error: --evidence {plain / 'ev'}: cannot write there: ")
    assert len(result.stderr.splitlines()) == 1
    link = tmp_path / "link"
    link.symlink_to(tmp_path)
    result = run_cli("watch", "--local", "--evidence", str(link))
    assert result.returncode == 1 and "is a symbolic link" in result.stderr


def test_killing_the_job_is_gone_with_its_evidence_kept(hung: DemoJob, tmp_path: Path) -> None:
    """Last in this module: it kills the shared hung job."""
    root = tmp_path / "evidence"
    with watching("--local", "--match", hung.tag, "--logs", str(hung.log_path), *FAST,
                  "--evidence", str(root), "--json") as watch:  # fmt: skip
        folder = Path(str(watch.event("evidence")["evidence"]))
        hung.stop()
        gone = watch.event("gone")
        assert gone["evidence"] == str(folder) and gone["job"] == watch.events()[0]["job"]
        assert watch.stop(signal.SIGTERM) == 0
    assert (folder / "report.md").is_file() and (folder / "stacks.json").is_file()
    assert [e["event"] for e in watch.events()] == ["stall", "evidence", "gone"]
