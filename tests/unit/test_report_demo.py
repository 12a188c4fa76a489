"""`areal-console report` on the demo job (the reference trainer hung in its cleanup, with
AReaL-format metrics that drift and then stall), with secrets planted in the ranks'
environment and in the job's log."""

from __future__ import annotations

import os
import re
import secrets
import tarfile
from collections.abc import Iterator
from pathlib import Path

import pytest
from areal_console.core.replay.demo import DemoJob, new_demo
from conftest import run_cli

pytestmark = pytest.mark.slow

WANDB_KEY = secrets.token_hex(20)
HF_TOKEN = "hf_" + secrets.token_hex(16)
DB_PASSWORD = "pw" + secrets.token_hex(8)
PLANTED = (WANDB_KEY, HF_TOKEN, DB_PASSWORD)


@pytest.fixture(scope="module")
def demo() -> Iterator[DemoJob]:
    planted = {"WANDB_API_KEY": WANDB_KEY, "HF_TOKEN": HF_TOKEN, "NCCL_DEBUG": "WARN"}
    saved = {k: os.environ.get(k) for k in planted}
    os.environ.update(planted)  # the ranks inherit them
    job = new_demo("cleanup", nproc=2, dump_steps=2)
    try:
        job.start()
        job.wait_ready(timeout=300)
        with open(job.log_path, "a") as fh:  # the job is hung: nothing writes after this
            fh.write(f"export HF_TOKEN={HF_TOKEN}\ndb: postgres://svc:{DB_PASSWORD}@db:5432\n")
        yield job
    finally:
        for k, v in saved.items():
            if v is None:
                os.environ.pop(k, None)
            else:
                os.environ[k] = v
        job.stop()
        job.remove_files()


def test_report_on_the_demo_is_true_to_the_run_and_keeps_its_secrets(
    demo: DemoJob, tmp_path: Path
) -> None:
    result = run_cli("report", "--local", "--match", demo.tag, "--logs", str(demo.log_path),
                     "-o", str(tmp_path / "demo.md"), timeout=180)  # fmt: skip
    # The demo writes no config.yaml: the one part not collected, named; exit 3.
    assert result.returncode == 3, result.stderr
    assert "warning: not collected: config: no config.yaml in the log directory" in result.stderr
    md = (tmp_path / "demo.md").read_text()
    assert "Everyone waits on rank 1 (in cleanup_distributed (" in md
    assert "rank 0 only waits in the training loop" in md
    assert "(`cleanup_deadlock`)" in md and "rank 0 (1): all_reduce_gradients (" in md
    assert "Collective ledger (Flight Recorder):" in md
    # Health from the job's own log: its 30 steps and the drift away from 1.
    assert "Training health (steps 0-29, last step at " in md
    assert re.search(
        r"`ppo_actor/update/behave_imp_weight/avg` \(since step \d+, still at step 29\): ", md
    )
    assert "rank 0: hanging on purpose (debug.hang=cleanup)" in md
    assert "Not known: AReaL was not found in the ranks' interpreters." in md
    import platform

    import torch

    assert f"Python {platform.python_version()} " in md and f"torch {torch.__version__} " in md
    assert "NCCL_DEBUG=WARN" in md and "WANDB_API_KEY=***" in md
    assert "Command line of rank 0 (pid " in md and "debug.hang=cleanup" in md
    assert "export HF_TOKEN=***" in md and "postgres://svc:***@db:5432" in md
    bundle = tmp_path / "demo.tar.gz"
    assert bundle.stat().st_size <= 4 * 2**20
    with tarfile.open(bundle) as tar:
        names = [m.name.split("/", 1)[1] for m in tar.getmembers()]
        data = {m.name: tar.extractfile(m).read() for m in tar.getmembers()}  # type: ignore[union-attr]
    assert {"stacks.json", "ledger.json", "metrics.json", "report.md", "MANIFEST.txt"} <= set(names)
    assert any(n.endswith("/trainer.log") for n in names)
    for secret in PLANTED:
        assert secret not in md
        assert all(secret.encode() not in d for d in data.values()), secret


def test_report_finds_the_demo_log_as_the_tui_does(demo: DemoJob, tmp_path: Path) -> None:
    """No --logs: the demo's command lines name no AReaL log directory; its ranks write
    their output to trainer.log, which the agent reports, so the report has the log and
    the health from it (as `b` in the demo's console has)."""
    result = run_cli("report", "--local", "--match", demo.tag, "-o", str(tmp_path / "r.md"),
                     timeout=180)  # fmt: skip
    assert result.returncode == 3, result.stderr
    warnings = [line for line in result.stderr.splitlines() if line.startswith("warning:")]
    assert len(warnings) == 1, result.stderr  # logs and metrics were collected
    assert warnings[0].startswith("warning: not collected: config: no config.yaml"), warnings
    md = (tmp_path / "r.md").read_text()
    assert f"Log: `{demo.log_path}`" in md
    assert "rank 0: hanging on purpose (debug.hang=cleanup)" in md
    assert "Training health (steps 0-29, last step at " in md
