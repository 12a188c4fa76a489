"""AReaL's name-resolve records read on this node, for a console that cannot see the
record root (`--name-resolve-via NODE`), and the records' addresses probed from here.

    name_resolve {root, user, experiment, trial}
        -> {root, exists, entries: [{key, value, owner}], refused: [why],
            trials: [...], users: [...]}     (trials/users only when no entry was found)
    tcp_probe {addresses: [[host, port], ...], timeout}
        -> {verdicts: [[host, port, null | why], ...]}

Both use the node package's readers (areal_node.name_resolve, areal_node.tcp_probe),
the console's own when it reads a root it sees: same owner check, same bounds.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from areal_node import name_resolve, tcp_probe
from areal_node.agent.protocol import OpError, arg, op

if TYPE_CHECKING:
    from areal_node.agent.serve import Agent

MAX_PROBES = 4096  # addresses in one request (a 512-worker job has 512)


@op("name_resolve")
def op_name_resolve(agent: Agent, args: dict[str, Any]) -> dict[str, Any]:
    root = arg(args, "root", str, name_resolve.DEFAULT_NFS_ROOT)
    if not root.startswith("/") or "\0" in root:
        raise OpError(f"argument 'root' must be an absolute path, got {root!r}")
    user = arg(args, "user", str, "")
    experiment = arg(args, "experiment", str, "")
    trial = arg(args, "trial", str, "")
    try:
        return name_resolve.lookup(root, user, experiment, trial)
    except name_resolve.RootError as exc:
        raise OpError(str(exc)) from None


@op("tcp_probe")
def op_tcp_probe(agent: Agent, args: dict[str, Any]) -> dict[str, Any]:
    raw = arg(args, "addresses", list, [])
    timeout = arg(args, "timeout", float, tcp_probe.PROBE_TIMEOUT)
    if not 0 < timeout <= 30:
        raise OpError(f"argument 'timeout' must be between 0 and 30 seconds, got {timeout}")
    if len(raw) > MAX_PROBES:
        raise OpError(f"at most {MAX_PROBES} addresses, got {len(raw)}")
    addresses: list[tuple[str, int]] = []
    for item in raw:
        ok = isinstance(item, list) and len(item) == 2 and isinstance(item[0], str)
        port = item[1] if ok else None
        if not ok or not isinstance(port, int) or isinstance(port, bool) or not 0 < port < 65536:
            raise OpError(f"argument 'addresses': expected [host, port] pairs, got {item!r}")
        addresses.append((item[0], port))
    verdicts = tcp_probe.probe_addresses(addresses, timeout)
    return {"verdicts": [[host, port, verdicts.get((host, port))] for host, port in addresses]}
