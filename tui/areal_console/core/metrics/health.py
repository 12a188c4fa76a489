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
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, fields

import numpy as np
import numpy.typing as npt

from areal_console.core.common.textfmt import format_bytes, format_duration
from areal_console.core.metrics.changepoint import trend_onset, variance_onset
from areal_console.core.stacks.diagnose import AREAL_GROUP_TIMEOUT_S

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

    reward_flat_min_t: float = 3.0
    """The fitted gain must be this many standard errors above zero (the slope's t
    statistic against the scatter around the line); below it the rise is noise."""

    reward_flat_min_noise_ratio: float = 2.0
    """The fitted gain must exceed this many noise standard deviations (the scatter around
    the line): a rise smaller than the band the reward moves in step to step is flat."""

    stall_factor: float = 5.0
    """Stalled when no new step came for this many times the median step time..."""

    stall_min_seconds: float = 10.0
    """...and for at least this many seconds."""

    episode_gap: int = 2
    """Stretches where a check holds, apart by at most this many logged steps where it does
    not, are one episode (a metric flickering around its limit is one episode, not one per
    crossing)."""


def thresholds_from(values: dict[str, float]) -> HealthThresholds:
    """Thresholds with `values` (settings) over the defaults; unknown names raise KeyError."""
    known = {f.name: f.type for f in fields(HealthThresholds)}
    out: dict[str, float | int] = {}
    for key, value in values.items():
        if key not in known:
            raise KeyError(key)
        whole = key in ("window", "reward_flat_steps", "episode_gap")
        out[key] = int(value) if whole else float(value)
    return HealthThresholds(**out)  # type: ignore[arg-type]


@dataclass(frozen=True)
class HealthWarning:
    """One episode of a check: where its condition began, where it last held, and whether
    it still holds at the metric's latest step (`active`). A check over a window (a trend)
    begins where the change was found inside the first window that triggers it (the
    window's first step when none is)."""

    check: str
    metric: str
    step: int | None  # the latest step the condition held (for an active one: the last step)
    summary: str
    remedy: str
    config_keys: tuple[str, ...] = ()
    first_step: int | None = None
    last_step: int | None = None
    active: bool = True

    @property
    def message(self) -> str:
        return f"{self.summary}. {self.remedy}"

    @property
    def key(self) -> tuple[str, str, int | None]:
        """Identifies an episode across reports of a growing run (it only grows)."""
        return (self.check, self.metric, self.first_step)

    def to_json(self) -> dict[str, object]:
        return {
            "metric": self.metric,
            "step": self.step,
            "first_step": self.first_step,
            "last_step": self.last_step,
            "active": self.active,
            "message": self.message,
        }


Series = tuple[Sequence[int], Sequence[float]]
Ints = npt.NDArray[np.int64]
Floats = npt.NDArray[np.float64]
Bools = npt.NDArray[np.bool_]


def _finite_arrays(series: Series) -> tuple[Ints, Floats]:
    """The series' steps and values as arrays, NaN and inf left out."""
    steps = np.asarray(series[0], dtype=np.int64)
    values = np.asarray(series[1], dtype=np.float64)
    n = min(len(steps), len(values))
    steps, values = steps[:n], values[:n]
    keep = np.isfinite(values)
    if keep.all():
        return steps, values
    return steps[keep], values[keep]


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


# --------------------------------------------------------------------------------------
# Judging every step: each check says, per step, whether its condition holds there; runs
# of steps where it holds are episodes. Windowed checks use running sums (one pass, in
# numpy: a 100,000-step run is judged in milliseconds, not seconds).


@dataclass(frozen=True)
class LineFit:
    """A least-squares line through one window of equally spaced values."""

    slope: float  # per step
    gain: float  # slope x (n - 1): the fitted change over the window
    resid_sd: float  # scatter around the line (n - 2 degrees of freedom)
    t: float  # slope / its standard error (inf when the line fits exactly)


@dataclass(frozen=True)
class RollingFits:
    """`LineFit`s of every window of `n` values, as arrays indexed by the window's last
    value (NaN before the first full window)."""

    n: int
    slope: Floats
    gain: Floats
    resid_sd: Floats
    t: Floats

    def at(self, i: int) -> LineFit | None:
        if not 0 <= i < len(self.slope) or math.isnan(self.slope[i]):
            return None
        return LineFit(float(self.slope[i]), float(self.gain[i]), float(self.resid_sd[i]),
                       float(self.t[i]))  # fmt: skip


