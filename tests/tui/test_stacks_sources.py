"""Where stacks came from, on the Stacks screen (Pilot): a capture whose ranks answered
from their worker servers (real recorded `dump_traceback` answers of the hung gloo job
tests/jobs/fr_ranks.py `op`) says so in its status line, and NCCL's RAS report (as NCCL
2.28.7 writes it, tests/jobs/standin_nccl_ras.py) shows beside the ledger. And the
merge of a capture that mixes sources."""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Any

from areal_console.core.stacks.nccl_ras import parse_ras_json
from areal_console.core.stacks.parsing import build_capture
from areal_console.core.stacks.report import analysed
from areal_console.screens.stacks import StacksScreen
from areal_console.widgets.ledger_pane import LedgerPane
from areal_node.agent.worker_server import parse_traceback
from textual.widgets import Static

from tests.support.screens import ScreenHost
from tests.support.waits import until as wait_until

DATA = Path(__file__).parents[1] / "data" / "worker_server"
sys.path.insert(0, str(Path(__file__).parents[1] / "jobs"))
import standin_nccl_ras  # noqa: E402


def raw_capture(sources: dict[int, str]) -> dict[str, Any]:
    """Four ranks of the recorded hung job: ranks 0-2 in all_reduce, rank 3 in broadcast,
    each from the worker server, or (`py-spy`) with py-spy's qualified function name."""
    answers = {
        "all_reduce": parse_traceback((DATA / "dump_traceback_gloo_rank0.txt").read_text()),
        "broadcast": parse_traceback(
            (DATA / "dump_traceback_gloo_rank3_debug_server.txt").read_text()
        ),
    }
    procs, dumps = [], []
    for rank, source in sources.items():
        pid = 4000 + rank
        threads = answers["broadcast" if rank == 3 else "all_reduce"]
        if source == "py-spy":  # py-spy names a function by its qualified name
            threads = [
                {**t, "frames": [
                    {**f, "name": "_exception_logger.<locals>.wrapper"} if f["name"] == "wrapper"
                    else f for f in t["frames"]
                ]} for t in threads
            ]  # fmt: skip
        procs.append({"pid": pid, "ppid": 1, "rank": rank, "local_rank": rank,
                      "world_size": 4, "role": None, "cmdline": "python fr_ranks.py op"})  # fmt: skip
        dumps.append({"pid": pid, "ok": True, "threads": threads, "source": source})
    return {
        "captured_at": "2026-11-29T05:00:00+00:00",
        "nodes": [{"node": "node0", "processes": procs, "samples": [dumps]}],
        "nccl_ras": {
            "ok": True,
            "address": "127.0.0.1:28028",
            "format": "json",
            "report": standin_nccl_ras.json_report(),
        },
    }


async def test_the_screen_says_stacks_came_from_the_worker_servers() -> None:
    capture = build_capture(raw_capture({r: "worker_server" for r in range(4)}))
    screen = StacksScreen(capture)
    app = ScreenHost(screen)
    async with app.run_test(size=(200, 40)) as pilot:
        await wait_until(pilot, lambda: screen.analysis is not None)
        status = str(screen.query_one("#status", Static).render())
        assert "stacks from worker server: ranks 0-3" in status
        pane = str(screen.query_one(LedgerPane).render())
        assert "NCCL RAS 127.0.0.1:28028" in pane
        assert (
            "comm 0x5a1e3c2b9d4f6071 (4 ranks): AllReduce: ranks 0-2 up to #12, rank 3 up to #11"
            in pane
        )
        assert screen.diagnosis is not None
        assert any(
            e.startswith("NCCL RAS: comm 0x5a1e3c2b9d4f6071: rank 3")
            for e in screen.diagnosis.evidence
        )


def test_mixed_sources_merge_as_one_stack() -> None:
    """Ranks 0-1 by py-spy (qualified names), 2-3 by their worker servers (bare names):
    ranks 0-2 stopped at the same lines still form one group."""
    result = analysed(build_capture(raw_capture({0: "py-spy", 1: "py-spy", 2: "worker_server",
                                                  3: "worker_server"})))  # fmt: skip
    assert [g.label for g in result.analysis.groups] == ["0-2", "3"]
    assert [r.source for r in result.capture.rank_stacks] == ["py-spy"] * 2 + ["worker_server"] * 2
    group = result.json()["groups"][0]
    assert group["frames"][1]["function"] == "_exception_logger.<locals>.wrapper"
    assert "Stacks from py-spy: ranks 0-1 · worker server: ranks 2-3\n" in result.text()
    assert parse_ras_json(standin_nccl_ras.json_report()).lagging_ranks() == [3]
