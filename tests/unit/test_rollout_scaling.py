"""The staleness capacity scaled as AReaL scales it: the job's mode from its processes, the
data-parallel size from `actor.backend` in AReaL's allocation syntax (the strings AReaL's
own examples and tests use), and the notes when either is assumed."""

from __future__ import annotations

from typing import Any

import pytest
from areal_console.core.common.errors import UserError
from areal_console.core.rollout.context import RolloutSummary, summarize
from areal_console.core.rollout.scaling import (
    SINGLE_CONTROLLER,
    SPMD,
    data_parallel_size,
    job_mode,
    scaling,
)
from hypothesis import given
from hypothesis import strategies as st

# (spec, data_parallel_size) as AReaL parses them at cbff54d: its tests
# (tests/test_allocation_mode.py:326-365, `ModelAllocation.from_str(...).parallel`) and the
# `actor.backend` / `rollout.backend` of its example configs.
AREAL_SPECS = [
    ("fsdp:d4", 4),  # tests/test_allocation_mode.py:328; examples/math/boba_grpo.yaml:48
    ("sglang:d4t2", 4),  # tests/test_allocation_mode.py:335
    ("vllm:d2t4p2", 2),  # tests/test_allocation_mode.py:342
    ("megatron:d4t2p2", 4),  # tests/test_allocation_mode.py:350
    ("archon:d2", 2),  # tests/test_allocation_mode.py:358
    ("fsdp:d4c2", 4),  # tests/test_allocation_mode.py:397
    ("fsdp:d1", 1),  # tests/test_allocation_mode.py:402
    ("fsdp:d4p1t1", 4),  # examples/math/gsm8k_grpo.yaml:48
    ("sglang:d4p1t1", 4),  # examples/math/gsm8k_grpo.yaml:22
    ("fsdp:d7p1t1", 7),  # examples/vlm/clevr_count_70k_grpo.yaml:43
    ("fsdp:d1p1t4", 1),  # examples/distillation/gsm8k_grpo_distill_mode_trainEngine.yaml:91
    ("megatron:d2p2t1", 2),  # examples/search_agent/tongyi_deepresearch/config.yaml:42
    # The MoE form: the attention part's `d` (alloc_mode.py:957-1055).
    ("megatron:(attn:d1p12t4|ffn:d1p12e4)", 1),  # tests/test_allocation_mode.py:364
    ("megatron:(attn:d2p1t4|ffn:d1p1e8)", 2),  # examples/dte/gsm8k_grpo_qwen3_30b_a3b.yaml:65
    ("megatron:(attn:d4p1t4c2|ffn:d4p1e8)", 4),  # examples/swe/qwen3_30b_a3b_grpo.yaml:74
    ("megatron:(attn:d2c4|ffn:d1e8)", 2),  # examples/profile/qwen3_30b_a3b_sft_profile.yaml:25
    # examples/vlm/qwen3_6_35b_a3b_megatron_geometry3k_grpo.yaml:42
    ("megatron:(attn:d8p2t2|ffn:d4p2t1e4)", 8),
    # The grammar's other forms (alloc_mode.py:594-635): a name, no parentheses, spaces.
    ("fsdp[actor]:d4", 4),
    ("megatron:attn:d4t2|ffn:d1e8", 4),
    (" fsdp : d2 t2 ", 2),
    ("megatron:t4p2", 1),  # no `d`: 1
]

# Strings AReaL refuses (ModelAllocation.from_str raises): never a size.
REFUSED = [
    "sglang:d4+fsdp:d4",  # tests/test_allocation_mode.py:414 (one component per engine)
    "d4",  # no backend (alloc_mode.py:917-923)
    "fsdp:d0",  # NUMBER is [1-9][0-9]*
    "sglang:c2",  # inference backends take d, t, p only
    "fsdp:x4",
    "fsdp:",
    "fsdp.d4",  # the parser's hint: colons, not dots
    "fsdp:d4" + "1" * 300,
]


@pytest.mark.parametrize(("spec", "dp"), AREAL_SPECS)
def test_data_parallel_size_of_arealS_allocation_strings(spec: str, dp: int) -> None:
    assert data_parallel_size(spec) == dp


