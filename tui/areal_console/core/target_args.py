"""The target options every subcommand shares (`--local | --hosts | --inventory |
--slurm-job ...`) and the node specs they name. Kept apart from `targets` (the records)
so that the inventory and Slurm resolvers, which build those records, are not imported by
them in a cycle."""

from __future__ import annotations

import argparse
import sys
from typing import Any

from areal_console.core import inventory as inv
from areal_console.core.errors import UsageError, UserError
from areal_console.core.slurm_targets import resolve_slurm_targets
from areal_console.core.targets import NodeSpec, local_node


def add_target_arguments(parser: argparse.ArgumentParser) -> None:
    """`--local | --hosts ... | --inventory FILE`, shared by every subcommand and the TUI."""
    group = parser.add_argument_group("targets")
    excl = group.add_mutually_exclusive_group()
    excl.add_argument("--local", action="store_true", help="this machine (the default)")
    excl.add_argument("--hosts", metavar="[USER@]HOST[:PORT],...", help="nodes to reach over SSH")
    excl.add_argument("--inventory", metavar="FILE", help="a cluster.yaml inventory")
    excl.add_argument(
        "--slurm-job",
        metavar="JOBID",
        help="the nodes of a running Slurm job, reached through srun --overlap",
    )
    group.add_argument(
        "--login",
        metavar="[USER@]HOST[:PORT]",
        help="run Slurm's commands on this login host over SSH (default: here)",
    )
    group.add_argument(
        "--slurm-mode",
        choices=("step", "node", "ssh"),
        default="step",
        help="one srun step for all nodes (default), one step per node, or plain SSH",
    )
    group.add_argument(
        "--group",
        action="append",
        metavar="NAME",
        help="only the inventory's nodes in this group (repeatable)",
    )
    group.add_argument(
        "--ssh-config",
        metavar="FILE",
        help="ssh config to honour instead of ~/.ssh/config (also $AREAL_CONSOLE_SSH_CONFIG)",
    )
    group.add_argument(
        "--connect-timeout",
        type=float,
        default=10.0,
        metavar="SECONDS",
        help="give up reaching a node after this long (default 10)",
    )
    group.add_argument(
        "--accept-new-hosts",
        action="store_true",
        help="trust and remember host keys not seen before (headless use)",
    )


def resolve_targets(args: argparse.Namespace) -> list[NodeSpec]:
    """The node specs the parsed target options name (default: this machine)."""
    slurm_job = getattr(args, "slurm_job", None)
    if getattr(args, "login", None) and not slurm_job:
        raise UsageError("--login goes with --slurm-job (it is where Slurm's commands run)")
    if slurm_job:
        plan = resolve_slurm_targets(
            str(slurm_job),
            login=getattr(args, "login", None),
            mode=getattr(args, "slurm_mode", "step"),
        )
        for note in plan.notes:
            print(f"note: {note}", file=sys.stderr)
        return plan.specs
    hosts = getattr(args, "hosts", None)
    inventory = getattr(args, "inventory", None)
    if hosts or inventory:
        if hosts:
            if getattr(args, "group", None):
                raise UserError("--group selects from an --inventory, not from --hosts")
            return inv.parse_hosts(hosts)
        return inv.load_inventory(str(inventory), groups=getattr(args, "group", None))
    return [local_node()]


def fleet_options(args: argparse.Namespace) -> dict[str, Any]:
    """Transport options from the parsed target options, for `Fleet(specs, **options)`."""
    options: dict[str, Any] = {
        "accept_new_hosts": bool(getattr(args, "accept_new_hosts", False)),
        "connect_timeout": float(getattr(args, "connect_timeout", None) or 10.0),
    }
    if getattr(args, "ssh_config", None):
        options["ssh_config"] = args.ssh_config
    return options
