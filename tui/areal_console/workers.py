"""Background work in the Textual layer, done one way.

- `@background(group, doing=..., retry=...)` makes a method a thread worker: exclusive in
  its group (a new request cancels the older one), `exit_on_error=False`, and the method
  receives a `Ticket` as its first argument.
- The worker never touches widgets: it posts a `Reply` message (see `messages.py`) that
  carries its ticket. The handler calls `self.fresh(reply)` and drops replies that answer
  an older request than the newest of their group, so a slow, stale result never
  overwrites a fresh one.
- Long workers call `cancelled()` between steps and stop early.
- A worker that raises becomes a notification saying what failed, why, and what to do
  (`WorkerHost.on_worker_state_changed`); nothing is left spinning.
- `PollChain`: chained one-shot timers (the next poll is armed when the last one ended,
  so polls never overlap); a failed poll is retried with a growing delay instead of ending
  the chain, and a screen that is not shown does not poll until it is shown again.
"""

from __future__ import annotations

import functools
from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Concatenate, ParamSpec, TypeVar

from textual.dom import DOMNode
from textual.screen import ModalScreen, Screen
from textual.timer import Timer
from textual.worker import Worker, WorkerState, get_current_worker

from areal_console.core.common.errors import UserError
from areal_console.toast import toast

P = ParamSpec("P")
H = TypeVar("H", bound="WorkerHost")


@dataclass(frozen=True)
class Ticket:
    """Which request a worker answers: its group and the group's request number."""

    group: str
    number: int


@dataclass(frozen=True)
class WorkPlan:
    """How to talk about a group's work when it fails."""

    doing: str
    retry: str


def cancelled() -> bool:
    """In a worker thread: has this worker been cancelled (a newer request, screen gone)?"""
    try:
        return get_current_worker().is_cancelled
    except RuntimeError:  # not in a worker (a direct call from a test)
        return False


def failure_text(plan: WorkPlan | None, error: BaseException | None, group: str) -> str:
    """One line for the user: what failed, why, and what to do about it."""
    doing = plan.doing if plan else group
    if error is None:
        why = "unknown error"
    elif isinstance(error, UserError | OSError):
        why = str(error) or error.__class__.__name__
    else:
        why = f"{error.__class__.__name__}: {error}" if str(error) else error.__class__.__name__
    retry = plan.retry if plan and plan.retry else "try again; if it keeps failing, check the node"
    return f"{doing[:1].upper()}{doing[1:]} failed: {why}. {retry[:1].upper()}{retry[1:]}."


if TYPE_CHECKING:
    _HostBase = DOMNode
else:
    # Not a DOMNode at run time: a DOMNode base would shift the tie-breakers of the App's
    # and screens' DEFAULT_CSS (they are numbered by position in the class's bases).
    _HostBase = object


class WorkerHost(_HostBase):
    """Mixed into a Screen or App ahead of it: `class RunsScreen(WorkerHost, Screen[None])`."""

    _tickets: dict[str, int]
    _plans: dict[str, WorkPlan]
    _chains: list[PollChain]
    _last_failure: dict[str, str]

    def _host_state(self) -> None:
        if "_tickets" not in self.__dict__:
            self._tickets, self._plans, self._chains, self._last_failure = {}, {}, [], {}

    def new_ticket(self, group: str) -> Ticket:
        """A new request in `group`: replies to earlier ones are stale from now on."""
        self._host_state()
        number = self._tickets.get(group, 0) + 1
        self._tickets[group] = number
        return Ticket(group, number)

    def fresh(self, reply: Any) -> bool:
        """Does `reply` (a `messages.Reply`) answer the newest request of its group?"""
        self._host_state()
        ticket: Ticket = reply.ticket
        return self._tickets.get(ticket.group) == ticket.number

    def on_worker_state_changed(self, event: Worker.StateChanged) -> None:
        self._host_state()
        worker = event.worker
        if event.state == WorkerState.ERROR:
            text = failure_text(self._plans.get(worker.group), worker.error, worker.group)
            # A poll that keeps failing the same way says so once, not every few seconds.
            if self._last_failure.get(worker.group) != text:
                self._last_failure[worker.group] = text
                toast(self, text, severity="error", timeout=10)
        elif event.state == WorkerState.SUCCESS:
            self._last_failure.pop(worker.group, None)
        for chain in self._chains:
            if chain.group == worker.group:
                chain.worker_ended(event.state)

    def on_screen_resume(self) -> None:
        self._host_state()
        for chain in self._chains:
            chain.resume()


