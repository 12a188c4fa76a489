"""What a stall leaves behind: one new private folder with the stack capture (3 samples,
also saved to the captures store tagged `watch`), the collective ledger, the servers'
state, and a report in AReaL's issue template with its bundle (as `report` writes them).

Each part that cannot be had is named in `watch.json` with why; taking evidence never
raises for a part that failed. Folders beyond `keep` are removed, oldest first.
"""

from __future__ import annotations

import json
import re
import shutil
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from areal_console.core.connection.fleet import Fleet
from areal_console.core.watch.files import check_private_dir, new_private_dir, write_private

EVIDENCE_SAMPLES = 3
SAMPLE_INTERVAL = 1.0  # seconds between the evidence capture's samples (as `stacks`)
TAG = "watch"
FOLDER = re.compile(r"^\d{8}-\d{6}-")
REPORT_NAME = "report.md"
STATE_FILE = ".watch-state-{key}.json"


def folder_name(job: str | None, at: float) -> str:
    """`YYYYmmdd-HHMMSS-<job>`: sorts by time; the job's key made one safe component."""
    stem = re.sub(r"[^\w.@+-]+", "_", job or "job").strip("._")[:64] or "job"
    return time.strftime("%Y%m%d-%H%M%S", time.gmtime(at)) + "-" + stem


@dataclass
class EvidenceRequest:
    job: str | None
    """The job's key (its processes: see stacks/scope.py)."""
    match: str | None = None
    slurm_job: str | None = None
    log_path: str | None = None
    """The run's log directory or file (None: from the job's command lines, as `report`)."""
    log_node: str | None = None
    stall: str = ""
    """Why it is a stall, in words."""


@dataclass
class Evidence:
    folder: Path
    report: Path | None = None
    capture_id: str | None = None
    capture_path: str | None = None
    missing: dict[str, str] = field(default_factory=dict)

    def to_json(self) -> dict[str, Any]:
        return {
            "folder": str(self.folder),
            "report": str(self.report) if self.report else None,
            "capture_id": self.capture_id,
            "capture_path": self.capture_path,
            "missing": self.missing,
        }

    @classmethod
    def from_json(cls, doc: Any) -> Evidence:
        """The record `to_json` wrote (ValueError when `doc` is not one)."""
        if not isinstance(doc, dict) or not isinstance(doc.get("folder"), str):
            raise ValueError("not an evidence record")
        missing = doc.get("missing") or {}
        if not isinstance(missing, dict):
            raise ValueError("not an evidence record")
        report, capture_id, capture_path = (_opt_str(doc.get(k)) for k in
                                            ("report", "capture_id", "capture_path"))  # fmt: skip
        return cls(Path(doc["folder"]), Path(report) if report else None, capture_id,
                   capture_path, {str(k): str(v) for k, v in missing.items()})  # fmt: skip


def _opt_str(value: Any) -> str | None:
    return value if isinstance(value, str) else None


ServersState = Callable[[Fleet], dict[str, Any]]


def take_evidence(
    fleet: Fleet,
    request: EvidenceRequest,
    root: Path,
    at: float,
    servers_state: ServersState | None = None,
) -> Evidence:
    """Everything a person would have captured at this stall, into a new folder in `root`."""
    return fill_evidence(fleet, request, new_evidence_folder(root, request.job, at), at,
                         servers_state)  # fmt: skip


def new_evidence_folder(root: Path, job: str | None, at: float) -> Path:
    """The stall's new, empty 0700 folder in `root` (OSError when none can be made)."""
    return _new_folder(root, folder_name(job, at))


def fill_evidence(
    fleet: Fleet,
    request: EvidenceRequest,
    folder: Path,
    at: float,
    servers_state: ServersState | None = None,
) -> Evidence:
    """The stall's evidence, written into `folder` (new and empty, see `new_evidence_folder`)."""
    evidence = Evidence(folder)

    def save(name: str, data: bytes) -> None:
        try:
            write_private(folder, name, data)
        except OSError as exc:
            evidence.missing[name] = f"not written: {exc}"

    doc = _capture(fleet, request, evidence, save)
    if servers_state is not None:
        try:
            save("servers.json", _json(servers_state(fleet)))
        except Exception as exc:  # a node gone meanwhile: the rest of the evidence stays
            evidence.missing["servers.json"] = f"servers not read: {exc}"
    _report(fleet, request, doc, evidence, save)
    if doc is not None and evidence.capture_id:
        _link_capture(doc, evidence)
    _save_summary(request, at, evidence, save)
    return evidence


def unfinished_evidence(folder: Path, request: EvidenceRequest, at: float, why: str) -> Evidence:
    """The record of evidence whose writing failed part-way (`why`): what is in `folder`
    stays, and `watch.json` says what is missing (written here unless the writer got to it)."""
    evidence = Evidence(folder, missing={"evidence": why})
    if (folder / REPORT_NAME).is_file():
        evidence.report = folder / REPORT_NAME

    def save(name: str, data: bytes) -> None:
        try:
            write_private(folder, name, data)
        except OSError as exc:
            evidence.missing[name] = f"not written: {exc}"

    if not (folder / "watch.json").exists():
        _save_summary(request, at, evidence, save)
    return evidence


