"""Name the hang: which of AReaL's debugging-guide patterns the stacks show, and what next.

Patterns, checked in this order (the first that fits wins):
- `progressing`: repeated samples differ, so the job is slow rather than hung.
- `missing_ranks`: WORLD_SIZE promises ranks that no node shows (a rank died).
- `weight_update_stuck`: ranks inside AReaL's weight-update path (core/stacks/
  weight_update.py), with the servers' pause state and versions when polled.
- `rollout_stall`: AReaL's controller (or the data-parallel heads) wait for rollout
  results while trainers idle or wait at a barrier (staleness control, a dead server).
- `cleanup_deadlock`: some ranks are in a cleanup/exit path, others in the training loop.
- `collective_mismatch`: ranks wait in different collectives or at different call sites.
- `cross_group_deadlock` (set from the collective ledger, core/ledger/verdict.py): ranks
  wait on each other across process groups.
- `same_collective`: every rank waits in the same collective (network/NCCL, or a straggler).
- `none`: nothing that looks like a hang.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from areal_node.constants import config_key

from areal_console.core.common.rankset import brief_ranks
from areal_console.core.stacks.library import is_library_file
from areal_console.core.stacks.merge import RankGroup, StackAnalysis
from areal_console.core.stacks.parsing import gc_paused
from areal_console.core.stacks.records import Frame, RankStack, Stack, per_stack
from areal_console.core.stacks.weight_update import weight_update_stuck

if TYPE_CHECKING:
    from areal_console.core.ledger.waitfor import WaitForGraph

COLLECTIVES = frozenset(
    {
        "all_reduce",
        "all_reduce_coalesced",
        "all_reduce_multigpu",
        "all_gather",
        "all_gather_into_tensor",
        "all_gather_object",
        "_all_gather_base",
        "all_to_all",
        "all_to_all_single",
        "broadcast",
        "broadcast_object_list",
        "_broadcast_coalesced",
        "reduce",
        "reduce_scatter",
        "reduce_scatter_tensor",
        "_reduce_scatter_base",
        "gather",
        "gather_object",
        "scatter",
        "scatter_object_list",
        "barrier",
        "monitored_barrier",
        "_store_based_barrier",
        "send",
        "recv",
        "isend",
        "irecv",
        "batch_isend_irecv",
        "wait",
        "synchronize",
    }
)

# Frames that mean "this rank is shutting down": functions, and words in function names.
CLEANUP_FUNCTIONS = frozenset({"destroy_process_group", "_exitfunc", "_run_exitfuncs", "__exit__"})
CLEANUP_WORDS = (
    "cleanup",
    "clean_up",
    "shutdown",
    "teardown",
    "tear_down",
    "finalize",
    "destroy",
    "atexit",
    "on_exit",
    "close",
)

DEBUG_ENV = (
    "Re-run with TORCH_DISTRIBUTED_DEBUG=DETAIL: it checks that ranks call matching "
    "collectives and reports the first mismatch with op and shapes"
)
NCCL_DEBUG = "Set NCCL_DEBUG=INFO (NCCL_DEBUG_SUBSYS=COLL) and read the last lines each rank logged"
# A hung collective fails when its process group's timeout runs out. AReaL creates every
# group with DIST_GROUP_DEFAULT_TIMEOUT = 7200 s (areal/utils/constants.py:12 at cbff54d6,
# passed to init_process_group/new_group in areal/engine/fsdp_engine.py:322-334 and
# megatron_engine.py:373-400, and made torch's default by patch_dist_group_timeout,
# areal/engine/core/distributed.py:10-23). NCCL_TIMEOUT is read by neither torch nor AReaL.
AREAL_GROUP_TIMEOUT_S = 7200
AREAL_TIMEOUT = (
    f"AReaL creates every process group with a {AREAL_GROUP_TIMEOUT_S} s timeout "
    "(DIST_GROUP_DEFAULT_TIMEOUT in areal/utils/constants.py): a hung collective fails "
    "with an error only 2 hours after it started. NCCL_TIMEOUT changes nothing (neither "
    "torch nor AReaL reads it); to fail sooner, lower DIST_GROUP_DEFAULT_TIMEOUT, the "
    "`timeout=` AReaL passes to init_process_group and new_group"
)
GROUP_TIMEOUT = (
    "A hung collective fails only when its process group's timeout runs out: pass a "
    "shorter `timeout=` to init_process_group (torch's default: 10 min for NCCL, 30 min "
    "for gloo) so the next hang fails fast with an error. NCCL_TIMEOUT is not read by torch"
)


def timeout_advice(analysis: StackAnalysis) -> str:
    """How long this job hangs before failing, and what shortens it: AReaL's fixed
    7200 s for an AReaL job (a worker with an experiment/trial, or AReaL's frames in a
    group's stack; groups are few, so this stays cheap at 16,384 ranks)."""
    if any(r.job for r in analysis.capture.rank_stacks):
        return AREAL_TIMEOUT
    for g in analysis.groups:
        if any("/areal/" in f.file.replace("\\", "/") for f in g.frames):
            return AREAL_TIMEOUT
    return GROUP_TIMEOUT


LAUNCH_BLOCKING = (
    "CUDA_LAUNCH_BLOCKING=1 makes a kernel that never finishes show up in the stack of "
    "the rank that launched it"
)


# Where AReaL waits for rollout results (at AReaL cbff54d6): the dispatcher's blocking
# waits (areal/infra/workflow_executor.py:570 `wait_results`, :631 `wait_for_task`, :660
# `active_submit_and_wait`), reached from `prepare_batch`/`rollout_batch`/`wait` of the
# executor (:1307-1445), of the remote engines (areal/infra/remote_inf_engine.py:1367-1415,
# areal/engine/sglang_remote.py:602-637), of the single-controller RolloutController
# (areal/infra/controller/rollout_controller.py:981-1065) and of the SPMD coordinator that
# runs rollout on data-parallel heads only (areal/infra/dist_rollout.py:152-260).
ROLLOUT_WAITS = frozenset({"wait_results", "wait_for_task", "active_submit_and_wait"})
ROLLOUT_ENTRIES = frozenset({"prepare_batch", "rollout_batch", "wait"})
ROLLOUT_FILES = frozenset(
    {
        "workflow_executor.py",
        "remote_inf_engine.py",
        "rollout_controller.py",
        "dist_rollout.py",
        "sglang_remote.py",
        "vllm_remote.py",
    }
)
# The dispatcher's producer thread parks here when it may not submit: no staleness or
# concurrency capacity (StalenessManager.get_capacity() <= 0), rollout paused, or no input
# (areal/infra/workflow_executor.py:460-473).
ROLLOUT_PRODUCER_WAIT = "_get_next_task_for_submission"
BUSY_METRICS = (
    "sglang:num_running_reqs",
    "sglang:num_queue_reqs",
    "vllm:num_requests_running",
    "vllm:num_requests_waiting",
)
STALENESS_KEYS = (
    f"Raise `{config_key('rollout.max_head_offpolicyness')}` (default 0: no rollout may run "
    f"ahead of the trained weights) and `{config_key('rollout.max_concurrent_rollouts')}` "
    "(default: the consumer batch size); AReaL's debugging guide: if they are not large "
    "enough 'the rollout process will block indefinitely due to staleness control'"
)


@dataclass
class Diagnosis:
    pattern: str
    title: str
    detail: str
    evidence: list[str] = field(default_factory=list)
    suggestions: list[str] = field(default_factory=list)
    # Who waits for whom (from the collective ledger); None without a ledger.
    wait_for: WaitForGraph | None = field(default=None, compare=False, repr=False)

    def to_json(self) -> dict[str, Any]:
        return {
            "pattern": self.pattern,
            "title": self.title,
            "detail": self.detail,
            "evidence": list(self.evidence),
            "suggestions": list(self.suggestions),
        }


def _short(fn: str) -> str:
    return fn.rsplit(".", 1)[-1]


def _is_library(frame: Frame) -> bool:
    """Library code by package (torch and its deps, the stdlib, known infrastructure),
    never by install location: AReaL's frames and pip-installed trainers are user code."""
    return is_library_file(frame.file)


@per_stack
def collective_frame(frames: Stack) -> Frame | None:
    """The outermost torch.distributed collective the stack is in (None: not in one)."""
    found = None
    for frame in frames:  # leaf first: keep the last match, the one user code called
        if _short(frame.function) in COLLECTIVES and (
            "distributed" in frame.file or "c10d" in frame.file
        ):
            found = frame
    return found


def call_site(frames: Stack, below: Frame | None = None) -> Frame | None:
    """The innermost frame of user code (not torch, not the standard library)."""
    start = frames.index(below) + 1 if below is not None and below in frames else 0
    for frame in frames[start:]:
        if not _is_library(frame):
            return frame
    return frames[start] if start < len(frames) else None


@per_stack
def cleanup_frame(frames: Stack) -> Frame | None:
    for frame in frames:
        name = _short(frame.function).lower()
        if name in CLEANUP_FUNCTIONS or any(w in name for w in CLEANUP_WORDS):
            return frame
    return None


def _basename(path: str) -> str:
    return path.replace("\\", "/").rsplit("/", 1)[-1]


@per_stack
def rollout_wait_frame(frames: Stack) -> Frame | None:
    """The outermost AReaL frame waiting for rollout results (None: not waiting on rollout)."""
    wait = entry = None
    for frame in frames:  # leaf first: the first wait is the innermost one
        if _basename(frame.file) not in ROLLOUT_FILES:
            continue
        name = _short(frame.function)
        if name in ROLLOUT_WAITS and wait is None:
            wait = frame
        elif name in ROLLOUT_ENTRIES:
            entry = frame  # keep the outermost: the call the trainer made
    found = wait or entry
    if found is None or collective_frame(frames) is not None:
        return None  # a data-parallel peer in a broadcast: waiting at a barrier instead
    return found


@per_stack
def rollout_entry_frame(frames: Stack) -> Frame | None:
    """The outermost `prepare_batch`/`rollout_batch`/`wait` of AReaL's rollout code."""
    found = None
    for frame in frames:
        if _basename(frame.file) in ROLLOUT_FILES and _short(frame.function) in ROLLOUT_ENTRIES:
            found = frame
    return found


def describe(frames: Stack) -> str:
    """`all_reduce_grads -> all_reduce (file:line)` for evidence lines."""
    coll = collective_frame(frames)
    site = call_site(frames, coll)
    leaf = coll or (frames[0] if frames else None)
    if leaf is None:
        return "an empty stack"
    where = f"{_short(leaf.function)} ({leaf.location})"
    if site is not None and site != leaf:
        return f"{_short(site.function)} ({site.location}) -> {where}"
    return where


def short_where(frames: Stack) -> str:
    """`all_reduce_grads > all_reduce`: the call site and the collective (or the leaf)."""
    coll = collective_frame(frames)
    leaf = coll or (frames[0] if frames else None)
    if leaf is None:
        return "(no frames)"
    site = call_site(frames, coll)
    if site is not None and site != leaf:
        return f"{_short(site.function)} > {_short(leaf.function)}"
    return _short(leaf.function)


def _ranks_word(ranks: list[int]) -> str:
    return f"rank {ranks[0]}" if len(ranks) == 1 else f"ranks {brief_ranks(ranks)}"


def _calls(group: RankGroup) -> str:
    """`ranks 0-3 call all_reduce at train.py:16`."""
    coll = collective_frame(group.frames)
    site = call_site(group.frames, coll)
    name = _short(coll.function) if coll else "?"
    at = f" at {_basename(site.file)}:{site.line}" if site is not None and site != coll else ""
    verb = "calls" if group.size == 1 else "call"
    return f"{_ranks_word(group.ranks)} {verb} {name}{at}"


def mismatch_sentence(groups: list[RankGroup]) -> str:
    """The odd ranks first, then the rest: `Rank 4 calls broadcast at train.py:13 while ranks
    0-3 call all_reduce at train.py:16`; groups of one size are named in rank order."""
    by_rank = sorted(groups, key=lambda g: g.ranks[0] if g.ranks else 0)
    largest = max(g.size for g in groups)
    most = [g for g in groups if g.size == largest]
    if len(most) == 1:
        odd = [_calls(g) for g in by_rank if g is not most[0]]
        text = f"{', '.join(odd)} while {_calls(most[0])}"
    elif len(groups) == 2:
        text = f"{_calls(by_rank[0])} while {_calls(by_rank[1])}"
    else:
        text = "; ".join(_calls(g) for g in by_rank)
    return text[0].upper() + text[1:]


def _group_evidence(groups: list[RankGroup]) -> list[str]:
    return [f"{_ranks_word(g.ranks)} ({g.size}): {describe(g.frames)}" for g in groups]


def failure_reasons(failed: list[RankStack]) -> list[str]:
    """One line per distinct reason, with the ranks it hit: "ranks 0-3: py-spy not found"."""
    by_reason: dict[str, list[RankStack]] = {}
    for r in failed:
        by_reason.setdefault(r.error or r.state, []).append(r)
    lines = []
    for reason, ranks in by_reason.items():
        numbered = sorted(r.rank for r in ranks if r.rank is not None)
        pids = ", ".join(str(r.pid) for r in ranks[:8]) + (
            f", ... ({len(ranks)} processes)" if len(ranks) > 8 else ""
        )
        who = _ranks_word(numbered) if numbered else f"pid {pids}"
        lines.append(f"{who}: {reason}")
    return lines


def diagnose(analysis: StackAnalysis) -> Diagnosis:
    """Name the hang pattern of an analysed capture (the cyclic collector paused: the
    capture's records hold no cycles, and at 100,000 ranks its passes over them cost
    more than the diagnosis)."""
    with gc_paused():
        return _diagnose(analysis)


def _diagnose(analysis: StackAnalysis) -> Diagnosis:
    capture = analysis.capture
    groups = analysis.groups
    ranks = capture.rank_stacks
    failed = [r for r in ranks if r.state != "ok"]
    failed_note = [
        f"{_ranks_word([r.rank])} not captured: {r.error}" for r in failed if r.rank is not None
    ]

    if capture.samples > 1:
        moving = [r.rank for r in ranks if r.progressing and r.rank is not None]
        stuck = [r.rank for r in ranks if r.progressing is False and r.rank is not None]
        if moving and len(moving) >= len(stuck):
            evidence = [f"{_ranks_word(moving)}: stacks changed across {capture.samples} samples"]
            if stuck:
                evidence.append(f"{_ranks_word(stuck)}: identical in every sample")
            return Diagnosis(
                "progressing",
                "Slow, not hung: stacks change between samples",
                f"{len(moving)} of {len(moving) + len(stuck)} ranks moved in "
                f"{capture.samples} samples {capture.interval:g}s apart.",
                evidence + failed_note,
                [
                    "Profile instead of waiting: `py-spy record -o profile.svg --pid PID` on a "
                    "slow rank shows where the time goes",
                    "Compare step times across ranks in the logs: one slow rank makes every "
                    "rank slow at the next collective",
                    "If some ranks never change, capture again with more samples and look at "
                    "those ranks first",
                ],
            )

    if analysis.missing:
        where = _group_evidence(groups[:3])
        return Diagnosis(
            "missing_ranks",
            f"{_ranks_word(analysis.missing).capitalize()} missing: the process died",
            f"WORLD_SIZE is {analysis.world_size} but no node shows "
            f"{_ranks_word(analysis.missing)}; the surviving ranks wait for it.",
            [
                f"missing: {_ranks_word(analysis.missing)} of {analysis.world_size}",
                *where,
                *failed_note,
            ],
            [
                "Read the missing rank's log and exit status; check `dmesg` for the OOM "
                "killer and the node for GPU Xid errors",
                timeout_advice(analysis),
                "TORCH_DISTRIBUTED_DEBUG=DETAIL and NCCL_DEBUG=INFO make the next run "
                "report which peer went away",
                "Restart from the last checkpoint once the cause is fixed",
            ],
        )

    cleanup = [g for g in groups if cleanup_frame(g.frames) is not None]
    training = [g for g in groups if cleanup_frame(g.frames) is None]
    if not cleanup:
        updating = weight_update_stuck(analysis, failed_note, collective_frame)
        if updating is not None:
            notes = analysis.capture.rollout.notes if analysis.capture.rollout else []
            title, detail, evidence, suggestions = updating
            return Diagnosis("weight_update_stuck", title, detail, evidence, suggestions + notes)
        stall = rollout_stall(analysis, failed_note)
        if stall is not None:
            return stall

    if not groups and failed:
        return Diagnosis(
            "none",
            "Nothing captured: no rank's stack could be read",
            f"{len(failed)} {'rank' if len(failed) == 1 else 'ranks'} found, none dumped; "
            "so no hang pattern can be named. Why, per rank:",
            failure_reasons(failed) + [f"node {e.node}: {e.error}" for e in capture.errors],
            ["Fix what the reasons say on those nodes, then capture again"],
        )

    if not groups:
        return Diagnosis(
            "none",
            "No rank stacks captured",
            "No process with rank variables (RANK/WORLD_SIZE) was found on the chosen nodes.",
            [f"node {e.node}: {e.error}" for e in capture.errors],
            [
                "Check that the job runs on the chosen nodes",
                "Narrow the capture to the job's processes by their command line",
            ],
        )

    if cleanup and training:
        c_ranks = sorted(r for g in cleanup for r in g.ranks)
        t_ranks = sorted(r for g in training for r in g.ranks)
        frame = cleanup_frame(cleanup[0].frames)
        assert frame is not None
        return Diagnosis(
            "cleanup_deadlock",
            "Cleanup deadlock: some ranks are shutting down while others still train",
            f"{_ranks_word(c_ranks).capitalize()} entered a cleanup path "
            f"({_short(frame.function)}) and {'waits' if len(c_ranks) == 1 else 'wait'} there; "
            f"{_ranks_word(t_ranks)} still {'waits' if len(t_ranks) == 1 else 'wait'} in "
            "the training loop for them. Usually one rank raised and its cleanup calls a "
            "collective the others will never reach.",
            _group_evidence(cleanup) + _group_evidence(training) + failed_note,
            [
                f"Read the log of {_ranks_word(c_ranks)} for the exception that sent it "
                "to cleanup: that is the real error",
                "Do not call collectives (barrier, destroy_process_group) in exception or "
                "`finally` paths; on error, exit so the launcher stops the other ranks",
                DEBUG_ENV,
                timeout_advice(analysis),
            ],
        )

    in_coll = [g for g in groups if collective_frame(g.frames) is not None]
    if len(groups) > 1 and len(in_coll) == len(groups):
        kinds = {_short(f.function) for g in groups if (f := collective_frame(g.frames))}
        what = "different collectives" if len(kinds) > 1 else "different call sites"
        return Diagnosis(
            "collective_mismatch",
            f"Collective mismatch: ranks wait in {what}",
            f"{mismatch_sentence(groups)}; each waits for peers that called something else. "
            "Look for rank-dependent control flow before the divergence point.",
            _group_evidence(groups)
            + (
                [f"divergence point: {describe((analysis.divergence,))}"]
                if analysis.divergence
                else []
            )
            + failed_note,
            [
                DEBUG_ENV,
                "Check conditions that depend on the rank, data or a caught exception "
                "before these call sites (skipped batches, early `continue`)",
                NCCL_DEBUG,
                timeout_advice(analysis),
            ],
        )

    if in_coll:
        main = in_coll[0]
        others = [g for g in groups if g is not main]
        if not others:
            return Diagnosis(
                "same_collective",
                "Every rank waits in the same collective",
                f"All {main.size} ranks are blocked in {describe(main.frames)}. The "
                "collective itself does not complete: a network or NCCL problem, a peer "
                "outside this capture, or a slow rank.",
                _group_evidence(groups) + failed_note,
                [
                    NCCL_DEBUG,
                    "Check the network between nodes (NCCL_SOCKET_IFNAME, NCCL_IB_HCA, "
                    "firewall) and GPU health (nvidia-smi, Xid errors in dmesg)",
                    "Capture again with --samples 3 to tell a slow rank from a hang",
                    timeout_advice(analysis),
                    LAUNCH_BLOCKING,
                ],
            )
        stragglers = sorted(r for g in others for r in g.ranks)
        return Diagnosis(
            "same_collective",
            "Ranks wait in one collective for a straggler",
            f"{_ranks_word(main.ranks).capitalize()} {'waits' if main.size == 1 else 'wait'} "
            f"in {describe(main.frames)}; "
            f"{_ranks_word(stragglers)} never got there.",
            _group_evidence(groups) + failed_note,
            [
                f"Look at what {_ranks_word(stragglers)} is doing: the stack shows where "
                "it is stuck or slow",
                "Capture again with --samples 3 to see whether the straggler moves",
                LAUNCH_BLOCKING,
                NCCL_DEBUG,
            ],
        )

    return Diagnosis(
        "none",
        "No hang pattern recognised",
        "No rank is blocked in a collective or a cleanup path.",
        _group_evidence(groups[:5]) + failed_note,
        ["Capture again with --samples 3 --interval 2 to see whether the job moves"],
    )


def _in_coll(r: RankStack) -> bool:
    return collective_frame(r.work_frames) is not None


def _who(r: RankStack) -> str:
    return r.label if r.rank is not None else f"the {r.role or 'process'} (pid {r.pid} on {r.node})"


@per_stack
def producer_wait_frame(frames: Stack) -> Frame | None:
    """The innermost frame of a rollout producer waiting for its next task (None: none)."""
    return next((f for f in frames if _short(f.function) == ROLLOUT_PRODUCER_WAIT), None)


def rollout_stall(analysis: StackAnalysis, failed_note: list[str]) -> Diagnosis | None:
    """The controller (or the data-parallel heads) wait for rollout results while the
    trainers sit idle or at a barrier: rollout is blocked, not training."""
    capture = analysis.capture
    waiting: list[tuple[RankStack, Frame]] = []
    producer: list[tuple[RankStack, Frame]] = []
    for r in capture.ranks:
        if r.state != "ok" or r.server is not None:
            continue
        hit = rollout_wait_frame(r.work_frames)
        if hit is None and r.rank is None:
            for t in r.threads:  # the controller's waiting thread need not be its main one
                hit = rollout_wait_frame(t.frames)
                if hit is not None:
                    break
        if hit is not None:
            waiting.append((r, hit))
        for t in r.threads:
            if (frame := producer_wait_frame(t.frames)) is not None:
                producer.append((r, frame))
    if not waiting:
        return None
    waiter_ids = {id(r) for r, _ in waiting}
    others = [
        r
        for r in capture.rank_stacks
        if r.rank is not None and id(r) not in waiter_ids and r.state == "ok"
    ]
    at_barrier = sorted(r.rank for r in others if r.rank is not None and _in_coll(r))
    idle = sorted(r.rank for r in others if r.rank is not None and not _in_coll(r))
    servers = [r for r in capture.ranks if r.server is not None]
    bad = [r for r in servers if r.server is not None and r.server.ok is False]
    names = ", ".join(_who(r) for r, _ in waiting[:4]) + (" ..." if len(waiting) > 4 else "")
    first_rank, first = waiting[0]
    entry = next(
        (
            e
            for t in first_rank.threads
            if first in t.frames and (e := rollout_entry_frame(t.frames))
        ),
        None,
    )
    under = f", called from {_short(entry.function)} ({entry.location})" if entry else ""
    trainers = []
    if at_barrier:
        verb = "waits" if len(at_barrier) == 1 else "wait"
        trainers.append(f"{_ranks_word(at_barrier)} {verb} at a barrier or broadcast")
    if idle:
        trainers.append(f"{_ranks_word(idle)} {'sits' if len(idle) == 1 else 'sit'} idle")
    detail = (
        f"{names} {'waits' if len(waiting) == 1 else 'wait'} for rollout results in "
        f"{_short(first.function)} ({first.location}){under if entry != first else ''}"
        + (f"; {' and '.join(trainers)}" if trainers else "")
        + ". Training is not hung: rollout does not deliver. Either AReaL's staleness "
        "control allows no new rollout, or the rollouts in flight never finish "
        "(an inference server is down or stuck)."
    )
    evidence = []
    for r, wait in waiting[:8]:
        stack = next((t.frames for t in r.threads if wait in t.frames), r.work_frames)
        outer = rollout_entry_frame(stack)
        chain = (
            f"{_short(outer.function)} ({outer.location}) -> " if outer and outer != wait else ""
        )
        evidence.append(f"{_who(r)}: {chain}{_short(wait.function)} ({wait.location})")
    for r, frame in producer[:2]:
        evidence.append(
            f"{_who(r)}: the rollout producer thread waits in {_short(frame.function)} "
            f"({frame.location}): it may not submit (no staleness or concurrency "
            "capacity, rollout paused, or no input)"
        )
    if at_barrier:
        evidence.append(f"{_ranks_word(at_barrier)}: at a barrier or broadcast")
    if idle:
        evidence.append(f"{_ranks_word(idle)}: idle, no collective")
    for r in servers:
        assert r.server is not None
        evidence.append(
            f"{r.server.kind} server {r.server.address} (pid {r.pid} on {r.node}): "
            f"{r.server.health_text}"
        )
    summary = capture.rollout
    cap = summary.capacity if summary is not None else None
    if summary is not None and cap is not None:
        used = ", ".join(
            f"{k.removeprefix('rollout.')} {v['value']} ({v['from']})"
            for k, v in summary.config.items()
        )
        evidence.append(
            f"AReaL's rollout capacity recomputed: {cap.explanation}; capacity {cap.capacity}"
        )
        evidence.append(f"with {used}")
        if summary.counts is not None:
            evidence.append(f"counts from the {summary.counts.source}")
    idle_servers = [
        r
        for r in servers
        if r.server is not None
        and r.server.metrics
        and not any(r.server.metrics.get(n) for n in BUSY_METRICS)
    ]
    for r in idle_servers[:4]:
        assert r.server is not None
        evidence.append(
            f"{r.server.kind} server {r.server.address}: idle (no request running or queued)"
        )
    if cap is not None and cap.zero_terms:
        terms = " and ".join(cap.zero_terms)
        detail += (
            f" AReaL's capacity for new rollouts is {cap.capacity}: the {terms} "
            f"term{'s are' if len(cap.zero_terms) > 1 else ' is'} at or below zero."
        )
    suggestions = []
    if bad:
        listed = ", ".join(
            f"{r.server.kind} {r.server.address} on {r.node}" for r in bad if r.server
        )
        suggestions.append(
            f"Inference server(s) not healthy: {listed}. Rollouts cannot finish while a "
            "server is down: read its log (the rollout role's log in the experiment's log "
            "dir), restart it or the rollout workers"
        )
    if cap is not None and "staleness" in cap.zero_terms:
        suggestions.append(
            "The staleness term is spent: every rollout this version allows is accepted or "
            f"running, and the version does not advance. Raise `{config_key('rollout.max_head_offpolicyness')}`, "
            "or find why the trainer does not consume the accepted rollouts"
        )
    if cap is not None and "concurrency" in cap.zero_terms:
        suggestions.append(
            "The concurrency term is spent: the rollouts in flight never finish. Look at the "
            f"servers and reward functions, then `{config_key('rollout.max_concurrent_rollouts')}`"
        )
    suggestions.append(STALENESS_KEYS)
    if summary is not None:
        suggestions.extend(summary.notes)
    if not bad:
        suggestions.append(
            "Check that every inference server answers `GET /health` (`areal-console "
            "nodes` polls them) and read the rollout workers' logs"
        )
    suggestions.append(
        "Capture again with --samples 3: if the waiting stack moves, rollout is slow, not blocked"
    )
    return Diagnosis(
        "rollout_stall",
        "Rollout stall: the trainers wait for rollout results that do not come",
        detail[:1].upper() + detail[1:],
        evidence + failed_note,
        suggestions,
    )
