"""Typed batch records: built from real `batches.py` answers, and odd JSON reads as None."""

from __future__ import annotations

from pathlib import Path

from areal_console.core.batch_records import (
    BatchSummary,
    Comparison,
    Histogram,
    SampleRow,
    StepEntry,
    sample_rows,
)
from areal_console.core.batch_source import LocalBatchSource
from areal_console.core.batches import compare

from tests.fixtures import batch_dumps as bf


def test_records_of_a_real_dump_directory(tmp_path: Path) -> None:
    dump = tmp_path / "dump"
    bf.write_trajectory_dump(dump, dp_size=2)
    source = LocalBatchSource()
    raw = source.summary(str(dump))
    s = BatchSummary.from_json(raw)
    assert s.path == str(dump) and s.format == raw["format"]
    assert s.samples == raw["samples"] and s.groups == raw["groups"]
    assert s.stats is not None and s.stats.seq_len is not None
    assert s.stats.seq_len.mean == raw["stats"]["seq_len"]["mean"]
    assert s.warnings == tuple(raw["warnings"])
    assert [e.file for e in s.timeline] == [e["file"] for e in raw["timeline"]]
    assert [e.samples for e in s.timeline] == [e.get("samples") for e in raw["timeline"]]
    hist = s.distributions["task_reward"]
    assert sum(hist.counts) == raw["samples"]
    table = source.samples(str(dump))
    rows = sample_rows(table)
    assert [r.index for r in rows] == [r["index"] for r in table["rows"]]
    assert [r.seq_len for r in rows] == [r["seq_len"] for r in table["rows"]]
    first = s.timeline[0].file
    assert first is not None
    one = BatchSummary.from_json(source.summary(str(dump / first)))
    assert one.as_step().samples == one.samples and one.as_step().file is None
    c = Comparison.from_json(compare(raw, raw))
    assert c.a == c.b == str(dump)
    assert all(r.delta in (0, None) for r in c.rows) and len(c.rows) > 10


def test_bad_or_missing_fields_read_as_none() -> None:
    s = BatchSummary.from_json(
        {
            "format": 3,
            "samples": "many",
            "tokens": True,  # a bool is no count
            "stats": {"seq_len": "x", "no_eos_ratio": "0.5", "version": {"min": "a"}},
            "eos_token_ids": [2, "x"],
            "warnings": "not a list",
            "distributions": {"task_reward": [1, 2], "seq_len": {"edges": "x", "counts": [1]}},
            "remote": {"nodes": {"a:1": "2", "b:2": 3}},
            "timeline": [{"file": "step_000001.pt", "step": "1", "samples": None}, "junk"],
        }
    )
    assert s.path == "" and s.format == "3" and s.samples is None and s.tokens is None
    assert s.stats is not None and s.stats.seq_len is None and s.stats.no_eos_ratio is None
    assert s.stats.version is not None and s.stats.version.min is None
    assert s.eos_token_ids == (2,)
    assert s.warnings == ()
    assert "task_reward" not in s.distributions
    assert s.distributions["seq_len"] == Histogram(edges=(), counts=(1,))
    assert s.remote is not None and dict(s.remote.nodes) == {"b:2": 3} and s.remote.shards is None
    assert s.timeline == (StepEntry(file="step_000001.pt"),)
    empty = BatchSummary.from_json({})
    assert empty.stats is None and empty.timeline == () and empty.as_step() == StepEntry()

    assert SampleRow.from_json({"seq_len": 3}) is None  # no index: no row
    row = SampleRow.from_json(
        {"index": 4, "group": "g", "seq_len": 1.5, "eos": 1, "no_eos": True, "task_reward": None}
    )
    assert row is not None
    assert (row.group, row.seq_len, row.eos, row.task_reward) == (None, None, None, None)
    assert row.ends_in_eos is False  # AReaL's rule when no EOS id came
    assert row.value("index") == 4 and row.value("text_values") is None
    assert sample_rows({"rows": [{"index": 1}, {"no": "index"}, 7]}) == (SampleRow(index=1),)
    assert sample_rows({"rows": None}) == ()

    c = Comparison.from_json({"rows": [{"stat": "samples", "a": "x", "b": 2, "delta": None}, 1]})
    assert c.a is None and len(c.rows) == 1 and (c.rows[0].a, c.rows[0].b) == (None, 2)
