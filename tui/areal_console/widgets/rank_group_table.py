"""Equivalence classes of ranks: one keyed row per group, marks updated in place."""

from __future__ import annotations

import re

from rich.text import Text
from textual.message import Message

from areal_console.core.stacks.diagnose import short_where
from areal_console.core.stacks.merge import RankGroup
from areal_console.widgets.vim_table import VimTable

MARK = "●"


_RANK_SET = re.compile(r"^\d{1,9}(-\d{1,9})?(,\d{1,9}(-\d{1,9})?){0,63}$")


def rank_intervals(text: str) -> list[tuple[int, int]] | None:
    """`0-2047,4095` as intervals [(0, 2047), (4095, 4095)]; None when `text` is no rank
    set. Never expanded: `0-999999999` is one interval, not a billion ranks."""
    text = text.replace(" ", "")
    if not _RANK_SET.match(text):
        return None
    out = []
    for part in text.split(","):
        lo, _, hi = part.partition("-")
        out.append((int(lo), int(hi or lo)))
    return out


def group_matches(group: RankGroup, text: str) -> bool:
    """`/` filter: a rank set (`2049`, `0-15,4095`: the groups holding any of them),
    `node:NAME` or `role:ROLE` (groups with a rank there), else function names, files
    or the group's rank label."""
    needle = text.strip().lower()
    if not needle:
        return True
    intervals = rank_intervals(needle)
    if intervals is not None:
        return any(lo <= r <= hi for r in group.ranks for lo, hi in intervals)
    key, colon, value = needle.partition(":")
    if colon and key in ("node", "role") and value:
        field = "node" if key == "node" else "role"
        return any(value in str(getattr(m, field) or "").lower() for m in group.members)
    if needle in group.label:
        return True
    return any(needle in f.function.lower() or needle in f.file.lower() for f in group.frames)


class RankGroupTable(VimTable):
    """Rows are keyed by the group's index, so marks and filters never rebuild cells."""

    class ViewChanged(Message):
        """The table's height or scroll changed: the rows out of view may have too."""

    row_noun = "group"
    cut_columns = ("where",)  # the group's whole stack is beside it (enter)

    def on_mount(self) -> None:
        self.cursor_type = "row"
        self.zebra_stripes = True
        self.add_column(" ", key="mark", width=1)
        self.add_column("RANKS", key="ranks")  # widths follow the content
        self.add_column("N", key="size")
        self.add_column("WHERE", key="where")
        self.groups: list[RankGroup] = []
        self.shown: list[int] = []

    def show_groups(self, groups: list[RankGroup], marked: list[int], text_filter: str) -> None:
        self.groups = groups
        with self.app.batch_update():
            self.clear()
            self.shown = [i for i, g in enumerate(groups) if group_matches(g, text_filter)]
            for i in self.shown:
                g = groups[i]
                ranks = Text(g.label, style="bold yellow" if g.outlier else "")
                where = Text(short_where(g.frames))
                if g.outlier:
                    where.append("  outlier", style="yellow")
                if any(m.progressing for m in g.members):
                    where.append("  moving", style="green")
                self.add_row(MARK if i in marked else "", ranks, str(g.size), where, key=str(i))

    def on_resize(self) -> None:
        super().on_resize()
        self.post_message(self.ViewChanged())

    def watch_scroll_y(self, old_value: float, new_value: float) -> None:
        super().watch_scroll_y(old_value, new_value)
        if round(old_value) != round(new_value):
            self.post_message(self.ViewChanged())

    def rows_below(self) -> int:
        """Rows under the table's bottom edge (scrolled out of view below)."""
        visible = max(0, self.scrollable_content_region.height - self.header_height)
        return max(0, self.row_count - int(self.scroll_y) - visible)

    def set_marks(self, marked: list[int]) -> None:
        for i in self.shown:
            self.update_cell(str(i), "mark", MARK if i in marked else "")

    @property
    def current_group(self) -> int | None:
        if not self.shown or self.cursor_row < 0 or self.cursor_row >= len(self.shown):
            return None
        return self.shown[self.cursor_row]

    def select_group(self, index: int) -> bool:
        if index not in self.shown:
            return False
        self.move_cursor(row=self.shown.index(index))
        return True
