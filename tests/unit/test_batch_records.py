"""Typed records the screens read (batches, a stack dump): real answers, odd JSON as None."""

from __future__ import annotations

from pathlib import Path

from areal_console.core.batches.records import (
    BatchSummary,
    Comparison,
    Histogram,
    SampleRow,
    SampleView,
    StepEntry,
    sample_rows,
)
from areal_console.core.batches.source import LocalBatchSource
from areal_console.core.stacks.parsing import ProcessDump
from areal_console.core.stacks.records import (
    Frame,
    RankStack,
    StackCapture,
    Thread,
    Variable,
    variables_at,
)
from areal_console.widgets.token_view import sample_text
from areal_node.batches import compare

from tests.support.fixtures import batch_dumps as bf


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
    hist = s.task_reward_hist
    assert hist is not None and sum(hist.counts) == raw["samples"]
    assert (
        s.seq_len_hist is not None
        and list(s.seq_len_hist.edges) == raw["distributions"]["seq_len"]["edges"]
    )
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
    assert s.task_reward_hist is None and s.response_len_hist is None
    assert s.seq_len_hist == Histogram(edges=(), counts=(1,))
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


def test_sample_view_of_a_real_sample_and_of_odd_json(tmp_path: Path) -> None:
    dump = tmp_path / "dump"
    bf.write_trajectory_dump(dump, steps=(0,))
    raw = LocalBatchSource().sample(str(dump), 3)
    view = SampleView.from_json(raw)
    assert (view.index, view.group, view.row) == (3, raw["group"], raw["row"])
    assert view.tokens == tuple(raw["tokens"]) and view.logprobs == tuple(raw["logprobs"])
    assert view.loss_mask == tuple(bool(m) for m in raw["loss_mask"])
    odd_json = {"index": "3", "tokens": [1, "x"], "logprobs": [-0.1, "y"], "versions": "v",
                "extras": [1], "reward": 0.5, "prompt": [], "completion": "done"}  # fmt: skip
    odd = SampleView.from_json(odd_json)
    assert (odd.index, odd.tokens, odd.versions, odd.extras) == (None, None, None, {})
    assert odd.logprobs == (-0.1, None) and odd.task_reward == 0.5  # the reward stands in
    assert (odd.prompt, odd.completion) == (None, "done")
    text = str(sample_text(odd))  # a text rollout's view: prompt and completion
    assert "completion\ndone" in text and "task_reward 0.5" in text


def test_stack_dump_reply_reads_odd_answers_as_no_stack() -> None:
    assert ProcessDump.from_agent({"dumps": []}, 7).error == "no answer"
    assert ProcessDump.from_agent(None, 7).error == "no answer"
    assert ProcessDump.from_agent({"dumps": [{"ok": False, "error": "gone"}]}, 7).error == "gone"
    frames = [{"name": "f", "filename": "a.py", "line": 3,
               "locals": [{"name": "x", "repr": "1", "arg": True}, "junk"]}]  # fmt: skip
    main = {"thread_id": 9, "os_thread_id": 7, "thread_name": "MainThread", "frames": frames}
    reply = {"dumps": [{"ok": True, "pid": True, "threads": [main, "junk"]}]}
    dump = ProcessDump.from_agent(reply, 7)
    assert dump.error is None and dump.pid == 7 and len(dump.threads) == 1
    assert dump.threads[0].variables(0) == (Variable("x", "1", True),)
    assert dump.threads[0].variables(5) == ()


def test_variables_at_a_frame_are_typed() -> None:
    f, g = Frame("f", "a.py", 3), Frame("g", "a.py", 9)
    with_locals = Thread(
        "MainThread", 1, (f, g), is_main=True, locals=[[], [{"name": "x", "repr": "2"}]]
    )
    plain = Thread("MainThread", 2, (g,), is_main=True)
    ranks = [
        RankStack("n", 1, rank=0, threads=[with_locals]),
        RankStack("n", 2, rank=1, threads=[plain]),
    ]
    capture = StackCapture("now", 1, ranks)
    assert variables_at(capture, g) == [(ranks[0].label, (Variable("x", "2", False),))]
    assert variables_at(capture, f) == []  # no variables there
