"""Training health over time: every check judged at every step, warnings as episodes (where
each began, where it last held, whether it still holds), the reward judged against its own
noise, and `metrics --follow` announcing episodes as they open and close.

Every log is written by tests/support/areal_logfmt.py, the cited transcription of AReaL's
StatsLogger run with the real `tabulate` and `colorlog`.
"""

from __future__ import annotations

import json
import math
import random
from pathlib import Path
from typing import Any

import pytest
from areal_console.core.metrics.follow import MetricsFollower
from areal_console.core.metrics.health import (
    BEHAVE_IMP_WEIGHT,
    IMPORTANCE_WEIGHT,
    NO_EOS_RATIO,
    ROLLOUT_REWARD,
    SEQ_LEN,
    TASK_REWARD,
    HealthThresholds,
    noise_std,
    rolling_fits,
    rolling_noise,
    slope,
)
from areal_console.core.metrics.report import HealthReport, episode_events, report_json
from conftest import run_cli

from tests.support.areal_logfmt import AReaLLogWriter, actor_stats, write_run

STEPS = 60


def report_of(log_dir: Path, steps: int, stats: Any) -> HealthReport:
    write_run(log_dir, steps, stats=stats, finished=True)
    follower = MetricsFollower(str(log_dir))
    follower.poll()
    return follower.report(now=follower.store.step_times[-1] + 1)


def drift_and_spike(step: int) -> dict[str, float]:
    """behave_imp_weight drifts from step 29; importance_weight spikes at 49-51."""
    over: dict[str, float] = {}
    if step >= 29:
        over[BEHAVE_IMP_WEIGHT] = 1.06 + 0.005 * (step - 29)
    if 49 <= step <= 51:
        over[IMPORTANCE_WEIGHT] = 1.4
    return actor_stats(step, **over)


def test_drift_from_a_known_step_and_a_spike_that_ends(tmp_path: Path) -> None:
    report = report_of(tmp_path, STEPS, drift_and_spike)
    doc = report_json(report)
    assert doc["warnings"] == [
        {
            "metric": BEHAVE_IMP_WEIGHT,
            "step": 59,
            "first_step": 29,
            "last_step": 59,
            "active": True,
            "message": report.warnings[0].message,
        },
        {
            "metric": IMPORTANCE_WEIGHT,
            "step": 51,
            "first_step": 49,
            "last_step": 51,
            "active": False,
            "message": report.warnings[1].message,
        },
    ]
    assert doc["warnings"][0]["message"].startswith(f"{BEHAVE_IMP_WEIGHT} = 1.21 at step 59")
    assert doc["warnings"][1]["message"].startswith(f"{IMPORTANCE_WEIGHT} = 1.4 at step 51")


def noise(seed: int, sd: float, n: int = STEPS) -> list[float]:
    rng = random.Random(seed)
    return [rng.gauss(0, sd) for _ in range(n)]


FLAT_NOISE = noise(7, 0.012)
LEARN_NOISE = list(zip(noise(3, 0.04), noise(4, 0.04), strict=True))


def flat_noisy(step: int) -> dict[str, float]:
    return actor_stats(step, **{ROLLOUT_REWARD: 0.5 + 0.019 * step / 59 + FLAT_NOISE[step]})


def test_flat_noisy_reward_warns_against_its_own_noise(tmp_path: Path) -> None:
    """Fitted gain ~0.019 over 60 steps under noise sd ~0.012: the old rule (a fitted gain
    of at least 0.01 over the last 50 steps) let it pass; against its noise it is flat."""
    report = report_of(tmp_path, STEPS, flat_noisy)
    _, values = report.store.series(ROLLOUT_REWARD)
    whole = rolling_fits(values, STEPS).at(STEPS - 1)
    assert whole is not None
    assert whole.gain == pytest.approx(0.019, abs=0.004)
    assert whole.resid_sd == pytest.approx(0.012, abs=0.003)
    t = HealthThresholds()
    assert slope(values[-50:]) * 49 >= t.reward_flat_min_gain  # what the old rule checked
    flat = [w for w in report.warnings if w.check == "reward_flat"]
    assert [(w.metric, w.active, w.last_step) for w in flat] == [(ROLLOUT_REWARD, True, 59)]
    assert flat[0].first_step is not None and flat[0].first_step <= 10
    assert "not increasing" in flat[0].summary and "noise" in flat[0].summary


