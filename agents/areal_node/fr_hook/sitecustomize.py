"""Opt-in Flight Recorder access for a running job, enabled with one line at launch:

    PYTHONPATH=/path/to/areal_node/fr_hook${PYTHONPATH:+:$PYTHONPATH} torchrun ...

Python imports this file at start-up (it is a `sitecustomize`). In every process that is a
rank (has `RANK` set) or an AReaL rpc_server (`-m areal.infra.rpc.rpc_server`, which
learns its rank later over `POST /set_env`) it

- turns torch's Flight Recorder on (`TORCH_FR_BUFFER_SIZE`, default 2000 entries) unless
  the job set it;
- once torch is imported, starts torch's own per-process worker server on a Unix socket,
  `areal-fr-<pid>.sock` in a directory of this user's own (`areal-fr-<uid>`, mode 0700,
  under `AREAL_FR_SOCKET_DIR`, `TMPDIR` or /tmp), which answers from a C++
  thread even while the main thread is blocked in a collective. Besides torch's handlers
  (`fr_trace_json`, `dump_traceback`, ...) it serves `areal_fr_trace`: the trace as JSON
  with each process group's name, description and ranks filled in (gloo leaves them out);
- writes the same trace as a pickle to `${TORCH_FR_DUMP_TEMP_FILE}<rank>` (default
  `/tmp/nccl_trace_rank_<rank>`, where NCCL's dump on timeout goes) when the process dies
  of an uncaught exception, e.g. a gloo timeout (gloo itself writes no dump): through a
  new file of its own (mode 0600, never through a link or into a file someone else
  created), renamed into place. The rank is the one known when it answers or dumps.

Standard library only at import; torch is touched only after the job imported it. Any
other `sitecustomize` later on `sys.path` still runs (another copy of this hook does not).
"""

from __future__ import annotations

import atexit
import importlib.abc
import importlib.machinery
import importlib.util
import json
import os
import secrets
import stat
import sys
from types import ModuleType
from typing import Any

BUFFER_SIZE = "2000"
HANDLER = "areal_fr_trace"
DEFAULT_DUMP_PREFIX = "/tmp/nccl_trace_rank_"
RPC_SERVER_MODULE = "areal.infra.rpc.rpc_server"
AREAL_FR_HOOK = 1  # marks a copy of this hook (another copy on sys.path is not chained)
_state: dict[str, Any] = {}


def _private_dir(base: str) -> str | None:
    """`<base>/areal-fr-<uid>` if it is (or could be made) a directory of this user's
    alone; None when someone else planted that name or it is not a plain directory."""
    path = os.path.join(base, f"areal-fr-{os.getuid()}")
    try:
        os.mkdir(path, 0o700)
    except FileExistsError:
        pass
    except OSError:
        return None
    try:
        st = os.lstat(path)
    except OSError:
        return None
    if not stat.S_ISDIR(st.st_mode) or st.st_uid != os.getuid():
        return None
    if stat.S_IMODE(st.st_mode) != 0o700:
        os.chmod(path, 0o700)  # ours: only the mode the umask gave it to fix
    return path


def socket_dir() -> str:
    """This user's private socket directory (mode 0700, owned by this user, whatever the
    umask) under the first of `AREAL_FR_SOCKET_DIR`, `TMPDIR`, /tmp where one can be had;
    when every `areal-fr-<uid>` name was planted by someone else, a fresh directory with
    a random name (the agent finds the socket by the process, not by its directory)."""
    named = (os.environ.get("AREAL_FR_SOCKET_DIR"), os.environ.get("TMPDIR"), "/tmp")
    bases = [d for d in named if d and len(d) < 60]
    for base in bases:
        path = _private_dir(base)
        if path is not None:
            return path
    import tempfile

    for base in bases:
        try:
            return tempfile.mkdtemp(prefix=f"areal-fr-{os.getuid()}-", dir=base)
        except OSError:
            continue
    raise OSError("no directory for the recorder socket")


def socket_path() -> str:
    """Where this process's worker server listens: `areal-fr-<pid>.sock` in `socket_dir()`."""
    return os.path.join(socket_dir(), f"areal-fr-{os.getpid()}.sock")


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
    rank = rank_now()
    if rank is not None:
        data["rank"] = rank
    return data


def _serve_trace(request: Any, response: Any) -> None:
    try:
        response.set_content(json.dumps(trace()), "application/json")
        response.set_status(200)
    except Exception as exc:  # a handler must answer, never raise into C++
        response.set_content(f"{type(exc).__name__}: {exc}", "text/plain")
        response.set_status(500)


def rank_now() -> int | None:
    """This process's rank as known now: its process group's, else `RANK` (an AReaL
    rpc_server gets it over HTTP after start), else None."""
    torch = sys.modules.get("torch")
    dist = getattr(torch, "distributed", None)
    try:
        if dist is not None and dist.is_available() and dist.is_initialized():
            return int(dist.get_rank())
    except (RuntimeError, ValueError):
        pass
    value = os.environ.get("RANK", "")
    return int(value) if value.isdigit() else None


