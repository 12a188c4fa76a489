"""The watch's loop: look at the job every interval (its processes, its AReaL log, and its
stacks while the log is quiet), hand each look to the decisions (`state.observe`), and on
a stall take the evidence (`evidence.take_evidence`).

Cheap by design: a look is one `sample` per node (no CPU% wait, no NVML) and the log's new
bytes; py-spy runs (non-blocking, one sample) only while the log is quiet. The state is
saved beside the evidence after every change, so a restarted watch knows the episode it
was in and does not take the same stall's evidence again.
"""

from __future__ import annotations

import hashlib
import json
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from areal_console.core.common.errors import UsageError, UserError
from areal_console.core.connection.fleet import Fleet, NodeFailure
from areal_console.core.connection.records import process_rows
from areal_console.core.metrics.follow import LocalFiles, MetricsFollower, NodeFiles
from areal_console.core.metrics.locate import job_log
from areal_console.core.metrics.store import MetricStore
from areal_console.core.rollout.context import rank_file
from areal_console.core.stacks.capture import CaptureOptions, capture_raw, sample_nodes
from areal_console.core.stacks.parsing import FrameTable, build_capture
from areal_console.core.stacks.records import RankStack
from areal_console.core.stacks.scope import (
    UNSCOPED,
    JobChoiceError,
    JobGroup,
    choose_job,
    group_jobs,
)
from areal_console.core.watch.evidence import (
    STATE_FILE,
    Evidence,
    EvidenceRequest,
    ServersState,
    prune,
    take_evidence,
)
from areal_console.core.watch.files import write_private
from areal_console.core.watch.state import (
    Event,
    Look,
    WatchConfig,
    WatchState,
    evidence_taken,
    log_quiet,
    observe,
    state_from_json,
    wants_stacks,
)

MAX_TRACED_RANKS = 8  # perf-tracer files looked at per look (their growth is what counts)
STEP_TIMES_KEPT = 64  # the log's last step times the stall judgement needs (and no more)
LOOK_TIMEOUT = 15.0  # a node's answer to one look (sample, py-spy)
# Distinct stacks the looks' frame table holds before it is replaced by an empty one.
MAX_TABLE_STACKS = 4096


@dataclass
class WatchTarget:
    """Which job to watch, and where its log is when its command lines do not say."""

    job: str | None = None
    match: str | None = None
    slurm_job: str | None = None
    log_path: str | None = None
    log_node: str | None = None
    log_owner: str | None = None

    def key(self, targets: str) -> str:
        """Names this watch's state file: the same job on the same targets, the same file."""
        text = json.dumps([targets, self.job, self.match, self.slurm_job, self.log_path])
        return hashlib.sha256(text.encode()).hexdigest()[:16]


Emit = Callable[[Event, str | None], None]
Note = Callable[[str], None]
OnEvidence = Callable[[Evidence, str | None], None]
TakeEvidence = Callable[[EvidenceRequest, Path, float], Evidence]
"""Takes a stall's evidence into a new folder of the root (OSError: no folder made)."""


