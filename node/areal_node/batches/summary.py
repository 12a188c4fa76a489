"""Rollout batches: a safe reader, statistics and AReaL's health checks.

This module imports only the standard library and torch: the console ships its source to a
node's agent (the agent's `load` op) so that summaries and sample slices are computed next
to the file and only small JSON results travel. `OPS` holds those agent handlers.

Safety: files load with `torch.load(weights_only=True, mmap=True, map_location="cpu")`.
A pickle that would run code is refused before anything in it runs; `trust_pickle=True`
opts in. Speed: tensors are memory-mapped, and a summary touches only what it needs
(the masks, a few gathered token ids and versions per sample, and a bounded sample of
per-token log-probabilities), so a multi-GB dump summarizes in about a second.
"""

from __future__ import annotations

import contextlib
import json
import math
import os
import re
import threading
import warnings
import zipfile
from collections import OrderedDict
from typing import Any

try:
    from areal_node.agent import DUMP_FILE as STEP_FILE
    from areal_node.constants import config_key, rejection_sampling_example
except ImportError:  # on a node: batch_source.py appends areal_keys.py's source to this
    pass  # one's, and STEP_FILE made from the agent's pattern

# Formats a path can hold.
TRAJECTORY = "trajectory_dump"  # list[dict[str, Tensor | Any]], one dict per prompt group
TRAJECTORY_REFS = "trajectory_refs"  # the same, holding single-controller RTensor references
TRAJECTORY_DIR = "trajectory_dir"  # a directory of step_NNNNNN[_dp_K].pt files
DICT_BATCH = "dict_batch"  # one dict of [B, T] tensors
TEXT_ROLLOUT = "text_rollout"  # rollout/<version>/<task_id>.jsonl
CHECKPOINT = "checkpoint"  # a model or optimizer state_dict
UNKNOWN = "unknown"
BATCH_FORMATS = (TRAJECTORY, TRAJECTORY_REFS, TRAJECTORY_DIR, DICT_BATCH, TEXT_ROLLOUT)

# AReaL's thresholds (performance and debugging guides, areal/api/cli_args.py).
NO_EOS_WARN = 0.05
# The bound AReaL's own warning suggests for actor.rejection_sampling (metric=ratio), the
# old default of the removed behave_imp_weight_cap (cli_args.py:1941-1952 at cbff54d6).
REJECTION_UPPER = 5.0
BEHAVE_IMP_WEIGHT_DRIFT = 0.1  # mean further than this from 1.0 warns
EQUAL_REWARD_GROUPS_WARN = 0.5
LENGTH_GROWTH_WARN = 0.2  # growth of mean response length over the steps shown

# A directory summary analyzes this many of the newest steps (each with all its dp ranks).
MAX_DIR_STEPS = 32

# Per-token statistics (behave_imp_weight) read at most this many tokens per file.
TOKEN_BUDGET = 1 << 20

# AReaL's dump names, `step_{step:06d}.pt` / `step_{step:06d}_dp_{dp_rank}.pt`: STEP_FILE is
# the agent's DUMP_FILE (imported above; on a node, batch_source.node_source() defines it).
EOS_CONFIG_FILES = ("generation_config.json", "config.json", "tokenizer_config.json")
# AReaL's multi-modal keys (areal/utils/data.py:88-90): lists of per-sample dicts.
MULTI_MODAL_PREFIX = "multi_modal_input"


# How a refused pickle is opened anyway, in CLI words; the console says its own key instead.
TRUST_HINT = "open it with --trust-pickle only if you trust who wrote it"


class BatchError(Exception):
    """A file or directory that cannot be shown, with a one-line reason."""


class UnsafePickleError(BatchError):
    """The file holds pickled objects that could run code when loaded."""


# --------------------------------------------------------------------------------------
# Loading


# torch's legacy format: a pickle (any protocol) whose first object is this magic number
# (torch/serialization.py MAGIC_NUMBER), after the two-byte protocol header.
LEGACY_HEAD = b"\x8a\x0a" + (0x1950A86A20F9469CFC6C).to_bytes(10, "little")

_cache_lock = threading.Lock()
# Keyed by (kind, real path, mtime, size, ...): a rewritten file is a new entry. Loaded
# files hold a mapping each, so few are kept; per-file analyses are small dicts.
_cache: dict[str, OrderedDict[tuple[Any, ...], Any]] = {
    "pt": OrderedDict(),
    "analysis": OrderedDict(),
}
_CACHE_SIZE = {"pt": 8, "analysis": 512}


def _cached(key: tuple[Any, ...], make: Any) -> Any:
    kind = key[0]
    lru = _cache[kind]
    with _cache_lock:
        if key in lru:
            lru.move_to_end(key)
            return lru[key]
    value = make()
    with _cache_lock:
        lru[key] = value
        while len(lru) > _CACHE_SIZE[kind]:
            lru.popitem(last=False)
    return value


def _file_key(path: str) -> tuple[str, int, int]:
    st = os.stat(path)
    return (os.path.realpath(path), st.st_mtime_ns, st.st_size)


