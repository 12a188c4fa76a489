"""Server flags: each kind raised by the state that means it, and not by its near misses."""

from __future__ import annotations

import pytest
from areal_node.constants import AREAL_KEYS
from areal_node.prom_text import decode_body, parse_exposition
from areal_node.server_flags import (
    FLAG_CONFIG_KEYS,
    FLAG_KINDS,
    PAUSE_GRACE_S,
    ServerPoint,
    fleet_flags,
    server_flags,
    throughput_from_counter,
)

from tests.support.fixtures.rollout_formats import ServerState, sglang_metrics, vllm_metrics


def sglang_point(at: float, **state: float) -> ServerPoint:
    values = parse_exposition(decode_body(sglang_metrics(ServerState(**state)))).values()  # type: ignore[arg-type]
    return ServerPoint(at, values, throughput=values["sglang:gen_throughput"])


def kinds(flags: list) -> list[str]:
    return [f.kind for f in flags]


def test_every_kind_names_a_registered_areal_key() -> None:
    assert set(FLAG_CONFIG_KEYS) == set(FLAG_KINDS)
    for key in FLAG_CONFIG_KEYS.values():
        assert key in AREAL_KEYS


def test_a_healthy_server_has_no_flags() -> None:
    history = [sglang_point(t) for t in range(10)]
    assert server_flags(history, trainer_version=3, max_head_offpolicyness=2) == []


def test_paused_past_the_grace_or_behind_the_trainer() -> None:
    points = [ServerPoint(t, paused=False, weight_version=4) for t in (0, 10)]
    points += [ServerPoint(t, paused=True, weight_version=4) for t in (20, 20 + PAUSE_GRACE_S)]
    (flag,) = server_flags(points)
    assert flag.kind == "paused_after_update" and "paused for 120s at version 4" in flag.evidence
    assert flag.config_key == "actor.weight_update_mode"
    # A short pause is a weight update in progress; behind the trainer it is stuck.
    short = points[:3]
    assert server_flags(short) == []
    assert kinds(server_flags(short, trainer_version=5)) == ["paused_after_update"]
    # Resumed: the pause is over.
    assert server_flags([*points, ServerPoint(200, paused=False, weight_version=4)]) == []


def test_version_lag_beyond_the_allowed_offpolicyness() -> None:
    now = [ServerPoint(0, weight_version=3)]
    assert server_flags(now, trainer_version=5, max_head_offpolicyness=2) == []
    (flag,) = server_flags(now, trainer_version=6, max_head_offpolicyness=2)
    assert flag.kind == "version_lag" and "3 behind, allowed 2" in flag.evidence
    assert flag.config_key == "rollout.max_head_offpolicyness"


def test_kv_saturated_needs_a_full_cache_and_a_growing_queue() -> None:
    full = [sglang_point(t, token_usage=0.97, queued=q) for t, q in enumerate((2, 5, 9))]
    (flag,) = server_flags(full)
    assert flag.kind == "kv_saturated" and "97% full, queue grew 2 -> 9" in flag.evidence
    steady = [sglang_point(t, token_usage=0.97, queued=5) for t in range(3)]
    assert server_flags(steady) == []
    roomy = [sglang_point(t, token_usage=0.6, queued=q) for t, q in enumerate((2, 5, 9))]
    assert server_flags(roomy) == []


def test_throughput_drop_against_the_recent_median() -> None:
    history = [sglang_point(t, throughput=2000 + 10 * t) for t in range(8)]
    assert server_flags([*history, sglang_point(9, throughput=900)]) == []
    (flag,) = server_flags([*history, sglang_point(9, throughput=300)])
    assert flag.kind == "throughput_drop" and "300 tokens/s" in flag.evidence
    idle = sglang_point(9, throughput=0, running=0, queued=0)
    assert server_flags([*history, idle]) == []  # nothing to generate: not a drop


def test_vllm_throughput_from_its_counter() -> None:
    def point(at: float, tokens: float) -> ServerPoint:
        body = vllm_metrics(ServerState(generation_tokens=tokens))
        return ServerPoint(at, parse_exposition(decode_body(body)).values())

    a, b = point(10, 5000), point(12, 9000)
    assert throughput_from_counter(a, b) == pytest.approx(2000)
    assert throughput_from_counter(b, point(14, 100)) is None  # restarted: counter reset
    assert throughput_from_counter(None, a) is None


def test_version_skew_names_the_odd_servers() -> None:
    flags = fleet_flags({"a:1": 7, "b:1": 7, "c:1": 6, "d:1": None})
    assert list(flags) == ["c:1"]
    assert "serves version 6; most servers serve 7 (6: 1, 7: 2)" in flags["c:1"][0].evidence
    assert fleet_flags({"a": 7, "b": 7}) == {} and fleet_flags({}) == {}


def test_version_skew_tie_goes_to_the_newest_number() -> None:
    assert list(fleet_flags({"a": 10, "b": 9})) == ["b"]
    assert list(fleet_flags({"a": "default", "b": 3})) == ["a"]
