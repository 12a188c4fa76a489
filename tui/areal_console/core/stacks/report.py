"""Exports of a capture: the `stacks --json` document and a plain-text report."""

from __future__ import annotations

import json
import os
import re
from dataclasses import dataclass, field, replace
from typing import Any

from areal_console.core.common.textfmt import plural
from areal_console.core.ledger.collect import absent_note
from areal_console.core.ledger.verdict import stack_activity, with_ledger
from areal_console.core.rollout.perf_trace import phase_summary
from areal_console.core.stacks.coverage import capture_coverage
from areal_console.core.stacks.diagnose import Diagnosis, diagnose
from areal_console.core.stacks.merge import StackAnalysis, analyse, format_ranks, group_name
from areal_console.core.stacks.nccl_ras import RasStatus
from areal_console.core.stacks.records import Frame, RankStack, Stack, StackCapture
from areal_console.core.stacks.slow_evidence import with_slow_evidence

SOURCE_NAMES = {"py-spy": "py-spy", "worker_server": "worker server"}


@dataclass
class AnalysedCapture:
    """A capture analysed once: its groups and tree, and its diagnosis. Every output of a
    capture (the saved file, `--json`, the text report, `--save`) is made from this, so a
    capture is never merged and diagnosed twice."""

    analysis: StackAnalysis
    diagnosis: Diagnosis
    _doc: dict[str, Any] | None = field(default=None, repr=False, compare=False)

    @property
    def capture(self) -> StackCapture:
        return self.analysis.capture

    def json(self) -> dict[str, Any]:
        """The `stacks --json` document (made once; the same dict on every call)."""
        if self._doc is None:
            self._doc = capture_json(self.capture, self.analysis, self.diagnosis)
        return self._doc

    def text(self) -> str:
        """The plain-text report."""
        return text_report(self.capture, self.analysis, self.diagnosis)


def analysed(capture: StackCapture) -> AnalysedCapture:
    """Merge, group and diagnose `capture` (the collective ledger included), once."""
    analysis = analyse(capture)
    return AnalysedCapture(analysis, full_diagnosis(analysis))


def capture_json(
    capture: StackCapture,
    analysis: StackAnalysis | None = None,
    diagnosis: Diagnosis | None = None,
) -> dict[str, Any]:
    """The `stacks --json` document (docs/guide/cli-json.md) (plus `id` and `interval` when known)."""
    analysis = analysis or analyse(capture)
    diagnosis = diagnosis or full_diagnosis(analysis)
    # Ranks share interned stacks: encode each distinct stack once.
    encoded: dict[Stack, list[dict[str, Any]]] = {}

    def frames_json(frames: Stack) -> list[dict[str, Any]]:
        found = encoded.get(frames)
        if found is None:
            found = encoded[frames] = [f.to_json() for f in frames]
        return found

    ranks = []
    for r in capture.ranks:
        doc_rank = r.to_json(with_threads=False)
        doc_rank["threads"] = [
            {"name": t.name, "tid": t.tid, "idle": t.idle, "frames": frames_json(t.frames)}
            | ({"locals": t.locals} if t.locals is not None else {})
            for t in r.threads
        ]
        ranks.append(doc_rank)
    doc: dict[str, Any] = {
        "captured_at": capture.captured_at,
        "samples": capture.samples,
        "ranks": ranks,
        "groups": [g.to_json() for g in analysis.groups],
        "diagnosis": diagnosis.to_json(),
        "errors": [e.to_json() for e in capture.errors],
        "coverage": capture_coverage(capture).to_json(),
        "ledger": capture.ledger.to_json() if capture.ledger is not None else None,
        "rollout": capture.rollout.to_json() if capture.rollout is not None else None,
        "ended_roles": list(capture.ended_roles),
        "idle_gpus": list(capture.idle_gpus),
    }
    if capture.nccl_ras is not None:
        doc["nccl_ras"] = capture.nccl_ras.to_json()
    if doc["ledger"] is not None:
        graph = diagnosis.wait_for
        doc["ledger"]["wait_for"] = (graph.to_json() if graph is not None else
                                     {"edges": [], "edges_left_off": 0, "cycles": [], "roots": []})  # fmt: skip
    if capture.capture_id:
        doc["id"] = capture.capture_id
    doc["interval"] = capture.interval
    if capture.job:
        doc["job"] = capture.job
    if capture.user:
        doc["user"] = capture.user
    if capture.rank_source:
        doc["rank_source"] = capture.rank_source
    if capture.tags:  # a reopened capture keeps what took it, and its evidence
        doc["tags"] = list(capture.tags)
    if capture.watch_evidence or capture.watch_report:
        doc["watch"] = {"evidence": capture.watch_evidence, "report": capture.watch_report}
    return doc


