"""Per-sample facts of a tensor batch: lengths, rewards, EOS, versions, weights.

Torch on first use; touches only what a summary needs (the masks, a few gathered token ids
and versions per sample, a bounded sample of per-token log-probabilities).
"""

from __future__ import annotations

import contextlib
import math
import os
from typing import Any

from areal_node.batches.loader import (
    TRAJECTORY,
    TRAJECTORY_REFS,
    RTensorRef,
    dtype_name,
    is_tensor,
    is_tensorish,
)
from areal_node.batches.stats import REJECTION_UPPER

# AReaL's multi-modal keys (areal/utils/data.py:88-90): lists of per-sample dicts.
MULTI_MODAL_PREFIX = "multi_modal_input"

# Per-token statistics (behave_imp_weight) read at most this many tokens per file.
TOKEN_BUDGET = 1 << 20


def groups_of(obj: Any, fmt: str) -> list[dict[str, Any]]:
    """Prompt groups: the dump's own, or for a dict batch rows sharing a prompt."""
    if fmt in (TRAJECTORY, TRAJECTORY_REFS):
        return list(obj) if isinstance(obj, list) else [obj]
    return [_split_rows(obj, rows) for rows in _prompt_groups(obj)]


def _split_rows(batch: dict[str, Any], rows: list[int]) -> dict[str, Any]:
    """Rows lo..hi of a batch dict; per-sample lists are sliced, other values kept."""
    lo, hi = rows[0], rows[-1] + 1
    n = int(batch["input_ids"].shape[0])
    out: dict[str, Any] = {}
    for k, v in batch.items():
        if is_tensor(v):
            if v.dim() >= 1 and v.shape[0] == n:
                out[k] = v[lo:hi]
        elif isinstance(v, list) and len(v) == n:
            out[k] = v[lo:hi]
        else:
            out[k] = v
    return out


def _prompt_groups(batch: dict[str, Any]) -> list[list[int]]:
    """Consecutive rows with the same prompt tokens form one GRPO group."""
    import torch

    ids = batch["input_ids"]
    n = ids.shape[0]
    lm: Any = batch.get("loss_mask")
    if not is_tensor(lm) or lm.shape[:1] != ids.shape[:1]:
        lm = None
    groups: list[list[int]] = []
    last: tuple[int, ...] | None = None
    for i in range(n):
        if lm is not None:
            plen = int(torch.argmax(lm[i].ne(0).to(torch.uint8)).item()) if lm[i].any() else 0
        else:
            plen = 0
        key = tuple(ids[i, :plen].tolist()) if plen else (i,)
        if groups and key == last:
            groups[-1].append(i)
        else:
            groups.append([i])
        last = key
    return groups


def group_tensor(g: dict[str, Any], key: str, dim: int | None = None) -> Any:
    """`g[key]` when it is a tensor (of `dim` dimensions), else None."""
    v: Any = g.get(key)
    if not is_tensor(v) or (dim is not None and v.dim() != dim):
        return None
    return v


def value_meta(key: str, v: Any) -> dict[str, Any]:
    """What `batch --json` says about one entry of a group dict: shape and dtype."""
    if is_tensorish(v):
        shape = list(v.shape)
        kind = "rtensor" if isinstance(v, RTensorRef) else "tensor"
        return {"shape": shape, "dtype": dtype_name(v), "kind": kind}
    if isinstance(v, (bool, int, float, str)) or v is None:
        return {"shape": [], "dtype": type(v).__name__, "kind": "value", "value": v}
    if isinstance(v, (list, tuple)):
        meta: dict[str, Any] = {
            "shape": [len(v)],
            "dtype": f"list[{'|'.join(sorted({type(x).__name__ for x in v})) or '-'}]",
            "kind": "list",
        }
        if key.startswith(MULTI_MODAL_PREFIX):
            # One dict per sample (areal/workflow/vision_rlvr.py:148-156): pixel_values, ...
            fields: dict[str, Any] = {}
            for item in v:
                if isinstance(item, dict):
                    for name, t in item.items():
                        if is_tensorish(t):
                            fields.setdefault(
                                name, {"shape": list(t.shape), "dtype": dtype_name(t)}
                            )
            meta["fields"] = fields
        return meta
    return {"shape": [], "dtype": type(v).__name__, "kind": "object"}


