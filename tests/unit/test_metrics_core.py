"""Training metrics from AReaL's logs: the parser, the tensorboard reader, the guide's checks.

Every log here is written by tests/support/areal_logfmt.py, a cited transcription of AReaL's own
StatsLogger/printing/logging code run with the real `tabulate`, `colorlog` and
`tensorboardX` packages.
"""

from __future__ import annotations

import logging
import math
import os
import random
import subprocess
import types
from pathlib import Path

import pytest
from areal_console.core.common.textfmt import format_duration
from areal_console.core.metrics.follow import LocalFiles, MetricsFollower
from areal_console.core.metrics.health import (
    BEHAVE_IMP_WEIGHT,
    IMPORTANCE_WEIGHT,
    NO_EOS_RATIO,
    ROLLOUT_REWARD,
    SEQ_LEN,
    TASK_REWARD,
    HealthThresholds,
    stall_state,
)
from areal_console.core.metrics.logdir import log_dir_from_processes, run_identity
from areal_console.core.metrics.logparse import LogParser, parse_log
from areal_console.core.metrics.report import build_report, report_json
from areal_console.core.metrics.tboard import TensorboardReader

from tests.support.areal_logfmt import AReaLLogWriter, actor_stats, tabulate_stats, write_run
from tests.support.areal_source import AReaLSource


def rounded(value: float) -> float:
    return float(f"{value:.4e}")


def areal_module(areal: AReaLSource, path: str) -> types.ModuleType:
    """One of AReaL's modules, run from its file under a private name (never imported as
    `areal...`)."""
    module = types.ModuleType(f"areal_under_test.{path.replace('/', '.')[:-3]}")
    exec(compile(areal.read(path), path, "exec"), module.__dict__)
    return module


def test_transcribed_tabulate_stats_matches_areals_own_function(areal: AReaLSource) -> None:
    """AReaL's printing.py gives the same table."""
    printing = areal_module(areal, "areal/utils/printing.py")
    for n in (1, 3, 4, 5, 83):
        stats = dict(list(actor_stats(7).items())[:n])
        assert printing.tabulate_stats(stats) == tabulate_stats(stats)


def test_log_lines_are_what_areals_logging_code_writes(tmp_path: Path, areal: AReaLSource) -> None:
    """main.log and merged.log as AReaL's own `setup_file_logging` handlers write them, and
    rank 0's stdout (trainer.log) as its `plain` formatter prints it, byte for byte, for the
    loggers and messages the test logs use (one-line and table records)."""
    logging_py = areal_module(areal, "areal/utils/logging.py")
    logging_py.setup_file_logging(str(tmp_path / "areal"))
    handlers = list(logging_py._file_handlers)
    plain = logging_py.log_config["formatters"]["plain"]
    stdout = plain["()"](plain["format"], datefmt=plain["datefmt"], log_colors=plain["log_colors"])
    assert [Path(h.baseFilename).name for h in handlers] == ["main.log", "merged.log"]
    records = [
        ("StatsLogger", "Epoch 1/1 Step 3/12 Train step 3/12 done."),
        ("StatsLogger", "Stats (1/1):"),
        ("StatsLogger", "\n" + tabulate_stats(dict(list(actor_stats(2).items())[:9]))),
        ("RLTrainer", "Training completes! Total time elapsed 90.00."),
    ]
    ours = {mode: AReaLLogWriter(tmp_path / mode, mode=mode) for mode in ("single", "spmd")}
    printed = []
    try:
        for i, (name, message) in enumerate(records):
            when = 1_700_000_000.0 + 30.25 * i
            record = logging.LogRecord(name, logging.INFO, __file__, 0, message, None, None)
            record.created, record.msecs = when, (when - int(when)) * 1000
            for handler in handlers:
                handler.handle(record)
            printed.append(stdout.format(record) + "\n")
            for writer in ours.values():
                writer.now = when
                writer.info(name, message)
    finally:
        for handler in handlers:
            handler.close()
        for writer in ours.values():
            writer.release()
    for name in ("main.log", "merged.log"):
        theirs = (tmp_path / "areal" / name).read_bytes()
        assert b"\x1b[" in theirs and theirs.count(b"(AReaL)") == len(records)
        assert (tmp_path / "single" / name).read_bytes() == theirs, name
    assert (tmp_path / "spmd" / "trainer.log").read_text() == "".join(printed)