class Watcher:
    """One job, watched until `stop` is set."""

    def __init__(
        self,
        fleet: Fleet,
        target: WatchTarget,
        config: WatchConfig,
        root: Path,
        keep: int,
        state_key: str,
        emit: Emit,
        note: Note,
        servers_state: ServersState | None = None,
        on_evidence: OnEvidence | None = None,
        clock: Callable[[], float] = time.time,
        take: TakeEvidence | None = None,
    ) -> None:
        """`take`: how a stall's evidence is taken (default: in this process, through
        `fleet`, with `servers_state`; the command takes it in a child process)."""
        self.fleet = fleet
        self.target = target
        self.config = config
        self.root = root
        self.keep = keep
        self.emit = emit
        self.note = note
        self.servers_state = servers_state
        self.on_evidence = on_evidence
        self.clock = clock
        self.take = take or self._take_here
        self.stop = threading.Event()
        self.state_name = STATE_FILE.format(key=state_key)
        self.state = self._load_state()
        self._saved = self.state
        self.job_key: str | None = None
        self.follower: MetricsFollower | None = None
        self._step_times: list[float] = []
        self._steps = 0
        self._log_error: str | None = None
        self._down: dict[str, str] = {}
        # One frame table for every look: a job's unchanged stacks are the same objects
        # each time, so what is remembered per stack object (records.per_stack) does not
        # grow by a look's worth of stacks at every look.
        self._frames = FrameTable()

    # state ----------------------------------------------------------------------------
    def _load_state(self) -> WatchState:
        try:
            with open(self.root / self.state_name, encoding="utf-8") as fh:
                return state_from_json(json.loads(fh.read(1 << 20)))
        except (OSError, ValueError):
            return WatchState()

    def _save_state(self) -> None:
        if self.state == self._saved:
            return
        try:
            write_private(self.root, self.state_name, json.dumps(self.state.to_json()).encode())
            self._saved = self.state
        except OSError as exc:
            self.note(f"state not saved in {self.root}: {exc}")

    # one look -------------------------------------------------------------------------
    def look(self) -> Look:
        at = self.clock()
        sampled = sample_nodes(self.fleet)
        self._reachability(sampled)
        ok = {n: r for n, r in sampled.items() if not isinstance(r, NodeFailure)}
        job = self._job(ok)
        if job is None and self.state.phase == "waiting" and ok:
            self._log_note("no job to watch on the targets yet (waiting for its processes)")
        seen = frozenset(_pids(job)) if job is not None else frozenset()
        pids: frozenset[str] | None = seen
        failed = {n for n, r in sampled.items() if isinstance(r, NodeFailure)}
        # The episode's processes on a node that did not answer are not known gone (a node
        # that held none of them changes nothing).
        held = {p for p in self.state.episode if p.rpartition(":")[0] in failed}
        if held:
            pids = seen | held
        steps, quiet, finished, why = self._follow_log(job)
        stacks = None
        if job is not None and wants_stacks(self.state, quiet, self.follower is not None,
                                            self.config.interval):  # fmt: skip
            stacks = self._stacks(job, sampled)
        spans = self._spans(job) if quiet is not None and quiet >= self.config.interval else None
        return Look(at, pids, steps, quiet, finished, stacks, why, spans)

    def _reachability(self, sampled: dict[str, Any]) -> None:
        """A note when a node stops answering, and when it answers again (the fleet
        reconnects on the next call, with backoff)."""
        for name, result in sampled.items():
            if isinstance(result, NodeFailure):
                if name not in self._down:
                    self._down[name] = result.error
                    self.note(f"{name}: unreachable ({result.error}); reconnecting")
            elif name in self._down:
                del self._down[name]
                self.note(f"{name}: reconnected")

    def _job(self, ok: dict[str, list[dict[str, Any]]]) -> JobGroup | None:
        """The watched job's processes now: the job seen before (by key), else the one
        `--job`/`--match` selects. Several jobs and no choice: UserError on the first look,
        none later (the note says why)."""
        jobs = group_jobs(ok, self.target.match, self.target.slurm_job)
        if self.job_key is not None:
            same = [g for g in jobs if g.key == self.job_key]
            if same:
                return same[0]
        try:
            chosen = choose_job(jobs, self.target.job)
        except JobChoiceError as exc:
            if not exc.jobs or (self.target.job is not None and "no job matches" in str(exc)):
                return None
            if self.job_key is None and self.state.phase == "waiting":
                raise UsageError(str(exc)) from None
            return None
        if len(chosen) != 1 or not chosen[0].processes:
            return None
        if chosen[0].key != UNSCOPED:
            self.job_key = chosen[0].key
        return chosen[0]

    def _follow_log(self, job: JobGroup | None) -> tuple[int | None, float | None, bool, str]:
        """(steps logged, seconds since the last, finished, the log's state in words);
        (None, None, False, "") while no log is followed."""
        if self.follower is None and job is not None:
            self.follower = self._open_log(job)
        follower = self.follower
        if follower is None:
            return None, None, False, ""
        try:
            follower.poll()
        except (UserError, OSError, KeyError, ValueError) as exc:
            self._log_note(f"log {follower.source or follower.path}: {exc}")
            return None, None, False, ""
        self._log_error = None
        store = follower.store
        if len(store.steps):
            self._steps += len(store.steps)
            self._step_times = (self._step_times + list(store.step_times))[-STEP_TIMES_KEPT:]
            # Steps are counted, not kept: a run of days keeps a flat memory.
            follower.store = MetricStore()
            if follower.parser is not None:
                follower.parser.store = follower.store
            if follower.tensorboard is not None:
                follower.tensorboard.store = follower.store
        quiet, why = log_quiet(self._step_times, follower.node_now(), follower.finished,
                               self.config.stall_after, follower.unread_bytes)  # fmt: skip
        return self._steps, quiet, follower.finished, why

    def _open_log(self, job: JobGroup) -> MetricsFollower | None:
        """The follower of the job's log: the path given, else the one every view finds
        (`job_log`: the log directory its command lines name, else the file its output goes
        to; read as the job's user's files only), else None (stacks alone judge)."""
        path, node, owner = self.target.log_path, self.target.log_node, self.target.log_owner
        if path is None:
            for name, procs in job.processes.items():
                session = self.fleet.session(name)
                user = str(procs[0].get("user") or session.hello.get("user") or "")
                found = job_log(process_rows(list(procs)), user)
                if found:
                    path, node, owner = found, name, user
                    break
        if path is None:
            self._log_note("no AReaL log named by the job's command lines or output (give --logs): "
                           "stalls are judged from its stacks")  # fmt: skip
            return None
        session = self.fleet.session(node) if node else self.fleet.sessions[0]
        local = session.spec.transport == "local"
        files = LocalFiles(owner) if local else NodeFiles(session, owner)
        self.note(f"following {'' if local else session.name + ':'}{path}")
        return MetricsFollower(path, files)

    def _spans(self, job: JobGroup | None) -> int | None:
        """Bytes in the ranks' perf-tracer files beside the followed log (AReaL's
        `<log dir>/perf_tracer/[<role>/]traces-r<rank>.jsonl`); None when there are none."""
        follower = self.follower
        if follower is None or job is None:
            return None
        base = follower.source.split(":", 1)[-1] if follower.files.node else follower.source
        log_dir = base if not base.endswith(".log") else base.rsplit("/", 1)[0]
        ranked = sorted((p for ps in job.processes.values() for p in ps
                         if isinstance(p.get("rank"), int)), key=lambda p: int(p["rank"]))  # fmt: skip
        total, found = 0, False
        for p in ranked[:MAX_TRACED_RANKS]:
            role = p.get("role") if isinstance(p.get("role"), str) else None
            for path in rank_file(log_dir, "perf_tracer", f"traces-r{p['rank']}.jsonl", role):
                try:
                    total += int(follower.files.read(path, 0, None, 1)["size"])
                except (UserError, KeyError, OSError, ValueError):
                    continue
                found = True
                break
        return total if found else None

    def _log_note(self, text: str) -> None:
        if text != self._log_error:
            self._log_error = text
            self.note(text)

    def _stacks(self, job: JobGroup, sampled: dict[str, Any]) -> str | None:
        """A signature of every process's stack (one non-blocking py-spy sample)."""
        options = CaptureOptions(samples=1, job=job.key, match=self.target.match,
                                 slurm_job=self.target.slurm_job, nonblocking=True,
                                 timeout=LOOK_TIMEOUT, ledger=False, rollout=False)  # fmt: skip
        try:
            raw = capture_raw(self.fleet, options, sampled)
            if self._frames.stacks_held() > MAX_TABLE_STACKS:
                self._frames = FrameTable()
            capture = build_capture(raw, self._frames)
        except Exception as exc:  # the job left meanwhile; a node dropped: no sample this look
            self._log_note(f"stacks not sampled: {exc}")
            return None
        signature, failed = stacks_signature(capture.ranks)
        if failed:  # py-spy missing or refused: say so, once, or no stall is seen
            from areal_console.core.stacks.diagnose import failure_reasons

            self._log_note("stacks not sampled: " + "; ".join(failure_reasons(failed)))
        return signature

    # the loop -------------------------------------------------------------------------
    def tick(self) -> None:
        """One look, its events, and the evidence of a stall."""
        look = self.look()
        before = self.state
        self.state, events, capture = observe(self.state, look, self.config)
        for event in events:
            self.emit(event, self.job_key)
        if self.state.episode_no != before.episode_no and before.phase != "waiting":
            self.note(f"new episode of the job: {len(self.state.episode)} processes")
        self._save_state()
        if capture:
            self._evidence(events[-1])

    def _evidence(self, stall: Event) -> None:
        request = EvidenceRequest(job=self.job_key, match=self.target.match,
                                  slurm_job=self.target.slurm_job, log_path=self.target.log_path,
                                  log_node=self.target.log_node, stall=stall.detail)  # fmt: skip
        if request.log_path is None and self.follower is not None:
            request.log_path = self.follower.path
            request.log_node = self.follower.files.node
        try:
            evidence = self.take(request, self.root, stall.at)
        except OSError as exc:  # the folder itself could not be made
            self.note(f"no evidence folder in {self.root}: {exc}")
            return
        parts = [k.removeprefix("report: ") for k in evidence.missing]
        missing = f"not collected: {', '.join(parts)} (why: watch.json)" if parts else ""
        self.state, event = evidence_taken(self.state, str(evidence.folder), self.clock(), missing)
        self.emit(event, self.job_key)
        self._save_state()
        if self.on_evidence is not None:
            self.on_evidence(evidence, self.job_key)
        for gone in prune(self.root, self.keep):
            self.note(f"removed the oldest evidence {gone} (--keep {self.keep})")

    def _take_here(self, request: EvidenceRequest, root: Path, at: float) -> Evidence:
        return take_evidence(self.fleet, request, root, at, self.servers_state)

    def run(self) -> None:
        """Look every interval until `stop` is set."""
        while not self.stop.is_set():
            started = time.monotonic()
            try:
                self.tick()
            except UsageError:
                raise  # several jobs and none chosen: the user has to say which
            except Exception as exc:  # a watch runs for days: one failed look is a note
                self._log_note(f"look failed ({type(exc).__name__}: {exc}); trying again")
            self.stop.wait(max(0.0, self.config.interval - (time.monotonic() - started)))

    def close(self) -> None:
        if self.follower is not None:
            self.follower.close()


def stacks_signature(ranks: list[RankStack]) -> tuple[str | None, list[RankStack]]:
    """(a signature of every process's work thread, the processes whose stacks were not
    read). The work thread is what groups and diffs compare: a helper thread that
    flickers between idle and busy does not count as moving. None when any process was
    not read: a sample that misses some (a dump that failed under load) is not compared,
    or the missing ones would read as stacks that moved."""
    failed = [r for r in ranks if r.state != "ok"]
    if failed or not ranks:
        return None, failed
    parts = [(r.node, r.pid, tuple(r.work_frames))
             for r in sorted(ranks, key=lambda r: (r.node, r.pid))]  # fmt: skip
    return hashlib.sha256(repr(parts).encode()).hexdigest(), []


def _pids(job: JobGroup) -> list[str]:
    return [f"{node}:{p['pid']}" for node, procs in job.processes.items() for p in procs]
