"""What a new user meets first: where focus starts, hints that fit the screen they are on,
no command-line advice inside the console, every capture in the palette, keymap typos
reported, and counts in good English."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

from areal_console.app import ConsoleApp
from areal_console.core.common.settings import Settings
from areal_console.core.common.textfmt import plural
from areal_console.core.connection.monitor import NodeView, RecordedMonitor
from areal_console.core.stacks.records import StackCapture
from areal_console.core.stacks.store import save_capture
from areal_console.screens.batches import BatchesScreen
from areal_console.screens.cluster import status_text
from conftest import run_cli
from textual.widgets import DataTable

from tests.support import waits
from tests.support.fixtures import batch_dumps as bf


async def until(condition: Callable[[], bool], timeout: float = 30.0, what: str = "") -> None:
    await waits.until(None, condition, timeout, what or "condition")


def one_rank_view() -> NodeView:
    proc = {"pid": 7, "ppid": 1, "rank": 0, "world_size": 1, "role": "trainer", "cmdline": "x"}
    return NodeView("n1", "10.0.0.1", "up", sample={"processes": [proc], "gpus": []})


async def test_batches_starts_on_the_steps_and_one_tab_reaches_the_samples(tmp_path: Path) -> None:
    bf.write_trajectory_dump(tmp_path, steps=[1, 2], dp_size=1, n_groups=2, group_size=2)
    app = ConsoleApp(None, RecordedMonitor([one_rank_view()]), batches_path=str(tmp_path))
    async with app.run_test(size=(120, 36)) as pilot:
        await pilot.press("3")
        screen = app.screen
        assert isinstance(screen, BatchesScreen)
        samples = screen.query_one("#samples", DataTable)
        await until(lambda: samples.row_count > 0, what="samples")
        assert screen.focused is screen.query_one("#steps")
        await pilot.press("tab")
        assert screen.focused is samples


async def test_the_welcome_hint_leaves_with_the_cluster_screen() -> None:
    app = ConsoleApp(None, RecordedMonitor([one_rank_view()]), welcome="Press s to capture")
    async with app.run_test(size=(120, 36)) as pilot:
        await pilot.pause()
        assert [n.message for n in app._notifications] == ["Press s to capture"]
        assert next(iter(app._notifications)).timeout <= 10
        await pilot.press("4")  # no fleet: says the Runs screen needs live nodes; stays
        await pilot.press("2")
        await until(lambda: app.current_mode == "stacks", what="the Stacks screen")
        await pilot.pause()
        assert "Press s to capture" not in [n.message for n in app._notifications]


async def test_the_palette_lists_every_saved_capture() -> None:
    for i in range(25):
        save_capture(StackCapture(captured_at=f"2026-01-01T00:00:{i:02d}+00:00", samples=1,
                                  ranks=[], capture_id=f"c{i:03d}"))  # fmt: skip
    app = ConsoleApp(None, RecordedMonitor([]))
    async with app.run_test(size=(120, 36)):
        app.refresh_saved_captures()  # what opening the palette does
        await until(lambda: len(app.saved_captures) == 25, what="every capture listed")
        labels = [label for label, _, _ in app._saved_capture_entries()]
    assert len(labels) == 25 and any("c000" in label for label in labels)


async def test_unknown_keymap_ids_are_reported() -> None:
    settings = Settings(keymap={"cluster.capture": "x", "cluster.captur": "y"})
    app = ConsoleApp(None, RecordedMonitor([]), settings=settings)
    async with app.run_test(size=(120, 36)) as pilot:
        await pilot.pause()
        messages = " ".join(n.message for n in app._notifications)
        assert "'cluster.captur'" in messages and "'cluster.capture'" not in messages


def test_read_only_help_names_what_it_disables() -> None:
    out = run_cli("tui", "--help")
    assert out.returncode == 0
    text = " ".join(out.stdout.split())
    assert "--read-only disable stopping jobs and launching replays" in text
    assert "kill" not in text


def test_counts_read_as_english() -> None:
    assert plural(1, "job") == "1 job" and plural(2, "job") == "2 jobs"
    assert plural(1, "process", "processes") == "1 process"
    assert "1 rank of world size 1" in status_text([one_rank_view()], None, "", False)


async def test_footer_keys_are_rebuilt_only_when_the_keys_change(tmp_path: Path) -> None:
    """Back on a screen whose keys are as they were, its footer keeps its key widgets (a
    rebuild styled ~50 widgets anew on every switch); a change of keys rebuilds it."""
    from areal_console.widgets.console_footer import ConsoleFooter
    from textual.widgets._footer import FooterKey

    bf.write_trajectory_dump(tmp_path, steps=[1], dp_size=1, n_groups=1, group_size=2)
    app = ConsoleApp(None, RecordedMonitor([one_rank_view()]), batches_path=str(tmp_path))
    async with app.run_test(size=(160, 36)) as pilot:
        await pilot.pause()
        cluster = app.screen
        keys = list(cluster.query_one(ConsoleFooter).query(FooterKey))
        assert keys and keys[0].key == "question_mark"
        await pilot.press("3")
        await until(lambda: isinstance(app.screen, BatchesScreen), what="Batches")
        await pilot.pause()
        batches_keys = [k.key for k in app.screen.query_one(ConsoleFooter).query(FooterKey)]
        assert batches_keys != [k.key for k in keys]  # each screen shows its own keys
        await pilot.press("1")
        await until(lambda: app.screen is cluster, what="the Cluster screen")
        await pilot.pause()
        again = list(cluster.query_one(ConsoleFooter).query(FooterKey))
        assert [id(k) for k in again] == [id(k) for k in keys]
        # the same keys, but one disabled: rebuilt
        footer = cluster.query_one(ConsoleFooter)
        footer._shown = (*(footer._shown or ()), ("x", "x", "x", False, ""))
        cluster.refresh_bindings()
        old = {id(k) for k in keys}
        await until(
            lambda: bool(footer.query(FooterKey)) and id(footer.query(FooterKey)[0]) not in old,
            what="the rebuilt keys",
        )
        rebuilt = list(footer.query(FooterKey))
        assert [k.key for k in rebuilt] == [k.key for k in keys]
        assert old.isdisjoint(id(k) for k in rebuilt)
