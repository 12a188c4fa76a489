"""`areal-console report` on the AReaL single-controller test job (tests/jobs/
areal_controller.py: real workers hung in a gloo barrier in their EngineWorker threads,
AReaL's log directory, config.yaml), with secrets planted in the controller's argv, the
workers' environment, config.yaml and a role log; then on the same job once it is gone."""

from __future__ import annotations

import getpass
import json
import re
import secrets
import socket
from collections.abc import Iterator
from pathlib import Path

import pytest
from areal_console.core.targets.resolve import local_node
from conftest import run_cli

from tests.support.report_checks import (
    Planted,
    areal_checkout,
    assert_template,
    bundle_files,
)
from tests.support.report_checks import assert_no_secret as check_no_secret
from tests.tui.test_areal_processes import STUB, ArealRun

PLANT = Planted()
WANDB_KEY, HF_TOKEN, RAY_TOKEN = PLANT.wandb, PLANT.hf, PLANT.ray
PLANTED = PLANT.values


@pytest.fixture(scope="module")
def planted_run(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ArealRun]:
    # AReaL from a source checkout (a git work tree on PYTHONPATH), at a known commit.
    checkout = tmp_path_factory.mktemp("areal-checkout")
    commit = areal_checkout(STUB, checkout)
    env = {**PLANT.env(), "NCCL_DEBUG": "INFO"}
    args = ("--config", "gsm8k_grpo.yaml", f"--hf-token={HF_TOKEN}",
            f"RAY_AUTH_TOKEN={RAY_TOKEN}", "actor.path=Qwen/Qwen2.5-1.5B")  # fmt: skip
    run = ArealRun(tmp_path_factory.mktemp("areal-report"), "collective", 2, stub=checkout,
                   env=env, script_args=args)  # fmt: skip
    run.commit = commit  # type: ignore[attr-defined]
    log_dir = run.workdir / "logs" / getpass.getuser() / "gsm8k-grpo" / run.trial
    # Chatter enough that a small bound must cut the logs (random: it does not compress).
    with open(log_dir / "merged.log", "a") as fh:
        fh.writelines(f"[actor]     debug {secrets.token_hex(32)}\n" for _ in range(3000))
    # A role log echoing the W&B key without its name (as wandb's login line does).
    with open(log_dir / "actor.log", "a") as fh:
        fh.write(PLANT.wandb_login_line())
    try:
        yield run
    finally:
        run.stop()


def assert_no_secret(markdown: str, files: dict[str, bytes]) -> None:
    check_no_secret(PLANTED, markdown, files)


def test_report_on_the_hung_job_has_every_section_true_to_the_run(
    planted_run: ArealRun, tmp_path: Path
) -> None:
    out_md = tmp_path / "bug.md"
    result = run_cli("report", "--local", "--match", str(planted_run.workdir), "-o", str(out_md))
    assert result.returncode == 0, result.stderr
    assert f"wrote {out_md} and {tmp_path / 'bug.tar.gz'}" in result.stdout
    md = out_md.read_text()
    assert_template(md)
    assert (
        "- [ ] I can consistently reproduce the bug across multiple trials or random seeds." in md
    )
    # Checklist hint: rank 1 is elsewhere (slow_step), rank 0 only waits in the barrier.
    checklist = md[: md.index("## Detailed Information")]
    assert "Everyone waits on rank 1 (in slow_step" in checklist
    assert "rank 0 only waits in a collective" in checklist
    # Describe the bug: the diagnosis as `stacks --json` gives it.
    assert "**Ranks wait in one collective for a straggler** (`same_collective`)" in md
    assert "rank 0 (1): train_batch (" in md
    assert "Collective ledger" in md and "Training health" in md
    # Full logs: each role's log in AReaL's log directory, the end of it.
    logs = md[md.index("### Full logs") : md.index("## To Reproduce")]
    log_dir = planted_run.workdir / "logs" / getpass.getuser() / "gsm8k-grpo" / planted_run.trial
    node = local_node().name
    assert f"Log directory: `{log_dir}` on {node};" in logs
    assert f"**Node {node}**:" in logs  # one node: one group, each role's log in it
    assert f"actor: {log_dir}/actor.log (last" in logs
    assert f"every role: {log_dir}/merged.log (last" in logs
    actor = logs[logs.index("actor.log (last") : logs.index("merged.log (last")]
    assert "worker actor/1 serving on" in actor and "[actor]     debug " in logs
    # Commit ID: the checkout's version and HEAD, read from its files.
    commit = md[md.index("### Commit ID") : md.index("### Environment")]
    assert f"AReaL 2.0.0, git commit `{planted_run.commit}` on branch `main`" in commit  # type: ignore[attr-defined]
    # Environment: this interpreter, this torch, the OS; the ranks' NCCL_DEBUG.
    import platform

    import torch

    env = md[md.index("### Environment") : md.index("### Script")]
    assert f"Python {platform.python_version()} " in env
    assert f"torch {torch.__version__} (CUDA none, NCCL not found)" in env
    assert "NCCL_DEBUG=INFO" in env and "WANDB_API_KEY=***" in env and "HF_TOKEN=***" in env
    # Script: the controller's command line (secrets masked, names kept) and config.yaml.
    script = md[md.index("### Script") :]
    assert "areal_controller.py" in script and "--hf-token=***" in script
    assert "RAY_AUTH_TOKEN=***" in script and "actor.path=Qwen/Qwen2.5-1.5B" in script
    assert f"trial_name: {planted_run.trial}" in script
    assert "wandb_api_key: '***'" in script and "https://bob:***@wandb.example.com" in script
    # The bundle: every part, within the default bound, no secret anywhere.
    files = bundle_files(tmp_path / "bug.tar.gz")
    assert {"report.md", "MANIFEST.txt", "stacks.json", "metrics.json", "config.yaml",
            "versions.json", "processes.json", f"logs/{node}/actor.log"} <= set(files)  # fmt: skip
    assert (tmp_path / "bug.tar.gz").stat().st_size <= 4 * 2**20
    doc = json.loads(files["stacks.json"])
    assert doc["diagnosis"]["pattern"] == "same_collective"
    assert b"***(wandb_api_key)" in files[f"logs/{node}/actor.log"]  # the echoed key, named
    assert_no_secret(md, files)


