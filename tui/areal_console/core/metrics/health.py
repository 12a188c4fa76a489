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
    """One episode of a check: where its condition began, where it last held, and whether
    it still holds at the metric's latest step (`active`). A check over a window (a trend)
    begins at the first step of the first window that triggers it."""

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


# --------------------------------------------------------------------------------------
# Judging every step: each check says, per step, whether its condition holds there; runs
# of steps where it holds are episodes. Windowed checks use running sums (one pass).


@dataclass(frozen=True)
class LineFit:
    """A least-squares line through one window of equally spaced values."""

    slope: float  # per step
    gain: float  # slope x (n - 1): the fitted change over the window
    resid_sd: float  # scatter around the line (n - 2 degrees of freedom)
    t: float  # slope / its standard error (inf when the line fits exactly)


def rolling_fits(values: Sequence[float], n: int) -> list[LineFit | None]:
    """`LineFit` of each window of `n` values ending at index i (None before the first)."""
    out: list[LineFit | None] = [None] * min(n - 1, len(values))
    if n < 3 or len(values) < n:
        return out
    y0 = values[0]  # centred: running sums of small numbers lose less
    ys = [v - y0 for v in values]
    cy = [0.0, *itertools.accumulate(ys)]
    cyy = [0.0, *itertools.accumulate(y * y for y in ys)]
    cjy = [0.0, *itertools.accumulate(j * y for j, y in enumerate(ys))]
    sxx = n * (n * n - 1) / 12
    for i in range(n - 1, len(ys)):
        a, b = i - n + 1, i + 1
        sy = cy[b] - cy[a]
        syy = cyy[b] - cyy[a]
        jbar = (a + i) / 2
        sxy = (cjy[b] - cjy[a]) - jbar * sy
        k = sxy / sxx
        ssr = max(0.0, syy - sy * sy / n - k * sxy)
        sd = math.sqrt(ssr / (n - 2))
        se = sd / math.sqrt(sxx)
        t = (
            k / se
            if se > 1e-12 * max(1.0, abs(k))
            else (math.inf if k > 0 else -math.inf if k < 0 else 0.0)
        )
        out.append(LineFit(k, k * (n - 1), sd, t))
    return out


def rolling_noise(values: Sequence[float], n: int) -> list[float | None]:
    """`noise_std` of each window of `n` values ending at index i (None before the first)."""
    out: list[float | None] = [None] * min(n - 1, len(values))
    if n < 3 or len(values) < n:
        return out
    d = [b - a for a, b in itertools.pairwise(values)]
    cd = [0.0, *itertools.accumulate(d)]
    cdd = [0.0, *itertools.accumulate(x * x for x in d)]
    m = n - 1  # differences per window
    for i in range(n - 1, len(values)):
        a, b = i - m, i  # differences a .. i-1
        s1 = cd[b] - cd[a]
        var = max(0.0, (cdd[b] - cdd[a]) / m - (s1 / m) ** 2)
        out.append(math.sqrt(var) / math.sqrt(2))
    return out


def episodes(
    steps: Sequence[int],
    holds: Sequence[bool],
    window: int,
    make: Callable[[int], tuple[str, str, tuple[str, ...]]],
    check: str,
    metric: str,
) -> list[HealthWarning]:
    """Runs of `holds` as episodes; `make(i)` words the warning at index i (its last)."""
    out = []
    i, n = 0, len(holds)
    while i < n:
        if not holds[i]:
            i += 1
            continue
        j = i
        while j + 1 < n and holds[j + 1]:
            j += 1
        summary, remedy, keys = make(j)
        first = steps[max(0, i - window + 1)]
        out.append(HealthWarning(check, metric, steps[j], summary, remedy, keys,
                                 first, steps[j], j == n - 1))  # fmt: skip
        i = j + 1
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
        steps, values = _finite(get.get(name, ((), ())))

        def make(
            i: int,
            name: str = name,
            remedy: str = remedy,
            keys: tuple[str, ...] = keys,
            steps: list[int] = steps,
            values: list[float] = values,
        ) -> tuple[str, str, tuple[str, ...]]:
            return (f"{name} = {values[i]:.4g} at step {steps[i]}, more than {tol:g} "
                    "from 1.0", remedy, keys)  # fmt: skip

        holds = [abs(v - 1.0) > tol for v in values]
        out += episodes(steps, holds, 1, make, check, name)
    return out


def check_no_eos(get: Mapping[str, Series], t: HealthThresholds) -> list[HealthWarning]:
    steps, values = _finite(get.get(NO_EOS_RATIO, ((), ())))

    def make(i: int) -> tuple[str, str, tuple[str, ...]]:
        return (
            f"{NO_EOS_RATIO} = {values[i]:.3g} at step {steps[i]}: more than "
            f"{t.no_eos_ratio_max:.0%} of trajectories are truncated before EOS",
            "Increase gconfig.max_new_tokens, or filter out overly long trajectories "
            "(dynamic filtering)",
            ("gconfig.max_new_tokens",),
        )

    holds = [v > t.no_eos_ratio_max for v in values]
    return episodes(steps, holds, 1, make, "no_eos_ratio", NO_EOS_RATIO)


