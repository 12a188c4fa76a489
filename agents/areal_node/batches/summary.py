"""Summaries of a dump file, a dump directory or a text rollout dump (`batch --json`)."""

from __future__ import annotations

import json
import os
from typing import Any

from areal_node.batches.analysis import (
    TOKEN_BUDGET,
    analyze_groups,
    groups_of,
    merge_meta,
    value_meta,
)
from areal_node.batches.eos import find_eos_token_ids
from areal_node.batches.loader import (
    DICT_BATCH,
    TEXT_ROLLOUT,
    TRAJECTORY,
    TRAJECTORY_DIR,
    TRAJECTORY_REFS,
    BatchError,
    RTensorRef,
    ShardRef,
    cached,
    detect_format,
    file_key,
    is_tensorish,
    load_pt,
)
from areal_node.batches.stats import batch_stats, batch_warnings, histogram, length_trend_warnings
from areal_node.constants import DUMP_FILE

# A directory summary analyzes this many of the newest steps (each with all its dp ranks).
MAX_DIR_STEPS = 32


def parse_step_name(name: str) -> tuple[int, int | None] | None:
    """(step, dp_rank) from `step_000003.pt` / `step_000003_dp_1.pt`, else None."""
    m = DUMP_FILE.match(name)
    if not m:
        return None
    return int(m.group(1)), (int(m.group(2)) if m.group(2) is not None else None)


def list_dump_dir(path: str) -> list[dict[str, Any]]:
    """The step files of a dump directory, sorted by (step, dp_rank); reads no file."""
    entries = []
    with os.scandir(path) as it:
        for e in it:
            parsed = parse_step_name(e.name)
            if parsed is None or not e.is_file():
                continue
            entries.append(
                {
                    "step": parsed[0],
                    "dp_rank": parsed[1],
                    "file": e.name,
                    "path": e.path,
                    "bytes": e.stat().st_size,
                }
            )
    entries.sort(key=lambda x: (x["step"], -1 if x["dp_rank"] is None else x["dp_rank"]))
    return entries


def resolve_eos(
    path: str, eos_token_id: int | list[int] | None
) -> tuple[list[int] | None, str | None]:
    if eos_token_id is not None:
        ids = [eos_token_id] if isinstance(eos_token_id, int) else list(eos_token_id)
        return ids, "option"
    return find_eos_token_ids(path)


def file_analysis(
    path: str, eos_ids: list[int] | None, trust_pickle: bool, token_budget: int
) -> tuple[str, str, dict[str, Any] | None]:
    key = ("analysis", *file_key(path), trust_pickle, tuple(eos_ids or ()), token_budget)

    def make() -> tuple[str, str, dict[str, Any] | None]:
        obj = load_pt(path, trust_pickle)
        fmt, description = detect_format(obj)
        if fmt == TRAJECTORY_REFS:
            return fmt, description, references_summary(groups_of(obj, fmt))
        if fmt not in (TRAJECTORY, DICT_BATCH):
            return fmt, description, None
        groups = groups_of(obj, fmt)
        result = analyze_groups(groups, eos_ids, token_budget, path)
        result["n_groups"] = len(groups)
        return fmt, description, result

    return cached(key, make)


def references_summary(groups: list[dict[str, Any]]) -> dict[str, Any]:
    """What a batch of RTensor references tells without its data: shapes, and where it was."""
    keys: dict[str, dict[str, Any]] = {}
    nodes: dict[str, int] = {}
    samples = 0
    for g in groups:
        for k, v in g.items():
            meta = value_meta(k, v)
            keys[k] = merge_meta(keys[k], meta) if k in keys else meta
            if isinstance(v, RTensorRef) and isinstance(v.shard, ShardRef):
                addr = str(v.shard.node_addr)
                nodes[addr] = nodes.get(addr, 0) + 1
        for key in ("attention_mask", "input_ids"):
            t: Any = g.get(key)
            if is_tensorish(t) and len(t.shape) == 2:
                samples += int(t.shape[0])
                break
    return {"n_groups": len(groups), "samples": samples, "keys": keys, "nodes": nodes}