def test_table_is_column_major_four_pairs_a_row() -> None:
    stats = {f"k{i}": float(i) for i in range(10)}  # 3 rows: k0 k3 k6 k9 / k1 k4 k7 / ...
    rows = [line for line in tabulate_stats(stats).splitlines() if line.startswith("│")]
    assert len(rows) == 3
    assert [c.strip() for c in rows[0].split("│")[1:-1]][0::2] == ["k0", "k3", "k6", "k9"]
    assert "0.0000e+00" in rows[0]


@pytest.mark.parametrize("mode,name", [("single", "main.log"), ("single", "merged.log"),
                                       ("spmd", "trainer.log")])  # fmt: skip
def test_parser_reads_every_step_and_metric_as_areal_wrote_them(
    tmp_path: Path, mode: str, name: str
) -> None:
    write_run(tmp_path, 12, mode=mode, finished=True)
    data = (tmp_path / name).read_bytes()
    assert b"\x1b[" in data  # colours kept in the file, as AReaL's handlers write them
    parser = parse_log(data)
    store = parser.store
    assert list(store.steps) == list(range(12))  # global_step, 0-based
    assert sorted(store.names()) == sorted(actor_stats(0))  # names exactly as AReaL's
    for step in (0, 5, 11):
        for key, value in actor_stats(step).items():
            _, values = store.series(key)
            assert values[step] == rounded(value)
    assert parser.finished
    assert parser.total_steps == 12
    assert store.step_times[1] - store.step_times[0] == pytest.approx(30.0)


def test_worker_prefix_in_merged_log_is_tolerated(tmp_path: Path) -> None:
    """merged.log gets `[role]` padded to 10 on every line of a worker's output
    (areal/infra/utils/proc.py:112-119)."""
    write_run(tmp_path, 4, mode="spmd")
    text = (tmp_path / "trainer.log").read_text()
    prefixed = "".join("[actor]".ljust(10) + line + "\n" for line in text.splitlines())
    plain, merged = parse_log(text.encode()).store, parse_log(prefixed.encode()).store
    assert list(merged.steps) == [0, 1, 2, 3]
    assert merged.series(BEHAVE_IMP_WEIGHT) == plain.series(BEHAVE_IMP_WEIGHT)


def test_incremental_feeding_in_any_chunks_equals_one_read(tmp_path: Path) -> None:
    write_run(tmp_path, 9, finished=True)
    data = (tmp_path / "main.log").read_bytes()
    whole = parse_log(data).store
    rng = random.Random(3)
    parser = LogParser()
    pos = 0
    while pos < len(data):
        n = rng.choice([1, 7, 100, 4096, 20000])
        parser.feed(data[pos : pos + n])
        pos += n
    assert list(parser.store.steps) == list(whole.steps)
    for name in whole.names():
        assert parser.store.series(name) == whole.series(name)
    assert parser.finished


def test_several_stats_dicts_in_one_commit_take_consecutive_steps(tmp_path: Path) -> None:
    """log_step = max(global_step, last + 1) + i (areal/utils/stats_logger.py:145-159)."""
    writer = AReaLLogWriter(tmp_path, mode="spmd")
    writer.commit(0, 0, 0, [{"a": 1.0}, {"a": 2.0}])
    writer.commit(0, 1, 1, {"a": 3.0})  # global step 1 < last + 1 = 2: logged at 2
    writer.commit(0, 4, 4, {"a": 4.0})
    writer.release()
    store = parse_log((tmp_path / "trainer.log").read_bytes()).store
    assert store.series("a") == ([0, 1, 2, 4], [1.0, 2.0, 3.0, 4.0])


def test_nan_and_inf_values_parse(tmp_path: Path) -> None:
    writer = AReaLLogWriter(tmp_path, mode="spmd")
    writer.commit(0, 0, 0, {"x": float("nan"), "y": float("inf"), "z": -2.5})
    writer.release()
    store = parse_log((tmp_path / "trainer.log").read_bytes()).store
    assert math.isnan(store.series("x")[1][0])
    assert store.series("y")[1] == [math.inf]
    assert store.series("z")[1] == [-2.5]


def test_tensorboard_reader_matches_the_log(tmp_path: Path) -> None:
    write_run(tmp_path / "logs", 6, tensorboard=tmp_path / "tb")
    reader = TensorboardReader(str(tmp_path / "tb"))
    assert reader.poll() == 6 * len(actor_stats(0))
    log = parse_log((tmp_path / "logs" / "main.log").read_bytes()).store
    assert set(reader.store.names()) == set(log.names())
    steps, values = reader.store.series(BEHAVE_IMP_WEIGHT)
    assert steps == [0, 1, 2, 3, 4, 5]
    for v, expected in zip(values, log.series(BEHAVE_IMP_WEIGHT)[1], strict=True):
        assert v == pytest.approx(expected, rel=1e-4)  # float32 in tensorboard, %.4e in the log
    assert reader.poll() == 0  # nothing new: nothing re-read


