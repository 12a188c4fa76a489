"""The collective ledger on Flight Recorder dumps recorded from real 4-rank gloo jobs
(tests/jobs/fr_ranks.py run with the recorder hook and a 4 s timeout, so every rank that
was alive wrote its dump): the dumps decoded as the agent decodes them, lined up by our
analysis and by torch's own analyzer (`torch.distributed.flight_recorder`), which must
agree on the first mismatch and on who is missing from each collective."""

from __future__ import annotations

import json
import os
import pickle
import pickletools
from pathlib import Path
from typing import Any

import pytest
from areal_console.core.ledger import build_ledger, ledger_from_json, parse_trace
from areal_console.core.ledger.analyse import Ledger
from areal_console.core.ledger.collect import ABSENT_HINT, ledger_from_raw
from areal_console.core.ledger.verdict import with_ledger
from areal_console.core.stacks.diagnose import Diagnosis
from areal_node.agent.flight_recorder import fr_dump_files, safe_unpickle, slim_trace

DATA = Path(__file__).parents[1] / "data" / "fr"
MODES = ("op", "size", "behind", "died")


def ledger_of(mode: str) -> Ledger:
    files = fr_dump_files([str(DATA / mode / "rank_")], None)
    assert files and all(f["ok"] for f in files), files
    traces = [parse_trace(f["rank"], "node", "file", f["path"], f["trace"]) for f in files]
    return build_ledger(traces, world_size=4)


def torch_db(mode: str) -> Any:
    from torch.distributed.flight_recorder.components.builder import build_db
    from torch.distributed.flight_recorder.components.config_manager import JobConfig
    from torch.distributed.flight_recorder.components.loader import read_dir

    args = JobConfig().parse_args([str(DATA / mode), "--allow-incomplete-ranks"])
    details, version = read_dir(args)
    return build_db(details, args, version)


def test_op_mismatch_named_by_sequence_id() -> None:
    g = ledger_of("op").group("0")
    assert g is not None and g.desc == "default_pg" and g.members == (0, 1, 2, 3)
    assert g.mismatch is not None
    assert (g.mismatch.seq, g.mismatch.kind) == (4, "op")
    assert [(c.op, ranks) for c, ranks in g.mismatch.variants] == [
        ("all_reduce", (0, 1, 2)),
        ("broadcast", (3,)),
    ]
    assert g.summary() == "ranks 0-2 all_reduce #4 [8] float32 · rank 3 broadcast #4 [8] float32"
    assert not g.behind and not g.absent


def test_size_mismatch_and_the_rank_that_went_on() -> None:
    g = ledger_of("size").group("0")
    assert g is not None and g.mismatch is not None
    assert (g.mismatch.seq, g.mismatch.kind) == (4, "sizes")
    assert [(c.shape, r) for c, r in g.mismatch.variants] == [("[8]", (0, 1, 3)), ("[5]", (2,))]
    # rank 2's all_reduce returned (gloo does not check sizes); it waits in the barrier
    assert g.behind == {0: 1, 1: 1, 3: 1}
    assert g.summary() == "rank 2 barrier #5 · ranks 0-1,3 all_reduce #4 [8] float32"


def test_one_rank_one_call_behind() -> None:
    ledger = ledger_of("behind")
    default, grads = ledger.group("0"), ledger.group("1")
    assert default is not None and grads is not None
    assert default.mismatch is None and default.behind == {1: 1}
    assert {p.rank: p.head for p in default.positions} == {0: 4, 1: 3, 2: 4, 3: 4}
    assert grads.desc == "grads" and grads.behind == {0: 1, 2: 1, 3: 1}
    assert "group 0 (default_pg): rank 1 is 1 call behind" in ledger.findings()
    # gloo tracks enqueued and completed, not started
    pos = next(p for p in default.positions if p.rank == 0)
    assert pos.started is None and pos.completed == 4  # the timed-out call counts as done


def test_dead_rank_is_absent() -> None:
    g = ledger_of("died").group("0")
    assert g is not None and g.absent == (3,) and g.mismatch is None and not g.behind
    assert g.summary() == "ranks 0-2 all_reduce #4 [8] float32 · rank 3 no trace"


