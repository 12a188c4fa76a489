"""The Stacks screen's banner with what the stacks cannot see: a role whose Slurm job ended
while the others wait, and a rank whose GPU idles (driven with Pilot on a real recorded
capture: ranks in the same collective)."""

from __future__ import annotations

from areal_console.core.stacks.parsing import build_capture
from areal_console.screens.stacks import StacksScreen
from areal_console.widgets.diagnosis_banner import DiagnosisBanner

from tests.support.screens import ScreenHost
from tests.tui.test_stacks_screen import load_raw, open_screen

CANCELLED = {"role": "rollout", "job_id": "123", "name": "exp_t:rollout", "state": "CANCELLED",
             "exit_code": "0:15", "source": "squeue"}  # fmt: skip
IDLE = {"node": "node0", "pid": 4242, "rank": 1, "gpus": [1], "util": 0.0, "samples": 12,
        "memory": 7321157632, "others_median": 100.0}  # fmt: skip


async def test_the_banner_names_the_ended_role_and_the_idle_gpu() -> None:
    raw = load_raw("same_collective")
    screen = StacksScreen(build_capture(raw))
    async with ScreenHost(screen).run_test(size=(160, 50)) as pilot:
        await open_screen(pilot, screen)
        plain = str(screen.query_one(DiagnosisBanner).render())
    assert "same_collective" in plain and "role_ended" not in plain

    raw = load_raw("same_collective") | {"ended_roles": [CANCELLED], "idle_gpus": [IDLE]}
    screen = StacksScreen(build_capture(raw))
    async with ScreenHost(screen).run_test(size=(160, 50)) as pilot:
        await open_screen(pilot, screen)
        banner = str(screen.query_one(DiagnosisBanner).render())
    assert "role_ended" in banner
    assert "Likely cause: role rollout's Slurm job 123 ended CANCELLED (exit 0:15)" in banner
    assert "rank 1's GPU is idle (0% mean over 12 samples)" in banner