_COMPACT = json.JSONEncoder(separators=(",", ":"))


def compact_json(doc: dict[str, Any]) -> str:
    """`json.dumps(doc, separators=(",", ":"))` of a `capture_json` document, the same
    text, made faster: its ranks' threads share frame lists (one per distinct stack), and
    each is encoded once instead of once per thread."""
    encoded: dict[int, tuple[Any, str]] = {}  # id(frames list) -> (the list, its JSON)
    out: list[str] = []
    put = out.append

    def spliced(obj: Any, last: str, inner: Any) -> None:
        """`obj`, a dict whose last key is `last`, with that value written by `inner`."""
        head = _COMPACT.encode({k: v for k, v in obj.items() if k != last})
        put(head[:-1] + ("," if len(head) > 2 else "") + _COMPACT.encode(last) + ":")
        inner(obj[last])
        put("}")

    def frames(value: Any) -> None:
        found = encoded.get(id(value))
        if found is None or found[0] is not value:
            found = encoded[id(value)] = (value, _COMPACT.encode(value))
        put(found[1])

    def thread(value: Any) -> None:
        if isinstance(value, dict) and list(value)[-1:] == ["frames"]:
            spliced(value, "frames", frames)
        else:
            put(_COMPACT.encode(value))

    def threads(value: Any) -> None:
        if not isinstance(value, list):
            put(_COMPACT.encode(value))
            return
        put("[")
        for i, t in enumerate(value):
            if i:
                put(",")
            thread(t)
        put("]")

    def rank(value: Any) -> None:
        if isinstance(value, dict) and list(value)[-1:] == ["threads"]:
            spliced(value, "threads", threads)
        else:
            put(_COMPACT.encode(value))

    put("{")
    for n, (key, value) in enumerate(doc.items()):
        put(("," if n else "") + _COMPACT.encode(key) + ":")
        if key == "ranks" and isinstance(value, list):
            put("[")
            for i, r in enumerate(value):
                if i:
                    put(",")
                rank(r)
            put("]")
        else:
            put(_COMPACT.encode(value))
    put("}")
    return "".join(out)


def indented_json(doc: dict[str, Any], indent: int = 1) -> str:
    """`json.dumps(doc, indent=indent)` of a `capture_json` document, the same text: each
    shared frame list is encoded once (as a placeholder while the rest is encoded, then
    put back at the indentation of its line), since the indenting encoder is Python's
    slow one and 4,096 ranks have 600,000 frames but a few distinct stacks."""
    nonce = os.urandom(6).hex()
    tokens: dict[int, tuple[Any, str, int]] = {}  # id(frames) -> (frames, token, number)

    def token(frames: Any) -> str:
        found = tokens.get(id(frames))
        if found is None or found[0] is not frames:
            found = tokens[id(frames)] = (frames, f"\0{nonce}:{len(tokens)}\0", len(tokens))
        return found[1]

    def thread(t: Any) -> Any:
        if isinstance(t, dict) and isinstance(t.get("frames"), list):
            return dict(t, frames=token(t["frames"]))
        return t

    def rank(r: Any) -> Any:
        if isinstance(r, dict) and isinstance(r.get("threads"), list):
            return dict(r, threads=[thread(t) for t in r["threads"]])
        return r

    ranks = doc.get("ranks")
    swapped = dict(doc, ranks=[rank(r) for r in ranks]) if isinstance(ranks, list) else doc
    text = json.dumps(swapped, indent=indent)
    encoded = {n: json.dumps(frames, indent=indent) for frames, _, n in tokens.values()}

    def put_back(m: re.Match[str]) -> str:
        line = m.string.rfind("\n", 0, m.start()) + 1
        depth = len(m.string[line : m.start()]) - len(m.string[line : m.start()].lstrip(" "))
        return encoded[int(m.group(1))].replace("\n", "\n" + " " * depth)

    return re.sub(rf'"\\u0000{nonce}:(\d+)\\u0000"', put_back, text)


def full_diagnosis(analysis: StackAnalysis) -> Diagnosis:
    """The stacks' diagnosis, with the collective ledger's findings when there is one."""
    ledger = analysis.capture.ledger
    found = diagnose(analysis)
    if ledger is not None:
        found = with_ledger(found, ledger, stack_activity(analysis))
    return with_slow_evidence(with_ras(found, analysis.capture.nccl_ras), analysis)