def test_report_anonymized_and_cut_to_a_small_bound(planted_run: ArealRun, tmp_path: Path) -> None:
    out_md = tmp_path / "anon.md"
    result = run_cli("report", "--local", "--match", str(planted_run.workdir), "-o", str(out_md),
                     "--anonymize", "--max-bundle-mb", "0.02")  # fmt: skip
    assert result.returncode == 0, result.stderr
    assert "note: cut to fit --max-bundle-mb 0.02: " in result.stderr
    bundle = tmp_path / "anon.tar.gz"
    assert bundle.stat().st_size <= 0.02 * 2**20
    md = out_md.read_text()
    files = bundle_files(bundle)
    assert "cut to fit the bound:" in files["MANIFEST.txt"].decode()
    user, host = getpass.getuser(), socket.gethostname()
    for text in [md, *(d.decode(errors="replace") for d in files.values())]:
        assert f"/{user}/" not in text
        assert not re.search(rf"(?<![\w.-]){re.escape(host)}(?![\w-])", text)
        assert "127.0.0.1" not in text
    assert "/logs/user-1/gsm8k-grpo/" in md  # the same alias wherever the user stood
    assert_no_secret(md, files)


def test_report_on_a_gone_job_from_its_saved_capture_and_log_dir(
    planted_run: ArealRun, tmp_path: Path
) -> None:
    taken = run_cli("stacks", "--local", "--json", "--match", str(planted_run.workdir))
    assert taken.returncode == 0, taken.stderr
    capture_id = json.loads(taken.stdout)["id"]
    result = run_cli("report", "--capture", capture_id, "-o", str(tmp_path / "gone.md"))
    # Everything came from the saved capture and the log directory its command lines name.
    assert result.returncode == 0, result.stderr
    md = (tmp_path / "gone.md").read_text()
    assert f"stacks from the saved capture {capture_id} taken at" in md
    assert "(`same_collective`)" in md and "worker actor/0 serving on" in md
    assert f"trial_name: {planted_run.trial}" in md
    assert_no_secret(md, bundle_files(tmp_path / "gone.tar.gz"))


def test_report_says_what_it_could_not_collect(tmp_path: Path) -> None:
    # No job on the targets, no saved capture: every part named, exit 3, still written.
    result = run_cli("report", "--local", "--match", "no-such-job-" + secrets.token_hex(4),
                     "-o", str(tmp_path / "none.md"))  # fmt: skip
    assert result.returncode == 3, result.stderr
    assert "warning: not collected: stacks: no rank of the job runs on the targets" in result.stderr
    # logs, config and metrics share one reason: one line names the three.
    assert "warning: not collected: logs, config, metrics: the log directory is not known" in (
        result.stderr
    )
    assert result.stderr.count("warning: not collected:") == 2, result.stderr
    md = (tmp_path / "none.md").read_text()
    assert "Not collected by areal-console:" in md and "### Environment" in md


def test_report_bad_input_is_one_line(tmp_path: Path) -> None:
    result = run_cli("report", "--max-bundle-mb", "lots")
    assert result.returncode == 2
    assert result.stderr.startswith("error: ") and len(result.stderr.splitlines()) == 1
    result = run_cli("report", "--capture", "nope-" + secrets.token_hex(3))
    assert result.returncode == 1
    assert result.stderr.startswith("error: no saved capture") and "Traceback" not in result.stderr


