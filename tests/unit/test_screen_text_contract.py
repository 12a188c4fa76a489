"""What reaches the screen, as a contract on the source (an AST scan, like the import
contracts): every notification goes through `areal_console/toast.py`, which escapes
control characters and never reads markup; nothing asks Textual to read markup; and no
f-string is handed to a widget that reads markup (`Label`, `Static`, `.update`) outside
the modules below, whose f-strings hold only counts and rank ranges.

Textual reads a toast's message and a `Label`'s string as markup: a dump's recorded metric
`x[/]` in a toast ended the console (tests/tui/test_toasts.py drives each toast source)."""

from __future__ import annotations

import ast
from pathlib import Path

UI = Path(__file__).resolve().parents[2] / "tui" / "areal_console"
TOAST_MODULE = UI / "toast.py"
MARKUP_WIDGETS = {"Label", "Static", "update"}
ESCAPERS = {"remote_text", "remote_block", "remote_line", "remote_log_line", "printable"}
# Modules whose f-strings into a Label or Static hold only numbers the console computed.
COUNTED_TITLES = {
    "screens/stacks.py": "group counts and rank ranges in pane titles",
    "dialogs/job_choice.py": "a count of jobs",
}


def ui_modules() -> list[Path]:
    return [p for p in UI.rglob("*.py") if "core" not in p.relative_to(UI).parts]


def calls(path: Path) -> list[ast.Call]:
    return [n for n in ast.walk(ast.parse(path.read_text())) if isinstance(n, ast.Call)]


def name_of(call: ast.Call) -> str | None:
    func = call.func
    return func.attr if isinstance(func, ast.Attribute) else getattr(func, "id", None)


def direct_notifies(paths: list[Path]) -> list[str]:
    return [
        f"{path.name}:{call.lineno}"
        for path in paths
        if path != TOAST_MODULE
        for call in calls(path)
        if name_of(call) == "notify" and call.args
    ]


def formatted_into_markup(paths: list[Path]) -> list[str]:
    return [
        f"{path.name}:{call.lineno}"
        for path in paths
        for call in calls(path)
        if name_of(call) in MARKUP_WIDGETS
        and call.args
        and any(isinstance(n, ast.JoinedStr) for n in ast.walk(call.args[0]))
        and not (isinstance(call.args[0], ast.Call) and name_of(call.args[0]) in ESCAPERS)
    ]


def test_every_notification_goes_through_toast() -> None:
    direct = direct_notifies(ui_modules())
    assert not direct, f"call widgets.remote_text.toast, not notify: {direct}"
    toast_calls = [c for c in calls(TOAST_MODULE) if name_of(c) == "notify"]
    assert len(toast_calls) == 1
    markup = {k.arg: ast.unparse(k.value) for k in toast_calls[0].keywords}
    assert markup.get("markup") == "False"


def test_nothing_asks_for_markup() -> None:
    asked = [
        f"{path.relative_to(UI)}:{call.lineno}"
        for path in ui_modules()
        for call in calls(path)
        for k in call.keywords
        if k.arg == "markup" and not (isinstance(k.value, ast.Constant) and k.value.value is False)
    ]
    assert not asked, asked


def test_no_formatted_string_reaches_a_widget_that_reads_markup() -> None:
    checked = [p for p in ui_modules() if str(p.relative_to(UI)) not in COUNTED_TITLES]
    found = formatted_into_markup(checked)
    assert not found, f"wrap remote text in widgets.remote_text.remote_text: {found}"


def test_the_scan_sees_a_direct_notify(tmp_path: Path) -> None:
    """The scan itself: a screen that notifies directly, or an f-string title, is found."""
    bad = tmp_path / "bad.py"
    bad.write_text("self.notify(f'{x}')\nself.app.notify(x)\nLabel(f'{name}')\n"
                   "Label(remote_text(f'{name}'))\ncondition.notify()\n")  # fmt: skip
    assert direct_notifies([bad]) == ["bad.py:1", "bad.py:2"]
    assert formatted_into_markup([bad]) == ["bad.py:3"]
