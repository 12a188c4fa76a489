"""`areal-console [TARGETS]`: the interactive console."""

from __future__ import annotations

import argparse
from typing import Any

from areal_console.core.targets import add_target_arguments, resolve_targets


def register(subparsers: Any) -> None:
    parser = subparsers.add_parser(
        "tui",
        help="open the interactive console (the default command)",
        description="Open the interactive console on the given nodes (default: this machine).",
    )
    add_target_arguments(parser)
    parser.add_argument("--read-only", action="store_true", help="disable kill, stop and launch")
    parser.add_argument(
        "--interval", type=float, default=1.0, help="seconds between samples (default 1)"
    )
    parser.set_defaults(handler=run)


def run(args: argparse.Namespace) -> int:
    from areal_console.app import create_app

    app = create_app(
        resolve_targets(args),
        accept_new_hosts=args.accept_new_hosts,
        read_only=args.read_only,
        refresh_interval=args.interval,
    )
    app.run()
    return 0
