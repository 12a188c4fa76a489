"""The Textual application shell, shared by the CLI, the tests and the screenshot script."""

from __future__ import annotations

from typing import Any, Protocol

from textual.app import App
from textual.binding import Binding

from areal_console.core.fleet import Fleet
from areal_console.core.monitor import FleetMonitor, NodeView
from areal_console.core.targets import NodeSpec
from areal_console.screens.cluster import ClusterScreen
from areal_console.screens.help import HelpScreen


class Monitor(Protocol):
    def start(self) -> None: ...
    def stop(self) -> None: ...
    def snapshot(self) -> list[NodeView]: ...
    def set_include_all(self, include_all: bool) -> None: ...


class ConsoleApp(App[None]):
    """areal-console: live GPUs and ranks of a training job, one key from a diagnosis."""

    TITLE = "areal-console"
    ENABLE_COMMAND_PALETTE = True
    BINDINGS = [
        Binding("q", "quit", "Quit", id="app.quit", tooltip="Leave the console"),
        Binding(
            "question_mark", "help", "Help", id="app.help", tooltip="Show every key of this screen"
        ),
    ]

    def __init__(
        self,
        fleet: Fleet | None,
        monitor: Monitor | None = None,
        *,
        read_only: bool = False,
        refresh_interval: float = 1.0,
    ) -> None:
        super().__init__()
        self.fleet = fleet
        if monitor is None:
            if fleet is None:
                raise ValueError("ConsoleApp needs a fleet or a monitor")
            monitor = FleetMonitor(fleet, interval=refresh_interval)
        self.monitor: Monitor = monitor
        self.read_only = read_only
        self.refresh_interval = refresh_interval

    def on_mount(self) -> None:
        self.monitor.start()
        self.push_screen(ClusterScreen(refresh_interval=self.refresh_interval))

    def on_unmount(self) -> None:
        self.monitor.stop()
        if self.fleet is not None:
            self.fleet.close()

    def action_help(self) -> None:
        if isinstance(self.screen, HelpScreen):
            return
        own: list[tuple[str, str, str]] = []
        generic: list[tuple[str, str, str]] = []
        for key, active in self.active_bindings.items():
            binding = active.binding
            if not binding.description:
                continue
            # The console's own keys (they carry ids) first, widget navigation after.
            (own if binding.id else generic).append(
                (key, binding.description, binding.tooltip or "")
            )
        rows = own + generic
        title = f"Keys — {self.screen.__class__.__name__.removesuffix('Screen')}"
        self.push_screen(HelpScreen(title, rows))


def create_app(specs: list[NodeSpec], **options: Any) -> ConsoleApp:
    """The app on live nodes (the CLI's path)."""
    fleet_options = {k: options.pop(k) for k in ("accept_new_hosts",) if k in options}
    return ConsoleApp(Fleet(specs, **fleet_options), **options)
