"""`areal-console trainer`: run the reference trainer on this machine."""

from __future__ import annotations

import argparse
import subprocess
import sys
from datetime import datetime, timezone

from areal_console.core.common.locations import data_dir
from areal_console.core.replay.plan import local_trainer


def register(subparsers: argparse._SubParsersAction) -> None:
    parser = subparsers.add_parser(
        "trainer",
        help="run the reference RL trainer (tiny LM, GRPO, AReaL dump/replay flags)",
        description=(
            "Run the torch-only reference trainer here (torchrun underneath when --nproc > 1). "
            "Overrides use AReaL's dotted style, e.g. steps=8 "
            "trajectory_debug.dump_rollout_data=true trajectory_debug.path=/tmp/dumps. "
            "Per-step metrics go to output_dir (default: a new folder under the data dir; "
            "the path is printed)."
        ),
    )
    parser.add_argument("--nproc", type=_ranks, default=1, help="data-parallel ranks (default 1)")
    parser.add_argument("--config", metavar="FILE", help="YAML or JSON config file")
    parser.add_argument(
        "overrides", nargs="*", default=[], metavar="key=value", help="config overrides"
    )
    parser.set_defaults(handler=run)


def _ranks(text: str) -> int:
    """--nproc: a whole number of ranks, at least 1 (0 or -1 would run nothing and exit 0)."""
    try:
        value = int(text)
    except ValueError:
        value = 0
    if value < 1:
        raise argparse.ArgumentTypeError(f"needs a whole number >= 1, got {text!r}")
    return value


def run(args: argparse.Namespace) -> int:
    argv = ["--nproc", str(args.nproc)]
    if args.config:
        argv += ["--config", args.config]
    # Metrics go to the data dir unless `output_dir=` says otherwise (never into the current
    # directory); the trainer prints the path it writes to.
    stamp = datetime.now(timezone.utc).strftime("%Y%m%d-%H%M%S-%f")
    argv += ["--default-output-dir", str(data_dir() / "trainer-runs" / stamp)]
    # The trainer validates its own configuration and prints "error: ..." itself.
    command, env = local_trainer(*argv, *args.overrides)
    if not sys.stdout.isatty():
        env["NO_COLOR"] = "1"  # piped or redirected: AReaL's coloured log lines as plain text
    return subprocess.call(command, env=env)