def _save_summary(
    request: EvidenceRequest, at: float, evidence: Evidence, save: Callable[[str, bytes], None]
) -> None:
    save("watch.json", _json({"job": request.job, "stall": request.stall,
                              "at": _iso(at), **evidence.to_json()}))  # fmt: skip


def _capture(
    fleet: Fleet, request: EvidenceRequest, evidence: Evidence, save: Callable[[str, bytes], None]
) -> dict[str, Any] | None:
    from areal_console.core.stacks.capture import CaptureOptions, capture_and_analyse

    options = CaptureOptions(
        samples=EVIDENCE_SAMPLES,
        interval=SAMPLE_INTERVAL,
        job=request.job,
        match=request.match,
        slurm_job=request.slurm_job,
        tags=(TAG,),
    )
    try:
        result = capture_and_analyse(fleet, options)
    except Exception as exc:  # the job left between the stall and the capture, a node dropped
        evidence.missing["stacks.json"] = f"no capture: {exc}"
        return None
    capture = result.capture
    if capture.save_error:
        evidence.missing["captures store"] = capture.save_error
    else:
        evidence.capture_id = capture.capture_id
        from areal_console.core.common import locations

        evidence.capture_path = str(locations.captures_dir() / f"{capture.capture_id}.json")
    doc = result.json()
    save("stacks.json", _json(doc))
    save("stacks.txt", result.text().encode())
    ledger = doc.get("ledger")
    save("ledger.json", _json(ledger if ledger is not None else
                              {"error": "the capture read no Flight Recorder trace"}))  # fmt: skip
    return doc


def _report(
    fleet: Fleet,
    request: EvidenceRequest,
    doc: dict[str, Any] | None,
    evidence: Evidence,
    save: Callable[[str, bytes], None],
) -> None:
    from areal_console.core.report.bundle import build_report, bundle_path_for, tar_bytes
    from areal_console.core.report.collect import ReportRequest, collect
    from areal_console.core.report.redact import Redactor

    note = f"stacks captured by `areal-console watch` at the stall (capture {evidence.capture_id})"
    req = ReportRequest(job=request.job, capture=doc, capture_note=note if doc else "",
                        log_path=request.log_path, log_node=request.log_node)  # fmt: skip
    try:
        inputs = collect(fleet, req, None)
        report = build_report(inputs, Redactor())
    except Exception as exc:  # collect names failed parts; this is what it could not
        evidence.missing[REPORT_NAME] = f"no report: {exc}"
        return
    bundle = Path(bundle_path_for(REPORT_NAME)).name
    save(REPORT_NAME, report.markdown.encode())
    save(bundle, tar_bytes(report.files))
    if REPORT_NAME not in evidence.missing:
        evidence.report = evidence.folder / REPORT_NAME
    for part, why in report.missing.items():
        evidence.missing.setdefault(f"report: {part}", why)


def _link_capture(doc: dict[str, Any], evidence: Evidence) -> None:
    """The saved capture names its evidence folder and report (the palette and `stacks
    --list --json` show them): the store's file is written again, atomically, with them."""
    from areal_console.core.stacks.store import write_atomic

    doc["watch"] = {"evidence": str(evidence.folder),
                    "report": str(evidence.report) if evidence.report else None}  # fmt: skip
    try:
        assert evidence.capture_path is not None
        write_atomic(Path(evidence.capture_path), json.dumps(doc, separators=(",", ":")))
    except OSError as exc:
        evidence.missing["captures store"] = f"the capture does not name its report: {exc}"


def _new_folder(root: Path, name: str) -> Path:
    for n in range(100):
        try:
            return new_private_dir(root, name if n == 0 else f"{name}-{n}")
        except FileExistsError:
            continue
    raise FileExistsError(f"{root / name}: taken")


def evidence_folders(root: Path) -> list[Path]:
    """The evidence folders in `root`, oldest first (real folders of this user only)."""
    out = []
    try:
        entries = list(root.iterdir())
    except OSError:
        return []
    for path in entries:
        if not FOLDER.match(path.name):
            continue
        try:
            check_private_dir(path)
        except OSError:
            continue
        out.append(path)
    return sorted(out, key=lambda p: p.name)


def prune(root: Path, keep: int) -> list[Path]:
    """Remove the oldest evidence folders beyond `keep`; returns them."""
    folders = evidence_folders(root)
    removed = folders[: max(0, len(folders) - keep)]
    for path in removed:
        shutil.rmtree(path, ignore_errors=True)  # never follows the links inside
    return removed


def _json(doc: Any) -> bytes:
    return (json.dumps(doc, indent=1, default=str) + "\n").encode()


def _iso(at: float) -> str:
    return time.strftime("%Y-%m-%dT%H:%M:%S+00:00", time.gmtime(at))
