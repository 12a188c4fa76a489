"""Flags on inference servers: what their polled state says is wrong, with the evidence, a
remedy and the AReaL config key to change. Pure functions over polled observations.

The kinds are a fixed set (FLAG_KINDS, documented in docs/guide/rollout.md):
- `paused_after_update`: a server has been paused (AReaL's pause route) longer than a
  weight update takes, or paused while the trainer is on a newer version.
- `version_skew`: the servers of one job serve different weight versions.
- `version_lag`: a server's version lags the trainer's by more than
  `rollout.max_head_offpolicyness`.
- `kv_saturated`: the KV cache is nearly full and the waiting queue grows.
- `throughput_drop`: generation throughput fell to a fraction of its recent median
  while requests are running or waiting.
"""

from __future__ import annotations

import math
import statistics
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

FLAG_KINDS = (
    "paused_after_update",
    "version_skew",
    "version_lag",
    "kv_saturated",
    "throughput_drop",
)
# The AReaL config key each kind's remedy names (all fields of AReaL's config at cbff54d).
FLAG_CONFIG_KEYS = {
    "paused_after_update": "actor.weight_update_mode",
    "version_skew": "actor.weight_update_mode",
    "version_lag": "rollout.max_head_offpolicyness",
    "kv_saturated": "rollout.max_concurrent_rollouts",
    "throughput_drop": "rollout.max_concurrent_rollouts",
}
PAUSE_GRACE_S = 120.0  # a disk or xccl update that takes longer is flagged
KV_FULL = 0.95  # token usage at or above: saturated
THROUGHPUT_FRACTION = 0.25  # current below this share of the recent median: a drop
MIN_HISTORY = 5  # polls before a median means anything

USAGE_METRICS = ("sglang:token_usage", "vllm:kv_cache_usage_perc")
QUEUE_METRICS = ("sglang:num_queue_reqs", "vllm:num_requests_waiting")
RUNNING_METRICS = ("sglang:num_running_reqs", "vllm:num_requests_running")


@dataclass(frozen=True)
class ServerFlag:
    kind: str
    evidence: str
    remedy: str
    config_key: str

    def to_json(self) -> dict[str, str]:
        return {
            "kind": self.kind,
            "evidence": self.evidence,
            "remedy": self.remedy,
            "config_key": self.config_key,
        }


@dataclass
class ServerPoint:
    """One poll of one server: when, its metric values, throughput (tokens/s, measured or
    derived from a counter), pause state and served version (None: not known)."""

    at: float
    metrics: dict[str, float] = field(default_factory=dict)
    throughput: float | None = None
    paused: bool | None = None
    weight_version: int | str | None = None


def _flag(kind: str, evidence: str, remedy: str) -> ServerFlag:
    return ServerFlag(kind, evidence, remedy, FLAG_CONFIG_KEYS[kind])


def _first(metrics: dict[str, float], names: Sequence[str]) -> float | None:
    for name in names:
        if name in metrics:
            return metrics[name]
    return None


def throughput_from_counter(prev: ServerPoint | None, cur: ServerPoint) -> float | None:
    """Tokens/s from vLLM's `generation_tokens_total` across two polls."""
    name = "vllm:generation_tokens_total"
    if prev is None or name not in prev.metrics or name not in cur.metrics:
        return None
    dt = cur.at - prev.at
    delta = cur.metrics[name] - prev.metrics[name]
    if dt <= 0 or delta < 0:  # a restarted server resets its counter
        return None
    rate = delta / dt
    return rate if math.isfinite(rate) else None


def paused_since(history: Sequence[ServerPoint]) -> float | None:
    """When the current pause began (the first poll of the latest paused run)."""
    since = None
    for point in history:
        if point.paused:
            since = point.at if since is None else since
        elif point.paused is False:
            since = None
    return since


def version_flags(
    version: int | str | None,
    paused: bool | None,
    paused_for: float | None,
    trainer_version: int | None,
    max_head_offpolicyness: int | None,
) -> list[ServerFlag]:
    """`paused_after_update` and `version_lag` of one server: its served version, whether
    and how long it has been paused (None: not known), the trainer's version and the
    allowed lag (None: not known)."""
    flags = []
    served = version if isinstance(version, int) else None
    behind = trainer_version is not None and served is not None and trainer_version > served
    held = paused_for is not None and paused_for >= PAUSE_GRACE_S
    if paused and (held or behind):
        ahead = f"; the trainer is on version {trainer_version}" if behind else ""
        length = f" for {paused_for:.0f}s" if paused_for is not None else ""
        flags.append(
            _flag(
                "paused_after_update",
                f"paused{length} at version {version}{ahead}",
                "The weight update left the server paused (continue_generation never "
                "came): look at the trainer ranks in the weight-update path (stacks), "
                "then resume with POST /continue_generation or restart the rollout; "
                "with disk updates check the saved path is readable from the server",
            )
        )
    if (
        trainer_version is not None
        and served is not None
        and max_head_offpolicyness is not None
        and trainer_version - served > max_head_offpolicyness
    ):
        flags.append(
            _flag(
                "version_lag",
                f"serves version {served}, the trainer is on {trainer_version} "
                f"({trainer_version - served} behind, allowed {max_head_offpolicyness})",
                "Weight updates do not reach this server: read its log for failed "
                "update_weights calls; raising the allowed offpolicyness only hides it",
            )
        )
    return flags


