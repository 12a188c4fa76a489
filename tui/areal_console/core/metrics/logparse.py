"""An incremental parser of AReaL's metric log (main.log, merged.log, <role>.log, trainer.log).

What AReaL writes per step (areal/utils/stats_logger.py:135-162 at cbff54d6):

    (AReaL) 20250101-12:00:00.123 StatsLogger INFO: Epoch 1/3 Step 2/50 Train step 2/150 done.
    (AReaL) 20250101-12:00:00.124 StatsLogger INFO: Stats (1/1):
    (AReaL) 20250101-12:00:00.125 StatsLogger INFO:
    ╒══════════════════════════╤═════════════╤═══ ...
    │ ppo_actor/seq_len/avg    │  4.0000e+02 │ ...
    ├──────────────────────────┼─────────────┼─── ...
    ...
    ╘══════════════════════════╧═════════════╧═══ ...

The progress line is 1-based (N = global_step + 1); the table (areal/utils/printing.py:6-21)
holds four key/value pairs per row in column-major order, values `%.4e`. Lines carry ANSI
colour codes, and in `merged.log` a `[role]` prefix padded to 10 columns. Neither matters
here: the patterns never span a colour code, and the table is cut at its `│` borders. At the
end of a run AReaL logs `Training completes! Total time elapsed ...` (stats_logger.py:125).

Speed: once a step has been read the searching way below, the steps after it that repeat
its record's shape are read in bulk (logbulk.py); the searching path takes whatever does
not: the first steps, a new table layout, a foreign line inside a record, damage.
"""

from __future__ import annotations

import calendar
import math
import re
import time

from areal_console.core.metrics.logbulk import (
    COUNT,
    PROGRESS_LINE,
    RecordRun,
    RecordTemplate,
    fits,
    log_steps,
    read_run,
    record_template,
)
from areal_console.core.metrics.store import MetricStore

HEADS = re.compile(
    PROGRESS_LINE + rb"|Stats \(" + COUNT + rb"/" + COUNT + rb"\):" + rb"|Training completes!"
)
TIMESTAMP = re.compile(rb"(\d{4})(\d\d)(\d\d)-(\d\d):(\d\d):(\d\d)\.(\d{3}) ")
BAR = "│".encode()
TOP = "╒".encode()
BOTTOM = "╘".encode()
# The table's first line follows its log line within a few hundred bytes (more if another
# process's lines got in between in merged.log); farther means this Stats record has none.
TABLE_WINDOW = 8192
BULK_FIRST, BULK_MOST = 16, 4096  # records compared per bulk pass: first, and at most
BULK_BACKOFF = 255  # records read the searching way, at most, after bulk attempts that failed
TEMPLATES = 8  # record shapes kept (a run alternates between a few: eval steps, value widths)
SEAM = 256 << 10  # a chunk's head parsed with the previous chunk's unfinished record ...
SEAM_MARGIN = 4096  # ... or, when that is shorter, enough of the chunk to finish a record
# twice as long as the longest kept record shape, plus this


def local_utc_offset() -> int:
    """Seconds east of UTC of this machine's local time now."""
    return int(time.localtime().tm_gmtoff)


