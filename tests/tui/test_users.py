"""On a shared account the cache holds everyone's captures and runs: each is stored with
its login identity, and the user's own are listed by default (everyone's with a key)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from areal_console.app import ConsoleApp
from areal_console.core.common.identity import UserScope, login_user
from areal_console.core.connection.fleet import Fleet
from areal_console.core.connection.monitor import RecordedMonitor
from areal_console.core.replay import runs as jobs
from areal_console.core.stacks.store import SavedCapture
from areal_console.palette import ConsoleCommands
from areal_console.screens.runs import RunsScreen
from conftest import run_cli
from textual.widgets import DataTable, Label

from tests.support import waits
from tests.support.screens import ScreenHost

RANK0 = Path(__file__).parents[1] / "data" / "pyspy_text" / "rank0.txt"


def test_login_user_prefers_sudo_user(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("SUDO_USER", "alice")
    assert login_user() == "alice"
    monkeypatch.delenv("SUDO_USER")
    assert login_user() not in ("", "alice")


def test_stacks_list_shows_your_captures_and_all_users_lists_everyone(tmp_path: Path) -> None:
    data = {"AREAL_CONSOLE_DATA_DIR": str(tmp_path)}
    for user in ("alice", "bob"):
        made = run_cli("stacks", "--import", str(RANK0), "--json", SUDO_USER=user, **data)
        assert made.returncode == 0, made.stderr
        assert json.loads(made.stdout)["user"] == user
    mine = run_cli("stacks", "--list", SUDO_USER="alice", **data)
    assert mine.returncode == 0, mine.stderr
    rows = mine.stdout.splitlines()
    assert rows[0].split() == ["ID", "CAPTURED", "USER", "RANKS", "DIAGNOSIS"]
    assert [r.split()[2] for r in rows[1:]] == ["alice"]
    assert mine.stderr == "note: 1 other users' captures not listed (--all-users lists them)\n"
    everyone = run_cli("stacks", "--list", "--all-users", "--json", SUDO_USER="alice", **data)
    users = [c["user"] for c in json.loads(everyone.stdout)["captures"]]
    assert sorted(users) == ["alice", "bob"] and everyone.stderr == ""


async def test_jobs_screen_lists_your_runs_and_u_shows_everyones(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("AREAL_CONSOLE_DATA_DIR", str(tmp_path))
    for i, (job_id, user) in enumerate([("replay-mine", "alice"), ("replay-theirs", "bob"),
                                        ("replay-old", None)]):  # fmt: skip
        jobs.save_run(jobs.RunRecord(job_id=job_id, node="n1", plan={"steps": [0, 1]},
                                     launched_at=100.0 - i, state="finished", user=user))  # fmt: skip
    app = ScreenHost(RunsScreen(Fleet([]), poll=3600, users=UserScope(me="alice")))
    async with app.run_test(size=(120, 30)) as pilot:
        table = app.screen.query_one("#jobs-table", DataTable)

        def listed() -> list[str]:
            return sorted(str(table.get_row_at(i)[0]) for i in range(table.row_count))

        await waits.until(pilot, lambda: table.row_count > 0, 10, "the jobs")
        # Records written before users were stored stay visible to everyone.
        assert listed() == ["replay-mine", "replay-old"]
        status = str(app.screen.query_one("#jobs-status", Label).content)
        assert "1 job of other users hidden (u shows them)" in status
        await pilot.press("u")
        await waits.until(pilot, lambda: table.row_count == 3, 10, "every user's jobs")
        assert listed() == ["replay-mine", "replay-old", "replay-theirs"]
        await pilot.press("u")
        await waits.until(pilot, lambda: table.row_count == 2, 10, "yours again")


async def test_the_palette_lists_your_captures_and_offers_everyones() -> None:
    app = ConsoleApp(None, RecordedMonitor([]))
    async with app.run_test(size=(120, 30)) as pilot:
        app.users = UserScope(me="alice")
        app.saved_captures = [
            SavedCapture(f"c-{u}", Path(f"/x/{u}.json"), "t", 2, "none", "title", user=u)
            for u in ("alice", "bob")
        ]
        provider = ConsoleCommands(app.screen)

        def labels() -> list[str]:
            return [label for label, _, _ in provider._entries() if "captures" in label
                    or label.startswith("Capture ")]  # fmt: skip

        assert labels() == ["Show every user's captures and runs", "Capture c-alice: title"]
        toggle = next(a for label, _, a in provider._entries() if label.startswith("Show every"))
        toggle()
        await pilot.pause()
        assert labels() == ["Show only your captures and runs", "Capture c-alice: title",
                            "Capture c-bob: title"]  # fmt: skip