def _window_sums(x: Floats, n: int) -> Floats:
    """Sum of each window of `n` consecutive items, indexed by the window's last item."""
    c = np.concatenate(([0.0], np.cumsum(x)))
    return c[n:] - c[:-n]


def rolling_fits(values: Sequence[float] | Floats, n: int) -> RollingFits:
    """Least-squares lines through each window of `n` values ending at index i."""
    y = np.asarray(values, dtype=np.float64)
    size = len(y)
    nan = np.full(size, np.nan)
    if n < 3 or size < n:
        return RollingFits(n, nan, nan.copy(), nan.copy(), nan.copy())
    y = y - y[0]  # centred: running sums of small numbers lose less
    j = np.arange(size, dtype=np.float64)
    sy = _window_sums(y, n)
    syy = _window_sums(y * y, n)
    sjy = _window_sums(j * y, n)
    jbar = j[n - 1 :] - (n - 1) / 2  # mean index of each window
    sxy = sjy - jbar * sy
    sxx = n * (n * n - 1) / 12
    k = sxy / sxx
    ssr = np.maximum(0.0, syy - sy * sy / n - k * sxy)
    sd = np.sqrt(ssr / (n - 2))
    se = sd / math.sqrt(sxx)
    exact = se <= 1e-12 * np.maximum(1.0, np.abs(k))
    with np.errstate(divide="ignore", invalid="ignore"):
        t = np.where(exact, np.sign(k) * np.inf, k / np.where(exact, 1.0, se))
    t = np.where(exact & (k == 0), 0.0, t)

    def pad(a: Floats) -> Floats:
        return np.concatenate((nan[: n - 1], a))

    return RollingFits(n, pad(k), pad(k * (n - 1)), pad(sd), pad(t))


def rolling_noise(values: Sequence[float] | Floats, n: int) -> Floats:
    """`noise_std` of each window of `n` values ending at index i (NaN before the first)."""
    y = np.asarray(values, dtype=np.float64)
    out = np.full(len(y), np.nan)
    if n < 3 or len(y) < n:
        return out
    d = np.diff(y)
    m = n - 1  # differences per window
    s1 = _window_sums(d, m)
    s2 = _window_sums(d * d, m)
    var = np.maximum(0.0, s2 / m - (s1 / m) ** 2)
    out[n - 1 :] = np.sqrt(var) / math.sqrt(2)
    return out


def episodes(
    steps: Ints,
    holds: Bools,
    window: int,
    make: Callable[[int], tuple[str, str, tuple[str, ...]]],
    check: str,
    metric: str,
    gap: int = 0,
    onset: Callable[[int, int], int | None] | None = None,
) -> list[HealthWarning]:
    """Runs of `holds` as episodes (runs at most `gap` indices apart merged); `make(i)`
    words the warning at index i (its last). An episode of a windowed check begins in
    the first window that holds, indices `lo..i`: at `lo + onset(lo, i)` when `onset`
    finds the change inside it, else at `lo`."""
    flags = np.asarray(holds, dtype=np.int8)
    if not flags.any():
        return []
    edges = np.diff(np.concatenate(([0], flags, [0])))
    starts = np.flatnonzero(edges == 1).tolist()
    ends = (np.flatnonzero(edges == -1) - 1).tolist()
    runs: list[list[int]] = []
    for i, j in zip(starts, ends, strict=True):
        if runs and i - runs[-1][1] - 1 <= gap:
            runs[-1][1] = j
        else:
            runs.append([i, j])
    out = []
    last = len(flags) - 1
    for i, j in runs:
        summary, remedy, keys = make(j)
        lo = max(0, i - window + 1)
        inside = onset(lo, i) if onset is not None and i > lo else None
        first = int(steps[lo + (inside or 0)])
        out.append(HealthWarning(check, metric, int(steps[j]), summary, remedy, keys,
                                 first, int(steps[j]), j == last))  # fmt: skip
    return out