def ledger_lines(capture: StackCapture, diagnosis: Diagnosis | None = None) -> list[str]:
    """The report's "Collective ledger" section (one line when there is none), with who
    waits for whom."""
    ledger = capture.ledger
    errors = [f"  error: {e}" for e in (ledger.errors if ledger is not None else ())]
    if ledger is None or not ledger.groups:
        return ["", "Collective ledger: " + absent_note(ledger), *errors]
    lines = ["", "Collective ledger (Flight Recorder):", *errors]
    for g in ledger.used_groups:
        lines.append(f"  {g.label}, {g.members_label}: {g.summary()}")
        lines += [f"    ! {p}" for p in g.problems()]
    lines += [f"  note: {n}" for n in ledger.notes]
    graph = diagnosis.wait_for if diagnosis is not None else None
    if graph is not None and not graph.empty:
        lines += ["", "Who waits for whom (from the ledger):"]
        lines += [f"  {line}" for line in graph.lines()]
    return lines


def source_summary(ranks: list[RankStack]) -> str:
    """Where the ranks' stacks came from, e.g. `py-spy: ranks 0-1 · worker server: ranks
    2-3` ("" when no rank says: an older capture, or none captured)."""
    by_source: dict[str, list[int]] = {}
    for r in ranks:
        if r.rank is not None and r.source in SOURCE_NAMES:
            by_source.setdefault(r.source, []).append(r.rank)
    parts = []
    for source, numbers in by_source.items():
        who = "rank" if len(numbers) == 1 else "ranks"
        parts.append(f"{SOURCE_NAMES[source]}: {who} {format_ranks(numbers)}")
    return " · ".join(parts)


def _frame_line(frame: Frame) -> str:
    return f"{frame.function} ({frame.file}:{frame.line})"


def text_report(
    capture: StackCapture,
    analysis: StackAnalysis | None = None,
    diagnosis: Diagnosis | None = None,
    max_frames: int = 40,
) -> str:
    """A report to read in a terminal or paste into an issue."""
    analysis = analysis or analyse(capture)
    diagnosis = diagnosis or full_diagnosis(analysis)
    ranks = capture.rank_stacks
    ok = sum(1 for r in ranks if r.state == "ok")
    lines = [
        f"Stack capture {capture.capture_id or ''} at {capture.captured_at}".replace("  ", " "),
        f"{plural(len(ranks), 'rank')} ({ok} captured)"
        + (f", world size {analysis.world_size}" if analysis.world_size else "")
        + f", {plural(len(analysis.groups), 'group')}, {plural(capture.samples, 'sample')}"
        + (f", job {capture.job}" if capture.job else ""),
        f"Coverage: {capture_coverage(capture).line()}",
        *([f"Stacks from {sources}"] if (sources := source_summary(ranks)) else []),
        *([f"Taken by: {taken}"] if (taken := taken_by(capture)) else []),
        *_import_lines(capture),
        "",
        f"DIAGNOSIS [{diagnosis.pattern}] {diagnosis.title}",
        f"  {diagnosis.detail}",
    ]
    if diagnosis.evidence:
        lines.append("  Evidence:")
        lines += [f"    - {e}" for e in diagnosis.evidence]
    if diagnosis.suggestions:
        lines.append("  Next steps:")
        lines += [f"    - {s}" for s in diagnosis.suggestions]
    lines += ledger_lines(capture, diagnosis)
    if capture.nccl_ras is not None:
        ras = capture.nccl_ras
        version = f", NCCL {ras.nccl_version}" if ras.nccl_version else ""
        lines += ["", f"NCCL RAS ({ras.address or 'no address'}{version}):", *ras.lines()]
    phases = phase_summary([(r.rank, r.phase) for r in ranks if r.rank is not None and r.phase])
    if phases:
        lines += ["", f"Step phases (perf tracer): {phases}"]
    if analysis.divergence is not None:
        lines += ["", f"Divergence point: {_frame_line(analysis.divergence)}"]
    for i, g in enumerate(analysis.groups):
        flag = "  (outlier)" if g.outlier else ""
        who = "rank" if g.size == 1 else "ranks"
        lines += ["", f"Group {group_name(i)}: {who} {g.label} ({g.size}){flag}"]
        frames = g.frames[:max_frames]
        lines += [f"    {_frame_line(f)}" for f in frames]
        if len(g.frames) > max_frames:
            lines.append(f"    ... {len(g.frames) - max_frames} more frames")
    others = [r for r in capture.ranks if r.rank is None and r.state == "ok"]
    if others:
        lines += ["", "Other job processes:"]
        for r in others:
            leaf = r.work_frames[0] if r.work_frames else None
            where = _frame_line(leaf) if leaf else "no frames"
            extra = f" [{r.server.address}: {r.server.health_text}]" if r.server else ""
            job = f" of {r.job}" if r.job else ""
            lines.append(f"  {r.role or 'process'}{job} pid {r.pid} on {r.node}{extra}: {where}")
    lines += _locals_lines(capture)
    failed = [r for r in capture.ranks if r.state != "ok"]
    if failed or capture.errors:
        lines += ["", "Errors:"]
        lines += [f"  {r.label} (pid {r.pid} on {r.node}): {r.state}: {r.error}" for r in failed]
        lines += [f"  node {e.node}: {e.error}" for e in capture.errors]
    return "\n".join(lines) + "\n"


