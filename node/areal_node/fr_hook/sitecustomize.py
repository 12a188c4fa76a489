"""Opt-in Flight Recorder access for a running job, enabled with one line at launch:

    PYTHONPATH=/path/to/areal_node/fr_hook${PYTHONPATH:+:$PYTHONPATH} torchrun ...

Python imports this file at start-up (it is a `sitecustomize`). In every process that is a
rank (has `RANK` set) it

- turns torch's Flight Recorder on (`TORCH_FR_BUFFER_SIZE`, default 2000 entries) unless
  the job set it;
- once torch is imported, starts torch's own per-process worker server on a Unix socket,
  `areal-fr-<pid>.sock` in `AREAL_FR_SOCKET_DIR`, `TMPDIR` or /tmp, which answers from a C++
  thread even while the main thread is blocked in a collective. Besides torch's handlers
  (`fr_trace_json`, `dump_traceback`, ...) it serves `areal_fr_trace`: the trace as JSON
  with each process group's name, description and ranks filled in (gloo leaves them out);
- writes the same trace as a pickle to `${TORCH_FR_DUMP_TEMP_FILE}<rank>` (default
  `/tmp/nccl_trace_rank_<rank>`, where NCCL's dump on timeout goes) when the process dies
  of an uncaught exception, e.g. a gloo timeout (gloo itself writes no dump).

Standard library only at import; torch is touched only after the job imported it. Any
other `sitecustomize` later on `sys.path` still runs.
"""

from __future__ import annotations

import atexit
import importlib.abc
import importlib.machinery
import importlib.util
import json
import os
import sys
from types import ModuleType
from typing import Any

BUFFER_SIZE = "2000"
HANDLER = "areal_fr_trace"
DEFAULT_DUMP_PREFIX = "/tmp/nccl_trace_rank_"
_state: dict[str, Any] = {}


def socket_path() -> str:
    """Where this process's worker server listens: the first of `AREAL_FR_SOCKET_DIR`,
    `TMPDIR`, /tmp that keeps the path short enough for a Unix socket (the agent looks
    in the same order)."""
    name = f"areal-fr-{os.getpid()}.sock"
    dirs = (os.environ.get("AREAL_FR_SOCKET_DIR"), os.environ.get("TMPDIR"), "/tmp")
    return next(os.path.join(d, name) for d in dirs if d and len(os.path.join(d, name)) < 100)


def remove_stale_sockets(directory: str) -> None:
    """Remove `areal-fr-<pid>.sock` files of processes that are gone (a killed rank cannot
    remove its own), and one of an earlier process with this pid."""
    try:
        names = os.listdir(directory)
    except OSError:
        return
    for name in names:
        pid = name[len("areal-fr-") : -len(".sock")]
        if not (name.startswith("areal-fr-") and name.endswith(".sock") and pid.isdigit()):
            continue
        if int(pid) == os.getpid() or not os.path.exists(f"/proc/{pid}"):
            try:
                os.unlink(os.path.join(directory, name))
            except OSError:
                pass


def dump_prefix() -> str:
    return (
        os.environ.get("TORCH_FR_DUMP_TEMP_FILE")
        or os.environ.get("TORCH_NCCL_DEBUG_INFO_TEMP_FILE")
        or DEFAULT_DUMP_PREFIX
    )


def _pg_config() -> dict[str, dict[str, str]]:
    """Every process group's name -> {name, desc, ranks} (what NCCL records and gloo does not)."""
    import torch.distributed as dist

    if not dist.is_initialized():
        return {}
    c10d = dist.distributed_c10d
    config = {}
    for group, name in list(c10d._world.pg_names.items()):
        try:
            ranks = dist.get_process_group_ranks(group)
        except (RuntimeError, ValueError):
            continue
        desc = getattr(group, "group_desc", "") or "undefined"
        config[str(name)] = {"name": str(name), "desc": str(desc), "ranks": str(sorted(ranks))}
    return config


