"""`areal-console nodes`: each node's GPUs and training processes."""

from __future__ import annotations

import argparse
import json
import shutil
import sys
import time
from collections.abc import Iterable
from typing import Any

from areal_console.commands.options import target_options
from areal_console.core.common.errors import EXIT_ERROR, EXIT_OK, EXIT_PARTIAL
from areal_console.core.common.identity import login_user
from areal_console.core.common.textfmt import format_bytes, rank_summary, render_table
from areal_console.core.connection.fleet import NodeFailure, NodeSession
from areal_console.core.connection.nodes import node_report, server_text
from areal_console.core.connection.records import ServerRow
from areal_console.core.rollout.context import (
    fleet_trainer_state,
    run_trainer,
    server_keys,
    versioned_servers,
)
from areal_console.core.rollout.jobs import fleet_runs
from areal_console.core.rollout.servers import add_fleet_flags
from areal_console.core.targets.areal_world import count_areal_world_sizes
from areal_console.core.targets.resolve import (
    add_target_arguments,
    areal_plan,
    count,
    open_fleet,
    resolve_targets,
    seconds,
)
from areal_console.core.targets.specs import NodeSpec


def register(subparsers: Any) -> None:
    parser = subparsers.add_parser(
        "nodes",
        help="list each node's GPUs and training processes",
        description="List each node's GPUs and training processes (ranks, launchers, servers).",
    )
    add_target_arguments(parser)
    parser.add_argument("--all", action="store_true", help="every Python process, not only ranks")
    parser.add_argument("--json", action="store_true", help="machine-readable output")
    parser.add_argument(
        "--timeout", type=seconds, default=30.0, help="seconds to wait for each node (default 30)"
    )
    parser.add_argument(
        "--samples",
        type=count,
        default=None,
        metavar="N",
        help="sample N times: each process's RSS series and memory_growth flag, ranks gone "
        "between samples, the servers' flags that need several polls",
    )
    parser.add_argument(
        "--interval",
        type=seconds,
        default=5.0,
        metavar="S",
        help="seconds between samples (--samples; default 5)",
    )
    parser.set_defaults(handler=run)


def run(args: argparse.Namespace) -> int:
    from areal_console.core.connection.sampling import SampleHistory

    specs = resolve_targets(target_options(args))
    fleet = open_fleet(target_options(args), specs)
    history = SampleHistory() if args.samples is not None else None
    gone: list[Any] = []
    try:
        for i in range(args.samples or 1):
            if i:
                time.sleep(args.interval)
            results = fleet.call_all("sample", {"all": bool(args.all)}, timeout=args.timeout)
            nodes = [with_session_facts(s, results.get(s.name)) for s in fleet]
            if history is not None:
                gone += history.add(nodes, time.time())
        add_ray_ids(specs, nodes)
        count_areal_world_sizes(n["processes"] for n in nodes)
        rollout = add_rollout_flags(fleet, nodes)
    finally:
        fleet.close()
    plan = areal_plan(target_options(args))
    doc: dict[str, Any] = {"nodes": nodes}
    if rollout is not None:
        doc["rollout"] = rollout
    if history is not None:
        history.annotate(nodes)
        doc["samples"] = {"count": history.samples, "interval": args.interval}
        doc["gone"] = [g.to_json() for g in gone]
        spread, idle = history.gpu_spread()
        doc["gpu_spread"] = {"ranks": [r.to_json() for r in spread],
                             "idle": [i.to_json() for i in idle]}  # fmt: skip
    if plan is not None:
        if not args.all:  # the job's processes only: its workers, wrappers, controller, servers
            for n in nodes:
                n["processes"] = [p for p in n["processes"] if p.get("job") == plan.job_key]
        doc["areal"] = plan.to_json()
    if args.json:
        json.dump(doc, sys.stdout, indent=2)
        sys.stdout.write("\n")
    else:
        sys.stdout.write(render_nodes(nodes, _terminal_width()))
        if history is not None:
            sys.stdout.write(render_sampled(nodes, gone, history.gpu_spread()[1]))
    code, lines = outcome(nodes)
    for line in lines:
        print(line, file=sys.stderr)
    return code


def outcome(nodes: list[dict[str, Any]]) -> tuple[int, list[str]]:
    """The exit code and the stderr lines: all nodes down is an error (1); some down is
    partial (3): the others' results stand, and the failures are warnings."""
    failed = [n for n in nodes if n["state"] != "up"]
    if not failed:
        return EXIT_OK, []
    every = len(failed) == len(nodes)
    kind = "error" if every else "warning"
    lines = [f"{kind}: {n['name']}: {n['error']}" for n in failed]
    return (EXIT_ERROR if every else EXIT_PARTIAL), lines


