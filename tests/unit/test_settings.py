"""Settings file: typed fields, and errors that name the file and line."""

from __future__ import annotations

from pathlib import Path

import pytest
from areal_console.core.common.errors import UserError
from areal_console.core.common.settings import Settings, load_settings
from conftest import run_cli


def write(tmp_path: Path, text: str) -> Path:
    path = tmp_path / "config.yaml"
    path.write_text(text)
    return path


def test_missing_file_gives_defaults(tmp_path: Path) -> None:
    assert load_settings(tmp_path / "nope.yaml") == Settings()


def test_values_are_read(tmp_path: Path) -> None:
    s = load_settings(write(tmp_path, "theme: nord\nrefresh_interval: 2\nread_only: true\n"
                                      "keymap:\n  cluster.filter: f\n"))  # fmt: skip
    assert (s.theme, s.refresh_interval, s.read_only) == ("nord", 2, True)
    assert s.keymap == {"cluster.filter": "f"}
    s = load_settings(write(tmp_path, "launch_templates:\n  mine: torchrun {script} x={dir}\n"
                                      "replay_template: mine\n"))  # fmt: skip
    assert (
        s.launch_templates == {"mine": "torchrun {script} x={dir}"} and s.replay_template == "mine"
    )


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ("theme: nord\nrefresh_intervl: 2\n", ":2: unknown setting 'refresh_intervl'"),
        ("theme: nord\nread_only: maybe\n", ":2: read_only must be bool, got 'maybe'"),
        ("keymap:\n  a: [1]\n", ":1: keymap must map names to strings"),
        ("theme: [unclosed\n", ":2: invalid YAML"),
        ("- just\n- a list\n", ":1: settings must be a mapping"),
        ("refresh_interval: 0.01\n", ":1: refresh_interval must be >= 0.1"),
    ],
)
def test_errors_name_file_and_line(tmp_path: Path, text: str, message: str) -> None:
    path = write(tmp_path, text)
    with pytest.raises(UserError) as info:
        load_settings(path)
    assert str(info.value).startswith(str(path))
    assert message in str(info.value)


def test_bad_settings_file_is_one_line_from_the_cli(tmp_path: Path) -> None:
    path = write(tmp_path, "read_only: maybe\n")
    result = run_cli("tui", AREAL_CONSOLE_CONFIG=str(path))
    assert result.returncode == 1
    assert result.stderr.strip() == f"error: {path}:1: read_only must be bool, got 'maybe'"
