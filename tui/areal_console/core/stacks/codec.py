"""The saved / exported capture JSON (`stacks --json`, docs/guide/cli-json.md) back into the
records of `records` (each record writes itself with its `to_json`)."""

from __future__ import annotations

import contextlib
import operator
from typing import TYPE_CHECKING, Any

from areal_console.core.common.textfmt import MAX_CMDLINE, capped
from areal_console.core.rollout.perf_trace import RankPhase
from areal_console.core.stacks.parsing import FrameTable, gc_paused
from areal_console.core.stacks.records import (
    MAIN_THREAD,
    STACK_SOURCES,
    NodeError,
    RankStack,
    ServerInfo,
    Stack,
    StackCapture,
    Thread,
)

if TYPE_CHECKING:
    from areal_console.core.ledger.analyse import Ledger
    from areal_console.core.rollout.context import RolloutSummary
    from areal_console.core.stacks.nccl_ras import RasStatus


_FRAME_FIELDS = operator.itemgetter("function", "file", "line")


def _stack_of(table: FrameTable, read: dict[Any, Stack], frames: Any) -> Stack:
    """A thread's `frames` (a list of {function, file, line}) as an interned stack: the
    ranks of a job share a few stacks, so each is checked and built once, found again by
    its fields (picked at C speed)."""
    try:
        key = tuple(map(_FRAME_FIELDS, frames))
        return read[key]
    except (KeyError, TypeError):
        pass  # not read yet, or not a list of frames: built (or refused) below
    stack = table.intern(
        tuple(table.frame(str(f["function"]), str(f["file"]), int(f["line"])) for f in frames)
    )
    with contextlib.suppress(TypeError):  # an unhashable field: stays unremembered
        read[tuple(map(_FRAME_FIELDS, frames))] = stack
    return stack


def capture_from_json(data: dict[str, Any]) -> StackCapture:
    with gc_paused():
        return _capture_from_json(data)


def _capture_from_json(data: dict[str, Any]) -> StackCapture:
    table = FrameTable()
    read: dict[Any, Stack] = {}
    ranks = []
    for r in data.get("ranks", []):
        threads = [
            Thread(
                name=str(t.get("name", "")),
                tid=int(t.get("tid") or 0),
                frames=_stack_of(table, read, t.get("frames", [])),
                idle=bool(t.get("idle")),
                is_main=False,
                locals=t.get("locals"),
            )
            for t in r.get("threads", [])
        ]
        main = next((t for t in threads if t.name == MAIN_THREAD or t.tid == r.get("pid")), None)
        if main is None and threads:
            main = threads[0]
        if main is not None:
            main.is_main = True
        ranks.append(
            RankStack(
                node=str(r.get("node")),
                pid=int(r.get("pid") or 0),
                rank=r.get("rank"),
                local_rank=r.get("local_rank"),
                world_size=r.get("world_size"),
                role=r.get("role"),
                cmdline=capped(str(r.get("cmdline") or ""), MAX_CMDLINE),
                state=str(r.get("state") or "ok"),
                error=r.get("error"),
                progressing=r.get("progressing"),
                threads=threads,
                job=r.get("job"),
                server=ServerInfo.from_json(r.get("server")),
                phase=RankPhase.from_json(r.get("phase"), r.get("rank")),
                source=r["source"] if r.get("source") in STACK_SOURCES else None,
                stdout=r["stdout"] if isinstance(r.get("stdout"), str) else None,
            )
        )
    return StackCapture(
        captured_at=str(data.get("captured_at") or ""),
        samples=int(data.get("samples") or 1),
        ranks=ranks,
        errors=[NodeError(str(e.get("node")), str(e.get("error"))) for e in data.get("errors", [])],
        interval=float(data.get("interval") or 0.0),
        capture_id=data.get("id"),
        job=data.get("job"),
        ledger=_ledger_from_json(data.get("ledger")),
        user=data["user"] if isinstance(data.get("user"), str) else None,
        rollout=_rollout_from_json(data.get("rollout")),
        nccl_ras=_ras_from_json(data.get("nccl_ras")),
        rank_source=data["rank_source"] if isinstance(data.get("rank_source"), str) else None,
        ended_roles=_dicts(data.get("ended_roles")),
        idle_gpus=_dicts(data.get("idle_gpus")),
    )


def _dicts(value: Any, most: int = 64) -> list[dict[str, Any]]:
    """A list of JSON objects as it came (the others left out), at most `most`."""
    return [v for v in value[:most] if isinstance(v, dict)] if isinstance(value, list) else []


def _ras_from_json(doc: Any) -> RasStatus | None:
    from areal_console.core.stacks.nccl_ras import RasStatus

    return RasStatus.from_json(doc)


def _rollout_from_json(doc: Any) -> RolloutSummary | None:
    from areal_console.core.rollout.context import RolloutSummary

    return RolloutSummary.from_json(doc)


def _ledger_from_json(doc: Any) -> Ledger | None:
    from areal_console.core.ledger.analyse import ledger_from_json

    return ledger_from_json(doc) if isinstance(doc, dict) else None
