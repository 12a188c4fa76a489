"""A scripted walk of `areal-console demo` at 80x24 and 160x45, as a new user would take it:
the real demo job (the reference trainer, hung in its cleanup), the real local agent, the
console driven with Pilot. Every documented key of every screen is pressed, and the walk
fails on a key that changes nothing on the screen, on a Python repr or a traceback shown
to the user, and on a word cut in a status column.

"Documented" is what `?` lists as the console's own keys (bindings with an id) on each
screen; the walk checks it pressed all of them.
"""

from __future__ import annotations

import re
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from areal_console.app import ConsoleApp, create_app
from areal_console.commands.demo import WELCOME
from areal_console.core.common.settings import Settings
from areal_console.core.metrics.locate import HealthTarget
from areal_console.core.replay.demo import DemoJob, new_demo
from areal_console.core.targets.resolve import local_node
from textual.pilot import Pilot
from textual.widgets import DataTable

pytestmark = pytest.mark.slow

REPR = re.compile(r"<[A-Za-z_][\w.]* (object )?at 0x[0-9a-fA-F]+>|Traceback \(most recent")
STATUS_COLUMNS = {"state", "verification", "exit"}
# Keys the walk cannot judge by a change on the screen, and why.
NOT_JUDGED = {
    "app.quit": "leaves the console (checked at the end: the app exits with status 0)",
    "app.interrupt": "ctrl+c leaves at once (tests/cluster/test_interrupts.py)",
}


@pytest.fixture(scope="module")
def demo() -> Iterator[DemoJob]:
    job = new_demo("cleanup", nproc=2, dump_steps=2)
    try:
        job.start()
        job.wait_ready(timeout=300)
        yield job
    finally:
        job.stop()
        job.remove_files()


def screen_text(app: ConsoleApp) -> str:
    """What the terminal shows now, as text (the screen's composed lines)."""
    return "\n".join(strip.text for strip in app.screen._compositor.render_strips())


class Walk:
    """Presses keys and checks the screen after each one."""

    def __init__(self, pilot: Pilot[None], app: ConsoleApp) -> None:
        self.pilot = pilot
        self.app = app
        self.problems: list[str] = []
        self.pressed: dict[str, set[str]] = {}  # screen class -> binding ids pressed
        self.documented: dict[str, set[str]] = {}

    def fingerprint(self) -> tuple[Any, ...]:
        app = self.app
        notes = tuple(n.identity for n in app._notifications)
        # The screen's text, plus what it shows only as colour: the highlighted row of the
        # focused table (moving it is a visible change even where no pane follows it).
        focused = app.screen.focused
        cursor = getattr(focused, "cursor_coordinate", None)
        return (id(app.screen), focused, cursor, app.theme, notes, screen_text(app))

    def _record(self, key: str) -> str:
        screen = type(self.app.screen).__name__
        own = {b.binding.id for b in self.app.active_bindings.values()
               if b.binding.id and b.binding.description}  # fmt: skip
        self.documented.setdefault(screen, set()).update(own)
        # Every binding of the key along the focus chain: a focused table's j (table.down)
        # is the screen's j (stacks.next_group) as well.
        ids = {b.id for _node, bindings in self.app.screen._binding_chain
               for b in bindings.key_to_bindings.get(key, []) if b.id}  # fmt: skip
        self.pressed.setdefault(screen, set()).update(ids or {key})
        return f"{screen}: {key}"

    async def press(self, *keys: str, did: Any = None, timeout: float = 20.0) -> None:
        """Press each key; it must change the screen, or (where its effect can end where it
        began, as enter reloading the step already shown) make `did()` true."""
        for key in keys:
            where = self._record(key)
            before = self.fingerprint()
            await self.pilot.press(key)
            await self.pilot.pause()
            deadline = time.monotonic() + timeout
            while not (did() if did is not None else self.fingerprint() != before):
                if time.monotonic() > deadline:
                    self.problems.append(f"{where} changed nothing on the screen")
                    break
                await self.pilot.pause(0.1)
            self.check(where)

    async def until(self, what: str, condition: Any, timeout: float = 120.0) -> None:
        deadline = time.monotonic() + timeout
        while not condition():
            if time.monotonic() > deadline:
                raise AssertionError(
                    f"timed out waiting for {what}; problems: {self.problems}; "
                    f"screen:\n{screen_text(self.app)}"
                )
            await self.pilot.pause(0.1)

    def check(self, where: str) -> None:
        # py-spy --locals shows variables as Python prints them ("x = <Foo at 0x..>"): data,
        # not the console failing to format something.
        text = "\n".join(line for line in screen_text(self.app).splitlines() if " = " not in line)
        found = REPR.search(text)
        if found:
            self.problems.append(f"{where}: a Python repr on screen: {found.group(0)!r}")
        for table in self.app.screen.query(DataTable):
            for key, column in table.columns.items():
                if str(key.value).lower() not in STATUS_COLUMNS:
                    continue
                room = column.content_width if column.auto_width else column.width
                for row in table.rows:
                    cell = str(table.get_cell(row, key))
                    if len(cell) > room:
                        self.problems.append(f"{where}: {cell!r} cut to {room} in {key.value}")


