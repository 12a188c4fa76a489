"""NCCL's RAS status report (read by the agent's `nccl_ras` op) as typed records, and
what it says about a hang: per communicator, how many collectives of each kind every rank
has launched. The rank whose count lags is the one the others wait on.

Formats, transcribed from NVIDIA/nccl v2.28.7-1 src/ras/client_support.cc:
- JSON (`SET FORMAT json`, 2.28.7 on): `jsonWriteHeader` .. `jsonWriteFooter` (1890-1987):
  `{"nccl_version", "communicators": [{"hash", "size", "ranks": [{"rank", "host",
  "pid", "status": {...}, "collective_counts": {"AllReduce": n, ...}}], "missing_ranks":
  [{"rank", "host", "pid", "status": {"unresponsive", "considered_dead"}}]}], "ras":
  {"collection_time_sec", "timeouts_count"}}`. 2.28.7 and 2.28.9 leave out the comma after
  a missing rank's `"nvml_dev"` (1963; fixed in 2.29): that one defect is repaired.
- Text (`VERBOSE STATUS`, 2.24 on): per mismatched communicator `#G-I (HASH) MISMATCH`,
  then per operation `Communicator ranks have different OP operation counts`, `N ranks
  have launched up to operation V` / `... have not launched any operations`, and
  `Rank R has launched up to operation V -- GPU ...` or `Rank R -- GPU ...` for ranks of
  a group of that count (1541-1631); `Missing communicator data from N job processes`
  (1227), `Encountered N communication timeouts` (1400).
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass, field
from typing import Any

from areal_console.core.common.rankset import format_ranks

MAX_COMMS = 4096
MAX_RANKS = 1 << 17  # ranks read per communicator
MAX_NOTES = 12
# The 2.28.7/2.28.9 JSON defect: `"nvml_dev": N` + newline + `"status"` with no comma.
_MISSING_COMMA = re.compile(r'("nvml_dev": -?\d{1,10})(\n[ ]{0,40}"status")')
_GROUP = re.compile(
    r"(\d{1,9}) ranks have (?:launched up to operation (\d{1,19})|not launched any)"
)
_ONE = re.compile(r"Rank (\d{1,9}) (?:has launched up to operation (\d{1,19})|has not launched any"
                  r"|--)")  # fmt: skip
_MISMATCH = re.compile(r"#\d{1,9}-\d{1,9} \(([0-9a-fA-F]{1,16})\) MISMATCH")
_OP = re.compile(r"Communicator ranks have different (\w{1,40}) operation counts")
NOTE_STARTS = (
    "Missing communicator data from",
    "Encountered ",
    "Communicator ranks have different status",
)


@dataclass(slots=True)
class RasCount:
    """Ranks of a communicator that launched `count` collectives of one kind (`ranks`
    may list fewer than `size`: the text report names only the smaller groups)."""

    count: int
    size: int
    ranks: list[int] = field(default_factory=list)


@dataclass(slots=True)
class RasComm:
    hash: str
    size: int | None = None
    counts: dict[str, list[RasCount]] = field(default_factory=dict)  # operation -> groups
    missing: list[int] = field(default_factory=list)
    dead: list[int] = field(default_factory=list)

    def lags(self) -> list[tuple[str, RasCount, int]]:
        """(operation, a group that launched fewer, the most any rank launched) for every
        operation whose counts differ: those ranks are the ones the others wait on."""
        found = []
        for name, groups in self.counts.items():
            most = max((g.count for g in groups), default=0)
            found += [(name, g, most) for g in groups if g.count < most]
        return found

    def summary(self) -> str:
        size = f"{self.size} ranks" if self.size is not None else "size unknown"
        parts = []
        for name, groups in self.counts.items():
            if len(groups) < 2:
                continue
            shown = ", ".join(
                f"{_who(g)} up to #{g.count}" for g in sorted(groups, key=lambda g: -g.count)
            )
            parts.append(f"{name}: {shown}")
        if self.missing:
            parts.append(f"no data from ranks {format_ranks(self.missing)}")
        if self.dead:
            parts.append(f"considered dead: ranks {format_ranks(self.dead)}")
        return f"comm {self.hash} ({size}): " + ("; ".join(parts) or "counts agree")


def _who(g: RasCount) -> str:
    if g.ranks and len(g.ranks) == g.size:
        return f"rank {g.ranks[0]}" if g.size == 1 else f"ranks {format_ranks(g.ranks)}"
    return f"{g.size} ranks" + (f" ({format_ranks(g.ranks)})" if g.ranks else "")


@dataclass(slots=True)
class RasStatus:
    """What one RAS port answered (or why nothing was read)."""

    address: str | None = None
    format: str | None = None  # json | text
    nccl_version: str | None = None
    comms: list[RasComm] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)
    error: str | None = None

    def lagging_ranks(self) -> list[int]:
        """Ranks whose count lags in some communicator (named in the report)."""
        return sorted({r for c in self.comms for _, g, _ in c.lags() for r in g.ranks})

    def lines(self) -> list[str]:
        if self.error:
            return [f"  {self.error}"]
        out = [f"  {c.summary()}" for c in self.comms if c.lags() or c.missing or c.dead]
        if not out:
            out.append(f"  {len(self.comms)} communicators, every rank's counts agree")
        out += [f"  note: {n}" for n in self.notes]
        return out

    def findings(self) -> list[str]:
        """One line per lag: what the diagnosis cites."""
        found = []
        for c in self.comms:
            for name, g, most in c.lags():
                found.append(f"comm {c.hash}: {_who(g)} launched {name} up to #{g.count}, "
                              f"others up to #{most}: they wait on {_who(g)}")  # fmt: skip
        return found

    def to_json(self) -> dict[str, Any]:
        return {
            "address": self.address,
            "format": self.format,
            "nccl_version": self.nccl_version,
            "communicators": [
                {
                    "hash": c.hash,
                    "size": c.size,
                    "missing": c.missing,
                    "dead": c.dead,
                    "counts": {
                        k: [{"count": g.count, "size": g.size, "ranks": g.ranks} for g in v]
                        for k, v in c.counts.items()
                    },
                }
                for c in self.comms
            ],
            "lagging_ranks": self.lagging_ranks(),
            "notes": self.notes,
            "error": self.error,
        }

    @classmethod
    def from_json(cls, doc: Any) -> RasStatus | None:
        """A saved capture's `nccl_ras` back (None: absent or not one)."""
        if not isinstance(doc, dict):
            return None
        comms = []
        for c in doc.get("communicators") or []:
            if not isinstance(c, dict):
                continue
            counts = {
                str(k): [RasCount(_int(g.get("count")) or 0, _int(g.get("size")) or 0,
                                  _ints(g.get("ranks"))) for g in v if isinstance(g, dict)]
                for k, v in (c.get("counts") or {}).items() if isinstance(v, list)
            }  # fmt: skip
            comms.append(RasComm(str(c.get("hash")), _int(c.get("size")), counts,
                                 _ints(c.get("missing")), _ints(c.get("dead"))))  # fmt: skip
        return cls(_str(doc.get("address")), _str(doc.get("format")), _str(doc.get("nccl_version")),
                   comms, [str(n) for n in doc.get("notes") or []][:MAX_NOTES],
                   _str(doc.get("error")))  # fmt: skip


