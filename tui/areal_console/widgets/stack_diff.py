"""Two stacks side by side, aligned from the root; differing frames highlighted."""

from __future__ import annotations

from rich.text import Text

from areal_console.core.stacks.diff import StackDiff
from areal_console.core.stacks.model import Frame
from areal_console.widgets.vim_table import VimTable

ROW_STYLE = {"same": "dim", "line": "yellow", "differ": "bold red"}
MARKER = {"same": " ", "line": "~", "differ": "≠"}


def frame_cell(frame: Frame | None, kind: str, width: int | None = None) -> Text:
    """`function  file:line`; when it does not fit `width`, the function name is cut (the
    `file:line` is what tells two frames apart). The frame pane below shows it in full."""
    if frame is None:
        return Text("—", style="dim")
    where = f"  {frame.file.rsplit('/', 1)[-1]}:{frame.line}"
    function = frame.function
    if width is not None and len(function) + len(where) > width:
        room = max(1, width - len(where) - 1)
        function = function[:room] + "…"
        if len(function) + len(where) > width:  # not even the location fits: keep its end
            where = "…" + where[-(width - len(function) - 1) :] if width > len(function) + 1 else ""
    text = Text(function, style=ROW_STYLE[kind])
    text.append(where, style="dim")
    return text


class StackDiffView(VimTable):
    """Rows keyed by position; `]`/`[` jump between differences."""

    def on_mount(self) -> None:
        self.cursor_type = "row"
        self.diff: StackDiff | None = None
        self._titles = ("", "")
        self._side = 0

    def on_resize(self) -> None:
        # The halves follow the width the table has now (a resize, a pane shown later).
        if (
            self.diff is not None
            and self.size.width
            and self._side != self._side_for(self.size.width)
        ):
            row = self.cursor_row
            self.show_diff(self.diff, *self._titles)
            self.move_cursor(row=row)

    @staticmethod
    def _side_for(width: int) -> int:
        return max(16, (width - 3 - 1 - 4 * 2 - 2) // 2)

    def show_diff(
        self, diff: StackDiff, left_title: str, right_title: str, width: int | None = None
    ) -> None:
        """Fill the table; `width` is the space it will have (it may be hidden now)."""
        self.diff = diff
        self._titles = (left_title, right_title)
        with self.app.batch_update():
            self.clear(columns=True)
            # Two equal halves, whatever the frames' lengths: long ones are cut, not the
            # right-hand side.
            side = self._side = self._side_for(width or self.size.width)
            self.add_column("#", key="depth", width=3)
            self.add_column(left_title, key="left", width=side)
            self.add_column(" ", key="marker", width=1)
            self.add_column(right_title, key="right", width=side)
            for i, row in enumerate(diff.rows):
                self.add_row(
                    str(i),
                    frame_cell(row.left, row.kind, side),
                    Text(MARKER[row.kind], style=ROW_STYLE[row.kind]),
                    frame_cell(row.right, row.kind, side),
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
