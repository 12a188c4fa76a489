"""Stack analysis on real py-spy captures recorded from the hang scenarios."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
from areal_console.core.stacks import (
    analyse,
    build_capture,
    diagnose,
    diff_stacks,
    format_ranks,
    parse_ranks,
)
from areal_console.core.stacks.codec import capture_from_json
from areal_console.core.stacks.diagnose import collective_frame
from areal_console.core.stacks.merge import group_ranks, thread_trees
from areal_console.core.stacks.parsing import parse_pyspy_threads
from areal_console.core.stacks.records import Frame
from areal_console.core.stacks.report import capture_json, text_report

DATA = Path(__file__).parents[1] / "data" / "pyspy"


def load_raw(name: str) -> dict[str, Any]:
    return json.loads((DATA / f"{name}.json").read_text())


@pytest.fixture(scope="module")
def fixtures() -> dict[str, Any]:
    names = ["cleanup_deadlock", "collective_mismatch", "same_collective", "missing_rank", "slow"]
    return {n: analyse(build_capture(load_raw(n))) for n in names}


def _short(fn: str) -> str:
    return fn.rsplit(".", 1)[-1]


# -- rank ranges ------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("ranks", "label"),
    [
        ([], ""),
        ([5], "5"),
        ([0, 1, 2, 3], "0-3"),
        ([8, 0, 2, 1, 3], "0-3,8"),
        ([0, 2, 4], "0,2,4"),
        ([1, 2, 4, 5, 6, 9], "1-2,4-6,9"),
        ([3, 3, 4], "3-4"),
    ],
)
def test_format_ranks_is_compact(ranks: list[int], label: str) -> None:
    assert format_ranks(ranks) == label
    assert parse_ranks(label) == sorted(set(ranks))


def test_parse_ranks_rejects_garbage() -> None:
    with pytest.raises(ValueError, match="bad rank range"):
        parse_ranks("0-x")


# -- parsing ----------------------------------------------------------------------------


def test_parse_keeps_leaf_first_and_marks_main_thread() -> None:
    raw = load_raw("cleanup_deadlock")
    capture = build_capture(raw)
    ranks = capture.rank_stacks
    assert [r.rank for r in ranks] == [0, 1, 2, 3]
    assert all(r.world_size == 4 and r.state == "ok" for r in ranks)
    for r in ranks:
        main = r.main_thread
        assert main is not None and main.is_main and not main.idle
        assert main.frames[-1].function == "_run_module_as_main"  # root last
    assert _short(ranks[0].main_frames[0].function) == "all_reduce"
    assert _short(ranks[3].main_frames[0].function) == "barrier"
    launcher = [r for r in capture.ranks if r.rank is None]
    assert [r.role for r in launcher] == ["launcher"]


def test_idle_threads_are_detected() -> None:
    threads = parse_pyspy_threads(
        [
            {
                "thread_name": "MainThread",
                "os_thread_id": 10,
                "frames": [{"name": "all_reduce", "filename": "/t/distributed_c10d.py", "line": 1}],
            },
            {
                "thread_name": "pool-0",
                "os_thread_id": 11,
                "frames": [
                    {"name": "wait", "filename": "/usr/lib/python3.11/threading.py", "line": 9},
                    {"name": "_worker", "filename": "/x.py", "line": 3},
                ],
            },
            {
                "thread_name": "loader",
                "os_thread_id": 12,
                "frames": [{"name": "collate", "filename": "/data.py", "line": 4}],
            },
        ],
        pid=10,
    )
    assert [(t.name, t.is_main, t.idle) for t in threads] == [
        ("MainThread", True, False),
        ("loader", False, False),
        ("pool-0", False, True),
    ]


def test_recorded_heartbeat_threads_are_idle(fixtures: dict[str, Any]) -> None:
    for r in fixtures["same_collective"].capture.rank_stacks:
        assert [(t.name, t.is_main, t.idle) for t in r.threads] == [
            ("MainThread", True, False),
            ("heartbeat", False, True),
        ]


def test_thread_trees_hide_idle_threads(fixtures: dict[str, Any]) -> None:
    capture = fixtures["cleanup_deadlock"].capture
    assert list(thread_trees(capture, include_idle=False)) == ["MainThread"]
    trees = thread_trees(capture, include_idle=True)
    assert list(trees) == ["MainThread", "heartbeat"]
    assert trees["heartbeat"].label == "0-3"
    assert [c.label for c in trees["MainThread"].children.values()] == ["0-3"]


def test_frames_are_interned_across_ranks(fixtures: dict[str, Any]) -> None:
    a = fixtures["same_collective"].capture.rank_stacks
    assert a[0].main_frames[0] is a[1].main_frames[0]


# -- merge ------------------------------------------------------------------------------


def test_cleanup_deadlock_groups_and_outlier(fixtures: dict[str, Any]) -> None:
    analysis = fixtures["cleanup_deadlock"]
    assert [(g.label, g.size) for g in analysis.groups] == [("0-2", 3), ("3", 1)]
    assert [g.label for g in analysis.outliers] == ["3"]
    assert analysis.divergence is not None
    assert _short(analysis.divergence.function) == "train"
    assert analysis.group_of(3) == 1 and analysis.group_of(0) == 0


def test_collective_mismatch_groups_split_by_parity(fixtures: dict[str, Any]) -> None:
    analysis = fixtures["collective_mismatch"]
    assert sorted(g.label for g in analysis.groups) == ["0,2", "1,3"]
    assert analysis.outliers == []
    leafs = {g.label: _short(g.frames[0].function) for g in analysis.groups}
    assert leafs == {"0,2": "all_reduce", "1,3": "broadcast"}
    assert _short(analysis.divergence.function) == "train_step"


def test_tree_carries_rank_sets(fixtures: dict[str, Any]) -> None:
    analysis = fixtures["cleanup_deadlock"]
    tree = analysis.tree
    assert tree.label == "0-3"
    nodes = list(tree.walk())
    train = [n for n in nodes if n.frame and _short(n.frame.function) == "train"]
    assert {n.label for n in train} == {"0-2", "3"}  # two lines of `train`: loop vs finally
    leaves = [n for n in nodes if not n.children]
    assert sorted(n.label for n in leaves) == ["0-2", "3"]
    # every child's ranks are a subset of its parent's
    for n in nodes:
        for c in n.children.values():
            assert set(c.ranks) <= set(n.ranks)
            assert c.depth == n.depth + 1


def test_same_collective_is_one_group(fixtures: dict[str, Any]) -> None:
    analysis = fixtures["same_collective"]
    assert [(g.label, g.size) for g in analysis.groups] == [("0-3", 4)]
    assert analysis.divergence is None
    assert _short(collective_frame(analysis.groups[0].frames).function) == "all_reduce"


def test_missing_rank_is_found_from_world_size(fixtures: dict[str, Any]) -> None:
    analysis = fixtures["missing_rank"]
    assert analysis.world_size == 4
    assert analysis.missing == [3]
    assert [g.label for g in analysis.groups] == ["0-2"]


def test_group_ranks_skips_failed_and_rankless() -> None:
    capture = build_capture(load_raw("collective_mismatch"))
    capture.ranks[0].state = "error"
    groups = group_ranks(capture.ranks)
    assert sorted(r for g in groups for r in g.ranks) == [1, 2, 3]


# -- diff -------------------------------------------------------------------------------


def test_diff_marks_first_differing_frame(fixtures: dict[str, Any]) -> None:
    groups = fixtures["collective_mismatch"].groups
    by_label = {g.label: g for g in groups}
    diff = diff_stacks(by_label["0,2"].frames, by_label["1,3"].frames)
    first = diff.rows[diff.first_difference]
    # everything above is shared; train_step is the same function on another line
    assert all(r.same for r in diff.rows[: diff.first_difference])
    assert first.kind == "line" and _short(first.left.function) == "train_step"
    calls = diff.rows[diff.differences[1]]
    assert calls.kind == "differ"
    assert _short(calls.left.function) == "all_reduce_grads"
    assert _short(calls.right.function) == "broadcast_params"
    assert not diff.equal


def test_diff_of_equal_and_uneven_stacks() -> None:
    a = (Frame("leaf", "a.py", 3), Frame("root", "a.py", 1))
    assert diff_stacks(a, a).equal
    deeper = (Frame("deeper", "a.py", 9), *a)
    d = diff_stacks(a, deeper)
    assert d.first_difference == 2
    assert d.rows[2].left is None and d.rows[2].right == deeper[0]


# -- diagnosis --------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("name", "pattern"),
    [
        ("cleanup_deadlock", "cleanup_deadlock"),
        ("collective_mismatch", "collective_mismatch"),
        ("same_collective", "same_collective"),
        ("missing_rank", "missing_ranks"),
        ("slow", "progressing"),
    ],
)
def test_diagnosis_per_scenario(fixtures: dict[str, Any], name: str, pattern: str) -> None:
    diagnosis = diagnose(fixtures[name])
    assert diagnosis.pattern == pattern
    assert diagnosis.title and diagnosis.detail
    assert diagnosis.evidence and diagnosis.suggestions


def test_diagnosis_evidence_names_ranks_and_frames(fixtures: dict[str, Any]) -> None:
    d = diagnose(fixtures["cleanup_deadlock"])
    assert any(e.startswith("rank 3 ") and "cleanup_distributed" in e for e in d.evidence)
    assert any(e.startswith("ranks 0-2 ") and "all_reduce_grads" in e for e in d.evidence)
    assert any("TORCH_DISTRIBUTED_DEBUG=DETAIL" in s for s in d.suggestions)
    mismatch = diagnose(fixtures["collective_mismatch"])
    assert "call all_reduce at" in mismatch.detail and "call broadcast at" in mismatch.detail
    same = diagnose(fixtures["same_collective"])
    assert any("NCCL_DEBUG=INFO" in s for s in same.suggestions)
    missing = diagnose(fixtures["missing_rank"])
    assert "rank 3" in missing.title.lower() and "missing: rank 3 of 4" in missing.evidence


def test_slow_single_sample_is_not_called_progressing() -> None:
    raw = load_raw("slow")
    raw["nodes"][0]["samples"] = raw["nodes"][0]["samples"][:1]
    capture = build_capture(raw)
    assert capture.samples == 1
    assert all(r.progressing is None for r in capture.rank_stacks)
    assert diagnose(analyse(capture)).pattern != "progressing"


def test_stuck_job_sampled_twice_is_not_progressing() -> None:
    raw = load_raw("same_collective")
    node = raw["nodes"][0]
    node["samples"] = [node["samples"][0], node["samples"][0]]
    capture = build_capture(raw)
    assert [r.progressing for r in capture.rank_stacks] == [False] * 4
    assert diagnose(analyse(capture)).pattern == "same_collective"


def test_rank_exiting_between_samples_is_gone_with_its_last_stack() -> None:
    raw = load_raw("same_collective")
    node = raw["nodes"][0]
    first = node["samples"][0]
    pid = next(p["pid"] for p in node["processes"] if p["rank"] == 2)
    second = [dict(d) for d in first]
    for d in second:
        if d["pid"] == pid:
            d.clear()
            d.update(
                pid=pid,
                requested_pid=pid,
                ok=False,
                reason="gone",
                error=f"process {pid} exited during capture",
            )
    node["samples"] = [first, second]
    capture = build_capture(raw)
    rank = capture.find_rank(2)
    assert rank is not None and rank.state == "gone"
    assert rank.error == f"process {pid} exited during capture (before sample 2)"
    assert rank.main_frames  # the stack it had is kept
    assert [r.progressing for r in capture.rank_stacks] == [False, False, None, False]
    assert [g.label for g in analyse(capture).groups] == ["0-1,3"]


def test_failed_dumps_are_data() -> None:
    raw = load_raw("collective_mismatch")
    node = raw["nodes"][0]
    dump = next(d for d in node["samples"][0] if d["pid"] == node["processes"][1]["pid"])
    dump.clear()
    dump.update(
        pid=node["processes"][1]["pid"],
        requested_pid=node["processes"][1]["pid"],
        ok=False,
        reason="permission",
        error="permission denied attaching",
    )
    raw["nodes"].append({"node": "node9", "error": "connection refused"})
    capture = build_capture(raw)
    bad = [r for r in capture.ranks if r.state != "ok"]
    assert [(r.rank, r.state, r.error) for r in bad] == [
        (0, "error", "permission denied attaching")
    ]
    assert [(e.node, e.error) for e in capture.errors] == [("node9", "connection refused")]
    report = text_report(capture)
    assert "node node9: connection refused" in report
    assert "permission denied attaching" in report


# -- export -----------------------------------------------------------------------------


def test_json_matches_schema_and_round_trips(fixtures: dict[str, Any]) -> None:
    capture = fixtures["cleanup_deadlock"].capture
    doc = json.loads(json.dumps(capture_json(capture)))
    assert {"captured_at", "samples", "ranks", "groups", "diagnosis", "errors"} <= set(doc)
    rank = doc["ranks"][0]
    assert set(rank) == {
        "node",
        "pid",
        "rank",
        "local_rank",
        "world_size",
        "role",
        "cmdline",
        "state",
        "error",
        "progressing",
        "job",
        "server",
        "phase",
        "source",
        "stdout",
        "threads",
    }
    assert rank["source"] == "py-spy"
    assert set(rank["threads"][0]) == {"name", "tid", "idle", "frames"}
    assert set(rank["threads"][0]["frames"][0]) == {"function", "file", "line"}
    assert [g["label"] for g in doc["groups"]] == ["0-2", "3"]
    assert set(doc["diagnosis"]) == {"pattern", "title", "detail", "evidence", "suggestions"}
    again = capture_json(capture_from_json(doc))
    assert again["groups"] == doc["groups"]
    assert again["diagnosis"] == doc["diagnosis"]
    assert again["ranks"] == doc["ranks"]


def test_text_report_reads_well(fixtures: dict[str, Any]) -> None:
    report = text_report(fixtures["collective_mismatch"].capture)
    assert "DIAGNOSIS [collective_mismatch]" in report
    assert "Group A: ranks 0,2 (2)" in report and "Group B: ranks 1,3 (2)" in report
    assert "Ranks 0,2 call all_reduce at hang.py:142 while ranks 1,3 call broadcast" in report
    assert "Divergence point: Trainer.train_step" in report
    assert "launcher pid" in report


# -- saved captures ---------------------------------------------------------------------


def test_save_list_open_and_corrupt_files(tmp_path: Path) -> None:
    from areal_console.core.common.errors import UserError
    from areal_console.core.stacks.store import (
        list_captures,
        load_capture,
        resolve_capture,
        save_capture,
    )

    first = build_capture(load_raw("cleanup_deadlock"))
    first.capture_id = "20260101-000000-aaaa"
    second = build_capture(load_raw("missing_rank"))
    second.capture_id = "20260101-000000-aaab"
    second.captured_at = "2999-01-01T00:00:00+00:00"
    for c in (first, second):
        save_capture(c, tmp_path)
    (tmp_path / "broken.json").write_text("{not json")
    assert not list(tmp_path.glob("*.tmp"))  # the temp files were renamed into place
    saved = list_captures(tmp_path)
    assert [(c.capture_id, c.pattern, c.ranks) for c in saved] == [
        ("20260101-000000-aaab", "missing_ranks", 3),
        ("20260101-000000-aaaa", "cleanup_deadlock", 4),
    ]
    assert resolve_capture("latest", tmp_path).stem == "20260101-000000-aaab"
    with pytest.raises(UserError, match="ambiguous"):
        resolve_capture("20260101-000000-aaa", tmp_path)
    with pytest.raises(UserError, match="no saved capture"):
        resolve_capture("nope", tmp_path)
    reopened = load_capture("20260101-000000-aaaa", tmp_path)
    assert analyse(reopened).groups[1].label == "3"
    assert diagnose(analyse(reopened)).pattern == "cleanup_deadlock"


def test_unknown_scenario_pattern_is_refused() -> None:
    from tests.support.fixtures.hang import start_scenario

    with pytest.raises(ValueError, match="unknown pattern"):
        start_scenario("deadlock-of-the-week")