def background(
    group: str, *, doing: str, retry: str = "", exclusive: bool = True
) -> Callable[
    [Callable[Concatenate[H, Ticket, P], object]], Callable[Concatenate[H, P], Worker[Any]]
]:
    """Run the decorated method in a thread worker of `group` with a fresh `Ticket`.

    `doing` ("reading the jobs") and `retry` ("press r to refresh") make the failure
    notification; `exclusive=False` lets requests of the group run side by side (stopping
    several jobs), each still with its own ticket.
    """

    def decorate(
        method: Callable[Concatenate[H, Ticket, P], object],
    ) -> Callable[Concatenate[H, P], Worker[Any]]:
        @functools.wraps(method)
        def start(self: H, *args: P.args, **kwargs: P.kwargs) -> Worker[Any]:
            ticket = self.new_ticket(group)  # on the UI thread, before the worker runs
            self._plans[group] = WorkPlan(doing, retry)
            return self.run_worker(
                functools.partial(method, self, ticket, *args, **kwargs),
                name=method.__name__,
                group=group,
                description=f"{doing} (request {ticket.number})",
                exclusive=exclusive,
                exit_on_error=False,
                thread=True,
            )

        return start

    return decorate


class PollChain:
    """Poll with `start()` every `interval` seconds while `host` is shown.

    The next poll is armed when the worker of `group` ended (success or failure), never on
    a fixed clock, so a slow poll is not stacked on. After a failure the delay doubles up
    to `max_interval`; the first success brings it back. While the host screen is not the
    one shown (another mode, or a full screen pushed over it; dialogs don't count), a due
    poll is skipped and made as soon as the screen is shown again.
    """

    def __init__(
        self,
        host: WorkerHost,
        start: Callable[[], object],
        *,
        group: str,
        interval: float,
        max_interval: float = 30.0,
    ) -> None:
        self.host = host
        self.start = start
        self.group = group
        self.interval = interval
        self.max_interval = max(max_interval, interval)
        self.failures = 0
        self.paused = False
        self.polls = 0
        self._timer: Timer | None = None
        host._host_state()
        host._chains.append(self)

    @property
    def delay(self) -> float:
        if not self.failures:
            return self.interval
        return min(self.max_interval, self.interval * 2**self.failures)

    def worker_ended(self, state: WorkerState) -> None:
        if state == WorkerState.SUCCESS:
            self.failures = 0
        elif state == WorkerState.ERROR:
            self.failures += 1
        else:
            return  # cancelled: the request that replaced it arms the next poll
        if self._timer is not None:
            self._timer.stop()
        self._timer = self.host.set_timer(self.delay, self._due)

    def _shown(self) -> bool:
        """The host screen is on top, or under dialogs only (it is still seen, dimmed)."""
        host = self.host
        if not isinstance(host, Screen):
            return True
        try:
            stack = host.app.screen_stack
        except Exception:  # the app is shutting down
            return False
        if host not in stack:
            return False  # another mode's screen is shown
        return all(isinstance(s, ModalScreen) for s in stack[stack.index(host) + 1 :])

    def _due(self) -> None:
        self._timer = None
        if not self._shown():
            self.paused = True
            return
        self.polls += 1
        self.start()

    def resume(self) -> None:
        """The host is shown again: poll now if a poll fell due while it was hidden."""
        if self.paused:
            self.paused = False
            self.polls += 1
            self.start()