def references_text(path: str, nodes: dict[str, int]) -> str:
    """One line: what RTensor references are and how to get the data behind them."""
    where = ", ".join(f"{n} shards on {addr}" for addr, n in sorted(nodes.items())[:4])
    more = f", and more on {len(nodes) - 4} other workers" if len(nodes) > 4 else ""
    return (
        f"{path}: holds AReaL RTensor references, not tensors: in single-controller mode "
        "the controller saved its view of the batch, whose tensors stay in the RPC servers "
        f"of the workers that made them ({where}{more}) and are deleted when the "
        "step ends (clear_batches); the file has only their shapes and dtypes. To get the "
        "data, save RTensor.localize(batch) instead (it fetches every shard over HTTP, "
        "GET http://<node_addr>/data/<shard_id>, while the trial runs), or dump in SPMD mode"
    )


def summarize_file(
    path: str,
    eos_token_id: int | list[int] | None = None,
    trust_pickle: bool = False,
    token_budget: int = TOKEN_BUDGET,
    bins: int = 10,
) -> dict[str, Any]:
    """`batch --json` for one `.pt` file (any format; non-batches are described)."""
    eos_ids, eos_source = resolve_eos(path, eos_token_id)
    fmt, description, result = file_analysis(path, eos_ids, trust_pickle, token_budget)
    parsed = parse_step_name(os.path.basename(path))
    summary: dict[str, Any] = {
        "path": path,
        "format": fmt,
        "description": description,
        "step": parsed[0] if parsed else None,
        "dp_rank": parsed[1] if parsed else None,
        "bytes": os.path.getsize(path),
        "eos_token_ids": eos_ids,
        "eos_source": eos_source,
    }
    if result is None:
        summary.update(groups=0, samples=0, tokens=0, keys={}, stats={}, warnings=[])
        return summary
    if fmt == TRAJECTORY_REFS:
        summary.update(
            groups=result["n_groups"],
            samples=result["samples"],
            tokens=None,
            keys=result["keys"],
            stats={},
            remote={"nodes": result["nodes"], "shards": sum(result["nodes"].values())},
            warnings=[references_text(path, result["nodes"])],
        )
        return summary
    rows = result["rows"]
    stats = batch_stats(
        rows, result["group_rewards"], result["behave_imp_weight"], result["version_span"]
    )
    summary.update(
        groups=result["n_groups"],
        samples=len(rows),
        tokens=sum(r["seq_len"] for r in rows),
        keys=result["keys"],
        stats=stats,
        warnings=batch_warnings(stats, result["keys"], eos_known=eos_ids is not None),
        distributions=_distributions(rows, bins),
    )
    return summary


def _distributions(rows: list[dict[str, Any]], bins: int) -> dict[str, Any]:
    return {
        "task_reward": histogram(
            [r["task_reward"] for r in rows if r.get("task_reward") is not None], bins
        ),
        "seq_len": histogram([float(r["seq_len"]) for r in rows], bins),
        "response_len": histogram([float(r["response_len"]) for r in rows], bins),
    }


