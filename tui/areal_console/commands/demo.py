"""`areal-console demo`: start a small hung training job here and open the console on it."""

from __future__ import annotations

import argparse
import signal
import sys
import time
from types import FrameType
from typing import Any

from areal_console.core.common.settings import load_settings
from areal_console.core.replay.demo import PATTERNS, new_demo

WELCOME = (
    "Demo job running: its ranks are below. Press s to capture every rank's stack and see "
    "the diagnosis, 3 for the dumped batches (r there replays a step), 4 for the replay runs, 5 (or h) "
    "for its training health, ? for keys."
)


def register(subparsers: Any) -> None:
    parser = subparsers.add_parser(
        "demo",
        help="start a small local training job that hangs, and open the console on it",
        description="Start the reference trainer as a small multi-rank job on this machine; "
        "it dumps a few steps in AReaL's layout, then hangs in the chosen way. The console "
        "opens on it; everything is cleaned up on exit (Ctrl-C included).",
    )
    parser.add_argument("--pattern", choices=PATTERNS, default="cleanup",
                        help="how the job stops making progress (default: cleanup)")  # fmt: skip
    parser.add_argument("--nproc", type=int, default=2, help="ranks (default 2)")
    parser.add_argument("--steps", type=int, default=3, help="steps to train and dump (default 3)")
    parser.add_argument("--no-tui", action="store_true",
                        help="only start the job and wait (Ctrl-C stops it): for scripts")  # fmt: skip
    parser.set_defaults(handler=run)


def _exit_on_signal(signum: int, frame: FrameType | None) -> None:
    raise SystemExit(128 + signum)


def run(args: argparse.Namespace) -> int:
    settings = load_settings()
    job = new_demo(args.pattern, args.nproc, args.steps)
    for sig in (signal.SIGTERM, signal.SIGHUP):
        signal.signal(sig, _exit_on_signal)

    def say(text: str) -> None:
        print(f"demo: {text}", file=sys.stderr, flush=True)

    try:
        say(f"starting the reference trainer with {args.nproc} ranks in {job.workdir}")
        job.start()
        job.wait_ready(progress=say)
        say(f"job ready ({'hung: ' + args.pattern if args.pattern != 'none' else 'training'}); "
            f"dumps in {job.dump_dir}")  # fmt: skip
        if args.no_tui:
            say("press Ctrl-C to stop it")
            while job.process is not None and job.process.poll() is None:
                time.sleep(0.5)
            return 0
        from areal_console.app import create_app
        from areal_console.core.metrics.locate import HealthTarget
        from areal_console.core.targets.resolve import local_node

        app = create_app(
            [local_node()],
            settings=settings,
            batches_path=str(job.dump_dir),
            initial_filter=job.tag,
            welcome=WELCOME,
            health_target=HealthTarget(str(job.log_path), match=job.tag),
        )
        app.run()
        return app.return_code or 0  # 130 after Ctrl-C
    finally:
        killed = job.stop()
        job.remove_files()
        say(f"stopped the demo job ({killed} processes) and removed {job.workdir}")
