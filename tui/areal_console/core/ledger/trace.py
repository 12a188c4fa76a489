"""One rank's Flight Recorder dump as typed records.

A dump (torch's pickle or JSON layout, `version` 2.x) has `entries` (one per collective
or point-to-point call, oldest first, a ring of `TORCH_FR_BUFFER_SIZE`), `pg_status` (per
process group id: last enqueued / started / completed collective sequence id) and
`pg_config` (per group name: description and member ranks; NCCL fills it in, gloo leaves
it empty). The agent sends it per process group as columns (see the agent's
`slim_trace`): sequence ids, and per collective an index into a small table of what ranks
must agree on. Lining up thousands of ranks then compares integer lists in C.
"""

from __future__ import annotations

import ast
import functools
import json
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

# torch's scalar type names (as the recorder writes them) -> the dtype users know.
DTYPES = {
    "Float": "float32",
    "Double": "float64",
    "Half": "float16",
    "BFloat16": "bfloat16",
    "Long": "int64",
    "Int": "int32",
    "Short": "int16",
    "Char": "int8",
    "Byte": "uint8",
    "Bool": "bool",
    "ComplexFloat": "complex64",
    "ComplexDouble": "complex128",
}


def _sizes(raw: Any) -> tuple[tuple[int, ...], ...]:
    return tuple(tuple(int(d) for d in s) for s in raw or ())


@dataclass(frozen=True)
class Call:
    """One collective as one rank recorded it."""

    seq: int
    op: str
    input_sizes: tuple[tuple[int, ...], ...]
    output_sizes: tuple[tuple[int, ...], ...]
    dtypes: tuple[str, ...]
    state: str
    retired: bool

    @classmethod
    def from_sig(cls, sig: Any, seq: int, state: str = "", retired: bool = False) -> Call:
        """From a table row `[profiling_name, input_sizes, output_sizes, input_dtypes]`."""
        name, inputs, outputs, dtypes = sig
        return cls(
            seq=seq,
            op=str(name).split(":", 1)[-1],
            input_sizes=_sizes(inputs),
            output_sizes=_sizes(outputs),
            dtypes=tuple(DTYPES.get(str(d), str(d)) for d in dtypes or ()),
            state=state,
            retired=retired,
        )

    @property
    def signature(self) -> tuple[object, ...]:
        """What ranks must agree on (not the state, which differs by timing)."""
        return (self.op, self.input_sizes, self.output_sizes, self.dtypes)

    @property
    def shape(self) -> str:
        """`[8]`, `[8] [2,3]` (one per input tensor), or empty for a barrier."""
        return " ".join("[" + ",".join(str(d) for d in s) + "]" for s in self.input_sizes)

    @property
    def dtype(self) -> str:
        return ",".join(dict.fromkeys(self.dtypes))

    def describe(self, seq: bool = True) -> str:
        """`all_reduce #17 [8] float32`."""
        parts = [self.op]
        if seq:
            parts.append(f"#{self.seq}")
        parts += [p for p in (self.shape, self.dtype) if p]
        return " ".join(parts)

    def to_json(self) -> dict[str, Any]:
        return {
            "seq": self.seq,
            "op": self.op,
            "input_sizes": [list(s) for s in self.input_sizes],
            "output_sizes": [list(s) for s in self.output_sizes],
            "dtypes": list(self.dtypes),
            "state": self.state,
            "retired": self.retired,
        }

    @classmethod
    def from_json(cls, doc: dict[str, Any]) -> Call:
        return cls(
            seq=int(doc["seq"]),
            op=str(doc["op"]),
            input_sizes=_sizes(doc.get("input_sizes")),
            output_sizes=_sizes(doc.get("output_sizes")),
            dtypes=tuple(str(d) for d in doc.get("dtypes") or ()),
            state=str(doc.get("state") or ""),
            retired=bool(doc.get("retired")),
        )


