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
from array import array
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

from areal_console.core.common.textfmt import clip, clip_repr, printable

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
    return tuple(tuple(_dim(d) for d in s) for s in raw or ())


def _dim(raw: Any) -> int:
    value = int(raw)
    if not 0 <= value < 2**63:
        raise ValueError(f"tensor dimension {clip(value, 40)} out of range")
    return value


def _text(raw: Any, limit: int = 200) -> str:
    """A name from a trace, safe to show and of a sane length."""
    return printable(raw)[:limit]


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
            op=_text(name).split(":", 1)[-1],
            input_sizes=_sizes(inputs),
            output_sizes=_sizes(outputs),
            dtypes=tuple(DTYPES.get(str(d), _text(d, 40)) for d in dtypes or ()),
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
    except (TypeError, ValueError, OverflowError):
        return None
    return value if 0 <= value <= MAX_SEQ else None


def _members(raw: Any) -> tuple[int, ...] | None:
    if isinstance(raw, str):
        return _members_text(raw) if len(raw) <= MAX_MEMBERS_TEXT else None
    if (
        isinstance(raw, (list, tuple))
        and raw
        and all(type(r) is int and 0 <= r < 2**31 for r in raw)
    ):
        return tuple(sorted(raw))
    return None


@functools.lru_cache(maxsize=1024)
def _members_text(raw: str) -> tuple[int, ...] | None:
    """`"[0, 1, 2]"` as the recorder writes member lists (every rank repeats the same
    string, hence the cache)."""
    try:
        value = json.loads(raw)
    except (ValueError, RecursionError):
        try:
            value = ast.literal_eval(raw)
        except (ValueError, SyntaxError, TypeError, MemoryError, RecursionError):
            return None
    return _members(value) if not isinstance(value, str) else None


class TraceError(ValueError):
    """A rank's trace that is not a Flight Recorder trace (malformed, hostile, too big)."""


# A trace is what a rank's process answers, or what it left in a file: another user's
# input. Bounds past any real recorder (its ring is `TORCH_FR_BUFFER_SIZE` entries).
MAX_CALLS = 1_000_000  # collectives per group
MAX_SEQ = 2**63 - 1  # the recorder's sequence ids are int64
MAX_MEMBERS_TEXT = 1_000_000  # a member list as text ("[0, 1, ...]")


def parse_trace(rank: int, node: str, source: str, where: str, data: Any) -> RankTrace:
    """A `RankTrace` from the agent's reduced trace (`slim_trace`); `TraceError` when it
    is not one (wrong types, bad indices, absurd sizes, nesting too deep)."""
    try:
        return _parse_trace(rank, node, source, where, data)
    except TraceError:
        raise
    except (TypeError, ValueError, KeyError, IndexError, AttributeError, OverflowError) as exc:
        raise TraceError(f"malformed trace: {clip(exc, 120)}") from None
    except RecursionError:
        raise TraceError("malformed trace: nested too deeply") from None


def _mapping(data: dict[str, Any], key: str) -> dict[Any, Any]:
    value = data.get(key)
    if value is None:
        return {}
    if not isinstance(value, dict):
        raise TraceError(f"malformed trace: {key} is a {type(value).__name__}, not a mapping")
    return value


def _seqs(g: dict[str, Any]) -> Sequence[int]:
    seq_range = g.get("seq_range")
    if seq_range:
        first, count = (_bounded_int(v, MAX_SEQ) for v in seq_range)
        if count > MAX_CALLS or first + count > MAX_SEQ:
            raise TraceError(f"malformed trace: {count} calls from #{first}: out of range")
        return range(first, first + count)
    seqs = [_bounded_int(s, MAX_SEQ) for s in g.get("seqs") or ()]
    if len(seqs) > MAX_CALLS:
        raise TraceError(f"malformed trace: {len(seqs)} calls in one group")
    return seqs


def _bounded_int(value: Any, top: int) -> int:
    if type(value) is not int or not 0 <= value <= top:
        raise TraceError(f"malformed trace: {clip_repr(value, 40)} is not a sequence number")
    return value