def check_seq_len_growth(get: Mapping[str, Series], t: HealthThresholds) -> list[HealthWarning]:
    s_steps, seq = _finite(get.get(SEQ_LEN, ((), ())))
    e_steps, eos = _finite(get.get(NO_EOS_RATIO, ((), ())))
    w = t.window
    if len(seq) < w or len(eos) < w:
        return []
    if s_steps != e_steps:  # line the two up by step
        eos_at = dict(zip(e_steps, eos, strict=True))
        pairs = [(s, v, eos_at[s]) for s, v in zip(s_steps, seq, strict=True) if s in eos_at]
        s_steps = [p[0] for p in pairs]
        seq, eos = [p[1] for p in pairs], [p[2] for p in pairs]
    seq_fit, eos_fit = rolling_fits(seq, w), rolling_fits(eos, w)
    cs = [0.0, *itertools.accumulate(seq)]
    growth: list[float] = []
    holds = []
    for i, (sf, ef) in enumerate(zip(seq_fit, eos_fit, strict=True)):
        if sf is None or ef is None:
            growth.append(0.0)
            holds.append(False)
            continue
        mean = (cs[i + 1] - cs[i + 1 - w]) / w
        g = sf.gain / mean if mean else 0.0
        growth.append(g)
        holds.append(g >= t.seq_len_growth and ef.gain > 0.005)

    def make(i: int) -> tuple[str, str, tuple[str, ...]]:
        ef = eos_fit[i]
        assert ef is not None
        return (
            f"{SEQ_LEN} grew {growth[i]:.0%} over the {w} steps to {s_steps[i]} while "
            f"{NO_EOS_RATIO} rose by {ef.gain:.3g}",
            "Growing sequences lead to more truncation: watch no_eos_ratio, raise "
            "gconfig.max_new_tokens or filter long trajectories",
            ("gconfig.max_new_tokens",),
        )

    return episodes(s_steps, holds, w, make, "seq_len_growth", SEQ_LEN)


def check_task_reward_noise(get: Mapping[str, Series], t: HealthThresholds) -> list[HealthWarning]:
    steps, values = _finite(get.get(TASK_REWARD, ((), ())))
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

    holds = [x is not None and x > t.task_reward_std_max for x in noise]
    return episodes(steps, holds, w, make, "task_reward_variance", TASK_REWARD)


REWARD_FLAT_REMEDY = (
    "Establish a baseline by evaluating before training; train on the test set to see "
    "whether rewards rise there; if not, tune the batch size "
    "(train_dataset.batch_size) or learning rate (actor.optimizer.lr), try another "
    "base model or SFT first; if they do, check the training data's quality and "
    "difficulty (dynamic filtering via should_accept_fn)"
)


def reward_flat_reason(fit: LineFit, t: HealthThresholds) -> str | None:
    """Why a window's reward counts as not increasing (None: it increases). The rule is
    documented in docs/health.md."""
    if fit.gain < t.reward_flat_min_gain:
        return f"below the minimum gain {t.reward_flat_min_gain:g}"
    if fit.t < t.reward_flat_min_t:
        return (f"not significant against its step-to-step scatter (t = {fit.t:.2g} < "
                f"{t.reward_flat_min_t:g})")  # fmt: skip
    if fit.gain < t.reward_flat_min_noise_ratio * fit.resid_sd:
        return (f"smaller than {t.reward_flat_min_noise_ratio:g}x its noise "
                f"(sd {fit.resid_sd:.2g}): inside the band the reward moves in")  # fmt: skip
    return None


def check_reward_flat(get: Mapping[str, Series], t: HealthThresholds) -> list[HealthWarning]:
    out = []
    n = t.reward_flat_steps
    for name in (ROLLOUT_REWARD, TASK_REWARD):
        steps, values = _finite(get.get(name, ((), ())))
        if len(values) < n:
            continue
        fits = rolling_fits(values, n)
        reasons = [reward_flat_reason(f, t) if f is not None else None for f in fits]

        def make(
            i: int,
            name: str = name,
            steps: list[int] = steps,
            fits: list[LineFit | None] = fits,
            reasons: list[str | None] = reasons,
        ) -> tuple[str, str, tuple[str, ...]]:
            fit = fits[i]
            assert fit is not None
            return (f"{name} is not increasing: fitted change {fit.gain:+.3g} over the "
                    f"{n} steps to {steps[i]}, {reasons[i]}", REWARD_FLAT_REMEDY,
                    ("train_dataset.batch_size", "actor.optimizer.lr"))  # fmt: skip

        out += episodes(steps, [r is not None for r in reasons], n, make, "reward_flat", name)
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


@dataclass(frozen=True)
class StallState:
    stalled: bool
    finished: bool
    last_step_at: float | None
    median_step_seconds: float | None
    waited_seconds: float | None
    limit_seconds: float | None

    def describe(self) -> str:
        if self.finished:
            return "finished (AReaL logged its completion line)"
        if self.last_step_at is None:
            return "no step logged yet"
        if self.median_step_seconds is None:
            return "too few steps to judge progress"
        waited = self.waited_seconds or 0.0
        if self.stalled:
            return (f"stalled: no new step for {waited:.0f}s, {waited / self.median_step_seconds:.0f}x "
                    f"the median step time ({self.median_step_seconds:.3g}s)")  # fmt: skip
        return f"progressing: last step {waited:.0f}s ago (median step {self.median_step_seconds:.3g}s)"


def stall_state(
    step_times: Sequence[float], now: float, finished: bool, t: HealthThresholds | None = None
) -> StallState:
    """Is the run stalled? No new step for `stall_factor` x the median step time (and at
    least `stall_min_seconds`); a run that logged its completion line is finished instead."""
    t = t or HealthThresholds()
    times = [x for x in step_times if math.isfinite(x)]
    last = times[-1] if times else None
    if finished or last is None:
        return StallState(False, finished, last, None, None, None)
    recent = times[-51:]
    gaps = [b - a for a, b in itertools.pairwise(recent) if b >= a]
    waited = max(0.0, now - last)
    if len(gaps) < 2:
        return StallState(False, False, last, None, waited, None)
    median = statistics.median(gaps)
    limit = max(t.stall_factor * median, t.stall_min_seconds)
    return StallState(waited > limit, False, last, median, waited, limit)