def _int(value: Any) -> int | None:
    return value if isinstance(value, int) and not isinstance(value, bool) else None


def _ints(values: Any) -> list[int]:
    return (
        [v for v in values if _int(v) is not None][:MAX_RANKS] if isinstance(values, list) else []
    )


def _list(value: Any) -> list[Any]:
    return value if isinstance(value, list) else []


def _str(value: Any) -> str | None:
    return str(value)[:200] if isinstance(value, str) else None


def parse_ras_json(text: str) -> RasStatus:
    """A JSON report (see the module docstring) as records; ValueError if it is not one."""
    try:
        doc = json.loads(_MISSING_COMMA.sub(r"\1,\2", text))
    except (ValueError, RecursionError) as exc:
        raise ValueError(f"not a RAS JSON report: {str(exc)[:100]}") from None
    if not isinstance(doc, dict) or not isinstance(doc.get("communicators"), list):
        raise ValueError("not a RAS JSON report: no communicators")
    status = RasStatus(format="json", nccl_version=_str(doc.get("nccl_version")))
    for c in doc["communicators"][:MAX_COMMS]:
        if not isinstance(c, dict):
            continue
        comm = RasComm(str(c.get("hash"))[:40], _int(c.get("size")))
        per_op: dict[str, dict[int, list[int]]] = {}
        for r in _list(c.get("ranks"))[:MAX_RANKS]:
            rank = _int(r.get("rank")) if isinstance(r, dict) else None
            counts = r.get("collective_counts") if isinstance(r, dict) else None
            if rank is None or not isinstance(counts, dict):
                continue
            for name, count in list(counts.items())[:64]:
                if _int(count) is not None:
                    per_op.setdefault(str(name)[:40], {}).setdefault(count, []).append(rank)
        for name, by_count in per_op.items():
            comm.counts[name] = [
                RasCount(n, len(rs), sorted(rs)) for n, rs in sorted(by_count.items())
            ]
        for m in _list(c.get("missing_ranks"))[:MAX_RANKS]:
            rank = _int(m.get("rank")) if isinstance(m, dict) else None
            if rank is None:
                continue
            comm.missing.append(rank)
            state = m.get("status")
            if isinstance(state, dict) and state.get("considered_dead") is True:
                comm.dead.append(rank)
        status.comms.append(comm)
    ras = doc.get("ras")
    if isinstance(ras, dict) and (_int(ras.get("timeouts_count")) or 0) > 0:
        status.notes.append(f"{ras['timeouts_count']} communication timeouts while gathering")
    return status


