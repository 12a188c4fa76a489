"""The target options of a parsed command line as the typed record the core takes, and
the job choice a capture's commands ask for."""

from __future__ import annotations

import argparse
from typing import TYPE_CHECKING

from areal_console.core.common.errors import ChoiceError
from areal_console.core.targets.options import TargetOptions

if TYPE_CHECKING:
    from areal_console.core.stacks.scope import JobChoiceError

_KEY = "_target_options"


def target_options(args: argparse.Namespace) -> TargetOptions:
    """`args`' target options as a `TargetOptions`; the same record on every call for the
    same `args`, so what resolving the targets learnt (`areal_plan`) stays with it."""
    options = getattr(args, _KEY, None)
    if options is None:
        options = TargetOptions.of(vars(args))
        setattr(args, _KEY, options)
    return options


def job_choice(exc: JobChoiceError) -> ChoiceError:
    """Several jobs and none picked (`stacks`, `report`): the error's line, then the jobs,
    one a line."""
    lines = str(exc).splitlines() or ["several jobs"]
    return ChoiceError(lines[0], lines[1:])
