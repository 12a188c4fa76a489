"""Command palette (ctrl+p): screens, actions, nodes and ranks, plus entries other screens add."""

from __future__ import annotations

import re
from collections.abc import Callable
from functools import partial
from typing import TYPE_CHECKING, Any

from textual.command import DiscoveryHit, Hit, Hits, Provider

from areal_console.navigation import SCREENS
from areal_console.screens.cluster import ClusterScreen

if TYPE_CHECKING:
    from areal_console.app import ConsoleApp

Entry = tuple[str, str, Callable[[], Any]]
MAX_SCORED = 200  # entries scored and drawn for one search (a 4,096-rank job has 4,096)


class ConsoleCommands(Provider):
    """Everything the console can jump to or do, searchable by name."""

    def _entries(self) -> list[Entry]:
        app: ConsoleApp = self.app  # type: ignore[assignment]
        entries: list[Entry] = []
        for screen in SCREENS:
            entries.append((f"Go to {screen.title}", f"key {screen.key}, or :{screen.mode}",
                            partial(app.action_goto, screen.mode)))  # fmt: skip
        entries.append(("Toggle dark/light theme", "ctrl+t", app.action_toggle_theme))
        entries.append(("Show keys of this screen", "?", app.action_help))
        shown = "only your" if app.users.everyone else "every user's"
        entries.append((f"Show {shown} captures and runs",
                        f"now: {app.users.describe()} (u on the Runs screen)",
                        app.action_toggle_users))  # fmt: skip
        entries += self._fleet_entries()
        for source in app.palette_sources:
            entries.extend(source())
        return entries

    def _fleet_entries(self) -> list[Entry]:
        """One entry per node and per rank, made once per palette opening: at 512 nodes
        that is 4,608 entries, and a search runs on every key pressed."""
        made: list[Entry] | None = getattr(self, "_fleet", None)
        if made is not None:
            return made
        app: ConsoleApp = self.app  # type: ignore[assignment]
        made = []
        for view in app.monitor.snapshot():
            made.append((f"Node {view.name} ({view.state})", view.error or view.address,
                         partial(self._show_node, view.name)))  # fmt: skip
            for proc in view.processes:
                if proc.rank is None:
                    continue
                made.append((
                    f"Rank {proc.rank} on {view.name} (pid {proc.pid})",
                    f"{proc.role or 'process'}: {proc.cmdline[:60]}",
                    partial(self._show_process, view.name, proc.pid),
                ))  # fmt: skip
        self._fleet = made
        return made

    def _show_node(self, name: str) -> None:
        app: ConsoleApp = self.app  # type: ignore[assignment]
        app.action_goto("nodes")
        screen = app.screen
        if isinstance(screen, ClusterScreen):
            screen.show_node(name)

    def _show_process(self, node: str, pid: int) -> None:
        app: ConsoleApp = self.app  # type: ignore[assignment]
        app.action_goto("nodes")
        screen = app.screen
        if isinstance(screen, ClusterScreen):
            screen.show_node(node, text_filter=str(pid))

    async def startup(self) -> None:
        """The palette opened: refresh the saved captures in the background; searches use
        the list the app holds (no disk reads on the UI thread per keystroke)."""
        app: ConsoleApp = self.app  # type: ignore[assignment]
        app.refresh_saved_captures()

    async def discover(self) -> Hits:
        for label, help_text, action in self._entries()[:12]:
            yield DiscoveryHit(label, action, help=help_text)

    async def search(self, query: str) -> Hits:
        matcher = self.matcher(query)
        # The fuzzy matcher scores a label only when the query's letters appear in it in
        # order (case aside): a regex says which at C speed, and only those are scored.
        needle = query.lower()
        possible = re.compile(".*?".join(map(re.escape, needle)), re.DOTALL).search
        found = [e for e in self._entries() if possible(e[0].lower()) is not None]
        if len(found) > MAX_SCORED:
            # A short query ("rank") matches every rank of a large job: score and draw the
            # labels that hold it whole first, shortest first, and say how many are left.
            found.sort(key=lambda e: (needle not in e[0].lower(), len(e[0])))
            more = len(found) - MAX_SCORED
            found = found[:MAX_SCORED]
            yield Hit(0.01, f"... {more:,} more entries match: type more of the name",
                      self._nothing, help="the palette scores the first 200")  # fmt: skip
        for label, help_text, action in found:
            score = matcher.match(label)
            if score > 0:
                yield Hit(score, matcher.highlight(label), action, help=help_text)

    def _nothing(self) -> None:
        """The "more entries" line: choosing it does nothing."""
