"""`areal-console report`: a bug report in AReaL's issue template, with a bundle beside it."""

from __future__ import annotations

import argparse
import re
import sys
import time
from pathlib import Path
from typing import Any

from areal_console.commands.options import job_choice, target_options
from areal_console.core.common.errors import EXIT_OK, EXIT_PARTIAL, UsageError, UserError
from areal_console.core.common.textfmt import printable
from areal_console.core.targets.resolve import (
    add_target_arguments,
    areal_plan,
    open_fleet,
    resolve_targets,
)


def megabytes(text: str) -> float:
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not a number of MB") from None
    if not 0.01 <= value <= 4096:
        raise argparse.ArgumentTypeError(f"{text!r}: give between 0.01 and 4096 MB")
    return value


def register(subparsers: Any) -> None:
    from areal_console.core.report.bundle import DEFAULT_MAX_MB

    parser = subparsers.add_parser(
        "report",
        help="a bug report for AReaL's issue tracker: diagnosis, logs, versions, config",
        description=(
            "Write a markdown bug report in the sections of AReaL's issue template (root "
            "cause from the stack capture, diagnosis, ledger, health warnings, log tails, "
            "AReaL's commit, each node's environment, the command line and config.yaml) and "
            "a .tar.gz bundle beside it (the capture, ledger, metrics, longer log tails, "
            "config). Secrets are masked in every part. On a job that is gone, give a saved "
            "capture (--capture) and the log directory (--logs)."
        ),
    )
    add_target_arguments(parser)
    parser.add_argument("-o", "--output", metavar="FILE",
                        help="the markdown file (the bundle goes beside it as FILE.tar.gz); "
                        "default: areal-report-<job>-<time>.md here")  # fmt: skip
    parser.add_argument("--anonymize", action="store_true",
                        help="also replace host names, IPs and user names (consistently)")  # fmt: skip
    parser.add_argument("--max-bundle-mb", type=megabytes, default=DEFAULT_MAX_MB, metavar="MB",
                        help=f"bound on the bundle's size (default {DEFAULT_MAX_MB:g}); "
                        "longer parts are cut to fit, and the report says which")  # fmt: skip
    parser.add_argument("--job", metavar="KEY",
                        help="the job, when the nodes run several (a key from the list shown)")  # fmt: skip
    parser.add_argument("--match", metavar="REGEX",
                        help="only processes whose command line matches")  # fmt: skip
    parser.add_argument("--capture", metavar="ID",
                        help="a saved capture (id, prefix, path or 'latest') instead of a new one")  # fmt: skip
    parser.add_argument("--logs", metavar="PATH",
                        help="the run's log directory (or log file), when the command lines "
                        "do not name it; read on every node that has it")  # fmt: skip
    parser.add_argument("--node", metavar="NAME",
                        help="read the log directory on this node only (default: on every "
                        "node that has it)")  # fmt: skip
    parser.set_defaults(handler=run)


def _explicit_targets(args: argparse.Namespace) -> bool:
    return any(getattr(args, name, None) for name in
               ("hosts", "inventory", "slurm_job", "ray", "areal", "local"))  # fmt: skip


def run(args: argparse.Namespace) -> int:
    from areal_console.core.report.bundle import build_report, default_report_name, write_report
    from areal_console.core.report.collect import ReportRequest, collect
    from areal_console.core.report.redact import Redactor, learn_identities

    if args.match:
        try:
            re.compile(args.match)
        except re.error as exc:
            raise UsageError(f"bad --match regex {args.match!r}: {exc}") from None
    _check_output(args.output)
    request = ReportRequest(job=args.job, log_path=args.logs, log_node=args.node,
                            only_log_node=bool(args.node))  # fmt: skip
    if args.capture:
        request.capture, request.capture_note = _saved(args.capture)
    # A saved capture and no target: the job is gone; everything is read here.
    fleet, gone = None, None
    if not args.capture or _explicit_targets(args):
        specs, gone = _targets(args)
        if specs:
            fleet = open_fleet(target_options(args), specs, probe_gpus=False, in_process=True)
    if args.areal:
        _areal_scope(args, request)
    take = (lambda: _take(fleet, args)) if fleet else None
    if fleet is None and gone is not None and request.capture is None:
        take = lambda: _saved_instead(args, gone)  # noqa: E731
    try:
        inputs = collect(fleet, request, take)
    finally:
        if fleet is not None:
            fleet.close()
    if gone is not None:
        inputs.missing["targets"] = gone
    redactor = Redactor(anonymize=args.anonymize)
    if args.anonymize:
        learn_identities(redactor, inputs)
    report = build_report(inputs, redactor, int(args.max_bundle_mb * 2**20))
    path = args.output or default_report_name(report.job, time.strftime("%Y%m%d-%H%M%S"))
    try:
        bundle, size = write_report(report, path)
    except OSError as exc:
        raise UserError(f"cannot write the report: {exc}") from None
    print(f"wrote {path} and {bundle} ({size} bytes)")
    for line in report.cut:
        print(f"note: cut to fit --max-bundle-mb {args.max_bundle_mb:g}: {printable(line)}",
              file=sys.stderr)  # fmt: skip
    for parts, why in _by_reason(report.missing):
        print(f"warning: not collected: {', '.join(parts)}: {printable(redactor.text(why))}",
              file=sys.stderr)  # fmt: skip
    return EXIT_PARTIAL if report.missing else EXIT_OK


