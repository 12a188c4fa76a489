"""Sample views: the per-sample table of one file and one sample in full."""

from __future__ import annotations

import math
import os
from typing import Any

from areal_node.batches.analysis import (
    TOKEN_BUDGET,
    analyze_groups,
    group_tensor,
    group_width,
    groups_of,
)
from areal_node.batches.eos import decoder_for
from areal_node.batches.loader import (
    DICT_BATCH,
    TRAJECTORY,
    TRAJECTORY_REFS,
    BatchError,
    detect_format,
    dtype_name,
    is_tensor,
    is_tensorish,
    load_pt,
)
from areal_node.batches.summary import (
    file_analysis,
    list_dump_dir,
    read_text_rollout,
    references_summary,
    references_text,
    resolve_eos,
    text_rollout_root,
    text_rows,
)


def resolve_step_file(path: str, step: int | None = None, dp_rank: int | None = None) -> str:
    """The file of `step` (default: the newest) and `dp_rank` (default: the lowest) in a dir."""
    if not os.path.isdir(path):
        return path
    entries = list_dump_dir(path)
    if not entries:
        if text_rollout_root(path):
            return path  # a text rollout dump is read as a whole
        raise BatchError(f"{path}: no step_NNNNNN.pt dump files here")
    if step is None:
        step = entries[-1]["step"]
    chosen = [e for e in entries if e["step"] == step]
    if dp_rank is not None:
        chosen = [e for e in chosen if e["dp_rank"] == dp_rank]
    if not chosen:
        have = sorted({(e["step"], e["dp_rank"]) for e in entries})
        raise BatchError(
            f"{path}: no file for step {step}"
            f"{'' if dp_rank is None else f' dp rank {dp_rank}'} (have {have[:8]})"
        )
    return str(chosen[0]["path"])


def sample_table(
    path: str,
    eos_token_id: int | list[int] | None = None,
    trust_pickle: bool = False,
    offset: int = 0,
    limit: int | None = None,
) -> dict[str, Any]:
    """Per-sample rows (group, lengths, reward, EOS, versions) of one file or text dump."""
    if os.path.isdir(path) and text_rollout_root(path) and not list_dump_dir(path):
        rows, _ = text_rows(read_text_rollout(path))
    else:
        eos_ids, _ = resolve_eos(path, eos_token_id)
        fmt, description, result = file_analysis(path, eos_ids, trust_pickle, TOKEN_BUDGET)
        if result is None:
            raise BatchError(f"{path}: not a rollout batch: {description}")
        if fmt == TRAJECTORY_REFS:
            raise BatchError(references_text(path, result["nodes"]))
        rows = result["rows"]
    end = len(rows) if limit is None else offset + limit
    return {"path": path, "total": len(rows), "offset": offset, "rows": rows[offset:end]}


