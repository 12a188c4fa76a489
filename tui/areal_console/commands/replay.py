"""`areal-console replay PATH`: replay a recorded trajectory dump on a node's GPUs (or CPU)."""

from __future__ import annotations

import argparse
import json
import sys
import time
from typing import Any

from areal_console.commands.options import target_options
from areal_console.core.common.errors import EXIT_ERROR, EXIT_OK, UsageError, UserError
from areal_console.core.common.settings import load_settings
from areal_console.core.common.textfmt import printable, strip_ansi
from areal_console.core.connection.client import AgentDisconnected, AgentError
from areal_console.core.replay import runs as jobs
from areal_console.core.replay.plan import (
    check_overrides,
    format_gpus,
    load_templates,
    parse_gpus,
    parse_step_range,
    plan_replay,
)
from areal_console.core.replay.python import check_torch, choose_python, uses_python
from areal_console.core.replay.verify import changed_run_note, failed
from areal_console.core.slurm import runs as slurm_runs
from areal_console.core.slurm.client import make_runner
from areal_console.core.targets.resolve import (
    NodeSpec,
    add_target_arguments,
    open_fleet,
    resolve_targets,
    seconds,
)


def register(subparsers: argparse._SubParsersAction) -> None:
    parser = subparsers.add_parser(
        "replay",
        help="replay a trajectory dump detached on a node, and verify it against the recording",
        description=(
            "Launch a replay of the dump directory (or one step_*.pt in it) on the node that "
            "holds it. Extra key=value arguments go to the trainer (e.g. a changed loss)."
        ),
    )
    parser.add_argument("path", help="dump directory or a step_NNNNNN[_dp_K].pt file in it")
    add_target_arguments(parser)
    parser.add_argument("--node", help="node holding the dump (default: the only target)")
    parser.add_argument("--gpus", help="GPU indices like 0,1, or cpu (default: free GPUs)")
    parser.add_argument("--steps", metavar="A:B", help="step range (default: all dumped steps)")
    parser.add_argument(
        "--template", default="reference", help="launch template (reference, areal, or config)"
    )
    parser.add_argument("--script", help="trainer script on the node (areal template)")
    parser.add_argument("--config", dest="trainer_config", help="trainer config on the node")
    parser.add_argument(
        "--python",
        help="python on the node (default: the node agent's interpreter where it has torch, "
        "else python3 from the node's PATH; checked for torch before launching)",
    )
    parser.add_argument(
        "--sbatch",
        action="store_true",
        help="run as a new sbatch job (default with --slurm-job: srun --overlap into that job)",
    )
    parser.add_argument("--wait", action="store_true", help="wait for the end and verify")
    parser.add_argument("--timeout", type=seconds, default=3600.0, help="seconds --wait waits")
    parser.add_argument("--dry-run", action="store_true", help="print the plan, launch nothing")
    parser.add_argument("--json", action="store_true", help="machine-readable output")
    parser.add_argument(
        "overrides", nargs="*", default=[], metavar="key=value", help="trainer overrides"
    )
    parser.set_defaults(handler=run)


RAY_LAUNCH = (
    "by the node's agent, a Ray actor pinned to the node (the run is its own process "
    "group, not a Ray task: it outlives the actor)"
)


def _say(text: str) -> None:
    print(f"replay: {text}", file=sys.stderr, flush=True)


class _LogProgress:
    """While waiting: the job log's newest line on stderr, each time it changes (at most
    every couple of seconds), so a long replay does not look stuck."""

    def __init__(self, session: Any, every: float = 2.0) -> None:
        self.session = session
        self.every = every
        self.last_line = ""
        self.next_at = 0.0

    def __call__(self, record: jobs.RunRecord) -> None:
        now = time.monotonic()
        if now < self.next_at:
            return
        self.next_at = now + self.every
        try:
            lines = jobs.tail(self.session, record.job_id, 1)
        except (AgentError, AgentDisconnected, OSError):
            return
        line = strip_ansi(lines[-1]).strip() if lines else ""  # AReaL's lines are coloured
        if line and line != self.last_line:
            self.last_line = line
            _say(f"{record.job_id}: {printable(line)}")


def log_reason(session: Any, record: jobs.RunRecord) -> str:
    """Why a run failed, from its log: the last `error:` line, else the last line (a
    traceback's exception); empty when the log cannot be read."""
    try:
        tail = jobs.tail(session, record.job_id, 40)
        lines = [plain for line in tail if (plain := strip_ansi(line).strip())]
    except (AgentError, AgentDisconnected, OSError):
        return ""
    errors = [line for line in lines if line.startswith("error:")]
    last = errors[-1].removeprefix("error:").strip() if errors else (lines[-1] if lines else "")
    return printable(last)


def pick_node(specs: list[NodeSpec], name: str | None) -> NodeSpec:
    if name is None:
        if len(specs) > 1:
            names = ", ".join(s.name for s in specs)
            raise UsageError(f"several targets ({names}): choose one with --node")
        return specs[0]
    for spec in specs:
        if spec.name == name or spec.host == name:
            return spec
    names = ", ".join(s.name for s in specs)
    raise UsageError(f"no node {name!r} among the targets ({names})")


