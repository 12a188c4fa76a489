"""A client for one node agent over any `Channel`: requests by id, events to a callback.

Thread-based on purpose: TUI workers and CLI fan-out both call it from worker threads.
"""

from __future__ import annotations

import itertools
import json
import re
import threading
import time
from collections.abc import Callable
from typing import Any

from areal_node.agent.protocol import PROTOCOL_VERSION

from areal_console.core.connection.transport import (
    MAX_LINE_BYTES,
    RECHECK_FRAME,
    TOO_LONG,
    Channel,
    ChannelClosed,
    source_frame,
)

EventHandler = Callable[[dict[str, Any]], None]
# The id at the start of a reply line, as the agent writes it: `{"id":12,`.
_LINE_ID = re.compile(rb'\s*\{\s*"id"\s*:\s*(\d{1,18})\s*[,}]')


class PayloadUploads:
    """The payload sent once per shared home: the first node that lacks it gets it; a node
    that asks while (or after) another node got it first waits for that one to start,
    then looks in its cache again, where a home shared with that node now has it; only a
    node that still lacks it then gets it too."""

    WAIT_SECONDS = 5.0  # at most, for the first node's agent to start

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._first: AgentClient | None = None
        self._first_done = threading.Event()
        self.sent = 0  # payloads sent (for status lines, benchmarks and tests)

    def frame_for(self, client: AgentClient) -> bytes:
        """What to answer `client`'s `need_source`: the payload, or "look again"."""
        with self._lock:
            asked_before, client.asked_source = client.asked_source, True
            if asked_before or self._first is None or self._first is client:
                if self._first is None:
                    self._first = client
                self.sent += 1
                return source_frame()
        self._first_done.wait(self.WAIT_SECONDS)
        return RECHECK_FRAME

    def settled(self, client: AgentClient) -> None:
        """`client`'s agent started, or its channel ended."""
        if self._first is client:
            self._first_done.set()


UPLOADS = PayloadUploads()


class AgentError(Exception):
    """The agent answered with an error."""


class AgentNotResponding(AgentError):
    """No answer in time while the channel stays open: the agent is frozen or overloaded."""

    def __init__(self, op: str, seconds: float) -> None:
        super().__init__(
            f"{op}: agent not responding for {seconds:g} s (the connection is still open)"
        )
        self.op, self.seconds = op, seconds


class AgentDisconnected(Exception):
    """The channel to the agent ended; the message says why."""


class PendingReply:
    """The agent's answer to one request, still to come: filled in by the reader thread
    (a future without concurrent.futures, whose imports alone cost a one-shot command
    5 ms). Not `messages.Reply`, which is a worker's message to a screen."""

    def __init__(self) -> None:
        self._done = threading.Event()
        self._result: Any = None
        self._error: BaseException | None = None

    def set_result(self, result: Any) -> None:
        self._result = result
        self._done.set()

    def set_exception(self, error: BaseException) -> None:
        self._error = error
        self._done.set()

    def done(self) -> bool:
        return self._done.is_set()

    def result(self, timeout: float | None = None) -> Any:
        """The result, or the error raised; `TimeoutError` when none came in `timeout`."""
        if not self._done.wait(timeout):
            raise TimeoutError
        if self._error is not None:
            raise self._error
        return self._result


