"""The performance guide's checks on a run's metrics, and stall detection. Pure functions.

Metric names are AReaL's (`ppo_actor/no_eos_ratios/avg`: plural in the code, singular in
the guide). Remedies follow AReaL's guide (docs/en/best_practices/algo_perf.md at
cbff54d6); the config keys are verified in areal/api/cli_args.py there:
`gconfig.max_new_tokens` (:170), `train_dataset.batch_size` (:3097),
`actor.ppo_n_minibatches` (:1676), `actor.megatron.use_deterministic_algorithms` (:962),
`actor.rejection_sampling` (:1816), `rollout.max_head_offpolicyness` (:2502),
`actor.optimizer.lr` (:1330, :391).
"""

from __future__ import annotations

import itertools
import math
import statistics
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, fields

from areal_console.core.textfmt import format_bytes

IMPORTANCE_WEIGHT = "ppo_actor/update/importance_weight/avg"
BEHAVE_IMP_WEIGHT = "ppo_actor/update/behave_imp_weight/avg"
NO_EOS_RATIO = "ppo_actor/no_eos_ratios/avg"
SEQ_LEN = "ppo_actor/seq_len/avg"
TASK_REWARD = "ppo_actor/task_reward/avg"
ROLLOUT_REWARD = "rollout/reward"
EVAL_REWARD = "eval-rollout/reward"
GUIDE_METRICS = (
    EVAL_REWARD,
    ROLLOUT_REWARD,
    TASK_REWARD,
    IMPORTANCE_WEIGHT,
    BEHAVE_IMP_WEIGHT,
    NO_EOS_RATIO,
    SEQ_LEN,
)


@dataclass(frozen=True)
class HealthThresholds:
    """When a check warns. `no_eos_ratio_max` is the guide's figure; the guide gives no
    number for the others ("very close to 1.0", "fluctuates significantly"), so theirs are
    this console's defaults, all configurable (settings key `health`)."""

    importance_weight_tolerance: float = 0.05
    """Warn when |importance_weight/avg - 1| or |behave_imp_weight/avg - 1| exceeds this."""

    no_eos_ratio_max: float = 0.05
    """Warn when no_eos_ratios/avg is above this (the guide: 5% of trajectories truncated)."""

    window: int = 20
    """Steps looked at for trends (seq_len growth, task_reward noise, sparkline trend)."""

    seq_len_growth: float = 0.10
    """Relative seq_len growth over `window` steps that counts as rising."""

    task_reward_std_max: float = 0.15
    """Step-to-step noise (std) of task_reward/avg over `window` steps above which it warns."""

    reward_flat_steps: int = 50
    """Steps over which the reward must rise; fewer logged steps are not judged."""

    reward_flat_min_gain: float = 0.01
    """Minimum reward gain (fitted) over `reward_flat_steps`; below it the reward is flat."""

    stall_factor: float = 5.0
    """Stalled when no new step came for this many times the median step time..."""

    stall_min_seconds: float = 10.0
    """...and for at least this many seconds."""


def thresholds_from(values: dict[str, float]) -> HealthThresholds:
    """Thresholds with `values` (settings) over the defaults; unknown names raise KeyError."""
    known = {f.name: f.type for f in fields(HealthThresholds)}
    out: dict[str, float | int] = {}
    for key, value in values.items():
        if key not in known:
            raise KeyError(key)
        out[key] = int(value) if key in ("window", "reward_flat_steps") else float(value)
    return HealthThresholds(**out)  # type: ignore[arg-type]


@dataclass(frozen=True)
class HealthWarning:
    check: str
    metric: str
    step: int | None
    summary: str
    remedy: str
    config_keys: tuple[str, ...] = ()

    @property
    def message(self) -> str:
        return f"{self.summary}. {self.remedy}"


Series = tuple[Sequence[int], Sequence[float]]


def _finite(series: Series) -> tuple[list[int], list[float]]:
    steps, values = series
    pairs = [(s, v) for s, v in zip(steps, values, strict=False) if math.isfinite(v)]
    return [p[0] for p in pairs], [p[1] for p in pairs]


