"""Stack captures: parse py-spy output, merge ranks into a tree, diff, diagnose, store.

Pure analysis lives in `model`, `merge`, `diff`, `diagnose` and `report`; `capture` talks
to the fleet and `store` keeps captures on disk. Nothing here imports Textual.

The names below are loaded on first use: importing one submodule (a one-shot command
imports only what it runs) does not import all the others.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from areal_console.core.stacks.diagnose import Diagnosis, diagnose
    from areal_console.core.stacks.diff import DiffRow, StackDiff, diff_stacks
    from areal_console.core.stacks.merge import (
        RankGroup,
        StackAnalysis,
        TreeNode,
        analyse,
        format_ranks,
        group_ranks,
        parse_ranks,
    )
    from areal_console.core.stacks.model import (
        Frame,
        RankStack,
        StackCapture,
        Thread,
        build_capture,
    )

_WHERE = {
    "Diagnosis": "diagnose",
    "diagnose": "diagnose",
    "DiffRow": "diff",
    "StackDiff": "diff",
    "diff_stacks": "diff",
    "RankGroup": "merge",
    "StackAnalysis": "merge",
    "TreeNode": "merge",
    "analyse": "merge",
    "format_ranks": "merge",
    "group_ranks": "merge",
    "parse_ranks": "merge",
    "Frame": "model",
    "RankStack": "model",
    "StackCapture": "model",
    "Thread": "model",
    "build_capture": "model",
}

__all__ = [
    "Diagnosis",
    "DiffRow",
    "Frame",
    "RankGroup",
    "RankStack",
    "StackAnalysis",
    "StackCapture",
    "StackDiff",
    "Thread",
    "TreeNode",
    "analyse",
    "build_capture",
    "diagnose",
    "diff_stacks",
    "format_ranks",
    "group_ranks",
    "parse_ranks",
]


def __getattr__(name: str) -> Any:
    module = _WHERE.get(name)
    if module is None:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    value = getattr(importlib.import_module(f"{__name__}.{module}"), name)
    globals()[name] = value
    return value
