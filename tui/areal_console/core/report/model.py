"""What a bug report is made from: typed records of the parts collected, and why a part
could not be collected."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any


@dataclass(frozen=True)
class LogTail:
    """The end of one log file: a few lines for the markdown, more for the bundle."""

    node: str
    path: str
    lines: list[str]
    """The last lines (the markdown shows these)."""
    text: str
    """The bundle's copy: the file's last bytes, whole lines."""
    size: int
    ident: str = ""
    """The file's "dev:inode" on its node."""
    also: tuple[str, ...] = ()
    """Other nodes that see this same file (a log directory shared between nodes)."""

    @property
    def nodes(self) -> tuple[str, ...]:
        return (self.node, *self.also)

    @property
    def role(self) -> str:
        """Whose log it is, as AReaL names its files: `<role>.log` per role (the launcher's
        `<job_name>.log`), `merged.log` every role's lines with a `[role]` prefix."""
        name = self.path.rstrip("/").rsplit("/", 1)[-1]
        stem = name[: -len(".log")] if name.endswith(".log") else name
        return "every role" if stem == "merged" else stem


@dataclass(frozen=True)
class NodeVersions:
    """What one node runs: the `versions` op's answer, plus GPU names from NVML."""

    node: str
    system: dict[str, Any]
    interpreters: list[dict[str, Any]]
    gpus: list[str] = field(default_factory=list)
    gone: bool = False
    """No process of the job ran there: the interpreter its command line names was read,
    without the environment (PYTHONPATH) the job's processes had."""


@dataclass
class ReportInputs:
    """Every part of a report, as collected (JSON-shaped where a command prints it: the
    sections read fields they know and ignore the rest). A part that could not be had is
    None, with the reason in `missing`."""

    job: str | None = None
    made_at: str = ""
    capture: dict[str, Any] | None = None
    """The `stacks --json` document."""
    capture_note: str = ""
    """Where the capture came from (taken now, or a saved one and when)."""
    metrics: dict[str, Any] | None = None
    """The `metrics --json` document."""
    processes: list[dict[str, Any]] = field(default_factory=list)
    """The job's processes (`nodes --json` entries, each with its `node`)."""
    log_dir: str | None = None
    """The run's log directory (its path on every node in `log_nodes`)."""
    log_nodes: list[str] = field(default_factory=list)
    """The nodes that have the log directory, in the order read (the controller's first)."""
    logs: list[LogTail] = field(default_factory=list)
    config_path: str | None = None
    config_text: str | None = None
    versions: list[NodeVersions] = field(default_factory=list)
    missing: dict[str, str] = field(default_factory=dict)
    """part -> why it was not collected."""


@dataclass(frozen=True)
class BundleFile:
    name: str
    data: bytes


@dataclass
class Report:
    """The markdown and the bundle's files, masked; what was cut to fit the bound."""

    markdown: str
    files: list[BundleFile]
    missing: dict[str, str]
    cut: list[str] = field(default_factory=list)
    job: str = ""
    """The job's name, masked (files are named after it)."""
