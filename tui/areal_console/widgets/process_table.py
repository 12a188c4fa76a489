"""The process pane: ranks and job processes, keyed by node and pid, updated in place."""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from operator import attrgetter
from typing import Any

from rich.text import Text

from areal_console.core.common.rank_filter import RankFilter, parse_filter
from areal_console.core.common.textfmt import format_bytes, printable
from areal_console.core.connection.nodes import server_text
from areal_console.core.connection.records import ProcessRow
from areal_console.core.connection.sampling import MemoryTrend
from areal_console.widgets.remote_text import remote_text
from areal_console.widgets.vim_table import VimTable, columns_for

COLUMNS = (
    ("job", "JOB"),  # shown only while more than one job is listed
    ("node", "NODE"),
    ("rank", "RANK"),
    ("local", "LOCAL"),
    ("role", "ROLE"),
    ("pid", "PID"),
    ("cpu", "CPU%"),
    ("rss", "RSS"),
    ("gpumem", "GPU MEM"),
    ("gpus", "GPUS"),
    ("state", "ST"),
    ("cmd", "COMMAND"),
)

SPARE = ("local", "rss", "state")  # on a narrow terminal, room for COMMAND (all in the detail)

ROLE_STYLE = {
    "launcher": "cyan",
    "controller": "cyan",
    "wrapper": "dim",
    "trainer": "",
    "actor": "magenta",
    "sglang": "blue",
    "vllm": "blue",
}


def row_key(node: str, pid: int) -> str:
    return f"{node}:{pid}"


def cpu_text(cpu_percent: float | None) -> str:
    return "-" if cpu_percent is None else f"{cpu_percent:.0f}"


def rss_cell(rss: float | None, trend: MemoryTrend | None) -> str | Text:
    """RSS, then its sparkline over the last samples; red while it grows steadily."""
    if trend is None:
        return format_bytes(rss)
    style = "bold red" if trend.growth is not None else "dim"
    return Text.assemble(format_bytes(rss), " ", (trend.spark, style))


def process_cells(
    node: str, p: ProcessRow, trend: MemoryTrend | None = None, job: str | None = None
) -> dict[str, str | Text]:
    """The cells of one process's row; `job`: the key of the job it belongs to."""

    def opt(value: Any) -> str:
        return "-" if value is None else str(value)

    role = printable(p.role or "-")
    rank, world = p.rank, p.world_size
    role_style = ROLE_STYLE.get(role, "")
    if p.server is not None and p.server.down:
        role_style = "bold red"  # an inference server that does not answer /health
    address = server_text(p.server)
    command = short_paths(p.cmdline)
    return {
        "job": remote_text(job or "-"),
        "node": node,
        "rank": f"{rank}/{world}" if rank is not None and world is not None else opt(rank),
        "local": opt(p.local_rank),
        "role": Text(role, style=role_style, justify="left"),
        "pid": str(p.pid),
        "cpu": cpu_text(p.cpu_percent),
        "rss": rss_cell(p.rss, trend),
        "gpumem": format_bytes(p.gpu_memory),
        "gpus": ",".join(map(str, p.gpus)) or "-",
        "state": remote_text(p.state or "?", style="bold red" if p.state == "Z" else ""),
        # Text, not str: a command line is untrusted and must never be read as markup.
        "cmd": Text(
            printable(one_line(f"[{address}] {command}" if address else command))[:CMD_WIDTH]
        ),
    }


def short_paths(command: str) -> str:
    """A command line with each path argument shown by its last part (`/root/.pyenv/…/bin/
    python -u /work/x/train.py` reads `python -u train.py`): the pane's narrow COMMAND
    column shows what runs, not the start of a directory. The whole line is in the process
    detail (enter), and the filter searches the whole line."""
    return " ".join(
        word.rstrip("/").rsplit("/", 1)[-1] or word if word.startswith(("/", "~/", "./")) else word
        for word in command.split(" ")
    )


CMD_WIDTH = 200  # the cut end of a longer command line is in the process detail (enter)


def one_line(text: str) -> str:
    """A command line on one row: `python -c "..."` code keeps its line breaks as ⏎."""
    return " ⏎ ".join(part.strip() for part in text.splitlines() if part.strip()) or text


# Orders of the process pane: (name, key of the value, largest first).
SORTS = {"rank": None, "cpu": "cpu_percent", "rss": "rss", "gpumem": "gpu_memory"}


