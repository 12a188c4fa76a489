"""`areal-console metrics`: a run's training metrics from AReaL's log, with the guide's checks."""

from __future__ import annotations

import argparse
import json
import sys
import time
from typing import Any

from areal_console.commands.options import target_options
from areal_console.core.common.errors import EXIT_OK, EXIT_PARTIAL, UsageError, UserError
from areal_console.core.targets.resolve import (
    add_target_arguments,
    areal_plan,
    names_remote_nodes,
    open_fleet,
    resolve_targets,
    seconds,
)


def register(subparsers: Any) -> None:
    parser = subparsers.add_parser(
        "metrics",
        help="training health: a run's metrics from AReaL's log, checked against the guide",
        description=(
            "Read the metrics AReaL logs every step (the `Stats` table in main.log, "
            "trainer.log or merged.log, or tensorboard event files) and check them the way "
            "AReaL's performance guide says: importance weights near 1, truncation "
            "(no_eos_ratios), sequence length growth, reward variance, flat reward, and "
            "whether the run still makes progress. PATH is a log file or the run's log "
            "directory (<fileroot>/logs/<user>/<experiment>/<trial>); with --job the "
            "directory is found from the job's command lines on the target nodes."
        ),
    )
    parser.add_argument("path", nargs="?", metavar="PATH", help="log file or log directory")
    add_target_arguments(parser)
    parser.add_argument(
        "--job",
        metavar="REGEX",
        help="find the log directory from the processes whose command line matches",
    )
    parser.add_argument("--node", metavar="NAME", help="the node that holds PATH")
    parser.add_argument("--follow", action="store_true", help="keep reading as the run logs")
    parser.add_argument(
        "--interval",
        type=seconds,
        default=2.0,
        metavar="S",
        help="seconds between reads (--follow)",
    )
    parser.add_argument("--json", action="store_true", help="the report as JSON")
    parser.set_defaults(handler=run)


def run(args: argparse.Namespace) -> int:
    from areal_console.core.common.settings import load_settings
    from areal_console.core.metrics.follow import LocalFiles, MetricsFollower, NodeFiles
    from areal_console.core.metrics.health import thresholds_from

    if not args.path and not args.job and not args.areal:
        raise UsageError(
            "metrics: give a log PATH, --job REGEX with the job's nodes, or --areal E/T"
        )
    if args.interval <= 0:
        raise UsageError("metrics: --interval must be positive")
    thresholds = thresholds_from(load_settings().health)
    remote = names_remote_nodes(target_options(args)) or bool(args.job or args.node)
    fleet = None
    try:
        if remote:
            fleet = open_fleet(target_options(args), resolve_targets(target_options(args)))
            session, path, owner = _where(fleet, args)
            follower = MetricsFollower(path, NodeFiles(session, owner), thresholds)
        else:
            follower = MetricsFollower(args.path, LocalFiles(), thresholds)
        follower.read_to_end()
        if not args.follow:
            _print(follower, args.json)
            for note in follower.notes:  # records skipped, files dropped: a partial report
                print(f"warning: {note}", file=sys.stderr)
            return EXIT_PARTIAL if follower.notes else EXIT_OK
        return _follow(follower, args)
    finally:
        if fleet is not None:
            fleet.close()


def _where(fleet: Any, args: argparse.Namespace) -> tuple[Any, str, str | None]:
    """The node, the path and, for a path found from a job's processes, the job's user
    (only that user's files are read there)."""
    from areal_console.core.metrics.locate import find_job_logs

    if args.path:
        if args.node:
            try:
                return fleet.session(args.node), args.path, None
            except KeyError:
                names = ", ".join(s.name for s in fleet)
                raise UsageError(
                    f"metrics: no node {args.node!r} among the targets ({names})"
                ) from None
        if len(fleet) > 1:
            raise UsageError("metrics: several nodes: say which holds PATH with --node NAME")
        return fleet.sessions[0], args.path, None
    plan = areal_plan(target_options(args))
    if plan is not None and not args.job:
        path, node, match = plan.log_target()
        if path is not None:
            print(f"note: log directory {path} (from --fileroot)", file=sys.stderr)
            # The directory is the job's: only its user's files are read there (as for a
            # path found from the job's processes).
            session = fleet.session(node) if node else fleet.sessions[0]
            return session, path, plan.name.user
        session, found = find_job_logs(fleet, match)
        print(f"note: {found.node}: {found.path}", file=sys.stderr)
        return session, found.path, found.owner
    session, found = find_job_logs(fleet, args.job)
    print(f"note: {found.node}: {found.path}", file=sys.stderr)
    return session, found.path, found.owner


