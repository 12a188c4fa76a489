"""The `/metrics` parser on the answers SGLang's and vLLM's code produce (the real
prometheus_client fed their metric definitions, tests/support/fixtures/rollout_formats.py), on broken and
hostile answers, and under Hypothesis with time bounds."""

from __future__ import annotations

import math
import time

from areal_node.prom_text import (
    MAX_SAMPLES,
    SGLANG_METRICS,
    VLLM_METRICS,
    decode_body,
    parse_exposition,
    parse_value,
)
from hypothesis import given
from hypothesis import strategies as st

from tests.support.fixtures.rollout_formats import ServerState, sglang_metrics, vllm_metrics


def test_sglang_answer_gives_every_family_the_console_reads() -> None:
    state = ServerState(
        running=7, queued=3, token_usage=0.91, throughput=2345.5, cache_hit_rate=0.25
    )
    values = parse_exposition(decode_body(sglang_metrics(state))).values()
    assert set(values) == set(SGLANG_METRICS)
    assert values["sglang:num_running_reqs"] == 7
    assert values["sglang:num_queue_reqs"] == 3
    assert values["sglang:token_usage"] == 0.91
    assert values["sglang:gen_throughput"] == 2345.5
    assert values["sglang:cache_hit_rate"] == 0.25


def test_sglang_series_per_tp_rank_add_up_and_ratios_take_the_largest() -> None:
    body = sglang_metrics(ServerState(tp_ranks=4, running=5, token_usage=0.5, histograms=3))
    parsed = parse_exposition(decode_body(body))
    assert len([s for s in parsed.samples if s.name == "sglang:num_running_reqs"]) == 4
    values = parsed.values()
    assert values["sglang:num_running_reqs"] == 5  # tp 0 reports, the others 0
    assert values["sglang:token_usage"] == 0.5
    labels = parsed.samples[0].labels()
    assert (
        labels is not None and ("tp_rank", "0") in labels and ("model_name", "qwen3-8b") in labels
    )


def test_vllm_counters_are_read_with_their_total_suffix() -> None:
    values = parse_exposition(
        decode_body(vllm_metrics(ServerState(generation_tokens=1234, queued=2)))
    ).values()
    assert set(values) == set(VLLM_METRICS)
    assert values["vllm:generation_tokens_total"] == 1234
    assert values["vllm:num_requests_waiting"] == 2
    assert values["vllm:prefix_cache_hits_total"] == 420


def test_every_family_is_kept_when_asked() -> None:
    parsed = parse_exposition(decode_body(sglang_metrics(ServerState(histograms=1))), wanted=None)
    assert any(s.name.endswith("_bucket") for s in parsed.samples)
    assert parsed.malformed == 0


def test_values_follow_prometheus_syntax_only() -> None:
    assert parse_value("+Inf") == math.inf and parse_value("-Inf") == -math.inf
    assert math.isnan(parse_value("NaN") or 0.0)
    assert parse_value("1.5e+03") == 1500.0
    for bad in ("1_000", "infinity", " 1", "0x10", "", "1" * 65, "nan"):
        assert parse_value(bad) is None, bad


def test_label_values_with_escapes_and_braces() -> None:
    text = 'sglang:num_running_reqs{model_name="a}\\"b\\\\c\\nd",tp_rank="0"} 3 1700000000000\n'
    (sample,) = parse_exposition(text).samples
    assert sample.value == 3
    assert sample.labels() == (("model_name", 'a}"b\\c\nd'), ("tp_rank", "0"))


def test_truncated_and_malformed_lines_are_counted_not_raised() -> None:
    body = sglang_metrics(ServerState()).decode()
    cut = body[: body.index("sglang:token_usage{") + 30]  # mid-label
    parsed = parse_exposition(cut)
    assert "sglang:token_usage" not in parsed.values()
    assert parsed.values()["sglang:num_running_reqs"] == 4
    assert parsed.malformed == 1
    junk = (
        'sglang:num_queue_reqs{a="1"} 1 2 3\nsglang:num_queue_reqs 1_0\n{x="1"} 3\n'
        + "a" * 10000
        + " 1\n"
    )
    parsed = parse_exposition(junk)
    assert parsed.samples == [] and parsed.malformed == 4


