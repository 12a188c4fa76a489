"""Help (`?`) names every key as the key a user presses: `#`, never `number_sign`."""

from __future__ import annotations

import importlib
import pkgutil
import re
from pathlib import Path

import areal_console.screens
import areal_console.widgets
import pytest
from areal_console.app import ConsoleApp
from areal_console.core.connection.monitor import NodeView, RecordedMonitor
from areal_console.dialogs.help import HelpScreen, key_label
from areal_console.navigation import SCREENS
from textual.binding import Binding
from textual.widgets import Static

from tests.support import waits
from tests.support.fixtures import batch_dumps as bf

# A key a keyboard has: one printable character, an arrow, or a named key; with modifiers.
NAMED = {"esc", "enter", "tab", "space", "backspace", "del", "pgup", "pgdn", "home", "end",
         "insert", "↑", "↓", "←", "→"}  # fmt: skip
PRESSABLE = re.compile(r"^((ctrl|shift|alt|super|meta)\+)*(?P<key>.+)$")


def pressable(label: str) -> bool:
    match = PRESSABLE.match(label)
    key = match["key"] if match else label
    return (len(key) == 1 and key.isprintable()) or key in NAMED or bool(re.fullmatch(r"f\d+", key))


def every_binding_key() -> set[str]:
    """Each key string of every binding the console has or inherits (screens, widgets)."""
    classes: list[type] = [ConsoleApp]
    for package in (areal_console.screens, areal_console.widgets):
        for info in pkgutil.iter_modules(package.__path__, package.__name__ + "."):
            module = importlib.import_module(info.name)
            classes += [v for v in vars(module).values() if isinstance(v, type)]
    keys: set[str] = set()
    for cls in classes:
        for base in cls.__mro__:
            for binding in vars(base).get("BINDINGS", None) or []:
                key = binding.key if isinstance(binding, Binding) else binding[0]
                keys.update(k.strip() for k in key.split(","))
    return keys


def test_every_binding_of_every_screen_and_widget_reads_as_a_key() -> None:
    keys = every_binding_key()
    assert {"number_sign", "question_mark", "slash", "left_square_bracket"} <= keys
    unreadable = {k: key_label(k) for k in keys if not pressable(key_label(k))}
    assert unreadable == {}


@pytest.mark.parametrize(
    ("key", "label"),
    [
        ("number_sign", "#"),
        ("escape,q,question_mark", "esc, q, ?"),
        ("ctrl+left_square_bracket", "ctrl+["),
        ("slash", "/"),
        ("minus", "-"),
        ("pageup", "pgup"),
        ("shift+tab", "shift+tab"),
        ("f5", "f5"),
    ],
)
def test_key_labels(key: str, label: str) -> None:
    assert key_label(key) == label


def help_keys(app: ConsoleApp) -> list[str]:
    """The KEY column of the open help screen."""
    table = app.screen.query_one("#help-table", Static).content
    return [str(cell) for cell in table.columns[0]._cells]  # type: ignore[union-attr]


async def test_help_on_every_screen_shows_pressable_keys(tmp_path: Path) -> None:
    """Every top-level screen this console has (recorded nodes and a batch dump): `?`."""
    proc = {"pid": 7, "ppid": 1, "rank": 0, "world_size": 1, "role": "trainer", "cmdline": "x"}
    view = NodeView("n1", "10.0.0.1", "up", sample={"processes": [proc], "gpus": []})
    bf.write_trajectory_dump(tmp_path, steps=[1], dp_size=1, n_groups=1, group_size=2)
    app = ConsoleApp(None, RecordedMonitor([view]), batches_path=str(tmp_path))
    seen: dict[str, list[str]] = {}
    async with app.run_test(size=(160, 45)) as pilot:
        modes = [e.mode for e in SCREENS if e.mode in app.screen_factories]
        assert {"nodes", "stacks", "batches"} <= set(modes)
        for mode in modes:
            await app.switch_mode(mode)
            await pilot.pause()
            await pilot.press("question_mark")
            await waits.until(None, lambda: isinstance(app.screen, HelpScreen), 10, "help")
            seen[mode] = help_keys(app)
            await pilot.press("escape")
            await waits.until(None, lambda: not isinstance(app.screen, HelpScreen), 10, "closed")
    assert "#" in seen["stacks"] and "number_sign" not in seen["stacks"]
    for mode, labels in seen.items():
        assert labels, mode
        for label in labels:
            assert all(pressable(k) for k in label.split(", ")), (mode, label)
