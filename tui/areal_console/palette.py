"""Command palette (ctrl+p): screens, actions, nodes and ranks, plus entries other screens add."""

from __future__ import annotations

from collections.abc import Callable
from functools import partial
from typing import TYPE_CHECKING, Any

from textual.command import DiscoveryHit, Hit, Hits, Provider

from areal_console.navigation import SCREENS
from areal_console.screens.cluster import ClusterScreen

if TYPE_CHECKING:
    from areal_console.app import ConsoleApp

Entry = tuple[str, str, Callable[[], Any]]


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
        for view in app.monitor.snapshot():
            entries.append((f"Node {view.name} ({view.state})", view.error or view.address,
                            partial(self._show_node, view.name)))  # fmt: skip
            for proc in view.processes:
                if proc.rank is None:
                    continue
                entries.append((
                    f"Rank {proc.rank} on {view.name} (pid {proc.pid})",
                    f"{proc.role or 'process'}: {proc.cmdline[:60]}",
                    partial(self._show_process, view.name, proc.pid),
                ))  # fmt: skip
        for source in app.palette_sources:
            entries.extend(source())
        return entries

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
        for label, help_text, action in self._entries():
            score = matcher.match(label)
            if score > 0:
                yield Hit(score, matcher.highlight(label), action, help=help_text)
