"""The target options of a parsed command line as the typed record the core takes."""

from __future__ import annotations

import argparse

from areal_console.core.targets.options import TargetOptions

_KEY = "_target_options"


def target_options(args: argparse.Namespace) -> TargetOptions:
    """`args`' target options as a `TargetOptions`; the same record on every call for the
    same `args`, so what resolving the targets learnt (`areal_plan`) stays with it."""
    options = getattr(args, _KEY, None)
    if options is None:
        options = TargetOptions.of(vars(args))
        setattr(args, _KEY, options)
    return options
