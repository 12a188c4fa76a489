"""The one background-work pattern (areal_console.workers): stale replies are dropped,
failures become notifications that say what to do, poll chains survive errors and pause
while their screen is hidden."""

from __future__ import annotations

import threading
import time
from dataclasses import dataclass

from areal_console.core.common.errors import UserError
from areal_console.messages import Reply
from areal_console.screens.runs import RunsScreen
from areal_console.workers import PollChain, Ticket, WorkerHost, background, cancelled
from textual import on
from textual.screen import Screen
from textual.widgets import Label

from tests.support import recorded
from tests.support.screens import ScreenHost
from tests.support.waits import until


@dataclass
class Answer(Reply):
    value: str


class Lookup(WorkerHost, Screen[None]):
    """Looks a value up in a worker; `gates` hold a request back until the test says go."""

    def __init__(self) -> None:
        super().__init__()
        self.gates: dict[str, threading.Event] = {}
        self.shown: list[str] = []
        self.dropped: list[str] = []
        self.saw_cancel: list[str] = []
        self.running: list[str] = []

    def compose(self):  # type: ignore[no-untyped-def]
        yield Label("", id="value")

    @background("lookup", doing="looking the value up", retry="press l to look again")
    def look_up(self, ticket: Ticket, value: str) -> None:
        self.running.append(value)
        gate = self.gates.get(value)
        if gate is not None:
            gate.wait(10)
        if cancelled():
            self.saw_cancel.append(value)
        if value == "boom":
            raise UserError("the node said no")
        if value == "crash":
            raise ZeroDivisionError("division by zero")
        self.post_message(Answer(value, ticket=ticket))

    @on(Answer)
    def _answer(self, message: Answer) -> None:
        if not self.fresh(message):
            self.dropped.append(message.value)
            return
        self.shown.append(message.value)


async def test_a_slow_stale_answer_never_overwrites_a_fresh_one() -> None:
    screen = Lookup()
    async with ScreenHost(screen).run_test() as pilot:
        screen.gates["old"] = threading.Event()
        screen.look_up("old")  # slow: held at its gate
        await until(pilot, lambda: screen.running == ["old"])
        screen.look_up("new")  # the newer request of the same group
        await until(pilot, lambda: screen.shown == ["new"])
        screen.gates["old"].set()  # now the old one finishes and posts its answer
        await until(pilot, lambda: screen.dropped == ["old"])
        assert screen.shown == ["new"]
        assert screen.saw_cancel == ["old"]  # exclusive: the old worker was cancelled


async def test_a_failing_worker_becomes_an_actionable_notification() -> None:
    screen = Lookup()
    app = ScreenHost(screen)
    async with app.run_test() as pilot:
        screen.look_up("boom")
        await until(pilot, lambda: app._notifications)
        texts = [n.message for n in app._notifications]
        assert texts == ["Looking the value up failed: the node said no. Press l to look again."]
        assert [n.severity for n in app._notifications] == ["error"]
        screen.look_up("crash")  # an unexpected error names its type
        await until(pilot, lambda: len(app._notifications) == 2)
        assert "ZeroDivisionError: division by zero" in list(app._notifications)[-1].message
        screen.look_up("fine")  # and the screen keeps working
        await until(pilot, lambda: screen.shown == ["fine"])


class Polled(WorkerHost, Screen[None]):
    """Polls every 0.02 s; the first `fail` polls raise."""

    def __init__(self, fail: int) -> None:
        super().__init__()
        self.fail = fail
        self.calls = 0
        self.chain = PollChain(self, self.poll, group="poll", interval=0.02, max_interval=0.1)

    def on_mount(self) -> None:
        self.poll()

    @background("poll", doing="polling", retry="wait")
    def poll(self, ticket: Ticket) -> None:
        self.calls += 1
        if self.calls <= self.fail:
            raise OSError("connection reset")


async def test_a_poll_chain_survives_errors_backs_off_and_pauses_when_hidden() -> None:
    screen = Polled(fail=3)
    app = ScreenHost(screen)
    async with app.run_test() as pilot:
        await until(pilot, lambda: screen.calls >= 2)
        assert screen.chain.failures >= 1 and screen.chain.delay > screen.chain.interval
        await until(pilot, lambda: screen.calls >= 6)  # kept polling through 3 failures
        assert screen.chain.failures == 0 and screen.chain.delay == screen.chain.interval
        # The same failure three times in a row is told once.
        assert [n.message for n in app._notifications] == [
            "Polling failed: connection reset. Wait."
        ]
        app.push_screen(Screen())  # hide it
        await until(pilot, lambda: screen.chain.paused)
        hidden_at = screen.calls
        await pilot.pause(0.3)  # fifteen intervals: a running chain would have polled
        assert screen.calls == hidden_at
        app.pop_screen()
        await until(pilot, lambda: screen.calls > hidden_at + 2)
        assert not screen.chain.paused


async def test_the_hidden_jobs_screen_stops_asking_the_nodes() -> None:
    app = recorded.jobs_app()
    fleet = app.fleet
    assert fleet is not None
    asked = []
    real_call_all = fleet.call_all

    def counting(*args, **kwargs):  # type: ignore[no-untyped-def]
        asked.append(time.monotonic())
        return real_call_all(*args, **kwargs)

    fleet.call_all = counting  # type: ignore[method-assign]
    app.screen_factories["jobs"] = lambda: RunsScreen(fleet, poll=0.05)
    async with app.run_test(size=recorded.SIZE) as pilot:
        await pilot.press("4")
        await until(pilot, lambda: len(asked) >= 3)
        jobs_screen = app.screen
        assert isinstance(jobs_screen, RunsScreen)
        await pilot.press("1")
        await until(pilot, lambda: jobs_screen.polls.paused)
        hidden_at = len(asked)
        await pilot.pause(0.4)  # eight poll intervals
        assert len(asked) == hidden_at
        await pilot.press("4")
        await until(pilot, lambda: len(asked) >= hidden_at + 2)
