"""`--ray [ADDRESS]`: a Ray cluster's nodes as node specs, reached through agent actors.

Ray is asked once for its nodes. Nodes Ray reports dead are kept (shown down, with Ray's
reason) but not contacted. Each alive node gets one spec; its agent is an actor pinned to
it (`ray_channel.py`), or, with `ssh_fallback`, SSH to the node's IP where Ray can't place
the actor.
"""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass, field

from areal_console.core.ray.nodes import (
    RAY_EXTRA,
    RayAddress,
    RayNode,
    list_nodes,
    parse_address,
    ray_importable,
)
from areal_console.core.targets.specs import NodeSpec, RayTarget


@dataclass
class RayPlan:
    """What `--ray` resolved to."""

    address: RayAddress
    nodes: list[RayNode]
    specs: list[NodeSpec]
    listed_by: str  # "state-api" | "dashboard"
    notes: list[str] = field(default_factory=list)


def node_names(nodes: list[RayNode]) -> list[str]:
    """A unique name per node: Ray's node name, with the node id's head where two share one."""
    counts = Counter(n.name for n in nodes)
    return [n.name if counts[n.name] == 1 else f"{n.name}-{n.node_id[:8]}" for n in nodes]


def ray_specs(address: RayAddress, nodes: list[RayNode], ssh_fallback: bool) -> list[NodeSpec]:
    """One spec per alive node, the head first."""
    order = sorted((n for n in nodes if n.alive), key=lambda n: (not n.is_head, n.ip, n.node_id))
    return [
        NodeSpec(
            name=name,
            transport="ray",
            host=node.ip,
            ray=RayTarget(address.for_ray, node.node_id, ssh_fallback),
        )
        for node, name in zip(order, node_names(order), strict=True)
    ]


MAX_DEAD_NOTES = 5


def resolve_ray_targets(text: str | None, *, ssh_fallback: bool = False) -> RayPlan:
    """The cluster's alive nodes as specs; `UserError` (one line) when Ray can't be asked.
    Nodes Ray reports dead (it keeps them in its table for a while) get a note each."""
    address = parse_address(text)
    nodes, listed_by = list_nodes(address)
    notes: list[str] = []
    dead = [n for n in nodes if not n.alive]
    for n in dead[:MAX_DEAD_NOTES]:
        why = f": {n.state_message}" if n.state_message else ""
        notes.append(f"Ray reports node {n.name} ({n.ip}) dead{why}; not contacting it")
    if len(dead) > MAX_DEAD_NOTES:
        notes.append(f"and {len(dead) - MAX_DEAD_NOTES} more dead nodes")
    if not ray_importable():
        how = "over SSH to each node's IP" if ssh_fallback else "not at all"
        notes.append(
            f"nodes listed through the Ray dashboard; without the [ray] extra ({RAY_EXTRA}) "
            f"the agent can't run as a Ray actor, so the nodes are reached {how}"
        )
    return RayPlan(address, nodes, ray_specs(address, nodes, ssh_fallback), listed_by, notes)
