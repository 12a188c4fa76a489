"""`areal-console [TARGETS]`: the interactive console."""

from __future__ import annotations

import argparse
from typing import Any

from areal_console.commands.options import target_options
from areal_console.core.common.settings import load_settings
from areal_console.core.targets.resolve import (
    add_target_arguments,
    areal_plan,
    resolve_targets,
    seconds,
)


def register(subparsers: Any) -> None:
    parser = subparsers.add_parser(
        "tui",
        help="open the interactive console (the default command)",
        description="Open the interactive console on the given nodes (default: this machine).",
    )
    add_target_arguments(parser)
    parser.add_argument("--read-only", action="store_true", default=None,
                        help="disable stopping jobs and launching replays")  # fmt: skip
    parser.add_argument("--interval", type=seconds, default=None,
                        help="seconds between samples (default 1, or the settings file)")  # fmt: skip
    parser.add_argument("--batches", metavar="PATH",
                        help="a dump (step_*.pt or its directory) to open in the Batches screen")  # fmt: skip
    parser.add_argument("--batches-node", metavar="NODE",
                        help="the node that holds --batches (default: where the console runs)")  # fmt: skip
    parser.add_argument("--health", metavar="PATH",
                        help="a run's AReaL log (file or log directory) for the Health screen")  # fmt: skip
    parser.add_argument("--health-node", metavar="NODE",
                        help="the node that holds --health (default: where the console runs)")  # fmt: skip
    parser.set_defaults(handler=run)


def health_target(args: argparse.Namespace) -> Any:
    """What the Health screen follows: `--health PATH`, else the `--areal` job's log
    directory (from `--fileroot`, or from its workers' command lines), else nothing."""
    from areal_console.core.metrics.locate import HealthTarget

    if args.health:
        return HealthTarget(args.health, args.health_node)
    plan = areal_plan(target_options(args))
    if plan is None:
        return None
    path, node, match = plan.log_target()
    return HealthTarget(path, node, match, owner=plan.name.user)


def run(args: argparse.Namespace) -> int:
    from areal_console.app import create_app

    settings = load_settings()  # before the screen opens: a bad file is a one-line error
    specs = resolve_targets(target_options(args))
    health = health_target(args)
    app = create_app(
        specs,
        targets=target_options(args),
        settings=settings,
        read_only=args.read_only,
        refresh_interval=args.interval,
        batches_path=args.batches,
        batches_node=args.batches_node,
        health_target=health,
    )
    app.run()
    return app.return_code or 0  # 130 after Ctrl-C
