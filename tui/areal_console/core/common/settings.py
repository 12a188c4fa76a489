"""User settings: a YAML file in the XDG config directory, read into a typed model.

Path: `$AREAL_CONSOLE_CONFIG`, else `$XDG_CONFIG_HOME/areal-console/config.yaml`. Every field
is optional; unknown keys and wrong types are errors that name the file and line.

Example:

    theme: textual-light
    refresh_interval: 2
    read_only: true
    keymap:
      cluster.filter: f        # binding id -> key(s), comma-separated
      app.help: question_mark,f1
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from areal_console.core.common import safe_yaml
from areal_console.core.common.errors import UserError
from areal_console.core.common.locations import config_file
from areal_console.core.common.textfmt import clip, clip_repr


@dataclass
class Settings:
    theme: str = "textual-dark"
    """Textual theme name, e.g. textual-dark, textual-light, nord, gruvbox."""

    refresh_interval: float = 1.0
    """Seconds between live samples of each node."""

    read_only: bool = False
    """Disable everything that kills, stops or launches (capture and browse still work)."""

    keymap: dict[str, str] = field(default_factory=dict)
    """Binding id -> keys (comma-separated), overriding the defaults; `?` lists the ids' keys."""

    agent_timeout: float = 5.0
    """Seconds a node's agent may leave a ping unanswered before the node is shown as
    "not responding" (its connection is kept; it turns back to "up" when it answers)."""
    pyspy_timeout: float = 10.0
    """Seconds to wait for one py-spy dump before giving that rank up as timed out."""

    capture_samples: int = 1
    """Stack samples per capture from the TUI (2 or more tells slow from hung)."""

    capture_interval: float = 1.0
    """Seconds between stack samples when capture_samples > 1."""

    launch_templates: dict[str, str] = field(default_factory=dict)
    """Replay launch templates, name -> command line (split like a shell, run as an argv
    list; placeholders such as {script} {config} {dir} are filled in per argument)."""

    replay_template: str = "reference"
    """The launch template the Batches screen's `r` dialog uses."""

    health: dict[str, float] = field(default_factory=dict)
    """Training-health thresholds over their defaults, e.g. `no_eos_ratio_max: 0.1`,
    `stall_factor: 10` (names: docs/guide/health.md)."""


FIELD_TYPES: dict[str, tuple[type, ...]] = {
    "theme": (str,),
    "refresh_interval": (int, float),
    "read_only": (bool,),
    "keymap": (dict,),
    "agent_timeout": (int, float),
    "pyspy_timeout": (int, float),
    "capture_samples": (int,),
    "capture_interval": (int, float),
    "launch_templates": (dict,),
    "replay_template": (str,),
    "health": (dict,),
}


def load_settings(path: Path | None = None) -> Settings:
    """Settings from `path` (default: the XDG config file); defaults when it doesn't exist."""
    import yaml

    path = path or config_file()
    if not path.exists():
        return Settings()
    text = safe_yaml.read_text(path, "settings file")
    try:
        node = yaml.compose(text)  # for line numbers; aliases stay shared here
        data = safe_yaml.load(text)
    except ValueError as exc:
        raise UserError(f"{path}: {exc}") from None
    except yaml.YAMLError as exc:
        mark = getattr(exc, "problem_mark", None)
        where = f"{path}:{mark.line + 1}" if mark is not None else str(path)
        problem = getattr(exc, "problem", None) or clip(exc)
        raise UserError(f"{where}: invalid YAML: {problem}") from None
    if data is None:
        return Settings()
    if not isinstance(data, dict):
        raise UserError(f"{path}:1: settings must be a mapping of keys to values")
    lines = _key_lines(node)
    known = {f.name for f in dataclasses.fields(Settings)}
    values: dict[str, Any] = {}
    for key, value in data.items():
        where = f"{path}:{lines.get(str(key), 1)}"
        if key not in known:
            raise UserError(
                f"{where}: unknown setting {clip_repr(key)} (known: {', '.join(sorted(known))})"
            )
        types = FIELD_TYPES[key]
        if (isinstance(value, bool) and bool not in types) or not isinstance(value, types):
            want = " or ".join(t.__name__ for t in types)
            raise UserError(f"{where}: {key} must be {want}, got {clip_repr(value)}")
        if key == "health":
            _check_health(where, value)
        elif isinstance(value, dict) and not all(
            isinstance(k, str) and isinstance(v, str) for k, v in value.items()
        ):
            raise UserError(f"{where}: {key} must map names to strings")
        values[key] = value
    settings = Settings(**values)
    for name in ("agent_timeout", "pyspy_timeout"):
        if not 0 < getattr(settings, name) < float("inf"):
            raise UserError(f"{path}:{lines.get(name, 1)}: {name} must be a number of seconds > 0")
    if settings.refresh_interval < 0.1:
        raise UserError(
            f"{path}:{lines.get('refresh_interval', 1)}: refresh_interval must be >= 0.1"
        )
    return settings


def _check_health(where: str, value: Any) -> None:
    from areal_console.core.metrics.health import thresholds_from

    for name, number in value.items():
        if isinstance(number, bool) or not isinstance(number, (int, float)):
            raise UserError(
                f"{where}: health.{clip(name)} must be a number, got {clip_repr(number)}"
            )
    try:
        thresholds_from(value)
    except KeyError as exc:
        from dataclasses import fields as dc_fields

        from areal_console.core.metrics.health import HealthThresholds

        known = ", ".join(f.name for f in dc_fields(HealthThresholds))
        raise UserError(
            f"{where}: unknown health threshold {clip_repr(exc.args[0])} (known: {known})"
        ) from None


def _key_lines(node: Any) -> dict[str, int]:
    """Top-level key -> 1-based line, from a composed YAML node."""
    out: dict[str, int] = {}
    for key_node, _ in getattr(node, "value", []) or []:
        if hasattr(key_node, "value") and hasattr(key_node, "start_mark"):
            out[str(key_node.value)] = key_node.start_mark.line + 1
    return out