def server_flags(
    history: Sequence[ServerPoint],
    trainer_version: int | None = None,
    max_head_offpolicyness: int | None = None,
) -> list[ServerFlag]:
    """Flags of one server from its polls, oldest first (the last is now)."""
    if not history:
        return []
    now = history[-1]
    flags: list[ServerFlag] = []
    since = paused_since(history)
    flags.extend(
        version_flags(
            now.weight_version,
            since is not None,
            None if since is None else now.at - since,
            trainer_version,
            max_head_offpolicyness,
        )
    )
    usage = _first(now.metrics, USAGE_METRICS)
    queues = [q for p in history[-3:] if (q := _first(p.metrics, QUEUE_METRICS)) is not None]
    if (
        usage is not None
        and usage >= KV_FULL
        and len(queues) >= 2
        and queues[-1] > queues[0]
        and all(b >= a for a, b in zip(queues, queues[1:]))
    ):
        flags.append(
            _flag(
                "kv_saturated",
                f"KV cache {usage:.0%} full, queue grew {queues[0]:g} -> {queues[-1]:g} "
                f"over {len(queues)} polls",
                "The server takes more requests than its KV cache holds: lower the "
                "rollouts in flight, or give the server more memory "
                "(sglang.mem_fraction_static / vllm.gpu_memory_utilization) or more servers",
            )
        )
    rates = [p.throughput for p in history[:-1] if p.throughput is not None]
    busy = (_first(now.metrics, RUNNING_METRICS) or 0) + (_first(now.metrics, QUEUE_METRICS) or 0)
    if now.throughput is not None and len(rates) >= MIN_HISTORY and busy > 0:
        median = statistics.median(rates[-60:])
        if median > 0 and now.throughput < THROUGHPUT_FRACTION * median:
            flags.append(
                _flag(
                    "throughput_drop",
                    f"{now.throughput:.0f} tokens/s, {now.throughput / median:.0%} of the "
                    f"recent median {median:.0f} tokens/s, with {busy:g} requests running "
                    "or waiting",
                    "Generation slowed while work is queued: check the server's KV cache "
                    "and log (preemption, retraction), and fewer rollouts in flight",
                )
            )
    return flags


def fleet_flags(
    versions: dict[str, int | str | None],
    trainer_version: int | None = None,
    max_head_offpolicyness: int | None = None,
    paused: dict[str, bool | None] | None = None,
) -> dict[str, list[ServerFlag]]:
    """The flags that need the whole fleet or the trainer, by server name: `version_skew`
    for each server not on the most common version; with the trainer's version,
    `version_lag` and `paused_after_update` (paused while the trainer moved on)."""
    out: dict[str, list[ServerFlag]] = {}
    for name, flag in _skew(versions).items():
        out.setdefault(name, []).append(flag)
    if trainer_version is not None:
        for name, version in versions.items():
            found = version_flags(
                version,
                (paused or {}).get(name),
                None,
                trainer_version,
                max_head_offpolicyness,
            )
            if found:
                out.setdefault(name, []).extend(found)
    return out


def _skew(versions: dict[str, int | str | None]) -> dict[str, ServerFlag]:
    """`version_skew` for each server (by name) not on the most common version."""
    known = {name: v for name, v in versions.items() if v is not None}
    if len(set(map(str, known.values()))) < 2:
        return {}
    counts: dict[str, int] = {}
    for v in known.values():
        counts[str(v)] = counts.get(str(v), 0) + 1
    # The most common version; on a tie the newest (numbers compared as numbers).
    common = max(counts, key=lambda v: (counts[v], v.isdigit(), int(v) if v.isdigit() else 0, v))
    listing = ", ".join(f"{v}: {n}" for v, n in sorted(counts.items()))
    return {
        name: _flag(
            "version_skew",
            f"serves version {v}; most servers serve {common} ({listing})",
            "Some servers missed a weight update: read their logs for the failed "
            "update, then update or restart them before rollouts mix versions",
        )
        for name, v in known.items()
        if str(v) != common
    }


def flags_json(flags: Sequence[ServerFlag]) -> list[dict[str, Any]]:
    return [f.to_json() for f in flags]
