"""Record with the reference trainer, replay through the CLI, verify bit for bit (all real)."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest
import torch
from areal_console.core.replay.plan import METRIC_NAMES

ROOT = Path(__file__).resolve().parents[2]


def console_env(home: Path) -> dict[str, str]:
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join([str(ROOT / "tui"), str(ROOT / "agents")])
    env["AREAL_CONSOLE_DATA_DIR"] = str(home / "data")
    env["AREAL_CONSOLE_CONFIG_DIR"] = str(home / "config")
    for var, sub in (
        ("XDG_CACHE_HOME", "cache"),
        ("XDG_DATA_HOME", "share"),
        ("XDG_CONFIG_HOME", "xconfig"),
    ):
        env[var] = str(home / sub)
    return env


def console(home: Path, *args: str, timeout: float = 180) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "areal_console", *args],
        env=console_env(home),
        capture_output=True,
        text=True,
        timeout=timeout,
        check=False,
    )


@pytest.fixture(scope="module")
def home(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return tmp_path_factory.mktemp("console-home")


@pytest.fixture(scope="module")
def recording(home: Path) -> Iterator[Path]:
    """Four steps recorded with dumps, checkpoints and metrics."""
    dump = home / "dumps"
    proc = console(
        home,
        "trainer",
        "steps=4",
        "seed=3",
        "trajectory_debug.dump_rollout_data=true",
        f"trajectory_debug.path={dump}",
        f"output_dir={home / 'run'}",
    )
    assert proc.returncode == 0, proc.stderr
    yield dump


def replay_json(home: Path, *args: str) -> tuple[int, dict, str]:
    proc = console(home, "replay", *args, "--wait", "--json")
    return proc.returncode, (json.loads(proc.stdout) if proc.stdout.strip() else {}), proc.stderr


@pytest.mark.slow
def test_dumps_use_areal_layout(recording: Path) -> None:
    names = sorted(p.name for p in recording.glob("step_*.pt"))
    assert names == [f"step_{s:06d}.pt" for s in range(4)]  # AReaL's global steps, from 0
    groups = torch.load(recording / "step_000002.pt", weights_only=True)
    assert isinstance(groups, list) and len(groups) == 4  # one dict per prompt group
    g = groups[0]
    dtypes = {k: v.dtype for k, v in g.items()}
    assert dtypes == {
        "input_ids": torch.int32,
        "loss_mask": torch.int32,
        "logprobs": torch.float32,
        "versions": torch.int32,
        "turn_ids": torch.int32,
        "attention_mask": torch.bool,
        "rewards": torch.float32,
    }
    n, t = g["input_ids"].shape
    assert g["rewards"].shape == (n,) and all(
        v.shape == (n, t) for k, v in g.items() if k != "rewards"
    )
    prompt = g["loss_mask"] == 0
    assert (g["versions"][prompt & g["attention_mask"]] == -1).all()
    assert (g["versions"][g["loss_mask"].bool()] == 1).all()  # step 2 sampled by version 1 (lag 1)
    assert (g["logprobs"][g["loss_mask"].bool()] < 0).all()
    recorded = [json.loads(x) for x in (recording / "metrics.jsonl").read_text().splitlines()]
    assert [r["step"] for r in recorded] == [0, 1, 2, 3]
    assert set(METRIC_NAMES) <= set(recorded[0])
    assert sorted(p.name for p in (recording / "checkpoints").iterdir()) == [
        f"ckpt_{s:06d}.pt" for s in range(4)
    ]


@pytest.mark.slow
def test_replay_reproduces_every_step_bit_for_bit(home: Path, recording: Path) -> None:
    code, out, err = replay_json(home, str(recording))
    assert code == 0, err
    assert out["state"] == "finished" and out["exit_code"] == 0 and out["gpus"] == "cpu"
    assert out["verification"]["matched"] is True
    assert out["verification"]["steps"] == [0, 1, 2, 3]
    assert out["verification"]["first_mismatch"] is None
    assert (
        isinstance(out["command"], list)
        and "trajectory_debug.replay_rollout_data=true" in out["command"]
    )
    assert Path(out["log"]).read_text().count("(replayed)") == 4


@pytest.mark.slow
def test_replay_from_a_checkpointed_later_step(home: Path, recording: Path) -> None:
    code, out, err = replay_json(home, str(recording / "step_000002.pt"), "--steps", "2:3")
    assert code == 0, err
    assert out["verification"]["matched"] is True and out["verification"]["steps"] == [2, 3]


@pytest.mark.slow
def test_tampered_dump_is_reported_as_differing(home: Path, recording: Path) -> None:
    tampered = home / "tampered"
    shutil.copytree(recording, tampered)
    groups = torch.load(tampered / "step_000002.pt", weights_only=True)
    groups[0]["rewards"] = 1.0 - groups[0]["rewards"]
    torch.save(groups, tampered / "step_000002.pt")
    code, out, err = replay_json(home, str(tampered), "--steps", "0:2")
    assert code == 1
    assert out["state"] == "finished"
    mismatch = out["verification"]["first_mismatch"]
    assert out["verification"]["matched"] is False and mismatch["step"] == 2
    assert mismatch["recorded"] != mismatch["replayed"]
    assert out["verification"]["steps"] == [0, 1]
    assert "replay differs from recording at step 2" in err


@pytest.mark.slow
def test_cross_device_recording_says_so_and_compares_within_tolerance(
    home: Path, recording: Path
) -> None:
    """A recording made on CUDA (its trajectory_meta.json says so), replayed on this CPU:
    the device of each is said before launch and the comparison is within a tolerance."""
    meta = json.loads((recording / "trajectory_meta.json").read_text())
    assert meta["device"] == "cpu" and meta["device_name"] == "cpu"  # what was recorded here
    on_cuda = home / "cuda-recording"
    shutil.copytree(recording, on_cuda)
    meta.update(device="cuda", device_name="NVIDIA H100 80GB HBM3")
    (on_cuda / "trajectory_meta.json").write_text(json.dumps(meta))
    dry = console(home, "replay", str(on_cuda), "--steps", "1:2", "--dry-run")
    assert dry.returncode == 0, dry.stderr
    assert (
        "recorded on cuda, replaying on cpu: cross-device, compared within a relative "
        "tolerance of 0.001" in dry.stderr
    )
    code, out, err = replay_json(home, str(on_cuda), "--steps", "1:2")
    assert code == 0, err
    assert (out["recorded_device"], out["device"], out["tolerance"]) == ("cuda", "cpu", 0.001)
    assert out["verification"]["matched"] is True
    assert "within relative tolerance 0.001, cross-device" in out["verification"]["summary"]


@pytest.mark.slow
def test_verifying_after_the_recording_is_gone_cannot_compare(home: Path, recording: Path) -> None:
    from areal_console.core.connection.fleet import Fleet
    from areal_console.core.replay import runs as jobs
    from areal_console.core.targets.resolve import local_node
    from areal_console.screens.runs import RunRow

    copy = home / "soon-gone"
    shutil.copytree(recording, copy)
    code, out, err = replay_json(home, str(copy), "--steps", "1:1")
    assert code == 0 and out["verification"]["matched"] is True, err
    shutil.rmtree(copy)  # the recording (and its metrics) deleted after the replay
    env = console_env(home)
    with pytest.MonkeyPatch.context() as mp:
        for key in ("AREAL_CONSOLE_DATA_DIR", "XDG_CACHE_HOME"):
            mp.setenv(key, env[key])
        record = next(r for r in jobs.load_runs() if r.job_id == out["job_id"])
        fleet = Fleet([local_node()])
        try:
            result = jobs.verify_run(fleet.sessions[0], record)  # what `v` does
        finally:
            fleet.close()
    assert result is not None and not result.matched and not result.comparable
    assert result.summary.startswith("cannot compare with the recording: ")
    assert "differs" not in result.summary
    assert RunRow(record).cells()[-1] == "cannot compare"


def test_missing_step_lists_available_steps(home: Path, recording: Path) -> None:
    proc = console(home, "replay", str(recording), "--steps", "2:9", "--wait")
    assert proc.returncode == 1
    assert "no dump for step 4" in proc.stderr and "available steps: 0-3" in proc.stderr
    assert "Traceback" not in proc.stderr


def test_gpu_index_the_node_does_not_have(home: Path, recording: Path) -> None:
    proc = console(home, "replay", str(recording), "--gpus", "3", "--wait")
    assert proc.returncode == 1
    assert "has no GPU" in proc.stderr and "--gpus cpu" in proc.stderr


def test_replay_that_also_dumps_is_refused(home: Path, recording: Path) -> None:
    proc = console(home, "replay", str(recording), "trajectory_debug.dump_rollout_data=true")
    assert proc.returncode == 2 and "mutually exclusive" in proc.stderr


def test_trainer_refuses_both_flags(home: Path) -> None:
    proc = console(
        home,
        "trainer",
        "trajectory_debug.dump_rollout_data=true",
        "trajectory_debug.replay_rollout_data=true",
        f"trajectory_debug.path={home}/x",
    )
    assert proc.returncode == 2  # a usage error: the arguments contradict each other
    assert proc.stderr.strip() == (
        "error: trajectory_debug.dump_rollout_data and trajectory_debug.replay_rollout_data "
        "are mutually exclusive: set only one"
    )


@pytest.mark.parametrize(
    ("args", "line"),
    [
        (["steps=abc"], "error: steps must be an integer, got 'abc'"),
        (["actor.eps_clip=abc"], "error: actor.eps_clip must be a number, got 'abc'"),
        (["nope=1"], "error: unknown config key 'nope' (known: actor.eps_clip, "),
        # Out of range: each failed in the first step with a traceback.
        (["gconfig.n_samples=0"], "error: gconfig.n_samples must be >= 1, got 0\n"),
        (["train_dataset.batch_size=0"], "error: train_dataset.batch_size must be >= 1, got 0\n"),
        (["gconfig.temperature=0"], "error: gconfig.temperature must be > 0, got 0\n"),
        (["threads=0"], "error: threads must be >= 1, got 0\n"),
        (["model.n_heads=3"], "error: model.d_model must be a multiple of model.n_heads, "
                              "got d_model=32 n_heads=3\n"),
        (["rollout.max_head_offpolicyness=-1"],
         "error: rollout.max_head_offpolicyness must be >= 0, got -1\n"),
        (["--nproc", "0"], "error: areal-console trainer: argument --nproc: needs a whole "
                           "number >= 1, got '0'"),
        (["--nproc", "-1"], "error: areal-console trainer: argument --nproc: needs a whole "
                            "number >= 1, got '-1'"),
    ],
)  # fmt: skip
def test_trainer_usage_errors_exit_2_in_one_line(home: Path, args: list[str], line: str) -> None:
    proc = console(home, "trainer", *args, timeout=60)
    assert proc.returncode == 2, proc.stderr
    assert proc.stderr.count("\n") == 1 and proc.stderr.startswith(line), proc.stderr
    assert proc.stdout == ""  # nothing ran


def test_piped_trainer_output_is_plain_text(home: Path, tmp_path: Path) -> None:
    proc = console(home, "trainer", "steps=1", f"output_dir={tmp_path}")  # stdout: a pipe
    assert proc.returncode == 0, proc.stderr
    assert "\x1b" not in proc.stdout + proc.stderr
    assert "(AReaL) " in proc.stdout and " StatsLogger INFO: Epoch 1/1 Step 1/1" in proc.stdout


def test_piped_replay_wait_output_is_plain_text(home: Path, recording: Path) -> None:
    # The run's log holds AReaL's coloured lines; what --wait shows of it is plain text.
    assert (
        "\x1b[92m"
        in Path(replay_json(home, str(recording), "--steps", "3:3")[1]["log"]).read_text()
    )
    proc = console(home, "replay", str(recording), "--steps", "3:3", "--wait")
    assert proc.returncode == 0, proc.stderr
    assert "\x1b" not in proc.stdout + proc.stderr and "\\x1b" not in proc.stderr
    # The log's own lines, shown while waiting (a run that ends between two looks shows
    # only its verdict, which is read from the same coloured log).
    shown = [line for line in proc.stderr.splitlines() if line.startswith("replay: replay-")]
    assert shown or "bit for bit" in proc.stderr, proc.stderr


def test_the_trainer_itself_refuses_no_ranks(home: Path) -> None:
    proc = subprocess.run([sys.executable, "-m", "areal_node.trainer", "--nproc", "0"],
                          env=console_env(home), capture_output=True, text=True, timeout=60,
                          check=False)  # fmt: skip
    assert proc.returncode == 2
    assert proc.stderr == "error: --nproc needs a whole number >= 1, got '0'\n"


@pytest.mark.parametrize(
    ("override", "line"),
    [
        ("notakv", "error: expected key=value, got 'notakv'"),
        ("actor.nope=3", "error: overrides: unknown config key 'actor.nope' (known: "),
        ("gconfig.n_samples=0", "error: overrides: gconfig.n_samples must be >= 1, got 0\n"),
    ],
)
def test_replay_usage_errors_exit_2_before_launching(
    home: Path, recording: Path, override: str, line: str
) -> None:
    proc = console(home, "replay", str(recording), override, "--wait")
    assert proc.returncode == 2, proc.stderr
    assert proc.stderr.count("\n") == 1 and proc.stderr.startswith(line), proc.stderr
    assert "job " not in proc.stdout  # nothing launched


def test_a_replay_that_fails_in_its_log_prints_the_reason(home: Path, recording: Path) -> None:
    # A value the trainer refuses only once it starts (not a key or a type): the reason
    # is in the run's log, and the console prints it.
    proc = console(home, "replay", str(recording), "actor.rejection_sampling.level=sequence",
                   "--steps", "0:0", "--wait")  # fmt: skip
    assert proc.returncode == 1, proc.stderr
    last = proc.stderr.strip().splitlines()[-1]
    assert last.startswith("error: replay failed: exit code 2: this trainer supports "
                           "actor.rejection_sampling with level=token"), last  # fmt: skip
    assert "(log: " in last


def test_trainer_writes_into_the_data_dir_and_says_where(home: Path, tmp_path: Path) -> None:
    """Without `output_dir=` the metrics go to a new folder in the data dir, never into
    the current directory, and the first line says where."""
    proc = subprocess.run(
        [sys.executable, "-m", "areal_console", "trainer", "steps=1"],
        env=console_env(home), cwd=tmp_path, capture_output=True, text=True, timeout=180,
        check=False,
    )  # fmt: skip
    assert proc.returncode == 0, proc.stderr
    assert list(tmp_path.iterdir()) == []
    first = proc.stdout.splitlines()[0]
    assert first.startswith("metrics: "), proc.stdout
    metrics = Path(first.removeprefix("metrics: "))
    assert metrics.is_relative_to(home / "data" / "trainer-runs")
    assert json.loads(metrics.read_text().splitlines()[0])["step"] == 0
    # AReaL's progress line: "Train step N" is global step N-1.
    assert "Epoch 1/1 Step 1/1 Train step 1/1 done." in proc.stdout


@pytest.mark.slow
def test_dump_rotation_keeps_pinned_steps(home: Path) -> None:
    dump = home / "rotated"
    proc = console(
        home,
        "trainer",
        "steps=6",
        "trajectory_debug.dump_rollout_data=true",
        f"trajectory_debug.path={dump}",
        "trajectory_debug.dump_steps=[1,2,4,5]",
        "trajectory_debug.max_keep=2",
        "trajectory_debug.pin_steps=[1]",
        f"output_dir={home / 'rotated-run'}",
    )
    assert proc.returncode == 0, proc.stderr
    assert sorted(p.name for p in dump.glob("step_*.pt")) == [
        "step_000001.pt",
        "step_000004.pt",
        "step_000005.pt",
    ]
    assert sorted(p.name for p in (dump / "checkpoints").iterdir()) == [
        "ckpt_000001.pt",
        "ckpt_000004.pt",
        "ckpt_000005.pt",
    ]


@pytest.mark.slow
def test_two_rank_recording_replays_and_rejects_other_dp_sizes(home: Path) -> None:
    dump = home / "dp2"
    proc = console(
        home,
        "trainer",
        "--nproc",
        "2",
        "steps=2",
        "trajectory_debug.dump_rollout_data=true",
        f"trajectory_debug.path={dump}",
        f"output_dir={home / 'dp2-run'}",
    )
    assert proc.returncode == 0, proc.stderr
    assert sorted(p.name for p in dump.glob("step_*.pt")) == [
        "step_000000_dp_0.pt",
        "step_000000_dp_1.pt",
        "step_000001_dp_0.pt",
        "step_000001_dp_1.pt",
    ]
    wrong = console(
        home,
        "trainer",
        "trajectory_debug.replay_rollout_data=true",
        f"trajectory_debug.path={dump}",
        "steps=2",
    )
    assert wrong.returncode == 1
    assert (
        "dumped with 2 data-parallel rank(s) but this run has 1: replay with --nproc 2"
        in wrong.stderr
    )
    code, out, err = replay_json(home, str(dump))
    assert code == 0, err
    assert (
        "--nproc" in out["command"] and out["command"][out["command"].index("--nproc") + 1] == "2"
    )
    assert out["verification"]["matched"] is True and out["verification"]["steps"] == [0, 1]


@pytest.mark.slow
def test_overrides_make_a_changed_run_compared_on_what_they_leave_unchanged(
    home: Path, recording: Path
) -> None:
    proc = console(home, "replay", str(recording), "actor.eps_clip=0.1", "--steps", "0:1", "--wait")
    assert proc.returncode == 0, proc.stderr
    assert "error" not in proc.stderr and "differs" not in proc.stdout + proc.stderr
    assert "replay: overrides change the run (actor.eps_clip=0.1): its loss and gradients" in (
        proc.stderr
    )
    assert (
        "overrides change the run (actor.eps_clip=0.1): loss and gradients not compared; what "
        "they leave unchanged matches the recording (task_reward, seq_len, no_eos_ratio, "
        "steps 0-1, bit for bit)"
    ) in proc.stdout
    code, out, err = replay_json(home, str(recording), "actor.eps_clip=0.1", "--steps", "0:1")
    assert code == 0, err
    v = out["verification"]
    assert v["matched"] is None and v["comparable"] is True and v["steps"] == [0, 1]
    assert v["overrides"] == ["actor.eps_clip=0.1"]
    assert v["compared"] == ["task_reward", "seq_len", "no_eos_ratio"]
    # The saved run names its overrides (the Runs screen reads it from there).
    run = next((home / "data" / "jobs").glob(f"{out['job_id']}.json"))
    assert json.loads(run.read_text())["extra"]["overrides"] == ["actor.eps_clip=0.1"]


@pytest.mark.slow
def test_an_override_of_the_data_says_why_nothing_is_compared(home: Path, recording: Path) -> None:
    code, out, err = replay_json(home, str(recording), "gconfig.max_new_tokens=5", "--steps", "0:0")
    assert code == 0, err
    v = out["verification"]
    assert v["matched"] is None and v["comparable"] is False
    assert v["summary"] == (
        "overrides change the run (gconfig.max_new_tokens=5): not compared with the "
        "recording: gconfig.max_new_tokens may change the data the replay reads"
    )


@pytest.mark.slow
def test_a_changed_run_on_another_batch_still_differs(home: Path, recording: Path) -> None:
    tampered = home / "tampered-changed"
    shutil.copytree(recording, tampered)
    groups = torch.load(tampered / "step_000001.pt", weights_only=True)
    groups[0]["rewards"] = 1.0 - groups[0]["rewards"]
    torch.save(groups, tampered / "step_000001.pt")
    code, out, err = replay_json(home, str(tampered), "actor.eps_clip=0.1", "--steps", "0:1")
    assert code == 1, err
    v = out["verification"]
    assert v["matched"] is False and v["first_mismatch"]["metric"] == "task_reward"
    errors = [line for line in err.splitlines() if line.startswith("error:")]
    assert len(errors) == 1 and errors[0].startswith(
        f"error: replay {out['job_id']} does not match its recording: overrides change the run "
        "(actor.eps_clip=0.1), yet what they leave unchanged differs from the recording at step 1"
    )


def without_torch_on_path(home: Path) -> str:
    """A PATH whose `python3` is a real interpreter without torch (an unactivated venv)."""
    bin_dir = home / "bare-bin"
    bin_dir.mkdir(exist_ok=True)
    bare = shutil.which("python3", path="/usr/bin:/bin")
    if bare is None or subprocess.run([bare, "-c", "import torch"], capture_output=True,
                                      check=False).returncode == 0:  # fmt: skip
        pytest.skip("no system python3 without torch on this machine")
    link = bin_dir / "python3"
    if not link.exists():
        link.symlink_to(bare)
    return f"{bin_dir}:/usr/bin:/bin"


@pytest.mark.slow
def test_replay_runs_with_the_agents_python_not_a_bare_python3(home: Path, recording: Path) -> None:
    path = without_torch_on_path(home)
    env = console_env(home) | {"PATH": path}
    proc = subprocess.run([sys.executable, "-m", "areal_console", "replay", str(recording),
                           "--steps", "0:0", "--wait", "--json"], env=env, capture_output=True,
                          text=True, timeout=180, check=False)  # fmt: skip
    assert proc.returncode == 0, proc.stderr
    out = json.loads(proc.stdout)
    assert out["command"][0] == sys.executable
    assert out["verification"]["matched"] is True


@pytest.mark.slow
def test_a_python_without_torch_is_refused_before_launching(home: Path, recording: Path) -> None:
    bare = without_torch_on_path(home).split(":")[0] + "/python3"
    before = set((home / "data" / "jobs").glob("replay-*.json"))
    proc = console(home, "replay", str(recording), "--python", bare, "--wait")
    assert proc.returncode == 1
    errors = [line for line in proc.stderr.splitlines() if line.startswith("error:")]
    assert errors == [
        f"error: {errors[0].split(':')[1].strip()}: {bare} cannot import torch "
        "(ModuleNotFoundError: No module named 'torch'): pass --python with the interpreter "
        "of the environment that trains (e.g. ~/venv/bin/python)"
    ]
    assert "Traceback" not in proc.stderr
    assert set((home / "data" / "jobs").glob("replay-*.json")) == before  # nothing launched