async def test_b_on_stacks_and_health_previews_then_writes_the_report(
    planted_run: ArealRun, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from areal_console.app import create_app
    from areal_console.core.common.settings import Settings
    from areal_console.core.metrics.locate import HealthTarget
    from areal_console.dialogs.report_preview import ReportPreview
    from textual.widgets import DataTable, Static

    from tests.support.waits import until

    monkeypatch.chdir(tmp_path)  # the preview writes to the working directory
    log_dir = planted_run.workdir / "logs" / getpass.getuser() / "gsm8k-grpo" / planted_run.trial
    app = create_app([local_node()], settings=Settings(), initial_filter=str(planted_run.workdir),
                     refresh_interval=0.5, health_target=HealthTarget(str(log_dir)))  # fmt: skip
    async with app.run_test(size=(120, 40)) as pilot:
        procs = app.screen.query_one("#processes", DataTable)
        await until(pilot, lambda: procs.row_count >= 2, timeout=60)
        await pilot.press("s")
        await until(pilot, lambda: getattr(app.screen, "diagnosis", None) is not None, timeout=90)
        await pilot.press("b")
        await until(pilot, lambda: isinstance(app.screen, ReportPreview)
                    and app.screen.report is not None, timeout=60)  # fmt: skip
        preview = app.screen
        assert isinstance(preview, ReportPreview) and preview.report is not None
        shown = str(preview.query_one("#report-text", Static).render())
        assert "## Checklist\n\n- [ ] The error occurs" in shown and "(`same_collective`)" in shown
        assert f"git commit `{planted_run.commit}`" in shown  # type: ignore[attr-defined]
        assert_no_secret(shown, {})
        await pilot.press("a")  # anonymized: the user in the log path is an alias now
        await until(pilot, lambda: "/logs/user-1/gsm8k-grpo/" in str(
            preview.query_one("#report-text", Static).render()), timeout=30)  # fmt: skip
        await pilot.press("w")
        await until(pilot, lambda: not isinstance(app.screen, ReportPreview), timeout=30)
        written = sorted(tmp_path.glob("areal-report-*"))
        assert [p.suffix for p in written] == [".md", ".gz"]
        md = written[0].read_text()
        assert "/logs/user-1/gsm8k-grpo/" in md and f"/{getpass.getuser()}/" not in md
        assert_no_secret(md, bundle_files(written[1]))
        # Health: the same key; the report has this run's log and the capture just taken.
        await pilot.press("escape", "5")
        await until(pilot, lambda: type(app.screen).__name__ == "HealthScreen", timeout=30)
        await pilot.press("b")
        await until(pilot, lambda: isinstance(app.screen, ReportPreview)
                    and app.screen.report is not None, timeout=60)  # fmt: skip
        assert isinstance(app.screen, ReportPreview) and app.screen.report is not None
        md = app.screen.report.markdown
        assert "(`same_collective`)" in md and f"{log_dir}/actor.log" in md
        await pilot.press("escape")
        await until(pilot, lambda: type(app.screen).__name__ == "HealthScreen", timeout=30)
        await pilot.press("q")


def test_report_on_a_rollout_stall_names_the_server_its_health_and_flags(
    tmp_path_factory: pytest.TempPathFactory, tmp_path: Path
) -> None:
    run = ArealRun(tmp_path_factory.mktemp("areal-report-rollout"), "rollout", 1,
                   health="unhealthy")  # fmt: skip
    try:
        server = json.loads((run.workdir / "server.json").read_text())
        result = run_cli("report", "--local", "--match", str(run.workdir), "-o",
                         str(tmp_path / "rollout.md"))  # fmt: skip
        assert result.returncode == 0, result.stderr
        md = (tmp_path / "rollout.md").read_text()
        assert "(`rollout_stall`)" in md
        servers = md[md.index("Inference servers:") : md.index("### Expected behavior")]
        assert f"- sglang on {local_node().name}, pid {server['pid']}, " in servers
        assert f"http://127.0.0.1:{server['port']}/health: unhealthy (503); flags:" in servers
        assert f"--model-path stub-model --host 127.0.0.1 --port {server['port']}" in servers
        # The controller's command line is the script that ran.
        assert "Command line of the controller (pid " in md
    finally:
        run.stop()


def test_report_into_a_missing_folder_is_one_line_and_makes_no_folder(tmp_path: Path) -> None:
    out = tmp_path / "missing" / "dir" / "r.md"
    result = run_cli("report", "--local", "--match", "no-such-job", "-o", str(out))
    assert result.returncode == 1
    assert result.stderr == f"error: -o {out}: no folder {out.parent} (create it first)\n"
    assert not (tmp_path / "missing").exists()
