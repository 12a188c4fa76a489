"""`areal-console nodes`: every target node's GPUs and training processes, in parallel.

Nodes that cannot be reached are listed with the reason; the rest are still shown, and
the exit code is 3 (partial) when some failed, 1 when none answered.
"""

from __future__ import annotations

import argparse
import json
import sys
from typing import Any

from areal_console.core.errors import EXIT_ERROR, EXIT_OK, EXIT_PARTIAL
from areal_console.core.fleet import Fleet, NodeFailure, NodeSession
from areal_console.core.targets import add_target_arguments, fleet_options, resolve_targets


def register(subparsers: Any) -> None:
    parser = subparsers.add_parser(
        "nodes",
        help="list nodes, GPUs and ranks",
        description="Connect to every target node in parallel and list GPUs and ranks.",
    )
    add_target_arguments(parser)
    parser.add_argument("--all", action="store_true", help="every Python process, not only ranks")
    parser.add_argument("--json", action="store_true", help="machine-readable output")
    parser.add_argument(
        "--timeout", type=float, default=30.0, metavar="SECONDS", help="per-node request timeout"
    )
    parser.set_defaults(handler=run)


_PROCESS_FIELDS = (
    "pid",
    "ppid",
    "cmdline",
    "rank",
    "local_rank",
    "world_size",
    "role",
    "cpu_percent",
    "rss",
    "state",
    "gpus",
    "gpu_memory",
)


def node_record(session: NodeSession, result: Any) -> dict[str, Any]:
    """One node's entry of `nodes --json`."""
    record: dict[str, Any] = {
        "name": session.name,
        "host": session.spec.host or "local",
        "state": "up",
        "error": None,
        "gpus": [],
        "gpu_error": None,
        "processes": [],
        "hostname": session.hello.get("hostname"),
        "python": session.hello.get("python"),
        "tools": session.hello.get("tools"),
        "latency_ms": round(session.latency * 1000, 2) if session.latency is not None else None,
    }
    if isinstance(result, NodeFailure):
        record.update(state="down", error=result.error)
        key = session.unknown_host_key
        if key is not None:
            record["host_key"] = {
                "host": key.host,
                "type": key.key_type,
                "fingerprint": key.fingerprint,
            }
        return record
    record["gpus"] = result.get("gpus", [])
    record["gpu_error"] = result.get("gpu_error")
    record["hostname"] = result.get("hostname", record["hostname"])
    record["processes"] = [
        {k: p.get(k) for k in _PROCESS_FIELDS} for p in result.get("processes", [])
    ]
    return record


def _ranks_text(processes: list[dict[str, Any]]) -> str:
    ranks = sorted(p["rank"] for p in processes if p.get("rank") is not None)
    return ",".join(str(r) for r in ranks) or "-"


def render_table(records: list[dict[str, Any]]) -> str:
    """A plain-text table (no colours: this output is often piped)."""
    rows = [("NODE", "STATE", "HOST", "LATENCY", "GPUS", "RANKS", "PROCS", "NOTE")]
    for r in records:
        up = r["state"] == "up"
        latency = f"{r['latency_ms']:.1f}ms" if up and r["latency_ms"] is not None else "-"
        note = r["error"] or r["gpu_error"] or ""
        rows.append(
            (
                r["name"],
                r["state"],
                str(r["hostname"] or r["host"]) if up else str(r["host"]),
                latency,
                str(len(r["gpus"])) if up else "-",
                _ranks_text(r["processes"]) if up else "-",
                str(len(r["processes"])) if up else "-",
                note,
            )
        )
    widths = [max(len(row[i]) for row in rows) for i in range(len(rows[0]) - 1)]
    lines = []
    for row in rows:
        cells = [cell.ljust(w) for cell, w in zip(row[:-1], widths, strict=True)]
        lines.append("  ".join([*cells, row[-1]]).rstrip())
    return "\n".join(lines)


def run(args: argparse.Namespace) -> int:
    specs = resolve_targets(args)
    fleet = Fleet(specs, **fleet_options(args))
    try:
        results = fleet.call_all("sample", {"all": bool(args.all)}, timeout=args.timeout)
        records = [node_record(s, results[s.name]) for s in fleet]
    finally:
        fleet.close()
    if args.json:
        json.dump({"nodes": records}, sys.stdout, indent=2)
        sys.stdout.write("\n")
    else:
        print(render_table(records))
    failed = [r for r in records if r["state"] != "up"]
    if not failed:
        return EXIT_OK
    for r in failed:
        print(f"error: {r['name']}: {r['error']}", file=sys.stderr)
    return EXIT_ERROR if len(failed) == len(records) else EXIT_PARTIAL
