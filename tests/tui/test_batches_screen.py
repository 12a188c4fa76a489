"""The Batches screen driven with Pilot over real dump files (no snapshots: widget contents)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import torch
from areal_console.core.batches.records import SampleRow
from areal_console.core.batches.source import LocalBatchSource
from areal_console.dialogs.trust_pickle import TrustPickleDialog
from areal_console.screens.batches import BatchesScreen, filter_rows
from areal_console.styles import STYLESHEET
from areal_console.widgets.mini_histogram import MiniHistogram
from areal_console.widgets.token_view import TokenView
from textual.app import App
from textual.widgets import DataTable, Static

from tests.support.fixtures import batch_dumps as bf
from tests.support.waits import until as wait_for


@pytest.fixture(scope="module")
def dump(tmp_path_factory: pytest.TempPathFactory) -> Path:
    d = tmp_path_factory.mktemp("screen-dump")
    bf.write_trajectory_dump(
        d, steps=[0, 1, 2], dp_size=2, n_groups=3, group_size=4, with_prox_logp=True
    )
    bf.write_model_config(d)
    return d


class Host(App[None]):
    CSS_PATH = STYLESHEET

    def __init__(self, screen: BatchesScreen) -> None:
        super().__init__()
        self.batches = screen
        self.replays: list[BatchesScreen.ReplayRequested] = []

    def on_mount(self) -> None:
        self.push_screen(self.batches)

    def on_batches_screen_replay_requested(self, message: BatchesScreen.ReplayRequested) -> None:
        self.replays.append(message)


def text_of(widget: Static) -> str:
    return str(widget.render())


@pytest.mark.slow
async def test_browse_steps_samples_and_tokens(dump: Path) -> None:
    screen = BatchesScreen(str(dump))
    app = Host(screen)
    async with app.run_test(size=(120, 40)) as pilot:
        steps = screen.query_one("#steps", DataTable)
        samples = screen.query_one("#samples", DataTable)
        await wait_for(pilot, lambda: samples.row_count == 12)
        assert steps.row_count == 6  # 3 steps x 2 dp ranks
        # The newest step opens first.
        assert screen.current_file is not None
        assert screen.current_file.endswith("step_000002_dp_1.pt")
        summary = text_of(screen.query_one("#summary", Static))
        assert "AReaL trajectory dump: 3 prompt groups" in summary
        assert "no_eos_ratio" in summary and "behave_imp_w" in summary
        assert sum(screen.query_one("#reward-hist", MiniHistogram).counts) == 12
        assert sum(screen.query_one("#length-hist", MiniHistogram).counts) == 12

        # Drill into another step file.
        steps.focus()
        steps.move_cursor(row=0)
        await pilot.press("enter")
        await wait_for(
            pilot,
            lambda: (
                (screen.current_file or "").endswith("step_000000_dp_0.pt")
                and samples.row_count == 12
                and "step 0 dp 0" in text_of(screen.query_one("#summary", Static))
            ),
        )

        # Open one sample: its tokens, unpadded, shaded by loss mask.
        samples.focus()
        samples.move_cursor(row=5)
        await pilot.press("enter")
        view = screen.query_one("#sample-view", TokenView)
        await wait_for(pilot, lambda: view.view is not None)
        assert view.view is not None and view.view.index == 5
        groups = torch.load(dump / "step_000000_dp_0.pt", weights_only=True)
        g = groups[view.view.group]
        expected = g["input_ids"][view.view.row, : view.view.seq_len].tolist()
        assert view.view.tokens == tuple(expected)
        rendered = view.render()
        assert str(expected[0]) in str(rendered) and "«v" in str(rendered)
        await pilot.press("l")  # per-token logprobs, as id:logprob
        first = view.view.prompt_len
        label = f"{expected[first]}:{view.view.logprobs[first]:.2f}"
        assert label in str(view.render())

        # Filter the sample table, then clear it with esc.
        await pilot.press("slash")
        await pilot.press(*"group=1")
        await wait_for(pilot, lambda: samples.row_count == 4)
        await pilot.press("escape")
        await wait_for(pilot, lambda: samples.row_count == 12)


@pytest.mark.slow
async def test_compare_marked_steps_and_replay_request(dump: Path) -> None:
    screen = BatchesScreen(str(dump))
    app = Host(screen)
    async with app.run_test(size=(120, 40)) as pilot:
        steps = screen.query_one("#steps", DataTable)
        await wait_for(pilot, lambda: screen.query_one("#samples", DataTable).row_count == 12)
        steps.focus()
        steps.move_cursor(row=0)
        await pilot.press("space")
        steps.move_cursor(row=4)
        await pilot.press("space")
        assert len(screen.marked) == 2
        assert steps.get_cell("0", "mark") == "✓" and steps.get_cell("4", "mark") == "✓"
        await pilot.press("c")
        summary = screen.query_one("#summary", Static)
        await wait_for(pilot, lambda: "response_len.mean" in text_of(summary))
        assert "step_000000_dp_0.pt" in text_of(summary)
        assert "step_000002_dp_0.pt" in text_of(summary)
        screen.action_request_replay()
        await wait_for(pilot, lambda: bool(app.replays))
        assert app.replays[0].steps == [0, 2] and app.replays[0].path == str(dump)


async def test_replay_asked_for_while_the_dump_is_read_is_refused(dump: Path) -> None:
    """Before the steps are listed no step is chosen: asking for a replay then says to wait
    (an empty choice would replay every step)."""
    screen = BatchesScreen(str(dump))
    screen.load_top = lambda: None  # type: ignore[method-assign]  # still reading, for good
    app = Host(screen)
    async with app.run_test(size=(120, 40)) as pilot:
        await pilot.pause()
        screen.action_request_replay()
        await pilot.pause()
        assert app.replays == []
        status = text_of(screen.query_one("#batches-status", Static))
        assert f"still reading {dump}: replay once its steps are listed" in status


class Payload:
    def __init__(self, marker: str) -> None:
        self.marker = marker

    def __reduce__(self) -> tuple[Any, ...]:
        return (open, (self.marker, "w"))


@pytest.mark.slow
async def test_unsafe_pickle_asks_before_loading(tmp_path: Path) -> None:
    marker = tmp_path / "payload-ran"
    path = tmp_path / "step_000003.pt"
    groups: list[dict[str, Any]] = list(bf.make_trajectory(3, n_groups=2, group_size=2))
    groups[0]["note"] = Payload(str(marker))
    torch.save(groups, path)
    screen = BatchesScreen(str(path))
    app = Host(screen)
    async with app.run_test(size=(120, 40)) as pilot:
        await wait_for(pilot, lambda: isinstance(app.screen, TrustPickleDialog))
        assert not marker.exists()
        status = text_of(screen.query_one("#batches-status", Static))
        assert "could run code when loaded" in status
        # The console's own key, not the CLI's flag.
        assert "press t to load it anyway" in status and "--trust-pickle" not in status
        await pilot.press("n")  # the default: nothing is loaded
        await wait_for(pilot, lambda: app.screen is screen)
        assert not marker.exists() and screen.trust_pickle is False
        screen.action_trust()
        await wait_for(pilot, lambda: isinstance(app.screen, TrustPickleDialog))
        await pilot.press("y")
        await wait_for(pilot, marker.exists)
        assert screen.trust_pickle is True


def _rows(*raw: dict[str, Any]) -> list[SampleRow]:
    return [r for r in map(SampleRow.from_json, raw) if r is not None]


def test_filter_rows_terms() -> None:
    rows = _rows(
        {"index": 0, "group": 0, "eos": True, "reward": 1.0},
        {"index": 1, "group": 0, "eos": False, "reward": 0.0},
        {"index": 2, "group": 1, "eos": False, "reward": 1.0, "task_id": "gsm8k-7"},
    )
    assert [r.index for r in filter_rows(rows, "noeos")] == [1, 2]
    assert [r.index for r in filter_rows(rows, "noeos reward=1")] == [2]
    assert [r.index for r in filter_rows(rows, "")] == [0, 1, 2]
    assert [r.index for r in filter_rows(rows, "group=1")] == [2]
    assert [r.index for r in filter_rows(rows, "eos=True")] == [0]
    assert [r.index for r in filter_rows(rows, "nosuchfield=1")] == []
    assert [r.index for r in filter_rows(rows, "gsm8k")] == [2]  # plain text: any value
    # Without an EOS id, AReaL's own rule (length == padded width) decides.
    unknown = _rows(
        {"index": 0, "eos": None, "no_eos": False},
        {"index": 1, "eos": None, "no_eos": True},
        {"index": 2},  # neither known: counts as not cut
    )
    assert [r.index for r in filter_rows(unknown, "noeos")] == [1]
    assert [r.index for r in filter_rows(unknown, "eos")] == [0, 2]


async def test_wrong_format_and_text_rollout(tmp_path: Path) -> None:
    ckpt = bf.write_checkpoint(tmp_path / "model.pt")
    screen = BatchesScreen(str(ckpt))
    app = Host(screen)
    async with app.run_test(size=(120, 40)) as pilot:
        status = screen.query_one("#batches-status", Static)
        await wait_for(pilot, lambda: "not a rollout batch" in text_of(status))
        assert "model checkpoint" in text_of(status)
        assert screen.query_one("#samples", DataTable).row_count == 0
    root = bf.write_text_rollout_dump(tmp_path / "exp", versions=(3,), tasks=2, samples_per_task=3)
    screen = BatchesScreen(str(root))
    app = Host(screen)
    async with app.run_test(size=(120, 40)) as pilot:
        samples = screen.query_one("#samples", DataTable)
        await wait_for(pilot, lambda: samples.row_count == 6)
        samples.focus()
        await pilot.press("enter")
        view = screen.query_one("#sample-view", TokenView)
        await wait_for(pilot, lambda: view.view is not None)
        assert "Question 0 at version 3" in str(view.render())


@pytest.mark.slow
async def test_screen_reads_through_a_nodes_agent(dump: Path) -> None:
    """With a fleet and a node name, everything is computed by that node's agent."""
    from areal_console.core.batches.source import RemoteBatchSource
    from areal_console.core.connection.fleet import Fleet
    from areal_console.core.targets.resolve import local_node

    fleet = Fleet([local_node()])
    try:
        screen = BatchesScreen(str(dump), fleet=fleet, node=local_node().name)
        assert isinstance(screen.source, RemoteBatchSource)
        app = Host(screen)
        async with app.run_test(size=(120, 40)) as pilot:
            samples = screen.query_one("#samples", DataTable)
            await wait_for(pilot, lambda: samples.row_count == 12, timeout=60)
            samples.focus()
            await pilot.press("enter")
            view = screen.query_one("#sample-view", TokenView)
            await wait_for(pilot, lambda: view.view is not None, timeout=60)
            assert view.view is not None and view.view.index == 0
            assert fleet.sessions[0].state == "up"
    finally:
        fleet.close()