async def walk_the_demo(app: ConsoleApp, pilot: Pilot[None], job: DemoJob) -> Walk:
    w = Walk(pilot, app)
    screen = app.screen
    procs = screen.query_one("#processes", DataTable)
    await w.until("the demo's ranks", lambda: procs.row_count >= 3)

    # Cluster ------------------------------------------------------------------------
    await w.press("question_mark", "escape")  # the help, and back
    await w.press("p")  # cursor to the processes: launcher and two ranks
    await w.press("G", "k", "g", "j")
    await w.press("P", "M", "V", "V")  # sorted by CPU, RSS, GPU memory, back to ranks
    await w.press("enter")  # the process in full
    await w.press("s", "n", "l", "escape")  # its stack, native, with locals; back
    await w.press("n", "enter", "escape")  # the node list; drill in; esc clears the filter
    await w.press("escape")  # and leaves the node
    await w.press("a", "a", "o")  # every Python process and back; node order
    await w.press("slash", *job.tag, "enter")  # the demo's job only, again
    await w.press("ctrl+t", "ctrl+t")
    await w.press("colon", "escape")
    await w.press("ctrl+p", "escape")
    await w.press("h")  # training health of the job (or why there is none)
    if type(app.screen).__name__ != "ClusterScreen":
        await w.press("escape")
    await w.press("1") if app.current_mode != "nodes" else None

    # Stacks -------------------------------------------------------------------------
    await w.press("s")
    await w.until("the diagnosis", lambda: getattr(app.screen, "diagnosis", None) is not None)
    await w.press("j", "k", "G", "g")
    await w.press("space", "j", "space", "d")  # mark two groups, diff them
    await w.press("right_square_bracket", "left_square_bracket")
    if app.screen.diffing is not None:  # (one group: nothing to diff, and it said so)
        await w.press("escape")
    await w.press("enter", "t", "i", "t")  # show a group in the tree; all threads; idle
    await w.press("o", "escape")  # source around the frame
    await w.press("slash", "escape")
    await w.press("number_sign", "0", "enter")  # the group of rank 0
    await w.press("f", "f", "e")  # the whole diagnosis and back; export
    await w.press("F")  # how to turn the Flight Recorder on: the hook line, AReaL's block
    await w.until("the recorder setup", lambda: type(app.screen).__name__ != "StacksScreen")
    await w.press("c", "escape")  # copied; closed
    await w.until("the Stacks screen", lambda: type(app.screen).__name__ == "StacksScreen")
    await w.press("b")  # a bug report's preview: collected, then shown
    await w.until("the report", lambda: getattr(app.screen, "report", None) is not None)
    # The capture is of the run the Health screen follows (`h` made it the job's events
    # directory): its metrics are in, as in a report made from the Health screen.
    assert "metrics" not in app.screen.report.missing, app.screen.report.missing
    await w.press("a")  # anonymized
    await w.press("w")  # written (to the test's directory) and closed
    await w.until("the Stacks screen", lambda: type(app.screen).__name__ == "StacksScreen")
    for key in ("N", "L", "r"):  # capture again: with native frames, with locals, plain
        before = app.screen.capture.capture_id if app.screen.capture else None
        await w.press(key)
        await w.until(f"the capture after {key}", lambda b=before: (
            app.screen.capture is not None and app.screen.capture.capture_id != b
        ))  # fmt: skip
    assert app.capture_state.native and app.capture_state.with_locals
    assert any(t.locals for r in app.screen.capture.ranks for t in r.threads)
    await w.press("escape")  # back to the Cluster screen

    # Batches and a replay --------------------------------------------------------------
    await w.press("3")
    samples = app.screen.query_one("#samples", DataTable)
    await w.until("the samples", lambda: samples.row_count > 0)
    await w.press("g", "j", "G", "k")
    # enter reads the highlighted step file again: the screen may end as it began.
    app.screen.current_file = None
    await w.press("enter", did=lambda: app.screen.current_file is not None)
    await w.until("the step's samples", lambda: samples.row_count > 0 and not samples.loading)
    await w.press("space", "j", "space", "c")  # compare two step files
    await w.press("tab", "j")  # one tab to the samples
    view = app.screen.query_one("#sample-view")
    await w.press("enter", did=lambda: view.view is not None)  # open the sample
    await w.press("l", "l")  # logprobs on and off
    await w.press("slash", *"eos", "enter", "escape")
    await w.press("t", "n")  # reload allowing pickles: asks first; no
    await w.press("t", "y")  # and yes (the demo's own dump)
    app.screen.top_summary = None  # f5 reads the dump again: the screen may end as it began
    await w.press("f5", did=lambda: app.screen.top_summary is not None)
    for _ in range(2):  # two replays: the Runs screen then has rows to move between
        await w.press("r")
        await w.until("the command preview", lambda: type(app.screen).__name__ == "ReplayDialog"
                      and "reference_trainer" in str(app.screen.query_one("#replay-command").render()))  # fmt: skip
        if _ == 0:
            await w.press("escape")  # cancel, then ask again
            await w.press("r")
            await w.until("the dialog again", lambda: type(app.screen).__name__ == "ReplayDialog")
        await w.press("enter")
        await w.until(
            "the Runs screen",
            lambda: app.current_mode == "jobs" and type(app.screen).__name__ == "RunsScreen",
        )  # the switch done too
        if _ == 0:
            await w.press("3")

    # Jobs ---------------------------------------------------------------------------
    table = app.screen.query_one("#jobs-table", DataTable)
    await w.until("both replays", lambda: table.row_count >= 2)
    await w.until("both verified", lambda: all(
        str(table.get_cell(r, "verification")) not in ("…", "—") for r in table.rows
    ))  # fmt: skip
    await w.press("G", "g", "j", "k")
    # enter tails the highlighted job's log, which the pane already shows: the screen may
    # end as it began (a finished run's verification no longer raises a toast).
    app.screen._log_key = None
    await w.press("enter", did=lambda: app.screen._log_key is not None)
    await w.press("space", "space", "v", "r")
    await w.press("u", "u")  # every user's runs, then yours again
    await w.press("s")  # stop: nothing running, it says so
    await w.press("slash", *"replay", "enter", "escape")
    await w.press("2", "4", "5")

    # Health (the demo job's log) -------------------------------------------------------
    await w.until("the metrics", lambda: any(
        t.row_count > 0 for t in app.screen.query(DataTable)
    ))  # fmt: skip
    await w.press("G", "g", "j", "k", "space", "enter", "slash", "escape", "r")
    banner = app.screen.query_one("#health-banner")
    for _ in range(2):  # the warnings listed, then folded (or the other way round)
        was = banner.is_expanded
        await w.press("w", did=lambda was=was: banner.is_expanded != was)
    await w.press("b")  # the bug report from here: this run's log and the last capture
    await w.until("the report", lambda: getattr(app.screen, "report", None) is not None)
    await w.press("escape")  # closed without writing
    await w.press("s")  # py-spy the job from here: the Stacks screen
    await w.until("the stacks", lambda: type(app.screen).__name__ == "StacksScreen")
    await w.press("escape", "1")
    return w