@pytest.mark.parametrize("spec", REFUSED)
def test_strings_areal_refuses_have_no_size(spec: str) -> None:
    with pytest.raises(UserError):
        data_parallel_size(spec)


@given(st.text(max_size=80))
def test_any_text_is_a_size_or_a_user_error(spec: str) -> None:
    try:
        assert data_parallel_size(spec) >= 1
    except UserError:
        pass


# Process records as the agent sends them (agents/areal_node/agent/processes.py).
def spmd_rank(rank: int, spmd: str | None = "1", world: int = 8) -> dict[str, Any]:
    env = {"RANK": str(rank), "WORLD_SIZE": str(world)}
    if spmd is not None:
        env["AREAL_SPMD_MODE"] = spmd
    return {"pid": 100 + rank, "rank": rank, "world_size": world, "role": "trainer",
            "cmdline": "python3 examples/math/gsm8k_rl.py --config /c/gsm8k_grpo.yaml", "env": env}  # fmt: skip


def sc_worker(index: int) -> dict[str, Any]:
    # areal/infra/scheduler/local.py:777-814: `python3 -m areal.infra.rpc.rpc_server --role R`
    cmd = f"python3 -m areal.infra.rpc.rpc_server --role actor --worker-index {index}"
    return {"pid": 200 + index, "rank": index, "world_size": 4, "role": "actor",
            "worker_index": index, "cmdline": cmd, "env": {}}  # fmt: skip


def test_the_jobs_mode_from_its_processes() -> None:
    mode, evidence = job_mode([spmd_rank(0), spmd_rank(1)])
    assert mode == SPMD and "AREAL_SPMD_MODE=1 in the environment of trainer 100" in evidence
    assert job_mode([spmd_rank(0, "true")])[0] == SPMD  # get_bool_env_var's truthy values
    assert job_mode([sc_worker(0), sc_worker(1)])[0] == SINGLE_CONTROLLER
    controller = {"pid": 7, "role": "controller", "cmdline": "python3 train.py --config /c.yaml"}
    assert job_mode([controller])[0] == SINGLE_CONTROLLER
    # "0", an older agent that does not send the variable, nothing AReaL's: not known.
    assert job_mode([spmd_rank(0, "0")])[0] is None
    assert job_mode([spmd_rank(0, None)])[0] is None
    assert job_mode([])[0] is None


def test_scaling_by_mode() -> None:
    backend = {"value": "fsdp:d4p1t1", "from": "/c/gsm8k_grpo.yaml"}
    spmd = scaling(SPMD, "env", backend, 8)
    assert (spmd.dp_size, spmd.note) == (4, None)
    assert spmd.source == "actor.backend 'fsdp:d4p1t1' (/c/gsm8k_grpo.yaml)"
    # Single controller: the global values whatever the allocation says.
    single = scaling(SINGLE_CONTROLLER, "workers", backend, 4)
    assert (single.dp_size, single.note) == (1, None)
    # SPMD without a usable actor.backend: the ranks' world size, said as assumed.
    bad = scaling(SPMD, "env", {"value": "fsdp.d4", "from": "command line"}, 8)
    assert bad.dp_size == 8 and bad.note is not None
    assert "actor.backend 'fsdp.d4' not understood" in bad.note and "world size 8" in bad.note
    none = scaling(SPMD, "env", None, None)
    assert none.dp_size == 1 and "assumed 1" in (none.note or "")
    # Mode not known: AReaL's default mode (dp 1), and what SPMD would divide by.
    unknown = scaling(None, "no process shows it", backend, 8)
    assert unknown.dp_size == 1
    assert "single-controller, assumed (dp 1)" in (unknown.note or "")
    assert "divided by dp 4" in (unknown.note or "")


TRACING = (
    "20260126-03:11:09.540 WorkflowExecutor INFO: Finish and accept rollout. "
    "enqueued: 0, running: 3, accepted: 20, rejected: 0."
)
CONFIG = (
    'actor:\n  backend: "fsdp:d4p1t1"\n'
    'rollout:\n  backend: "sglang:d4p1t1"\n  consumer_batch_size: 16\n'
    "  max_concurrent_rollouts: null\n  max_head_offpolicyness: 2\n"
)