def load_pt(path: str, trust_pickle: bool = False) -> Any:
    """The object in a `torch.save` file, memory-mapped, loaded without running code.

    Raises `UnsafePickleError` for pickles that need arbitrary globals (unless
    `trust_pickle`), `BatchError` for missing, empty, truncated or corrupt files.
    """
    if not os.path.exists(path):
        raise BatchError(f"{path}: no such file")
    if not os.path.isfile(path):
        raise BatchError(f"{path}: not a regular file")
    key = ("pt", *_file_key(path), trust_pickle)
    return _cached(key, lambda: _load_pt_uncached(path, trust_pickle))


# --------------------------------------------------------------------------------------
# AReaL's single-controller tensor references
#
# In single-controller mode the workers keep every tensor they produce and hand the
# controller an `RTensor` (areal/infra/rpc/rtensor.py:352-356 at cbff54d6): a dataclass of
# a `TensorShardInfo(shard_id, node_addr)` (rtensor.py:69-84) and a `meta` tensor (shape
# and dtype, no data). `RTensor.remotize` (rtensor.py:372-425) builds them on the worker
# (trimming padding first); `RTensor.localize` (rtensor.py:427-) fetches the data back with
# HTTP GETs to `http://<node_addr>/data/<shard_id>` on the worker's RPC server, and the
# trainer deletes the shards when the step ends (`clear_batches`). A batch the controller
# saves with `torch.save` therefore pickles the references (class
# `areal.infra.rpc.rtensor.RTensor`), not the data. These two inert classes stand in for
# AReaL's when such a file is read with `weights_only=True`: no AReaL code is imported or run.

RTENSOR_CLASS = "areal.infra.rpc.rtensor.RTensor"
SHARD_CLASS = "areal.infra.rpc.rtensor.TensorShardInfo"


class RTensorRef:
    """An unpickled `RTensor`: `shard` (a ShardRef) and `data` (a meta tensor).

    `shape` and `dtype` read the meta tensor, as AReaL's own properties do (rtensor.py:546-554).
    """

    shard: Any = None
    data: Any = None

    @property
    def shape(self) -> Any:
        return getattr(self.data, "shape", ())

    @property
    def dtype(self) -> Any:
        return getattr(self.data, "dtype", None)


class ShardRef:
    """An unpickled `TensorShardInfo`: where the data of an RTensor lives."""

    shard_id: Any = None
    node_addr: Any = None


_refs_allowed = False


def _allow_rtensor_refs() -> None:
    """Let `weights_only=True` unpickle AReaL's references as the inert classes above."""
    global _refs_allowed
    if _refs_allowed:
        return
    import torch

    with contextlib.suppress(AttributeError, TypeError):  # torch without (class, name) pairs
        torch.serialization.add_safe_globals([(RTensorRef, RTENSOR_CLASS), (ShardRef, SHARD_CLASS)])
    _refs_allowed = True


def _load_pt_uncached(path: str, trust_pickle: bool) -> Any:
    import pickle

    import torch

    try:
        size = os.path.getsize(path)
        with open(path, "rb") as f:
            head = f.read(len(LEGACY_HEAD) + 2)
    except OSError as exc:  # e.g. permission denied: this file only, said in one line
        raise BatchError(f"{path}: cannot read: {exc.strerror or exc}") from None
    if size == 0:
        raise BatchError(f"{path}: empty file")
    is_zip = head[:4] == b"PK\x03\x04"
    if is_zip and not zipfile.is_zipfile(path):
        raise BatchError(
            f"{path}: truncated or corrupt torch.save archive (no zip central directory; "
            "was the copy or the dump interrupted?)"
        )
    # The legacy (non-zip) format is a pickle that starts with torch's magic number; bytes
    # that merely start like a pickle are not a torch file (and not an "unsafe pickle").
    if not is_zip and not (head[:1] == b"\x80" and head[2:] == LEGACY_HEAD):
        raise BatchError(
            f"{path}: not a torch.save file (neither a zip archive nor torch's legacy format)"
        )
    _allow_rtensor_refs()
    try:
        # mmap needs the zip format; the legacy format is read normally. The safe loader is
        # tried first even with trust_pickle: most files need no more. torch's own warnings
        # (e.g. about the legacy format) are not the user's business here.
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            return torch.load(path, weights_only=True, mmap=is_zip, map_location="cpu")
    except pickle.UnpicklingError as exc:
        text = str(exc)
        if "Unsupported global" in text:
            found = re.search(r"Unsupported global: GLOBAL (\S+)", text)
            if trust_pickle:
                return _load_trusted(path, is_zip)
            what = f" ({found.group(1)})" if found else ""
            if found and found.group(1).startswith("areal."):
                what += (
                    ": AReaL objects that only AReaL itself can unpickle; with AReaL installed "
                    "they load with --trust-pickle"
                )
            raise UnsafePickleError(
                f"{path}: refused to load: it holds pickled objects that could run code when "
                f"loaded{what}; {TRUST_HINT}"
            ) from None
        raise BatchError(f"{path}: corrupt pickle data: {_one_line(text)}") from None
    except Exception as exc:
        raise _load_error(path, exc) from None


def _load_trusted(path: str, is_zip: bool) -> Any:
    import torch

    try:
        return torch.load(path, weights_only=False, mmap=is_zip, map_location="cpu")
    except ModuleNotFoundError as exc:
        raise BatchError(
            f"{path}: its pickle needs the Python module {exc.name!r}, which is not installed "
            "here (open it where the program that wrote it is installed)"
        ) from None
    except Exception as exc:
        raise _load_error(path, exc) from None