# The record fields the cells are made of: a row whose fields did not change is skipped
# without building its cells. CPU% and RSS (what a sample mostly changes) come first.
CELL_FIELDS = (
    "cpu_percent",
    "rss",
    "rank",
    "world_size",
    "local_rank",
    "role",
    "gpus",
    "gpu_memory",
    "state",
    "cmdline",
    "server",
)


cell_fields = attrgetter(*CELL_FIELDS)

CPU_COLUMN = [c for c, _ in COLUMNS].index("cpu")
RSS_COLUMN = [c for c, _ in COLUMNS].index("rss")


class ProcessTable(VimTable):
    """Rows keyed `node:pid`; only changed cells of the rows on screen are touched (a 1 Hz
    sample of 4,096 ranks changes every CPU%, of which the screen shows forty). Rows out
    of view are brought up to date when they come into it."""

    sort_by = "rank"  # a key of SORTS
    select_on_click = False  # selecting (enter) opens the process detail
    cut_columns = ("cmd", "job")  # the whole command line is in the detail (enter)
    cut_tails = {"job": 12}  # a job's port or trial name tells jobs apart

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.processes: dict[str, tuple[str, ProcessRow]] = {}
        self._trends: Mapping[tuple[str, int], MemoryTrend] = {}
        self._jobs: Mapping[tuple[str, int], str] = {}  # (node, pid) -> job key
        self.several_jobs = False  # the JOB column is shown

    def on_mount(self) -> None:
        self.cursor_type = "row"
        self.zebra_stripes = True
        # row key -> (the record's cell fields, each cell's text) as shown
        self._shown: dict[str, tuple[tuple[Any, ...], tuple[str, ...]]] = {}
        self._set_columns()

    def _set_columns(self) -> bool:
        columns = columns_for(self.app.size.width, COLUMNS, SPARE)
        if not self.several_jobs:
            columns = tuple(c for c in columns if c[0] != "job")
        return self.show_columns(columns)

    def on_resize(self) -> None:
        if self._set_columns():  # rows again, in the new columns
            self.update_processes(self.processes.values(), "", self._trends, self._jobs)
        super().on_resize()

    def clear(self, columns: bool = False) -> ProcessTable:
        self._shown = {}
        super().clear(columns)
        return self

    def update_processes(
        self,
        rows: Iterable[tuple[str, ProcessRow]],
        text_filter: str | RankFilter = "",
        trends: Mapping[tuple[str, int], MemoryTrend] | None = None,
        jobs: Mapping[tuple[str, int], str] | None = None,
    ) -> None:
        """Show `rows` that pass `text_filter`. `trends`: each (node, pid)'s RSS sparkline
        and growth (the RSS cell shows them); `jobs`: each one's job key. While the rows
        hold more than one job a JOB column is shown, and each job's rows stay together."""
        self._trends = trends or {}
        self._jobs = jobs = jobs or {}
        wanted = {row_key(n, p.pid): (n, p) for n, p in filter_rows(rows, text_filter)}
        self.processes = wanted
        several = len({jobs.get((n, p.pid)) for n, p in wanted.values()} - {None}) > 1
        if several != self.several_jobs:
            self.several_jobs = several
            self._set_columns()  # the JOB column comes or goes: rows again, below
        shown = self._shown
        with self.app.batch_update():
            gone = [k for k in shown if k not in wanted]
            self.remove_rows(gone)
            for key in gone:
                del shown[key]
            added = False
            for key, (node, proc) in wanted.items():
                if key in shown:
                    continue
                job = jobs.get((node, proc.pid))
                cells = process_cells(node, proc, self._trends.get((node, proc.pid)), job)
                shown[key] = ((*cell_fields(proc), job), tuple(str(cells[c]) for c, _ in COLUMNS))
                self.add_row(*(cells[c] for c in self.column_keys), key=key)
                added = True
            if added or self.sort_by != "rank":  # live values move rows: re-sort each time
                self._sort_rows()
            self._bring_up_to_date(self.keys_in_view())

    def rows_came_into_view(self) -> None:
        if self.processes:
            self._bring_up_to_date(self.keys_in_view())

    def _bring_up_to_date(self, keys: Iterable[str]) -> None:
        """Make the cells of the rows `keys` show their processes' newest records."""
        shown, trends, jobs = self._shown, self._trends, self._jobs
        changes: list[tuple[str, str, Any]] = []
        for key in keys:
            entry = self.processes.get(key)
            before = shown.get(key)
            if entry is None or before is None:
                continue
            node, proc = entry
            job = jobs.get((node, proc.pid))
            fields = (*cell_fields(proc), job)
            trend = trends.get((node, proc.pid))
            if before[0][2:] == fields[2:]:
                # only CPU% and RSS may differ: those two cells, nothing else built
                rss_now = rss_cell(fields[1], trend)
                if before[0] == fields and before[1][RSS_COLUMN] == str(rss_now):
                    continue
                cpu, rss = cpu_text(fields[0]), str(rss_now)
                old_cpu, old_rss = before[1][CPU_COLUMN], before[1][RSS_COLUMN]
                now = list(before[1])
                now[CPU_COLUMN], now[RSS_COLUMN] = cpu, rss
                shown[key] = (fields, tuple(now))
                if cpu != old_cpu:
                    changes.append((key, "cpu", cpu))
                if rss != old_rss and "rss" in self.column_keys:
                    changes.append((key, "rss", rss_now))
                continue
            cells = process_cells(node, proc, trend, job)
            texts = tuple(str(cells[c]) for c, _ in COLUMNS)
            shown[key] = (fields, texts)
            for i, (column, _) in enumerate(COLUMNS):
                if before[1][i] != texts[i] and column in self.column_keys:
                    changes.append((key, column, cells[column]))
        self.update_cells(changes)

    def set_sort(self, sort_by: str) -> None:
        """Order rows by rank (default) or by CPU, RSS or GPU memory, largest first."""
        self.sort_by = sort_by
        self._sort_rows()

    def _sort_rows(self) -> None:
        # The cursor stays on its process when rows move (as in htop), not on its index.
        selected = self.selected_key
        field = SORTS.get(self.sort_by)
        if field is None:
            order = {
                key: display_order(node, proc, self._jobs.get((node, proc.pid)))
                for key, (node, proc) in self.processes.items()
            }
            self.sort("node", "pid", key=lambda cells: order[f"{cells[0]}:{cells[1]}"])
        else:
            values = {key: (getattr(proc, field) or 0) for key, (_, proc) in self.processes.items()}
            self.sort("node", "pid", key=lambda cells: -values.get(f"{cells[0]}:{cells[1]}", 0))
        if selected is not None and selected in self.rows:
            index = self.get_row_index(selected)
            if index != self.cursor_row:
                self.move_cursor(row=index, animate=False)
        self.rows_came_into_view()  # other rows may be on screen now

    @property
    def selected_process(self) -> tuple[str, ProcessRow] | None:
        """(node, process record) of the highlighted row."""
        key = self.selected_key
        return self.processes.get(key) if key else None

    @property
    def selected_key(self) -> str | None:
        if not self.row_count:
            return None
        try:
            return self.coordinate_to_cell_key(self.cursor_coordinate).row_key.value
        except Exception:
            return None


