"""`areal-console watch`: watch a job unattended; on a stall, keep the evidence."""

from __future__ import annotations

import argparse
import json
import os
import re
import signal
import subprocess
import sys
import time
from pathlib import Path
from types import FrameType
from typing import Any

from areal_console.commands.options import target_options
from areal_console.core.common.errors import EXIT_OK, UsageError, UserError
from areal_console.core.targets.resolve import (
    add_target_arguments,
    areal_plan,
    count,
    open_fleet,
    resolve_targets,
    seconds,
)

DEFAULT_STALL_AFTER = 900.0
DEFAULT_INTERVAL = 30.0
DEFAULT_KEEP = 20
EXIT_INTERRUPTED = 130


def register(subparsers: Any) -> None:
    parser = subparsers.add_parser(
        "watch",
        help="watch a job unattended; on a stall keep its stacks, ledger, servers and a report",
        description=(
            "Follow one job: new steps in its AReaL log, its processes, and (only while the "
            "log is quiet) its stacks. On a stall (no new step for --stall-after seconds, or "
            "stacks unchanged that long while no step came) write, into a new 0700 folder "
            "under --evidence: the stack capture (3 samples; also listed by `stacks --list`, "
            "tagged watch), the collective ledger, the servers' state and a report in "
            "AReaL's issue template with its bundle; then run --exec. One line per event: "
            "stall, evidence, recovered, gone."
        ),
    )
    add_target_arguments(parser)
    scope = parser.add_mutually_exclusive_group()
    scope.add_argument("--job", metavar="KEY",
                       help="the job, when the nodes run several (a key `stacks` lists)")  # fmt: skip
    scope.add_argument("--match", metavar="REGEX",
                       help="the job whose processes' command lines match")  # fmt: skip
    parser.add_argument("--stall-after", type=seconds, default=DEFAULT_STALL_AFTER,
                        metavar="SECONDS", help="no new step for this long is a stall "
                        f"(default {DEFAULT_STALL_AFTER:g})")  # fmt: skip
    parser.add_argument("--interval", type=seconds, default=DEFAULT_INTERVAL, metavar="SECONDS",
                        help=f"seconds between looks at the job (default {DEFAULT_INTERVAL:g})")  # fmt: skip
    parser.add_argument("--evidence", metavar="DIR",
                        help="where evidence folders go (default: watch/ in the data "
                        "directory)")  # fmt: skip
    parser.add_argument("--keep", type=count, default=DEFAULT_KEEP, metavar="N",
                        help=f"evidence folders kept, oldest removed first (default {DEFAULT_KEEP})")  # fmt: skip
    parser.add_argument("--exec", dest="exec_cmd", metavar="CMD",
                        help="a shell command run after each stall's evidence, with "
                        "AREAL_CONSOLE_EVENT, AREAL_CONSOLE_EVIDENCE, AREAL_CONSOLE_REPORT "
                        "and AREAL_CONSOLE_JOB in its environment")  # fmt: skip
    parser.add_argument("--logs", metavar="PATH",
                        help="the run's log directory or file, when its command lines do "
                        "not name it")  # fmt: skip
    parser.add_argument("--node", metavar="NAME", help="the node that holds --logs")
    parser.add_argument("--json", action="store_true", help="one JSON object per event")
    parser.set_defaults(handler=run)


class _Stop:
    """SIGINT and SIGTERM end the watch between looks, with their exit codes."""

    def __init__(self, watcher: Any) -> None:
        self.watcher = watcher
        self.code = EXIT_OK
        self.saved = {s: signal.getsignal(s) for s in (signal.SIGINT, signal.SIGTERM)}
        for sig in self.saved:
            signal.signal(sig, self.handle)

    def handle(self, signum: int, frame: FrameType | None) -> None:
        self.code = EXIT_INTERRUPTED if signum == signal.SIGINT else EXIT_OK
        self.watcher.stop.set()

    def restore(self) -> None:
        for sig, handler in self.saved.items():
            signal.signal(sig, handler)