def trace() -> dict[str, Any]:
    """This process's Flight Recorder trace (as torch's JSON dump), process groups filled in."""
    from torch._C._distributed_c10d import _dump_fr_trace_json  # type: ignore[attr-defined]

    data: dict[str, Any] = json.loads(_dump_fr_trace_json())
    config = _pg_config()
    if config:
        data["pg_config"] = config
    return data


def _serve_trace(request: Any, response: Any) -> None:
    try:
        response.set_content(json.dumps(trace()), "application/json")
        response.set_status(200)
    except Exception as exc:  # a handler must answer, never raise into C++
        response.set_content(f"{type(exc).__name__}: {exc}", "text/plain")
        response.set_status(500)


def dump_to_file() -> str:
    """Write the trace (torch's pickle layout, groups filled in) to `<prefix><rank>`."""
    import pickle

    from torch._C._distributed_c10d import _dump_fr_trace  # type: ignore[attr-defined]

    data = pickle.loads(_dump_fr_trace())  # our own process's dump: trusted
    config = _pg_config()
    if config:
        data["pg_config"] = config
    path = f"{dump_prefix()}{os.environ.get('RANK', '0')}"
    tmp = f"{path}.{os.getpid()}.tmp"
    with open(tmp, "wb") as fh:
        pickle.dump(data, fh, protocol=2)
    os.replace(tmp, path)
    return path


def _excepthook(kind: Any, value: Any, tb: Any) -> None:
    _state["failed"] = True
    _state["excepthook"](kind, value, tb)


def _at_exit() -> None:
    if _state.get("failed"):
        try:
            dump_to_file()
        except Exception:  # exiting anyway; never turn an exit into a traceback
            pass
    path = _state.get("socket")
    if path:
        try:
            os.unlink(path)
        except OSError:
            pass


def start() -> str | None:
    """Start the worker server (once); torch must be importable. Returns the socket path."""
    if "server" in _state:
        return _state.get("socket")
    from torch._C import _distributed_c10d as c10d

    path = socket_path()
    remove_stale_sockets(os.path.dirname(path))
    c10d._register_handler(HANDLER, _serve_trace)
    _state["server"] = c10d._WorkerServer(path)
    _state["socket"] = path
    _state["excepthook"] = sys.excepthook
    sys.excepthook = _excepthook
    atexit.register(_at_exit)
    return path


def enable() -> None:
    """Turn the recorder on now and start the server once torch is imported."""
    os.environ.setdefault("TORCH_FR_BUFFER_SIZE", BUFFER_SIZE)
    if "torch" in sys.modules:
        start()
    elif not any(isinstance(f, _AfterTorch) for f in sys.meta_path):
        sys.meta_path.insert(0, _AfterTorch())


class _AfterTorch(importlib.abc.MetaPathFinder):
    """Runs `start()` right after `import torch` finishes (no thread, no polling)."""

    def find_spec(self, fullname: str, path: Any = None, target: Any = None) -> Any:
        if fullname != "torch":
            return None
        sys.meta_path.remove(self)
        spec = importlib.util.find_spec(fullname)
        if spec is None or spec.loader is None:
            return spec
        loader = spec.loader
        original = loader.exec_module

        def exec_module(module: ModuleType) -> None:
            original(module)
            try:
                start()
            except Exception as exc:  # never break the job's `import torch`
                sys.stderr.write(f"areal-console fr_hook: not started: {exc}\n")

        loader.exec_module = exec_module  # type: ignore[method-assign]
        return spec


def _chain_next_sitecustomize() -> None:
    """Run the `sitecustomize` this file shadows, if there is one further on the path."""
    here = os.path.dirname(os.path.abspath(__file__))
    rest = [p for p in sys.path if os.path.abspath(p or ".") != here]
    spec = importlib.machinery.PathFinder.find_spec("sitecustomize", rest)
    if spec is None or spec.loader is None or spec.origin == os.path.abspath(__file__):
        return
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)


if __name__ == "sitecustomize":
    _chain_next_sitecustomize()
    if os.environ.get("RANK") is not None and os.environ.get("AREAL_FR", "1") != "0":
        enable()
