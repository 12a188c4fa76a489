"""The target and fleet options as one typed record, shared by the CLI and the TUI.

The command line fills a `TargetOptions` from its parsed arguments (`commands/options.py`);
the TUI builds one directly. Everything below the commands reads this record, never the
command line's namespace.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

DEFAULT_CONNECT_TIMEOUT = 10.0
# How long one node may take to answer a fan-out (connect and agent start included) before
# it is reported as failed and the rest go on without it.
DEFAULT_NODE_TIMEOUT = 60.0
# How many nodes are worked on at once (threads in the console; each waits on its node).
DEFAULT_FANOUT_CONCURRENCY = 64
# Unauthenticated SSH connections in flight through one jump host (or to one sshd when
# there is none), below sshd's MaxStartups (10:30:100 by default: drops start at 10).
DEFAULT_MAX_STARTUPS = 8


@dataclass
class TargetOptions:
    """Which nodes (`--local`, `--hosts`, `--inventory`, `--slurm-job`, `--areal`, `--ray`)
    and how to reach them (ssh config, timeouts, host keys, fan-out limits)."""

    local: bool = False
    hosts: str | None = None  # Slurm hostlist grammar, `[USER@]HOST[:PORT],...`
    inventory: str | None = None  # a cluster.yaml
    slurm_job: str | None = None  # id or name
    areal: str | None = None  # `[USER/]EXPERIMENT/TRIAL`
    name_resolve_root: str | None = None
    name_resolve_via: str | None = None
    etcd3: str | None = None
    fileroot: str | None = None
    ray: str | None = None  # an address, or "auto"
    ray_ssh: bool = False
    login: str | None = None  # where Slurm's commands run
    slurm_mode: str = "step"  # step | node | ssh
    group: list[str] | None = None  # inventory groups
    ssh_config: str | None = None
    connect_timeout: float | None = None  # None: DEFAULT_CONNECT_TIMEOUT
    slurm_timeout: float | None = None
    accept_new_hosts: bool = False
    node_timeout: float | None = None  # None: DEFAULT_NODE_TIMEOUT
    fanout_concurrency: int | None = None  # None: DEFAULT_FANOUT_CONCURRENCY
    max_startups: int | None = None  # None: DEFAULT_MAX_STARTUPS
    # Relay through a tree of agents, this many children each (None or 0: flat, the
    # default): the console connects to that many nodes, whose agents start the rest over
    # ssh from node to node (`tree_ssh_config`: an ssh config on the nodes for that hop).
    fanout_tree: int | None = None
    tree_ssh_config: str | None = None
    # What `--areal` resolved to (`ArealPlan`), set by `resolve_targets`.
    areal_plan: Any = field(default=None, compare=False, repr=False)

    @classmethod
    def of(cls, values: dict[str, Any]) -> TargetOptions:
        """The record from a mapping that may hold other keys too (they are ignored)."""
        names = {f for f in cls.__dataclass_fields__ if f != "areal_plan"}
        return cls(**{k: v for k, v in values.items() if k in names and v is not None})

    def fleet_options(self) -> dict[str, Any]:
        """Keyword options for `Fleet(specs, **options)`."""
        options: dict[str, Any] = {
            "accept_new_hosts": self.accept_new_hosts,
            "connect_timeout": (
                DEFAULT_CONNECT_TIMEOUT
                if self.connect_timeout is None
                else float(self.connect_timeout)
            ),
            "node_timeout": (
                DEFAULT_NODE_TIMEOUT if self.node_timeout is None else float(self.node_timeout)
            ),
            "max_parallel": self.fanout_concurrency or DEFAULT_FANOUT_CONCURRENCY,
            "max_startups": self.max_startups or DEFAULT_MAX_STARTUPS,
        }
        if self.connect_timeout is not None:  # given: it bounds the agent's start too
            options["start_timeout"] = float(self.connect_timeout)
        if self.ssh_config:
            options["ssh_config"] = self.ssh_config
        if self.fanout_tree:
            options["fanout_tree"] = int(self.fanout_tree)
            if self.tree_ssh_config:
                options["tree_ssh_config"] = self.tree_ssh_config
        return options
