"""Rollout batches: a safe reader, statistics and AReaL's health checks.

Standard library and torch (imported on first use, never at import): the node's agent
runs this package from the payload (`ops.OPS` are its handlers), so summaries and sample
slices are computed next to the file and only small JSON results travel; the console
runs the same code on local files.

- `loader`: `torch.load(weights_only=True, mmap=True)`, a pickle that would run code
  refused before anything in it runs (`trust_pickle=True` opts in); the file's format;
- `eos`: EOS ids and tokenizers found next to a dump;
- `analysis`: per-sample facts of a tensor batch (masks, a few gathered token ids and
  versions per sample, a bounded sample of per-token log-probabilities: a multi-GB dump
  summarizes in about a second);
- `stats`: statistics and warnings, pure; `compare`: two summaries side by side;
- `summary`: a file, a dump directory or a text rollout dump as `batch --json`;
- `views`: the sample table of one file and one sample in full;
- `ops`: the agent's `batch_*` ops.
"""

from __future__ import annotations

from areal_node.batches.analysis import TOKEN_BUDGET, analyze_groups, groups_of
from areal_node.batches.compare import compare
from areal_node.batches.eos import find_eos_token_ids
from areal_node.batches.loader import (
    BATCH_FORMATS,
    CHECKPOINT,
    DICT_BATCH,
    TEXT_ROLLOUT,
    TRAJECTORY,
    TRAJECTORY_DIR,
    TRAJECTORY_REFS,
    TRUST_HINT,
    UNKNOWN,
    BatchError,
    UnsafePickleError,
    detect_format,
    load_pt,
)
from areal_node.batches.stats import (
    batch_stats,
    batch_warnings,
    describe,
    histogram,
    length_trend_warnings,
)
from areal_node.batches.summary import list_dump_dir, parse_step_name, summarize, summarize_dir
from areal_node.batches.views import json_safe, resolve_step_file, sample_table, sample_view

__all__ = [
    "BATCH_FORMATS",
    "CHECKPOINT",
    "DICT_BATCH",
    "TEXT_ROLLOUT",
    "TOKEN_BUDGET",
    "TRAJECTORY",
    "TRAJECTORY_DIR",
    "TRAJECTORY_REFS",
    "TRUST_HINT",
    "UNKNOWN",
    "BatchError",
    "UnsafePickleError",
    "analyze_groups",
    "batch_stats",
    "batch_warnings",
    "compare",
    "describe",
    "detect_format",
    "find_eos_token_ids",
    "groups_of",
    "histogram",
    "json_safe",
    "length_trend_warnings",
    "list_dump_dir",
    "load_pt",
    "parse_step_name",
    "resolve_step_file",
    "sample_table",
    "sample_view",
    "summarize",
    "summarize_dir",
]