def write_private(path: str, data: bytes) -> None:
    """Put `data` at `path` through a new file no one else can have prepared: created
    O_EXCL|O_NOFOLLOW (a planted link or file makes it fail, never redirects it) with
    mode 0600 under a random name in the same directory, then renamed over `path`. The
    directory must be this user's or sticky (like /tmp), so no one can swap the file
    between the write and the rename."""
    directory = os.path.dirname(path) or "."
    st = os.stat(directory)
    if st.st_uid != os.getuid() and not st.st_mode & stat.S_ISVTX and st.st_mode & 0o022:
        raise PermissionError(f"{directory}: writable by others and not sticky")
    tmp = os.path.join(
        directory, f".{os.path.basename(path)}.{os.getpid()}.{secrets.token_hex(8)}.tmp"
    )
    flags = os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | getattr(os, "O_CLOEXEC", 0)
    fd = os.open(tmp, flags, 0o600)
    try:
        try:
            os.fchmod(fd, 0o600)
            view = memoryview(data)
            while view:
                view = view[os.write(fd, view) :]
        finally:
            os.close(fd)
        os.replace(tmp, path)
    except BaseException:
        try:
            os.unlink(tmp)
        except OSError:
            pass
        raise


def dump_to_file() -> str | None:
    """Write the trace (torch's pickle layout, groups filled in) to `<prefix><rank>`
    (None: the rank is not known, nothing written)."""
    import pickle

    from torch._C._distributed_c10d import _dump_fr_trace  # type: ignore[attr-defined]

    rank = rank_now()
    if rank is None:
        return None
    data = pickle.loads(_dump_fr_trace())  # our own process's dump: trusted
    config = _pg_config()
    if config:
        data["pg_config"] = config
    data["rank"] = rank
    path = f"{dump_prefix()}{rank}"
    write_private(path, pickle.dumps(data, protocol=2))
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
    remove_stale_sockets(os.path.dirname(path))  # our private directory: only ours there
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
    """Runs `start()` right after `import torch` finishes (no thread, no polling). A mere
    `importlib.util.find_spec("torch")` (an availability check) leaves it in place: it
    steps aside only once torch's module has run."""

    def __init__(self) -> None:
        self.busy = False

    def find_spec(self, fullname: str, path: Any = None, target: Any = None) -> Any:
        if fullname != "torch" or self.busy:
            return None
        self.busy = True
        try:
            spec = importlib.util.find_spec(fullname)
        finally:
            self.busy = False
        if spec is None or spec.loader is None or not hasattr(spec.loader, "exec_module"):
            return spec
        loader = spec.loader
        original = loader.exec_module
        finder = self

        def exec_module(module: ModuleType) -> None:
            original(module)
            if finder in sys.meta_path:
                sys.meta_path.remove(finder)
            try:
                start()
            except Exception as exc:  # never break the job's `import torch`
                sys.stderr.write(f"areal-console fr_hook: not started: {exc}\n")

        loader.exec_module = exec_module  # type: ignore[method-assign]
        return spec


def _is_hook_copy(origin: str) -> bool:
    """Whether the file at `origin` is a copy of this hook (it carries the marker)."""
    try:
        with open(origin, "rb") as fh:
            return b"\nAREAL_FR_HOOK = " in fh.read(1 << 20)
    except OSError:
        return False


def _chain_next_sitecustomize() -> None:
    """Run the `sitecustomize` this file shadows, if there is one further on the path;
    other copies of this hook on the path are skipped (chaining them would recurse)."""
    here = os.path.dirname(os.path.abspath(__file__))
    rest = [p for p in sys.path if os.path.abspath(p or ".") != here]
    while rest:
        spec = importlib.machinery.PathFinder.find_spec("sitecustomize", rest)
        if spec is None or spec.loader is None or not spec.origin:
            return
        found = os.path.dirname(os.path.abspath(spec.origin))
        if not _is_hook_copy(spec.origin):
            module = importlib.util.module_from_spec(spec)
            spec.loader.exec_module(module)
            return
        rest = [p for p in rest if os.path.abspath(p or ".") != found]


def is_rpc_server() -> bool:
    """Whether this process is an AReaL rpc_server (`python -m areal.infra.rpc.rpc_server`)."""
    argv = list(getattr(sys, "orig_argv", []) or [])
    if not argv:
        try:
            with open("/proc/self/cmdline", "rb") as fh:
                argv = fh.read().decode("utf-8", "replace").split("\0")
        except OSError:
            return False
    skip = False
    for i, word in enumerate(argv[1:], 1):
        if skip:
            skip = False
        elif word == "-m":
            return argv[i + 1 : i + 2] == [RPC_SERVER_MODULE]
        elif word.startswith("-m"):
            return word == "-m" + RPC_SERVER_MODULE
        elif word in ("-X", "-W"):
            skip = True  # their argument follows
        elif not word.startswith("-") or word == "-c":
            return False
    return False


def wanted() -> bool:
    """Whether this process records: a rank, or an AReaL rpc_server, unless AREAL_FR=0."""
    if os.environ.get("AREAL_FR", "1") == "0":
        return False
    return os.environ.get("RANK") is not None or is_rpc_server()


if __name__ == "sitecustomize":
    _chain_next_sitecustomize()
    if wanted():
        enable()
