"""Keep a keyed `DataTable` equal to a list of rows, touching only what changed."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from textual.widgets import DataTable


def sync_rows(
    table: DataTable[Any], columns: Sequence[str], rows: Sequence[tuple[str, Sequence[Any]]]
) -> None:
    """Make `table` show `rows` (key, cells) in order: rows gone are removed, changed cells
    updated in place (`update_cell`), new rows added; a changed order rebuilds the table."""
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
