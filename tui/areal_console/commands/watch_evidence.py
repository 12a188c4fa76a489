"""The watch's evidence, taken in a short-lived child process.

A watch runs for days; taking a stall's evidence (the 3-sample capture, the report and
its bundle) imports and builds far more than a look does. Done in the watch's own
process, that stays: its memory grew by about 10 MB at the first stall and never came
back (the report's modules, OpenSSL and NVML bindings pulled in by them, and the heap
the capture and report were built in). So the watch makes the stall's folder itself and
hands the rest to a child process (`python -m areal_console.commands.watch_evidence`)
that reaches the same nodes with its own connections, writes the same files as `watch`
always did, prints the evidence record as one JSON line and exits. A crash, a leak or a
hang there cannot take the watch down: the folder keeps what was written, and
`watch.json` says why the rest is missing.

The request (nodes, fleet options, the stall) goes to the child on its stdin, never on
its command line.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from dataclasses import asdict
from pathlib import Path
from typing import Any

from areal_node import launcher

from areal_console.core.targets.specs import NodeSpec, spec_from_json, spec_to_json
from areal_console.core.watch.evidence import (
    Evidence,
    EvidenceRequest,
    new_evidence_folder,
    unfinished_evidence,
)

# The child's whole life: a capture (3 samples, each bounded by the node timeout), the
# report's reads and the servers' state. Past this it is killed and the folder kept.
CHILD_TIMEOUT = 600.0
MODULE = "areal_console.commands.watch_evidence"


class ChildEvidence:
    """Takes a stall's evidence (`Watcher.take`) in a child process that reaches `specs`
    with `fleet_options` (what `Fleet(specs, **fleet_options)` takes)."""

    def __init__(
        self, specs: list[NodeSpec], fleet_options: dict[str, Any], timeout: float = CHILD_TIMEOUT
    ) -> None:
        self.specs = specs
        self.fleet_options = fleet_options
        self.timeout = timeout
        self.module = MODULE

    def __call__(self, request: EvidenceRequest, root: Path, at: float) -> Evidence:
        folder = new_evidence_folder(root, request.job, at)  # OSError: no folder, no child
        doc = {
            "specs": [spec_to_json(s) for s in self.specs],
            "fleet": self.fleet_options,
            "request": asdict(request),
            "folder": str(folder),
            "at": at,
        }
        try:
            proc = subprocess.Popen(
                launcher.user_module(sys.executable, self.module), stdin=subprocess.PIPE,
                stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                env=launcher.clean_env(_child_env()), start_new_session=True,
            )  # fmt: skip
        except OSError as exc:
            return unfinished_evidence(folder, request, at, f"evidence writer not started: {exc}")
        # Its own session, and it ignores SIGTERM/SIGINT: a stop meant for the watch does
        # not cut the evidence short (the watch stops once it is written, between looks).
        try:
            out, err = proc.communicate(json.dumps(doc).encode(), timeout=self.timeout)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.communicate()
            why = f"evidence writer killed after {self.timeout:g}s"
            return unfinished_evidence(folder, request, at, why)
        lines = out.decode(errors="replace").strip().splitlines()
        try:
            if proc.returncode != 0 or not lines:
                raise ValueError("no record")
            evidence = Evidence.from_json(json.loads(lines[-1]))
            if evidence.folder != folder:
                raise ValueError("another folder")
            return evidence
        except ValueError:
            said = [ln for ln in err.decode(errors="replace").splitlines() if ln.strip()]
            why = f"evidence writer failed (exit {proc.returncode})"
            return unfinished_evidence(folder, request, at, why + (f": {said[-1]}" if said else ""))


def _child_env() -> dict[str, str]:
    """This process's environment, with the folders this console and its agent are
    imported from first on the child's path (the same code, however it was started)."""
    import areal_node

    import areal_console

    dirs = [
        str(Path(m.__file__ or "").resolve().parent.parent) for m in (areal_console, areal_node)
    ]
    path = [*dict.fromkeys(dirs), *filter(None, os.environ.get("PYTHONPATH", "").split(os.pathsep))]
    return {**os.environ, "PYTHONPATH": os.pathsep.join(path)}


def servers_state(fleet: Any) -> dict[str, Any]:
    """The nodes' servers and GPUs, as `nodes --json` gives them (with the fleet's flags)."""
    from areal_console.commands.nodes import add_rollout_flags, with_session_facts

    results = fleet.call_all("sample", {"all": False}, timeout=30)
    nodes = [with_session_facts(s, results.get(s.name)) for s in fleet]
    rollout = add_rollout_flags(fleet, nodes)
    return {"nodes": nodes, "rollout": rollout}


def main() -> int:
    """The child: the request on stdin, the evidence written, its record on stdout.

    SIGTERM and SIGINT are ignored: `systemctl stop`, `scancel` and Ctrl-C signal every
    process of the watch, and the watch itself stops only once the evidence is written (as
    it always did); the watch's timeout, and the service manager's own, still bound it."""
    import signal

    for sig in (signal.SIGTERM, signal.SIGINT):
        signal.signal(sig, signal.SIG_IGN)
    from areal_console.core.connection.fleet import Fleet
    from areal_console.core.watch.evidence import fill_evidence

    doc = json.loads(sys.stdin.read())
    specs = [spec_from_json(s) for s in doc["specs"]]
    request = EvidenceRequest(**doc["request"])
    fleet = Fleet(specs, **doc["fleet"])
    try:
        evidence = fill_evidence(fleet, request, Path(doc["folder"]), float(doc["at"]),
                                 servers_state)  # fmt: skip
    finally:
        fleet.close()
    print(json.dumps(evidence.to_json()), flush=True)
    return 0


if __name__ == "__main__":
    try:
        sys.exit(main())
    except Exception as exc:  # one line for the watch's note; the folder keeps the rest
        print(f"{type(exc).__name__}: {exc}", file=sys.stderr)
        sys.exit(1)
