"""Equivalence classes of ranks: one keyed row per group, marks updated in place."""

from __future__ import annotations

from rich.text import Text
from textual.message import Message

from areal_console.core.common.rank_filter import RankFilter, parse_filter
from areal_console.core.stacks.diagnose import short_where
from areal_console.core.stacks.merge import RankGroup
from areal_console.widgets.vim_table import VimTable

MARK = "●"


def group_matches(group: RankGroup, text: str | RankFilter) -> bool:
    """`/` filter: a rank set (`2049`, `0-15,4095`: the groups holding any of them),
    `node:NAME` or `role:ROLE` (groups with a rank there), else function names, files
    or the group's rank label."""
    wanted = parse_filter(text) if isinstance(text, str) else text
    needle = wanted.text
    if not needle:
        return True
    if wanted.ranks is not None:
        return any(wanted.has_rank(r) for r in group.ranks)
    if wanted.node is not None:
        return any(wanted.has_node(str(m.node or "")) for m in group.members)
    if wanted.role is not None:
        return any(m.role is not None and wanted.has_role(m.role) for m in group.members)
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
            wanted = parse_filter(text_filter)
            self.shown = [i for i, g in enumerate(groups) if group_matches(g, wanted)]
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
