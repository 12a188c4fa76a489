"""`enter` on a process: everything about it the table cuts or leaves out, and its stack
one key away (`s`; `n` with native frames, `l` with local variables)."""

from __future__ import annotations

from typing import Any

from rich.text import Text
from textual import on
from textual.app import ComposeResult
from textual.binding import Binding
from textual.containers import VerticalScroll
from textual.screen import ModalScreen
from textual.widgets import Static

from areal_console.core.common.textfmt import format_bytes
from areal_console.core.connection.fleet import Fleet
from areal_console.core.connection.records import ProcessRow
from areal_console.core.stacks.parsing import ProcessDump
from areal_console.core.stacks.records import Thread
from areal_console.messages import ProcessStack
from areal_console.widgets.remote_text import remote_text
from areal_console.workers import Ticket, WorkerHost, background


def describe_process(node: str, p: ProcessRow) -> Text:
    """The full record: identity, resources, rank variables and the whole command line."""
    text = Text()

    def row(label: str, value: Any) -> None:
        text.append(f"{label:<13}", style="bold")
        text.append_text(remote_text(f"{'-' if value is None or value == '' else value}"))
        text.append("\n")

    rank, world = p.rank, p.world_size
    row("node", node)
    row("pid", f"{p.pid}  (parent {'-' if p.ppid is None else p.ppid})")
    row("rank", f"{rank} of world size {world}" if rank is not None else None)
    row("local rank", p.local_rank)
    row("role", p.role)
    row("state", p.state)
    row("CPU", None if p.cpu_percent is None else f"{p.cpu_percent:.0f}%")
    row("RSS", format_bytes(p.rss))
    gpus = ",".join(map(str, p.gpus)) or None
    row("GPUs", gpus)
    row("GPU memory", format_bytes(p.gpu_memory) if p.gpu_memory is not None else
        ("not reported (no NVML on the node)" if gpus else None))  # fmt: skip
    text.append("\nenvironment (rank variables)\n", style="bold")
    if p.env:
        for key in sorted(p.env):
            text.append_text(remote_text(f"  {key}={p.env[key]}"))
            text.append("\n")
    else:
        text.append_text(remote_text(f"  {p.env_error or 'none set'}", style="dim"))
        text.append("\n")
    text.append("\ncommand line\n", style="bold")
    text.append_text(remote_text(p.cmdline))
    return text


def describe_stack(threads: list[Thread]) -> Text:
    """Every thread's frames, innermost first (as py-spy prints them), with any --locals."""
    text = Text()
    for t in threads:
        text.append(f"\nThread {t.tid} ({t.name}){'  idle' if t.idle else ''}\n", style="bold")
        for i, frame in enumerate(t.frames):
            text.append_text(remote_text(f"  {frame.function} ", style="cyan"))
            text.append_text(remote_text(f"({frame.file}:{frame.line})", style="dim"))
            text.append("\n")
            for var in t.variables(i):
                kind = "arg" if var.arg else "local"
                text.append_text(remote_text(f"      {kind} {var.name} = {var.repr}", "dim"))
                text.append("\n")
    return text


class ProcessDetailScreen(WorkerHost, ModalScreen[None]):
    """One process in full; `s` dumps its stack with py-spy through its node's agent."""

    DEFAULT_CSS = """
    ProcessDetailScreen { align: center middle; }
    ProcessDetailScreen > VerticalScroll {
        width: 95%; max-width: 140; height: auto; max-height: 95%;
        border: thick $accent; background: $surface; padding: 0 1;
    }
    ProcessDetailScreen #process-hint { color: $text-muted; }
    """
    BINDINGS = [
        Binding("s", "stack", "Stack", id="process.stack",
                tooltip="Dump this process's stack now (py-spy)"),
        Binding("n", "stack('native')", "Native stack", id="process.native",
                tooltip="Dump it with C/C++ frames too (py-spy --native: NCCL under a collective)"),
        Binding("l", "stack('locals')", "Locals", id="process.locals",
                tooltip="Dump it with each frame's local variables (py-spy --locals)"),
        Binding("escape,q", "dismiss", "Close", id="process.close", tooltip="Back to the table"),
    ]  # fmt: skip

    def __init__(self, fleet: Fleet | None, node: str, process: ProcessRow) -> None:
        super().__init__()
        self.fleet = fleet
        self.node = node
        self.process = process

    def compose(self) -> ComposeResult:
        with VerticalScroll():
            yield Static(describe_process(self.node, self.process), id="process-info")
            yield Static("s stack · n with native frames · l with locals · esc back",
                         id="process-hint")  # fmt: skip
            yield Static("", id="process-stack")

    def action_stack(self, mode: str = "") -> None:
        if self.fleet is None:
            self.query_one("#process-stack", Static).update(
                Text("No live node: this console shows recorded data.", style="yellow")
            )
            return
        self.query_one("#process-stack", Static).update(Text("dumping…", style="dim"))
        self._dump(mode)

    @background("process-stack", doing="dumping the process's stack", retry="press s again")
    def _dump(self, ticket: Ticket, mode: str) -> None:
        assert self.fleet is not None
        pid = self.process.pid
        args = {"pids": [pid], "timeout": 15.0, "native": mode == "native",
                "locals": mode == "locals"}  # fmt: skip
        reply = self.fleet.session(self.node).call("pyspy", args, timeout=45)
        dump = ProcessDump.from_agent(reply, pid)
        if dump.error is not None:
            text = remote_text(f"no stack: {dump.error}", style="yellow")
            self.post_message(ProcessStack(text, ticket=ticket))
            return
        title = {"native": " (with native frames)", "locals": " (with locals)"}.get(mode, "")
        text = Text(f"stack of pid {dump.pid}{title}", style="bold")
        text.append_text(describe_stack(dump.threads))
        self.post_message(ProcessStack(text, ticket=ticket))

    @on(ProcessStack)
    def _stack_dumped(self, message: ProcessStack) -> None:
        if self.fresh(message):
            self.query_one("#process-stack", Static).update(message.text)

    async def action_dismiss(self, result: None = None) -> None:
        self.dismiss(result)