def learning(step: int) -> dict[str, float]:
    """A run that learns: both rewards rise 0.3 over 60 steps through noise sd 0.04."""
    rise = 0.2 + 0.3 * step / 59
    a, b = LEARN_NOISE[step]
    return actor_stats(step, **{ROLLOUT_REWARD: rise + a, TASK_REWARD: rise + b})


def test_a_learning_run_stays_quiet(tmp_path: Path) -> None:
    report = report_of(tmp_path, STEPS, learning)
    assert report.warnings == []


def recovering(step: int) -> dict[str, float]:
    """Truncation above 5% for steps 10-30, then back to 1%; a flat reward that starts
    rising at step 50."""
    over = {NO_EOS_RATIO: 0.2 if 10 <= step <= 30 else 0.01}
    over[ROLLOUT_REWARD] = 0.5 if step < 50 else 0.5 + 0.01 * (step - 50)
    return actor_stats(step, **over)


def test_a_run_that_recovers_keeps_its_ended_episodes(tmp_path: Path) -> None:
    report = report_of(tmp_path, 100, recovering)
    got = [(w.check, w.metric, w.first_step, w.last_step, w.active) for w in report.warnings]
    flat = next(g for g in got if g[0] == "reward_flat")
    assert got == sorted(got, key=lambda g: -g[3])  # newest first
    assert ("no_eos_ratio", NO_EOS_RATIO, 10, 30, False) in got
    assert flat[1:2] == (ROLLOUT_REWARD,) and flat[2] == 0 and flat[4] is False
    assert 49 <= flat[3] < 70, got  # flat until the rise takes over the window
    assert not any(g[4] for g in got)


def test_rolling_statistics_match_the_direct_ones() -> None:
    rng = random.Random(1)
    values = [0.3 + 0.004 * i + rng.gauss(0, 0.02) for i in range(200)]
    fits = rolling_fits(values, 50)
    noises = rolling_noise(values, 20)
    for i in (49, 120, 199):
        fit = fits.at(i)
        assert fit is not None
        assert fit.slope == pytest.approx(slope(values[i - 49 : i + 1]), rel=1e-9)
    for i in (19, 77, 199):
        assert noises[i] == pytest.approx(noise_std(values[i - 19 : i + 1]), rel=1e-9)
    assert fits.at(48) is None and math.isnan(noises[18])
    exact = rolling_fits([0.5] * 60, 50).at(59)
    assert exact is not None and (exact.gain, exact.t) == (0.0, 0.0)


def test_follow_announces_episodes_as_they_open_and_close(tmp_path: Path) -> None:
    """A live run read as it grows: the spike opens at 49 and closes at 52."""
    writer = AReaLLogWriter(tmp_path, mode="spmd")
    follower = MetricsFollower(str(tmp_path / "trainer.log"))
    seen: dict[Any, bool] = {}
    lines: list[dict[str, Any]] = []
    for step in range(STEPS):
        writer.now = 1_700_000_000.0 + 30 * step
        writer.commit(0, step, step, drift_and_spike(step))
        if step in (30, 50, 52, 59):
            follower.poll()
            events, seen = episode_events(seen, follower.report(now=writer.now + 1))
            lines += [{"at": step, **e} for e in events]
    writer.release()
    assert [(e["at"], e["event"], e["metric"], e["first_step"], e["active"]) for e in lines] == [
        (30, "open", BEHAVE_IMP_WEIGHT, 29, True),
        (50, "open", IMPORTANCE_WEIGHT, 49, True),
        (52, "close", IMPORTANCE_WEIGHT, 49, False),
    ]
    assert lines[2]["last_step"] == 51