def healthy(step: int) -> dict[str, float]:
    return actor_stats(step)


def report_for(tmp_path: Path, steps: int, stats, finished: bool = False, now=None):  # type: ignore[no-untyped-def]
    write_run(tmp_path, steps, stats=stats, finished=finished)
    follower = MetricsFollower(str(tmp_path))
    follower.poll()
    last = follower.store.step_times[-1]
    return follower.report(now=last + 1.0 if now is None else now)


def test_a_healthy_run_raises_no_warning(tmp_path: Path) -> None:
    report = report_for(tmp_path, 60, healthy)
    assert report.warnings == []
    assert not report.stall.stalled


@pytest.mark.parametrize(
    "check,metric,overrides,key",
    [
        ("behave_imp_weight", BEHAVE_IMP_WEIGHT,
         lambda s: {BEHAVE_IMP_WEIGHT: 1.0 + 0.01 * s}, "rollout.max_head_offpolicyness"),
        ("importance_weight", IMPORTANCE_WEIGHT,
         lambda s: {IMPORTANCE_WEIGHT: 1.2}, "actor.ppo_n_minibatches"),
        ("no_eos_ratio", NO_EOS_RATIO, lambda s: {NO_EOS_RATIO: 0.2}, "gconfig.max_new_tokens"),
        ("seq_len_growth", SEQ_LEN,
         lambda s: {SEQ_LEN: 400.0 + 10 * s, NO_EOS_RATIO: 0.01 + 0.0005 * s},
         "gconfig.max_new_tokens"),
        ("task_reward_variance", TASK_REWARD,
         lambda s: {TASK_REWARD: 0.4 + 0.02 * s + 0.3 * (-1) ** s}, "train_dataset.batch_size"),
        ("reward_flat", ROLLOUT_REWARD, lambda s: {ROLLOUT_REWARD: 0.5}, "train_dataset.batch_size"),
    ],
)  # fmt: skip
def test_each_check_fires_alone_with_remedy_and_config_key(
    tmp_path: Path, check: str, metric: str, overrides, key: str
) -> None:
    report = report_for(tmp_path, 60, lambda s: actor_stats(s, **overrides(s)))
    assert [w.check for w in report.warnings] == [check]
    warning = report.warnings[0]
    assert warning.metric == metric
    assert warning.step == 59
    assert key in warning.config_keys and key in warning.message


def test_thresholds_are_configurable(tmp_path: Path) -> None:
    write_run(tmp_path, 10, stats=lambda s: actor_stats(s, **{NO_EOS_RATIO: 0.08}))
    follower = MetricsFollower(str(tmp_path))
    follower.poll()
    now = follower.store.step_times[-1] + 1
    assert [w.check for w in follower.report(now).warnings] == ["no_eos_ratio"]
    follower.thresholds = HealthThresholds(no_eos_ratio_max=0.1)
    assert follower.report(now).warnings == []


def test_stalled_after_k_median_step_times_and_finished_is_not_stalled(tmp_path: Path) -> None:
    t = HealthThresholds(stall_factor=5, stall_min_seconds=10)
    times = [100.0 + 30 * i for i in range(10)]  # median step 30 s
    assert not stall_state(times, times[-1] + 149, False, t).stalled
    state = stall_state(times, times[-1] + 151, False, t)
    assert state.stalled and state.median_step_seconds == 30
    assert not stall_state(times, times[-1] + 10_000, True, t).stalled
    assert not stall_state(times[:2], times[1] + 10_000, False, t).stalled  # too few steps

    report = report_for(tmp_path / "a", 8, healthy, now=1e12)
    assert report.stall.stalled and [w.check for w in report.warnings] == ["stalled"]
    done = report_for(tmp_path / "b", 8, healthy, finished=True, now=1e12)
    assert done.stall.finished and not done.stall.stalled and done.warnings == []