def slope(values: Sequence[float]) -> float:
    """Least-squares slope per step of equally spaced values (0 for fewer than 2)."""
    n = len(values)
    if n < 2:
        return 0.0
    mean_x = (n - 1) / 2
    mean_y = sum(values) / n
    num = sum((i - mean_x) * (v - mean_y) for i, v in enumerate(values))
    den = sum((i - mean_x) ** 2 for i in range(n))
    return num / den


def noise_std(values: Sequence[float]) -> float:
    """Step-to-step noise: std of first differences / sqrt(2) (a steady trend is not noise)."""
    if len(values) < 3:
        return 0.0
    diffs = [b - a for a, b in itertools.pairwise(values)]
    return statistics.pstdev(diffs) / math.sqrt(2)


def check_importance_weights(get: Mapping[str, Series], t: HealthThresholds) -> list[HealthWarning]:
    out = []
    remedies = {
        IMPORTANCE_WEIGHT: (
            "importance_weight",
            "Reduce actor.ppo_n_minibatches (with 1 it should be exactly 1); if it persists at "
            "1 (common with MoE), set actor.megatron.use_deterministic_algorithms=true",
            ("actor.ppo_n_minibatches", "actor.megatron.use_deterministic_algorithms"),
        ),
        BEHAVE_IMP_WEIGHT: (
            "behave_imp_weight",
            "Configure actor.rejection_sampling (e.g. {level: token, action: mask, metric: "
            "ratio, upper: 5.0}); if it persists, reduce rollout.max_head_offpolicyness to "
            "make samples less stale",
            ("actor.rejection_sampling", "rollout.max_head_offpolicyness"),
        ),
    }
    for name, (check, remedy, keys) in remedies.items():
        steps, values = _finite(get.get(name, ((), ())))
        if not values:
            continue
        value = values[-1]
        if abs(value - 1.0) > t.importance_weight_tolerance:
            out.append(HealthWarning(
                check, name, steps[-1],
                f"{name} = {value:.4g} at step {steps[-1]}, more than "
                f"{t.importance_weight_tolerance:g} from 1.0",
                remedy, keys,
            ))  # fmt: skip
    return out


def check_no_eos(get: Mapping[str, Series], t: HealthThresholds) -> list[HealthWarning]:
    steps, values = _finite(get.get(NO_EOS_RATIO, ((), ())))
    if not values or values[-1] <= t.no_eos_ratio_max:
        return []
    return [HealthWarning(
        "no_eos_ratio", NO_EOS_RATIO, steps[-1],
        f"{NO_EOS_RATIO} = {values[-1]:.3g} at step {steps[-1]}: more than "
        f"{t.no_eos_ratio_max:.0%} of trajectories are truncated before EOS",
        "Increase gconfig.max_new_tokens, or filter out overly long trajectories "
        "(dynamic filtering)",
        ("gconfig.max_new_tokens",),
    )]  # fmt: skip


def check_seq_len_growth(get: Mapping[str, Series], t: HealthThresholds) -> list[HealthWarning]:
    s_steps, seq = _finite(get.get(SEQ_LEN, ((), ())))
    _, eos = _finite(get.get(NO_EOS_RATIO, ((), ())))
    w = t.window
    if len(seq) < w or len(eos) < w:
        return []
    seq_w, eos_w = seq[-w:], eos[-w:]
    mean = sum(seq_w) / w
    growth = slope(seq_w) * (w - 1) / mean if mean else 0.0
    eos_growth = slope(eos_w) * (w - 1)
    if growth < t.seq_len_growth or eos_growth <= 0.005:
        return []
    return [HealthWarning(
        "seq_len_growth", SEQ_LEN, s_steps[-1],
        f"{SEQ_LEN} grew {growth:.0%} over the last {w} steps while {NO_EOS_RATIO} rose "
        f"by {eos_growth:.3g}",
        "Growing sequences lead to more truncation: watch no_eos_ratio, raise "
        "gconfig.max_new_tokens or filter long trajectories",
        ("gconfig.max_new_tokens",),
    )]  # fmt: skip


