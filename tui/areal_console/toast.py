"""The one way the console shows a notification (a toast)."""

from __future__ import annotations

from textual.message_pump import MessagePump
from textual.notifications import SeverityLevel

from areal_console.core.common.textfmt import printable


def toast(
    node: MessagePump,
    message: object,
    *,
    title: object = "",
    severity: SeverityLevel = "information",
    timeout: float | None = None,
) -> None:
    """The one way a screen, dialog or the app shows a notification. Toasts carry remote
    text (a recorded metric's name, a node's error, a job id from a record file), and
    Textual reads a toast's message as markup by default: `x[/]` raised a MarkupError that
    ended the console, `[@click=app.quit]` became a live action. Here the message and title
    are escaped like every other remote text and never read as markup. Thread-safe, as
    `App.notify` is."""
    node.app.notify(
        printable(message, layout=True),
        title=printable(title),
        severity=severity,
        timeout=timeout,
        markup=False,
    )
