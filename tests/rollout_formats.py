"""The answers of inference servers and AReaL's routes, as the real code produces them.

`/metrics`: the real `prometheus_client` (the library SGLang and vLLM export with) given
the metric definitions of the releases AReaL pins, transcribed with their names,
documentation and label names:
- SGLang 0.5.10.post1 (AReaL pyproject.toml:149), sglang/srt/observability/
  metrics_collector.py:189-270 (gauges), labels from scheduler_metrics_mixin.py:133-139.
- vLLM 0.19.1 (AReaL pyproject.vllm.toml:162), vllm/v1/metrics/loggers.py:414 (label
  names), :437, :447, :483, :506, :517, :636.
`/model_info`: SGLang's http_server.py:561-578 (`weight_version` is a string).
`/health` of AReaL v2's data proxy: areal/v2/inference_service/data_proxy/app.py:62-67
and :371-381 (`status`, `backend`, `sessions`, `paused`, `version`).
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, generate_latest

SGLANG_LABELS = ("model_name", "engine_type", "tp_rank", "pp_rank", "moe_ep_rank")
VLLM_LABELS = ("model_name", "engine")


@dataclass
class ServerState:
    """What a stand-in server reports."""

    running: float = 4.0
    queued: float = 0.0
    token_usage: float = 0.35
    throughput: float = 1800.0
    cache_hit_rate: float = 0.42
    used_tokens: float = 35000.0
    max_tokens: float = 100000.0
    generation_tokens: float = 0.0  # vLLM's counter
    weight_version: str = "default"
    proxy_version: int = 0
    paused: bool = False
    tp_ranks: int = 1
    histograms: int = 0  # extra histogram families (SGLang exports many)
    extra: dict[str, str] = field(default_factory=dict)


def sglang_metrics(state: ServerState, model: str = "qwen3-8b") -> bytes:
    """`GET /metrics` of an SGLang server (one series per tp rank, as with
    `enable_metrics_for_all_schedulers`)."""
    reg = CollectorRegistry()

    def gauge(name: str, doc: str) -> Gauge:
        return Gauge(name, doc, labelnames=SGLANG_LABELS, registry=reg)

    defs = {
        "num_running_reqs": (
            gauge("sglang:num_running_reqs", "The number of running requests."),
            state.running,
        ),
        "num_used_tokens": (
            gauge("sglang:num_used_tokens", "The number of used tokens."),
            state.used_tokens,
        ),
        "token_usage": (gauge("sglang:token_usage", "The token usage."), state.token_usage),
        "gen_throughput": (
            gauge("sglang:gen_throughput", "The generation throughput (token/s)."),
            state.throughput,
        ),
        "num_queue_reqs": (
            gauge("sglang:num_queue_reqs", "The number of requests in the waiting queue."),
            state.queued,
        ),
        "cache_hit_rate": (
            gauge("sglang:cache_hit_rate", "The prefix cache hit rate."),
            state.cache_hit_rate,
        ),
        "max_total_num_tokens": (
            gauge(
                "sglang:max_total_num_tokens",
                "Maximum total number of tokens in the KV cache pool.",
            ),
            state.max_tokens,
        ),
    }
    for tp in range(state.tp_ranks):
        labels = {
            "model_name": model,
            "engine_type": "unified",
            "tp_rank": str(tp),
            "pp_rank": "0",
            "moe_ep_rank": "0",
        }
        for metric, value in defs.values():
            metric.labels(**labels).set(value if tp == 0 else 0.0)
    for h in range(state.histograms):
        hist = Histogram(
            f"sglang:kv_transfer_latency_ms_{h}",
            "The transfer latency of the KV cache in ms.",
            labelnames=SGLANG_LABELS,
            buckets=(1, 2, 5, 10, 25, 50, 100, 250, 500, 1000, 2500, 5000),
            registry=reg,
        )
        for tp in range(max(1, state.tp_ranks)):
            hist.labels(model, "unified", str(tp), "0", "0").observe(12.5 + h)
    return generate_latest(reg)


def vllm_metrics(state: ServerState, model: str = "qwen3-8b") -> bytes:
    """`GET /metrics` of a vLLM server (one engine)."""
    reg = CollectorRegistry()
    labels = {"model_name": model, "engine": "0"}
    running = Gauge(
        "vllm:num_requests_running",
        "Number of requests in model execution batches.",
        VLLM_LABELS,
        registry=reg,
    )
    waiting = Gauge(
        "vllm:num_requests_waiting",
        "Number of requests waiting to be processed.",
        VLLM_LABELS,
        registry=reg,
    )
    kv = Gauge(
        "vllm:kv_cache_usage_perc",
        "KV-cache usage. 1 means 100 percent usage.",
        VLLM_LABELS,
        registry=reg,
    )
    queries = Counter(
        "vllm:prefix_cache_queries",
        "Prefix cache queries, in terms of number of queried tokens.",
        VLLM_LABELS,
        registry=reg,
    )
    hits = Counter(
        "vllm:prefix_cache_hits",
        "Prefix cache hits, in terms of number of cached tokens.",
        VLLM_LABELS,
        registry=reg,
    )
    gen = Counter(
        "vllm:generation_tokens",
        "Number of generation tokens processed.",
        VLLM_LABELS,
        registry=reg,
    )
    running.labels(**labels).set(state.running)
    waiting.labels(**labels).set(state.queued)
    kv.labels(**labels).set(state.token_usage)
    queries.labels(**labels).inc(1000)
    hits.labels(**labels).inc(1000 * state.cache_hit_rate)
    if state.generation_tokens:
        gen.labels(**labels).inc(state.generation_tokens)
    else:
        gen.labels(**labels)
    return generate_latest(reg)


def sglang_model_info(state: ServerState, model_path: str = "/models/qwen3-8b") -> bytes:
    """`GET /model_info` of SGLang (http_server.py:561-578; the dict names
    `weight_version` twice, so JSON carries it once)."""
    return json.dumps(
        {
            "model_path": model_path,
            "tokenizer_path": model_path,
            "is_generation": True,
            "preferred_sampling_params": None,
            "weight_version": state.weight_version,
            "has_image_understanding": False,
            "has_audio_understanding": False,
            "model_type": "qwen3",
            "architectures": ["Qwen3ForCausalLM"],
        }
    ).encode()


def data_proxy_health(state: ServerState, backend: str = "http://127.0.0.1:30000") -> bytes:
    """`GET /health` of AReaL v2's data proxy (pydantic's JSON of DataProxyHealthResponse)."""
    body = {
        "status": "ok",
        "backend": backend,
        "sessions": 0,
        "paused": state.paused,
        "version": state.proxy_version,
    }
    return json.dumps(body, separators=(",", ":")).encode()
