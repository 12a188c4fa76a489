"""The Stacks screen driven with Pilot on real recorded captures."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
from areal_console.core.stacks.capture import CaptureState
from areal_console.core.stacks.parsing import build_capture
from areal_console.core.stacks.records import StackCapture
from areal_console.dialogs.source_view import SourceViewScreen
from areal_console.screens.stacks import StacksScreen
from areal_console.widgets.diagnosis_banner import DiagnosisBanner
from areal_console.widgets.rank_group_table import RankGroupTable
from areal_console.widgets.stack_diff import StackDiffView
from areal_console.widgets.stack_tree import StackTree
from textual.widgets import Input, Static

import tests.support.fixtures.hang as hang_module
from tests.support.screens import ScreenHost
from tests.support.waits import until as wait_until

DATA = Path(__file__).parents[1] / "data" / "pyspy"
HANG_PY = str(Path(hang_module.__file__).resolve())


def load_raw(name: str) -> dict[str, Any]:
    raw = json.loads((DATA / f"{name}.json").read_text())
    # The recording names the scenario file where it was recorded; point at this checkout.
    for node in raw["nodes"]:
        for sample in node["samples"]:
            for dump in sample:
                for thread in dump.get("threads") or []:
                    for frame in thread["frames"]:
                        if frame["filename"].endswith("areal_console/scenarios/hang.py"):
                            frame["filename"] = HANG_PY
    return raw


def capture_of(name: str) -> StackCapture:
    return build_capture(load_raw(name))


def big_capture(world: int) -> StackCapture:
    """`world` ranks from the cleanup-deadlock recording: a few in cleanup, the rest training."""
    node = load_raw("cleanup_deadlock")["nodes"][0]
    rank_of = {p["pid"]: p["rank"] for p in node["processes"]}
    dumps = sorted(
        (d for d in node["samples"][0] if rank_of.get(d["pid"]) is not None),
        key=lambda d: rank_of[d["pid"]],
    )
    nodes = []
    for n in range(world // 8):
        procs, out = [], []
        for local in range(8):
            rank = n * 8 + local
            src = dumps[-1] if rank % 997 == 5 else dumps[0]
            procs.append(
                {
                    "pid": 1000 + rank,
                    "ppid": 1,
                    "rank": rank,
                    "local_rank": local,
                    "world_size": world,
                    "role": "trainer",
                    "cmdline": "python train.py",
                }
            )
            out.append({"pid": 1000 + rank, "ok": True, "threads": src["threads"]})
        nodes.append({"node": f"node{n}", "processes": procs, "samples": [out]})
    return build_capture({"captured_at": "2026-01-01T00:00:00+00:00", "nodes": nodes})


def group_labels(table: RankGroupTable) -> list[str]:
    return [str(table.get_row(str(i))[1]) for i in table.shown]


def status(screen: StacksScreen) -> str:
    return str(screen.query_one("#status", Static).render())


def tree_labels(tree: StackTree) -> list[str]:
    out = []
    stack = list(tree.root.children)
    while stack:
        node = stack.pop(0)
        out.append(str(node.label))
        stack[:0] = list(node.children)
    return out


async def open_screen(pilot: Any, screen: StacksScreen) -> None:
    await wait_until(
        pilot, lambda: screen.analysis is not None and bool(screen.query_one(RankGroupTable).shown)
    )


async def test_banner_groups_and_tree() -> None:
    screen = StacksScreen(capture_of("cleanup_deadlock"))
    app = ScreenHost(screen)
    async with app.run_test(size=(120, 40)) as pilot:
        await open_screen(pilot, screen)
        banner = str(screen.query_one(DiagnosisBanner).render())
        assert "cleanup_deadlock" in banner and "Cleanup deadlock" in banner
        assert "TORCH_DISTRIBUTED_DEBUG=DETAIL" in banner
        table = screen.query_one(RankGroupTable)
        assert group_labels(table) == ["0-2", "3"]
        assert "outlier" in str(table.get_row("1")[3])
        labels = tree_labels(screen.query_one(StackTree))
        assert labels[0].startswith("_run_module_as_main") and "[0-3] (4)" in labels[0]
        assert any(
            label.startswith("Trainer.cleanup_distributed") and "[3] (1)" in label
            for label in labels
        )
        assert "4 ranks of 4 · 2 groups" in status(screen)


async def test_mark_diff_and_jump_between_differences() -> None:
    screen = StacksScreen(capture_of("collective_mismatch"))
    app = ScreenHost(screen)
    async with app.run_test(size=(120, 40)) as pilot:
        await open_screen(pilot, screen)
        screen.query_one(RankGroupTable).focus()
        await pilot.press("space", "j", "space")
        assert screen.marked == [0, 1]
        await pilot.press("d")
        view = screen.query_one(StackDiffView)
        assert view.display and not screen.query_one(StackTree).display
        assert view.diff is not None
        first = view.diff.first_difference
        assert view.cursor_row == first
        assert str(view.get_row(str(first))[2]) == "~"  # train_step: same function, other line
        await pilot.press("right_square_bracket")
        row = view.get_row(str(view.cursor_row))
        assert str(row[2]) == "≠"
        # At 120 columns a long name is cut, never the file:line that tells frames apart.
        assert str(row[1]).startswith("Trainer.all_redu") and str(row[1]).endswith("hang.py:142")
        assert str(row[3]).startswith("Trainer.broadcas") and str(row[3]).endswith("hang.py:145")
        await pilot.press("left_square_bracket")
        assert view.cursor_row == first
        await pilot.press("left_square_bracket")
        assert "no more differences above" in status(screen)
        await pilot.press("escape")
        assert not view.display and screen.query_one(StackTree).display


async def test_goto_rank_filter_and_missing_rank() -> None:
    screen = StacksScreen(capture_of("missing_rank"))
    app = ScreenHost(screen)
    async with app.run_test(size=(120, 40)) as pilot:
        await open_screen(pilot, screen)
        assert "missing_ranks" in str(screen.query_one(DiagnosisBanner).render())
        await pilot.press("number_sign")
        prompt = screen.query_one("#prompt", Input)
        assert prompt.display and prompt.has_focus
        await pilot.press("3", "enter")
        assert "rank 3 is missing" in status(screen)
        await pilot.press("number_sign", "1", "enter")
        assert "rank 1 is in group A: ranks 0-2 (3)" in status(screen)
        await pilot.press("slash")
        await pilot.press(*"broadcast")
        assert screen.query_one(RankGroupTable).shown == []
        await pilot.press("escape")
        assert group_labels(screen.query_one(RankGroupTable)) == ["0-2"]


async def test_thread_views_and_source() -> None:
    screen = StacksScreen(capture_of("cleanup_deadlock"))
    app = ScreenHost(screen)
    async with app.run_test(size=(120, 40)) as pilot:
        await open_screen(pilot, screen)
        tree = screen.query_one(StackTree)

        def headings() -> list[str]:
            return [str(n.label).split()[0] for n in tree.root.children]

        await pilot.press("t")
        await wait_until(pilot, lambda: headings() == ["MainThread"])  # heartbeat is idle
        title = str(screen.query_one("#detail-title").render())
        assert "all threads, without idle threads" in title
        await pilot.press("i")
        await wait_until(pilot, lambda: headings() == ["MainThread", "heartbeat"])
        assert "[0-3] (4)" in str(tree.root.children[1].label)
        await pilot.press("t")
        await wait_until(
            pilot, lambda: "main thread" in str(screen.query_one("#detail-title").render())
        )
        # the groups table has focus: `o` opens the group's call site in the scenario file
        screen.query_one(RankGroupTable).focus()
        await pilot.press("o")
        await wait_until(pilot, lambda: isinstance(app.screen, SourceViewScreen))
        source = app.screen
        assert isinstance(source, SourceViewScreen)
        assert source.frame.file == HANG_PY
        assert source.frame.function == "Trainer.all_reduce_grads"
        body = source.query_one("#source-body", Static)
        await wait_until(pilot, lambda: "reading" not in str(body.render()))
        assert "not on this machine" not in str(body.render())
        await pilot.press("escape")
        assert app.screen is screen


async def test_four_thousand_ranks_stay_responsive() -> None:
    capture = big_capture(4096)
    screen = StacksScreen(capture)
    app = ScreenHost(screen)
    # How fast it opens is measured in bench/bench_stacks.py (`bench_screen(4096)`), not
    # here: a time budget in a test fails on a loaded machine and proves nothing.
    async with app.run_test(size=(120, 40)) as pilot:
        await open_screen(pilot, screen)
        table = screen.query_one(RankGroupTable)
        assert len(table.shown) == 2 and table.groups[0].size == 4096 - 5
        await pilot.press("number_sign", *"3993", "enter")
        assert "rank 3993 is in group B" in status(screen)
        await pilot.press("d")
        assert screen.query_one(StackDiffView).display


async def test_recapture_through_a_callable() -> None:
    calls: list[int] = []

    def recapture() -> StackCapture:
        calls.append(1)
        if len(calls) == 2:
            raise OSError("node0: connection reset")
        return capture_of("same_collective" if len(calls) == 1 else "collective_mismatch")

    screen = StacksScreen(recapture=recapture)
    app = ScreenHost(screen)
    async with app.run_test(size=(120, 40)) as pilot:
        await open_screen(pilot, screen)
        assert group_labels(screen.query_one(RankGroupTable)) == ["0-3"]
        await pilot.press("r")
        await wait_until(pilot, lambda: "capture failed" in status(screen))
        assert "connection reset" in status(screen)
        assert group_labels(screen.query_one(RankGroupTable)) == ["0-3"]  # kept
        await pilot.press("r")
        await wait_until(pilot, lambda: screen.query_one(RankGroupTable).shown == [0, 1])
        assert "collective_mismatch" in str(screen.query_one(DiagnosisBanner).render())


async def test_native_and_locals_keys_change_the_shared_capture_state() -> None:
    """N and L flip the console's capture options (the object the App captures with) and
    capture again; a capture opened from disk has none to change."""
    state = CaptureState(match="trainer")
    seen: list[tuple[bool, bool]] = []

    def recapture() -> StackCapture:
        seen.append((state.native, state.with_locals))
        return capture_of("same_collective")

    screen = StacksScreen(recapture=recapture, state=state)
    app = ScreenHost(screen)
    async with app.run_test(size=(120, 40)) as pilot:
        await open_screen(pilot, screen)
        await pilot.press("L")
        await wait_until(pilot, lambda: len(seen) == 2)
        await pilot.press("N")
        await wait_until(pilot, lambda: len(seen) == 3)
        await pilot.press("L")
        await wait_until(pilot, lambda: len(seen) == 4)
    assert seen == [(False, False), (False, True), (True, True), (True, False)]
    assert state.match == "trainer"

    on_disk = StacksScreen(capture_of("same_collective"))
    app = ScreenHost(on_disk)
    async with app.run_test(size=(120, 40)) as pilot:
        await open_screen(pilot, on_disk)
        await pilot.press("N")
        assert "opened from disk" in status(on_disk)


async def test_export_writes_report_next_to_capture(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("AREAL_CONSOLE_DATA_DIR", str(tmp_path))
    capture = capture_of("collective_mismatch")
    capture.capture_id = "20260101-000000-beef"
    screen = StacksScreen(capture)
    app = ScreenHost(screen)
    async with app.run_test(size=(120, 40)) as pilot:
        await open_screen(pilot, screen)
        await pilot.press("e")
        await wait_until(pilot, lambda: "exported" in status(screen))
    report = (tmp_path / "captures" / "20260101-000000-beef.txt").read_text()
    assert "DIAGNOSIS [collective_mismatch]" in report
    saved = json.loads((tmp_path / "captures" / "20260101-000000-beef.json").read_text())
    assert saved["diagnosis"]["pattern"] == "collective_mismatch"


async def test_slow_job_groups_show_moving() -> None:
    screen = StacksScreen(capture_of("slow"))
    app = ScreenHost(screen)
    async with app.run_test(size=(120, 40)) as pilot:
        await open_screen(pilot, screen)
        table = screen.query_one(RankGroupTable)
        wheres = [str(table.get_row(str(i))[3]) for i in table.shown]
        assert any("moving" in w for w in wheres)
        assert "progressing" in str(screen.query_one(DiagnosisBanner).render())


def test_screen_needs_something_to_show() -> None:
    with pytest.raises(ValueError, match="needs a capture"):
        StacksScreen()


async def test_keys_that_cannot_move_say_why() -> None:
    """j/k/g/G at the end of the group list, and ] / [ with no diff open, say so in the
    status line instead of doing nothing."""
    screen = StacksScreen(capture_of("cleanup_deadlock"))
    app = ScreenHost(screen)
    async with app.run_test(size=(120, 40)) as pilot:
        await open_screen(pilot, screen)
        table = screen.query_one(RankGroupTable)
        table.focus()
        await pilot.press("k")
        assert table.cursor_row == 0 and status(screen) == "already at the first group"
        await pilot.press("G")
        assert table.cursor_row == 1
        await pilot.press("j")
        assert table.cursor_row == 1 and status(screen) == "already at the last group"
        await pilot.press("right_square_bracket")
        assert status(screen).startswith("no diff open, so no next difference")
        await pilot.press("left_square_bracket")
        assert status(screen).startswith("no diff open, so no previous difference")
        await pilot.press("slash", *"0-2", "enter")  # one group left
        await pilot.press("g")
        assert status(screen) == "already at the first group (the only one)"


def test_capture_progress_reaches_the_screen_a_few_times_a_second() -> None:
    """Each finished dump counts, but the Stacks screen is told at most every
    PROGRESS_EVERY seconds (and at the end): one message per dump made the UI thread
    compete with the capture."""
    from types import SimpleNamespace

    from areal_console.app import ConsoleApp

    from tests.support.recorded import recorded_monitor

    app = ConsoleApp(None, recorded_monitor())
    posted: list[Any] = []
    app._stacks_screen = SimpleNamespace(post_message=posted.append)  # type: ignore[assignment]
    for done in range(1, 65):
        app._progress("node1", 1000 + done, done != 7, done, 64)
    assert app._dumped == {"node1": (64, 64, 1)}
    assert 2 <= len(posted) < 64
    assert (posted[0].done, posted[-1].done, posted[-1].total, posted[-1].failed) == (1, 64, 64, 1)


async def test_ledger_pane_leads_with_the_deadlock_between_groups() -> None:
    """A capture `stacks` saved from the real wrong-group job (every stack alike; rank 3
    passed the tp group): the banner and the ledger pane say who waits for whom."""
    from areal_console.widgets.ledger_pane import LedgerPane

    from tests.support import recorded

    app = recorded.saved_stacks_app("saved_wrong_group")
    async with app.run_test(size=recorded.SIZE) as pilot:
        await recorded.open_stacks(pilot)
        screen = app.screen
        assert isinstance(screen, StacksScreen) and screen.diagnosis is not None
        assert screen.diagnosis.pattern == "cross_group_deadlock"
        assert "Cross-group deadlock: ranks 2-3" in str(screen.query_one(DiagnosisBanner).render())
        pane = str(screen.query_one(LedgerPane).render())
        assert pane.startswith("deadlock rank 2 waits in all_reduce #4 of group 0 (default_pg) "
                               "for rank 3, rank 3 waits in all_reduce #1 of group ")  # fmt: skip
        assert pane.index("deadlock") < pane.index("group 0 (default_pg)  ranks 0-2 all_reduce")


async def test_status_shows_each_ranks_phase_and_stragglers_escaped() -> None:
    from areal_console.core.rollout.perf_trace import RankPhase

    capture = capture_of("cleanup_deadlock")
    for r in capture.rank_stacks:
        assert r.rank is not None
        span = "train.rollout" if r.rank != 3 else "train.\x1b]2;pwned\x07update"
        r.phase = RankPhase("actor", r.rank, span, 7 if r.rank != 3 else 6, 12.0, r.rank == 3, None)
    screen = StacksScreen(capture)
    app = ScreenHost(screen)
    async with app.run_test(size=(200, 40)) as pilot:
        await open_screen(pilot, screen)
        text = status(screen)
        assert "train.rollout (step 7, 12s): ranks 0-2" in text
        assert "straggler: rank 3 in train.\\x1b]2;pwned\\x07update (step 6, 12s)" in text
        assert "\x1b" not in text


async def test_status_names_the_nodes_a_capture_lacks_with_their_reasons() -> None:
    from areal_console.core.stacks.records import NodeError

    capture = big_capture(64)
    capture.ranks = [r for r in capture.ranks if r.node not in ("node2", "node5")]
    capture.errors = [
        NodeError("node5", "authentication failed for root@10.0.0.6:22 (tried ~/.ssh/id)"),
        NodeError("node2", "timeout 5 s: no answer within the node deadline (--node-timeout)"),
    ]
    screen = StacksScreen(capture)
    async with ScreenHost(screen).run_test(size=(160, 40)) as pilot:
        await open_screen(pilot, screen)
        assert "48 ranks of 64" in status(screen)
        assert "2 nodes failed: node2 (timeout 5 s), node5 (authentication)" in status(screen)