@dataclass
class GroupTrace:
    """One rank's record of one process group."""

    name: str
    desc: str
    ranks: tuple[int, ...] | None  # members, when the dump says
    seqs: Sequence[int] = range(0)  # collectives' sequence ids, ascending
    keys: list[int] = field(default_factory=list)  # per collective: a row of `table`
    table: list[Any] = field(default_factory=list)  # what ranks must agree on
    last_state: str = ""
    last_retired: bool = False
    last_enqueued: int | None = None
    last_started: int | None = None
    last_completed: int | None = None

    @property
    def contiguous(self) -> bool:
        """Sequence ids run without gaps or repeats (then index = seq - first)."""
        return isinstance(self.seqs, range) or (
            not self.seqs or self.seqs[-1] - self.seqs[0] == len(self.seqs) - 1
        )

    @property
    def head(self) -> int:
        """The last collective this rank enqueued on the group (0: none yet)."""
        last = self.seqs[-1] if self.seqs else 0
        return max(last, self.last_enqueued or 0)

    def call_at(self, seq: int) -> Call | None:
        if not self.seqs:
            return None
        if self.contiguous:
            i = seq - self.seqs[0]
            if not 0 <= i < len(self.keys):
                return None
        else:
            found = [j for j, s in enumerate(self.seqs) if s == seq]
            if not found:
                return None
            i = found[-1]
        if i == len(self.keys) - 1:
            return Call.from_sig(self.table[self.keys[i]], seq, self.last_state, self.last_retired)
        return Call.from_sig(self.table[self.keys[i]], seq)


@dataclass
class RankTrace:
    """One rank's Flight Recorder trace and where it came from."""

    rank: int
    node: str
    source: str  # "live" (asked the running process) or "file" (a dump file)
    where: str  # socket or file path
    version: str
    groups: dict[str, GroupTrace]


def _status_value(raw: Any) -> int | None:
    try:
        value = int(raw)
    except (TypeError, ValueError):
        return None
    return value if value >= 0 else None


def _members(raw: Any) -> tuple[int, ...] | None:
    if isinstance(raw, str):
        return _members_text(raw)
    if isinstance(raw, (list, tuple)) and raw and all(isinstance(r, int) for r in raw):
        return tuple(sorted(raw))
    return None


@functools.lru_cache(maxsize=1024)
def _members_text(raw: str) -> tuple[int, ...] | None:
    """`"[0, 1, 2]"` as the recorder writes member lists (every rank repeats the same
    string, hence the cache)."""
    try:
        value = json.loads(raw)
    except ValueError:
        try:
            value = ast.literal_eval(raw)
        except (ValueError, SyntaxError):
            return None
    return _members(value) if not isinstance(value, str) else None


def parse_trace(rank: int, node: str, source: str, where: str, data: dict[str, Any]) -> RankTrace:
    """A `RankTrace` from the agent's reduced trace (`slim_trace`)."""
    config = data.get("pg_config") or {}
    groups: dict[str, GroupTrace] = {}
    pg_ids: dict[str, str] = {}  # pg_status is keyed by the recorder's numeric pg id
    for g in data.get("groups") or ():
        name = str(g.get("name"))
        conf = config.get(name) or {}
        seq_range = g.get("seq_range")
        seqs: Sequence[int] = (
            range(int(seq_range[0]), int(seq_range[0]) + int(seq_range[1]))
            if seq_range
            else [int(s) for s in g.get("seqs") or ()]
        )
        groups[name] = GroupTrace(
            name=name,
            desc=str(g.get("desc") or conf.get("desc") or ""),
            ranks=_members(conf.get("ranks")),
            seqs=seqs,
            keys=list(g.get("keys") or ()),
            table=list(g.get("table") or ()),
            last_state=str(g.get("last_state") or ""),
            last_retired=bool(g.get("last_retired")),
        )
        pg_ids[str(g.get("pg_id"))] = name
    for name, conf in config.items():
        if name and name not in groups and isinstance(conf, dict):
            desc = str(conf.get("desc") or "")
            groups[name] = GroupTrace(str(name), desc, _members(conf.get("ranks")))
    for pg_id, status in (data.get("pg_status") or {}).items():
        group = groups.get(pg_ids.get(str(pg_id), str(pg_id)))
        if group is None or not isinstance(status, dict):
            continue
        group.last_enqueued = _status_value(status.get("last_enqueued_collective"))
        group.last_started = _status_value(status.get("last_started_collective"))
        group.last_completed = _status_value(status.get("last_completed_collective"))
    return RankTrace(rank, node, source, where, str(data.get("version") or ""), groups)