@pytest.mark.parametrize("mode", MODES)
def test_agrees_with_torch_analyzer(mode: str) -> None:
    """Same files, both analyzers: the first failed collective per group and the ranks
    missing from each collective that torch matched."""
    ours = ledger_of(mode)
    db = torch_db(mode)
    for c in db.collectives:
        mine = ours.group(c.pg_desc.split(":")[0])  # "<group name>:<desc>"
        assert mine is not None, (mode, c.group_id)
        if not c.pass_check:
            assert mine.mismatch is not None and mine.mismatch.seq == c.collective_seq_id
            # the ranks torch names as differing recorded something else than torch's entry
            ref = (c.collective_name.split(":")[-1], c.input_sizes)
            for rank, other in (c.mismatch_collectives or {}).items():
                variant = next(v for v, ranks in mine.mismatch.variants if rank in ranks)
                got = (variant.op, [list(s) for s in variant.input_sizes])
                assert got != ref
                assert got == (other.collective_name.split(":")[-1], other.input_sizes)
        elif c.missing_ranks:
            assert {r: 1 for r in c.missing_ranks} == {
                r: n for r, n in mine.behind.items() if r in c.missing_ranks
            }
            assert all(
                p.head >= c.collective_seq_id
                for p in mine.positions
                if p.rank not in c.missing_ranks
            )
    mismatched = {c.collective_seq_id for c in db.collectives if not c.pass_check}
    assert {g.mismatch.seq for g in ours.groups if g.mismatch} == mismatched
    if mode == "died":
        from torch.distributed.flight_recorder.components.builder import build_db
        from torch.distributed.flight_recorder.components.config_manager import JobConfig
        from torch.distributed.flight_recorder.components.loader import read_dir

        args = JobConfig().parse_args([str(DATA / mode)])
        with pytest.raises(AssertionError, match=r"Missing dump files from ranks \{3\}"):
            build_db(*read_dir(args)[:1], args, read_dir(args)[1])
        assert {r for g in ours.groups for r in g.absent} == {3}


def test_json_round_trip() -> None:
    ledger = ledger_of("size")
    doc = json.loads(json.dumps(ledger.to_json()))
    again = ledger_from_json(doc)
    assert again.to_json() == ledger.to_json()
    assert doc["findings"][0] == (
        "group 0 (default_pg): #4 sizes mismatch: ranks 0-1,3 all_reduce [8] float32 "
        "vs rank 2 all_reduce [5] float32"
    )


def test_live_json_layout_parses_like_the_pickle() -> None:
    """torch's JSON dump writes pg_status values as strings and no pg_config for gloo."""
    with open(DATA / "behind" / "rank_0", "rb") as fh:
        data = slim_trace(safe_unpickle(fh.read()))
    as_json = json.loads(json.dumps(data))
    as_json["pg_config"] = {}
    for status in as_json["pg_status"].values():
        for key in status:
            status[key] = str(status[key])
    a = parse_trace(0, "n", "live", "sock", data)
    b = parse_trace(0, "n", "live", "sock", as_json)
    assert (a.groups["0"].head, a.groups["0"].last_completed) == (4, 4)
    assert (b.groups["0"].head, b.groups["0"].last_completed) == (4, 4)
    assert b.groups["0"].keys == a.groups["0"].keys
    assert b.groups["0"].ranks is None  # membership then comes from the world size
    assert "1" not in b.groups  # a group nobody used is known only from pg_config


def test_unpickler_refuses_code() -> None:
    class Boom:
        def __reduce__(self) -> tuple[Any, ...]:
            return (os.system, ("echo pwned",))

    payload = pickle.dumps({"entries": [Boom()]})
    assert "GLOBAL" in {op.name for op, _, _ in pickletools.genops(payload)} or "STACK_GLOBAL" in {
        op.name for op, _, _ in pickletools.genops(payload)
    }
    with pytest.raises(pickle.UnpicklingError, match="refusing to load"):
        safe_unpickle(payload)
    assert safe_unpickle(pickle.dumps({"a": [1, 2.5, None, True, ("x", b"y")]})) == {
        "a": [1, 2.5, None, True, ("x", b"y")]
    }


