"""`weight_update_stuck` and the starved `rollout_stall` from stacks shaped as AReaL's code
(frames named after areal/engine/fsdp_engine.py and areal/infra/* at cbff54d), server
state as the agent reports it, and the Flight Recorder ledger of the update group."""

from __future__ import annotations

from pathlib import Path

from areal_console.core.ledger import build_ledger, parse_trace
from areal_console.core.ledger.verdict import stack_activity, with_ledger
from areal_console.core.stacks import diagnose
from areal_console.core.stacks.merge import analyse
from areal_console.core.stacks.records import Frame, RankStack, ServerInfo, StackCapture, Thread
from areal_node.agent.flight_recorder import fr_dump_files

AREAL = "/opt/venv/lib/python3.11/site-packages/areal"
TORCH = "/opt/venv/lib/python3.11/site-packages/torch/distributed/distributed_c10d.py"

UPDATE_STACK = (
    Frame("broadcast", TORCH, 2710),
    Frame("_update_bucket_weights_from_distributed", f"{AREAL}/engine/fsdp_engine.py", 1502),
    Frame("_update_weights_from_distributed", f"{AREAL}/engine/fsdp_engine.py", 1640),
    Frame("update_weights", f"{AREAL}/engine/fsdp_engine.py", 631),
    Frame("_run", f"{AREAL}/infra/rpc/guard/engine_blueprint.py", 170),
)
BARRIER_STACK = (
    Frame("barrier", TORCH, 4159),
    Frame("train_batch", f"{AREAL}/engine/fsdp_engine.py", 700),
)


def rank(r: int, frames: tuple[Frame, ...]) -> RankStack:
    return RankStack(
        node="node1",
        pid=100 + r,
        rank=r,
        world_size=4,
        role="actor",
        threads=[
            Thread("EngineWorker", 10 + r, frames),
            Thread("MainThread", 1, (), idle=True, is_main=True),
        ],
    )


def server(
    paused: bool | None, version: int | None, flags: list[dict[str, str]] | None = None
) -> RankStack:
    info = ServerInfo.from_json(
        {
            "kind": "sglang",
            "url": "http://127.0.0.1:30000/health",
            "health": {"ok": True, "status": 200, "latency_ms": 2.0},
            "paused": paused,
            "weight_version": version,
            "metrics": {"sglang:num_running_reqs": 0.0},
            "flags": flags or [],
        }
    )
    return RankStack(
        node="node2",
        pid=900,
        role="sglang",
        server=info,
        threads=[Thread("MainThread", 1, (), is_main=True)],
    )


def capture(ranks: list[RankStack]) -> StackCapture:
    return StackCapture(captured_at="2026-11-26T09:00:00Z", samples=1, ranks=ranks)


def test_ranks_in_the_update_path_with_a_paused_server() -> None:
    flag = {
        "kind": "paused_after_update",
        "evidence": "paused for 340s at version 3",
        "remedy": "r",
        "config_key": "actor.weight_update_mode",
    }
    ranks = [rank(r, UPDATE_STACK) for r in range(4)] + [server(True, 3, [flag])]
    d = diagnose(analyse(capture(ranks)))
    assert d.pattern == "weight_update_stuck"
    assert d.title == "Weight update stuck: ranks 0-3 in the weight-update path, servers paused"
    assert "1 of 1 server(s) paused" in d.detail
    assert any("update_weights (" in e and "-> broadcast (" in e for e in d.evidence)
    assert any("paused, version 3, healthy" in e for e in d.evidence)
    assert any("paused_after_update: paused for 340s at version 3" in e for e in d.evidence)
    assert any("actor.weight_update_mode" in s for s in d.suggestions)


def test_without_update_frames_it_stays_a_collective_pattern() -> None:
    ranks = [rank(r, BARRIER_STACK) for r in range(4)] + [server(True, 3)]
    assert diagnose(analyse(capture(ranks))).pattern == "same_collective"


def test_a_size_mismatch_in_the_ledger_names_the_update_collective() -> None:
    data = Path(__file__).parents[1] / "data" / "fr" / "size" / "rank_"
    files = fr_dump_files([str(data)], None)
    ledger = build_ledger(
        [parse_trace(f["rank"], "node", "file", f["path"], f["trace"]) for f in files], 4
    )
    analysis = analyse(capture([rank(r, UPDATE_STACK) for r in range(4)] + [server(False, 2)]))
    d = with_ledger(diagnose(analysis), ledger, stack_activity(analysis))
    assert d.pattern == "weight_update_stuck"
    assert d.title == "Weight update stuck: sizes mismatch at collective #4 of group 0 (default_pg)"
    assert d.detail.startswith(
        "#4 sizes mismatch: ranks 0-1,3 all_reduce [8] float32 vs rank 2 all_reduce [5] float32. "
        "Ranks 0-3 are inside AReaL's weight-update path"
    )
    assert d.wait_for is not None
