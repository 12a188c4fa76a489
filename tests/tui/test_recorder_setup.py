"""The Flight Recorder setup block (docs/guide/ledger.md) and the Stacks screen's `F` key that
shows it when no trace came: the block's AReaL keys are AReaL's own fields."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import yaml
from areal_console.core.ledger.setup import recorder_setup
from areal_console.core.stacks.parsing import build_capture
from areal_console.dialogs.recorder_setup import RecorderSetupScreen
from areal_console.screens.stacks import StacksScreen
from areal_console.widgets.ledger_pane import LedgerPane
from areal_node.fr_hook import HOOK_DIR
from textual.widgets import TextArea

from tests.support.screens import ScreenHost
from tests.support.waits import until as wait_until
from tests.tui.test_stacks_screen import load_raw, open_screen

CLI_ARGS = Path(__file__).parents[1] / "data" / "areal_cli_args_cbff54d6.json"


def test_block_is_yaml_with_arealss_own_fields() -> None:
    block = recorder_setup("/opt/fr_hook")
    assert "export PYTHONPATH=/opt/fr_hook${PYTHONPATH:+:$PYTHONPATH}" in block
    doc = yaml.safe_load(block[block.index("actor:") :])
    (spec,) = doc["actor"]["scheduling_spec"]
    assert spec["cmd"] == "python -m areal.infra.rpc.rpc_server"
    assert spec["env_vars"] == {"PYTHONPATH": "/opt/fr_hook", "TORCH_FR_BUFFER_SIZE": "2000"}
    classes = json.loads(CLI_ARGS.read_text())["classes"]
    assert set(spec) <= set(classes["SchedulingSpec"]["fields"])
    assert classes["SchedulingSpec"]["fields"]["env_vars"] == "dict[str, str]"
    assert "scheduling_spec" in classes["TrainEngineConfig"]["fields"]
    # AReaL joins env_vars as k=v,... and splits them again
    assert not any("," in v or "=" in v for v in spec["env_vars"].values())


def test_docs_carry_the_block() -> None:
    docs = (Path(__file__).parents[2] / "docs" / "guide" / "ledger.md").read_text()
    assert recorder_setup("/path/to/fr_hook") in docs


async def test_f_shows_the_block_and_copies_it() -> None:
    raw = load_raw("cleanup_deadlock")
    for node in raw["nodes"]:
        node["fr"] = {"live": [], "files": [], "prefixes": []}  # asked; no rank had a trace
    screen = StacksScreen(build_capture(raw))
    app = ScreenHost(screen)
    async with app.run_test(size=(120, 40)) as pilot:
        await open_screen(pilot, screen)
        assert "F: how to turn it on" in str(screen.query_one(LedgerPane).render())
        await pilot.press("F")
        await wait_until(pilot, lambda: isinstance(app.screen, RecorderSetupScreen))
        block = recorder_setup(str(HOOK_DIR))
        assert app.screen.query_one(TextArea).text == block
        await pilot.press("c")
        assert app.clipboard == block
        await pilot.press("escape")
        await wait_until(pilot, lambda: app.screen is screen)


@pytest.mark.parametrize("size", [(80, 24), (160, 45)])
async def test_the_setup_fits_the_terminal(size: tuple[int, int]) -> None:
    """At 80x24 the whole box and its hint are on screen (the block wraps and scrolls in its
    area); at 160 columns no line of the block wraps (the export line did)."""
    raw = load_raw("cleanup_deadlock")
    for node in raw["nodes"]:
        node["fr"] = {"live": [], "files": [], "prefixes": []}
    screen = StacksScreen(build_capture(raw))
    app = ScreenHost(screen)
    block = recorder_setup(str(HOOK_DIR))
    async with app.run_test(size=size) as pilot:
        await open_screen(pilot, screen)
        await pilot.press("F")
        await wait_until(pilot, lambda: isinstance(app.screen, RecorderSetupScreen))
        await pilot.pause()
        dialog = app.screen
        box = dialog.query_one("Vertical").region
        assert box.x >= 0 and box.y >= 0 and box.right <= size[0] and box.bottom <= size[1]
        shown = "\n".join(strip.text for strip in dialog._compositor.render_strips())
        assert "c: copy   esc: close" in shown
        area = dialog.query_one(TextArea)
        assert area.soft_wrap and area.region.right <= size[0]  # wrapped, never cut
        if size[0] >= 160:
            assert area.wrapped_document.height == len(block.splitlines())
            assert "export PYTHONPATH=" + str(HOOK_DIR) + "${PYTHONPATH:+:$PYTHONPATH}" in shown