def merge_meta(old: dict[str, Any], new: dict[str, Any]) -> dict[str, Any]:
    """Key metadata of several groups: rows add up, widths take the maximum."""
    out = dict(old)
    if new["kind"] in ("tensor", "rtensor", "list") and old["kind"] == new["kind"]:
        a, b = old["shape"], new["shape"]
        if a and b:
            out["shape"] = [a[0] + b[0], *[max(x, y) for x, y in zip(a[1:], b[1:])]]
    if new["dtype"] not in old["dtype"].split("|"):
        out["dtype"] = "|".join(sorted(set(old["dtype"].split("|")) | {new["dtype"]}))
    if "value" in old and old.get("value") != new.get("value"):
        out.pop("value", None)
        out["values_differ"] = True
    return out


_STRUCT_CODES = {
    "int32": "i",
    "int64": "q",
    "float32": "f",
    "float64": "d",
    "int16": "h",
    "uint8": "B",
    "int8": "b",
    "bool": "?",
}


class ElementReader:
    """Single elements of memory-mapped tensors, read with `pread` from the file.

    Indexing a mapped tensor at one token per row faults in (and reads around) pages of
    every row; reading the few bytes at the element's file offset does not. Falls back to
    plain indexing when the tensor is not backed by a mapping of `path` (legacy files).
    """

    def __init__(self, path: str | None) -> None:
        self.fd: int | None = None
        self.ranges: list[tuple[int, int, int]] = []  # (start, end, file offset at start)
        self._scratch = bytearray()
        if path is None:
            return
        real = os.path.realpath(path)
        try:
            with open("/proc/self/maps", encoding="utf-8", errors="replace") as f:
                for line in f:
                    parts = line.split(None, 5)
                    if len(parts) == 6 and parts[5].rstrip("\n") == real:
                        lo, hi = (int(x, 16) for x in parts[0].split("-"))
                        self.ranges.append((lo, hi, int(parts[2], 16)))
            if self.ranges:
                self.fd = os.open(real, os.O_RDONLY)
        except OSError:
            self.ranges, self.fd = [], None

    def close(self) -> None:
        if self.fd is not None:
            os.close(self.fd)
            self.fd = None

    def _offset(self, t: Any) -> int | None:
        if self.fd is None or t.dim() == 0:
            return None
        ptr = t.data_ptr()
        for lo, hi, off in self.ranges:
            if lo <= ptr < hi:
                return ptr - lo + off
        return None

    def read(self, t: Any) -> Any:
        """An in-memory copy of a whole mapped tensor, read with one `preadv`.

        Bulk reads cost a fraction of faulting the same pages in one by one, and the pages
        do not stay mapped into this process. The copy lives in a scratch buffer that the
        next `read` may reuse: use it before reading the next tensor.
        """
        import torch

        base = self._offset(t)
        if base is None or self.fd is None or not t.is_contiguous():
            return t
        nbytes = t.numel() * t.element_size()
        if len(self._scratch) < nbytes:
            self._scratch = bytearray(nbytes)  # a new buffer: older copies stay valid
        view = memoryview(self._scratch)[:nbytes]
        try:
            got = os.preadv(self.fd, [view], base)
        finally:
            view.release()
        if got != nbytes:
            return t
        return torch.frombuffer(self._scratch, dtype=t.dtype, count=t.numel()).view(t.shape)

    def prefetch(self, tensors: list[Any]) -> None:
        """Ask the kernel to start reading these tensors' bytes now, all at once.

        On a cold cache, many scattered synchronous reads wait one disk round trip each;
        announcing them up front lets the device serve them in parallel.
        """
        if self.fd is None or not hasattr(os, "posix_fadvise"):
            return
        for t in tensors:
            base = self._offset(t)
            if base is not None:
                nbytes = t.numel() * t.element_size()
                with contextlib.suppress(OSError):
                    os.posix_fadvise(self.fd, base, nbytes, os.POSIX_FADV_WILLNEED)

    def gather(self, t: Any, cols: list[int]) -> list[Any]:
        """`t[r, cols[r]]` for every row r, as Python numbers."""
        import struct

        base = self._offset(t) if t.dim() == 2 else None
        code = _STRUCT_CODES.get(dtype_name(t))
        if base is None or code is None or self.fd is None:
            import torch

            return t[torch.arange(len(cols)), torch.tensor(cols)].tolist()
        size = t.element_size()
        s0, s1 = t.stride()
        out = []
        for r, c in enumerate(cols):
            raw = os.pread(self.fd, size, base + (r * s0 + c * s1) * size)
            out.append(struct.unpack("<" + code, raw)[0])
        return out


