"""The agent's side of the wire: protocol version, the op registry and argument checks.

Every request names an op; a module registers its handlers with `@op("name")` and they
run with the `Agent` and the request's `args` dict. `OpError` is a reply with `ok: false`.
The modules of ops a session may never use are imported on their first request
(`LATER`), so an agent starts without compiling them.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from areal_node.agent.serve import Agent


PROTOCOL_VERSION = 1
AGENT_VERSION = "0.1.0"


class OpError(Exception):
    """An error reply: the request was understood but cannot be served."""


Handler = Callable[["Agent", dict], Any]
OPS: dict[str, Handler] = {}
# op -> the module that registers it, imported when the op is first asked for (a third of
# the agent's code: the agent starts about 5 ms sooner without it).
LATER: dict[str, str] = {
    **dict.fromkeys(
        ("job_launch", "jobs", "job_stop", "job_tail", "stage_file", "replay_index"),
        "areal_node.agent.jobs",
    ),
    **dict.fromkeys(("file_tail", "log_find", "file_read"), "areal_node.agent.logs"),
    "fr_traces": "areal_node.agent.flight_recorder",
    "nccl_ras": "areal_node.agent.nccl_ras",
    **dict.fromkeys(("name_resolve", "tcp_probe"), "areal_node.agent.name_resolve_op"),
    "relay_start": "areal_node.agent.relay",
}


# Each op's deadline, in seconds from the request's arrival: by then the agent has answered,
# with the result or with `<op>: no answer within N s (deadline)`. Each lies below the wait
# of the console's own call, so the agent's answer comes first. An op with a duration
# argument adds it (`pyspy`: its `timeout`, `job_stop`: its `grace`); ops of an extension
# (the batch reader's) take DEFAULT_DEADLINE.
DEADLINES: dict[str, float] = {
    "hello": 25.0,
    "ping": 5.0,
    "relay_start": 10.0,
    "sample": 25.0,
    "stream": 5.0,
    "stream_stop": 5.0,
    "load": 110.0,
    "shutdown": 5.0,
    "pyspy": 25.0,
    "fr_traces": 50.0,
    "nccl_ras": 40.0,
    "file_tail": 25.0,
    "log_find": 25.0,
    "file_read": 25.0,
    "job_launch": 25.0,
    "jobs": 12.0,
    "job_stop": 12.0,
    "job_tail": 25.0,
    "stage_file": 25.0,
    "replay_index": 25.0,
    "name_resolve": 25.0,
    "tcp_probe": 5.0,
}
DEFAULT_DEADLINE = 110.0
DEADLINE_ARGS = {"pyspy": "timeout", "job_stop": "grace", "tcp_probe": "timeout"}
MAX_DEADLINE = 600.0


def deadline(name: str, args: dict[str, Any]) -> float:
    """Seconds op `name` may take with these arguments before a timeout error answers it."""
    base = DEADLINES.get(name, DEFAULT_DEADLINE)
    extra = args.get(DEADLINE_ARGS.get(name, ""), 0.0)
    if isinstance(extra, bool) or not isinstance(extra, (int, float)) or not extra > 0:
        extra = 0.0
    return min(base + float(extra), MAX_DEADLINE)


def op(name: str) -> Callable[[Handler], Handler]:
    """Register a request handler under `name`."""

    def register(func: Handler) -> Handler:
        OPS[name] = func
        return func

    return register


def known_ops() -> list[str]:
    """Every op this agent serves, registered or to be imported."""
    return sorted(set(OPS) | set(LATER))


def handler(name: str) -> Handler | None:
    """The handler of op `name` (its module imported on first use); None: no such op."""
    if name not in OPS and name in LATER:
        import importlib

        importlib.import_module(LATER[name])  # its @op decorators register it
    return OPS.get(name)


def arg(args: dict[str, Any], name: str, kind: type, default: Any) -> Any:
    value = args.get(name, default)
    if kind is float and isinstance(value, int) and not isinstance(value, bool):
        value = float(value)
    if not isinstance(value, kind) or (kind is not bool and isinstance(value, bool)):
        raise OpError(f"argument {name!r} must be {kind.__name__}, got {value!r}")
    return value


# Bounds on one message the agent writes: nesting, values, bytes, the bits of an integer.
# A reply past them (a planted trace nested 200,000 deep, a shared subtree that expands to
# gigabytes, an integer of 20,000 bits) is answered with an error instead.
MAX_REPLY_DEPTH = 200
MAX_REPLY_VALUES = 4_000_000
MAX_REPLY_BYTES = 256 << 20
MAX_INT_BITS = 4096


class ReplyUnsendable(Exception):
    """A message that cannot be written within the bounds; its text says which."""


def check_message(message: Any) -> None:
    """Raise ReplyUnsendable when `message` breaks a bound; walks it without recursion,
    counting a subtree each time it is reached (as the encoder would write it)."""
    stack: list[tuple[Any, int]] = [(message, 0)]
    values = 0
    size = 0
    while stack:
        value, depth = stack.pop()
        values += 1
        if isinstance(value, str):
            size += len(value) + 2
        elif isinstance(value, (dict, list, tuple)):
            if depth >= MAX_REPLY_DEPTH:
                raise ReplyUnsendable(f"reply nested deeper than {MAX_REPLY_DEPTH} levels")
            if isinstance(value, dict):
                for key, item in value.items():
                    size += len(key) + 3 if isinstance(key, str) else 8
                    stack.append((item, depth + 1))
            else:
                stack.extend((item, depth + 1) for item in value)
            size += 2
        elif isinstance(value, int) and not isinstance(value, bool):
            if value.bit_length() > MAX_INT_BITS:
                raise ReplyUnsendable(
                    f"reply holds an integer of {value.bit_length()} bits (at most {MAX_INT_BITS})"
                )
            size += 8
        else:
            size += 8
        if values > MAX_REPLY_VALUES or size > MAX_REPLY_BYTES:
            raise ReplyUnsendable(
                f"reply larger than {MAX_REPLY_VALUES} values or {MAX_REPLY_BYTES >> 20} MB"
            )


def encode_message(message: dict[str, Any]) -> bytes:
    """One JSON line; ReplyUnsendable when `message` breaks a bound or does not encode."""
    check_message(message)
    try:
        text = json.dumps(message, separators=(",", ":"), default=str)
    except (ValueError, TypeError, RecursionError, MemoryError, OverflowError) as exc:
        raise ReplyUnsendable(f"reply cannot be encoded: {type(exc).__name__}") from None
    if len(text) > MAX_REPLY_BYTES:  # default=str may have grown it
        raise ReplyUnsendable(f"reply larger than {MAX_REPLY_BYTES >> 20} MB")
    return (text + "\n").encode()