def test_metrics_follow_json_prints_episode_lines(tmp_path: Path) -> None:
    write_run(tmp_path, STEPS, stats=drift_and_spike, finished=True)
    result = run_cli("metrics", str(tmp_path), "--follow", "--json")
    assert result.returncode == 0, result.stderr
    docs = [json.loads(line) for line in result.stdout.splitlines()]
    events = [d for d in docs if "event" in d]
    assert "warnings" in docs[0] and len(docs) == 1 + len(events)
    assert [(e["event"], e["metric"], e["first_step"], e["last_step"]) for e in events] == [
        ("open", BEHAVE_IMP_WEIGHT, 29, 59),
        ("open", IMPORTANCE_WEIGHT, 49, 51),
        ("close", IMPORTANCE_WEIGHT, 49, 51),
    ]
    assert set(events[0]) == {"event", "metric", "step", "first_step", "last_step", "active",
                              "message"}  # fmt: skip


def test_a_flickering_metric_is_one_episode(tmp_path: Path) -> None:
    """importance_weight crosses its limit every other step from 10 to 30: one episode
    (stretches at most `episode_gap` steps apart merge), eleven with the gap at 0."""
    from areal_console.core.metrics.health import run_checks, thresholds_from
    from areal_console.core.metrics.report import SeriesView

    def flicker(step: int) -> dict[str, float]:
        over = {IMPORTANCE_WEIGHT: 1.2} if 10 <= step <= 30 and step % 2 == 0 else {}
        return actor_stats(step, **over)

    report = report_of(tmp_path, 40, flicker)
    assert [(w.metric, w.first_step, w.last_step, w.active) for w in report.warnings] == [
        (IMPORTANCE_WEIGHT, 10, 30, False)
    ]
    each = run_checks(SeriesView(report.store), thresholds_from({"episode_gap": 0}))
    assert len(each) == 11 and {w.first_step for w in each} == set(range(10, 31, 2))


# Episode starts of the windowed checks: the change point inside the first window that
# triggers, not that window's first step. Logs written by the transcription of AReaL's
# StatsLogger, each with its change at a known step.

SHIFT_NOISE = noise(11, 0.005, 120)


def seq_growth_from_40(step: int) -> dict[str, float]:
    """seq_len flat at 1000 until step 40, then 2% longer each step, with truncation
    rising along."""
    grown = max(0, step - 40)
    return actor_stats(step, **{SEQ_LEN: 1000.0 * (1.02**grown) * (1 + SHIFT_NOISE[step]),
                                NO_EOS_RATIO: 0.01 + 0.001 * grown})  # fmt: skip


def noisy_reward_from_50(step: int) -> dict[str, float]:
    """task_reward steady (sd 0.01) until step 50, then jumping (sd 0.3)."""
    sd = 0.01 if step < 50 else 0.3
    return actor_stats(step, **{TASK_REWARD: 0.5 + NOISE_SHIFT[step] * sd})


NOISE_SHIFT = noise(12, 1.0, 120)


def reward_plateau_at_60(step: int) -> dict[str, float]:
    """rollout/reward rises 0.01 a step until step 60, then stays flat."""
    level = 0.2 + 0.01 * min(step, 60)
    return actor_stats(step, **{ROLLOUT_REWARD: level + SHIFT_NOISE[step] * 0.5})


@pytest.mark.parametrize(
    ("stats", "check", "change"),
    [
        (seq_growth_from_40, "seq_len_growth", 40),
        (noisy_reward_from_50, "task_reward_variance", 50),
        (reward_plateau_at_60, "reward_flat", 60),
    ],
)
def test_a_windowed_episode_begins_at_its_change_point(
    tmp_path: Path, stats: Any, check: str, change: int
) -> None:
    report = report_of(tmp_path, 120, stats)
    [episode] = [w for w in report.warnings if w.check == check]
    assert episode.first_step is not None and abs(episode.first_step - change) <= 2, episode
    # The first window that triggers starts well before the change.
    window = HealthThresholds().reward_flat_steps if check == "reward_flat" else 20
    assert episode.last_step is not None
    assert episode.first_step > change - window + 3


def test_an_episode_with_no_change_inside_its_window_begins_at_the_window() -> None:
    from areal_console.core.metrics.changepoint import trend_onset, variance_onset

    line = [0.5 + 0.01 * i for i in range(30)]
    assert trend_onset(line, rising=True) is None  # one straight line: nothing changed
    assert trend_onset([0.5] * 30, rising=False) is None
    steady = [0.3 * x for x in noise(5, 1.0, 30)]
    assert variance_onset(steady) is None  # the same noise throughout