def run(args: argparse.Namespace) -> int:
    from areal_console.commands.watch_evidence import ChildEvidence
    from areal_console.core.watch.evidence import evidence_folders
    from areal_console.core.watch.files import private_root, probe_writable
    from areal_console.core.watch.loop import Watcher, WatchTarget
    from areal_console.core.watch.state import WatchConfig

    root = _evidence_root(args)
    if args.match:
        try:
            re.compile(args.match)
        except re.error as exc:
            raise UsageError(f"bad --match regex {args.match!r}: {exc}") from None
    if args.node and not args.logs:
        raise UsageError("--node names the node that holds --logs: give --logs too")
    try:
        root = private_root(root)
        probe_writable(root)
    except OSError as exc:
        raise UserError(f"--evidence {root}: cannot write there: {exc.strerror or exc}") from None
    specs = resolve_targets(target_options(args))
    target = WatchTarget(job=args.job, match=args.match,
                         slurm_job=getattr(args, "slurm_job", None),
                         log_path=args.logs, log_node=args.node)  # fmt: skip
    plan = areal_plan(target_options(args))
    if plan is not None:
        target.job = target.job or f"areal:{plan.job_key}"
        if not args.logs:
            path, node, _ = plan.log_target()
            if path is not None:
                target.log_path, target.log_node, target.log_owner = path, node, plan.name.user
    _one_malloc_arena()  # before the agent's and the fleet's threads allocate
    fleet_options = {**target_options(args).fleet_options(), "probe_gpus": False,
                     "in_process": True}  # fmt: skip
    fleet = open_fleet(target_options(args), specs, **fleet_options)
    out = _Output(args.json)
    exec_runs: list[subprocess.Popen[bytes]] = []

    def on_evidence(evidence: Any, job: str | None) -> None:
        if args.exec_cmd:
            exec_runs[:] = [p for p in exec_runs if p.poll() is None]  # reap the finished
            exec_runs.append(_run_exec(args.exec_cmd, evidence, job, out))

    config = WatchConfig(stall_after=args.stall_after, interval=args.interval)
    names = ",".join(sorted(s.name for s in specs))
    # The evidence is taken in a child process: what it imports and builds is gone with it.
    watcher = Watcher(fleet, target, config, root, args.keep, target.key(names), out.event,
                      out.note, on_evidence=on_evidence,
                      take=ChildEvidence(specs, fleet_options))  # fmt: skip
    stop = _Stop(watcher)
    try:
        kept = len(evidence_folders(root))
        out.note(f"watching {names}: stall after {args.stall_after:g}s, a look every "
                 f"{args.interval:g}s; evidence in {root} ({kept} kept)")  # fmt: skip
        watcher.run()
    finally:
        stop.restore()
        watcher.close()
        fleet.close()
        for proc in exec_runs:
            if proc.poll() is None:
                out.note(f"--exec still running (pid {proc.pid}); not waited for")
    out.note("stopped")
    return stop.code


M_ARENA_MAX = -8  # glibc's mallopt parameter (malloc.h)


def _one_malloc_arena() -> None:
    """Every thread of this process allocates from one malloc arena. A watch runs for days
    with a pool of short-lived threads (the in-process agent, the fleet's fan-out); glibc
    gives threads arenas of their own (up to 8 per core), each keeping its high-water mark:
    measured, +3.8 MB of RSS over the first 160 looks, against +0.3 MB with one arena
    (docs/benchmarks/watch.md). Not glibc (musl, macOS): left as it is."""
    import ctypes

    try:
        libc = ctypes.CDLL(None)
        libc.mallopt(M_ARENA_MAX, 1)
    except (OSError, AttributeError):
        pass


def _evidence_root(args: argparse.Namespace) -> Path:
    from areal_console.core.common import locations

    return Path(args.evidence) if args.evidence else locations.data_dir() / "watch"


class _Output:
    """Events on stdout, one line each; notes on stderr."""

    def __init__(self, as_json: bool) -> None:
        self.as_json = as_json

    def event(self, event: Any, job: str | None) -> None:
        at = time.strftime("%Y-%m-%dT%H:%M:%S+00:00", time.gmtime(event.at))
        if self.as_json:
            doc = {"event": event.event, "job": job, "at": at, "evidence": event.evidence,
                   "detail": event.detail}  # fmt: skip
            line = json.dumps(doc)
        else:
            where = f" evidence={event.evidence}" if event.evidence else ""
            detail = f" ({event.detail})" if event.detail else ""
            line = f"{at} {event.event} {job or '-'}{where}{detail}"
        print(line, flush=True)

    def note(self, text: str) -> None:
        print(f"watch: {text}", file=sys.stderr, flush=True)


def _run_exec(cmd: str, evidence: Any, job: str | None, out: _Output) -> subprocess.Popen[bytes]:
    """The user's own command through the shell; what it needs comes in its environment
    only (never in the command text). Its output goes to stderr: stdout is the events'."""
    env = {
        **os.environ,
        "AREAL_CONSOLE_EVENT": "stall",
        "AREAL_CONSOLE_EVIDENCE": str(evidence.folder),
        "AREAL_CONSOLE_REPORT": str(evidence.report or ""),
        "AREAL_CONSOLE_JOB": job or "",
    }
    proc = subprocess.Popen(["/bin/sh", "-c", cmd], env=env, stdin=subprocess.DEVNULL,
                            stdout=2)  # fmt: skip
    out.note(f"--exec started (pid {proc.pid})")
    return proc
