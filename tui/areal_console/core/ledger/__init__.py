"""The collective ledger: which collective each rank is in, from PyTorch's Flight Recorder.

`trace` turns one rank's Flight Recorder dump (live JSON or a decoded dump file) into a
`RankTrace`; `analyse` lines the ranks up per process group (`build_ledger`); `verdict`
adds what the ledger shows to a stack diagnosis. Pure functions, no Textual, no I/O.
"""

from areal_console.core.ledger.analyse import (
    Disagreement,
    GroupLedger,
    Ledger,
    RankPosition,
    build_ledger,
    ledger_from_json,
)
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