def _load_error(path: str, exc: Exception) -> BatchError:
    text = str(exc)
    if isinstance(exc, RuntimeError):
        if "central directory" in text or "zip archive" in text:
            return BatchError(f"{path}: truncated or corrupt torch.save archive")
        return BatchError(f"{path}: cannot load: {_one_line(text)}")
    if isinstance(
        exc, (EOFError, UnicodeDecodeError, ValueError, KeyError, OSError, zipfile.BadZipFile)
    ):
        return BatchError(
            f"{path}: truncated or corrupt torch.save archive ({exc.__class__.__name__}: "
            f"{_one_line(text)})"
        )
    # Garbage bytes can trip the unpickler in any way (IndexError, ...).
    return BatchError(
        f"{path}: corrupt torch.save data ({exc.__class__.__name__}: {_one_line(text)})"
    )


def _one_line(text: str, limit: int = 200) -> str:
    line = " ".join(text.split())
    return line if len(line) <= limit else line[: limit - 3] + "..."


# --------------------------------------------------------------------------------------
# Format detection


def _is_tensor(value: Any) -> bool:
    import torch

    return isinstance(value, torch.Tensor)


def _is_tensorish(value: Any) -> bool:
    """A tensor, or an RTensor reference standing for one."""
    return _is_tensor(value) or isinstance(value, RTensorRef)


def _dtype_name(t: Any) -> str:
    return str(t.dtype).replace("torch.", "")


def _is_group(g: Any) -> bool:
    """A trajectory dict: a tensor-ish `input_ids` or `attention_mask` of [G, T]."""
    if not isinstance(g, dict):
        return False
    for key in ("input_ids", "attention_mask"):
        v: Any = g.get(key)
        if _is_tensorish(v) and len(v.shape) == 2:
            return True
    return False


def _has_refs(obj: Any) -> bool:
    if isinstance(obj, RTensorRef):
        return True
    if isinstance(obj, dict):
        return any(_has_refs(v) for v in obj.values())
    if isinstance(obj, (list, tuple)):
        return any(_has_refs(v) for v in obj)
    return False


def detect_format(obj: Any) -> tuple[str, str]:
    """(format, a short description of what the object holds)."""
    if isinstance(obj, list):
        if obj and all(_is_group(g) for g in obj):
            if _has_refs(obj):
                return TRAJECTORY_REFS, (
                    f"AReaL single-controller dump: {len(obj)} trajectories of RTensor "
                    "references (shapes only; the tensors stayed on the workers)"
                )
            return TRAJECTORY, f"AReaL trajectory dump: {len(obj)} prompt groups"
        kinds = sorted({type(x).__name__ for x in obj})
        return UNKNOWN, f"a list of {len(obj)} items ({', '.join(kinds) or 'empty'})"
    if isinstance(obj, dict):
        tensors = {k: v for k, v in obj.items() if _is_tensor(v)}
        ids: Any = obj.get("input_ids")
        if _is_tensor(ids) and ids.dim() == 2:
            rows = ids.shape[0]
            extra = len(obj) - len(tensors)
            more = f" and {extra} other entr{'y' if extra == 1 else 'ies'}" if extra else ""
            return DICT_BATCH, f"a batch dict of {len(tensors)} tensors{more}, {rows} samples"
        if _is_group(obj) and _has_refs(obj):
            return TRAJECTORY_REFS, (
                "AReaL single-controller batch of RTensor references (shapes only; the "
                "tensors stayed on the workers)"
            )
        nested = [k for k in ("state_dict", "model", "module", "model_state_dict") if k in obj]
        if nested and isinstance(obj[nested[0]], dict):
            inner = obj[nested[0]]
            extra_keys = sorted(k for k in obj if k != nested[0])
            more = f"; also {', '.join(map(str, extra_keys[:5]))}" if extra_keys else ""
            text = _state_dict_text(inner)
            return CHECKPOINT, f"a training checkpoint ({nested[0]}: {text}{more})"
        if "optimizer" in obj or "optimizer_state_dict" in obj:
            names = ", ".join(map(str, list(obj)[:6]))
            return CHECKPOINT, f"an optimizer checkpoint (keys {names})"
        if tensors and len(tensors) == len(obj) and _looks_like_weights(tensors):
            return CHECKPOINT, f"a model checkpoint ({_state_dict_text(tensors)})"
        keys = list(obj)[:6]
        more = ", ..." if len(obj) > 6 else ""
        return UNKNOWN, f"a dict of {len(obj)} entries (keys {', '.join(map(str, keys))}{more})"
    if _is_tensor(obj):
        return UNKNOWN, f"a single tensor {list(obj.shape)} {_dtype_name(obj)}"
    return UNKNOWN, f"a {type(obj).__name__}"


