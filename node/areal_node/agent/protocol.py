"""The agent's side of the wire: protocol version, the op registry and argument checks.

Every request names an op; a module registers its handlers with `@op("name")` and they
run with the `Agent` and the request's `args` dict. `OpError` is a reply with `ok: false`.
The modules of ops a session may never use are imported on their first request
(`LATER`), so an agent starts without compiling them.
"""

from __future__ import annotations

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
    **dict.fromkeys(("name_resolve", "tcp_probe"), "areal_node.agent.name_resolve_op"),
}


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
