"""The `/` filter of a screen: one box, one behaviour everywhere.

`/` opens the box and focuses it; every keystroke filters (the screen redraws); enter goes
back to the screen's table, the filter staying on; escape clears the filter and closes the
box, and only an escape with no filter left is the screen's own (back, close). A screen
yields a `FilterInput` and mixes in `FilterHost`, which keeps `text_filter` in step with the
box and calls the screen's `filter_changed` to redraw.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

from textual import on
from textual.message import Message
from textual.widgets import Input

if TYPE_CHECKING:
    from textual.dom import DOMNode

    _HostBase = DOMNode
else:
    # Not a DOMNode at run time (as WorkerHost): a DOMNode base would shift the tie-breakers
    # of the screens' DEFAULT_CSS.
    _HostBase = object


class FilterInput(Input):
    """A screen's filter box, hidden until opened."""

    DEFAULT_CSS = """
    FilterInput { display: none; }
    FilterInput.-open { display: block; }
    """

    @dataclass
    class Filtered(Message):
        """The filter's text changed (surrounding spaces dropped)."""

        filter_input: FilterInput
        text: str

        @property
        def control(self) -> FilterInput:
            return self.filter_input

    def __init__(
        self, placeholder: str, *, id: str, back_to: str, hide_on_enter: bool = False
    ) -> None:
        """`back_to`: a selector of the widget that takes the focus back (enter, escape).
        `hide_on_enter`: enter also hides the box (for a screen that shows the filter
        elsewhere, in its status line)."""
        super().__init__(placeholder=placeholder, id=id)
        self.back_to = back_to
        self.hide_on_enter = hide_on_enter

    @property
    def text(self) -> str:
        return self.value.strip()

    @property
    def is_open(self) -> bool:
        return self.has_class("-open")

    def open(self) -> None:
        self.add_class("-open")
        self.screen.set_focus(self)  # now, not later: keys typed right after / belong here

    def close(self) -> bool:
        """Clear and close the box; False when it was closed and empty already."""
        if not (self.is_open or self.value):
            return False
        typing = self.has_focus
        with self.prevent(Input.Changed):  # the host redraws once, now (FilterHost)
            self.value = ""
        self.remove_class("-open")
        if typing:  # else the focus stays where the user put it
            self._focus_back()
        return True

    def set_text(self, text: str) -> None:
        """Filter by `text` without opening the box (the host sets its own filter)."""
        with self.prevent(Input.Changed):
            self.value = text

    @on(Input.Changed)
    def _changed(self, event: Input.Changed) -> None:
        event.stop()
        self.post_message(self.Filtered(self, self.text))

    @on(Input.Submitted)
    def _submitted(self, event: Input.Submitted) -> None:
        # Not stopped: a screen may do more on enter.
        if self.hide_on_enter:
            self.remove_class("-open")
        self._focus_back()

    def _focus_back(self) -> None:
        self.screen.query_one(self.back_to).focus()


class FilterHost(_HostBase):
    """Mixed into a Screen that yields one `FilterInput`: `class S(FilterHost, Screen[None])`.

    `text_filter` follows the box; `filter_changed` (the screen's) redraws for it.
    """

    text_filter: str = ""

    def filter_changed(self) -> None:
        """Redraw for the new `text_filter`."""

    def action_filter(self) -> None:
        self.query_one(FilterInput).open()

    def on_filter_input_filtered(self, message: FilterInput.Filtered) -> None:
        self.text_filter = message.text
        self.filter_changed()

    def close_filter(self) -> bool:
        """escape's first duty: clear the filter and close its box. False when there was
        neither (the screen's own escape goes on)."""
        if not self.query_one(FilterInput).close():
            return False
        self.text_filter = ""
        self.filter_changed()
        return True

    def set_filter(self, text: str) -> None:
        """Filter by `text` as if typed (the caller redraws)."""
        self.query_one(FilterInput).set_text(text)
        self.text_filter = text.strip()