@pytest.mark.slow
def test_batches_screen_snapshot(
    snap_compare: Any, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The screen with a sample open (relative paths and seeded fixtures: deterministic)."""
    monkeypatch.chdir(tmp_path)
    bf.write_trajectory_dump(
        "dumps",
        steps=[10, 11, 12],
        dp_size=2,
        n_groups=3,
        group_size=4,
        with_prox_logp=True,
        no_eos_fraction=0.2,
        max_new_tokens=48,
    )
    bf.write_model_config("dumps")
    screen = BatchesScreen("dumps")
    app = Host(screen)

    async def run_before(pilot: Any) -> None:
        samples = screen.query_one("#samples", DataTable)
        await wait_for(pilot, lambda: samples.row_count == 12)
        samples.focus()
        samples.move_cursor(row=2)
        await pilot.press("enter")
        await wait_for(pilot, lambda: screen.query_one(TokenView).view is not None)
        await pilot.pause()

    assert snap_compare(app, terminal_size=(140, 44), run_before=run_before)


async def test_single_controller_dump_shows_shapes_and_where_the_data_went(
    tmp_path: Path,
) -> None:
    gen = torch.Generator().manual_seed(3)
    groups = [bf.teacher_group(gen, rl_loss_weight=1.0, distill_loss_weight=0.5) for _ in range(2)]
    path = bf.write_single_controller_step(tmp_path, 0, groups, ["10.0.0.7:40000"])
    screen = BatchesScreen(str(path))
    app = Host(screen)
    async with app.run_test(size=(120, 40)) as pilot:
        summary = screen.query_one("#summary", Static)
        await wait_for(pilot, lambda: "RTensors" in text_of(summary))
        text = text_of(summary)
        assert "single-controller dump" in text and "10.0.0.7:40000 (18)" in text
        assert "RTensor.localize(batch)" in text
        samples = screen.query_one("#samples", DataTable)
        await wait_for(pilot, lambda: not samples.loading)
        assert samples.row_count == 0


class GatedSource(LocalBatchSource):
    """The real local reader, whose first summary waits until the test lets it go (the
    first read of a real dump takes 1-1.6 s; here it takes as long as the test needs)."""

    def __init__(self) -> None:
        import threading

        self.gate = threading.Event()

    def summary(self, path: str, **options: Any) -> dict[str, Any]:
        assert self.gate.wait(30)
        return super().summary(path, **options)


async def test_first_open_shows_loading_not_blank_panes(dump: Path) -> None:
    source = GatedSource()
    screen = BatchesScreen(str(dump), source=source)
    app = Host(screen)
    async with app.run_test(size=(120, 40)) as pilot:
        await pilot.pause()
        steps = screen.query_one("#steps", DataTable)
        assert steps.loading and steps.row_count == 0
        assert text_of(screen.query_one("#batches-status", Static)) == f"reading {dump}…"
        source.gate.set()
        await wait_for(pilot, lambda: steps.row_count == 6)
        assert not steps.loading