def _check_output(output: str | None) -> None:
    """`-o` into a folder that does not exist: said before anything is collected (folders
    are never made: a typo would otherwise leave the report where nobody looks)."""
    if not output:
        return
    folder = Path(output).expanduser().absolute().parent
    if not folder.is_dir():
        raise UserError(f"-o {output}: no folder {folder} (create it first)")


def _by_reason(missing: dict[str, str]) -> list[tuple[list[str], str]]:
    """The parts not collected, grouped by their reason (parts sharing one reason, such as
    logs, config and metrics without a log directory, make one warning), first seen first."""
    groups: dict[str, list[str]] = {}
    for part, why in missing.items():
        groups.setdefault(why, []).append(part)
    return [(parts, why) for why, parts in groups.items()]


def _targets(args: argparse.Namespace) -> tuple[list[Any], str | None]:
    """The targets' nodes; for `--areal`, a job whose records are gone too is no error: the
    report is made from its saved capture and log directory (why, as the second)."""
    try:
        specs = resolve_targets(target_options(args))
    except UserError as exc:
        if not args.areal or isinstance(exc, UsageError):
            raise
        return [], f"the job's nodes: {exc}"
    if not specs:
        return [], "the job's nodes: its records name no node"
    return specs, None


def _areal_scope(args: argparse.Namespace, request: Any) -> None:
    """`--areal E/T` names the job, not only its nodes: the capture is of its processes,
    a saved one is its newest, and `--fileroot` gives its log directory."""
    import os

    from areal_console.core.targets.name_resolve import parse_job_name

    plan = areal_plan(target_options(args))
    name = plan.name if plan is not None else parse_job_name(str(args.areal))
    if not args.job:
        args.job = f"areal:{name.short}"
        request.job = request.job or args.job
    fileroot = getattr(args, "fileroot", None)
    if fileroot and not args.logs:
        request.log_path = os.path.join(fileroot, "logs", name.user, name.experiment, name.trial)


def _saved_instead(
    args: argparse.Namespace, why: str
) -> tuple[dict[str, Any] | None, str, str | None]:
    """The newest saved capture of the job, for a job whose nodes are not known any more."""
    saved = _newest_saved(args.job or args.match)
    if saved is None:
        return None, "", f"{why}; and no saved capture of it (give --capture)"
    doc, note = _saved(str(saved))
    return doc, f"{note} (the job is gone)", None


def _saved(ref: str) -> tuple[dict[str, Any], str]:
    import json

    from areal_console.core.stacks.store import resolve_capture

    path = resolve_capture(ref)
    try:
        doc = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError) as exc:
        raise UserError(f"cannot read capture {path}: {exc}") from None
    if not isinstance(doc, dict) or not isinstance(doc.get("ranks"), list):
        raise UserError(f"{path} is not a stack capture")
    return doc, f"stacks from the saved capture {doc.get('id') or path.stem} taken at " \
                f"{doc.get('captured_at') or '?'}"  # fmt: skip


def _take(fleet: Any, args: argparse.Namespace) -> tuple[dict[str, Any] | None, str, str | None]:
    """A new capture of the job; when no rank runs any more, the newest saved one of it."""
    from areal_console.core.stacks.capture import (
        CaptureOptions,
        JobChoiceError,
        capture_and_analyse,
    )

    options = CaptureOptions(match=args.match, job=args.job,
                             slurm_job=getattr(args, "slurm_job", None))  # fmt: skip
    try:
        result = capture_and_analyse(fleet, options)
    except JobChoiceError as exc:
        # The job named is not among the jobs running there: it is gone (its saved capture
        # stands in); several jobs, or several matching: the user has to choose.
        if not (args.job and all(args.job not in g.key for g in exc.jobs)):
            raise job_choice(exc) from None
        doc: dict[str, Any] = {"ranks": []}
    else:
        doc = result.json()
    captured = [r for r in doc["ranks"] if r.get("rank") is not None and r.get("state") == "ok"]
    if captured:
        return doc, f"stacks captured now (capture {doc.get('id')})", None
    saved = _newest_saved(args.job or args.match)
    why = "no rank of the job runs on the targets"
    if saved is None:
        return None, "", why + " and no saved capture of it (give --capture)"
    doc, note = _saved(str(saved))
    return doc, f"{note} ({why} now)", None


def _newest_saved(job: str | None) -> Path | None:
    """The newest saved capture (of the job: its key, else its text naming `job`)."""
    import json

    from areal_console.core.stacks.store import list_captures

    for saved in list_captures():
        if job is None:
            return saved.path
        try:
            text = saved.path.read_text(encoding="utf-8")
            key = json.loads(text).get("job")
        except (OSError, ValueError, AttributeError):
            continue
        if key == job or (not str(job).startswith("areal:") and job in text):
            return saved.path
    return None