def _looks_like_weights(tensors: dict[str, Any]) -> bool:
    names = list(tensors)
    return sum(1 for n in names if n.endswith((".weight", ".bias"))) >= max(1, len(names) // 2)


def _state_dict_text(sd: dict[str, Any]) -> str:
    tensors = [(k, v) for k, v in sd.items() if _is_tensor(v)]
    params = sum(v.numel() for _, v in tensors)
    dtypes = sorted({_dtype_name(v) for _, v in tensors})
    example = ""
    if tensors:
        name, t = tensors[0]
        example = f"; e.g. {name} {list(t.shape)}"
    return f"{len(tensors)} tensors, {_count_text(params)} parameters, {'/'.join(dtypes)}{example}"


def _count_text(n: float) -> str:
    for unit, size in (("B", 1e9), ("M", 1e6), ("K", 1e3)):
        if n >= size:
            return f"{n / size:.1f}{unit}"
    return str(int(n))


# --------------------------------------------------------------------------------------
# EOS ids and tokenizers next to the dump


def find_eos_token_ids(path: str) -> tuple[list[int] | None, str | None]:
    """EOS ids and where they came from: (ids, source), or (None, None).

    Looked for in `generation_config.json` / `config.json` / `tokenizer_config.json` in the
    dump's directory or its parent, then through the experiment's `config.yaml`: next to
    the dump, or in AReaL's log directory of the trial the dump belongs to (the dump's
    default place is `<fileroot>/<experiment>/<trial>/debug_trajectories/`, the config's
    `<fileroot>/logs/<user>/<experiment>/<trial>/config.yaml`), whose `tokenizer_path` or
    `actor.path` names the model directory holding those files.
    """
    start = path if os.path.isdir(path) else os.path.dirname(os.path.abspath(path))
    for directory in (start, os.path.dirname(start)):
        found = _eos_in_model_dir(directory)
        if found[0]:
            return found
    for config in _experiment_configs(start):
        for model_dir in _model_dirs_from_config(config):
            ids, source = _eos_in_model_dir(model_dir)
            if ids:
                return ids, f"{source} (via {config})"
    return None, None


def _eos_in_model_dir(directory: str) -> tuple[list[int] | None, str | None]:
    for name in EOS_CONFIG_FILES:
        candidate = os.path.join(directory, name)
        ids = _eos_from_config(candidate)
        if ids:
            return ids, candidate
    return None, None


def _experiment_configs(start: str) -> list[str]:
    """`config.yaml` files of the experiment a dump directory belongs to."""
    out = [os.path.join(d, "config.yaml") for d in (start, os.path.dirname(start))]
    trial_dir = os.path.dirname(start)
    trial = os.path.basename(trial_dir)
    experiment = os.path.basename(os.path.dirname(trial_dir))
    fileroot = os.path.dirname(os.path.dirname(trial_dir))
    logs = os.path.join(fileroot, "logs")
    if trial and experiment and os.path.isdir(logs):
        with contextlib.suppress(OSError):
            for user in sorted(os.listdir(logs)):
                out.append(os.path.join(logs, user, experiment, trial, "config.yaml"))
    return [c for c in out if os.path.isfile(c)]


def _model_dirs_from_config(path: str) -> list[str]:
    """`tokenizer_path` and `actor.path` of an AReaL config.yaml (as `save_config` writes it)."""
    try:
        with open(path, encoding="utf-8") as f:
            text = f.read(1 << 20)
    except OSError:
        return []
    found: dict[str, str] = {}
    section = ""
    # yaml.dump(asdict(cfg), default_flow_style=False): top-level keys at column 0, their
    # fields indented by two; read just the two keys, without needing PyYAML on the node.
    for line in text.splitlines():
        if not line.strip() or line.lstrip().startswith("#"):
            continue
        indent = len(line) - len(line.lstrip())
        key, sep, value = line.strip().partition(":")
        if not sep:
            continue
        value = value.strip().strip("'\"")
        if indent == 0:
            section = key
            if key == "tokenizer_path" and value:
                found["tokenizer_path"] = value
        elif indent == 2 and section == "actor" and key == "path" and value:
            found["actor.path"] = value
    dirs = [found[k] for k in ("tokenizer_path", "actor.path") if k in found]
    return [d for d in dict.fromkeys(dirs) if os.path.isdir(d)]


def _eos_from_config(path: str) -> list[int] | None:
    try:
        with open(path, encoding="utf-8") as f:
            config = json.load(f)
    except (OSError, ValueError):
        return None
    if not isinstance(config, dict):
        return None
    value = config.get("eos_token_id")
    if isinstance(value, int) and not isinstance(value, bool):
        return [value]
    if isinstance(value, list) and value and all(isinstance(v, int) for v in value):
        return list(value)
    # tokenizer_config.json names the token; its id is in added_tokens_decoder.
    token = config.get("eos_token")
    if isinstance(token, dict):
        token = token.get("content")
    decoder = config.get("added_tokens_decoder")
    if isinstance(token, str) and isinstance(decoder, dict):
        for tid, entry in decoder.items():
            if isinstance(entry, dict) and entry.get("content") == token and str(tid).isdigit():
                return [int(tid)]
    return None


def _decoder_for(path: str) -> Any:
    """A tokenizer saved next to the dump (or one level up), loaded from local files only.

    Uses `tokenizers` when installed, else `transformers`; None (token ids are shown) when
    neither is installed or no tokenizer files are there. Never downloads anything.
    """
    start = os.path.dirname(os.path.abspath(path))
    for directory in (start, os.path.dirname(start)):
        candidate = os.path.join(directory, "tokenizer.json")
        if not os.path.exists(candidate):
            continue
        try:
            from tokenizers import Tokenizer

            return Tokenizer.from_file(candidate)
        except ImportError:
            pass
        except Exception:  # a broken tokenizer file must not break the view
            return None
        try:
            from transformers import AutoTokenizer

            return AutoTokenizer.from_pretrained(directory, local_files_only=True)
        except Exception:  # not installed, or files it cannot read: show token ids
            return None
    return None


# --------------------------------------------------------------------------------------
# Per-sample facts of a tensor batch


def _groups_of(obj: Any, fmt: str) -> list[dict[str, Any]]:
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
        if _is_tensor(v):
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
    if not _is_tensor(lm) or lm.shape[:1] != ids.shape[:1]:
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


def _tensor(g: dict[str, Any], key: str, dim: int | None = None) -> Any:
    """`g[key]` when it is a tensor (of `dim` dimensions), else None."""
    v: Any = g.get(key)
    if not _is_tensor(v) or (dim is not None and v.dim() != dim):
        return None
    return v


def _value_meta(key: str, v: Any) -> dict[str, Any]:
    """What `batch --json` says about one entry of a group dict: shape and dtype."""
    if _is_tensorish(v):
        shape = list(v.shape)
        kind = "rtensor" if isinstance(v, RTensorRef) else "tensor"
        return {"shape": shape, "dtype": _dtype_name(v), "kind": kind}
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
                        if _is_tensorish(t):
                            fields.setdefault(
                                name, {"shape": list(t.shape), "dtype": _dtype_name(t)}
                            )
            meta["fields"] = fields
        return meta
    return {"shape": [], "dtype": type(v).__name__, "kind": "object"}


def _merge_meta(old: dict[str, Any], new: dict[str, Any]) -> dict[str, Any]:
    """Key metadata of several groups: rows add up, widths take the maximum."""
    out = dict(old)
    if new["kind"] in ("tensor", "rtensor", "list") and old["kind"] == new["kind"]:
        a, b = old["shape"], new["shape"]
        if a and b:
            out["shape"] = [a[0] + b[0], *[max(x, y) for x, y in zip(a[1:], b[1:])]]  # noqa: B905
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
        code = _STRUCT_CODES.get(_dtype_name(t))
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
            if (t := _tensor(g, key)) is not None
        ]
    )
    # AReaL's no_eos_ratios (areal/trainer/ppo/actor.py:371-419 at cbff54d6): a sequence
    # counts when its length equals the width of the batch the actor trains on, which is
    # the file's groups concatenated by concat_padded_tensors (areal/utils/data.py:241-298):
    # every group right-padded to the widest one. No EOS id is involved.
    widths = [int(_group_width(g)) for g in groups]
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
            meta = _value_meta(k, v)
            key_meta[k] = _merge_meta(key_meta[k], meta) if k in key_meta else meta
        ids = _tensor(g, "input_ids", 2)
        am = _tensor(g, "attention_mask", 2)
        lm = _tensor(g, "loss_mask", 2)
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
        vers = _tensor(g, "versions", 2)
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
        prox = _tensor(g, "prox_logp", 2)
        behave = _tensor(g, "logprobs", 2)
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