def analyze_groups(
    groups: list[dict[str, Any]],
    eos_ids: list[int] | None,
    token_budget: int = TOKEN_BUDGET,
    path: str | None = None,
) -> dict[str, Any]:
    """Per-sample rows and per-token aggregates, reading as little tensor data as it can.

    `path` is the file the groups are mapped from, for reading single elements directly.
    """
    import torch

    # Many small tensor ops: torch's intra-op thread pool adds only wake-ups. On a busy
    # 2-core machine one thread ran a 1 GB dump's summary 1.5-7x faster than two
    # (bench/bench_batches_console.py); the process's setting is restored after.
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    reader = ElementReader(path)
    try:
        return _analyze_groups(groups, eos_ids, token_budget, reader)
    finally:
        reader.close()
        torch.set_num_threads(threads)


def _analyze_groups(
    groups: list[dict[str, Any]],
    eos_ids: list[int] | None,
    token_budget: int,
    reader: ElementReader,
) -> dict[str, Any]:
    import torch

    iw_groups = _budgeted_groups(groups, token_budget)
    reader.prefetch(
        [
            t
            for gi, g in enumerate(groups)
            for key in (
                "attention_mask",
                "loss_mask",
                *(("prox_logp", "logprobs") if gi in iw_groups else ()),
            )
            if (t := group_tensor(g, key)) is not None
        ]
    )
    # AReaL's no_eos_ratios (areal/trainer/ppo/actor.py:371-419 at cbff54d6): a sequence
    # counts when its length equals the width of the batch the actor trains on, which is
    # the file's groups concatenated by concat_padded_tensors (areal/utils/data.py:241-298):
    # every group right-padded to the widest one. No EOS id is involved.
    widths = [int(group_width(g)) for g in groups]
    batch_width = max(widths) if widths else 0
    rows: list[dict[str, Any]] = []
    group_rewards: list[list[float]] = []
    key_counts: dict[str, int] = {}
    key_meta: dict[str, dict[str, Any]] = {}
    iw_sum = 0.0
    iw_n = 0
    iw_min = math.inf
    iw_max = -math.inf
    iw_over = 0
    version_span: list[int] = []
    for gi, g in enumerate(groups):
        for k, v in g.items():
            key_counts[k] = key_counts.get(k, 0) + 1
            meta = value_meta(k, v)
            key_meta[k] = merge_meta(key_meta[k], meta) if k in key_meta else meta
        ids = group_tensor(g, "input_ids", 2)
        am = group_tensor(g, "attention_mask", 2)
        lm = group_tensor(g, "loss_mask", 2)
        ref = ids if ids is not None else am if am is not None else lm
        if ref is None:
            continue
        n, width = ref.shape[0], ref.shape[1]
        # One pass over each mask and no temporaries: count_nonzero, not .ne().sum().
        if am is not None:
            seq = torch.count_nonzero(reader.read(am), dim=-1)
        else:
            seq = torch.full((n,), width, dtype=torch.int64)
        if lm is not None:
            # loss_mask is 0 on padding, so it needs no AND with the attention mask.
            lm_data = reader.read(lm)
            resp = torch.count_nonzero(lm_data, dim=-1)
            first = torch.argmax(
                lm_data if lm.dtype != torch.bool else lm_data.to(torch.uint8), dim=-1
            )
            del lm_data
        else:
            resp = torch.zeros(n, dtype=torch.int64)
            first = torch.zeros(n, dtype=torch.int64)
        last = (seq - 1).clamp(min=0).tolist()
        last_tok: list[Any] = reader.gather(ids, last) if ids is not None else [None] * n
        vers = group_tensor(g, "versions", 2)
        head: list[Any] = [None] * n
        tail: list[Any] = [None] * n
        if vers is not None:
            # Two values per sample, not the whole versions tensor.
            head, tail = reader.gather(vers, first.tolist()), reader.gather(vers, last)
        rewards = _per_sample(g, "rewards", n, reader)
        # AReaL's task_reward (actor.py:376-380): original_rewards when the workflow kept
        # them (agent workflows store group-normalised `rewards`), else rewards.
        original = _per_sample(g, "original_rewards", n, reader)
        task = original if any(x is not None for x in original) else rewards
        if any(x is not None for x in rewards):
            group_rewards.append([float(r) for r in rewards if r is not None])
        seq_l, resp_l, first_l = seq.tolist(), resp.tolist(), first.tolist()
        for r in range(n):
            eos = None
            if eos_ids is not None and last_tok[r] is not None and resp_l[r] > 0:
                eos = int(last_tok[r]) in eos_ids
            has_resp = resp_l[r] > 0
            h = head[r] if has_resp else None
            t = tail[r] if has_resp else None
            if h is not None and t is not None and h >= 0 and t >= 0:
                version_span.append(int(t) - int(h))
            # actor.py:52-65: the first generated position, or the length without one.
            prompt_len = int(first_l[r]) if has_resp else int(seq_l[r])
            rows.append(
                {
                    "index": len(rows),
                    "group": gi,
                    "row": r,
                    "seq_len": int(seq_l[r]),
                    "prompt_len": prompt_len,
                    "response_len": int(resp_l[r]),
                    "task_reward": task[r],
                    "reward": rewards[r],
                    "no_eos": int(seq_l[r]) == batch_width,
                    "eos": eos,
                    "head_version": None if h is None else int(h),
                    "tail_version": None if t is None else int(t),
                }
            )
        prox = group_tensor(g, "prox_logp", 2)
        behave = group_tensor(g, "logprobs", 2)
        if gi in iw_groups and prox is not None and behave is not None and lm is not None:
            # behave_imp_weight = pi_prox / pi_behave as the actor forms it: prox_logp is
            # next-token aligned (compute_logp: position t scores token t+1), logprobs are
            # token aligned, so AReaL rolls logprobs and loss_mask by -1 first
            # (actor.py:214-215, 239) and compares under the rolled mask
            # (areal/utils/functional/functional.py:231, 263). Each read is copied out (by
            # roll / boolean indexing) before the next one.
            mask = torch.roll(reader.read(lm), shifts=-1, dims=-1).ne(0)
            if mask.any():
                p = reader.read(prox)[mask].double()
                b = torch.roll(reader.read(behave), shifts=-1, dims=-1)[mask].double()
                log_ratio = p - b
                # functional.py:233: non-finite log ratios count as 0 (weight 1).
                log_ratio = torch.where(torch.isfinite(log_ratio), log_ratio, 0.0)
                w = torch.exp(log_ratio)
                iw_sum += float(w.sum())
                iw_n += int(w.numel())
                iw_min = min(iw_min, float(w.min()))
                iw_max = max(iw_max, float(w.max()))
                iw_over += int((w > REJECTION_UPPER).sum())
    keys = {
        k: {
            **m,
            **(
                {"missing_in_groups": len(groups) - key_counts[k]}
                if key_counts[k] != len(groups)
                else {}
            ),
        }
        for k, m in key_meta.items()
    }
    iw = None
    if iw_n:
        iw = {
            "mean": iw_sum / iw_n,
            "min": iw_min,
            "max": iw_max,
            "above_upper_ratio": iw_over / iw_n,
            "upper": REJECTION_UPPER,
            "tokens": iw_n,
            "sampled": len(iw_groups) < sum(1 for g in groups if "prox_logp" in g),
        }
    return {
        "rows": rows,
        "group_rewards": group_rewards,
        "keys": keys,
        "behave_imp_weight": iw,
        "version_span": version_span,
        "batch_width": batch_width,
    }