def nodes(procs: list[dict[str, Any]]) -> list[dict[str, Any]]:
    rollout = {"log_dir": "/l", "logs": [{"text": TRACING}], "traces": [], "sessions": [],
               "configs": [{"path": "/c/gsm8k_grpo.yaml", "kind": "config", "text": CONFIG}]}  # fmt: skip
    return [{"node": "n1", "processes": procs, "rollout": rollout}]


def test_an_spmd_ranks_capacity_is_divided_by_the_actors_dp() -> None:
    procs = [spmd_rank(r) for r in range(2)]
    summary = summarize(nodes(procs), [p["cmdline"] for p in procs], 1)
    cap = summary.capacity
    assert cap is not None
    # max_concurrent_rollouts None -> 16 (AReaL's `or`), // 4 = 4, 3 running: 1 left;
    # batch 16 // 4 = 4: (2 + 1 + 1) x 4 - (20 + 3) = -7.
    assert (cap.concurrency, cap.staleness, cap.zero_terms) == (1, -7, ("staleness",))
    assert "(per rank: 16 // dp 4 and batch 16 // dp 4)" in cap.explanation
    assert summary.config["dp_size"]["value"] == 4 and summary.config["mode"]["value"] == SPMD
    assert summary.config["actor.backend"] == {"value": "fsdp:d4p1t1", "from": "/c/gsm8k_grpo.yaml"}
    # A saved capture recomputes the same capacity from its JSON.
    again = RolloutSummary.from_json(summary.to_json())
    assert again is not None and again.capacity == cap
    # An override on the command line changes the allocation: dp 2.
    over = [procs[0]["cmdline"] + " actor.backend=fsdp:d2"]
    assert summarize(nodes(procs), over, 1).config["dp_size"]["value"] == 2


def test_a_single_controllers_capacity_uses_the_global_values() -> None:
    procs = [sc_worker(0), sc_worker(1)]
    summary = summarize(nodes(procs), [p["cmdline"] for p in procs], 1)
    cap = summary.capacity
    assert cap is not None and summary.config["dp_size"]["value"] == 1
    # 16 - 3 running = 13; (2 + 1 + 1) x 16 - 23 = 41.
    assert (cap.concurrency, cap.staleness, cap.zero_terms) == (13, 41, ())
    assert not any("dp" in n for n in summary.notes)


def test_an_unknown_mode_is_said_with_the_value_assumed() -> None:
    procs = [spmd_rank(0, None)]
    summary = summarize(nodes(procs), [procs[0]["cmdline"]], 1)
    assert summary.config["dp_size"] == {"value": 1, "from": "assumed (the mode is not known)"}
    assert any("mode is not known" in n and "dp 4" in n for n in summary.notes)
    # A saved capture from before the mode was recorded recomputes with dp 1.
    doc = summary.to_json()
    del doc["config"]["dp_size"]
    again = RolloutSummary.from_json(doc)
    assert again is not None and again.capacity == summary.capacity


def test_the_agent_sends_arealS_spmd_variable_from_proc() -> None:
    """A rank started as AReaL's SPMD launchers start it (`AREAL_SPMD_MODE=1` beside the
    torchrun variables, areal/infra/launcher/local.py:418): the agent reads it from the
    process's /proc environ and the console tells the mode from its record."""
    import os
    import subprocess
    import sys
    import time

    from areal_console.core.connection.client import AgentClient
    from areal_console.core.connection.transport import LocalChannel

    env = {**os.environ, "AREAL_SPMD_MODE": "1", "RANK": "0", "WORLD_SIZE": "2"}
    proc = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"], env=env)
    client = AgentClient(LocalChannel())
    client.start(gpus=False)
    try:
        deadline = time.monotonic() + 15
        while True:
            procs = client.request("sample", {"all": False, "cpu": False, "gpus": False})
            mine = [p for p in procs["processes"] if p["pid"] == proc.pid]
            if mine:
                break
            assert time.monotonic() < deadline, "the rank was not sampled"
            time.sleep(0.1)
        assert mine[0]["env"]["AREAL_SPMD_MODE"] == "1"
        mode, evidence = job_mode(mine)
        assert mode == SPMD and f"trainer {proc.pid}" in evidence
    finally:
        client.close()
        proc.kill()
        proc.wait()
