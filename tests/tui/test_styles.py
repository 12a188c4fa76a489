"""One stylesheet for the whole app: a screen looks the same whatever was shown before it.

Screens once carried their own CSS_PATH sheets, which Textual applies app-wide once loaded,
so `.pane-title` on the Cluster screen changed colour after the Batches screen had been
opened. Here every top-level screen is visited in two orders (and the first one again at
the end) and the computed styles of every widget are compared.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
from areal_console.app import ConsoleApp
from areal_console.core.metrics.locate import HealthTarget
from areal_console.screens.stacks import StacksScreen
from textual.widget import Widget
from textual.widgets._toast import Toast, ToastRack

from tests.support import recorded
from tests.support.areal_logfmt import write_run

pytestmark = pytest.mark.slow

ORDER = ("nodes", "stacks", "batches", "jobs", "health")
KEYS = {"nodes": "1", "stacks": "2", "batches": "3", "jobs": "4", "health": "5"}
STYLES = ("color", "background", "text_style", "padding", "width", "height", "border_top",
          "border_right", "border_bottom", "dock", "margin", "display")  # fmt: skip


def styled(widget: Widget) -> tuple[str, ...]:
    return tuple(str(getattr(widget.styles, name)) for name in STYLES)


def signature(app: ConsoleApp) -> dict[str, tuple[str, ...]]:
    """Every widget of the current screen (by its place in the tree) -> its computed styles."""
    screen = app.screen
    out = {"screen": styled(screen)}
    for i, widget in enumerate(screen.walk_children(with_self=False)):
        if isinstance(widget, Toast | ToastRack) or widget.has_pseudo_class("focus"):
            continue  # notifications and focus differ with the path taken, by design
        classes = ".".join(sorted(widget.classes))
        out[f"{i}:{type(widget).__name__}#{widget.id}.{classes}"] = styled(widget)
    return out


def ready(app: ConsoleApp, mode: str) -> bool:
    """The screen of `mode` is current and has what it shows (Health: its first report)."""
    if app.current_mode != mode:
        return False
    return mode != "health" or getattr(app.screen, "report", None) is not None


def full_app(dump: Path, run: Path) -> ConsoleApp:
    app = recorded.jobs_app()
    app.batches_path = str(dump)
    app.register_screen("batches", app._new_batches_screen)
    app.health_target = HealthTarget(str(run))
    app.register_screen("health", app._new_health_screen)
    capture = recorded.recorded_capture()
    app.register_screen("stacks", lambda: StacksScreen(capture))
    return app


async def visit(order: tuple[str, ...], dump: Path, run: Path) -> list[tuple[str, dict[str, Any]]]:
    app = full_app(dump, run)
    seen: list[tuple[str, dict[str, Any]]] = []
    async with app.run_test(size=recorded.SIZE) as pilot:
        for mode in order:
            await pilot.press(KEYS[mode])
            await recorded.wait_until(pilot, lambda mode=mode: ready(app, mode), what=mode)
            await pilot.pause()
            seen.append((mode, signature(app)))
    return seen


@pytest.fixture(scope="module")
def dump(tmp_path_factory: pytest.TempPathFactory) -> Path:
    path = tmp_path_factory.mktemp("styles-dump")
    recorded.write_batches_dump(path)
    return path


@pytest.fixture(scope="module")
def run(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A finished AReaL run's log, written by AReaL's logging code (the Health screen's)."""
    path = tmp_path_factory.mktemp("styles-run") / "run"
    write_run(path, 12, finished=True)
    return path


async def test_screens_look_the_same_in_any_order(dump: Path, run: Path) -> None:
    forward = await visit((*ORDER, ORDER[0]), dump, run)
    backward = await visit(tuple(reversed(ORDER)), dump, run)
    first = dict(forward[:-1])
    assert set(first) == set(ORDER)
    # Cluster, fresh vs after every other screen was shown.
    assert forward[-1][1] == first["nodes"]
    for mode, sig in backward:
        assert sig.keys() == first[mode].keys(), mode
        changed = {k: (first[mode][k], v) for k, v in sig.items() if first[mode][k] != v}
        assert not changed, f"{mode} looks different after another order: {changed}"