def summarize_dir(
    path: str,
    eos_token_id: int | list[int] | None = None,
    trust_pickle: bool = False,
    token_budget: int = TOKEN_BUDGET,
    bins: int = 10,
    max_steps: int = MAX_DIR_STEPS,
) -> dict[str, Any]:
    """A dump directory: the steps x dp-ranks timeline, pooled stats, trend warnings.

    Only the newest `max_steps` steps are analyzed (all their dp-rank files); older files
    are listed with their sizes and `"analyzed": false`.
    """
    entries = list_dump_dir(path)
    if not entries:
        if text_rollout_root(path):
            return summarize_text_rollout(path, bins=bins)
        others = [n for n in os.listdir(path) if n.endswith(".pt")]
        if others:
            raise BatchError(
                f"{path}: no step_NNNNNN.pt dump files here ({len(others)} other .pt files, "
                f"e.g. {sorted(others)[0]}: open one directly)"
            )
        raise BatchError(
            f"{path}: no rollout dumps here (expected step_NNNNNN.pt files or "
            "rollout/<version>/<task_id>.jsonl)"
        )
    eos_ids, eos_source = resolve_eos(path, eos_token_id)
    rows: list[dict[str, Any]] = []
    group_rewards: list[list[float]] = []
    spans: list[int] = []
    warnings: list[str] = []
    keys: dict[str, Any] = {}
    file_versions: list[tuple[int, dict[str, Any]]] = []
    file_weights: list[dict[str, Any]] = []
    n_groups = 0
    newest = sorted({e["step"] for e in entries})[-max_steps:] if max_steps > 0 else []
    recent = set(newest)
    for e in entries:
        e["analyzed"] = e["step"] in recent
        if not e["analyzed"]:
            continue
        try:
            fmt, description, result = file_analysis(e["path"], eos_ids, trust_pickle, token_budget)
        except BatchError as exc:  # this file only: the summary goes on without it
            e["error"], e["unreadable"] = str(exc), True
            warnings.append(f"unreadable: {exc}")
            continue
        if result is None or fmt == TRAJECTORY_REFS:
            e["error"] = (
                references_text(e["file"], result["nodes"])
                if result is not None
                else f"not a rollout batch: {description}"
            )
            warnings.append(e["error"] if result is not None else f"{e['file']}: {e['error']}")
            continue
        file_rows = result["rows"]
        file_stats = batch_stats(
            file_rows, result["group_rewards"], result["behave_imp_weight"], None
        )
        e.update(
            format=fmt,
            groups=result["n_groups"],
            samples=len(file_rows),
            tokens=sum(r["seq_len"] for r in file_rows),
            seq_len_mean=file_stats["seq_len"]["mean"],
            response_len_mean=file_stats["response_len"]["mean"],
            task_reward_mean=file_stats["task_reward"]["mean"],
            no_eos_ratio=file_stats["no_eos_ratio"],
            no_eos_token_ratio=file_stats["no_eos_token_ratio"],
            equal_reward_group_ratio=file_stats["equal_reward_group_ratio"],
        )
        if file_stats["version"]:
            file_versions.append((len(file_rows), file_stats["version"]))
        if result["behave_imp_weight"]:
            file_weights.append(result["behave_imp_weight"])
        rows.extend(file_rows)
        group_rewards.extend(result["group_rewards"])
        spans.extend(result["version_span"])
        n_groups += result["n_groups"]
        for k, meta in result["keys"].items():
            keys[k] = merge_meta(keys[k], meta) if k in keys else dict(meta)
    per_step = _per_step(entries)
    stats = batch_stats(rows, group_rewards, _pooled_weights(file_weights), spans)
    stats["version"] = _pooled_versions(file_versions, stats["version"])
    warnings = batch_warnings(stats, keys, eos_known=eos_ids is not None) + warnings
    warnings += length_trend_warnings(per_step)
    return {
        "path": path,
        "format": TRAJECTORY_DIR,
        "description": f"AReaL trajectory dump directory: "
        f"{len({e['step'] for e in entries})} steps, {len(entries)} files"
        + (
            f" (newest {len(per_step)} steps analyzed)"
            if len(per_step) < len({e["step"] for e in entries})
            else ""
        ),
        "step": None,
        "dp_rank": None,
        "bytes": sum(e["bytes"] for e in entries),
        "eos_token_ids": eos_ids,
        "eos_source": eos_source,
        "groups": n_groups,
        "samples": len(rows),
        "tokens": sum(r["seq_len"] for r in rows),
        "keys": keys,
        "stats": stats,
        "warnings": warnings,
        "distributions": _distributions(rows, bins),
        "steps": sorted({e["step"] for e in entries}),
        "dp_ranks": sorted({e["dp_rank"] for e in entries if e["dp_rank"] is not None}),
        "per_step": per_step,
        "timeline": [{k: v for k, v in e.items() if k != "path"} for e in entries],
    }


