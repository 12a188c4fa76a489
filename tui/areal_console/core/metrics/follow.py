"""Following a run's metrics: its log (or tensorboard files), here or on a node via the agent.

Reads are offset-based and bounded (the agent's `file_tail` op, or the same function for
local files): each poll reads only what was appended; a rotated or truncated file is read
again from its start. Remote tensorboard files are mirrored chunk by chunk into a local
cache file that the tensorboard loader follows.
"""

from __future__ import annotations

import base64
import math
import os
import time
import zlib
from dataclasses import dataclass
from typing import Any, Protocol

from areal_node.agent.logs import find_logs, owner_uid, read_chunk
from areal_node.agent.protocol import OpError

from areal_console.core.common import private_files
from areal_console.core.common.errors import UserError
from areal_console.core.metrics.health import HealthThresholds
from areal_console.core.metrics.logparse import LogParser
from areal_console.core.metrics.report import HealthReport, build_report
from areal_console.core.metrics.store import MetricStore
from areal_console.core.metrics.tboard import TensorboardReader
from areal_console.core.rollout.stragglers import PhaseDurations, Straggler, find_stragglers

CHUNK = 4 << 20
# A one-shot report reads the whole log (AReaL logs ~20 KB a step: 1 GB is ~50,000 steps);
# past this it says how much it left unread.
READ_ALL_LIMIT = 4 << 30
# The perf tracer files (stragglers): each read from its start, at most this much a poll;
# past TRACE_LIMIT a file's further bytes are not read (about 100,000 steps of the
# trainer's phases).
TRACE_POLL = 16 << 20
TRACE_LIMIT = 256 << 20
TRACE_FIND_EVERY = 30.0  # seconds between looks for new perf tracer files


class FileAccess(Protocol):
    """Where the files are: this machine, or a node through its agent."""

    node: str | None

    def read(self, path: str, offset: int, ident: str | None, max_bytes: int) -> dict[str, Any]: ...
    def find(self, path: str) -> dict[str, Any]: ...


class LocalFiles:
    """Files on this machine, read as the agent reads them (`owner`: as `NodeFiles`)."""

    node: str | None = None

    def __init__(self, owner: str | None = None) -> None:
        self.owner = owner

    def _uid(self) -> int | None:
        try:
            return owner_uid({"owner": self.owner})
        except OpError as exc:
            raise UserError(str(exc).replace(" on this node", "")) from None

    def read(self, path: str, offset: int, ident: str | None, max_bytes: int) -> dict[str, Any]:
        try:
            result = read_chunk(path, offset, ident, max_bytes, self._uid())
        except OpError as exc:
            raise UserError(str(exc)) from None
        except OSError as exc:
            raise UserError(f"cannot read {path}: {exc.strerror}") from None
        if not result["exists"]:
            raise UserError(f"no such file: {path}")
        return result

    def find(self, path: str) -> dict[str, Any]:
        try:
            return find_logs(path, owner=self._uid())
        except OpError as exc:
            raise UserError(str(exc).replace(" on this node", "")) from None


class Caller(Protocol):
    @property
    def name(self) -> str: ...

    def call(self, op: str, args: dict[str, Any] | None = None, timeout: float = 30.0) -> Any: ...


class NodeFiles:
    """Files on a node, read by its agent (`file_tail`, `log_find`).

    `owner`: the job's user, when the path came from a job's processes; the agent then
    reads only files that user owns (and follows no other user's symlink)."""

    def __init__(self, session: Caller, owner: str | None = None) -> None:
        self.session = session
        self.node: str | None = session.name
        self.owner = owner

    def read(self, path: str, offset: int, ident: str | None, max_bytes: int) -> dict[str, Any]:
        args = {"path": path, "offset": offset, "ident": ident, "max_bytes": max_bytes}
        result = dict(self._call("file_tail", self._owned(args)))
        result["data"] = zlib.decompress(base64.b64decode(result["data"]))
        return result

    def find(self, path: str) -> dict[str, Any]:
        return dict(self._call("log_find", self._owned({"path": path})))

    def _owned(self, args: dict[str, Any]) -> dict[str, Any]:
        return {**args, "owner": self.owner} if self.owner else args

    def _call(self, op: str, args: dict[str, Any]) -> Any:
        try:
            return self.session.call(op, args, timeout=60)
        except Exception as exc:  # AgentError, AgentDisconnected, NodeUnavailable
            raise UserError(f"{self.node}: {exc}") from None


