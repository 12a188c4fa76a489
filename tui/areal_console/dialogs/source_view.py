"""`o` on a frame: the source lines around it, when the file is on this machine."""

from __future__ import annotations

from rich.syntax import Syntax
from rich.text import Text
from textual.app import ComposeResult
from textual.binding import Binding
from textual.containers import VerticalScroll
from textual.message import Message
from textual.screen import ModalScreen
from textual.widgets import Label, Static

from areal_console.core.stacks.records import Frame, Variable
from areal_console.core.stacks.source import SourceSnippet, read_snippet
from areal_console.widgets.remote_text import remote_line, remote_text
from areal_console.workers import Ticket, WorkerHost, background


class SourceViewScreen(WorkerHost, ModalScreen[None]):
    """A snippet around `frame.line`, read in a worker; esc, q or o closes it."""

    DEFAULT_CSS = """
    SourceViewScreen { align: center middle; }
    SourceViewScreen > VerticalScroll {
        width: 90%; max-width: 130; height: auto; max-height: 90%;
        border: thick $accent; background: $surface; padding: 0 1;
    }
    SourceViewScreen #source-title { text-style: bold; padding: 0 0 1 0; }
    """
    BINDINGS = [
        Binding(
            "escape,q,o", "dismiss", "Close", id="source.close", tooltip="Close the source view"
        ),
    ]

    class Loaded(Message):
        def __init__(self, snippet: SourceSnippet) -> None:
            super().__init__()
            self.snippet = snippet

    def __init__(
        self,
        frame: Frame,
        context: int = 8,
        variables: list[tuple[str, tuple[Variable, ...]]] | None = None,
    ) -> None:
        super().__init__()
        self.frame = frame
        self.context = context
        self.variables = variables or []

    def compose(self) -> ComposeResult:
        with VerticalScroll():
            title = remote_text(f"{self.frame.function} — {self.frame.location}")
            yield Label(title, id="source-title")
            yield Static("reading…", id="source-body")
            if self.variables:
                text = Text()
                for who, variables in self.variables:
                    text.append(f"\nlocals of {who}\n", style="bold")
                    for v in variables:
                        kind = "arg  " if v.arg else "local"
                        text.append_text(remote_text(f"  {kind} {v.name} = {v.repr}"))
                        text.append("\n")
                yield Static(text, id="source-locals")

    def on_mount(self) -> None:
        self._read()

    @background("source-read", doing="reading the source file", retry="press o to try again")
    def _read(self, ticket: Ticket) -> None:
        self.post_message(self.Loaded(read_snippet(self.frame.file, self.frame.line, self.context)))

    def on_source_view_screen_loaded(self, message: Loaded) -> None:
        body = self.query_one("#source-body", Static)
        snippet = message.snippet
        if snippet.error:
            body.update(remote_text(snippet.error, style="yellow"))
            return
        body.update(
            Syntax(
                "\n".join(remote_line(line) for line in snippet.lines),
                "python",
                line_numbers=True,
                start_line=snippet.first,
                highlight_lines={snippet.line},
                theme="ansi_dark",
            )
        )

    async def action_dismiss(self, result: None = None) -> None:
        self.dismiss(result)