def add_rollout_flags(sessions: Iterable[NodeSession], nodes: list[dict[str, Any]]) -> Any:
    """The fleet's flags on each polled server, within its run (`version_skew`; with the
    run's trainer's version read from its files, `version_lag` and
    `paused_after_update`), and the `rollout` entry saying what they used (None: no
    polled server with a version). One run read: its trainer at the top level, as
    before; several: each in `runs` (docs/guide/cli-json.md)."""
    if not versioned_servers(nodes):
        up = [n for n in nodes if n.get("state") == "up"]
        add_fleet_flags(
            nodes,
            fleet_runs([(str(n["name"]), n.get("processes") or []) for n in up], login_user()),
        )
        return None
    state = fleet_trainer_state(sessions, nodes, login_user())
    trainers: dict[str, tuple[int | None, int | None]] = {}
    entries: list[dict[str, Any]] = []
    servers = set(server_keys(nodes))
    for log_dir, summary in state.read.items():
        head = summary.config.get("rollout.max_head_offpolicyness") or {}
        trainers[log_dir] = run_trainer(summary)
        run = state.runs.runs[log_dir]
        entries.append(
            {
                "run": run.label,
                "log_dir": log_dir,
                "user": run.owner,
                "trainer_version": None
                if summary.trainer is None
                else {"version": summary.trainer.version, "evidence": summary.trainer.evidence},
                "max_head_offpolicyness": head or None,
                "notes": summary.notes,
                "servers": sorted(
                    k for k, d in state.runs.of.items() if d == log_dir and k in servers
                ),
            }
        )
    add_fleet_flags(nodes, state.runs, trainers)
    one: dict[str, Any] = entries[0] if len(entries) == 1 else {}
    return {
        "trainer_version": one.get("trainer_version"),
        "max_head_offpolicyness": one.get("max_head_offpolicyness"),
        "notes": [*one.get("notes", []), *state.notes],
        "runs": entries,
        "skipped": state.skipped,
    }


def with_session_facts(session: NodeSession, result: Any) -> dict[str, Any]:
    """The documented node entry (docs/guide/cli-json.md), plus what the session learned: host
    name, Python, tools, latency, and the host key waiting for a decision when that is
    why it failed."""
    record = node_report(session.name, session.spec.address, result)
    sampled = result.get("hostname") if isinstance(result, dict) else None
    record["hostname"] = sampled or session.hello.get("hostname")
    record["via"] = session.via
    parent = session.relay_parent
    record["relay"] = parent.name if parent is not None else None
    record["python"] = session.hello.get("python")
    record["python_executable"] = session.hello.get("python_executable")
    record["tools"] = session.hello.get("tools")
    record["latency_ms"] = round(session.latency * 1000, 2) if session.latency is not None else None
    key = session.unknown_host_key
    if isinstance(result, NodeFailure) and key is not None:
        record["host_key"] = {
            "host": key.host,
            "type": key.key_type,
            "fingerprint": key.fingerprint,
        }
    return record


def add_ray_ids(specs: list[NodeSpec], nodes: list[dict[str, Any]]) -> None:
    """`processes[].ray` on Ray nodes: the actor and task each process is (else null)."""
    targets = {s.name: s.ray for s in specs if s.ray is not None}
    if not targets:
        return
    from areal_console.core.ray.nodes import auth_token, dashboard_of
    from areal_console.core.ray.ranks import ray_process_ids, ray_train_ranks

    address = next(iter(targets.values())).address
    ids = ray_process_ids(address, [t.node_id for t in targets.values()])
    train = None
    for node in nodes:
        target = targets.get(node["name"])
        by_pid = ids.get(target.node_id, {}) if target is not None else {}
        for p in node["processes"]:
            p["ray"] = by_pid.get(p["pid"])
            if target is None or p["rank"] is not None or p.get("role") != "ray_train":
                continue
            if train is None:  # asked once, and only when a Train worker has no rank
                train = ray_train_ranks(dashboard_of(address), auth_token())
            found = train.get((target.node_id, p["pid"]))
            if found is not None:
                p.update(rank=found.rank, local_rank=found.local_rank,
                         world_size=found.world_size)  # fmt: skip
                p["ray"] = {**(p["ray"] or {}), "train_run": found.run}


def render_summary(nodes: list[dict[str, Any]]) -> str:
    """One line per node: state, how it was reached, latency, GPUs, ranks (shown when there
    are several nodes)."""
    rows = []
    for n in nodes:
        up = n["state"] == "up"
        ranks = [p["rank"] for p in n["processes"] if p.get("rank") is not None]
        rows.append([
            n["name"], n["state"], n["host"], _via_cell(n),
            f"{n['latency_ms']:.1f}ms" if up and n.get("latency_ms") is not None else "-",
            str(len(n["gpus"])) if up else "-",
            rank_summary(ranks) or "-",
            str(len(n["processes"])) if up else "-",
            n["error"] or n["gpu_error"] or "",
        ])  # fmt: skip
    return render_table(
        ["NODE", "STATE", "HOST", "VIA", "LATENCY", "GPUS", "RANKS", "PROCS", "NOTE"],
        rows,
        indent="",
    )