def display_order(
    node: str, p: ProcessRow, job: str | None
) -> tuple[bool, str, bool, int, str, int]:
    """Rank order, one job after another: each job's ranks in rank order, then its other
    processes by pid; processes of no known job last."""
    return (job is None, job or "", p.rank is None, p.rank or 0, node, p.pid)


def process_matches(node: str, p: ProcessRow, text_filter: str | RankFilter) -> bool:
    """Whether the process table shows this process under `text_filter`: a rank set
    (`0-2047,4095`), `node:NAME`, `role:ROLE` (the grammar of the Stacks screen's group
    filter; one number is also taken as a pid), else text in its node, rank, role, job,
    pid or command line."""
    wanted = parse_filter(text_filter) if isinstance(text_filter, str) else text_filter
    if not wanted.text:
        return True
    if wanted.number is not None and p.pid == wanted.number:
        return True  # a pid, as the palette's jump to a rank filters
    if wanted.structured:
        return (
            wanted.has_rank(p.rank)
            and wanted.has_node(node)
            and (wanted.role is None or (p.role is not None and wanted.has_role(p.role)))
        )
    hay = f"{node} {p.rank} {p.role} {p.job} {p.pid} {p.cmdline}".lower()
    return wanted.text in hay


def filter_rows(
    rows: Iterable[tuple[str, ProcessRow]], text_filter: str | RankFilter
) -> Iterable[tuple[str, ProcessRow]]:
    """The (node, process) `rows` that `text_filter` lets through, the filter read once."""
    wanted = parse_filter(text_filter) if isinstance(text_filter, str) else text_filter
    if not wanted.text:
        return rows
    return (row for row in rows if process_matches(row[0], row[1], wanted))
