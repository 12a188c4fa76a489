"""The stacks' diagnosis with what they cannot see: a role whose Slurm job ended while the
actor's ranks wait (AReaL issue 1583), and a rank whose GPU idles while the others' are
busy (NVML readings as a real H200 node gave them, tests/data/h200-nodes.json). Stacks
shaped as AReaL's code at cbff54d (areal/engine/fsdp_engine.py)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from areal_console.core.connection.sampling import SampleHistory
from areal_console.core.stacks.codec import capture_from_json
from areal_console.core.stacks.merge import analyse
from areal_console.core.stacks.records import Frame, RankStack, StackCapture, Thread
from areal_console.core.stacks.report import analysed, full_diagnosis
from areal_console.core.stacks.slow_evidence import GpuIdle, RoleEnded, ended_roles

AREAL = "/opt/venv/lib/python3.11/site-packages/areal"
TORCH = "/opt/venv/lib/python3.11/site-packages/torch/distributed/distributed_c10d.py"
BARRIER = (
    Frame("barrier", TORCH, 4159),
    Frame("train_batch", f"{AREAL}/engine/fsdp_engine.py", 700),
)
CANCELLED = {"role": "rollout", "job_id": "123", "name": "exp_t:rollout", "state": "CANCELLED",
             "exit_code": "0:15", "source": "squeue"}  # fmt: skip


def _rank(r: int, progressing: bool | None = None) -> RankStack:
    return RankStack(node=f"node{r // 2}", pid=100 + r, rank=r, world_size=4, role="actor",
                     progressing=progressing,
                     threads=[Thread("MainThread", 1, BARRIER, is_main=True)])  # fmt: skip


def _capture(**extra: Any) -> StackCapture:
    return StackCapture("2026-11-29T08:00:00", 1, [_rank(r) for r in range(4)], **extra)


def _idle_docs(idle_rank: int) -> list[dict[str, Any]]:
    """Four samples of 2 nodes x 2 H200s, one rank a GPU, as NVML reads them on a real H200
    (100 % busy in a matmul loop), `idle_rank`'s GPU at NVML's idle reading of 0."""
    real = json.loads((Path(__file__).parents[1] / "data" / "h200-nodes.json").read_text())
    gpu, proc = real["nodes"][0]["gpus"][0], real["nodes"][0]["processes"][0]
    history = SampleHistory()
    for s in range(4):
        nodes = []
        for n in range(2):
            gpus = [{**gpu, "index": i, "util": 0 if 2 * n + i == idle_rank else gpu["util"]}
                    for i in range(2)]  # fmt: skip
            procs = [{**proc, "pid": 100 + 2 * n + i, "rank": 2 * n + i, "gpus": [i]}
                     for i in range(2)]  # fmt: skip
            nodes.append({"name": f"node{n}", "state": "up", "gpus": gpus, "processes": procs})
        history.add(nodes, float(s))
    return [i.to_json() for i in history.idle_ranks()]


def test_a_role_whose_slurm_job_ended_is_the_likely_cause() -> None:
    before = full_diagnosis(analyse(_capture()))
    assert before.pattern == "same_collective"
    result = analysed(_capture(ended_roles=[CANCELLED]))
    found = result.diagnosis
    cause = ("role rollout's Slurm job 123 ended CANCELLED (exit 0:15) while the actor's ranks "
             "wait in train_batch > barrier")  # fmt: skip
    assert found.pattern == "role_ended"
    assert found.title == f"Likely cause: {cause}"
    assert found.detail.startswith(cause + ". The stacks alone: " + before.title)
    assert found.evidence[0] == ("Slurm: role rollout's Slurm job 123 ended CANCELLED (exit "
                                 "0:15) while the job's other roles still run")  # fmt: skip
    assert "sacct -j 123" in found.suggestions[0]
    doc = result.json()
    assert doc["diagnosis"]["pattern"] == "role_ended" and doc["ended_roles"] == [CANCELLED]
    assert f"DIAGNOSIS [role_ended] Likely cause: {cause}" in result.text()
    # A saved capture reopened gives the same diagnosis.
    again = analysed(capture_from_json(json.loads(json.dumps(doc))))
    assert again.diagnosis.to_json() == found.to_json()


def test_an_ended_role_is_evidence_only_when_the_stacks_move() -> None:
    ranks = [_rank(r, progressing=r < 3) for r in range(4)]
    moving = StackCapture("t", 3, ranks, interval=1.0, ended_roles=[CANCELLED])
    found = full_diagnosis(analyse(moving))
    assert found.pattern == "progressing"
    assert found.evidence[0].startswith("Slurm: role rollout's Slurm job 123 ended CANCELLED")


def test_a_rank_whose_gpu_idles_while_the_others_are_busy_is_named() -> None:
    docs = _idle_docs(idle_rank=2)
    assert [d["rank"] for d in docs] == [2]
    found = full_diagnosis(analyse(_capture(idle_gpus=docs)))
    assert found.pattern == "same_collective"
    assert found.title.endswith(
        "; rank 2's GPU idles while the others' are busy: they likely wait on it"
    )
    assert found.evidence[0] == ("GPU idle: node1: rank 2's GPU is idle (0% mean over 4 "
                                 "samples) while the other ranks' median is 100%")  # fmt: skip
    assert "py-spy dump --pid 102" in found.suggestions[0] and "node1" in found.suggestions[0]
    # Every GPU busy: nothing to name, the diagnosis as the stacks alone give it.
    assert _idle_docs(idle_rank=-1) == []


def test_both_together_and_hostile_entries() -> None:
    found = full_diagnosis(analyse(_capture(ended_roles=[CANCELLED], idle_gpus=_idle_docs(1))))
    assert found.pattern == "role_ended"
    assert [e.split(":")[0] for e in found.evidence[:2]] == ["Slurm", "GPU idle"]
    junk: list[Any] = [{"role": 5}, "x", {"role": "r", "job_id": "1"}, {"rank": True}]
    assert ended_roles(junk) == []
    assert GpuIdle.from_json({"rank": 1, "util": 10**400, "others_median": 90}) is None
    plain = full_diagnosis(analyse(_capture(ended_roles=junk, idle_gpus=junk)))
    assert plain == full_diagnosis(analyse(_capture()))
    ended = RoleEnded.from_json({**CANCELLED, "exit_code": None, "state": "NODE_FAIL"})
    assert ended is not None and ended.ended() == "role rollout's Slurm job 123 ended NODE_FAIL"
