"""`weight_update_stuck`: trainer ranks inside AReaL's weight-update path while the
inference servers stay paused or on the old version.

AReaL's weight-update path at cbff54d: the trainer's `update_weights` step
(areal/trainer/rl_trainer.py:880-890) into the train engines (areal/engine/fsdp_engine.py:
620 `update_weights`, :1356/:1456 `_update_bucket_weights_from_distributed[_async]`, :1596
`_update_weights_from_distributed`, :1695 `_update_weights_from_disk`; megatron_engine.py:
967, :1931, :2103, :2334, :2367, :2428, :2462), the remote engines and controllers that
pause the servers and push the weights (sglang_remote.py:543-560, vllm_remote.py:410-427,
areal/infra/controller/rollout_callback.py:103-177, rollout_controller.py:1140-1168), and
AWEX's reader (areal/engine/awex/colocate_reader.py:503).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING, NamedTuple

from areal_node.constants import config_key

from areal_console.core.stacks.merge import format_ranks
from areal_console.core.stacks.records import Frame, RankStack, Stack, per_stack

if TYPE_CHECKING:
    from areal_console.core.stacks.merge import StackAnalysis


class Finding(NamedTuple):
    """A `weight_update_stuck` diagnosis's parts (diagnose.py makes the Diagnosis)."""

    title: str
    detail: str
    evidence: list[str]
    suggestions: list[str]


WEIGHT_UPDATE_FUNCTIONS = frozenset(
    {
        "update_weights",
        "_update_weights_from_distributed",
        "_update_bucket_weights_from_distributed",
        "_update_bucket_weights_from_distributed_async",
        "_update_bucket_expert_weights_from_distributed",
        "_update_weights_from_disk",
        "_update_weights_via_registry",
        "_update_weights_via_bridge",
        "update_weights_from_distributed",
        "update_weights_from_disk",
        "init_weights_update_group",
    }
)
WEIGHT_UPDATE_FILES = frozenset(
    {
        "rl_trainer.py",
        "fsdp_engine.py",
        "megatron_engine.py",
        "sglang_remote.py",
        "vllm_remote.py",
        "remote_inf_engine.py",
        "rollout_callback.py",
        "rollout_controller.py",
        "train_controller.py",
        "colocate_reader.py",
    }
)


def _short(fn: str) -> str:
    return fn.rsplit(".", 1)[-1]


@per_stack
def weight_update_frames(frames: Stack) -> tuple[Frame, ...]:
    """The weight-update frames of a stack, innermost first."""
    return tuple(
        f
        for f in frames
        if _short(f.function) in WEIGHT_UPDATE_FUNCTIONS
        and f.file.rsplit("/", 1)[-1] in WEIGHT_UPDATE_FILES
    )


def _in_update(r: RankStack) -> tuple[Frame, ...]:
    found = weight_update_frames(r.work_frames)
    if found:
        return found
    for t in r.threads:
        found = weight_update_frames(t.frames)
        if found:
            return found
    return ()


def _who(r: RankStack) -> str:
    return r.label if r.rank is not None else f"the {r.role or 'process'} (pid {r.pid} on {r.node})"


def weight_update_stuck(
    analysis: StackAnalysis,
    failed_note: list[str],
    collective_frame: Callable[[Stack], Frame | None],
) -> Finding | None:
    """Ranks blocked in the weight-update path; the servers' state as evidence when the
    agent polled them (`collective_frame`: the diagnosis's own, to name the collective)."""
    capture = analysis.capture
    inside: list[tuple[RankStack, tuple[Frame, ...]]] = []
    for r in capture.ranks:
        if r.state != "ok" or r.server is not None:
            continue
        frames = _in_update(r)
        if frames:
            inside.append((r, frames))
    ranks_inside = sorted(r.rank for r, _ in inside if r.rank is not None)
    if not ranks_inside:
        return None  # a controller alone in update_weights waits on its workers: not enough
    servers = [r for r in capture.ranks if r.server is not None]
    paused = [r for r in servers if r.server is not None and r.server.paused]
    versions = {
        str(r.server.weight_version)
        for r in servers
        if r.server is not None and r.server.weight_version is not None
    }
    evidence = []
    for r, frames in inside[:8]:
        outer, inner = frames[-1], frames[0]
        coll = collective_frame(r.work_frames)
        chain = f"{_short(outer.function)} ({outer.location})"
        if inner is not outer:
            chain += f" -> {_short(inner.function)} ({inner.location})"
        if coll is not None:
            chain += f" -> {_short(coll.function)} ({coll.location})"
        evidence.append(f"{_who(r)}: {chain}")
    for r in servers:
        srv = r.server
        assert srv is not None
        state = []
        if srv.paused is not None:
            state.append("paused" if srv.paused else "not paused")
        if srv.weight_version is not None:
            state.append(f"version {srv.weight_version}")
        state.append(srv.health_text)
        evidence.append(
            f"{srv.kind} server {srv.address} (pid {r.pid} on {r.node}): {', '.join(state)}"
        )
        evidence.extend(
            f"{srv.address}: {f.get('kind')}: {f.get('evidence')}" for f in srv.flags[:3]
        )
    trainers = ("rank " if len(ranks_inside) == 1 else "ranks ") + format_ranks(ranks_inside)
    why = []
    if paused:
        why.append(f"{len(paused)} of {len(servers)} server(s) paused")
    if len(versions) > 1:
        why.append(f"servers on versions {', '.join(sorted(versions))}")
    detail = (
        f"{trainers.capitalize()} {'is' if len(ranks_inside) == 1 else 'are'} inside AReaL's weight-update path "
        f"({_short(inside[0][1][-1].function)})"
        + (f"; {' and '.join(why)}" if why else "")
        + ". The trainer pushes new weights and the servers never finish taking them: "
        "generation stays paused and training cannot go on."
    )
    suggestions = [
        "Compare what both sides of the weight-update group send: with the Flight Recorder "
        "ledger the sizes and dtypes of the broadcast are in the evidence (a dtype the "
        "server's metadata does not match hangs the transfer, AReaL #1439)",
        f"Try the other update path: `{config_key('actor.weight_update_mode')}=disk` (or "
        "xccl) tells a transport problem from a server problem",
        "Read the rollout servers' logs for update_weights errors; a server left paused "
        "after a disk update (AReaL #1160/#1181) resumes with POST /continue_generation",
        "NCCL_DEBUG=INFO on both trainer and servers shows where the weight broadcast stops",
    ]
    return Finding(
        f"Weight update stuck: {trainers} in the weight-update path"
        + (", servers paused" if paused else ""),
        detail,
        evidence + failed_note,
        suggestions,
    )
