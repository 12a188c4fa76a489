"""The collective ledger: which collective each rank is in, from PyTorch's Flight Recorder.

`trace` turns one rank's Flight Recorder dump (live JSON or a decoded dump file) into a
`RankTrace`; `analyse` lines the ranks up per process group (`build_ledger`); `verdict`
adds what the ledger shows to a stack diagnosis. Pure functions, no Textual, no I/O.

The trace parser's names load on first use: most captures carry no trace, and a one-shot
capture then never imports the parser.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from areal_console.core.common.lazy_names import lazy_names
from areal_console.core.ledger.analyse import (
    Disagreement,
    GroupLedger,
    Ledger,
    RankPosition,
    build_ledger,
    ledger_from_json,
)

if TYPE_CHECKING:
    from areal_console.core.ledger.trace import Call, GroupTrace, RankTrace, parse_trace

__all__ = [
    "Call",
    "Disagreement",
    "GroupLedger",
    "GroupTrace",
    "Ledger",
    "RankPosition",
    "RankTrace",
    "build_ledger",
    "ledger_from_json",
    "parse_trace",
]

__getattr__ = lazy_names(
    __name__, "trace", frozenset({"Call", "GroupTrace", "RankTrace", "parse_trace"})
)
