"""Prometheus text exposition (`GET /metrics`) of inference servers, parsed with bounds.

The answer comes from a process the agent does not own: every bound is explicit (the
caller caps the bytes it reads; here lines, samples, labels and label text are capped),
nothing recurses, and a malformed line is counted and skipped, never raised.
Only the families in `wanted` are split into labels and values: a server's answer is
mostly histogram buckets the console never shows.
"""

from __future__ import annotations

import math
import re
from dataclasses import dataclass, field

MAX_LINE = 8192  # a longer line is skipped as malformed
MAX_SAMPLES = 4096  # samples kept per answer (of the wanted families)
MAX_LABELS = 32  # labels per sample
MAX_LABEL_TEXT = 256  # characters per label value

# The families the console reads, as the releases AReaL pins define them
# (file:line in docs/design/areal.md). A counter is exposed with its `_total` suffix.
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
# A label block, then its pairs. The alternatives of a value cannot overlap, so matching
# stays linear in the (capped) line length.
_PAIR_TEXT = r'[ \t]*([a-zA-Z_][a-zA-Z0-9_]*)[ \t]*=[ \t]*"([^"\\]*(?:\\.[^"\\]*)*)"[ \t]*'
_LABELS = re.compile(r"\{(?:" + _PAIR_TEXT + r",)*(?:" + _PAIR_TEXT + r")?\}")
_PAIR = re.compile(_PAIR_TEXT)
_ESCAPE = re.compile(r"\\(.)", re.S)


@dataclass(frozen=True)
class Sample:
    """One sample line: the metric name, its label block as written, the value. The
    labels are parsed on demand (`labels()`): the agent reports values by name only."""

    name: str
    label_text: str
    value: float

    def labels(self) -> tuple[tuple[str, str], ...] | None:
        """The labels in the order given (None: a malformed block)."""
        if not self.label_text:
            return ()
        parsed = parse_labels(self.label_text)
        return None if parsed is None or parsed[1] != len(self.label_text) else parsed[0]


@dataclass
class Exposition:
    """What one answer held: the wanted samples, and how much was skipped."""

    samples: list[Sample] = field(default_factory=list)
    lines: int = 0
    malformed: int = 0
    dropped: int = 0  # wanted samples past MAX_SAMPLES

    def values(self) -> dict[str, float]:
        """One value per family (summed over series, or the largest for ratios); finite
        only: an `+Inf`, or series whose sum overflows, is no value (`nodes --json` stays
        JSON, which has no Infinity or NaN)."""
        out: dict[str, float] = {}
        for s in self.samples:
            if not math.isfinite(s.value):
                continue
            if s.name not in out:
                out[s.name] = s.value
            elif s.name in MAX_OVER_SERIES:
                out[s.name] = max(out[s.name], s.value)
            else:
                out[s.name] += s.value
        return {k: v for k, v in out.items() if math.isfinite(v)}


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
    block = _LABELS.match(text)
    if block is None:
        return None
    pairs = _PAIR.findall(text, 0, block.end())
    if len(pairs) > MAX_LABELS:
        return None
    labels = []
    for key, raw in pairs:
        if len(raw) > MAX_LABEL_TEXT:
            return None
        labels.append((key, _ESCAPE.sub(_unescape, raw) if "\\" in raw else raw))
    return tuple(labels), block.end()


def _unescape(m: re.Match[str]) -> str:
    c = m.group(1)
    return {"n": "\n", "\\": "\\", '"': '"'}.get(c, "\\" + c)


def parse_sample(line: str, name: str, start: int) -> Sample | None:
    """The label block and value after the name (at `start`) of one sample line."""
    label_text = ""
    if start < len(line) and line[start] == "{":
        # Label values may hold "}", but the value and timestamp after the block never do.
        close = line.rfind("}")
        if close < start:
            return None
        label_text = line[start : close + 1]
        start = close + 1
    parts = line[start:].split()
    if not parts or len(parts) > 2:  # value, optional timestamp
        return None
    value = parse_value(parts[0])
    if value is None:
        return None
    return Sample(name, label_text, value)


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