def _group_width(g: dict[str, Any]) -> int:
    for key in ("attention_mask", "input_ids"):
        t = _tensor(g, key, 2)
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
    t = _tensor(g, key)
    if t is None or t.numel() != n:
        return [None] * n
    values = reader.read(t) if reader is not None else t
    return [float(x) for x in values.reshape(-1).tolist()]


def _budgeted_groups(groups: list[dict[str, Any]], budget: int) -> set[int]:
    """Evenly spread groups whose tokens fit the per-token budget (all when they fit)."""
    sizes = []
    for g in groups:
        lp = _tensor(g, "logprobs")
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


# --------------------------------------------------------------------------------------
# Statistics and warnings (pure: rows in, numbers out)


def describe(values: list[float]) -> dict[str, float | None]:
    """mean, std (population), min and max; None for an empty list."""
    if not values:
        return {"mean": None, "std": None, "min": None, "max": None}
    n = len(values)
    mean = sum(values) / n
    var = sum((v - mean) ** 2 for v in values) / n
    return {"mean": mean, "std": math.sqrt(var), "min": min(values), "max": max(values)}


def histogram(values: list[float], bins: int = 10) -> dict[str, list[float]]:
    """Counts of `values` in `bins` equal-width bins: {"edges": [bins+1], "counts": [bins]}."""
    if not values:
        return {"edges": [], "counts": []}
    lo, hi = min(values), max(values)
    if hi == lo:
        return {"edges": [lo, hi], "counts": [float(len(values))]}
    width = (hi - lo) / bins
    counts = [0.0] * bins
    for v in values:
        counts[min(bins - 1, int((v - lo) / width))] += 1
    return {"edges": [lo + i * width for i in range(bins + 1)], "counts": counts}