def test_bad_and_stale_files_are_reported_not_fatal(tmp_path: Path) -> None:
    (tmp_path / "rank_0").write_bytes(b"not a pickle")
    (tmp_path / "rank_1").write_bytes(pickle.dumps([1, 2]))
    (tmp_path / "rank_x").write_bytes(b"ignored: no rank number")
    found = {f["rank"]: f for f in fr_dump_files([str(tmp_path / "rank_")], None)}
    assert sorted(found) == [0, 1]
    assert not found[0]["ok"] and "UnpicklingError" in found[0]["error"]
    assert not found[1]["ok"] and "not a Flight Recorder dump" in found[1]["error"]
    stale = fr_dump_files([str(tmp_path / "rank_")], since=4e9)
    assert sorted(f["rank"] for f in stale) == [0, 1]
    assert all(f.get("stale") for f in stale)


def test_raw_capture_prefers_live_and_says_when_absent() -> None:
    with open(DATA / "op" / "rank_3", "rb") as fh:
        trace = slim_trace(safe_unpickle(fh.read()))
    raw = {
        "nodes": [
            {
                "node": "a",
                "processes": [{"pid": 1, "rank": 3, "world_size": 4}],
                "fr": {
                    "live": [{"pid": 1, "rank": 3, "ok": True, "socket": "/s", "trace": trace}],
                    "files": [{"rank": 3, "path": "/f", "ok": True, "trace": trace}],
                },
            }
        ]
    }
    ledger = ledger_from_raw(raw)
    assert ledger is not None and ledger.sources == {3: "live:/s"}
    none = ledger_from_raw(
        {"nodes": [{"node": "a", "processes": [], "fr": {"live": [], "files": []}}]}
    )
    assert none is not None and none.groups == [] and none.notes == [ABSENT_HINT]
    assert ledger_from_raw({"nodes": [{"node": "a", "processes": []}]}) is None


def test_diagnosis_names_the_mismatch_by_sequence_id() -> None:
    base = Diagnosis("same_collective", "All ranks wait in all_reduce", "detail", ["stack"], [])
    got = with_ledger(base, ledger_of("op"))
    assert got.pattern == "collective_mismatch"
    assert got.title == "Ranks disagree at collective #4 of group 0 (default_pg)"
    assert got.evidence[0].startswith("Flight Recorder: group 0 (default_pg): #4 op mismatch")
    assert got.evidence[-1] == "stack"
    dead = Diagnosis("missing_ranks", "Rank 3 missing", "d", [], [])
    kept = with_ledger(dead, ledger_of("died"))
    assert kept.title == "Rank 3 missing"
    assert kept.evidence == [
        "Flight Recorder: group 0 (default_pg): no trace from rank 3",
        "Flight Recorder: group 1 (grads): no trace from rank 3",
        "wait-for: root: rank 3 (dead: no process shows rank 3); waited on by ranks 0-2",
        "wait-for: ranks 0-2 wait in all_reduce #4 of group 0 (default_pg) for rank 3",
    ]
    assert kept.detail == "d Every wait ends at rank 3: dead: no process shows rank 3."
    assert with_ledger(base, None) is base


def test_rank_behind_in_one_group_waiting_in_another_is_a_deadlock() -> None:
    """Every rank at the same line (stacks: same collective), but rank 1 waits in a
    barrier of `grads` while the others wait for it in all_reduce #4 of the default group."""
    base = Diagnosis("same_collective", "All ranks wait in all_reduce", "detail", [], ["net"])
    got = with_ledger(base, ledger_of("behind"))
    assert got.pattern == "cross_group_deadlock"
    assert got.title == "Cross-group deadlock: ranks 0-3 wait on each other across groups 0, 1"
    assert got.detail.startswith(
        "Rank 0 waits in all_reduce #4 of group 0 (default_pg) for rank 1, rank 1 waits in "
        "barrier #1 of group 1 (grads) for rank 0."
    )
    assert "Flight Recorder: group 0 (default_pg): rank 1 is 1 call behind" in got.evidence
    assert "net" not in got.suggestions
    assert got.wait_for is not None
    assert [c.ranks for c in got.wait_for.cycles] == [(0, 1), (1, 2), (1, 3)]
    assert got.wait_for.roots == []


