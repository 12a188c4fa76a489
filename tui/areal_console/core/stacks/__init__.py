"""Stack captures: parse py-spy output, merge ranks into a tree, diff, diagnose, store.

Pure analysis lives in `model`, `merge`, `diff`, `diagnose` and `report`; `capture` talks
to the fleet and `store` keeps captures on disk. Nothing here imports Textual.
"""

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
from areal_console.core.stacks.model import Frame, RankStack, StackCapture, Thread, build_capture

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