def batch_stats(
    rows: list[dict[str, Any]],
    group_rewards: list[list[float]],
    behave_imp_weight: dict[str, Any] | None = None,
    version_span: list[int] | None = None,
) -> dict[str, Any]:
    """The `stats` of `batch --json` from per-sample rows, named as AReaL's actor names them."""
    seq = [float(r["seq_len"]) for r in rows]
    prompt = [float(r["prompt_len"]) for r in rows]
    resp = [float(r["response_len"]) for r in rows]
    task = [float(r["task_reward"]) for r in rows if r.get("task_reward") is not None]
    rewards = [float(r["reward"]) for r in rows if r.get("reward") is not None]
    cut = [r["no_eos"] for r in rows if r.get("no_eos") is not None]
    judged = [r["eos"] for r in rows if r.get("eos") is not None]
    multi = [g for g in group_rewards if len(g) > 1]
    equal = [g for g in multi if max(g) - min(g) == 0]
    heads = [
        r["head_version"] for r in rows if r["head_version"] is not None and r["head_version"] >= 0
    ]
    tails = [
        r["tail_version"] for r in rows if r["tail_version"] is not None and r["tail_version"] >= 0
    ]
    version = None
    if heads:
        newest = max(tails or heads)
        stale = [newest - h for h in heads]
        version = {
            "min": min(heads),
            "max": newest,
            "staleness_mean": sum(stale) / len(stale),
            "staleness_max": max(stale),
            "mixed_version_ratio": (
                sum(1 for s in version_span if s > 0) / len(version_span) if version_span else 0.0
            ),
        }
    return {
        "seq_len": describe(seq),
        "prompt_len": describe(prompt),
        "response_len": describe(resp),
        "task_reward": describe(task),
        "reward": describe(rewards),
        # AReaL's: length == the padded width of the rank's batch (no EOS id needed).
        "no_eos_ratio": (sum(1 for c in cut if c) / len(cut)) if cut else None,
        # Beside it when an EOS id is known: responses whose last token is not EOS.
        "no_eos_token_ratio": (sum(1 for e in judged if not e) / len(judged)) if judged else None,
        "equal_reward_group_ratio": (len(equal) / len(multi)) if multi else None,
        "equal_reward_groups": len(equal),
        "version": version,
        "behave_imp_weight": behave_imp_weight,
    }


def batch_warnings(
    stats: dict[str, Any], keys: dict[str, Any] | None = None, eos_known: bool = True
) -> list[str]:
    """Health checks with AReaL's thresholds, as sentences a user can act on.

    `eos_known` is kept for callers; AReaL's no_eos_ratio needs no EOS id.
    """
    out: list[str] = []
    max_new = config_key("gconfig.max_new_tokens")
    ratio = stats.get("no_eos_ratio")
    if ratio is not None and ratio > NO_EOS_WARN:
        out.append(
            f"no_eos_ratio {ratio:.3f} > {NO_EOS_WARN}: {ratio:.0%} of sequences are as long as "
            f"the padded batch (cut at the length limit); raise {max_new} or filter "
            "truncated samples"
        )
    by_eos = stats.get("no_eos_token_ratio")
    if by_eos is not None and by_eos > NO_EOS_WARN and (ratio is None or ratio <= NO_EOS_WARN):
        out.append(
            f"{by_eos:.0%} of responses do not end in the EOS token (AReaL's no_eos_ratio, "
            f"{_ratio_text(ratio)}, only counts those as long as the padded batch): "
            f"truncated or stopped by another stop token; check {max_new} and "
            f"{config_key('gconfig.stop_token_ids')}"
        )
    iw = stats.get("behave_imp_weight")
    if iw:
        if abs(iw["mean"] - 1.0) > BEHAVE_IMP_WEIGHT_DRIFT:
            out.append(
                f"behave_imp_weight mean {iw['mean']:.3f} is far from 1.0: the proximal and "
                "behaviour policies diverge (stale rollouts or an inference/training "
                f"mismatch); lower {config_key('rollout.max_head_offpolicyness')}"
            )
        if iw["max"] > REJECTION_UPPER:
            out.append(
                f"behave_imp_weight up to {iw['max']:.2f} exceeds {REJECTION_UPPER:g} on "
                f"{iw['above_upper_ratio']:.2%} of tokens: filter them with "
                f"{rejection_sampling_example(REJECTION_UPPER)}"
            )
    eq = stats.get("equal_reward_group_ratio")
    if eq is not None and eq >= EQUAL_REWARD_GROUPS_WARN:
        out.append(
            f"{eq:.0%} of groups have all-equal rewards (zero GRPO advantage, no learning signal "
            "from them): filter them (dynamic sampling) or adjust task difficulty"
        )
    elif eq:
        out.append(
            f"{stats.get('equal_reward_groups', 0)} group(s) ({eq:.0%}) have all-equal "
            "rewards: zero advantage, no gradient from them"
        )
    reward = stats.get("task_reward") or {}
    if (
        reward.get("std") is not None
        and reward.get("mean")
        and reward["std"] > 2 * abs(reward["mean"])
        and reward["std"] > 1.0
    ):
        out.append("high task_reward variance: a larger batch would steady the gradient")
    for name, meta in (keys or {}).items():
        missing = meta.get("missing_in_groups")
        if missing:
            out.append(f"keys differ between groups: '{name}' is missing in {missing} group(s)")
    return out


def _ratio_text(value: float | None) -> str:
    return "-" if value is None else f"{value:.3f}"


