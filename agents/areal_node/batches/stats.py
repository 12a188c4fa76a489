"""Statistics and warnings of a batch: pure functions, rows in, numbers out."""

from __future__ import annotations

import math
from typing import Any

from areal_node.constants import config_key, rejection_sampling_example

# AReaL's thresholds (performance and debugging guides, areal/api/cli_args.py).
NO_EOS_WARN = 0.05
# The bound AReaL's own warning suggests for actor.rejection_sampling (metric=ratio), the
# old default of the removed behave_imp_weight_cap (cli_args.py:1941-1952 at cbff54d6).
REJECTION_UPPER = 5.0
BEHAVE_IMP_WEIGHT_DRIFT = 0.1  # mean further than this from 1.0 warns
EQUAL_REWARD_GROUPS_WARN = 0.5
LENGTH_GROWTH_WARN = 0.2  # growth of mean response length over the steps shown


def describe(values: list[float]) -> dict[str, float | None]:
    """mean, std (population), min and max; None for an empty list."""
    if not values:
        return {"mean": None, "std": None, "min": None, "max": None}
    n = len(values)
    mean = sum(values) / n
    var = sum((v - mean) ** 2 for v in values) / n
    return {"mean": mean, "std": math.sqrt(var), "min": min(values), "max": max(values)}


def histogram(values: list[float], bins: int = 10) -> dict[str, list[float]]:
    """Counts of `values` in `bins` equal-width bins: {"edges": [bins+1], "counts": [bins]}."""
    if not values:
        return {"edges": [], "counts": []}
    lo, hi = min(values), max(values)
    if hi == lo:
        return {"edges": [lo, hi], "counts": [float(len(values))]}
    width = (hi - lo) / bins
    counts = [0.0] * bins
    for v in values:
        counts[min(bins - 1, int((v - lo) / width))] += 1
    return {"edges": [lo + i * width for i in range(bins + 1)], "counts": counts}


def batch_stats(
    rows: list[dict[str, Any]],
    group_rewards: list[list[float]],
    behave_imp_weight: dict[str, Any] | None = None,
    version_span: list[int] | None = None,
) -> dict[str, Any]:
    """The `stats` of `batch --json` from per-sample rows, named as AReaL's actor names them."""
    seq = [float(r["seq_len"]) for r in rows]
    prompt = [float(r["prompt_len"]) for r in rows]
    resp = [float(r["response_len"]) for r in rows]
    task = [float(r["task_reward"]) for r in rows if r.get("task_reward") is not None]
    rewards = [float(r["reward"]) for r in rows if r.get("reward") is not None]
    cut = [r["no_eos"] for r in rows if r.get("no_eos") is not None]
    judged = [r["eos"] for r in rows if r.get("eos") is not None]
    multi = [g for g in group_rewards if len(g) > 1]
    equal = [g for g in multi if max(g) - min(g) == 0]
    heads = [
        r["head_version"] for r in rows if r["head_version"] is not None and r["head_version"] >= 0
    ]
    tails = [
        r["tail_version"] for r in rows if r["tail_version"] is not None and r["tail_version"] >= 0
    ]
    version = None
    if heads:
        newest = max(tails or heads)
        stale = [newest - h for h in heads]
        version = {
            "min": min(heads),
            "max": newest,
            "staleness_mean": sum(stale) / len(stale),
            "staleness_max": max(stale),
            "mixed_version_ratio": (
                sum(1 for s in version_span if s > 0) / len(version_span) if version_span else 0.0
            ),
        }
    return {
        "seq_len": describe(seq),
        "prompt_len": describe(prompt),
        "response_len": describe(resp),
        "task_reward": describe(task),
        "reward": describe(rewards),
        # AReaL's: length == the padded width of the rank's batch (no EOS id needed).
        "no_eos_ratio": (sum(1 for c in cut if c) / len(cut)) if cut else None,
        # Beside it when an EOS id is known: responses whose last token is not EOS.
        "no_eos_token_ratio": (sum(1 for e in judged if not e) / len(judged)) if judged else None,
        "equal_reward_group_ratio": (len(equal) / len(multi)) if multi else None,
        "equal_reward_groups": len(equal),
        "version": version,
        "behave_imp_weight": behave_imp_weight,
    }


