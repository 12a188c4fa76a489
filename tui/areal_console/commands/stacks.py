"""`areal-console stacks`: capture every rank's stack, merge, diagnose; list/reopen saves."""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path
from typing import Any

from areal_console.commands.options import job_choice, target_options
from areal_console.core.common.errors import (
    EXIT_ERROR,
    EXIT_OK,
    EXIT_PARTIAL,
    UsageError,
    UserError,
)
from areal_console.core.common.identity import UserScope
from areal_console.core.targets.resolve import (
    add_target_arguments,
    areal_plan,
    count,
    open_fleet,
    resolve_targets,
    seconds,
    seconds_or_zero,
)


def register(subparsers: Any) -> None:
    parser = subparsers.add_parser(
        "stacks",
        help="capture py-spy stacks of every rank, merged and diagnosed",
        description=(
            "Dump the stack of every rank on every node at once (one py-spy per process, "
            "in parallel), group ranks with identical stacks and name the hang pattern. "
            "Every capture is saved to the data directory before it is printed."
        ),
    )
    add_target_arguments(parser)
    parser.add_argument(
        "--samples",
        type=count,
        default=1,
        metavar="N",
        help="dumps per rank; with 2+ a rank whose stack changes is progressing",
    )
    parser.add_argument(
        "--interval",
        type=seconds_or_zero,
        default=1.0,
        metavar="S",
        help="seconds between samples (default 1)",
    )
    parser.add_argument(
        "--match", metavar="REGEX", help="only processes whose command line matches"
    )
    scope = parser.add_mutually_exclusive_group()
    scope.add_argument(
        "--job",
        metavar="KEY",
        help="the job to capture when the nodes run several (a key from the list shown)",
    )
    scope.add_argument(
        "--all-jobs",
        action="store_true",
        help="capture the ranks of every job on the nodes (default: the one job there is)",
    )
    parser.add_argument(
        "--timeout", type=seconds, default=15.0, metavar="S", help="per py-spy dump (default 15)"
    )
    parser.add_argument(
        "--nonblocking",
        action="store_true",
        help="do not pause the ranks while dumping (less accurate)",
    )
    parser.add_argument(
        "--native",
        action="store_true",
        help="include C/C++ frames (py-spy --native), e.g. NCCL under a hung collective",
    )
    parser.add_argument(
        "--locals",
        action="store_true",
        help="include each frame's local variables (py-spy --locals; slower, shows data)",
    )
    parser.add_argument(
        "--source",
        choices=("auto", "py-spy", "worker"),
        default="auto",
        help="where stacks come from: py-spy, or the rank's own worker server (torch's, "
        "started by the launch hook, TORCH_WORKER_SERVER_SOCKET or start_debug_server) "
        "for ranks py-spy cannot attach to; auto (default): py-spy, then the worker server",
    )
    parser.add_argument("--json", action="store_true", help="the capture as JSON")
    parser.add_argument(
        "--save", metavar="DIR", help="also write <id>.json and <id>.txt (report) into DIR"
    )
    parser.add_argument(
        "--import",
        dest="import_files",
        nargs="+",
        metavar="FILE",
        help=(
            "read plain `py-spy dump` text instead of capturing: one file per rank (rank "
            "from a number in every file name, e.g. rank3.txt, dump_3.txt; else argument order) or a loop's output with `==== PID N ====` "
            "headers, `-` for pasted text on stdin; saved, diagnosed and comparable like "
            "any capture"
        ),
    )
    saved = parser.add_argument_group("saved captures")
    saved.add_argument(
        "--list", action="store_true", help="list your saved captures (--all-users: everyone's)"
    )
    saved.add_argument(
        "--all-users",
        action="store_true",
        help="with --list: every user's captures, not only yours (a shared account keeps "
        "everyone's in one data directory)",
    )
    saved.add_argument(
        "--open", metavar="ID", help="show a saved capture (id, id prefix, path or 'latest')"
    )
    saved.add_argument(
        "--compare",
        nargs=2,
        metavar=("BEFORE", "AFTER"),
        help="rank-by-rank changes between two saved captures",
    )
    parser.set_defaults(handler=run)