@dataclass
class Tail:
    """One followed file: where the next read starts."""

    path: str
    offset: int = 0
    ident: str | None = None
    size: int = 0

    def read(self, files: FileAccess, max_bytes: int = CHUNK) -> dict[str, Any]:
        result = files.read(self.path, self.offset, self.ident, max_bytes)
        self.ident, self.offset, self.size = result["ident"], result["next"], result["size"]
        return result


class MetricsFollower:
    """A run's metrics from `path` (a log file, an event file, or the run's log directory)."""

    def __init__(
        self,
        path: str,
        files: FileAccess | None = None,
        thresholds: HealthThresholds | None = None,
    ) -> None:
        self.path = path
        self.files: FileAccess = files or LocalFiles()
        self.thresholds = thresholds or HealthThresholds()
        self.store = MetricStore()
        self.parser: LogParser | None = None
        self.tensorboard: TensorboardReader | None = None
        self.log: Tail | None = None
        self.event_tails: list[tuple[Tail, str]] = []  # remote event file -> local mirror
        self.source = ""
        self.traces: list[tuple[Tail, str | None, int]] = []  # perf tracer file, role, rank
        self.phases = PhaseDurations()
        self._stragglers: list[Straggler] | None = []
        self._trace_notes: dict[str, str] = {}
        self._traces_found_at = -math.inf
        self._node_now: float | None = None
        self._node_mono = 0.0
        self._mirror_dir: str | None = None

    # reading --------------------------------------------------------------------------
    def open(self) -> None:
        found = self.files.find(self.path)
        where = f"{self.files.node}:" if self.files.node else ""
        self._add_traces(found)
        if found["logs"]:
            self.log = Tail(found["logs"][0])
            self.parser = LogParser(self.store)
            self.source = where + self.log.path
        elif found["events"]:
            if self.files.node is None:
                self.tensorboard = TensorboardReader(found["path"], self.store)
            else:
                self._mirror_dir = str(private_files.temp_dir("areal-console-tb-"))
                for i, remote in enumerate(found["events"]):
                    local = os.path.join(self._mirror_dir, f"{i:03d}", os.path.basename(remote))
                    private_files.create(local).close()
                    self.event_tails.append((Tail(remote), local))
                self.tensorboard = TensorboardReader(self._mirror_dir, self.store)
            self.source = where + found["path"]
        else:
            raise UserError(f"no AReaL log (main.log, trainer.log, merged.log, *.log) or "
                            f"tensorboard events at {where}{found['path']}")  # fmt: skip

    def read_to_end(self, limit: int = READ_ALL_LIMIT) -> int:
        """Read the log to the end it had when this call began (a one-shot report must see
        the whole run, however large), at most `limit` bytes; returns how many new steps."""
        new = self.poll()
        if self.tensorboard is not None:
            read = 0
            while self.tensorboard.unread_bytes and read < limit:
                read += self.tensorboard.unread_bytes
                new += self.poll()
        self.poll_traces(TRACE_LIMIT)
        if self.log is None:
            return new
        end = self.log.size
        spent = self.log.offset
        while self.log.offset < end and spent < limit:
            before = self.log.offset
            new += self.poll()
            if self.log.offset <= before:
                break  # truncated, rotated or shrunk under us: what was read stands
            spent += self.log.offset - before
        return new

    @property
    def unread_bytes(self) -> int:
        """The log's bytes past what was read (as the last read saw its size), or the
        event files' bytes the last poll left for the next."""
        if self.tensorboard is not None:
            return self.tensorboard.unread_bytes
        return max(0, self.log.size - self.log.offset) if self.log is not None else 0

    @property
    def notes(self) -> list[str]:
        tb = self.tensorboard.notes if self.tensorboard is not None else []
        return tb + list(self._trace_notes.values())

    def _add_traces(self, found: dict[str, Any]) -> None:
        self._traces_found_at = time.monotonic()
        known = {tail.path for tail, _, _ in self.traces}
        for t in found.get("traces") or []:
            role, rank, path = t.get("role"), t.get("rank"), t.get("path")
            if isinstance(path, str) and type(rank) is int and path not in known:
                self.traces.append((Tail(path), role if isinstance(role, str) else None, rank))

    def poll_traces(self, budget: int = TRACE_POLL) -> None:
        """Read what each perf tracer file gained (at most `budget` bytes a file); the
        files are looked for again now and then (a rank's file appears at its first save)."""
        if time.monotonic() - self._traces_found_at > TRACE_FIND_EVERY:
            try:
                self._add_traces(self.files.find(self.path))
            except UserError:
                pass  # the log's own read says what is wrong
        for tail, role, rank in self.traces:
            spent = 0
            while spent < budget and tail.offset < TRACE_LIMIT:
                try:
                    result = tail.read(self.files, min(CHUNK, budget - spent))
                except UserError as exc:  # gone, or not readable: the others still count
                    self._trace_notes[tail.path] = str(exc)
                    break
                self._trace_notes.pop(tail.path, None)
                if result["rotated"] or result["truncated"]:
                    self.phases.reset(role, rank)
                if result["data"]:
                    self.phases.feed(role, rank, result["data"])
                    self._stragglers = None
                spent += len(result["data"])
                if result["eof"] or not result["data"]:
                    break
            if tail.offset >= TRACE_LIMIT and tail.size > tail.offset:
                self._trace_notes[tail.path] = (
                    f"{tail.path}: only its first {TRACE_LIMIT >> 20} MiB read for stragglers"
                )

    def stragglers(self) -> list[Straggler]:
        """Ranks persistently slower than the others in a phase (core/rollout/stragglers)."""
        if self._stragglers is None:
            self._stragglers = find_stragglers(self.phases.table())
        return self._stragglers

    def poll(self, budget: int = 64 << 20) -> int:
        """Read what was appended (at most `budget` bytes); returns how many new steps."""
        if self.parser is None and self.tensorboard is None:
            self.open()
        before = len(self.store.steps)
        self.poll_traces()
        if self.parser is not None and self.log is not None:
            spent = 0
            while spent < budget:
                result = self.log.read(self.files, min(CHUNK, budget - spent))
                self._clock(result)
                if result["rotated"] or result["truncated"]:
                    self.parser.reset()
                if spent == 0 and self.parser.bytes_read == 0:
                    self.parser.utc_offset = int(result.get("utc_offset", self.parser.utc_offset))
                self.parser.feed(result["data"])
                spent += len(result["data"])
                if result["eof"] or not result["data"]:
                    break
        if self.tensorboard is not None:
            for tail, local in self.event_tails:
                while True:
                    result = tail.read(self.files)
                    self._clock(result)
                    if result["rotated"] or result["truncated"]:
                        private_files.replace(local, result["data"])
                    else:
                        with private_files.append_bytes(local) as fh:
                            fh.write(result["data"])
                    if result["eof"] or not result["data"]:
                        break
            self.tensorboard.poll()
            errors = self.tensorboard.errors
            if errors and not self.store.steps and len(errors) == len(self.tensorboard.files):
                raise UserError("; ".join(errors.values()))
            if not self.event_tails:
                self._node_now, self._node_mono = time.time(), time.monotonic()
        return len(self.store.steps) - before

    def _clock(self, result: dict[str, Any]) -> None:
        self._node_now, self._node_mono = float(result["now"]), time.monotonic()

    def node_now(self) -> float:
        """The node's clock now (its last answer plus the time since)."""
        if self._node_now is None:
            return time.time()
        return self._node_now + (time.monotonic() - self._node_mono)

    @property
    def finished(self) -> bool:
        return bool(self.parser and self.parser.finished)

    def report(self, now: float | None = None) -> HealthReport:
        total = self.parser.total_steps if self.parser else None
        return build_report(self.source or self.path, self.store, self.finished,
                            self.node_now() if now is None else now, self.thresholds, total,
                            self.unread_bytes, self.notes,
                            tuple(self.stragglers()))  # fmt: skip

    def close(self) -> None:
        if self._mirror_dir:
            import shutil

            shutil.rmtree(self._mirror_dir, ignore_errors=True)
            self._mirror_dir = None
