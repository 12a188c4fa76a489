"""The report's parts, masked, as files of one `.tar.gz`, bounded in size."""

from __future__ import annotations

import io
import json
import re
import tarfile
from collections.abc import Container
from typing import Any

from areal_console.core.common import private_files
from areal_console.core.common.textfmt import printable
from areal_console.core.report.model import BundleFile, Report, ReportInputs
from areal_console.core.report.redact import Redactor
from areal_console.core.report.sections import markdown

DEFAULT_MAX_MB = 4.0
# Parts kept whole to the last (cut last, in this order from the end).
KEEP = ("report.md", "MANIFEST.txt")


def _json(doc: Any) -> bytes:
    return (json.dumps(doc, indent=1, default=str) + "\n").encode()


MAX_NAME = 96


def _safe(name: str) -> str:
    """One path component from text a node or process chose: no `/`, NUL or control
    character, never `.` or `..`, at most `MAX_NAME` characters."""
    safe = re.sub(r"[^\w.@+-]+", "_", name).strip("_")[:MAX_NAME]
    return "_" if not safe.strip(".") else safe


def unique_member(name: str, taken: Container[str]) -> str:
    """`name`, or when a member already has it, the same name with `~N` before its
    extension (the first N from 2 that is free). `_safe` never leaves a `~`, so a suffixed
    name never meets a name taken from input; the first file keeps the plain name."""
    if name not in taken:
        return name
    folder, slash, leaf = name.rpartition("/")
    stem, dot, ext = leaf.rpartition(".")
    if not stem:  # no extension (or a leading dot only)
        stem, dot, ext = leaf, "", ""
    n = 2
    while True:
        suffix = f"~{n}{dot}{ext}"
        candidate = f"{folder}{slash}{stem[: max(1, MAX_NAME - len(suffix))]}{suffix}"
        if candidate not in taken:
            return candidate
        n += 1


def raw_parts(inputs: ReportInputs) -> dict[str, Any]:
    """The bundle's files before masking: name -> text or a JSON-like value."""
    parts: dict[str, Any] = {}
    if inputs.capture is not None:
        parts["stacks.json"] = inputs.capture
        if inputs.capture.get("ledger") is not None:
            parts["ledger.json"] = inputs.capture["ledger"]
    if inputs.metrics is not None:
        parts["metrics.json"] = inputs.metrics
    if inputs.processes:
        parts["processes.json"] = inputs.processes
    if inputs.versions:
        parts["versions.json"] = [
            {"node": v.node, "system": v.system, "gpus": v.gpus, "interpreters": v.interpreters}
            for v in inputs.versions
        ]
    if inputs.config_text is not None:
        parts["config.yaml"] = inputs.config_text
    for tail in inputs.logs:
        name = tail.path.rstrip("/").rsplit("/", 1)[-1]
        # `_main.log` and `main.log` (or two folders' `main.log`) are one safe name: each
        # log keeps a member of its own.
        member = unique_member(f"logs/{_safe('+'.join(tail.nodes))}/{_safe(name)}", parts)
        parts[member] = tail.text
    return parts