def test_wait_for_graph_roots_and_scale() -> None:
    """A dead rank is the root; ranks that share a wait are linked once (16,384 ranks)."""
    from areal_console.core.ledger.analyse import GroupLedger, RankPosition
    from areal_console.core.ledger.waitfor import RankActivity, build_wait_for

    graph = build_wait_for(ledger_of("died"), {r: RankActivity(r, "collective") for r in range(3)})
    assert [(r.rank, r.why, r.waited_by) for r in graph.roots] == [
        (3, "dead: no process shows rank 3", (0, 1, 2))
    ]
    n = 16384
    ranks = tuple(range(n))
    default = GroupLedger("0", "default_pg", ranks,
                          [RankPosition(r, 7 if r else 6, None) for r in ranks])  # fmt: skip
    pair = GroupLedger("1", "", (0, 1), [RankPosition(0, 1, None), RankPosition(1, 0, None)])
    from areal_console.core.ledger.analyse import Ledger

    ledger = Ledger([default, pair], {r: "live:s" for r in ranks})
    graph = build_wait_for(ledger, {})
    assert [c.ranks for c in graph.cycles] == [(0, 1)]
    assert graph.cycles[0].groups == ("1", "0") and graph.cycles[0].seqs == (1, 7)
    doc = graph.to_json()
    assert len(doc["edges"]) == 4096 and doc["edges_left_off"] == n - 1 + 1 - 4096


def test_report_and_saved_json_carry_the_ledger_or_say_once_why_not() -> None:
    from areal_console.core.stacks.codec import capture_from_json
    from areal_console.core.stacks.parsing import build_capture
    from areal_console.core.stacks.report import capture_json, text_report

    pyspy = Path(__file__).parents[1] / "data" / "pyspy"
    with_fr = build_capture(json.loads((pyspy / "ledger_op.json").read_text()))
    assert with_fr.ledger is not None
    doc = json.loads(json.dumps(capture_json(with_fr)))
    assert doc["ledger"]["groups"][0]["mismatch"]["seq"] == 4
    reopened = capture_from_json(doc)
    saved = {k: v for k, v in doc["ledger"].items() if k != "wait_for"}
    assert reopened.ledger is not None and reopened.ledger.to_json() == saved
    # the graph is derived (ledger + stacks), so a reopened capture draws the same one
    assert capture_json(reopened)["ledger"]["wait_for"] == doc["ledger"]["wait_for"]
    assert "Ranks disagree at collective #4 of group 0 (default_pg)" in text_report(reopened)

    old = build_capture(json.loads((pyspy / "same_collective.json").read_text()))
    assert old.ledger is None and capture_json(old)["ledger"] is None
    lines = [ln for ln in text_report(old).splitlines() if "Collective ledger" in ln]
    assert lines == [
        "Collective ledger: not in this capture (taken without Flight Recorder traces): stacks only"
    ]


def test_hook_removes_sockets_of_processes_that_are_gone(tmp_path: Path) -> None:
    import importlib.util

    from areal_node.fr_hook import HOOK_DIR

    spec = importlib.util.spec_from_file_location("fr_hook_module", HOOK_DIR / "sitecustomize.py")
    assert spec is not None and spec.loader is not None
    hook = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(hook)  # not as `sitecustomize`: enables nothing
    gone, alive = tmp_path / "areal-fr-999999999.sock", tmp_path / f"areal-fr-{os.getppid()}.sock"
    other = tmp_path / "areal-fr-notes.txt"
    for f in (gone, alive, other):
        f.write_text("")
    hook.remove_stale_sockets(str(tmp_path))
    assert sorted(p.name for p in tmp_path.iterdir()) == sorted([alive.name, other.name])