def run(args: argparse.Namespace) -> int:
    from areal_console.core.stacks.store import load_capture, scan_captures

    if args.list:
        saved, bad = scan_captures()
        for b in bad:  # the rest are listed; each bad file is named
            print(f"warning: skipped {b.path}: {b.error}", file=sys.stderr)
        users = UserScope(everyone=args.all_users)
        shown = [c for c in saved if users.shows(c.user)]
        if len(shown) < len(saved) and not args.json:
            hidden = len(saved) - len(shown)
            print(f"note: {hidden} other users' captures not listed (--all-users lists them)",
                  file=sys.stderr)  # fmt: skip
        return _list(shown, args.json)
    if args.compare:
        return _compare(load_capture(args.compare[0]), load_capture(args.compare[1]), args.json)
    live = not (args.open or args.import_files)
    # Each capture is analysed once; the saved file, the output and --save come from that.
    if args.import_files:
        result, nodes = _import(args.import_files), 0
    elif args.open:
        from areal_console.core.stacks.report import analysed

        result, nodes = analysed(load_capture(args.open)), 0
    else:
        result, nodes = _capture(args)
    capture = result.capture
    if live and not capture.rank_stacks:  # nothing to show, and nothing was saved
        print(f"error: {_nothing_captured(capture, nodes, args.match)}", file=sys.stderr)
        return EXIT_ERROR
    if capture.save_error:
        print(f"warning: {capture.save_error}", file=sys.stderr)
    from areal_console.core.stacks.report import indented_json  # json.dumps, each stack once

    as_json = indented_json(result.json()) if args.json or args.save else ""
    text = result.text() if not args.json or args.save else ""
    if args.save:
        _export(capture, Path(args.save), as_json, text)
    sys.stdout.write(as_json + "\n" if args.json else text)  # one write
    if not live:
        return EXIT_OK
    return _outcome(capture)


def _outcome(capture: Any) -> int:
    """The exit code of a capture that found ranks, with a line on stderr for each thing
    that went wrong."""
    for e in capture.errors:
        print(f"warning: {e.node}: {e.error}", file=sys.stderr)
    if capture.errors:
        from areal_console.core.stacks.coverage import capture_coverage

        print(f"warning: coverage: {capture_coverage(capture).line()}", file=sys.stderr)
    ranks = capture.rank_stacks
    if not any(r.state == "ok" for r in ranks):
        from areal_console.core.stacks.diagnose import failure_reasons

        found = "1 rank" if len(ranks) == 1 else f"{len(ranks)} ranks"
        why = f"{found} found, no stack dumped: " + "; ".join(failure_reasons(ranks))
        print(f"error: no rank captured: {why}", file=sys.stderr)
        return EXIT_ERROR
    trace_errors = capture.ledger.errors if capture.ledger is not None else []
    for error in trace_errors:  # the stacks are whole; some ranks' traces are not
        print(f"warning: {error}", file=sys.stderr)
    return EXIT_PARTIAL if capture.errors or trace_errors else EXIT_OK


def _nothing_captured(capture: Any, nodes: int, match: str | None) -> str:
    """Why a capture found no rank, in one line."""
    if len(capture.errors) >= nodes:
        reasons = [f"{e.node}: {e.error}" for e in capture.errors[:2]]
        more = len(capture.errors) - len(reasons)
        return (
            f"no node answered ({nodes} tried): "
            + "; ".join(reasons)
            + (f"; {more} more" if more else "")
        )
    where = ""
    if capture.errors:  # some nodes answered, some did not
        first = capture.errors[0]
        where = f" ({len(capture.errors)} of {nodes} nodes did not answer: {first.node}: "
        where += f"{first.error})"
    if match:
        return f"no rank captured: no process with rank variables matches --match {match!r}{where}"
    return (
        "no rank captured: no process with rank variables (RANK, SLURM_PROCID, ...) is "
        f"running on the nodes that answered{where}"
    )


def _capture(args: argparse.Namespace) -> tuple[Any, int]:
    """A new capture, analysed and saved before it is shown; how many nodes were asked."""
    from areal_console.core.stacks.capture import (
        CaptureOptions,
        JobChoiceError,
        capture_and_analyse,
    )

    try:
        options = CaptureOptions(
            samples=args.samples,
            interval=args.interval,
            match=args.match,
            timeout=args.timeout,
            nonblocking=args.nonblocking,
            job=args.job,
            all_jobs=args.all_jobs,
            # --slurm-job names the job, not only its nodes: other jobs there stay out.
            slurm_job=getattr(args, "slurm_job", None),
            native=args.native,
            with_locals=args.locals,
            source=args.source,
            on_sample=lambda text: print(f"stacks: {text} (Ctrl-C stops)", file=sys.stderr),
        )
    except ValueError as exc:
        raise UsageError(str(exc)) from None
    # One-shot: a local agent runs as a thread of this process, and nobody loads NVML.
    targets = target_options(args)
    fleet = open_fleet(targets, resolve_targets(targets), probe_gpus=False, in_process=True)
    plan = areal_plan(targets)
    if plan is not None and not (args.job or args.all_jobs):
        options.job = f"areal:{plan.job_key}"  # --areal names the job, not only its nodes
    if plan is not None:  # a role whose Slurm job ended: the diagnosis names it
        options.ended_roles = tuple(e.to_json() for e in plan.ended_roles)
    try:
        result = capture_and_analyse(fleet, options)  # saved before it is shown
    except JobChoiceError as exc:  # several jobs: say so, list them, pick none
        raise job_choice(exc) from None
    except KeyboardInterrupt:
        options.cancel.set()  # no further samples; closing the fleet ends the dumps running
        raise
    finally:
        fleet.close()
    return result, len(fleet)