def check_task_reward_noise(get: Mapping[str, Series], t: HealthThresholds) -> list[HealthWarning]:
    steps, values = _finite(get.get(TASK_REWARD, ((), ())))
    w = t.window
    if len(values) < w:
        return []
    noise = noise_std(values[-w:])
    if noise <= t.task_reward_std_max:
        return []
    return [HealthWarning(
        "task_reward_variance", TASK_REWARD, steps[-1],
        f"{TASK_REWARD} fluctuates: step-to-step std {noise:.3g} over the last {w} steps "
        f"(above {t.task_reward_std_max:g})",
        "Training has high variance: increase the batch size (train_dataset.batch_size) "
        "if resources allow",
        ("train_dataset.batch_size",),
    )]  # fmt: skip


def check_reward_flat(get: Mapping[str, Series], t: HealthThresholds) -> list[HealthWarning]:
    name = ROLLOUT_REWARD if get.get(ROLLOUT_REWARD, ((), ()))[1] else TASK_REWARD
    steps, values = _finite(get.get(name, ((), ())))
    n = t.reward_flat_steps
    if len(values) < n:
        return []
    gain = slope(values[-n:]) * (n - 1)
    if gain >= t.reward_flat_min_gain:
        return []
    return [HealthWarning(
        "reward_flat", name, steps[-1],
        f"{name} is not increasing: fitted change {gain:+.3g} over the last {n} steps",
        "Establish a baseline by evaluating before training; train on the test set to see "
        "whether rewards rise there; if not, tune the batch size "
        "(train_dataset.batch_size) or learning rate (actor.optimizer.lr), try another "
        "base model or SFT first; if they do, check the training data's quality and "
        "difficulty (dynamic filtering via should_accept_fn)",
        ("train_dataset.batch_size", "actor.optimizer.lr"),
    )]  # fmt: skip


CHECKS = (
    check_importance_weights,
    check_no_eos,
    check_seq_len_growth,
    check_task_reward_noise,
    check_reward_flat,
)


def run_checks(get: Mapping[str, Series], t: HealthThresholds | None = None) -> list[HealthWarning]:
    """Every metric check on a run's series (`name -> (steps, values)`)."""
    t = t or HealthThresholds()
    out: list[HealthWarning] = []
    for check in CHECKS:
        out.extend(check(get, t))
    return out


@dataclass(frozen=True)
class StallState:
    stalled: bool
    finished: bool
    last_step_at: float | None
    median_step_seconds: float | None
    waited_seconds: float | None
    limit_seconds: float | None
    unread_bytes: int = 0  # the log's bytes not read yet: too early to judge

    def describe(self) -> str:
        if self.finished:
            return "finished (AReaL logged its completion line)"
        if self.unread_bytes:
            return f"reading the log: {format_bytes(self.unread_bytes)} not read yet"
        if self.last_step_at is None:
            return "no step logged yet"
        if self.median_step_seconds is None:
            return "too few steps to judge progress"
        waited = self.waited_seconds or 0.0
        if self.stalled:
            times = (f"{waited / self.median_step_seconds:.0f}x "
                     if self.median_step_seconds > 0 else "")  # fmt: skip
            return (f"stalled: no new step for {waited:.0f}s, {times}"
                    f"the median step time ({self.median_step_seconds:.3g}s)")  # fmt: skip
        return f"progressing: last step {waited:.0f}s ago (median step {self.median_step_seconds:.3g}s)"


def stall_state(
    step_times: Sequence[float],
    now: float,
    finished: bool,
    t: HealthThresholds | None = None,
    unread_bytes: int = 0,
) -> StallState:
    """Is the run stalled? No new step for `stall_factor` x the median step time (and at
    least `stall_min_seconds`); a run that logged its completion line is finished instead,
    and one whose log is not read to its end yet is not judged."""
    t = t or HealthThresholds()
    times = [x for x in step_times if math.isfinite(x)]
    last = times[-1] if times else None
    if finished or last is None or unread_bytes:
        return StallState(False, finished, last, None, None, None, unread_bytes)
    recent = times[-51:]
    gaps = [b - a for a, b in itertools.pairwise(recent) if b >= a]
    waited = max(0.0, now - last)
    if len(gaps) < 2:
        return StallState(False, False, last, None, waited, None)
    median = statistics.median(gaps)
    limit = max(t.stall_factor * median, t.stall_min_seconds)
    return StallState(waited > limit, False, last, median, waited, limit)