def _follow(follower: Any, args: argparse.Namespace) -> int:
    from areal_console.core.metrics.report import episode_events, report_json

    shown = -1
    seen: dict[Any, bool] = {}
    warned: set[str] = set()
    while True:
        for note in follower.notes:
            if note not in warned:
                warned.add(note)
                print(f"warning: {note}", file=sys.stderr)
        report = follower.report()
        events, seen = episode_events(seen, report)
        if len(report.steps) != shown or report.stall.stalled or follower.finished or events:
            shown = len(report.steps)
            if args.json:
                sys.stdout.write(json.dumps(report_json(report)) + "\n")
                for event in events:
                    sys.stdout.write(json.dumps(event) + "\n")
            else:
                sys.stdout.write(_status_line(report) + "\n")
                for event in events:
                    sys.stdout.write(f"  {_episode_line(event)}\n")
            sys.stdout.flush()
        if follower.finished:
            return EXIT_OK
        time.sleep(args.interval)
        try:
            follower.poll()
        except UserError as exc:
            print(f"warning: {exc}", file=sys.stderr)


def _status_line(report: Any) -> str:
    from areal_console.core.metrics.health import GUIDE_METRICS

    store = report.store
    step = report.steps[-1] if report.steps else None
    parts = [f"step {step}" if step is not None else "no step yet"]
    for name in GUIDE_METRICS:
        value = store.latest(name)
        if value is not None:
            parts.append(f"{name}={value:.4g}")
    parts.append(report.stall.describe())
    line = " ".join(parts)
    for w in report.warnings:
        if w.active:
            line += f"\n  warning (since step {w.first_step}): {w.message}"
    for s in report.stragglers:
        line += f"\n  straggler: {s.describe()}"
    return line


def _episode_line(event: dict[str, Any]) -> str:
    """`opened at step 29: ...` / `ended (steps 49-51): ...` for the text follow."""
    if event["event"] == "open":
        return f"opened at step {event['first_step']}: {event['message']}"
    span = f"steps {event['first_step']}-{event['last_step']}"
    return f"ended ({span}): {event['message']}"


def _print(follower: Any, as_json: bool) -> None:
    from areal_console.core.common.textfmt import render_table
    from areal_console.core.metrics.health import GUIDE_METRICS
    from areal_console.core.metrics.report import iso, report_json, summarize

    report = follower.report()
    if as_json:
        json.dump(report_json(report), sys.stdout, separators=(",", ":"))
        sys.stdout.write("\n")
        return
    steps = report.steps
    print(f"source: {report.source}")
    total = f" of {report.total_steps}" if report.total_steps else ""
    span = f"{steps[0]}-{steps[-1]}" if steps else "none"
    print(
        f"steps:  {span} ({len(steps)} logged{total}); last at {iso(report.stall.last_step_at) or '-'}"
    )
    print(f"state:  {report.stall.describe()}")
    summaries = {s.name: s for s in summarize(report.store, follower.thresholds.window)}
    rows = []
    for name in [n for n in GUIDE_METRICS if n in summaries]:
        s = summaries[name]
        rows.append([name, _fmt(s.latest), _fmt(s.minimum), _fmt(s.maximum),
                     f"{s.trend:+.3g}", s.spark])  # fmt: skip
    if rows:
        print()
        print(render_table(["metric", "latest", "min", "max", "trend", "last steps"], rows))
    others = len(summaries) - len(rows)
    if others:
        print(f"\n   {others} more metrics (--json for every series)")
    print()
    if not report.warnings:
        print("no warnings")
    for w in report.warnings:
        if w.first_step is None or w.first_step == w.last_step:
            where = f" (step {w.step})" if w.step is not None else ""
        else:
            where = f" (steps {w.first_step}-{w.last_step})"
        state = "" if w.active else " [ended]"
        print(f"warning{where}{state}: {w.message}")
    for s in report.stragglers:
        print(f"straggler: {s.describe()}")


def _fmt(value: float | None) -> str:
    return "-" if value is None else f"{value:.4g}"