class LogParser:
    """Feed it the log's bytes in any chunks; it fills a `MetricStore`.

    Steps are AReaL's global steps (0-based), as tensorboard and wandb show them: the
    progress line's `Train step N` is N - 1, and a commit of several stats dicts logs them at
    consecutive steps from max(global_step, last + 1) (stats_logger.py:145-159).
    `utc_offset` is the log writer's local time zone (log timestamps carry none). With
    `bulk=False` every record is read the searching way (the reference for the bulk path).
    """

    def __init__(
        self, store: MetricStore | None = None, utc_offset: int | None = None, bulk: bool = True
    ) -> None:
        self.store = store if store is not None else MetricStore()
        self.utc_offset = local_utc_offset() if utc_offset is None else utc_offset
        self.finished = False  # AReaL logged its completion line
        self.finished_at: float | None = None
        self.total_steps: int | None = None
        self.last_step = -1
        self._global: int | None = None  # from the latest progress line
        self._base = 0
        self._step_time = math.nan
        self._pending = b""
        self._layout_raw: list[bytes] = []
        self._layout: tuple[str, ...] = ()
        self._layout_n = 0
        self._days: dict[bytes, int] = {}
        self._templates: list[RecordTemplate] = []  # most recently used first
        self._table_read = False  # the latest Stats record had a table, read row by row
        self._bulk_misses = 0  # bulk attempts that read nothing in a row ...
        self._bulk_skip = 0  # ... and how many records to read the searching way before the next
        self.bulk = bulk
        self.bulk_steps = 0  # steps read in bulk
        self._run_length = BULK_FIRST  # records in the last bulk run
        self.bytes_read = 0

    # feeding --------------------------------------------------------------------------
    def feed(self, chunk: bytes) -> int:
        """Parse what is complete; keep the rest for the next call. Returns new steps."""
        self.bytes_read += len(chunk)
        before = len(self.store.steps)
        self._pending = self._feed(self._pending, chunk)
        return len(self.store.steps) - before

    def _feed(self, pending: bytes, chunk: bytes) -> bytes:
        """Parse `pending + chunk`; returns the incomplete rest. The chunk is copied only if
        the pending record does not end within its first bytes (the seam)."""
        if not pending:
            return chunk[self._parse(chunk) :]
        seam = pending + chunk[: self._seam(len(pending))]
        used = self._parse(seam)
        if len(seam) == len(pending) + len(chunk):
            return seam[used:]
        if used >= len(pending):
            return chunk[self._parse(chunk, used - len(pending)) :]
        data = pending + chunk
        return data[self._parse(data, used) :]

    def _seam(self, pending: int) -> int:
        """How much of a chunk to parse with `pending` bytes of an unfinished record: SEAM,
        or less when a record up to twice the longest kept shape would end within it."""
        longest = max((t.size for t in self._templates), default=SEAM)
        return SEAM if pending >= longest else min(SEAM, 2 * longest - pending + SEAM_MARGIN)

    def reset(self) -> None:
        """The file was truncated or replaced: forget the partial record (keep the data)."""
        self._pending = b""

    # parsing --------------------------------------------------------------------------
    def _parse(self, data: bytes, start: int = 0) -> int:
        """Parse the complete records of `data` from `start`; returns the offset up to which
        it was consumed."""
        end = max(data.rfind(b"\n") + 1, start)
        # record: where the current step's record began (after a table); `start` is one
        pos = record = self._runs(data, start, end) if self.bulk else start
        while True:
            m = HEADS.search(data, pos, end)
            if m is None:
                return end
            if m.group(5) is not None:  # progress line
                self._global = int(m.group(5)) - 1
                self.total_steps = int(m.group(6))
                self._step_time = self._time_of_line(data, m.start())
                pos = m.end()
            elif m.group(7) is not None:  # Stats (i/n): then the table
                table_end = self._table(data, m, end)
                if table_end < 0:
                    return record  # wait for the whole table; its record is read again
                pos = table_end
                if self._table_read and self.bulk:
                    pos = self._bulk(data, record, table_end, end)
                if pos > m.end():  # a table was read: the next record starts after it
                    record = pos
            else:
                self.finished = True
                self.finished_at = self._time_of_line(data, m.start())
                pos = m.end()

    def _table(self, data: bytes, m: re.Match[bytes], end: int) -> int:
        """Parse the table after a `Stats (i/n):` record; -1 if it is not complete yet."""
        self._table_read = False
        top = data.find(TOP, m.end(), min(end, m.end() + TABLE_WINDOW))
        if top < 0:
            if end - m.end() < TABLE_WINDOW and HEADS.search(data, m.end(), end) is None:
                return -1  # the table may still be on its way
            return m.end()  # an empty stats dict: no table
        if HEADS.search(data, m.end(), top) is not None:
            return m.end()  # that table belongs to a later record
        bottom = data.find(BOTTOM, top, end)
        if bottom < 0:
            return -1
        stop = data.find(b"\n", bottom, end)
        if stop < 0:
            return -1
        index = int(m.group(7))
        if index == 1:
            base = self.last_step + 1
            if self._global is not None:
                base = max(self._global, base)
            self._base = base
            self._global = None
        step = self._base + index - 1
        values = self._cells(data[top:bottom])
        if values is not None:
            self.store.add_row(step, self._layout, values)
            self.store.mark_step(step, self._step_time)
            self.last_step = step
            self._table_read = True
        return stop + 1

    def _bulk(self, data: bytes, record: int, table_end: int, end: int) -> int:
        """After a step read the searching way (its record is data[record:table_end]), read
        the records after it that repeat its shape or a recent one's; returns where they end."""
        if self._bulk_skip > 0:
            self._bulk_skip -= 1
            return table_end
        self._remember(data[record:table_end])
        pos = self._runs(data, table_end, end)
        missed = pos == table_end and end - pos >= min((t.size for t in self._templates), default=0)
        self._bulk_misses = min(2 * self._bulk_misses + 1, BULK_BACKOFF) if missed else 0
        self._bulk_skip = self._bulk_misses
        return pos

    def _remember(self, record: bytes) -> None:
        """Put the template of this record first among those kept (making it if needed)."""
        for i, kept in enumerate(self._templates):
            if fits(kept, record):
                self._templates.insert(0, self._templates.pop(i))
                return
        template = record_template(record)
        if template is not None:
            self._templates = [template, *self._templates[: TEMPLATES - 1]]

    def _runs(self, data: bytes, pos: int, end: int) -> int:
        """Read the runs of records from `pos` that repeat kept templates; their end."""
        while (after := self._run(data, pos, end)) > pos:
            pos = after
        return pos

    def _run(self, data: bytes, pos: int, end: int) -> int:
        """Read the run of records from `pos` that repeat a kept template; its end."""
        for template in self._templates:
            if data.startswith(template.last, pos + template.size - len(template.last)):
                after = self._read_run(data, pos, end, template)
                if after > pos:
                    return after
        return pos

    def _read_run(self, data: bytes, pos: int, end: int, template: RecordTemplate) -> int:
        """Records of `template` from `pos`, a pass at a time: the first pass as long as the
        last run was (a pass has a fixed cost; a long pass over a record that differs early
        wastes its comparison), then longer while they keep matching."""
        count, start = self._run_length, pos
        while (count := min(count, (end - pos) // template.size)) > 0:
            run = read_run(data, pos, count, template)
            read = len(run.train_steps) if run is not None else 0
            if run is not None:
                self._store_run(run, template.names)
                pos += read * template.size
            if read < count:  # a record differs: the next first pass is this run's length
                self._run_length = min(max((pos - start) // template.size, BULK_FIRST), BULK_MOST)
                return pos
            count = min(4 * count, BULK_MOST)
        # the data ended, not the run: the next chunk goes on with passes as long
        self._run_length = max(self._run_length, min((pos - start) // template.size, BULK_MOST))
        return pos

    def _store_run(self, run: RecordRun, names: tuple[str, ...]) -> None:
        """Steps read in bulk, each with a progress line and one stats dict (`Stats (1/1)`)."""
        steps = log_steps(run.train_steps, self.last_step)
        times = (run.seconds - self.utc_offset).tolist()
        self.store.add_rows(steps, names, run.values)
        self.store.mark_steps(steps, times)
        self.bulk_steps += len(steps)
        self.last_step = self._base = steps[-1]
        self._global = None
        self._step_time = times[-1]
        self.total_steps = run.total

    def _cells(self, table: bytes) -> list[float] | None:
        # Rows are every other line after the top border; the separator lines between
        # them are mostly multi-byte box characters, slow to search, so they go first.
        rows = table.split(b"\n")[1::2]
        if not rows:
            return None
        width = rows[0].count(BAR)  # bars per row: cells + 1
        if width < 3:
            return None
        parts = b"".join(rows).split(BAR)
        # parts: [prefix, c1 .. ck, gap, c1 .. ck, gap, ..., c1 .. ck, tail]
        del parts[::width]
        keys = parts[0::2]
        if keys != self._layout_raw:
            self._set_layout(keys)
        try:
            return list(map(float, parts[1::2][: self._layout_n]))
        except ValueError:
            return self._cells_slow(table)

    def _set_layout(self, keys: list[bytes]) -> None:
        names = [k.strip().decode(errors="replace") for k in keys]
        self._layout_raw = keys
        self._layout_n = sum(1 for n in names if n)
        self._layout = tuple(names[: self._layout_n])

    def _cells_slow(self, table: bytes) -> list[float] | None:
        """Row by row, for a table the fast path could not read (odd values, damage)."""
        pairs: dict[str, float] = {}
        for line in table.split(b"\n"):
            cells = [c.strip() for c in line.split(BAR)[1:-1]]
            for k, v in zip(cells[0::2], cells[1::2], strict=False):
                if not k:
                    continue
                try:
                    pairs[k.decode(errors="replace")] = float(v)
                except ValueError:
                    pairs[k.decode(errors="replace")] = math.nan
        if not pairs:
            return None
        self._layout_raw = []
        self._layout = tuple(pairs)
        self._layout_n = len(pairs)
        return list(pairs.values())

    def _time_of_line(self, data: bytes, at: int) -> float:
        start = data.rfind(b"\n", 0, at) + 1
        m = TIMESTAMP.search(data, start, at)
        if m is None:
            return math.nan
        day = m.group(1) + m.group(2) + m.group(3)
        days = self._days.get(day)
        if days is None:
            days = calendar.timegm((int(m.group(1)), int(m.group(2)), int(m.group(3)), 0, 0, 0))
            self._days[day] = days
        return (
            days
            + int(m.group(4)) * 3600
            + int(m.group(5)) * 60
            + int(m.group(6))
            + int(m.group(7)) / 1000
            - self.utc_offset
        )


def parse_log(data: bytes, utc_offset: int | None = None) -> LogParser:
    """A whole log at once."""
    parser = LogParser(utc_offset=utc_offset)
    parser.feed(data if data.endswith(b"\n") else data + b"\n")
    return parser
