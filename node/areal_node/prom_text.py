"""Prometheus text exposition (`GET /metrics`) of inference servers, parsed with bounds.

The answer comes from a process the agent does not own: every bound is explicit (the
caller caps the bytes it reads; here lines, samples, labels and label text are capped),
nothing recurses, and a malformed line is counted and skipped, never raised.
Only the families in `wanted` are split into labels and values: a server's answer is
mostly histogram buckets the console never shows.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field

MAX_LINE = 8192  # a longer line is skipped as malformed
MAX_SAMPLES = 4096  # samples kept per answer (of the wanted families)
MAX_LABELS = 32  # labels per sample
MAX_LABEL_TEXT = 256  # characters per label value

# The families the console reads, as the releases AReaL pins define them
# (file:line in docs/areal.md). A counter is exposed with its `_total` suffix.
SGLANG_METRICS = (
    "sglang:num_running_reqs",
    "sglang:num_queue_reqs",
    "sglang:num_used_tokens",
    "sglang:max_total_num_tokens",
    "sglang:token_usage",
    "sglang:gen_throughput",
    "sglang:cache_hit_rate",
)
VLLM_METRICS = (
    "vllm:num_requests_running",
    "vllm:num_requests_waiting",
    "vllm:kv_cache_usage_perc",
    "vllm:generation_tokens_total",
    "vllm:prefix_cache_queries_total",
    "vllm:prefix_cache_hits_total",
)
WANTED = frozenset(SGLANG_METRICS + VLLM_METRICS)
# Ratios and capacities are the largest over a server's series (tp/dp ranks); counts,
# tokens and throughput add up.
MAX_OVER_SERIES = frozenset(
    {
        "sglang:token_usage",
        "sglang:cache_hit_rate",
        "sglang:max_total_num_tokens",
        "vllm:kv_cache_usage_perc",
    }
)
_SPECIAL = {"NaN": math.nan, "+Inf": math.inf, "-Inf": -math.inf, "Inf": math.inf}
_NUMBER_CHARS = frozenset("0123456789.eE+-")


@dataclass(frozen=True, slots=True)
class Sample:
    """One sample line: the metric name, its labels in the order given, the value."""

    name: str
    labels: tuple[tuple[str, str], ...]
    value: float


@dataclass(slots=True)
class Exposition:
    """What one answer held: the wanted samples, and how much was skipped."""

    samples: list[Sample] = field(default_factory=list)
    lines: int = 0
    malformed: int = 0
    dropped: int = 0  # wanted samples past MAX_SAMPLES

    def values(self) -> dict[str, float]:
        """One value per family (summed over series, or the largest for ratios)."""
        out: dict[str, float] = {}
        for s in self.samples:
            if math.isnan(s.value):
                continue
            if s.name not in out:
                out[s.name] = s.value
            elif s.name in MAX_OVER_SERIES:
                out[s.name] = max(out[s.name], s.value)
            else:
                out[s.name] += s.value
        return out


def parse_value(text: str) -> float | None:
    """A sample value as Prometheus writes it (Go float syntax), or None."""
    special = _SPECIAL.get(text)
    if special is not None:
        return special
    # Python's float() also takes "1_0", "infinity" and surrounding blanks: refuse them.
    if not text or len(text) > 64 or not _NUMBER_CHARS.issuperset(text):
        return None
    try:
        return float(text)
    except ValueError:
        return None


def parse_labels(text: str) -> tuple[tuple[tuple[str, str], ...], int] | None:
    """`{a="x",b="y"}` from `text[0] == "{"`: the labels and the index after `}`."""
    labels: list[tuple[str, str]] = []
    i, n = 1, len(text)
    while True:
        while i < n and text[i] in " ,":
            i += 1
        if i < n and text[i] == "}":
            return tuple(labels), i + 1
        eq = text.find("=", i)
        if eq < 0 or eq + 1 >= n or text[eq + 1] != '"' or len(labels) >= MAX_LABELS:
            return None
        key = text[i:eq].strip()
        if not key.isidentifier():
            return None
        i = eq + 2
        chars: list[str] = []
        while True:
            if i >= n:
                return None
            c = text[i]
            if c == '"':
                break
            if c == "\\" and i + 1 < n:
                i += 1
                c = {"n": "\n", "\\": "\\", '"': '"'}.get(text[i], "\\" + text[i])
            chars.append(c)
            i += 1
        if len(chars) > MAX_LABEL_TEXT:
            return None
        labels.append((key, "".join(chars)))
        i += 1


def parse_sample(line: str, name: str, start: int) -> Sample | None:
    """The labels and value after the name (at `start`) of one sample line."""
    labels: tuple[tuple[str, str], ...] = ()
    if start < len(line) and line[start] == "{":
        parsed = parse_labels(line[start:])
        if parsed is None:
            return None
        labels, used = parsed
        start += used
    parts = line[start:].split()
    if not parts or len(parts) > 2:  # value, optional timestamp
        return None
    value = parse_value(parts[0])
    if value is None:
        return None
    return Sample(name, labels, value)


def parse_exposition(text: str, wanted: frozenset[str] | None = WANTED) -> Exposition:
    """Parse an exposition; only families in `wanted` are kept (None: every family)."""
    out = Exposition()
    samples = out.samples
    for line in text.split("\n"):
        out.lines += 1
        if not line or line[0] == "#":
            continue
        if len(line) > MAX_LINE:
            out.malformed += 1
            continue
        space = line.find(" ")
        brace = line.find("{", 0, space if space >= 0 else len(line))
        end = brace if brace >= 0 else space
        if end <= 0:
            out.malformed += 1
            continue
        name = line[:end]
        if wanted is not None and name not in wanted:
            continue
        if len(samples) >= MAX_SAMPLES:
            out.dropped += 1
            continue
        sample = parse_sample(line, name, end)
        if sample is None:
            out.malformed += 1
        else:
            samples.append(sample)
    return out


def decode_body(body: bytes) -> str:
    """An answer's bytes as text (invalid UTF-8 replaced, never raised)."""
    return body.decode("utf-8", "replace")
