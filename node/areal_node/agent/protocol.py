"""The agent's side of the wire: protocol version, the op registry and argument checks.

Every request names an op; a module registers its handlers with `@op("name")` and they
run with the `Agent` and the request's `args` dict. `OpError` is a reply with `ok: false`.
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


def op(name: str) -> Callable[[Handler], Handler]:
    """Register a request handler under `name`."""

    def register(func: Handler) -> Handler:
        OPS[name] = func
        return func

    return register


def arg(args: dict[str, Any], name: str, kind: type, default: Any) -> Any:
    value = args.get(name, default)
    if kind is float and isinstance(value, int) and not isinstance(value, bool):
        value = float(value)
    if not isinstance(value, kind) or (kind is not bool and isinstance(value, bool)):
        raise OpError(f"argument {name!r} must be {kind.__name__}, got {value!r}")
    return value
