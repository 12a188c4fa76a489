"""Where the console keeps its files (XDG base directories), in one place."""

from __future__ import annotations

import os
from pathlib import Path

APP_NAME = "areal-console"


def _xdg(var: str, default: str) -> Path:
    value = os.environ.get(var)
    return Path(value) if value else Path.home() / default


def data_dir() -> Path:
    """Captures, job records and logs: `$AREAL_CONSOLE_DATA_DIR` or XDG data home."""
    override = os.environ.get("AREAL_CONSOLE_DATA_DIR")
    return Path(override) if override else _xdg("XDG_DATA_HOME", ".local/share") / APP_NAME


def config_dir() -> Path:
    """Settings and keymap: `$AREAL_CONSOLE_CONFIG_DIR` or XDG config home."""
    override = os.environ.get("AREAL_CONSOLE_CONFIG_DIR")
    return Path(override) if override else _xdg("XDG_CONFIG_HOME", ".config") / APP_NAME


def config_file() -> Path:
    """The settings file: `$AREAL_CONSOLE_CONFIG` or `config.yaml` in the config dir."""
    override = os.environ.get("AREAL_CONSOLE_CONFIG")
    return Path(override) if override else config_dir() / "config.yaml"


def cache_dir() -> Path:
    return _xdg("XDG_CACHE_HOME", ".cache") / APP_NAME


def captures_dir() -> Path:
    return data_dir() / "captures"


def jobs_dir() -> Path:
    return data_dir() / "jobs"


def runs_dir() -> Path:
    """Run folders (a replay's working directory, its log and output), one per run."""
    return data_dir() / "runs"


def known_hosts_file() -> Path:
    """The console's own known-hosts file, consulted after `~/.ssh/known_hosts`."""
    return data_dir() / "known_hosts"
