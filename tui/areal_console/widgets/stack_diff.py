"""Two stacks side by side, aligned from the root; differing frames highlighted."""

from __future__ import annotations

from rich.text import Text

from areal_console.core.stacks.diff import StackDiff
from areal_console.core.stacks.records import Frame
from areal_console.widgets.vim_table import VimTable

ROW_STYLE = {"same": "dim", "line": "yellow", "differ": "bold red"}
MARKER = {"same": " ", "line": "~", "differ": "≠"}


def _location(frame: Frame) -> str:
    return f"{frame.file.rsplit('/', 1)[-1]}:{frame.line}"


def _cut_left(text: str, width: int) -> str:
    """The end of `text` in `width` cells: a file name loses its start, never its line."""
    if len(text) <= width:
        return text
    return "…" + text[len(text) - width + 1 :] if width > 1 else ""


def _cut_right(text: str, width: int) -> str:
    return text if len(text) <= width else text[: max(0, width - 1)] + "…"


def fits_one_line(frame: Frame | None, width: int) -> bool:
    """Whether `function  file:line` fits `width` cells uncut."""
    return frame is None or len(frame.function) + 2 + len(_location(frame)) <= width


def frame_cell(
    frame: Frame | None, kind: str, width: int | None = None, two_lines: bool = False
) -> Text:
    """`function  file:line` in `width` cells. The function name is what a reader compares,
    so it is cut last: first the file name loses its start (`…iner.py:1094`); with
    `two_lines` the location goes under the name and each line has the whole width."""
    if frame is None:
        return Text("—", style="dim")
    function, where = frame.function, _location(frame)
    if width is not None and two_lines:
        function, where = _cut_right(function, width), _cut_left(where, width - 2)
    elif width is not None and len(function) + 2 + len(where) > width:
        line = f":{frame.line}"
        keep = min(len(where), max(len(line) + 1, width - 2 - len(function)))
        where = _cut_left(where, keep)
        function = _cut_right(function, width - 2 - len(where))
    text = Text(function, style=ROW_STYLE[kind])
    text.append(("\n  " if two_lines else "  ") + where, style="dim")
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
            # One line a frame where every frame fits; otherwise the location goes under
            # the function name (a narrow terminal keeps whole names instead of cut ones).
            two = not all(fits_one_line(f, side) for r in diff.rows for f in (r.left, r.right))
            self.add_column("#", key="depth", width=3)
            self.add_column(left_title, key="left", width=side)
            self.add_column(" ", key="marker", width=1)
            self.add_column(right_title, key="right", width=side)
            for i, row in enumerate(diff.rows):
                self.add_row(
                    str(i),
                    frame_cell(row.left, row.kind, side, two),
                    Text(MARKER[row.kind], style=ROW_STYLE[row.kind]),
                    frame_cell(row.right, row.kind, side, two),
                    key=str(i),
                    height=2 if two else 1,
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
