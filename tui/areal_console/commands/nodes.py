"""`areal-console nodes`: each node's GPUs and training processes."""

from __future__ import annotations

import argparse
import json
import sys
from typing import Any

from areal_console.core.errors import EXIT_OK, EXIT_PARTIAL, UserError
from areal_console.core.fleet import Fleet, NodeFailure
from areal_console.core.nodes import node_report
from areal_console.core.targets import add_target_arguments, resolve_targets
from areal_console.core.textfmt import format_bytes, render_table


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
        "--timeout", type=float, default=30.0, help="seconds to wait for each node (default 30)"
    )
    parser.set_defaults(handler=run)


def run(args: argparse.Namespace) -> int:
    specs = resolve_targets(args)
    fleet = Fleet(specs, accept_new_hosts=getattr(args, "accept_new_hosts", False))
    try:
        results = fleet.call_all("sample", {"all": bool(args.all)}, timeout=args.timeout)
    finally:
        fleet.close()
    nodes = [node_report(spec.name, spec.address, results.get(spec.name)) for spec in specs]
    if args.json:
        json.dump({"nodes": nodes}, sys.stdout, indent=2)
        sys.stdout.write("\n")
    else:
        sys.stdout.write(render_nodes(nodes))
    failed = [n for n in nodes if n["state"] != "up"]
    if failed and len(failed) == len(nodes) and len(nodes) == 1:
        raise UserError(f"{failed[0]['name']}: {failed[0]['error']}")
    if failed:
        for n in failed:
            print(f"error: {n['name']}: {n['error']}", file=sys.stderr)
        return EXIT_PARTIAL
    return EXIT_OK


def render_nodes(nodes: list[dict[str, Any]]) -> str:
    out: list[str] = []
    for node in nodes:
        out.append(f"== {node['name']} ({node['host']}): {node['state']}")
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
                    _opt(p["rank"]),
                    _opt(p["local_rank"]),
                    _opt(p["world_size"]),
                    p["role"] or "-",
                    str(p["pid"]),
                    _pct(p["cpu_percent"]),
                    format_bytes(p["rss"]),
                    ",".join(map(str, p["gpus"])) or "-",
                    _truncate(p["cmdline"], 60),
                ]
                for p in node["processes"]
            ]
            out.append(
                render_table(
                    ["RANK", "LOCAL", "WORLD", "ROLE", "PID", "CPU", "RSS", "GPUS", "COMMAND"], rows
                )
            )
        else:
            out.append("   no training processes (use --all for every Python process)")
        out.append("")
    return "\n".join(out)


def _pct(value: float | None) -> str:
    return "-" if value is None else f"{value:.0f}%"


def _opt(value: int | None) -> str:
    return "-" if value is None else str(value)


def _truncate(text: str, width: int) -> str:
    return text if len(text) <= width else text[: width - 1] + "…"


__all__ = ["NodeFailure", "register", "render_nodes", "run"]