def _keys(raw: Any, rows: int) -> list[int]:
    """Each call's row of the table, checked at C speed: 4,096 ranks send 2,000 keys each.
    Integers only (a JSON `true` is read as its 1; a float, text or list is refused), each
    a row of the table."""
    if not isinstance(raw, (list, tuple)):
        raise TraceError("malformed trace: a group's keys are not a list")
    try:
        small = bytes(raw)  # the usual table has under 256 rows: one byte per key
    except TypeError:
        raise TraceError("malformed trace: a call's key is not a row of its table") from None
    except ValueError:
        return _wide_keys(raw, rows)  # a key past 255 (or negative): checked as int64
    if small and _top(small) >= rows:
        raise TraceError("malformed trace: a call's key is not a row of its table")
    return list(small)


@functools.lru_cache(maxsize=64)
def _top(keys: bytes) -> int:
    """The largest key (ranks send the same keys: found once per distinct list)."""
    return max(keys)


def _wide_keys(raw: list[Any] | tuple[Any, ...], rows: int) -> list[int]:
    try:
        packed = array("q", raw)
    except (TypeError, ValueError, OverflowError):
        raise TraceError("malformed trace: a call's key is not a row of its table") from None
    if packed and (min(packed) < 0 or max(packed) >= rows):
        raise TraceError("malformed trace: a call's key is not a row of its table")
    return packed.tolist()


def _check_table(table: list[Any]) -> None:
    """Every row of a group's table makes a `Call` (`TraceError` if not). Ranks send the
    same small table: one whose `repr` was checked already is not checked again."""
    text = repr(table)
    if text in _CHECKED_TABLES:
        return
    for row in table:  # small (distinct signatures): each row must make a Call
        if not isinstance(row, (list, tuple)) or len(row) != 4:
            raise TraceError(f"malformed trace: table row {clip_repr(row, 40)}")
        Call.from_sig(row, 0)
    if len(text) <= 1 << 16:
        _CHECKED_TABLES[text] = None
        if len(_CHECKED_TABLES) > 64:
            del _CHECKED_TABLES[next(iter(_CHECKED_TABLES))]


_CHECKED_TABLES: dict[str, None] = {}  # reprs of tables whose rows all made a Call


def _group(g: Any, conf: Any) -> GroupTrace:
    if not isinstance(g, dict):
        raise TraceError(f"malformed trace: a group is a {type(g).__name__}, not a mapping")
    conf = conf if isinstance(conf, dict) else {}
    seqs = _seqs(g)
    table = list(g.get("table") or ())
    keys = _keys(g.get("keys") or (), len(table))
    if len(keys) != len(seqs):
        raise TraceError(f"malformed trace: {len(keys)} keys for {len(seqs)} calls")
    _check_table(table)
    return GroupTrace(
        name=_text(g.get("name")),
        desc=_text(g.get("desc") or conf.get("desc") or ""),
        ranks=_members(conf.get("ranks")),
        seqs=seqs,
        keys=keys,
        table=table,
        last_state=_text(g.get("last_state") or ""),
        last_retired=bool(g.get("last_retired")),
    )


def _parse_trace(rank: int, node: str, source: str, where: str, data: Any) -> RankTrace:
    if not isinstance(data, dict):
        raise TraceError(f"malformed trace: a {type(data).__name__}, not a mapping")
    config = _mapping(data, "pg_config")
    for name, conf in config.items():
        if not isinstance(conf, dict):
            raise TraceError(f"malformed trace: pg_config[{_text(name, 40)!r}] is not a mapping")
    groups: dict[str, GroupTrace] = {}
    pg_ids: dict[str, str] = {}  # pg_status is keyed by the recorder's numeric pg id
    raw_groups = data.get("groups") or ()
    if not isinstance(raw_groups, (list, tuple)):
        raise TraceError("malformed trace: groups is not a list")
    for g in raw_groups:
        group = _group(g, config.get(_text(g.get("name"))) if isinstance(g, dict) else None)
        groups[group.name] = group
        pg_ids[_text(g.get("pg_id"))] = group.name
    for name, conf in config.items():
        name = _text(name)
        if name and name not in groups:
            desc = _text(conf.get("desc") or "")
            groups[name] = GroupTrace(name, desc, _members(conf.get("ranks")))
    for pg_id, status in _mapping(data, "pg_status").items():
        found = groups.get(pg_ids.get(_text(pg_id), _text(pg_id)))
        if found is None or not isinstance(status, dict):
            continue
        found.last_enqueued = _status_value(status.get("last_enqueued_collective"))
        found.last_started = _status_value(status.get("last_started_collective"))
        found.last_completed = _status_value(status.get("last_completed_collective"))
    return RankTrace(rank, node, source, where, _text(data.get("version") or ""), groups)
