"""Confirm an unknown SSH host key: the fingerprint is shown; `y` trusts it, `n` refuses."""

from __future__ import annotations

from textual.app import ComposeResult
from textual.binding import Binding
from textual.containers import Vertical
from textual.screen import ModalScreen
from textual.widgets import Static

from areal_console.widgets.remote_text import remote_block, remote_text


class HostKeyScreen(ModalScreen[bool]):
    DEFAULT_CSS = """
    HostKeyScreen { align: center middle; }
    HostKeyScreen > Vertical {
        width: 80; height: auto; border: thick $warning; background: $surface; padding: 1 2;
    }
    HostKeyScreen #question { margin-top: 1; text-style: bold; }
    """
    BINDINGS = [
        Binding("y", "answer(True)", "Trust", id="hostkey.trust",
                tooltip="Remember this host key in the console's known_hosts and connect"),
        Binding("n,escape", "answer(False)", "Refuse", id="hostkey.refuse",
                tooltip="Do not connect; the node stays down"),
    ]  # fmt: skip

    def __init__(self, node: str, address: str, key: str) -> None:
        super().__init__()
        self.node, self.address, self.key = node, address, key

    def compose(self) -> ComposeResult:
        with Vertical():
            who = remote_text(self.node, style="bold")
            who.append_text(remote_text(f" ({self.address}) presented a host key this console "
                                        "has not seen before:"))  # fmt: skip
            yield Static(who)
            yield Static(remote_block(f"\n  {self.key}\n"), id="fingerprint")
            yield Static("Compare it with the node's key (ssh-keygen -lf /etc/ssh/ssh_host_*_key.pub "
                         "on the node) before trusting it.")  # fmt: skip
            yield Static("Trust this key and connect? [y/n]", id="question")

    def action_answer(self, trust: bool) -> None:
        self.dismiss(trust)
