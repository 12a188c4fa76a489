"""Stack captures: parse py-spy output, merge ranks into a tree, diff, diagnose, store.

Pure analysis lives in `records`, `parsing`, `codec`, `merge`, `diff`, `diagnose` and `report`; `capture` talks
to the fleet and `store` keeps captures on disk. Nothing here imports Textual.

The diff's names load on first use: a capture never compares two stacks, so a one-shot
command does not import it. (The others are bound here at once: a name such as `diagnose`
must stay the function, never become its submodule once that is imported.)
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from areal_console.core.common.lazy_names import lazy_names
from areal_console.core.stacks.diagnose import Diagnosis, diagnose
from areal_console.core.stacks.merge import (
    RankGroup,
    StackAnalysis,
    TreeNode,
    analyse,
    format_ranks,
    group_ranks,
    parse_ranks,
)
from areal_console.core.stacks.parsing import build_capture
from areal_console.core.stacks.records import Frame, RankStack, StackCapture, Thread

if TYPE_CHECKING:
    from areal_console.core.stacks.diff import DiffRow, StackDiff, diff_stacks

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

__getattr__ = lazy_names(__name__, "diff", frozenset({"DiffRow", "StackDiff", "diff_stacks"}))