def _import(files: list[str]) -> Any:
    from areal_console.core.stacks.pyspy_text import ImportTooLarge, import_text_dumps
    from areal_console.core.stacks.report import analysed
    from areal_console.core.stacks.store import new_capture_id, save_capture

    paths = [Path(f) for f in files]
    for path in paths:
        if str(path) != "-" and not path.is_file():
            raise UsageError(f"--import: {path} is not a file")
    try:
        capture = import_text_dumps(paths, new_capture_id(), stdin=sys.stdin)
    except ImportTooLarge as exc:
        raise UserError(f"--import: {exc}") from None
    except ValueError as exc:
        raise UsageError(f"--import: {exc}") from None
    except OSError as exc:
        raise UserError(f"--import: cannot read {exc.filename}: {exc.strerror}") from None
    result = analysed(capture)
    try:
        save_capture(capture, doc=result.json())  # saved before it is shown, as a live one
    except (OSError, UserError) as exc:
        capture.save_error = f"capture not saved: {exc}"
    return result


def _export(capture: Any, directory: Path, as_json: str, text: str) -> None:
    """`--save DIR`: the capture's JSON document and its text report, as printed."""
    from areal_console.core.stacks.store import write_atomic

    try:
        write_atomic(directory / f"{capture.capture_id}.json", as_json)
        write_atomic(directory / f"{capture.capture_id}.txt", text)
    except OSError as exc:
        raise UserError(f"cannot save to {directory}: {exc}") from None


def _list(saved: list[Any], as_json: bool) -> int:
    if as_json:
        rows = [
            {
                "id": c.capture_id,
                "user": c.user,
                "path": str(c.path),
                "captured_at": c.captured_at,
                "ranks": c.ranks,
                "pattern": c.pattern,
                "title": c.title,
                "tags": list(c.tags),
                "report": c.report,
            }
            for c in saved
        ]
        json.dump({"captures": rows}, sys.stdout, indent=1)
        sys.stdout.write("\n")
        return EXIT_OK
    if not saved:
        print("no saved captures")
        return EXIT_OK
    print(f"{'ID':<22} {'CAPTURED':<26} {'USER':<12} {'RANKS':>5}  DIAGNOSIS")
    for c in saved:
        tags = "".join(f"[{t}] " for t in c.tags)
        print(f"{c.capture_id:<22} {c.captured_at:<26} {c.user or '-':<12} {c.ranks:>5}  "
              f"{tags}{c.pattern}: {c.title}")  # fmt: skip
    return EXIT_OK


def _compare(before: Any, after: Any, as_json: bool) -> int:
    from areal_console.core.stacks.diff import compare_captures
    from areal_console.core.stacks.merge import format_ranks

    changes = compare_captures(before, after)
    if as_json:
        rows = [
            {"rank": c.rank, "status": c.status, "diff": c.diff.to_json() if c.diff else None}
            for c in changes
        ]
        json.dump(
            {"before": before.capture_id, "after": after.capture_id, "ranks": rows},
            sys.stdout,
            indent=1,
        )
        sys.stdout.write("\n")
        return EXIT_OK
    print(f"{before.capture_id} -> {after.capture_id}")
    for status in ("changed", "same", "appeared", "vanished"):
        ranks = [c.rank for c in changes if c.status == status]
        if ranks:
            print(f"  {status}: ranks {format_ranks(ranks)}")
    for c in changes:
        if c.status == "changed" and c.diff and c.diff.first_difference is not None:
            row = c.diff.rows[c.diff.first_difference]
            left = f"{row.left.function}:{row.left.line}" if row.left else "-"
            right = f"{row.right.function}:{row.right.line}" if row.right else "-"
            print(f"  rank {c.rank}: {left}  ->  {right}")
    return EXIT_OK
