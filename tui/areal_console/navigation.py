"""The top-level screens: mode name, title, number key and `:` aliases.

Shared by the app (keys and `:` commands), the command palette and the help screen; its
own module so the palette need not import the app.
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class ScreenEntry:
    """A top-level screen: its mode name, title and number key."""

    mode: str
    title: str
    key: str
    aliases: tuple[str, ...] = ()


SCREENS = (
    ScreenEntry("nodes", "Cluster", "1", ("cluster", "n")),
    ScreenEntry("stacks", "Stacks", "2", ("stack", "s")),
    ScreenEntry("batches", "Batches", "3", ("batch", "b")),
    ScreenEntry("jobs", "Runs", "4", ("job", "j")),
    ScreenEntry("health", "Health", "5", ("metrics",)),
)
