"""What the console connects to: node specs from the command line or an inventory."""

from __future__ import annotations

import argparse
import math
import sys
from typing import Any

from areal_console.core.common.errors import UsageError, UserError
from areal_console.core.targets.options import TargetOptions

# The records live in specs.py (the resolvers import them from there); named here too.
from areal_console.core.targets.specs import NodeSpec as NodeSpec
from areal_console.core.targets.specs import SlurmTarget as SlurmTarget
from areal_console.core.targets.specs import local_node as local_node


def _number(text: str, kind: type, least: float, strict: bool, unit: str) -> Any:
    """`text` as a `kind` (int or float) >= `least` (> with `strict`), finite, for argparse."""
    try:
        value = kind(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not a {unit}") from None
    if not math.isfinite(value) or value < least or (strict and value == least):
        bound = f"{'>' if strict else '>='} {least:g}"
        raise argparse.ArgumentTypeError(f"{text!r}: must be a {unit} {bound}")
    return value


def seconds(text: str) -> float:
    """An argparse type: a number of seconds > 0 (not 0, not negative, not nan or inf)."""
    return float(_number(text, float, 0, True, "number of seconds"))


def seconds_or_zero(text: str) -> float:
    """An argparse type: a number of seconds >= 0."""
    return float(_number(text, float, 0, False, "number of seconds"))


def count(text: str) -> int:
    """An argparse type: a whole number >= 1."""
    return int(_number(text, int, 1, False, "whole number"))


def index(text: str) -> int:
    """An argparse type: a whole number >= 0."""
    return int(_number(text, int, 0, False, "whole number"))


def add_target_arguments(parser: argparse.ArgumentParser) -> None:
    """`--local | --hosts ... | --inventory FILE`, shared by every subcommand and the TUI."""
    group = parser.add_argument_group("targets")
    excl = group.add_mutually_exclusive_group()
    excl.add_argument("--local", action="store_true", help="this machine (the default)")
    excl.add_argument("--hosts", metavar="[USER@]HOST[:PORT],...", help="nodes to reach over SSH")
    excl.add_argument("--inventory", metavar="FILE", help="a cluster.yaml inventory")
    excl.add_argument(
        "--slurm-job",
        metavar="JOBID|NAME",
        help="the nodes of a running Slurm job (by id, or by name as squeue shows it), "
        "reached through srun --overlap",
    )
    excl.add_argument(
        "--areal",
        metavar="[USER/]EXPERIMENT/TRIAL",
        help="an AReaL job by its name: its workers' nodes, from AReaL's name-resolve records",
    )
    group.add_argument(
        "--name-resolve-root",
        metavar="DIR",
        help="--areal: the nfs record root (default /tmp/areal/name_resolve)",
    )
    group.add_argument(
        "--name-resolve-via",
        metavar="[USER@]HOST[:PORT]",
        help="--areal: read the nfs record root through this node's agent (over SSH), where "
        "it is not visible here",
    )
    group.add_argument(
        "--etcd3",
        metavar="HOST:PORT",
        help="--areal: read the records from etcd at this address (AReaL's etcd3_addr)",
    )
    group.add_argument(
        "--fileroot",
        metavar="DIR",
        help="--areal: the job's cluster.fileroot, for its log directory (default: read "
        "from the workers' command lines)",
    )
    group.add_argument(  # not exclusive: `--areal E/T --ray` reads the job from Ray's KV
        "--ray",
        nargs="?",
        const="auto",
        metavar="ADDRESS",
        help="the nodes of a Ray cluster, the agent as a Ray actor on each (default: "
        "$RAY_ADDRESS or the cluster started here; GCS host:port, ray://, or the dashboard URL)",
    )
    group.add_argument(
        "--ray-ssh",
        action="store_true",
        help="where Ray can't run the agent on a node, reach the node over SSH at its IP",
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
        type=seconds,
        default=None,
        metavar="SECONDS",
        help=(
            "give up reaching a node and starting its agent after this long "
            "(default 10; an srun step's start: 30)"
        ),
    )
    group.add_argument(
        "--slurm-timeout",
        type=seconds,
        default=None,
        metavar="SECONDS",
        help="give up on one of Slurm's commands (scontrol, squeue, srun probe) after this long "
        "(default 30)",
    )
    group.add_argument(
        "--node-timeout",
        type=seconds,
        default=None,
        metavar="SECONDS",
        help="a node that has not answered a fan-out (connect included) after this long is "
        "reported as failed and the rest go on without it (default 60)",
    )
    group.add_argument(
        "--fanout-concurrency",
        type=count,
        default=None,
        metavar="N",
        help="nodes worked on at once (default 64)",
    )
    group.add_argument(
        "--max-startups",
        type=count,
        default=None,
        metavar="N",
        help="SSH handshakes in flight at once through one jump host, or to one sshd "
        "(default 8, under sshd's MaxStartups 10:30:100)",
    )
    group.add_argument(
        "--fanout-tree",
        type=count,
        default=None,
        metavar="K",
        help="relay through a tree of agents (SSH nodes): connect to K nodes, whose agents "
        "start the others' over ssh from node to node, K each (default: off, every node "
        "connected directly)",
    )
    group.add_argument(
        "--tree-ssh-config",
        default=None,
        metavar="FILE",
        help="with --fanout-tree: an ssh config file on the nodes for the node-to-node hop "
        "(default: the user's own there)",
    )
    group.add_argument(
        "--accept-new-hosts",
        action="store_true",
        help="trust and remember host keys not seen before (headless use)",
    )


REMOTE_TARGETS = ("hosts", "inventory", "slurm_job", "areal", "ray")


def names_remote_nodes(options: TargetOptions) -> bool:
    """Whether the target options name nodes other than this machine."""
    return any(getattr(options, o) for o in REMOTE_TARGETS)


def resolve_targets(options: TargetOptions) -> list[NodeSpec]:
    """The node specs the parsed target options name (default: this machine)."""
    ray = options.ray
    if options.ray_ssh and ray is None:
        raise UsageError("--ray-ssh goes with --ray")
    others = [o for o in ("local", "hosts", "inventory", "slurm_job") if getattr(options, o)]
    if ray is not None and others:
        raise UsageError(f"--ray and --{others[0].replace('_', '-')} name two different targets")
    if ray is not None and not options.areal:
        from areal_console.core.ray.targets import resolve_ray_targets

        ray_plan = resolve_ray_targets(ray, ssh_fallback=bool(options.ray_ssh))
        for note in ray_plan.notes:
            print(f"note: {note}", file=sys.stderr)
        return ray_plan.specs
    slurm_job = options.slurm_job
    areal = options.areal
    if options.login and not (slurm_job or areal):
        raise UsageError("--login goes with --slurm-job or --areal (where Slurm's commands run)")
    for option in ("name_resolve_root", "name_resolve_via", "etcd3", "fileroot"):
        if getattr(options, option) and not areal:
            raise UsageError(f"--{option.replace('_', '-')} goes with --areal")
    if areal:
        return _areal_targets(options, str(areal))
    if slurm_job:
        from areal_console.core.slurm.client import SLURM_COMMAND_TIMEOUT
        from areal_console.core.slurm.targets import resolve_slurm_targets

        plan = resolve_slurm_targets(
            str(slurm_job),
            login=options.login,
            mode=options.slurm_mode,
            timeout=options.slurm_timeout or SLURM_COMMAND_TIMEOUT,
        )
        for note in plan.notes:
            print(f"note: {note}", file=sys.stderr)
        return plan.specs
    hosts = options.hosts
    inventory = options.inventory
    if hosts or inventory:
        from areal_console.core.targets import inventory as inv

        if hosts:
            if options.group:
                raise UsageError("--group selects from an --inventory, not from --hosts")
            try:
                return inv.parse_hosts(hosts)
            except UsageError:
                raise
            except UserError as exc:  # a bad value on the command line: exit 2
                raise UsageError(f"--hosts: {exc}") from None
        return inv.load_inventory(str(inventory), groups=options.group)
    return [local_node()]


def _areal_targets(options: TargetOptions, name: str) -> list[NodeSpec]:
    """`--areal`: the job's nodes; the plan stays on `options` (`areal_plan`) for the
    command's scoping and for the exit code (stale records make a run partial)."""
    from areal_console.core.slurm.client import SLURM_COMMAND_TIMEOUT
    from areal_console.core.targets.areal import resolve_areal_targets

    etcd3 = options.etcd3
    if etcd3 and options.name_resolve_root:
        raise UsageError("--name-resolve-root (nfs) and --etcd3 name two different backends")
    via_node = options.name_resolve_via
    if etcd3 and via_node:
        raise UsageError("--name-resolve-via reads nfs records; --etcd3 is read from here")
    registry = None
    ray = options.ray
    if ray is not None:
        if options.name_resolve_root or etcd3 or via_node:
            raise UsageError("--ray reads the job from AReaL's Ray KV actor: no other backend")
        from areal_console.core.ray.name_resolve import RayKvRegistry
        from areal_console.core.ray.nodes import parse_address

        registry = RayKvRegistry(parse_address(ray).for_ray)
    via = open_fleet(options, _one_host(via_node), probe_gpus=False) if via_node else None
    try:
        plan = resolve_areal_targets(
            name,
            nfs_root=options.name_resolve_root,
            etcd3=etcd3,
            login=options.login,
            mode=options.slurm_mode,
            slurm_timeout=options.slurm_timeout or SLURM_COMMAND_TIMEOUT,
            fileroot=options.fileroot,
            via=None if via is None else via.sessions[0],
            registry=registry,
        )
    finally:
        if via is not None:
            via.close()
    if ray is not None:
        _on_ray_nodes(plan, ray, bool(options.ray_ssh))
    for note in plan.notes:
        print(f"note: {note}", file=sys.stderr)
    for line in plan.warnings():
        print(f"warning: {line}", file=sys.stderr)
    options.areal_plan = plan
    return plan.specs


def _on_ray_nodes(plan: Any, ray: str, ssh_fallback: bool) -> None:
    """The job's nodes as the Ray cluster's: the agent actor on each node whose IP one of
    the job's records names."""
    from areal_console.core.ray.targets import resolve_ray_targets

    ray_plan = resolve_ray_targets(ray, ssh_fallback=ssh_fallback)
    hosts = {e.entry.host for e in plan.entries if e.entry.host}
    plan.specs = [s for s in ray_plan.specs if s.host in hosts]
    plan.notes += ray_plan.notes
    missing = sorted(hosts - {s.host for s in plan.specs})
    if missing:
        plan.notes.append(f"no alive Ray node at {', '.join(missing)} (named by the job's records)")


def _one_host(text: str) -> list[NodeSpec]:
    """`--name-resolve-via`: one SSH destination, `[USER@]HOST[:PORT]`."""
    from areal_console.core.targets import inventory as inv

    try:
        specs = inv.parse_hosts(text)
    except UserError as exc:
        raise UsageError(f"--name-resolve-via: {exc}") from None
    if len(specs) != 1:
        raise UsageError(f"--name-resolve-via names one node, got {len(specs)}")
    return specs


def areal_plan(options: TargetOptions) -> Any:
    """The `ArealPlan` `--areal` resolved to (None without `--areal`)."""
    return options.areal_plan


def fleet_options(options: TargetOptions) -> dict[str, Any]:
    """Transport options from the target options, for `Fleet(specs, **options)`."""
    return options.fleet_options()


def open_fleet(options: TargetOptions, specs: list[NodeSpec], **extra: Any) -> Any:
    """The `Fleet` for `specs` with the target options: every command that reaches
    nodes goes through here, so --ssh-config, --connect-timeout and --accept-new-hosts
    mean the same everywhere."""
    from areal_console.core.connection.fleet import Fleet

    return Fleet(specs, **{**options.fleet_options(), **extra})