def test_a_stall_is_told_in_the_unit_a_person_would_use(tmp_path: Path) -> None:
    """A fresh stall by its multiple of the step time; a log last written days ago by its
    age (it read `no new step for 260597s, 2208451x the median step time`), with the
    suggestion that the job may be gone."""
    t = HealthThresholds(stall_factor=5, stall_min_seconds=10)
    times = [100.0 + 30 * i for i in range(10)]  # median step 30 s
    fresh = stall_state(times, times[-1] + 912, False, t)
    assert fresh.describe() == "stalled: no new step for 15 min, 30x the median step time (30s)"
    assert not fresh.old
    days = stall_state(times, times[-1] + 3 * 86400 + 600, False, t)
    assert days.describe() == "stalled: last step 3 d ago (median step time 30s)"
    assert days.old
    quick = [100.0 + 0.1 * i for i in range(10)]  # a 0.1 s step: 1,000x in under 2 minutes
    minutes = stall_state(quick, quick[-1] + 300, False, t)
    assert minutes.describe() == "stalled: last step 5 min ago (median step time 0.1s)"
    assert not minutes.old  # within AReaL's 2-hour group timeout: it may well hang
    report = report_for(tmp_path, 8, healthy, now=1e12)
    [stalled] = report.warnings
    assert stalled.summary.startswith("stalled: last step ") and " d ago " in stalled.summary
    assert stalled.remedy.startswith("Check that the job still runs")
    assert [format_duration(s) for s in (0, 119, 120, 7169, 7199, 172799, 1e7)] == [
        "0s", "119s", "2 min", "119 min", "2 h", "2 d", "116 d"
    ]  # fmt: skip


def test_json_report_has_exactly_the_documented_shape(tmp_path: Path) -> None:
    report = report_for(tmp_path, 3, healthy)
    out = report_json(report)
    assert list(out) == ["source", "steps", "series", "latest", "warnings", "last_step_at",
                         "stalled", "unread_bytes", "notes", "stragglers"]  # fmt: skip
    assert out["source"].endswith("main.log")
    assert out["steps"] == [0, 1, 2]
    assert out["series"][TASK_REWARD][2] == [2, rounded(actor_stats(2)[TASK_REWARD])]
    assert out["latest"][ROLLOUT_REWARD] == rounded(actor_stats(2)[ROLLOUT_REWARD])
    assert out["last_step_at"] == "2023-11-14T22:14:50.000+00:00"  # 1_700_000_000 + 3 x 30 s
    assert out["stalled"] is False


def test_follower_reads_only_new_bytes_and_survives_truncation_and_rotation(
    tmp_path: Path,
) -> None:
    log = tmp_path / "trainer.log"
    writer = AReaLLogWriter(tmp_path, mode="spmd")
    follower = MetricsFollower(str(log))
    for s in range(3):
        writer.commit(0, s, s, actor_stats(s))
    assert follower.poll() == 3
    size = log.stat().st_size
    assert follower.log is not None and follower.log.offset == size
    assert follower.poll() == 0 and follower.log.offset == size  # nothing new, nothing read
    writer.commit(0, 3, 3, actor_stats(3))
    assert follower.poll() == 1
    writer.release()

    # truncated in place (copytruncate): read again from the start
    log.write_bytes(b"")
    writer = AReaLLogWriter(tmp_path, mode="spmd")
    writer.commit(0, 4, 4, actor_stats(4))
    assert follower.poll() == 1
    assert follower.store.steps[-1] == 4
    writer.release()

    # rotated: renamed away, a new file under the same name
    os.rename(log, tmp_path / "trainer.log.1")
    writer = AReaLLogWriter(tmp_path, mode="spmd")
    for s in (5, 6):
        writer.commit(0, s, s, actor_stats(s))
    writer.close()
    assert follower.poll() == 2
    assert list(follower.store.steps) == [0, 1, 2, 3, 4, 5, 6]
    assert follower.finished