def build_report(
    inputs: ReportInputs, redactor: Redactor, max_bytes: int = int(DEFAULT_MAX_MB * 2**20)
) -> Report:
    """The masked markdown and bundle files, cut until the `.tar.gz` fits `max_bytes`."""
    parts = raw_parts(inputs)
    text = markdown(inputs)
    # Learn every secret from every part before masking any: a key named in the config
    # is masked in the logs too.
    redactor.learn(text)
    for value in parts.values():
        redactor.learn_data(value)
    # Text parts hold what processes and logs wrote: a control character is written as
    # its escape (`\x1b`), so `cat report.md` never retitles or clears a terminal (JSON
    # parts escape them already).
    masked_md = printable(redactor.text(text), layout=True)
    files: dict[str, bytes] = {}
    for name, value in parts.items():
        member = unique_member(redactor.text(name), files)  # masking may make two names one
        if isinstance(value, str):
            files[member] = printable(redactor.text(value), layout=True).encode()
        else:
            files[member] = _json(redactor.data(value))
    files["report.md"] = masked_md.encode()
    cut: list[str] = []
    files["MANIFEST.txt"] = _manifest(inputs, redactor, cut, max_bytes)
    while tar_size(files) > max_bytes:
        victim = _largest_cuttable(files)
        if victim is None:
            break
        data = files[victim]
        if victim.startswith("logs/") or victim.endswith((".yaml", ".txt")):
            half = data[len(data) // 2 :]
            newline = half.find(b"\n")
            kept = half[newline + 1 :] if 0 <= newline < len(half) - 1 else half
            if len(kept) < 1024:
                del files[victim]
                cut.append(f"{victim}: left out")
            else:
                files[victim] = kept
                cut.append(f"{victim}: only its last {len(kept)} bytes kept")
        else:
            del files[victim]
            cut.append(f"{victim}: left out ({len(data)} bytes)")
        files["MANIFEST.txt"] = _manifest(inputs, redactor, cut, max_bytes)
    return Report(
        markdown=masked_md,
        files=[BundleFile(name, data) for name, data in files.items()],
        missing=dict(inputs.missing),
        cut=_merge_cuts(cut),
        job=redactor.text(inputs.job or ""),
    )


def _merge_cuts(cut: list[str]) -> list[str]:
    """One line per file (the last said about it)."""
    last: dict[str, str] = {}
    for line in cut:
        last[line.split(":", 1)[0]] = line
    return list(last.values())


def _largest_cuttable(files: dict[str, bytes]) -> str | None:
    candidates = [n for n in files if n not in KEEP]
    return max(candidates, key=lambda n: len(files[n])) if candidates else None


def _manifest(inputs: ReportInputs, redactor: Redactor, cut: list[str], max_bytes: int) -> bytes:
    lines = [
        "areal-console bug report bundle",
        f"made at {inputs.made_at}; bound {max_bytes} bytes compressed",
        "secrets masked as *** (with the name they had); "
        + ("host names, IPs and user names anonymized" if redactor.anonymize else
           "host names, IPs and user names as they are"),
    ]  # fmt: skip
    if inputs.missing:
        lines += ["", "not collected:", *[f"  {k}: {v}" for k, v in inputs.missing.items()]]
    if cut:
        lines += ["", "cut to fit the bound:", *[f"  {c}" for c in _merge_cuts(cut)]]
    return printable(redactor.text("\n".join(lines) + "\n"), layout=True).encode()


def tar_bytes(files: dict[str, bytes] | list[BundleFile], top: str = "report") -> bytes:
    """A gzip'd tar of `files` under the directory `top`, with fixed times and owners."""
    items = files.items() if isinstance(files, dict) else [(f.name, f.data) for f in files]
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w:gz", compresslevel=6) as tar:
        for name, data in items:
            info = tarfile.TarInfo(f"{top}/{name}")
            info.size = len(data)
            info.mode = 0o644
            info.mtime = 0
            tar.addfile(info, io.BytesIO(data))
    return buf.getvalue()


def tar_size(files: dict[str, bytes]) -> int:
    return len(tar_bytes(files))


def write_bytes_atomic(path: str, data: bytes) -> None:
    """Write whole (`private_files.replace`) in the folder the user named, which must be
    one no other user can change; the files are the user's alone (0600)."""
    private_files.replace(path, data, private=False)


def bundle_path_for(markdown_path: str) -> str:
    """The bundle beside the markdown: `X.md` -> `X.tar.gz`."""
    stem = markdown_path[: -len(".md")] if markdown_path.endswith(".md") else markdown_path
    return stem + ".tar.gz"


def write_report(report: Report, markdown_path: str) -> tuple[str, int]:
    """The markdown and, beside it, the bundle; returns the bundle's path and size."""
    bundle = bundle_path_for(markdown_path)
    data = tar_bytes(report.files)  # as measured against the bound
    write_bytes_atomic(markdown_path, report.markdown.encode())
    write_bytes_atomic(bundle, data)
    return bundle, len(data)


def default_report_name(job: str | None, stamp: str) -> str:
    """`areal-report-<job>-<time>.md`: the name when none is given."""
    stem = re.sub(r"[^\w.-]+", "_", job or "job").strip("_") or "job"
    return f"areal-report-{stem}-{stamp}.md"