def group_width(g: dict[str, Any]) -> int:
    for key in ("attention_mask", "input_ids"):
        t = group_tensor(g, key, 2)
        if t is not None:
            return int(t.shape[1])
    return 0


def _per_sample(
    g: dict[str, Any], key: str, n: int, reader: ElementReader | None = None
) -> list[float | None]:
    """A `[G]` (or `[G, 1]`) per-sample value as floats; Nones when absent or misshapen.

    With `reader`, the few bytes are read from the file: touching them through the mapping
    maps in the whole large page around them (2 MB per group of a 1 GB dump), which is
    most of a summary's resident memory."""
    t = group_tensor(g, key)
    if t is None or t.numel() != n:
        return [None] * n
    values = reader.read(t) if reader is not None else t
    return [float(x) for x in values.reshape(-1).tolist()]


def _budgeted_groups(groups: list[dict[str, Any]], budget: int) -> set[int]:
    """Evenly spread groups whose tokens fit the per-token budget (all when they fit)."""
    sizes = []
    for g in groups:
        lp = group_tensor(g, "logprobs")
        sizes.append(int(lp.numel()) if lp is not None else 0)
    total = sum(sizes)
    if budget <= 0:
        return set()
    if total <= budget:
        return set(range(len(groups)))
    stride = total / budget
    chosen: set[int] = set()
    used = 0
    for i in range(0, len(groups), max(1, int(stride))):
        if used >= budget:
            break
        chosen.add(i)
        used += sizes[i]
    return chosen
