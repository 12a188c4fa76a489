"""Ctrl-C for the commands a test starts, however the test run itself was started."""

from __future__ import annotations

import signal


def sigint_default() -> None:
    """`preexec_fn` for a command a test sends SIGINT to. A test run started in the
    background of a non-interactive shell (`pytest &`, `nohup`) ignores SIGINT, its
    children inherit that, and Python then installs no KeyboardInterrupt: the command
    would never see the Ctrl-C the test sends."""
    signal.signal(signal.SIGINT, signal.SIG_DFL)
