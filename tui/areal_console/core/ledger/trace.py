"""One rank's Flight Recorder dump as typed records.

A dump (torch's pickle or JSON layout, `version` 2.x) has `entries` (one per collective
or point-to-point call, oldest first, a ring of `TORCH_FR_BUFFER_SIZE`), `pg_status` (per
process group id: last enqueued / started / completed collective sequence id) and
`pg_config` (per group name: description and member ranks; NCCL fills it in, gloo leaves
it empty). Parsing keeps each entry's raw dict and one comparable key per collective, so
lining up thousands of ranks compares lists in C instead of building objects.
"""

from __future__ import annotations

import ast
import operator
from dataclasses import dataclass, field
from typing import Any

# What two ranks must agree on for the same collective.
_KEY = operator.itemgetter("profiling_name", "input_sizes", "output_sizes", "input_dtypes")

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
    def from_entry(cls, entry: dict[str, Any]) -> Call:
        name = str(entry.get("profiling_name") or "?")
        return cls(
            seq=int(entry.get("collective_seq_id") or 0),
            op=name.split(":", 1)[-1],
            input_sizes=_sizes(entry.get("input_sizes")),
            output_sizes=_sizes(entry.get("output_sizes")),
            dtypes=tuple(DTYPES.get(str(d), str(d)) for d in entry.get("input_dtypes") or ()),
            state=str(entry.get("state") or ""),
            retired=bool(entry.get("retired")),
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
    entries: list[dict[str, Any]] = field(default_factory=list)  # collectives, by seq
    keys: list[tuple[Any, ...]] = field(default_factory=list)  # what must match, per entry
    seqs: list[int] = field(default_factory=list)
    last_enqueued: int | None = None
    last_started: int | None = None
    last_completed: int | None = None

    @property
    def contiguous(self) -> bool:
        """Sequence ids run without gaps or repeats (then index = seq - first)."""
        return not self.seqs or self.seqs[-1] - self.seqs[0] == len(self.seqs) - 1

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
            return Call.from_entry(self.entries[i]) if 0 <= i < len(self.entries) else None
        for e, s in zip(self.entries, self.seqs, strict=True):
            if s == seq:
                return Call.from_entry(e)
        return None


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
        try:
            raw = ast.literal_eval(raw)
        except (ValueError, SyntaxError):
            return None
    if isinstance(raw, (list, tuple)) and raw and all(isinstance(r, int) for r in raw):
        return tuple(sorted(raw))
    return None


def parse_trace(rank: int, node: str, source: str, where: str, data: dict[str, Any]) -> RankTrace:
    """A `RankTrace` from a decoded dump (either layout). Point-to-point calls are skipped."""
    config = data.get("pg_config") or {}
    groups: dict[str, GroupTrace] = {}
    pg_ids: dict[str, str] = {}  # pg_status is keyed by the recorder's numeric pg id
    for entry in data.get("entries") or ():
        if entry.get("is_p2p"):
            continue
        pg = entry.get("process_group") or ("", "")
        name = str(pg[0])
        group = groups.get(name)
        if group is None:
            conf = config.get(name) or {}
            desc = str(pg[1] if len(pg) > 1 else "") or str(conf.get("desc") or "")
            group = groups[name] = GroupTrace(name, desc, _members(conf.get("ranks")))
            pg_ids[str(entry.get("pg_id"))] = name
        group.entries.append(entry)
    for group in groups.values():
        group.entries.sort(key=operator.itemgetter("collective_seq_id"))
        group.seqs = [int(s) for s in map(operator.itemgetter("collective_seq_id"), group.entries)]
        group.keys = list(map(_KEY, group.entries))
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
