"""The watch's evidence child process (commands/watch_evidence.py): the record it hands
back, and what is left when it fails or hangs (the folder, and `watch.json` saying why)."""

from __future__ import annotations

import json
from pathlib import Path

from areal_console.commands.watch_evidence import ChildEvidence
from areal_console.core.targets.specs import local_node
from areal_console.core.watch.evidence import EvidenceRequest
from areal_console.core.watch.files import private_root

FLEET = {"probe_gpus": False, "in_process": True}
REQUEST = EvidenceRequest(job="no-such-job", match="no-such-job-xyz", stall="a test stall")


def test_the_child_writes_the_folder_and_hands_back_its_record(tmp_path: Path) -> None:
    """No job matches: the capture is missing (and said so), the rest is written, and the
    record the child printed is the one the watch gets."""
    root = private_root(tmp_path / "ev")
    evidence = ChildEvidence([local_node()], FLEET)(REQUEST, root, 1_767_225_600.0)
    assert evidence.folder.parent == root and evidence.folder.name.endswith("-no-such-job")
    summary = json.loads((evidence.folder / "watch.json").read_text())
    assert summary["stall"] == "a test stall" and summary["folder"] == str(evidence.folder)
    assert "stacks.json" in evidence.missing and summary["missing"] == evidence.missing
    assert (evidence.folder / "servers.json").is_file()
    assert "evidence" not in evidence.missing


def test_a_child_that_fails_leaves_the_folder_saying_why(tmp_path: Path) -> None:
    root = private_root(tmp_path / "ev")
    child = ChildEvidence([local_node()], FLEET)
    child.module = "areal_console.commands.no_such_module"
    evidence = child(REQUEST, root, 1_767_225_600.0)
    why = evidence.missing["evidence"]
    assert why.startswith("evidence writer failed (exit 1): ") and "no_such_module" in why
    summary = json.loads((evidence.folder / "watch.json").read_text())
    assert summary["missing"] == {"evidence": why} and summary["report"] is None


def test_a_child_past_its_time_is_killed_and_the_folder_kept(tmp_path: Path) -> None:
    root = private_root(tmp_path / "ev")
    evidence = ChildEvidence([local_node()], FLEET, timeout=0.01)(REQUEST, root, 1_767_225_600.0)
    assert evidence.missing["evidence"] == "evidence writer killed after 0.01s"
    assert evidence.folder.is_dir() and (evidence.folder / "watch.json").is_file()