def test_wanted_families_are_found_at_line_starts_only() -> None:
    text = (
        "# HELP sglang:num_running_reqs The number of running requests.\n"
        'sglang:num_running_reqs_offline_batch{tp_rank="0"} 9\n'
        'x sglang:num_running_reqs{tp_rank="0"} 8\n'
        'sglang:num_running_reqs{tp_rank="0"} 7\r\n'
        "sglang:num_running_reqs 1"
    )
    parsed = parse_exposition(text)
    assert [s.value for s in parsed.samples] == [7, 1] and parsed.lines == 5
    every = parse_exposition(text, wanted=None)
    assert [(s.name, s.value) for s in every.samples] == [
        ("sglang:num_running_reqs_offline_batch", 9),
        ("sglang:num_running_reqs", 7),
        ("sglang:num_running_reqs", 1),
    ]
    assert every.malformed == 1  # the line that starts with "x"


def test_sample_cap_bounds_a_flood_of_wanted_lines() -> None:
    text = "".join(
        f'sglang:num_running_reqs{{tp_rank="{i}"}} 1\n' for i in range(MAX_SAMPLES + 500)
    )
    parsed = parse_exposition(text)
    assert len(parsed.samples) == MAX_SAMPLES and parsed.dropped == 500
    assert parsed.values()["sglang:num_running_reqs"] == MAX_SAMPLES


def test_hostile_label_blocks_give_no_labels_and_stay_fast() -> None:
    evil = "sglang:num_queue_reqs{" + 'a="\\' * 2000 + "} 1\n"
    t0 = time.perf_counter()
    parsed = parse_exposition(evil * 50)
    assert time.perf_counter() - t0 < 5  # 10x margin; backtracking would take minutes
    assert all(s.labels() is None for s in parsed.samples)


@given(st.text(max_size=3000))
def test_any_text_parses_within_bounds(text: str) -> None:
    t0 = time.perf_counter()
    parsed = parse_exposition(text, wanted=None)
    assert time.perf_counter() - t0 < 2  # a wide bound (10x); speed is bench/'s
    assert len(parsed.samples) <= MAX_SAMPLES
    for s in parsed.samples:
        s.labels()
    parsed.values()


@given(st.binary(max_size=2000), st.integers(min_value=0, max_value=4000))
def test_mutated_real_answers_never_raise(noise: bytes, at: int) -> None:
    body = sglang_metrics(ServerState(tp_ranks=2))
    at = min(at, len(body))
    mutated = body[:at] + noise + body[at:]
    parsed = parse_exposition(decode_body(mutated))
    assert len(parsed.samples) <= MAX_SAMPLES
    parsed.values()


def test_infinite_values_and_overflowing_sums_are_no_values() -> None:
    """`nodes --json` must stay JSON (no Infinity, no NaN) whatever a server answers."""
    import json

    from areal_node.server_flags import ServerPoint, throughput_from_counter

    text = (
        "sglang:num_running_reqs +Inf\n"
        'sglang:num_queue_reqs{tp_rank="0"} 1e308\nsglang:num_queue_reqs{tp_rank="1"} 1e308\n'
        'sglang:token_usage{tp_rank="0"} -Inf\nsglang:token_usage{tp_rank="1"} 0.5\n'
        "sglang:gen_throughput 12\n"
    )
    values = parse_exposition(text).values()
    assert values == {"sglang:token_usage": 0.5, "sglang:gen_throughput": 12.0}
    json.dumps(values, allow_nan=False)
    name = "vllm:generation_tokens_total"
    early, late = ServerPoint(0.0, {name: 0.0}), ServerPoint(1e-3, {name: 1.7e308})
    assert throughput_from_counter(early, late) is None