def batch_warnings(
    stats: dict[str, Any], keys: dict[str, Any] | None = None, eos_known: bool = True
) -> list[str]:
    """Health checks with AReaL's thresholds, as sentences a user can act on.

    `eos_known` is kept for callers; AReaL's no_eos_ratio needs no EOS id.
    """
    out: list[str] = []
    max_new = config_key("gconfig.max_new_tokens")
    ratio = stats.get("no_eos_ratio")
    if ratio is not None and ratio > NO_EOS_WARN:
        out.append(
            f"no_eos_ratio {ratio:.3f} > {NO_EOS_WARN}: {ratio:.0%} of sequences are as long as "
            f"the padded batch (cut at the length limit); raise {max_new} or filter "
            "truncated samples"
        )
    by_eos = stats.get("no_eos_token_ratio")
    if by_eos is not None and by_eos > NO_EOS_WARN and (ratio is None or ratio <= NO_EOS_WARN):
        out.append(
            f"{by_eos:.0%} of responses do not end in the EOS token (AReaL's no_eos_ratio, "
            f"{_ratio_text(ratio)}, only counts those as long as the padded batch): "
            f"truncated or stopped by another stop token; check {max_new} and "
            f"{config_key('gconfig.stop_token_ids')}"
        )
    iw = stats.get("behave_imp_weight")
    if iw:
        if abs(iw["mean"] - 1.0) > BEHAVE_IMP_WEIGHT_DRIFT:
            out.append(
                f"behave_imp_weight mean {iw['mean']:.3f} is far from 1.0: the proximal and "
                "behaviour policies diverge (stale rollouts or an inference/training "
                f"mismatch); lower {config_key('rollout.max_head_offpolicyness')}"
            )
        if iw["max"] > REJECTION_UPPER:
            out.append(
                f"behave_imp_weight up to {iw['max']:.2f} exceeds {REJECTION_UPPER:g} on "
                f"{iw['above_upper_ratio']:.2%} of tokens: filter them with "
                f"{rejection_sampling_example(REJECTION_UPPER)}"
            )
    eq = stats.get("equal_reward_group_ratio")
    if eq is not None and eq >= EQUAL_REWARD_GROUPS_WARN:
        out.append(
            f"{eq:.0%} of groups have all-equal rewards (zero GRPO advantage, no learning signal "
            "from them): filter them (dynamic sampling) or adjust task difficulty"
        )
    elif eq:
        out.append(
            f"{stats.get('equal_reward_groups', 0)} group(s) ({eq:.0%}) have all-equal "
            "rewards: zero advantage, no gradient from them"
        )
    reward = stats.get("task_reward") or {}
    if (
        reward.get("std") is not None
        and reward.get("mean")
        and reward["std"] > 2 * abs(reward["mean"])
        and reward["std"] > 1.0
    ):
        out.append("high task_reward variance: a larger batch would steady the gradient")
    for name, meta in (keys or {}).items():
        missing = meta.get("missing_in_groups")
        if missing:
            out.append(f"keys differ between groups: '{name}' is missing in {missing} group(s)")
    return out


def _ratio_text(value: float | None) -> str:
    return "-" if value is None else f"{value:.3f}"


def length_trend_warnings(per_step: list[dict[str, Any]]) -> list[str]:
    """Growing response lengths between steps (worse when no_eos_ratio grows too)."""
    points = [p for p in per_step if p.get("response_len_mean") is not None]
    if len(points) < 3:
        return []
    lens = [p["response_len_mean"] for p in points]
    # Indexes, not zip(strict=): nodes may run this module on Python older than 3.10.
    rising = all(lens[i + 1] > lens[i] for i in range(len(lens) - 3, len(lens) - 1))
    growth = lens[-1] / lens[0] - 1 if lens[0] else 0.0
    if not rising or growth < LENGTH_GROWTH_WARN:
        return []
    eos = [p.get("no_eos_ratio") for p in points]
    first, step_a, step_b = eos[0], points[0]["step"], points[-1]["step"]
    msg = (
        f"response length grows between steps: mean {lens[0]:.0f} -> {lens[-1]:.0f} tokens "
        f"(+{growth:.0%}) from step {step_a} to {step_b}"
    )
    if first is not None and eos[-1] is not None and eos[-1] > first:
        msg += (
            f", with no_eos_ratio {first:.3f} -> {eos[-1]:.3f}: generations are running "
            f"into {config_key('gconfig.max_new_tokens')}"
        )
    return [msg]