def _via_cell(node: dict[str, Any]) -> str:
    """How the agent was reached; a relayed node also names its relay (`ssh from node1`:
    node1's agent started it over ssh, `--fanout-tree`)."""
    via = node.get("via") or "-"
    return f"{via} from {node['relay']}" if node.get("relay") else via


def render_nodes(nodes: list[dict[str, Any]], width: int | None = None) -> str:
    """The text report; process lines are cut to `width` (a terminal's columns) at the end
    of their command, and left whole when there is no width (output to a file or a pipe)."""
    out: list[str] = [render_summary(nodes), ""] if len(nodes) > 1 else []
    for node in nodes:
        header = f"== {node['name']} ({node['host']}): {node['state']}"
        if node.get("via"):  # how the agent was reached: ssh, local, slurm, ray
            header += f" via {_via_cell(node)}"
        if node.get("python"):  # the interpreter the node chose for the agent
            header += f", python {node['python']} ({node.get('python_executable') or '?'})"
        out.append(header)
        if node["state"] != "up":
            out.append(f"   {node['error']}")
            out.append("")
            continue
        if node["gpus"]:
            rows = [
                [
                    str(g["index"]),
                    g["name"] or "?",
                    _pct(g["util"]),
                    f"{format_bytes(g['mem_used'])}/{format_bytes(g['mem_total'])}",
                    f"{g['temp']}C" if g["temp"] is not None else "-",
                    f"{g['power']}W" if g["power"] is not None else "-",
                ]
                for g in node["gpus"]
            ]
            out.append(render_table(["GPU", "NAME", "UTIL", "MEMORY", "TEMP", "POWER"], rows))
        else:
            out.append(f"   GPUs: none shown ({node['gpu_error'] or 'no devices'})")
        if node["processes"]:
            rows = [
                [
                    "?" if p["rank"] is None and p["role"] == "ray_train" else _opt(p["rank"]),
                    _opt(p["local_rank"]),
                    _opt(p["world_size"]),
                    p["role"] or "-",
                    str(p["pid"]),
                    _pct(p["cpu_percent"]),
                    format_bytes(p["rss"]),
                    ",".join(map(str, p["gpus"])) or "-",
                    _command(p),
                ]
                for p in node["processes"]
            ]
            table = render_table(
                ["RANK", "LOCAL", "WORLD", "ROLE", "PID", "CPU", "RSS", "GPUS", "COMMAND"], rows
            )
            out.extend(_clip(line, width) for line in table.splitlines())
        else:
            out.append("   no training processes (use --all for every Python process)")
        out.append("")
    return "\n".join(out)


def render_sampled(nodes: list[dict[str, Any]], gone: list[Any], idle: list[Any]) -> str:
    """After `--samples`: each process's RSS over the samples, its flags, the ranks gone,
    the ranks whose GPUs idle while the others' are busy."""
    from areal_console.core.metrics.report import sparkline

    out = []
    for node in nodes:
        for p in node["processes"]:
            series = [r for _, r in p.get("rss_series") or []]
            if len(series) > 1:
                out.append(f"{node['name']} pid {p['pid']}: RSS {sparkline(series, 40)} "
                           f"{format_bytes(series[0])} -> {format_bytes(series[-1])}")  # fmt: skip
            for flag in p.get("flags") or []:
                out.append(f"  {flag['kind']}: {flag['evidence']}\n    -> {flag['remedy']}")
    for g in gone:
        out.append(f"gone: {g.describe()}")
    for i in idle:
        out.append(f"GPU idle: {i.describe()}")
    return "\n".join(out) + "\n" if out else ""


def _command(p: dict[str, Any]) -> str:
    """The command line, led by a server's address and health or a worker's job."""
    lead = server_text(ServerRow.from_agent(p.get("server"))) or (p.get("job") or "")
    return f"[{lead}] {p['cmdline']}" if lead else str(p["cmdline"])


def _pct(value: float | None) -> str:
    return "-" if value is None else f"{value:.0f}%"


def _opt(value: int | None) -> str:
    return "-" if value is None else str(value)


def _terminal_width() -> int | None:
    """The terminal's columns when stdout is one; None for a file or a pipe (no cutting)."""
    if not sys.stdout.isatty():
        return None
    return shutil.get_terminal_size().columns


def _clip(line: str, width: int | None) -> str:
    return line if width is None or len(line) <= width else line[: max(width - 1, 1)] + "…"


__all__ = ["NodeFailure", "register", "render_nodes", "run"]