def length_trend_warnings(per_step: list[dict[str, Any]]) -> list[str]:
    """Growing response lengths between steps (worse when no_eos_ratio grows too)."""
    points = [p for p in per_step if p.get("response_len_mean") is not None]
    if len(points) < 3:
        return []
    lens = [p["response_len_mean"] for p in points]
    # Indexes, not zip(strict=): nodes may run this module on Python older than 3.10.
    rising = all(lens[i + 1] > lens[i] for i in range(len(lens) - 3, len(lens) - 1))
    growth = lens[-1] / lens[0] - 1 if lens[0] else 0.0
    if not rising or growth < LENGTH_GROWTH_WARN:
        return []
    eos = [p.get("no_eos_ratio") for p in points]
    first, step_a, step_b = eos[0], points[0]["step"], points[-1]["step"]
    msg = (
        f"response length grows between steps: mean {lens[0]:.0f} -> {lens[-1]:.0f} tokens "
        f"(+{growth:.0%}) from step {step_a} to {step_b}"
    )
    if first is not None and eos[-1] is not None and eos[-1] > first:
        msg += (
            f", with no_eos_ratio {first:.3f} -> {eos[-1]:.3f}: generations are running "
            f"into {config_key('gconfig.max_new_tokens')}"
        )
    return [msg]


def compare(a: dict[str, Any], b: dict[str, Any]) -> dict[str, Any]:
    """Side-by-side numbers of two summaries: rows of (stat, a, b, delta)."""
    rows = []
    for top in ("groups", "samples", "tokens"):
        rows.append(_compare_row(top, a.get(top), b.get(top)))
    sa, sb = a.get("stats") or {}, b.get("stats") or {}
    for name in ("seq_len", "prompt_len", "response_len", "task_reward"):
        for part in ("mean", "std", "min", "max"):
            rows.append(
                _compare_row(
                    f"{name}.{part}", (sa.get(name) or {}).get(part), (sb.get(name) or {}).get(part)
                )
            )
    for name in ("no_eos_ratio", "no_eos_token_ratio", "equal_reward_group_ratio"):
        rows.append(_compare_row(name, sa.get(name), sb.get(name)))
    for part in ("staleness_mean", "staleness_max"):
        rows.append(
            _compare_row(
                f"version.{part}",
                (sa.get("version") or {}).get(part),
                (sb.get("version") or {}).get(part),
            )
        )
    rows.append(
        _compare_row(
            "behave_imp_weight.mean",
            (sa.get("behave_imp_weight") or {}).get("mean"),
            (sb.get("behave_imp_weight") or {}).get("mean"),
        )
    )
    return {"a": a.get("path"), "b": b.get("path"), "rows": rows}


def _compare_row(stat: str, x: Any, y: Any) -> dict[str, Any]:
    delta = y - x if isinstance(x, (int, float)) and isinstance(y, (int, float)) else None
    return {"stat": stat, "a": x, "b": y, "delta": delta}


# --------------------------------------------------------------------------------------
# Files, directories, text rollouts


def parse_step_name(name: str) -> tuple[int, int | None] | None:
    """(step, dp_rank) from `step_000003.pt` / `step_000003_dp_1.pt`, else None."""
    m = STEP_FILE.match(name)
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


def _resolve_eos(
    path: str, eos_token_id: int | list[int] | None
) -> tuple[list[int] | None, str | None]:
    if eos_token_id is not None:
        ids = [eos_token_id] if isinstance(eos_token_id, int) else list(eos_token_id)
        return ids, "option"
    return find_eos_token_ids(path)


def _analysis(
    path: str, eos_ids: list[int] | None, trust_pickle: bool, token_budget: int
) -> tuple[str, str, dict[str, Any] | None]:
    key = ("analysis", *_file_key(path), trust_pickle, tuple(eos_ids or ()), token_budget)

    def make() -> tuple[str, str, dict[str, Any] | None]:
        obj = load_pt(path, trust_pickle)
        fmt, description = detect_format(obj)
        if fmt == TRAJECTORY_REFS:
            return fmt, description, references_summary(_groups_of(obj, fmt))
        if fmt not in (TRAJECTORY, DICT_BATCH):
            return fmt, description, None
        groups = _groups_of(obj, fmt)
        result = analyze_groups(groups, eos_ids, token_budget, path)
        result["n_groups"] = len(groups)
        return fmt, description, result

    return _cached(key, make)


def references_summary(groups: list[dict[str, Any]]) -> dict[str, Any]:
    """What a batch of RTensor references tells without its data: shapes, and where it was."""
    keys: dict[str, dict[str, Any]] = {}
    nodes: dict[str, int] = {}
    samples = 0
    for g in groups:
        for k, v in g.items():
            meta = _value_meta(k, v)
            keys[k] = _merge_meta(keys[k], meta) if k in keys else meta
            if isinstance(v, RTensorRef) and isinstance(v.shard, ShardRef):
                addr = str(v.shard.node_addr)
                nodes[addr] = nodes.get(addr, 0) + 1
        for key in ("attention_mask", "input_ids"):
            t: Any = g.get(key)
            if _is_tensorish(t) and len(t.shape) == 2:
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
    eos_ids, eos_source = _resolve_eos(path, eos_token_id)
    fmt, description, result = _analysis(path, eos_ids, trust_pickle, token_budget)
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
        if _text_rollout_root(path):
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
    eos_ids, eos_source = _resolve_eos(path, eos_token_id)
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
            fmt, description, result = _analysis(e["path"], eos_ids, trust_pickle, token_budget)
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
            keys[k] = _merge_meta(keys[k], meta) if k in keys else dict(meta)
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


