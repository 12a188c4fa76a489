"""Opt-in: the trainer's processes die with the process that started them.

`areal-console demo` sets `AREAL_NODE_DIE_WITH_PARENT=1`, so a demo job does not outlive a
console killed with SIGKILL (its ranks run in their own sessions: nothing else reaches
them). Replay runs started by the node agent do not set it: they outlive the console on
purpose. Linux only (`prctl(PR_SET_PDEATHSIG)`); elsewhere nothing is done.

The signal comes when the *thread* that forked the process ends, not its whole process:
the console starts the job, the trainer starts torchrun, and torchrun starts its ranks,
each from its main thread.
"""

from __future__ import annotations

import ctypes
import os
import signal
import sys

ENV = "AREAL_NODE_DIE_WITH_PARENT"
_PR_SET_PDEATHSIG = 1


def wanted() -> bool:
    return os.environ.get(ENV) == "1" and sys.platform.startswith("linux")


def die_with_parent() -> None:
    """SIGKILL this process when its parent dies (when `wanted()`); at once if the parent
    is already gone (adopted by init before the call)."""
    if not wanted():
        return
    parent = os.getppid()
    libc = ctypes.CDLL(None, use_errno=True)
    if libc.prctl(_PR_SET_PDEATHSIG, int(signal.SIGKILL), 0, 0, 0) != 0:
        return
    if parent == 1 or os.getppid() != parent:
        os.kill(os.getpid(), signal.SIGKILL)