def test_chain_diagnosis_names_the_root_not_the_network() -> None:
    """Rank i waits on the pair [i, i+1] for rank i+1; rank 5 is outside any collective:
    `same_collective` keeps its pattern, names rank 5 and drops the network advice."""
    from areal_console.core.ledger.analyse import GroupLedger, Ledger, RankPosition
    from areal_console.core.ledger.waitfor import RankActivity

    pairs = [
        GroupLedger(
            str(i + 1), "", (i, i + 1), [RankPosition(i, 1, None), RankPosition(i + 1, 0, None)]
        )
        for i in range(5)
    ]
    ledger = Ledger(pairs, {r: "live:s" for r in range(6)})
    activity = {r: RankActivity(r, "collective", "all_reduce") for r in range(5)}
    activity[5] = RankActivity(5, "compute", "main (chain.py:12)")
    base = Diagnosis("same_collective", "Ranks wait in one collective for a straggler", "d", [],
                     ["Set NCCL_DEBUG=INFO", "Check the network between nodes"])  # fmt: skip
    got = with_ledger(base, ledger, activity)
    assert got.pattern == "same_collective"
    assert got.title == (
        "Ranks 0-4 wait, directly or through each other, on rank 5 (outside any collective)"
    )
    assert got.suggestions[0] == (
        "Look at what rank 5 is doing: outside any collective: main (chain.py:12)"
    )
    assert not any("NCCL_DEBUG" in s or "network" in s for s in got.suggestions)
    assert got.wait_for is not None and got.wait_for.roots[0].waited_by == (0, 1, 2, 3, 4)


def crossed_ledger() -> Ledger:
    """What the demo's `collective` pattern records: rank 0 waits in group 2 for rank 1,
    rank 1 in group 3 for rank 0 (both at all_reduce #1), the default group idle."""
    from areal_console.core.ledger.analyse import GroupLedger, RankPosition

    def group(name: str, waiting: int, behind: int) -> GroupLedger:
        positions = [RankPosition(waiting, 1, None), RankPosition(behind, 0, None)]
        return GroupLedger(name, "undefined", (0, 1), sorted(positions, key=lambda p: p.rank),
                           behind={behind: 1})  # fmt: skip

    idle = GroupLedger(
        "0", "default_pg", (0, 1), [RankPosition(0, 9, None), RankPosition(1, 9, None)]
    )
    return Ledger([idle, group("2", 0, 1), group("3", 1, 0)], sources={})


def test_ranks_waiting_on_each_other_in_two_groups_are_a_deadlock_not_a_network_problem() -> None:
    """The demo's `collective` pattern: no network advice, the cycle named."""
    base = Diagnosis("same_collective", "Every rank waits in the same collective",
                     "a network or NCCL problem, a peer outside this capture, or a slow rank",
                     ["ranks 0-1 (2): all_reduce"], ["Check the network"])  # fmt: skip
    got = with_ledger(base, crossed_ledger())
    assert got.pattern == "cross_group_deadlock"
    assert "network" not in got.title.lower() and "NCCL" not in got.title
    assert "Check the network" not in got.suggestions
    assert got.wait_for is not None
    assert [c.ranks for c in got.wait_for.cycles] == [(0, 1)]
    assert sorted(got.wait_for.cycles[0].groups) == ["2", "3"]


def test_the_pane_lists_the_groups_with_findings_first_when_a_job_has_hundreds() -> None:
    """521 groups (default, 512 tensor- and 8 data-parallel groups at 4,096 ranks), one
    with a rank behind: in the pane's ten lines that group comes first, with its finding,
    and the healthy ones beyond four are counted in one line; five groups are all listed,
    in their order."""
    from areal_console.core.ledger.analyse import GroupLedger, Ledger, RankPosition
    from areal_console.widgets.ledger_pane import ledger_text

    def group(name: int, members: range, behind: dict[int, int] | None = None) -> GroupLedger:
        positions = [RankPosition(r, 30 - (behind or {}).get(r, 0), None) for r in members]
        return GroupLedger(str(name), f"g{name}", tuple(members), positions, behind or {})

    groups = [group(i, range(8 * i, 8 * i + 8)) for i in range(520)]
    groups.append(group(520, range(3, 4096, 8), behind={11: 1}))
    lines = ledger_text(Ledger(groups, {})).plain.splitlines()
    assert lines[0].startswith("group 520 (g520)  ")
    assert lines[1] == "  ! rank 11 is 1 call behind"
    assert [line.split("  ")[0] for line in lines[2:5]] == [f"group {i} (g{i})" for i in range(3)]
    assert lines[5] == "+517 groups without findings (group 3 (g3) … group 519 (g519))"
    assert len(lines) == 6

    few = ledger_text(Ledger(groups[:4] + groups[-1:], {})).plain.splitlines()
    assert [line.split("  ")[0] for line in few if line.startswith("group")] == [
        "group 0 (g0)", "group 1 (g1)", "group 2 (g2)", "group 3 (g3)", "group 520 (g520)"
    ]  # fmt: skip