def _text_rollout_root(path: str) -> str | None:
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
    root = _text_rollout_root(path)
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


def _text_rows(records: list[dict[str, Any]]) -> tuple[list[dict[str, Any]], list[list[float]]]:
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
    rows, group_rewards = _text_rows(records)
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


def resolve_step_file(path: str, step: int | None = None, dp_rank: int | None = None) -> str:
    """The file of `step` (default: the newest) and `dp_rank` (default: the lowest) in a dir."""
    if not os.path.isdir(path):
        return path
    entries = list_dump_dir(path)
    if not entries:
        if _text_rollout_root(path):
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
    if os.path.isdir(path) and _text_rollout_root(path) and not list_dump_dir(path):
        rows, _ = _text_rows(read_text_rollout(path))
    else:
        eos_ids, _ = _resolve_eos(path, eos_token_id)
        fmt, description, result = _analysis(path, eos_ids, trust_pickle, TOKEN_BUDGET)
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
    if os.path.isdir(path) and _text_rollout_root(path) and not list_dump_dir(path):
        records = read_text_rollout(path)
        rows, _ = _text_rows(records)
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
    eos_ids, _ = _resolve_eos(path, eos_token_id)
    obj = load_pt(path, trust_pickle)
    fmt, description = detect_format(obj)
    if fmt == TRAJECTORY_REFS:
        raise BatchError(references_text(path, references_summary(_groups_of(obj, fmt))["nodes"]))
    if fmt not in (TRAJECTORY, DICT_BATCH):
        raise BatchError(f"{path}: not a rollout batch: {description}")
    groups = _groups_of(obj, fmt)
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
    row["no_eos"] = row["seq_len"] == max(_group_width(g) for g in groups)
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
        t = _tensor(group, key, 2)
        if t is not None:
            per_token[key] = t[r, :n].tolist()
    scalars = {
        k: float(v.reshape(-1)[r])
        for k, v in group.items()
        if _is_tensor(v) and v.dim() == 1 and v.numel() > r and v.is_floating_point()
    }
    extras = _sample_extras(group, r)
    tokens = per_token.get("input_ids")
    text = None
    if tokens is not None:
        tok = _decoder_for(path)
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
        if _is_tensorish(v):
            continue
        if isinstance(v, (bool, int, float, str)) or v is None:
            out[k] = v
        elif isinstance(v, (list, tuple)):
            item = v[row] if len(v) > row else None
            if isinstance(item, dict):
                out[k] = {
                    name: (
                        {"shape": list(t.shape), "dtype": _dtype_name(t)}
                        if _is_tensorish(t)
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
        t = _tensor(group, key, 2)
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


# --------------------------------------------------------------------------------------
# Agent ops (this module is shipped to nodes and loaded by the agent's `load` op)


def _agent_error(agent: Any, exc: Exception) -> Exception:
    """The agent's own `OpError`, so the console sees a clean error reply."""
    send = getattr(type(agent), "send", None)
    cls = getattr(send, "__globals__", {}).get("OpError") if send is not None else None
    return cls(str(exc)) if isinstance(cls, type) else exc


def _common_args(args: dict[str, Any]) -> dict[str, Any]:
    eos = args.get("eos_token_id")
    return {"eos_token_id": eos, "trust_pickle": bool(args.get("trust_pickle", False))}


def _op_summary(agent: Any, args: dict[str, Any]) -> dict[str, Any]:
    try:
        return json_safe(summarize(str(args["path"]), **_common_args(args)))
    except BatchError as exc:
        raise _agent_error(agent, exc) from None


def _op_sample(agent: Any, args: dict[str, Any]) -> dict[str, Any]:
    try:
        path = resolve_step_file(str(args["path"]), args.get("step"), args.get("dp_rank"))
        return json_safe(sample_view(path, int(args["index"]), **_common_args(args)))
    except BatchError as exc:
        raise _agent_error(agent, exc) from None


def _op_samples(agent: Any, args: dict[str, Any]) -> dict[str, Any]:
    try:
        path = resolve_step_file(str(args["path"]), args.get("step"), args.get("dp_rank"))
        return json_safe(
            sample_table(
                path,
                **_common_args(args),
                offset=int(args.get("offset", 0)),
                limit=args.get("limit"),
            )
        )
    except BatchError as exc:
        raise _agent_error(agent, exc) from None


def _op_list(agent: Any, args: dict[str, Any]) -> dict[str, Any]:
    path = str(args["path"])
    try:
        if not os.path.isdir(path):
            raise BatchError(f"{path}: not a directory")
        return {
            "path": path,
            "files": [{k: v for k, v in e.items() if k != "path"} for e in list_dump_dir(path)],
        }
    except (BatchError, OSError) as exc:
        raise _agent_error(agent, exc) from None


OPS = {
    "batch_summary": _op_summary,
    "batch_sample": _op_sample,
    "batch_samples": _op_samples,
    "batch_list": _op_list,
}
