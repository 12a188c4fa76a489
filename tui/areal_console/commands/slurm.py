"""`areal-console slurm [JOBID]`: Slurm jobs, and how the console would reach one."""

from __future__ import annotations

import argparse
import json
import sys
from typing import Any

from areal_console.core.common.errors import EXIT_OK
from areal_console.core.common.textfmt import render_table
from areal_console.core.slurm.client import SLURM_COMMAND_TIMEOUT, SlurmClient, make_runner
from areal_console.core.slurm.targets import SLURM_MODES, resolve_slurm_targets
from areal_console.core.targets.resolve import seconds


def register(subparsers: Any) -> None:
    parser = subparsers.add_parser(
        "slurm",
        help="list Slurm jobs, or show how the console reaches one job's nodes",
        description=(
            "Without JOBID: the queue's jobs (yours unless --all-users). With JOBID: the job's"
            " nodes, GPUs and steps as Slurm reports them, and whether the console reaches"
            " them through srun or falls back to SSH."
        ),
    )
    parser.add_argument("job_id", nargs="?", metavar="JOBID", help="a Slurm job id")
    parser.add_argument(
        "--login", metavar="[USER@]HOST[:PORT]", help="run Slurm's commands on this login host"
    )
    parser.add_argument(
        "--slurm-mode", choices=SLURM_MODES, default="step", help="how to reach the nodes"
    )
    parser.add_argument(
        "--slurm-timeout",
        type=seconds,
        default=SLURM_COMMAND_TIMEOUT,
        metavar="SECONDS",
        help="give up on one of Slurm's commands after this long (default 30)",
    )
    parser.add_argument("--user", help="list this user's jobs (default: yours)")
    parser.add_argument("--all-users", action="store_true", help="list every user's jobs")
    parser.add_argument("--json", action="store_true", help="machine-readable output")
    parser.set_defaults(handler=run)


def run(args: argparse.Namespace) -> int:
    if args.job_id:
        return _show_job(args)
    client = SlurmClient(make_runner(args.login), args.slurm_timeout)
    user = None if args.all_users else (args.user or client.current_user())
    jobs = client.jobs(user)
    if args.json:
        json.dump({"jobs": [j.to_json() for j in jobs]}, sys.stdout, indent=2)
        sys.stdout.write("\n")
        return EXIT_OK
    rows = [
        [j.job_id, j.name, j.user, j.state, j.nodelist or f"({j.reason})", j.tres_per_node or "-"]
        for j in jobs
    ]
    sys.stdout.write(render_table(["JOBID", "NAME", "USER", "STATE", "NODES", "GRES"], rows) + "\n")
    return EXIT_OK


def _show_job(args: argparse.Namespace) -> int:
    plan = resolve_slurm_targets(
        args.job_id, login=args.login, mode=args.slurm_mode, timeout=args.slurm_timeout
    )
    nodes: list[dict[str, Any]] = [
        {
            "name": spec.name,
            "transport": spec.transport,
            "gpus": plan.job.gpus.get(spec.name, []),
            "slurm_state": plan.job.node_states.get(spec.name),
            "reachable": not (spec.slurm is not None and spec.slurm.unreachable),
            "error": spec.slurm.unreachable if spec.slurm is not None else None,
        }
        for spec in plan.specs
    ]
    if args.json:
        out: dict[str, Any] = {
            "job": plan.job.to_json(),
            "transport": plan.transport,
            "notes": plan.notes,
            "nodes": nodes,
        }
        json.dump(out, sys.stdout, indent=2)
        sys.stdout.write("\n")
        return EXIT_OK
    job = plan.job
    print(f"job {job.job_id} ({job.name}) of {job.user}: {job.state}, {len(job.nodes)} nodes")
    print(f"reached through: {plan.transport}")
    for note in plan.notes:
        print(f"note: {note}")
    rows = [
        [
            n["name"],
            n["slurm_state"] or "?",
            ",".join(map(str, n["gpus"])) or "-",
            "yes" if n["reachable"] else f"no: {n['error']}",
        ]
        for n in nodes
    ]
    print(render_table(["NODE", "SLURM STATE", "GPUS", "REACHABLE"], rows))
    steps = [
        [s.step_id, s.name, s.state, str(s.tasks or "-"), ",".join(s.nodes)] for s in job.steps
    ]
    if steps:
        print(render_table(["STEP", "NAME", "STATE", "TASKS", "NODES"], steps))
    return EXIT_OK
