"""What we read, as a contract on the source (an AST scan, like the import contracts):
a file another user controls (a job's log, trace, record or config; anything under /tmp or
another shared folder, which are hostile by default) is opened only through a guarded
reader: no link followed, never blocking (a FIFO is an error at once), a regular file
only, owned by a user the caller trusts, read to a bound.

- Console side: `core/common/guarded_read.py` (`open_guarded`, `read_guarded`), which
  opens through the node's.
- Node side: `agents/areal_node/guarded_read.py` (`open_regular`), behind the agent's log
  reads (`file_tail`, `file_read`, `log_find`), the Flight Recorder's dump reader, AReaL's
  nfs name-resolve records and the version reader; each adds its owner rule by the
  `owners` it passes. `test_node_read_contract.py` holds the node package to it call by
  call.

Every other module that calls `open`, `os.open`, `read_text` or `read_bytes` is listed in
OWN_FILES with what it reads: files the console or agent made, the user's own
configuration, a path the user named on the command line, or /proc. A new call in an
unlisted module fails here until it goes through the guarded reader or is listed."""

from __future__ import annotations

import ast
import os
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
PACKAGES = ((ROOT / "tui", "areal_console/core"), (ROOT / "agents", "areal_node"))
OPENERS = {"open", "read_text", "read_bytes"}

GUARDED = {
    "areal_node/guarded_read.py": "the guarded reader (open_regular), also the console's",
}
OWN_FILES = {
    "areal_console/core/common/safe_yaml.py": "inventory and settings files the user names",
    "areal_console/core/common/settings.py": "the console's settings file",
    "areal_console/core/connection/payload.py": "the node package's own files",
    "areal_console/core/connection/ssh.py": "the user's ssh_config and known_hosts",
    "areal_console/core/metrics/follow.py": "its own mirror files in a fresh temp folder",
    "areal_console/core/ray/nodes.py": "the user's Ray token file",
    "areal_console/core/replay/demo.py": "the demo's own folder and log",
    "areal_console/core/replay/runs.py": "run records in the console's data folder",
    "areal_console/core/report/bundle.py": "the bundle it writes",
    "areal_console/core/slurm/runs.py": "srun logs in the console's data folder",
    "areal_console/core/stacks/pyspy_text.py": "a file the user names (stacks --import)",
    "areal_console/core/stacks/store.py": "captures in the console's data folder",
    "areal_console/core/targets/inventory.py": "the inventory the user names",
    "areal_node/agent/jobs.py": "the agent's own run folders and records",
    "areal_node/agent/procfs.py": "/proc",
    "areal_node/agent/relay.py": "the payload zip the agent itself runs from",
    "areal_node/batches/analysis.py": "a dump the user names (batch PATH)",
    "areal_node/batches/eos.py": "a dump's tokenizer files the user names",
    "areal_node/batches/loader.py": "a dump the user names (batch PATH)",
    "areal_node/batches/summary.py": "a dump the user names (batch PATH)",
    "areal_node/fr_hook/sitecustomize.py": "runs inside a rank, as the rank's user",
    "areal_node/ray_host.py": "the file it creates (O_EXCL)",
    "areal_node/server_poll.py": "/proc/PID/net tables",
    "areal_console/core/watch/loop.py": "its own state file in the evidence folder",
    "areal_node/agent/nccl_ras.py": "/proc/PID/maps",
    "areal_node/private_files.py": "the files it creates (O_EXCL) or appends to (ours only)",
    "areal_node/versions.py": "/proc/PID (environ, cmdline, status); files via open_regular",
    "areal_node/trainer/areal_log.py": "the reference trainer's own log",
    "areal_node/trainer/config.py": "the trainer's config the user names",
    "areal_node/trainer/layout.py": "the trainer's own output folder",
    "areal_node/trainer/run.py": "the trainer's own output folder",
}


def opening_modules(paths: list[tuple[str, Path]]) -> set[str]:
    """The modules (by path under their package's root) that call an opener."""
    found = set()
    for name, path in paths:
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.Call):
                func = node.func
                called = func.attr if isinstance(func, ast.Attribute) else getattr(func, "id", None)
                if called in OPENERS:
                    found.add(name)
    return found


def package_files() -> list[tuple[str, Path]]:
    return [
        (str(path.relative_to(top)), path)
        for top, package in PACKAGES
        for path in (top / package).rglob("*.py")
    ]


def test_every_module_that_opens_files_is_guarded_or_reads_its_own() -> None:
    unlisted = sorted(opening_modules(package_files()) - set(GUARDED) - set(OWN_FILES))
    assert not unlisted, f"open through the guarded reader, or list with a reason: {unlisted}"


def test_the_lists_name_modules_that_open_files() -> None:
    assert sorted(set(GUARDED) | set(OWN_FILES)) == sorted(opening_modules(package_files()))


def test_the_scan_sees_every_way_to_open(tmp_path: Path) -> None:
    module = tmp_path / "reader.py"
    module.write_text("open(p)\nos.open(p, 0)\nPath(p).read_text()\nq.read_bytes()\n")
    assert opening_modules([("reader.py", module)]) == {"reader.py"}
    module.write_text("open_guarded(p)\nread_guarded(p, 1)\n")
    assert opening_modules([("reader.py", module)]) == set()


def test_a_tensorboard_fifo_or_link_is_refused_at_once(tmp_path: Path) -> None:
    """The console's readers of a job's local files go through it: a FIFO planted as an
    event file, or a link, is an error without blocking."""
    from areal_console.core.metrics.tfrecord import RecordFile
    from areal_console.core.rollout.perf_trace import read_tail

    fifo = tmp_path / "events.out.tfevents.1.host"
    os.mkfifo(fifo)
    link = tmp_path / "traces-r0.jsonl"
    link.symlink_to("/etc/passwd")
    with pytest.raises(OSError):
        list(RecordFile(str(fifo)).records())
    with pytest.raises(OSError):
        read_tail(fifo)
    with pytest.raises(OSError):
        read_tail(link)
