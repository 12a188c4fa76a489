"""The Servers pane: one row per inference server, with its load, version, pause state,
throughput trend and flags (what the agent read from the server's own port, and the
fleet's, within each server's run: versions that differ and, with the run's trainer's
version, a lag beyond `rollout.max_head_offpolicyness` or a server paused while the
trainer moved on)."""

from __future__ import annotations

from collections.abc import Iterable

from rich.text import Text

from areal_console.core.common.identity import login_user
from areal_console.core.connection.records import ProcessRow
from areal_console.core.rollout.servers import (
    KV_USAGE,
    QUEUED,
    RUNNING,
    ServerLine,
    row_runs,
    server_lines,
    throughput_trend,
)
from areal_console.core.rollout.trainer_watch import TrainerStates
from areal_console.widgets.keyed_rows import sync_rows
from areal_console.widgets.remote_text import remote_text
from areal_console.widgets.vim_table import VimTable

COLUMNS = (
    ("node", "NODE"),
    ("server", "SERVER"),
    ("kind", "KIND"),
    ("health", "HEALTH"),
    ("paused", "PAUSED"),
    ("version", "VERSION"),
    ("running", "RUN"),
    ("queued", "QUEUE"),
    ("kv", "KV"),
    ("tps", "TOK/S"),
    ("trend", "TREND"),
    ("flags", "FLAGS"),
)
KEYS = tuple(key for key, _ in COLUMNS)


def _count(value: float | None) -> str:
    return "-" if value is None else f"{value:.0f}"


def server_cells(line: ServerLine) -> tuple[Text, ...]:
    srv = line.server
    health = srv.health
    if health is None:
        health_cell = remote_text("not polled", style="dim")
    elif health.ok:
        took = f" {health.latency_ms:.0f}ms" if health.latency_ms is not None else ""
        health_cell = remote_text(f"ok{took}", style="green")
    else:
        health_cell = remote_text(health.error or "down", style="bold red")
    kv = srv.metric(*KV_USAGE)
    rates = srv.throughput
    flags = ", ".join(dict.fromkeys(f.kind for f in line.flags))
    return (
        remote_text(line.node),
        remote_text(srv.address),
        remote_text(srv.kind or "-"),
        health_cell,
        remote_text(
            "unknown" if srv.paused is None else ("PAUSED" if srv.paused else "no"),
            style="bold yellow" if srv.paused else ("dim" if srv.paused is None else ""),
        ),
        remote_text("-" if srv.weight_version is None else srv.weight_version),
        remote_text(_count(srv.metric(*RUNNING))),
        remote_text(_count(srv.metric(*QUEUED))),
        remote_text(
            "-" if kv is None else f"{kv:.0%}", style="red" if kv is not None and kv >= 0.95 else ""
        ),
        remote_text(_count(rates[-1]) if rates else "-"),
        remote_text(throughput_trend(rates), style="cyan"),
        remote_text(flags or "-", style="bold red" if flags else "dim"),
    )


class ServersPane(VimTable):
    """Rows keyed by node:pid and updated in place (only changed cells are redrawn)."""

    cut_columns = ("flags",)
    row_noun = "server"

    def __init__(self, *, id: str | None = None) -> None:
        super().__init__(id=id)
        self.lines: dict[str, ServerLine] = {}

    def on_mount(self) -> None:
        self.cursor_type = "row"
        for key, label in COLUMNS:
            self.add_column(label, key=key)

    def show_servers(
        self,
        nodes: Iterable[tuple[str, Iterable[ProcessRow]]],
        trainer: TrainerStates | None = None,
    ) -> list[ServerLine]:
        """Show the servers of `nodes` (name, processes), with the flags each run's
        trainer's version raises when it is known; returns the lines shown."""
        listed = [(node, list(procs)) for node, procs in nodes]
        any_server = any(p.server is not None for _, procs in listed for p in procs)
        known = trainer.runs() if trainer is not None else []
        runs = row_runs(listed, login_user(), known) if any_server else None
        lines = server_lines(listed, runs, trainer.trainers() if trainer is not None else None)
        sync_rows(self, KEYS, [(line.key, server_cells(line)) for line in lines])
        self.lines = {line.key: line for line in lines}
        return lines


def servers_title(count: int, trainer: TrainerStates | None) -> str:
    """The pane's title: the servers shown and the trainers' versions they are held to
    (one run: its trainer; several: each run's, by experiment/trial)."""
    known = [s for s in trainer.states if s.version is not None] if trainer else []
    skipped = f" · {len(trainer.skipped)} more runs not read" if trainer and trainer.skipped else ""
    if not known:
        return f"Servers ({count}){skipped}"

    def allowed(head: int | None) -> str:
        return "" if head is None else f" (max_head_offpolicyness {head})"

    if len(known) == 1:
        one = known[0]
        return f"Servers ({count}) · trainer on version {one.version}{allowed(one.max_head_offpolicyness)}{skipped}"
    each = ", ".join(
        f"{s.run.label if s.run else '?'} on {s.version}{allowed(s.max_head_offpolicyness)}"
        for s in known
    )
    return f"Servers ({count}) · trainers: {each}{skipped}"


def flag_lines(lines: Iterable[ServerLine], limit: int = 6) -> Text:
    """Each flag of the shown servers with its evidence, remedy and config key."""
    out = Text()
    shown = 0
    for line in lines:
        for f in line.flags:
            if shown == limit:
                out.append("\n… more flags: see `areal-console nodes --json`", style="dim")
                return out
            if shown:
                out.append("\n")
            out.append_text(remote_text(f"{line.server.address} {f.kind}: ", style="bold red"))
            out.append_text(remote_text(f"{f.evidence}. {f.remedy}"))
            if f.config_key:
                out.append_text(remote_text(f" [{f.config_key}]", style="cyan"))
            shown += 1
    return out
