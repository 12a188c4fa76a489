"""SVG snapshots of each screen at a fixed size, from recorded data (no clock, no host names)."""

from __future__ import annotations

from areal_console.app import ConsoleApp
from recorded import recorded_monitor


def test_cluster_screen_snapshot(snap_compare) -> None:  # type: ignore[no-untyped-def]
    app = ConsoleApp(None, recorded_monitor())
    assert snap_compare(app, terminal_size=(130, 36))
