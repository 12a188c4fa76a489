"""Loading a dumped batch safely, and telling its format.

Files load with `torch.load(weights_only=True, mmap=True, map_location="cpu")`: a pickle
that would run code is refused before anything in it runs (`trust_pickle=True` opts in).
Tensors are memory-mapped; loaded files and per-file analyses are cached by path, mtime and
size. Standard library at import; torch on first use.
"""

from __future__ import annotations

import contextlib
import os
import re
import threading
import warnings
import zipfile
from collections import OrderedDict
from typing import Any

# Formats a path can hold.
TRAJECTORY = "trajectory_dump"  # list[dict[str, Tensor | Any]], one dict per prompt group
TRAJECTORY_REFS = "trajectory_refs"  # the same, holding single-controller RTensor references
TRAJECTORY_DIR = "trajectory_dir"  # a directory of step_NNNNNN[_dp_K].pt files
DICT_BATCH = "dict_batch"  # one dict of [B, T] tensors
TEXT_ROLLOUT = "text_rollout"  # rollout/<version>/<task_id>.jsonl
CHECKPOINT = "checkpoint"  # a model or optimizer state_dict
UNKNOWN = "unknown"
BATCH_FORMATS = (TRAJECTORY, TRAJECTORY_REFS, TRAJECTORY_DIR, DICT_BATCH, TEXT_ROLLOUT)

# How a refused pickle is opened anyway, in CLI words; the console says its own key instead.
TRUST_HINT = "--trust-pickle would run it: use it only if you trust who wrote it"


class BatchError(Exception):
    """A file or directory that cannot be shown, with a one-line reason."""


class UnsafePickleError(BatchError):
    """The file holds pickled objects that could run code when loaded."""


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


def cached(key: tuple[Any, ...], make: Any) -> Any:
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


def file_key(path: str) -> tuple[str, int, int]:
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
    key = ("pt", *file_key(path), trust_pickle)
    return cached(key, lambda: _load_pt_uncached(path, trust_pickle))


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
        # torch names the callable the pickle reaches for in two ways: "Unsupported global:
        # GLOBAL x.y was not an allowed global" and, for modules it blocks outright (os,
        # posix, subprocess, ...), "Trying to load unsupported GLOBAL posix.system whose
        # module posix is blocked". Either way the file would run code.
        found = re.search(r"\bGLOBAL (\S+)", text)
        if found is not None:
            if trust_pickle:
                return _load_trusted(path, is_zip)
            what = f" (it would call {found.group(1)})"
            if found.group(1).startswith("areal."):
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


# Format detection


def is_tensor(value: Any) -> bool:
    import torch

    return isinstance(value, torch.Tensor)


def is_tensorish(value: Any) -> bool:
    """A tensor, or an RTensor reference standing for one."""
    return is_tensor(value) or isinstance(value, RTensorRef)


def dtype_name(t: Any) -> str:
    return str(t.dtype).replace("torch.", "")


def _is_group(g: Any) -> bool:
    """A trajectory dict: a tensor-ish `input_ids` or `attention_mask` of [G, T]."""
    if not isinstance(g, dict):
        return False
    for key in ("input_ids", "attention_mask"):
        v: Any = g.get(key)
        if is_tensorish(v) and len(v.shape) == 2:
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
        tensors = {k: v for k, v in obj.items() if is_tensor(v)}
        ids: Any = obj.get("input_ids")
        if is_tensor(ids) and ids.dim() == 2:
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
    if is_tensor(obj):
        return UNKNOWN, f"a single tensor {list(obj.shape)} {dtype_name(obj)}"
    return UNKNOWN, f"a {type(obj).__name__}"


def _looks_like_weights(tensors: dict[str, Any]) -> bool:
    names = list(tensors)
    return sum(1 for n in names if n.endswith((".weight", ".bias"))) >= max(1, len(names) // 2)


def _state_dict_text(sd: dict[str, Any]) -> str:
    tensors = [(k, v) for k, v in sd.items() if is_tensor(v)]
    params = sum(v.numel() for _, v in tensors)
    dtypes = sorted({dtype_name(v) for _, v in tensors})
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