MAX_FILES_LISTED = 16  # the import's files named one per line; past it, counted
_RANKS_FROM = {
    "dump": "Ranks as the dumps name them; files:",
    "file_name": "Ranks from the numbers in the file names; files:",
    "argument_order": "Ranks follow argument order (not every file name has a rank number); files:",
}


def taken_by(capture: StackCapture, home: str | None = None) -> str:
    """What took a saved capture and where its evidence is, in words ("" for a person's):
    `[watch] · report: /ev/20261129-031240-job/report.md`; a path in `home` as `~/...`."""
    if not capture.tags:
        return ""
    words = " ".join(f"[{t}]" for t in capture.tags)

    def shown(path: str) -> str:
        base = (home or "").rstrip("/")
        return "~" + path[len(base) :] if base and path.startswith(base + "/") else path

    if capture.watch_report:
        return f"{words} · report: {shown(capture.watch_report)}"
    if capture.watch_evidence:
        return f"{words} · evidence: {shown(capture.watch_evidence)}"
    return words


def _import_lines(capture: StackCapture) -> list[str]:
    """An imported capture: which file became which rank."""
    if capture.rank_source is None:
        return []
    lines = [_RANKS_FROM.get(capture.rank_source, "Files:")]
    by_file: dict[str, list[RankStack]] = {}
    for r in capture.rank_stacks:
        by_file.setdefault(r.node, []).append(r)
    for node, ranks in list(by_file.items())[:MAX_FILES_LISTED]:
        if len(ranks) == 1:
            pid = f" (pid {ranks[0].pid})" if ranks[0].pid else ""
            lines.append(f"  rank {ranks[0].rank}: {node}{pid}")
        else:  # a loop's output or one node's dumps in one file: its ranks as ranges
            numbers = [r.rank for r in ranks if r.rank is not None]
            lines.append(f"  ranks {format_ranks(numbers)}: {node}")
    if len(by_file) > MAX_FILES_LISTED:  # 512 files must not push the diagnosis off screen
        more = len(by_file) - MAX_FILES_LISTED
        lines.append(f"  ... and {plural(more, 'more file')} (`--json` names each rank's file)")
    return lines


def _locals_lines(capture: StackCapture, max_per_rank: int = 30) -> list[str]:
    """With --locals: each rank's main-thread variables, innermost frame first."""
    lines: list[str] = []
    for r in capture.ranks:
        main = r.main_thread
        if main is None or not main.locals:
            continue
        lines += ["", f"Locals of {r.label} (pid {r.pid} on {r.node}), main thread:"]
        shown = 0
        for frame, variables in zip(main.frames, main.locals, strict=False):
            if not variables:
                continue
            lines.append(f"  {_frame_line(frame)}")
            for v in variables:
                lines.append(f"      {v['name']} = {v['repr']}")
                shown += 1
            if shown >= max_per_rank:
                lines.append("      ...")
                break
    return lines


RAS_EVIDENCE_PREFIX = "NCCL RAS: "
RAS_SUGGESTION = (
    "NCCL's RAS counts show who is behind: look at what the lagging ranks are doing (their "
    "stacks above), and run `ncclras -v` on a node of the job for its full report"
)


def with_ras(diagnosis: Diagnosis, ras: RasStatus | None) -> Diagnosis:
    """`diagnosis` with NCCL RAS's findings: each lag as evidence; where the stacks alone
    see every rank in the same collective (or nothing), the title names the ranks whose
    collective count lags: the ones the others wait on."""
    if ras is None or ras.error:
        return diagnosis
    findings = ras.findings()
    dead = [
        f"comm {c.hash}: ranks {format_ranks(c.dead)} considered dead" for c in ras.comms if c.dead
    ]
    if not findings and not dead:
        return diagnosis
    evidence = [RAS_EVIDENCE_PREFIX + f for f in (dead + findings)[:12]] + list(diagnosis.evidence)
    suggestions = list(diagnosis.suggestions)
    if RAS_SUGGESTION not in suggestions:
        suggestions.insert(0, RAS_SUGGESTION)
    diagnosis = replace(diagnosis, evidence=evidence, suggestions=suggestions)
    lagging = ras.lagging_ranks()
    if lagging and diagnosis.pattern in ("same_collective", "none"):
        who = f"rank {lagging[0]}" if len(lagging) == 1 else f"ranks {format_ranks(lagging)}"
        title = f"{diagnosis.title}; NCCL RAS: the others wait on {who} (its collective count lags)"
        diagnosis = replace(diagnosis, title=title)
    return diagnosis
