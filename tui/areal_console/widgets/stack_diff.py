"""Two stacks side by side, aligned from the root; differing frames highlighted."""

from __future__ import annotations

from rich.text import Text
from textual.widgets import DataTable

from areal_console.core.stacks.diff import StackDiff
from areal_console.core.stacks.model import Frame

ROW_STYLE = {"same": "dim", "line": "yellow", "differ": "bold red"}
MARKER = {"same": " ", "line": "~", "differ": "≠"}


def frame_cell(frame: Frame | None, kind: str) -> Text:
    if frame is None:
        return Text("—", style="dim")
    text = Text(frame.function, style=ROW_STYLE[kind])
    text.append(f"  {frame.file.rsplit('/', 1)[-1]}:{frame.line}", style="dim")
    return text


class StackDiffView(DataTable[object]):
    """Rows keyed by position; `]`/`[` jump between differences."""

    def on_mount(self) -> None:
        self.cursor_type = "row"
        self.diff: StackDiff | None = None

    def show_diff(
        self, diff: StackDiff, left_title: str, right_title: str, width: int | None = None
    ) -> None:
        """Fill the table; `width` is the space it will have (it may be hidden now)."""
        self.diff = diff
        with self.app.batch_update():
            self.clear(columns=True)
            # Two equal halves, whatever the frames' lengths: long ones are cut, not the
            # right-hand side.
            side = max(16, ((width or self.size.width) - 3 - 1 - 4 * 2 - 2) // 2)
            self.add_column("#", key="depth", width=3)
            self.add_column(left_title, key="left", width=side)
            self.add_column(" ", key="marker", width=1)
            self.add_column(right_title, key="right", width=side)
            for i, row in enumerate(diff.rows):
                self.add_row(
                    str(i),
                    frame_cell(row.left, row.kind),
                    Text(MARKER[row.kind], style=ROW_STYLE[row.kind]),
                    frame_cell(row.right, row.kind),
                    key=str(i),
                )
        if diff.first_difference is not None:
            self.move_cursor(row=diff.first_difference)

    def jump(self, step: int) -> int | None:
        """Move to the next (`step` 1) or previous (-1) difference; its row, or None."""
        if self.diff is None:
            return None
        rows = self.diff.differences
        here = self.cursor_row
        ahead = [r for r in rows if r > here] if step > 0 else [r for r in rows if r < here]
        if not ahead:
            return None
        target = ahead[0] if step > 0 else ahead[-1]
        self.move_cursor(row=target)
        return target

    @property
    def current_frame(self) -> Frame | None:
        if self.diff is None or not 0 <= self.cursor_row < len(self.diff.rows):
            return None
        row = self.diff.rows[self.cursor_row]
        return row.left or row.right