def parse_ras_text(text: str) -> RasStatus:
    """A text report's mismatch sections as records (only differing counts are printed
    there: a communicator whose ranks agree does not appear)."""
    status = RasStatus(format="text")
    comm: RasComm | None = None
    groups: list[RasCount] | None = None
    current: RasCount | None = None
    for raw in text.splitlines():
        line = raw.strip()[:400]
        if line.startswith("NCCL version ") and status.nccl_version is None:
            status.nccl_version = line.split()[2][:40]
        elif (m := _MISMATCH.match(line)) is not None:
            if len(status.comms) >= MAX_COMMS:
                break
            comm = RasComm(f"0x{m.group(1).lower().lstrip('0') or '0'}")
            status.comms.append(comm)
            groups = current = None
        elif comm is not None and (m := _OP.match(line)) is not None:
            groups = comm.counts.setdefault(m.group(1), [])
            current = None
        elif groups is not None and (m := _GROUP.match(line)) is not None:
            current = RasCount(int(m.group(2) or 0), int(m.group(1)))
            groups.append(current)
        elif groups is not None and (m := _ONE.match(line)) is not None:
            rank = int(m.group(1))
            if " -- " in line and "launched" not in line.split(" -- ", 1)[0]:
                if current is not None and len(current.ranks) < MAX_RANKS:
                    current.ranks.append(rank)  # a member of the group just counted
            else:
                groups.append(RasCount(int(m.group(2) or 0), 1, [rank]))
        elif line.startswith(NOTE_STARTS) and len(status.notes) < MAX_NOTES:
            status.notes.append(line)
    return status


def ras_from_agent(reply: Any) -> RasStatus:
    """The agent's `nccl_ras` reply as records (an unreadable report: `error` says why)."""
    if not isinstance(reply, dict):
        return RasStatus(error="no answer")
    address = _str(reply.get("address"))
    if not reply.get("ok"):
        return RasStatus(address=address, error=_str(reply.get("error")) or "not read")
    report = reply.get("report")
    text = report if isinstance(report, str) else ""
    try:
        status = parse_ras_json(text) if reply.get("format") == "json" else parse_ras_text(text)
    except ValueError as exc:
        return RasStatus(address=address, format=_str(reply.get("format")), error=str(exc))
    status.address = address
    return status