IMPORTANCE_REMEDIES = {
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


def check_importance_weights(get: Mapping[str, Series], t: HealthThresholds) -> list[HealthWarning]:
    out = []
    tol = t.importance_weight_tolerance
    for name, (check, remedy, keys) in IMPORTANCE_REMEDIES.items():
        steps, values = _finite_arrays(get.get(name, ((), ())))

        def make(
            i: int,
            name: str = name,
            remedy: str = remedy,
            keys: tuple[str, ...] = keys,
            steps: Ints = steps,
            values: Floats = values,
        ) -> tuple[str, str, tuple[str, ...]]:
            return (f"{name} = {values[i]:.4g} at step {steps[i]}, more than {tol:g} "
                    "from 1.0", remedy, keys)  # fmt: skip

        out += episodes(steps, np.abs(values - 1.0) > tol, 1, make, check, name, t.episode_gap)
    return out


def check_no_eos(get: Mapping[str, Series], t: HealthThresholds) -> list[HealthWarning]:
    steps, values = _finite_arrays(get.get(NO_EOS_RATIO, ((), ())))

    def make(i: int) -> tuple[str, str, tuple[str, ...]]:
        return (
            f"{NO_EOS_RATIO} = {values[i]:.3g} at step {steps[i]}: more than "
            f"{t.no_eos_ratio_max:.0%} of trajectories are truncated before EOS",
            "Increase gconfig.max_new_tokens, or filter out overly long trajectories "
            "(dynamic filtering)",
            ("gconfig.max_new_tokens",),
        )

    holds = values > t.no_eos_ratio_max
    return episodes(steps, holds, 1, make, "no_eos_ratio", NO_EOS_RATIO, t.episode_gap)


def check_seq_len_growth(get: Mapping[str, Series], t: HealthThresholds) -> list[HealthWarning]:
    s_steps, seq = _finite_arrays(get.get(SEQ_LEN, ((), ())))
    e_steps, eos = _finite_arrays(get.get(NO_EOS_RATIO, ((), ())))
    w = t.window
    if len(seq) < w or len(eos) < w:
        return []
    if not np.array_equal(s_steps, e_steps):  # line the two up by step
        common, si, ei = np.intersect1d(s_steps, e_steps, return_indices=True)
        s_steps, seq, eos = common, seq[si], eos[ei]
    seq_fit, eos_fit = rolling_fits(seq, w), rolling_fits(eos, w)
    mean = np.full(len(seq), np.nan)
    if len(seq) >= w:
        mean[w - 1 :] = _window_sums(seq, w) / w
    with np.errstate(divide="ignore", invalid="ignore"):
        growth = np.where(mean != 0, seq_fit.gain / mean, 0.0)
    holds = (growth >= t.seq_len_growth) & (eos_fit.gain > 0.005)  # NaN compares False

    def make(i: int) -> tuple[str, str, tuple[str, ...]]:
        return (
            f"{SEQ_LEN} grew {growth[i]:.0%} over the {w} steps to {s_steps[i]} while "
            f"{NO_EOS_RATIO} rose by {eos_fit.gain[i]:.3g}",
            "Growing sequences lead to more truncation: watch no_eos_ratio, raise "
            "gconfig.max_new_tokens or filter long trajectories",
            ("gconfig.max_new_tokens",),
        )

    def onset(lo: int, i: int) -> int | None:
        return trend_onset(seq[lo : i + 1], rising=True)

    return episodes(s_steps, holds, w, make, "seq_len_growth", SEQ_LEN, t.episode_gap, onset)


def check_task_reward_noise(get: Mapping[str, Series], t: HealthThresholds) -> list[HealthWarning]:
    steps, values = _finite_arrays(get.get(TASK_REWARD, ((), ())))
    w = t.window
    noise = rolling_noise(values, w)

    def make(i: int) -> tuple[str, str, tuple[str, ...]]:
        return (
            f"{TASK_REWARD} fluctuates: step-to-step std {noise[i]:.3g} over the {w} steps "
            f"to {steps[i]} (above {t.task_reward_std_max:g})",
            "Training has high variance: increase the batch size (train_dataset.batch_size) "
            "if resources allow",
            ("train_dataset.batch_size",),
        )

    def onset(lo: int, i: int) -> int | None:
        return variance_onset(values[lo : i + 1])

    holds = noise > t.task_reward_std_max  # NaN compares False
    return episodes(steps, holds, w, make, "task_reward_variance", TASK_REWARD, t.episode_gap,
                    onset)  # fmt: skip


REWARD_FLAT_REMEDY = (
    "Establish a baseline by evaluating before training; train on the test set to see "
    "whether rewards rise there; if not, tune the batch size "
    "(train_dataset.batch_size) or learning rate (actor.optimizer.lr), try another "
    "base model or SFT first; if they do, check the training data's quality and "
    "difficulty (dynamic filtering via should_accept_fn)"
)


def reward_flat_reason(fit: LineFit, t: HealthThresholds) -> str | None:
    """Why a window's reward counts as not increasing (None: it increases). The rule is
    documented in docs/guide/health.md."""
    if fit.gain < t.reward_flat_min_gain:
        return f"below the minimum gain {t.reward_flat_min_gain:g}"
    if fit.t < t.reward_flat_min_t:
        return (f"not significant against its step-to-step scatter (t = {fit.t:.2g} < "
                f"{t.reward_flat_min_t:g})")  # fmt: skip
    if fit.gain < t.reward_flat_min_noise_ratio * fit.resid_sd:
        return (f"smaller than {t.reward_flat_min_noise_ratio:g}x its noise "
                f"(sd {fit.resid_sd:.2g}): inside the band the reward moves in")  # fmt: skip
    return None


def reward_flat_windows(fits: RollingFits, t: HealthThresholds) -> Bools:
    """Per window, whether the reward counts as not increasing (`reward_flat_reason`)."""
    with np.errstate(invalid="ignore"):
        return (
            (fits.gain < t.reward_flat_min_gain)
            | (fits.t < t.reward_flat_min_t)
            | (fits.gain < t.reward_flat_min_noise_ratio * fits.resid_sd)
        )


def check_reward_flat(get: Mapping[str, Series], t: HealthThresholds) -> list[HealthWarning]:
    out = []
    n = t.reward_flat_steps
    for name in (ROLLOUT_REWARD, TASK_REWARD):
        steps, values = _finite_arrays(get.get(name, ((), ())))
        if len(values) < n:
            continue
        fits = rolling_fits(values, n)

        def make(
            i: int, name: str = name, steps: Ints = steps, fits: RollingFits = fits
        ) -> tuple[str, str, tuple[str, ...]]:
            fit = fits.at(i)
            assert fit is not None
            return (f"{name} is not increasing: fitted change {fit.gain:+.3g} over the "
                    f"{n} steps to {steps[i]}, {reward_flat_reason(fit, t)}",
                    REWARD_FLAT_REMEDY, ("train_dataset.batch_size", "actor.optimizer.lr"))  # fmt: skip

        def onset(lo: int, i: int, values: Floats = values) -> int | None:
            return trend_onset(values[lo : i + 1], rising=False)  # it rose, then flattened

        flat = reward_flat_windows(fits, t)
        out += episodes(steps, flat, n, make, "reward_flat", name, t.episode_gap, onset)
    return out


CHECKS = (
    check_importance_weights,
    check_no_eos,
    check_seq_len_growth,
    check_task_reward_noise,
    check_reward_flat,
)


def run_checks(get: Mapping[str, Series], t: HealthThresholds | None = None) -> list[HealthWarning]:
    """Every check on a run's series (`name -> (steps, values)`), judged at every step:
    each episode once, active or ended, newest first."""
    t = t or HealthThresholds()
    out: list[HealthWarning] = []
    for check in CHECKS:
        out.extend(check(get, t))
    out.sort(key=lambda w: (not w.active, -(w.last_step or 0), -(w.first_step or 0)))
    return out


# A stall this many median step times long is told by its age ("last step 3 d ago"), not
# by a ratio in the millions.
OLD_LOG_TIMES = 1000


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
        median = self.median_step_seconds
        if self.stalled:
            times = waited / median if median > 0 else math.inf
            if times < OLD_LOG_TIMES:
                return (f"stalled: no new step for {format_duration(waited)}, {times:.0f}x "
                        f"the median step time ({median:.3g}s)")  # fmt: skip
            # A log last written hours or days ago: its age says more than a ratio in the
            # millions (the job may be gone without its completion line).
            return (f"stalled: last step {format_duration(waited)} ago (median step time "
                    f"{median:.3g}s)")  # fmt: skip
        return f"progressing: last step {format_duration(waited)} ago (median step {median:.3g}s)"

    @property
    def old(self) -> bool:
        """Quiet past AReaL's process-group timeout: a collective hung that long has failed
        and ended the job, so the log more likely belongs to a job that is gone."""
        return self.stalled and (self.waited_seconds or 0.0) > AREAL_GROUP_TIMEOUT_S


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
