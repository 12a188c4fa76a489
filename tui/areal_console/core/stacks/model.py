"""The names of the former `stacks.model`, now split into `records` (the typed records),
`parsing` (raw py-spy captures into records) and `codec` (the saved JSON back into them).

Only re-exports, for code written against the old module while the split merges; new
code imports from the three modules. The regrouping of the tree rewrites the remaining
imports and removes this file.
"""

from areal_console.core.stacks.codec import capture_from_json
from areal_console.core.stacks.parsing import (
    FrameTable,
    ProcessDump,
    build_capture,
    frame_variables,
    gc_paused,
    parse_pyspy_threads,
    variables_of,
)
from areal_console.core.stacks.records import (
    ENGINE_THREADS,
    IDLE_LEAVES,
    MAIN_THREAD,
    Frame,
    NodeError,
    RankStack,
    ServerInfo,
    Stack,
    StackCapture,
    Thread,
    Variable,
    in_distributed,
    in_engine,
    is_distributed_frame,
    is_idle_stack,
    now_iso,
    variables_at,
)

__all__ = [
    "ENGINE_THREADS",
    "IDLE_LEAVES",
    "MAIN_THREAD",
    "Frame",
    "FrameTable",
    "NodeError",
    "ProcessDump",
    "RankStack",
    "ServerInfo",
    "Stack",
    "StackCapture",
    "Thread",
    "Variable",
    "build_capture",
    "capture_from_json",
    "frame_variables",
    "gc_paused",
    "in_distributed",
    "in_engine",
    "is_distributed_frame",
    "is_idle_stack",
    "now_iso",
    "parse_pyspy_threads",
    "variables_at",
    "variables_of",
]