def sample_view(
    path: str,
    index: int,
    eos_token_id: int | list[int] | None = None,
    trust_pickle: bool = False,
) -> dict[str, Any]:
    """One sample, unpadded: tokens, loss mask, logprobs, versions, reward, lengths, text."""
    if os.path.isdir(path) and text_rollout_root(path) and not list_dump_dir(path):
        records = read_text_rollout(path)
        rows, _ = text_rows(records)
        _check_index(index, len(rows))
        rec = records[index]
        return {
            **rows[index],
            "path": path,
            "prompt": rec.get("prompt"),
            "completion": rec.get("completion"),
            "tokens": None,
            "text": None,
        }
    eos_ids, _ = resolve_eos(path, eos_token_id)
    obj = load_pt(path, trust_pickle)
    fmt, description = detect_format(obj)
    if fmt == TRAJECTORY_REFS:
        raise BatchError(references_text(path, references_summary(groups_of(obj, fmt))["nodes"]))
    if fmt not in (TRAJECTORY, DICT_BATCH):
        raise BatchError(f"{path}: not a rollout batch: {description}")
    groups = groups_of(obj, fmt)
    # Find the group from tensor shapes alone: opening one sample reads only its group.
    sizes = [_group_size(g) for g in groups]
    _check_index(index, sum(sizes))
    gi, start = 0, 0
    while index >= start + sizes[gi]:
        start += sizes[gi]
        gi += 1
    group = groups[gi]
    local = analyze_groups([group], eos_ids, 0, path)["rows"][index - start]
    row = {**local, "index": index, "group": gi}
    # AReaL's no_eos is relative to the whole batch's padded width, not the group's.
    row["no_eos"] = row["seq_len"] == max(group_width(g) for g in groups)
    n = row["seq_len"]
    r = row["row"]
    per_token: dict[str, Any] = {}
    for key in (
        "input_ids",
        "loss_mask",
        "logprobs",
        "versions",
        "turn_ids",
        "prox_logp",
        "ref_logp",
        "teacher_logp",
        "advantages",
    ):
        t = group_tensor(group, key, 2)
        if t is not None:
            per_token[key] = t[r, :n].tolist()
    scalars = {
        k: float(v.reshape(-1)[r])
        for k, v in group.items()
        if is_tensor(v) and v.dim() == 1 and v.numel() > r and v.is_floating_point()
    }
    extras = _sample_extras(group, r)
    tokens = per_token.get("input_ids")
    text = None
    if tokens is not None:
        tok = decoder_for(path)
        if tok is not None:
            try:
                text = tok.decode(tokens, skip_special_tokens=False)
            except Exception:  # a tokenizer that rejects the ids: fall back to ids
                text = None
    return {
        **row,
        "path": path,
        "tokens": tokens,
        "loss_mask": per_token.get("loss_mask"),
        "logprobs": per_token.get("logprobs"),
        "versions": per_token.get("versions"),
        "turn_ids": per_token.get("turn_ids"),
        "prox_logp": per_token.get("prox_logp"),
        "teacher_logp": per_token.get("teacher_logp"),
        "scalars": scalars,
        "extras": extras,
        "text": text,
    }


def _sample_extras(group: dict[str, Any], row: int) -> dict[str, Any]:
    """The group's non-tensor entries for one sample, as short JSON-able values.

    Python numbers and strings (`rl_loss_weight`, `distill_loss_weight`, `task_id`) are
    shared by the group; a multi-modal list has one dict per sample (its tensors' shapes).
    """
    out: dict[str, Any] = {}
    for k, v in group.items():
        if is_tensorish(v):
            continue
        if isinstance(v, (bool, int, float, str)) or v is None:
            out[k] = v
        elif isinstance(v, (list, tuple)):
            item = v[row] if len(v) > row else None
            if isinstance(item, dict):
                out[k] = {
                    name: (
                        {"shape": list(t.shape), "dtype": dtype_name(t)}
                        if is_tensorish(t)
                        else _short(t)
                    )
                    for name, t in item.items()
                }
            else:
                out[k] = _short(item) if len(v) > row else _short(v)
        else:
            out[k] = _short(v)
    return out


def _short(value: Any, limit: int = 200) -> Any:
    if isinstance(value, (bool, int, float)) or value is None:
        return value
    text = value if isinstance(value, str) else repr(value)
    return text if len(text) <= limit else text[: limit - 3] + "..."


def _group_size(group: dict[str, Any]) -> int:
    for key in ("input_ids", "attention_mask", "loss_mask"):
        t = group_tensor(group, key, 2)
        if t is not None:
            return int(t.shape[0])
    return 0


def _check_index(index: int, total: int) -> None:
    if not 0 <= index < total:
        raise BatchError(
            f"sample {index} out of range: the batch has {total} samples (0..{total - 1})"
        )


def json_safe(value: Any) -> Any:
    """NaN and infinities become None, so the result is strict JSON."""
    if isinstance(value, float):
        return value if math.isfinite(value) else None
    if isinstance(value, dict):
        return {k: json_safe(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [json_safe(v) for v in value]
    return value
