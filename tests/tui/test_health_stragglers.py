"""The Health screen lists the stragglers of a run's perf tracer files (written by the
transcription of AReaL's writer, tests/support/fixtures/perf_tracer_files.py)."""

from __future__ import annotations

from pathlib import Path

from tests.support.areal_logfmt import write_run
from tests.support.fixtures.perf_tracer_files import write_rank_run


async def test_the_health_screen_lists_the_stragglers(tmp_path: Path) -> None:
    """The Health screen, in the real app shell, on AReaL's log and its perf tracer files."""
    from areal_console.app import ConsoleApp
    from areal_console.core.metrics.locate import HealthTarget
    from areal_console.screens.health import HealthScreen
    from areal_console.widgets.health_banner import HealthBanner

    from tests.support.recorded import SIZE, recorded_monitor, wait_until

    write_run(tmp_path, 40, finished=True)
    write_rank_run(tmp_path, 4, 40, slow={1: ("train.ppo_update", 18, 2.0)}, noise=0.05)
    app = ConsoleApp(None, recorded_monitor(), health_target=HealthTarget(str(tmp_path)))
    async with app.run_test(size=SIZE) as pilot:
        await pilot.press("5")
        assert isinstance(app.screen, HealthScreen)

        def banner() -> str:
            found = list(app.screen.query(HealthBanner))
            return str(found[0].render()) if found else ""

        await wait_until(pilot, lambda: "straggler" in banner())
        assert "⏱ straggler: master rank 1: train.ppo_update takes" in banner()
        assert "since step 18" in banner()
