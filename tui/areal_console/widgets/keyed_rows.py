"""Keep a keyed `DataTable` equal to a list of rows, touching only what changed."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from textual.widgets import DataTable

from areal_console.widgets.remote_text import remote_text


def sync_rows(
    table: DataTable[Any], columns: Sequence[str], rows: Sequence[tuple[str, Sequence[Any]]]
) -> None:
    """Make `table` show `rows` (key, cells) in order: rows gone are removed, changed cells
    updated in place (`update_cell`), new rows added; a changed order rebuilds the table.
    A plain string cell is remote text (a node's name from a run record, a server's
    address): it is shown escaped, never read as markup, as a `DataTable` would read it."""
    rows = [
        (key, [remote_text(c) if isinstance(c, str) else c for c in cells]) for key, cells in rows
    ]
    keys = [key for key, _ in rows]
    wanted = set(keys)
    for old in list(table.rows):
        if old.value not in wanted:
            table.remove_row(old)
    if [k.value for k in table.rows] != keys[: len(table.rows)]:
        table.clear()  # a row now belongs before existing ones: rebuild in order
    for key, cells in rows:
        if key in table.rows:
            for column, value in zip(columns, cells, strict=True):
                if table.get_cell(key, column) != value:
                    table.update_cell(key, column, value, update_width=True)
        else:
            table.add_row(*cells, key=key)