@pytest.mark.timeout(900)
@pytest.mark.parametrize("size", [(80, 24), (160, 45)], ids=["80x24", "160x45"])
async def test_walk_every_documented_key_of_the_demo(
    demo: DemoJob, size: tuple[int, int], tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.chdir(tmp_path)  # where the bug report's preview writes
    # As `areal-console demo` builds it (commands/demo.py), with default settings.
    app = create_app([local_node()], settings=Settings(), batches_path=str(demo.dump_dir),
                     initial_filter=demo.tag, welcome=WELCOME, refresh_interval=0.5,
                     health_target=HealthTarget(str(demo.log_path), match=demo.tag))  # fmt: skip
    async with app.run_test(size=size) as pilot:
        walk = await walk_the_demo(app, pilot, demo)
        await pilot.press("q")
        await pilot.pause()
    assert app.return_code in (0, None)
    assert not walk.problems, "\n".join(walk.problems)
    # The console-wide keys (app.*) once anywhere; each screen's own keys on that screen.
    pressed_anywhere = set().union(*walk.pressed.values())
    missed = {
        screen: sorted(
            i
            for i in ids - walk.pressed.get(screen, set()) - set(NOT_JUDGED)
            if not (i.startswith("app.") and i in pressed_anywhere)
        )
        for screen, ids in walk.documented.items()
    }
    missed = {screen: ids for screen, ids in missed.items() if ids}
    assert not missed, f"documented keys the walk never pressed: {missed}"
    assert [p.suffix for p in sorted(tmp_path.glob("areal-report-*"))] == [".md", ".gz"]
