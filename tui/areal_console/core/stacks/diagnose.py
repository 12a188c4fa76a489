"""Name the hang: which of AReaL's debugging-guide patterns the stacks show, and what next.

Patterns, checked in this order (the first that fits wins):
- `progressing`: repeated samples differ, so the job is slow rather than hung.
- `missing_ranks`: WORLD_SIZE promises ranks that no node shows (a rank died).
- `cleanup_deadlock`: some ranks are in a cleanup/exit path, others in the training loop.
- `collective_mismatch`: ranks wait in different collectives or at different call sites.
- `same_collective`: every rank waits in the same collective (network/NCCL, or a straggler).
- `none`: nothing that looks like a hang.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from areal_console.core.stacks.merge import RankGroup, StackAnalysis, format_ranks
from areal_console.core.stacks.model import Frame, RankStack, Stack

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
NCCL_TIMEOUT = (
    "Lower the collective timeout (NCCL_TIMEOUT, or `timeout=` in init_process_group) so "
    "a hang fails fast with an error instead of waiting"
)
LAUNCH_BLOCKING = (
    "CUDA_LAUNCH_BLOCKING=1 makes a kernel that never finishes show up in the stack of "
    "the rank that launched it"
)


@dataclass
class Diagnosis:
    pattern: str
    title: str
    detail: str
    evidence: list[str] = field(default_factory=list)
    suggestions: list[str] = field(default_factory=list)

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
    f = frame.file
    return (
        "/torch/" in f
        or "site-packages" in f
        or "dist-packages" in f
        or "/lib/python3" in f
        or f.startswith("<")
    )


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


def cleanup_frame(frames: Stack) -> Frame | None:
    for frame in frames:
        name = _short(frame.function).lower()
        if name in CLEANUP_FUNCTIONS or any(w in name for w in CLEANUP_WORDS):
            return frame
    return None


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
    return f"rank {ranks[0]}" if len(ranks) == 1 else f"ranks {format_ranks(ranks)}"


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
        who = _ranks_word(numbered) if numbered else f"pid {', '.join(str(r.pid) for r in ranks)}"
        lines.append(f"{who}: {reason}")
    return lines


def diagnose(analysis: StackAnalysis) -> Diagnosis:
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
                NCCL_TIMEOUT,
                "TORCH_DISTRIBUTED_DEBUG=DETAIL and NCCL_DEBUG=INFO make the next run "
                "report which peer went away",
                "Restart from the last checkpoint once the cause is fixed",
            ],
        )

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
                "Narrow the capture to the job's processes (a filter on the Cluster screen, "
                "--match on the command line)",
            ],
        )

    cleanup = [g for g in groups if cleanup_frame(g.frames) is not None]
    training = [g for g in groups if cleanup_frame(g.frames) is None]
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
                NCCL_TIMEOUT,
            ],
        )

    in_coll = [g for g in groups if collective_frame(g.frames) is not None]
    if len(groups) > 1 and len(in_coll) == len(groups):
        kinds = {_short(f.function) for g in groups if (f := collective_frame(g.frames))}
        sites = {call_site(g.frames, collective_frame(g.frames)) for g in groups}
        what = "different collectives" if len(kinds) > 1 else "the same collective"
        site_word = "different call sites" if len(sites) > 1 else "one call site"
        return Diagnosis(
            "collective_mismatch",
            "Collective mismatch: ranks wait in different collectives",
            f"All {sum(g.size for g in groups)} ranks are blocked in {what} at {site_word} "
            f"({', '.join(sorted(kinds))}); each waits for peers that called something else. "
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
                NCCL_TIMEOUT,
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
                    NCCL_TIMEOUT,
                    LAUNCH_BLOCKING,
                ],
            )
        stragglers = sorted(r for g in others for r in g.ranks)
        return Diagnosis(
            "same_collective",
            "Ranks wait in one collective for a straggler",
            f"{_ranks_word(main.ranks).capitalize()} wait in {describe(main.frames)}; "
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
