"""Node specs: the records naming what the console connects to (no parsing here, so the
inventory and Slurm resolvers that build them import only this)."""

from __future__ import annotations

import ipaddress
import os
import re
from dataclasses import asdict, dataclass, field
from typing import Any

_HOST_NAME = re.compile(r"[A-Za-z0-9_][A-Za-z0-9._-]{0,252}")


def is_host(text: str) -> bool:
    """A host name (letters, digits, `.`, `_`, `-`; not starting with `-`) or an IP
    address, nothing else: a host read from a job's records, Ray or a process is handed
    to SSH (an ssh_config `ProxyCommand` expands it as `%h`), where a space or a leading
    `-` would become an option of the proxy command."""
    if _HOST_NAME.fullmatch(text):
        return True
    address, _, zone = text.partition("%")  # fe80::1%eth0: a link-local address's zone
    if ":" not in address or (zone and not _HOST_NAME.fullmatch(zone)) or text.endswith("%"):
        return False
    try:
        ipaddress.IPv6Address(address)
    except ValueError:
        return False
    return True


@dataclass(frozen=True)
class SlurmTarget:
    """How a "slurm" node is reached: a step of `job_id`, started where Slurm's commands are.

    `nodes` are all nodes of the fan-out (one multiplexed `srun` step serves them all in
    `mode="step"`; `mode="node"` starts one step per node). `unreachable` is Slurm's own
    reason when it already knows the node can't run a step (down, not responding).
    """

    job_id: str
    login: str | None = None
    nodes: tuple[str, ...] = ()
    mode: str = "step"
    gpus: int = 0
    unreachable: str | None = None


@dataclass(frozen=True)
class RayTarget:
    """How a "ray" node is reached: an agent actor pinned to `node_id` of the cluster at
    `address` (what `ray.init` takes). `ssh_fallback`: where Ray can't place the actor,
    reach the node over SSH at its IP."""

    address: str
    node_id: str
    ssh_fallback: bool = False


@dataclass(frozen=True)
class NodeSpec:
    """One node to reach: `transport` is "local" (a child process), "ssh", "slurm" or
    "ray"."""

    name: str
    transport: str = "local"
    host: str | None = None
    port: int | None = None
    user: str | None = None
    identity_file: str | None = None
    proxy_jump: str | None = None
    python: str = "python3"
    groups: tuple[str, ...] = field(default=())
    slurm: SlurmTarget | None = None
    ray: RayTarget | None = None

    @property
    def address(self) -> str:
        if self.transport == "local":
            return "local"
        if self.transport == "slurm" and self.slurm is not None:
            return f"slurm:{self.slurm.job_id}:{self.host}"
        if self.transport == "ray":
            return f"ray:{self.host}"
        user = f"{self.user}@" if self.user else ""
        port = f":{self.port}" if self.port else ""
        return f"{user}{self.host}{port}"


def local_node() -> NodeSpec:
    return NodeSpec(name=os.uname().nodename or "local", transport="local")


def spec_to_json(spec: NodeSpec) -> dict[str, Any]:
    """`spec` as plain JSON (for a child process that reaches the same nodes)."""
    return asdict(spec)


def spec_from_json(doc: dict[str, Any]) -> NodeSpec:
    """The spec `spec_to_json` wrote (TypeError when `doc` is not one)."""
    doc = dict(doc)
    slurm, ray = doc.pop("slurm", None), doc.pop("ray", None)
    return NodeSpec(
        **{**doc, "groups": tuple(doc.get("groups") or ())},
        slurm=SlurmTarget(**{**slurm, "nodes": tuple(slurm.get("nodes") or ())}) if slurm else None,
        ray=RayTarget(**ray) if ray else None,
    )