class AgentClient:
    def __init__(self, channel: Channel, on_event: EventHandler | None = None) -> None:
        self.channel = channel
        self.on_event = on_event
        self._ids = itertools.count(1)
        self._pending: dict[int, PendingReply] = {}
        self._lock = threading.Lock()
        self._ready = threading.Event()
        self.asked_source = False  # the agent asked for the payload (see PayloadUploads)
        self.closed_reason: str | None = None
        self.hello: dict[str, Any] = {}
        push = getattr(channel, "push_to", None)
        if callable(push):
            # A channel that hands its lines over itself (a relayed node's, from its hub's
            # reader): no reader thread of its own.
            push(self._take_line, self._take_end)
        else:
            reader = threading.Thread(target=self._read_loop, name="agent-reader", daemon=True)
            reader.start()

    # lifecycle ------------------------------------------------------------------------
    def start(self, timeout: float = 30.0, gpus: bool = True) -> dict[str, Any]:
        """Wait for the agent to come up, then handshake; returns the `hello` result.

        `gpus=False` asks the agent not to load NVML to report on it."""
        if not self._ready.wait(timeout):
            raise AgentDisconnected(
                self.closed_reason or f"agent did not start within {timeout:g}s"
            )
        if self.closed_reason:
            raise AgentDisconnected(self.closed_reason)
        args = (
            {"protocol": PROTOCOL_VERSION}
            if gpus
            else {"protocol": PROTOCOL_VERSION, "gpus": False}
        )
        self.hello = self.request("hello", args, timeout=timeout)
        if self.hello.get("protocol") != PROTOCOL_VERSION:
            raise AgentError(
                f"agent speaks protocol {self.hello.get('protocol')}, console {PROTOCOL_VERSION}"
            )
        return self.hello

    @property
    def alive(self) -> bool:
        return self.closed_reason is None

    def close(self) -> None:
        self.channel.close()

    # requests -------------------------------------------------------------------------
    def request_async(self, op: str, args: dict[str, Any] | None = None) -> PendingReply:
        fut = PendingReply()
        rid = next(self._ids)
        with self._lock:
            if self.closed_reason:
                fut.set_exception(AgentDisconnected(self.closed_reason))
                return fut
            self._pending[rid] = fut
        line = json.dumps({"id": rid, "op": op, "args": args or {}}) + "\n"
        try:
            self.channel.send(line.encode())
        except (ChannelClosed, OSError) as exc:
            with self._lock:
                self._pending.pop(rid, None)
            fut.set_exception(AgentDisconnected(str(exc) or "channel closed"))
        return fut

    def request(self, op: str, args: dict[str, Any] | None = None, timeout: float = 30.0) -> Any:
        fut = self.request_async(op, args)
        try:
            return fut.result(timeout)
        except TimeoutError:
            # The link is still there (a dropped one ends the future at once): the agent
            # itself is stuck, stopped or overloaded.
            raise AgentNotResponding(op, timeout) from None

    def round_trip(self, timeout: float = 10.0) -> float:
        """Seconds for one `ping`."""
        t0 = time.perf_counter()
        self.request("ping", timeout=timeout)
        return time.perf_counter() - t0

    # reader ---------------------------------------------------------------------------
    def _read_loop(self) -> None:
        """Survives any line: one it cannot use fails the request it answers (its id read
        from the line's start), and the reader goes on."""
        while True:
            line = self.channel.recv_line()
            if not line:
                break
            try:
                self._handle_line(line)
            except Exception as exc:  # a message that broke its handling fails its request
                self._fail(line, f"reply could not be handled: {type(exc).__name__}")
        self._closed(self.channel.exit_reason())

    def _take_line(self, line: bytes) -> None:
        """One line pushed by the channel (as `_read_loop` takes each)."""
        try:
            self._handle_line(line)
        except Exception as exc:
            self._fail(line, f"reply could not be handled: {type(exc).__name__}")

    def _take_end(self) -> None:
        self._closed(self.channel.exit_reason())

    def _handle_line(self, line: bytes) -> None:
        if line.startswith(TOO_LONG):
            self._fail(line[len(TOO_LONG) :], f"reply longer than {MAX_LINE_BYTES >> 20} MB")
            return
        try:
            message = json.loads(line)
        except RecursionError:
            self._fail(line, "reply nested too deeply to decode")
            return
        except ValueError:
            return  # noise on stdout (e.g. a login banner) is not a reply
        if not isinstance(message, dict):
            return
        if "event" in message:
            self._handle_event(message)
            return
        rid = message.get("id")
        with self._lock:
            fut = self._pending.pop(rid, None) if isinstance(rid, int) else None
        if fut is None:
            return
        if message.get("ok"):
            fut.set_result(message.get("result"))
        else:
            fut.set_exception(AgentError(str(message.get("error", "unknown error"))))

    def _fail(self, line: bytes, why: str) -> None:
        """Fail the request whose id starts `line` (the agent writes the id first)."""
        found = _LINE_ID.match(line[:64])
        if found is None:
            return
        with self._lock:
            fut = self._pending.pop(int(found.group(1)), None)
        if fut is not None:
            fut.set_exception(AgentError(why))

    def _handle_event(self, message: dict[str, Any]) -> None:
        kind = message["event"]
        if kind == "need_source":
            try:
                self.channel.send(UPLOADS.frame_for(self))
            except (ChannelClosed, OSError):
                pass
            return
        if kind == "ready":
            self._ready.set()
            UPLOADS.settled(self)
            return
        if self.on_event is not None:
            try:
                self.on_event(message)
            except Exception:  # a broken subscriber must not kill the reader
                pass

    def _closed(self, reason: str) -> None:
        UPLOADS.settled(self)
        with self._lock:
            self.closed_reason = reason or "agent connection closed"
            pending, self._pending = self._pending, {}
        self._ready.set()
        for fut in pending.values():
            fut.set_exception(AgentDisconnected(self.closed_reason))
        if self.on_event is not None:
            try:
                self.on_event({"event": "closed", "reason": self.closed_reason})
            except Exception:
                pass