def run(args: argparse.Namespace) -> int:
    spec = pick_node(resolve_targets(target_options(args)), args.node)
    try:  # bad values on the command line: exit 2
        first, last = parse_step_range(args.steps)
        gpus = parse_gpus(args.gpus)
    except UserError as exc:
        raise UsageError(str(exc)) from None
    templates = load_templates(load_settings().launch_templates)
    if args.template not in templates:
        raise UsageError(f"no launch template {args.template!r} (have: {', '.join(templates)})")
    template = templates[args.template]
    try:
        check_overrides(args.overrides, template)
    except UserError as exc:
        raise UsageError(str(exc)) from None
    fleet = open_fleet(target_options(args), [spec])
    session = fleet.session(spec.name)
    try:
        try:
            hello = session.connect()
            index = jobs.dump_index(session, args.path)
            sample = session.call("sample")
            script = args.script or ""
            if template.name == "reference" and not script:
                script = jobs.stage_trainer(session)
        except (AgentError, AgentDisconnected, OSError) as exc:
            raise UserError(f"{spec.name}: {exc}") from None
        python = choose_python(hello, args.python)
        plan = plan_replay(
            index,
            spec.name,
            sample,
            template,
            gpus=gpus,
            first=first,
            last=last,
            script=script,
            python=python.path,
            config=args.trainer_config or "",
            overrides=args.overrides,
        )
        if not args.json:
            _say(plan.device_note)  # before anything runs: which device, and how compared
            if uses_python(template):
                _say(python.note)
            if args.overrides:
                _say(changed_run_note(plan.template, args.overrides))
        if args.dry_run:
            print(json.dumps(plan.to_json(), indent=1) if args.json else plan.command_line)
            return EXIT_OK
        if uses_python(template):
            check_torch(session, python)  # a clear error now, not in the job's log later
        via_slurm = spec.slurm is not None or args.sbatch
        try:
            if via_slurm:
                launch = slurm_runs.launch_slurm(
                    make_runner(spec.slurm.login if spec.slurm else None),
                    plan,
                    host_job=spec.slurm.job_id if spec.slurm else None,
                    sbatch=args.sbatch,
                    login=spec.slurm.login if spec.slurm else None,
                    overrides=args.overrides,
                )
                record = launch.record
            else:
                record = jobs.launch(session, plan, overrides=args.overrides)
        except (AgentError, AgentDisconnected, OSError) as exc:
            raise UserError(f"{spec.name}: launch failed: {exc}") from None
        verification = None
        if args.wait:
            _say(f"replay {record.job_id} running on {record.node} (log: {record.log}); "
                 "waiting for it to end (Ctrl-C stops waiting, the job keeps running)")  # fmt: skip
            try:
                if via_slurm:
                    slurm_runs.wait_slurm(launch, args.timeout)
                else:
                    jobs.wait(session, record, args.timeout, on_poll=_LogProgress(session))
            except KeyboardInterrupt:
                _say(f"stopped waiting: replay {record.job_id} keeps running on {record.node} "
                     f"(detached; log: {record.log})")  # fmt: skip
                raise
            if record.state == "finished":
                verification = jobs.verify_run(session, record)
        # How the run was started: a Slurm step, or the node's agent (an SSH session, this
        # machine, or on --ray the agent actor pinned to the node; the run outlives it).
        launched_via = "slurm" if via_slurm else session.via
        result = {
            "job_id": record.job_id,
            "node": record.node,
            "via": launched_via,
            "gpus": plan.gpus or "cpu",
            "device": plan.device,
            "recorded_device": plan.recorded_device,
            "tolerance": plan.tolerance,
            "command": record.extra.get("argv", plan.argv),
            "env": plan.env,
            "log": record.log,
            "state": record.state,
            "exit_code": record.exit_code,
            "verification": verification.to_json() if verification else None,
            "slurm_job": record.slurm_job,
            "slurm_step": record.slurm_step,
            "slurm_state": record.extra.get("slurm_state"),
        }
        if args.json:
            print(json.dumps(result, indent=1))
        else:
            print(
                f"job {record.job_id} on {record.node} ({format_gpus(plan.gpus)}): {record.state}"
            )
            if launched_via == "ray":  # over SSH, Slurm or here it goes without saying
                print(f"  launched: {RAY_LAUNCH}")
            print(f"  command: {plan.command_line}")
            print(f"  log: {record.log}")
            if record.slurm_job:
                print(f"  {record.slurm_label}")
            if args.wait:
                print(f"  exit code: {record.exit_code}")
            if verification is not None:
                print(f"  {verification.summary}")
        if not args.wait:
            return EXIT_OK
        if record.state != "finished":
            why = record.error or f"exit code {record.exit_code}"
            reason = log_reason(session, record)
            why += f": {reason}" if reason else ""
            print(f"error: replay {record.state}: {why} (log: {record.log})", file=sys.stderr)
            return EXIT_ERROR
        if verification is not None and failed(verification):
            # In text, the verification line above says how it differs: not said twice.
            why = verification.summary if args.json else "see the verification line above"
            print(f"error: replay {record.job_id} does not match its recording: {why}",
                  file=sys.stderr)  # fmt: skip
            return EXIT_ERROR
        return EXIT_OK
    finally:
        fleet.close()