def _pooled_versions(
    per_file: list[tuple[int, dict[str, Any]]], pooled: dict[str, Any] | None
) -> dict[str, Any] | None:
    """Staleness is relative to each file's newest policy, not to the newest step shown."""
    if not per_file or pooled is None:
        return pooled
    n = sum(w for w, _ in per_file)
    return {
        **pooled,
        "staleness_mean": sum(w * v["staleness_mean"] for w, v in per_file) / n,
        "staleness_max": max(v["staleness_max"] for _, v in per_file),
    }


def _pooled_weights(per_file: list[dict[str, Any]]) -> dict[str, Any] | None:
    """behave_imp_weight over several files, token-weighted."""
    if not per_file:
        return None
    n = sum(w["tokens"] for w in per_file)
    return {
        "mean": sum(w["mean"] * w["tokens"] for w in per_file) / n,
        "min": min(w["min"] for w in per_file),
        "max": max(w["max"] for w in per_file),
        "above_upper_ratio": sum(w["above_upper_ratio"] * w["tokens"] for w in per_file) / n,
        "upper": per_file[0]["upper"],
        "tokens": n,
        "sampled": any(w["sampled"] for w in per_file),
    }


def _per_step(entries: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Sample-weighted means per step across its dp-rank files."""
    by_step: dict[int, list[dict[str, Any]]] = {}
    for e in entries:
        by_step.setdefault(e["step"], []).append(e)
    out = []
    for step in sorted(by_step):
        if not all(e.get("analyzed", True) for e in by_step[step]):
            continue
        files = [e for e in by_step[step] if e.get("samples")]
        n = sum(e["samples"] for e in files)

        def mean(field: str, files: list[dict[str, Any]] = files, n: int = n) -> float | None:
            vals = [(e[field], e["samples"]) for e in files if e.get(field) is not None]
            total = sum(w for _, w in vals)
            return sum(v * w for v, w in vals) / total if total else None

        out.append(
            {
                "step": step,
                "files": len(by_step[step]),
                "samples": n,
                "seq_len_mean": mean("seq_len_mean"),
                "response_len_mean": mean("response_len_mean"),
                "task_reward_mean": mean("task_reward_mean"),
                "no_eos_ratio": mean("no_eos_ratio"),
                "no_eos_token_ratio": mean("no_eos_token_ratio"),
            }
        )
    return out


def text_rollout_root(path: str) -> str | None:
    """The `rollout` directory (holding `<version>/*.jsonl`) at or under `path`, if any."""
    candidates = [path, os.path.join(path, "rollout")]
    for c in candidates:
        if not os.path.isdir(c):
            continue
        try:
            subdirs = [
                d for d in os.listdir(c) if d.isdigit() and os.path.isdir(os.path.join(c, d))
            ]
        except OSError:
            continue
        if any(n.endswith(".jsonl") for d in subdirs for n in os.listdir(os.path.join(c, d))):
            return c
    # A single version directory.
    if os.path.isdir(path) and any(n.endswith(".jsonl") for n in os.listdir(path)):
        return path
    return None


def read_text_rollout(path: str) -> list[dict[str, Any]]:
    """All records of a text rollout dump, each with its `version` and `file`, in order."""
    root = text_rollout_root(path)
    if root is None:
        raise BatchError(f"{path}: no rollout/<version>/<task_id>.jsonl files here")
    files: list[tuple[int | None, str]] = []
    names = os.listdir(root)
    version_dirs = sorted(
        int(d) for d in names if d.isdigit() and os.path.isdir(os.path.join(root, d))
    )
    for v in version_dirs:
        vdir = os.path.join(root, str(v))
        files += [
            (v, os.path.join(vdir, n)) for n in sorted(os.listdir(vdir)) if n.endswith(".jsonl")
        ]
    if not version_dirs:
        base = os.path.basename(os.path.normpath(root))
        files = [
            (int(base) if base.isdigit() else None, os.path.join(root, n))
            for n in sorted(names)
            if n.endswith(".jsonl")
        ]
    records = []
    for version, file in files:
        with open(file, encoding="utf-8") as f:
            for lineno, line in enumerate(f, 1):
                if not line.strip():
                    continue
                try:
                    rec = json.loads(line)
                except ValueError as exc:
                    raise BatchError(f"{file}:{lineno}: not a JSON line ({exc})") from None
                if not isinstance(rec, dict):
                    raise BatchError(f"{file}:{lineno}: not a JSON object")
                rec["version"] = version
                rec["file"] = os.path.relpath(file, root)
                records.append(rec)
    return records


def text_rows(records: list[dict[str, Any]]) -> tuple[list[dict[str, Any]], list[list[float]]]:
    rows = []
    by_task: dict[Any, list[float]] = {}
    tasks: dict[Any, int] = {}
    for i, rec in enumerate(records):
        seq = int(rec.get("seqlen") or 0)
        plen = int(rec.get("prompt_len") or 0)
        reward = rec.get("reward")
        # workflow_executor.py:1036-1038: the un-normalised reward, when there is one.
        original = rec.get("original_reward", reward)
        task = (rec.get("version"), rec.get("task_id"))
        group = tasks.setdefault(task, len(tasks))
        if isinstance(reward, (int, float)):
            by_task.setdefault(task, []).append(float(reward))
        rows.append(
            {
                "index": i,
                "group": group,
                "row": rec.get("sample_idx"),
                "task_id": rec.get("task_id"),
                "seq_len": seq,
                "prompt_len": plen,
                "response_len": max(0, seq - plen),
                "task_reward": float(original) if isinstance(original, (int, float)) else None,
                "reward": float(reward) if isinstance(reward, (int, float)) else None,
                "no_eos": None,
                "eos": None,
                "head_version": rec.get("head_version"),
                "tail_version": rec.get("tail_version"),
            }
        )
    return rows, list(by_task.values())


def summarize_text_rollout(path: str, bins: int = 10) -> dict[str, Any]:
    records = read_text_rollout(path)
    rows, group_rewards = text_rows(records)
    spans = [
        r["tail_version"] - r["head_version"]
        for r in rows
        if isinstance(r["head_version"], int) and isinstance(r["tail_version"], int)
    ]
    stats = batch_stats(rows, group_rewards, None, spans)
    fields: dict[str, Any] = {}
    for rec in records:
        for k, v in rec.items():
            if k in ("version", "file"):
                continue
            fields.setdefault(k, {"shape": [0], "dtype": type(v).__name__})
            fields[k]["shape"][0] += 1
    versions = sorted({r["version"] for r in records if r["version"] is not None})
    return {
        "path": path,
        "format": TEXT_ROLLOUT,
        "description": f"AReaL text rollout dump: {len(records)} samples, "
        f"{len(group_rewards)} tasks, versions {versions}",
        "step": None,
        "dp_rank": None,
        "groups": len(group_rewards),
        "samples": len(rows),
        "tokens": sum(r["seq_len"] for r in rows),
        "keys": fields,
        "stats": stats,
        "warnings": batch_warnings(stats, None, eos_known=True),
        "distributions": _distributions(rows, bins),
        "versions": versions,
    }


def summarize(
    path: str,
    eos_token_id: int | list[int] | None = None,
    trust_pickle: bool = False,
    token_budget: int = TOKEN_BUDGET,
    bins: int = 10,
) -> dict[str, Any]:
    """`batch --json` for a file or a directory."""
    if os.path.isdir(path):
        return summarize_dir(path, eos_token_id, trust_pickle, token_budget, bins)
    if not os.path.exists(path):
        raise BatchError(f"{path}: no such file or directory")
    if path.endswith(".jsonl"):
        return summarize_text_rollout(os.path.dirname(path) or ".", bins=bins)
    return summarize_file(path, eos_token_id, trust_pickle, token_budget, bins)