def test_reads_are_bounded(tmp_path: Path) -> None:
    write_run(tmp_path, 5, mode="spmd")
    size = (tmp_path / "trainer.log").stat().st_size
    files = LocalFiles()
    first = files.read(str(tmp_path / "trainer.log"), 0, None, 1000)
    assert len(first["data"]) == 1000 and not first["eof"] and first["size"] == size
    follower = MetricsFollower(str(tmp_path))
    assert follower.poll(budget=size // 2) < 5  # a poll stops at its budget...
    follower.poll()
    assert list(follower.store.steps) == [0, 1, 2, 3, 4]  # ...and the next one goes on


def test_directory_prefers_main_log_then_trainer_log(tmp_path: Path) -> None:
    write_run(tmp_path, 2)
    (tmp_path / "actor.log").write_text("worker output\n")
    follower = MetricsFollower(str(tmp_path))
    follower.poll()
    assert follower.source.endswith("/main.log")


def test_missing_path_is_a_clear_error(tmp_path: Path) -> None:
    from areal_console.core.common.errors import UserError

    with pytest.raises(UserError, match="no such file or directory"):
        MetricsFollower(str(tmp_path / "nope")).poll()
    (tmp_path / "empty").mkdir()
    with pytest.raises(UserError, match="no AReaL log"):
        MetricsFollower(str(tmp_path / "empty")).poll()


def test_log_dir_from_worker_and_controller_command_lines() -> None:
    worker = ("/bin/bash -c 'stdbuf -oL python3 -m areal.infra.rpc.rpc_server --port 123 "
              "--experiment-name gsm8k --trial-name t1 --role actor --worker-index 0 "
              "--fileroot /data/areal'")  # fmt: skip
    inner = worker.split("'")[1]
    assert run_identity(inner) == {"experiment": "gsm8k", "trial": "t1", "fileroot": "/data/areal"}
    assert log_dir_from_processes(["python3 x.py", inner], "alice") == (
        "/data/areal/logs/alice/gsm8k/t1"
    )
    controller = ("python3 examples/math/gsm8k_rl.py --config c.yaml experiment_name=e "
                  "trial_name=t cluster.fileroot=/fs stats_logger.tensorboard.path=/fs/tb")  # fmt: skip
    assert run_identity(controller)["tensorboard"] == "/fs/tb"
    assert log_dir_from_processes([controller], "bob") == "/fs/logs/bob/e/t"
    assert log_dir_from_processes(["python3 train.py"], "bob") is None
    # no fileroot on the command line: AReaL's default (areal/api/cli_args.py:3048-3049)
    assert log_dir_from_processes(["python3 t.py experiment_name=e trial_name=t"], "bob") == (
        "/tmp/areal/logs/bob/e/t"
    )


def test_report_of_a_run_with_no_steps_yet(tmp_path: Path) -> None:
    (tmp_path / "main.log").write_text("(AReaL) 20250101-00:00:00.000 RLTrainer INFO: starting\n")
    follower = MetricsFollower(str(tmp_path))
    assert follower.poll() == 0
    report = follower.report()
    assert report.steps == [] and not report.stall.stalled and report.warnings == []
    assert build_report("x", follower.store, False, 0.0).stall.last_step_at is None


# The reference trainer writes AReaL's format without tabulate/colorlog: same bytes ------


@pytest.mark.parametrize("n", [1, 2, 3, 4, 5, 9, 13])
def test_trainer_table_is_byte_identical_to_tabulate(n: int) -> None:
    from areal_node.trainer import areal_log as rt

    rng = random.Random(n)
    values = [rng.uniform(-5, 5) * 10 ** rng.randint(-6, 6) for _ in range(n)]
    if n > 3:
        values[1], values[2] = math.nan, -math.inf
    stats = {f"ppo_actor/metric_{i}/avg" if i % 2 else f"k{i}": v for i, v in enumerate(values)}
    assert rt.stats_table(stats) == tabulate_stats(stats)


def test_trainer_log_line_is_areals_stdout_format(tmp_path: Path) -> None:
    from areal_node.trainer import areal_log as rt

    writer = AReaLLogWriter(tmp_path, mode="spmd")
    writer.now = 1_700_000_123.456
    writer.info("StatsLogger", "Stats (1/1):")
    writer.release()
    expected = (tmp_path / "trainer.log").read_text().rstrip("\n")
    assert rt.areal_log_line("Stats (1/1):", 1_700_000_123.456) == expected


def test_reference_trainer_run_reads_like_an_areal_run(tmp_path: Path) -> None:
    """A real (1-rank) run: its stdout and tensorboard events carry the metrics.jsonl values."""
    import json

    from areal_console.core.replay.plan import local_trainer
    from areal_node.trainer.areal_log import AREAL_NAMES

    argv, env = local_trainer(
        "steps=4", f"output_dir={tmp_path / 'out'}",
        f"stats_logger.tensorboard.path={tmp_path / 'tb'}",
        env={**os.environ, "OMP_NUM_THREADS": "1"},
    )  # fmt: skip
    out = subprocess.run(argv, capture_output=True, timeout=300, env=env)
    assert out.returncode == 0, out.stderr.decode()[-2000:]
    parser = parse_log(out.stdout)
    records = [
        json.loads(line) for line in (tmp_path / "out" / "metrics.jsonl").read_text().splitlines()
    ]
    assert list(parser.store.steps) == [0, 1, 2, 3]  # global steps, logged as Train step 1-4
    assert parser.finished and parser.total_steps == 4
    for name, areal_name in AREAL_NAMES.items():
        assert parser.store.series(areal_name)[1] == [rounded(r[name]) for r in records]
    reader = TensorboardReader(str(tmp_path / "tb"))
    reader.poll()
    steps, values = reader.store.series(BEHAVE_IMP_WEIGHT)
    assert steps == [0, 1, 2, 3]
    assert values == pytest.approx([r["behave_imp_weight"] for r in records], rel=1e-6)
